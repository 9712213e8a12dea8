"""Small helpers shared by the threshold-based acceptance tests (exact, AustereMH, MHSubLhd).

The Metropolis–Hastings decision can be written as a comparison of the mean ratio with a
threshold that depends on a uniform draw: accept iff ``μ > (log u − c) / N``, with
``μ = (1/N) Σ l_i`` and ``c`` the data-free part. Every such test draws ``u`` first, with
the same call, so that two tests run from generators in the same state use the same ``u``
(which makes their decisions directly comparable).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["draw_uniform", "is_fault", "log_threshold"]


def draw_uniform(rng: np.random.Generator) -> float:
    """One uniform draw on ``(0, 1]`` (so that ``log u`` is finite).

    Parameters
    ----------
    rng : numpy.random.Generator
        The test's generator; exactly one ``random()`` call is made.

    Returns
    -------
    float
        ``1 − rng.random()``, uniform on ``(0, 1]``.

    """
    return 1.0 - float(rng.random())


def log_threshold(
    rng: np.random.Generator, data_free: float, n_total: int
) -> tuple[float, float]:
    """Draw ``u`` and return ``(log u, (log u − c) / N)``.

    The second value is the threshold of the mean ratio: μ0 of Korattikara et al. (2014,
    eq. 2) or ψ of Bardenet et al. (2014). The exact test accepts iff ``μ > μ0``, i.e. iff
    ``log u < Δ = N μ + c``.

    Parameters
    ----------
    rng : numpy.random.Generator
        The test's generator (one draw, see :func:`draw_uniform`).
    data_free : float
        The data-free part ``c(θ, θ')``.
    n_total : int
        Population size N.

    Returns
    -------
    tuple of float
        ``(log_u, threshold)``.

    Examples
    --------
    >>> import numpy as np
    >>> log_u, mu0 = log_threshold(np.random.default_rng(0), 0.5, 10)
    >>> bool(np.isclose(mu0, (log_u - 0.5) / 10))
    True

    """
    log_u = math.log(draw_uniform(rng))
    return log_u, (log_u - data_free) / n_total


def is_fault(value: float) -> bool:
    """Whether a non-finite value is a fault (NaN or +inf) rather than a zero likelihood.

    A ``−inf`` log ratio means the proposal has zero likelihood (or prior): rejecting is the
    exact decision, not an error. NaN or ``+inf`` means the model could not be evaluated;
    the proposal is rejected and the step flags ``nonfinite``.

    Parameters
    ----------
    value : float
        A non-finite value (finite values return False).

    Returns
    -------
    bool
        True for NaN and ``+inf``, False for ``−inf`` and finite values.

    Examples
    --------
    >>> is_fault(float("nan")), is_fault(float("inf")), is_fault(float("-inf"))
    (True, True, False)

    """
    return math.isnan(value) or value == math.inf
