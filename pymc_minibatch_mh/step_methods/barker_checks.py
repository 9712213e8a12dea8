"""The checks of ``MinibatchBarker``'s settings (also ``MinibatchGibbs``'s Barker test)."""

from __future__ import annotations

import math
from typing import Any

from pymc_minibatch_mh.core.correction import LOGISTIC_SD, CorrectionDistribution, get_correction

__all__ = [
    "DEFAULT_BARKER_SIGMA",
    "barker_correction",
    "check_acceptance",
    "check_barker_settings",
    "check_rows_setting",
]

#: σ of Barker's test unless given (its correction table's error is 5e-8 there).
DEFAULT_BARKER_SIGMA: float = 1.0


def check_barker_settings(sigma: Any, tolerance: Any, early_decision: Any) -> None:
    """Validate the settings of the minibatch Barker test (also ``MinibatchGibbs``'s).

    Parameters
    ----------
    sigma, tolerance, early_decision
        As for :class:`~pymc_minibatch_mh.MinibatchBarker`.

    Raises
    ------
    ValueError
        For a value out of its range.

    """
    if not (isinstance(sigma, int | float) and 0.0 < sigma < LOGISTIC_SD):
        raise ValueError(
            f"sigma must be in (0, π/√3 ≈ {LOGISTIC_SD:.4f}), got {sigma!r}: the normal "
            "part of the logistic noise cannot have a larger sd than the logistic itself."
        )
    if tolerance is not None and not (0.0 < tolerance < 1.0):
        raise ValueError(f"tolerance must be in (0, 1) or None, got {tolerance!r}.")
    if early_decision is not None and not (
        early_decision > 0 and math.isfinite(early_decision)
    ):
        raise ValueError(
            f"early_decision must be a positive number or None, got {early_decision!r}."
        )


def check_acceptance(acceptance: Any, sigma: Any, correction: Any, skew_correction: Any) -> None:
    """Validate ``acceptance`` and the settings that go with it.

    Raises
    ------
    ValueError
        For an unknown acceptance function; with ``"penalty"``, a ``sigma`` that is not a
        positive finite number, a ``correction`` table, or ``skew_correction``. (With
        ``"barker"`` or ``"auto"``, :func:`check_barker_settings` checks ``sigma``.)

    """
    if acceptance not in ("auto", "barker", "penalty"):
        raise ValueError(
            f"acceptance must be 'auto', 'barker' or 'penalty', got {acceptance!r}."
        )
    if acceptance != "penalty":
        return
    if sigma is not None and not (isinstance(sigma, int | float) and 0.0 < sigma
                                  and math.isfinite(sigma)):
        raise ValueError(f"sigma must be a positive number, got {sigma!r}.")
    if correction is not None:
        raise ValueError(
            "acceptance='penalty' draws its correction exactly (an exponential shifted by "
            "-sigma**2/2); a correction table is for Barker's test. Leave correction unset."
        )
    if skew_correction:
        raise ValueError(
            "skew_correction is implemented for Barker's test only; use it with "
            "acceptance='barker', or leave it off with acceptance='penalty'."
        )


def check_rows_setting(batch_size: Any, error_tolerance: Any, table_error: float) -> bool:
    """Validate ``batch_size`` and ``error_tolerance``; whether m is sized by the budget.

    Raises
    ------
    ValueError
        For a string other than ``"auto"``, an ``error_tolerance`` with a fixed
        ``batch_size``, or one outside (table error, 1). A fixed ``batch_size`` is checked
        by the step's base.

    """
    auto = isinstance(batch_size, str)
    if auto and batch_size != "auto":
        raise ValueError(f"batch_size must be a positive integer or 'auto', got {batch_size!r}.")
    if error_tolerance is None:
        return auto
    if not auto:
        raise ValueError(
            f"error_tolerance sizes the minibatch, but batch_size={batch_size!r} fixes it. "
            "Give error_tolerance with batch_size='auto' (the default), or a fixed "
            "batch_size alone."
        )
    if not (isinstance(error_tolerance, int | float) and table_error < error_tolerance < 1.0):
        raise ValueError(
            f"error_tolerance must be a number in ({table_error:.1e}, 1), got "
            f"{error_tolerance!r}: it bounds the acceptance probability's error per step, "
            f"and the correction table's error alone is {table_error:.1e}."
        )
    return True


def barker_correction(
    sigma: float, correction: CorrectionDistribution | None
) -> CorrectionDistribution:
    """The correction distribution for ``sigma``: ``correction`` if given, else the table.

    Parameters
    ----------
    sigma, correction
        As for :class:`~pymc_minibatch_mh.MinibatchBarker`.

    Returns
    -------
    CorrectionDistribution
        ``correction``, or :func:`~pymc_minibatch_mh.get_correction`'s.

    Raises
    ------
    ValueError
        If ``correction`` was built for another ``sigma``.

    """
    if correction is not None and not math.isclose(correction.sigma, sigma):
        raise ValueError(
            f"The correction distribution was built for sigma={correction.sigma}, "
            f"but sigma={sigma} was given."
        )
    return correction if correction is not None else get_correction(float(sigma))
