"""The skew correction of the minibatch Barker test: a skewed top-up noise.

The minibatch test accepts iff ``Δ* + X_nc + X_corr > 0``. Given the minibatch, the
acceptance probability is ``H(Δ*, σ² − s²)`` with ``H(x, v) = P(N(0, v) + X_corr < x)``,
and ``H(x, σ²) ≈ g(x)``, Barker's function. ``H`` solves the heat equation,
``∂H/∂v = ½ ∂²H/∂x²``, so expanding ``E H(Δ + e, σ² − V − η)`` (``e = Δ* − Δ`` with
variance ``V`` and third cumulant ``κ₃``, ``η = s² − V``) to third order gives

    P(accept | Δ) − g(Δ) ≈ (κ₃ / 6 − C / 2) · g‴(Δ),    C = cov(Δ*, s²),

the first Edgeworth term of the test. For a mean of ``n`` rows drawn without replacement
from ``N`` whose ratios have third central moment ``μ₃`` (mean of cubes over the N rows),

    κ₃ = N³ μ₃ (N − n)(N − 2n) / [n² (N − 1)(N − 2)],
    C  = N⁴ μ₃ (N − n)² / [n² (N − 1)² (N − 2)],

so ``C ≈ κ₃`` for ``n ≪ N`` and the error is about ``−κ₃ g‴(Δ) / 3``: the estimated
variance co-varies with Δ* and triples the plain skew term. A top-up noise with third
cumulant ``κ_a`` adds ``κ_a g‴(Δ) / 6``; the skew-corrected test therefore draws the top-up
with ``κ_a = 3C − κ₃`` (about ``2κ₃``), with ``μ₃`` estimated without bias from the
minibatch, and variance ``σ² − s²`` as before: a centred gamma variable, negated for
negative ``κ_a``. Its shape is ``k = 4v³/κ_a²`` and scale ``|κ_a| / (2v)`` for the top-up
variance ``v``.

A gamma top-up brings a fourth cumulant ``1.5 κ_a² / v`` of its own. The correction is
applied only while the error of that term, ``κ_a² / (16 v) · max|g⁗|``, is at most half
the first-order term it removes, ``|κ_a| / 6 · max|g‴|``: that is ``|κ_a| ≤``
:data:`SKEW_LIMIT` ``· v``. Otherwise the step falls back to the plain Gaussian top-up and
says so (the ``skew_fallback`` stat).

The rule is part of the compiled test (:func:`skew_topup_cumulant` is called by
:func:`~pymc_minibatch_mh.core.barker.barker_rounds`); :func:`skew_topup` draws the
top-up and :func:`acceptance_probability` gives the test's acceptance probability given
the minibatch in closed form, for measurements.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import special

from pymc_minibatch_mh.core.logistic import barker_probabilities

__all__ = [
    "LOGISTIC_D3_MAX",
    "LOGISTIC_D4_MAX",
    "SKEW_LIMIT",
    "acceptance_probability",
    "skew_topup",
    "skew_topup_cumulant",
]

#: ``max |g‴|`` of the logistic CDF g (at 0).
LOGISTIC_D3_MAX: float = 0.125
#: ``max |g⁗|`` of the logistic CDF g (checked on a fine grid by the tests).
LOGISTIC_D4_MAX: float = 0.12768392196771414
#: The correction is applied while ``|κ_a| ≤ SKEW_LIMIT · (σ² − s²)``, see the module notes.
SKEW_LIMIT: float = 16.0 / 12.0 * LOGISTIC_D3_MAX / LOGISTIC_D4_MAX


@numba.njit(cache=True, nogil=True)
def skew_topup_cumulant(
    n: int, n_total: int, m3: float, topup_variance: float
) -> tuple[float, bool]:  # pragma: no cover
    """Third cumulant the top-up noise needs, and whether the test falls back (compiled).

    Parameters
    ----------
    n, n_total : int
        Rows used and N.
    m3 : float
        Sum of cubed deviations of the ``n`` ratios from their mean.
    topup_variance : float
        ``σ² − s²`` (> 0).

    Returns
    -------
    tuple
        ``(kappa, fallback)``: the estimate of ``κ_a = 3C − κ₃`` (see the module notes;
        0.0 when it cannot be estimated) and whether it is too large for the top-up, by
        the rule ``|κ_a| > SKEW_LIMIT · topup_variance`` (or is not finite).

    """
    if n < 3 or n >= n_total:
        return 0.0, False
    big_n = float(n_total)
    rest = big_n - n
    # E Σ (l − l̄)³ = A · μ₃ for a sample without replacement (A → (n−1)(n−2)/n as N → ∞).
    a = n - 3.0 * rest / (big_n - 1.0) + 2.0 * rest * (big_n - 2.0 * n) / (
        n * (big_n - 1.0) * (big_n - 2.0)
    )
    mu3 = m3 / a
    scale = big_n**3 * mu3 * rest / (n * n * (big_n - 1.0) * (big_n - 2.0))
    kappa = scale * (3.0 * big_n * rest / (big_n - 1.0) - (big_n - 2.0 * n))
    if not math.isfinite(kappa):
        return 0.0, True
    return kappa, abs(kappa) > SKEW_LIMIT * topup_variance


def skew_topup(rng: np.random.Generator, variance: float, kappa: float) -> float:
    """One draw of the top-up noise with the given variance and third cumulant.

    Parameters
    ----------
    rng : numpy.random.Generator
        Source of the draw (one ``standard_normal`` for ``kappa = 0``, else one ``gamma``).
    variance : float
        ``v = σ² − s²`` (> 0).
    kappa : float
        Third cumulant; 0 gives the plain ``N(0, v)`` top-up.

    Returns
    -------
    float
        ``√v · Z``, or ``±(Γ − kθ)`` with ``Γ ~ Gamma(k, θ)``, ``k = 4v³/κ²``,
        ``θ = |κ|/(2v)`` and the sign of κ.

    """
    if kappa == 0.0:
        return math.sqrt(variance) * rng.standard_normal()
    theta = abs(kappa) / (2.0 * variance)
    shape = variance / (theta * theta)
    draw = rng.gamma(shape, theta) - shape * theta
    return draw if kappa > 0.0 else -draw


def acceptance_probability(
    delta_star: ArrayLike,
    variance: ArrayLike,
    support: NDArray[np.float64],
    weights: NDArray[np.float64],
    sigma: float,
    skew: ArrayLike = 0.0,
) -> NDArray[np.float64]:
    """The test's acceptance probability given the minibatch, in closed form.

    ``P(Δ* + T + X_corr > 0)`` for the top-up ``T`` of :func:`skew_topup` (variance
    ``σ² − s²``, third cumulant ``skew``) and ``X_corr`` the correction distribution:
    ``Σ_j w_j Φ((Δ* + y_j)/√v)`` for a Gaussian top-up, and with the regularised incomplete
    gamma functions (``scipy.special.gammaincc``, ``scipy.special.gammainc``) for a
    gamma one. Where ``s² ≥ σ²`` (all rows used, or an early decision) the test draws a
    logistic and the probability is ``g(Δ*)``
    (:func:`~pymc_minibatch_mh.core.logistic.barker_probabilities`).

    Parameters
    ----------
    delta_star, variance, skew : array_like
        Δ*, s² and the top-up's third cumulant (the test's ``skew`` output), broadcast
        together.
    support, weights : numpy.ndarray
        Atoms and probabilities of the correction distribution.
    sigma : float
        Its σ.

    Returns
    -------
    numpy.ndarray
        The probabilities, of the broadcast shape.

    """
    delta, var, kappa = np.broadcast_arrays(
        np.asarray(delta_star, dtype=np.float64), np.asarray(variance, dtype=np.float64),
        np.asarray(skew, dtype=np.float64),
    )
    topup = np.maximum(sigma * sigma - var, 0.0)[..., None]
    x = delta[..., None] + support  # accept iff x + T > 0 for atom y_j
    k = np.broadcast_to(kappa[..., None], x.shape)
    per_atom = np.empty(x.shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        gauss = k == 0.0
        per_atom[gauss] = special.ndtr(x / np.sqrt(topup))[gauss]
        for sign, function in ((1.0, special.gammaincc), (-1.0, special.gammainc)):
            # κ > 0: P(Γ > kθ − x); κ < 0: P(Γ < kθ + x), Γ ~ Gamma(k, θ).
            mask = sign * k > 0.0
            v = np.broadcast_to(topup, x.shape)[mask]
            theta = np.abs(k[mask]) / (2.0 * v)
            shape = v / (theta * theta)
            per_atom[mask] = function(shape, np.maximum(shape - sign * x[mask] / theta, 0.0))
    result = per_atom @ weights
    return np.where(var < sigma * sigma, result, barker_probabilities(delta))
