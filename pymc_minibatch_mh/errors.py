"""The exceptions of the package, in one place.

Every refusal says what is wrong and what to do. They are ``ValueError`` subclasses, so
code that catches ``ValueError`` keeps working; catch these to tell the package's refusals
apart. :func:`compared` formats the two numbers of a message's comparison.
"""

from __future__ import annotations

__all__ = [
    "ControlVariateError",
    "DataChangedError",
    "DataStoreError",
    "ModelNotSupportedError",
    "StartPointError",
    "compared",
]


class ModelNotSupportedError(ValueError):
    """The model cannot be sampled by a minibatch step; the message says why and what to do."""


class StartPointError(ModelNotSupportedError):
    """The log-probability is not finite at the start point: the initial values or the data."""


class DataStoreError(ModelNotSupportedError):
    """Data given with ``data=`` cannot be used; the message says why and what to do."""


class DataChangedError(DataStoreError):
    """Data given with ``data=`` changed while a step was using it."""


class ControlVariateError(ValueError):
    """The control variates cannot be built; the message says why and what to do."""


def compared(value: float, limit: float, digits: int = 2) -> tuple[str, str]:
    """Format two compared numbers with enough significant digits to tell them apart.

    For a message saying that ``value`` is above or below ``limit``: the fewest digits,
    from ``digits`` on, at which the two differ.

    Parameters
    ----------
    value, limit : float
        The measured number and the limit it is compared with.
    digits : int
        The fewest significant digits shown.

    Returns
    -------
    tuple of str
        ``value`` and ``limit`` formatted alike (``repr`` of both when they are equal
        to 17 digits).

    """
    for k in range(digits, 18):
        a, b = f"{value:.{k}g}", f"{limit:.{k}g}"
        if a != b:
            return a, b
    return repr(float(value)), repr(float(limit))
