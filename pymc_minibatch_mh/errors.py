"""The exceptions of the package, in one place.

Every refusal says what is wrong and what to do. They are ``ValueError`` subclasses, so
code that catches ``ValueError`` keeps working; catch these to tell the package's refusals
apart.
"""

from __future__ import annotations

__all__ = [
    "ControlVariateError",
    "DataChangedError",
    "DataStoreError",
    "ModelNotSupportedError",
    "StartPointError",
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

