r"""The acceptance-probability error of the minibatch Barker test: its estimate and its audit.

The exact Barker test accepts with probability ``g(Δ) = 1/(1 + e^{−Δ})``. The minibatch
test accepts iff ``Δ* + X_nc + X_corr > 0``; given the minibatch (``Δ*`` and ``s²``) it
accepts with probability

.. math::

    p(Δ^*, s^2) = P(X_{nc} + X_{corr} > −Δ^*)
               = \sum_j w_j\,Q\bigl((−Δ^* − y_j)/\sqrt{σ^2 − s^2}\bigr)

(:func:`barker_accept_probability`, from the correction table's atoms ``y_j`` and
weights ``w_j``; ``Q = 1 − Φ``). Averaged over minibatches, ``E[p(Δ*, s²)] − g(Δ)`` is the
test's *bias* for the pair (θ, θ′): the quantity that matters for the chain.

Two error sources make the bias non-zero: the correction table (its L∞ error,
``correction.error``) and the non-normality of ``Δ*``. The first Edgeworth term of the
law of ``Δ* − Δ`` (third cumulant ``κ₃``) moves the acceptance probability by

.. math::

    \frac{κ_3}{6}\,g'''(Δ),\qquad |g'''| \le 1/8,

because the test's total noise ``(Δ* − Δ) + X_nc + X_corr`` is logistic up to that term
(Stein's identity ``E[f(Z) He₃(Z)] = E[f'''(Z)]``; the expansion: Hall [2]_; its use for
this test: Seita et al. [1]_). :func:`third_cumulant` gives ``κ₃`` of
``Δ*`` for a minibatch of ``n`` of ``N`` rows drawn without replacement;
:func:`edgeworth_bias` the signed first Edgeworth term; :func:`barker_error_estimate` the
per-step estimate the step methods report (first order in ``κ₃``, with the other terms
of that order); the audit records the full data's ``κ₃``
(:func:`population_third_cumulant`).

References
----------
.. [1] Seita, D., Pan, X., Chen, H., Canny, J. (2017). An Efficient Minibatch Acceptance
   Test for Metropolis-Hastings. UAI 2017 (Appendix A.5; arXiv v1, Appendix E).
.. [2] Hall, P. (1992). The Bootstrap and Edgeworth Expansion. Springer, section 2.2.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from scipy.special import stdtr
from scipy.stats import moment

from pymc_minibatch_mh.core.correction import CorrectionSampler
from pymc_minibatch_mh.core.logistic import barker_probability
from pymc_minibatch_mh.core.moments import finite_population_factor, population_variance
from pymc_minibatch_mh.core.penalty import BARKER, PenaltyCorrection, penalty_derivative
from pymc_minibatch_mh.core.skew import acceptance_probability

__all__ = [
    "acceptance_derivative",
    "barker_accept_probability",
    "barker_error_estimate",
    "barker_derivative",
    "barker_probability",  # defined in core.logistic (the Barker function g)
    "edgeworth_bias",
    "population_third_cumulant",
    "third_cumulant",
    "threshold_error_estimate",
]


@numba.njit(cache=True)
def barker_derivative(delta: float, order: int) -> float:
    """The ``order``-th derivative of ``g(Δ) = 1/(1 + e^{−Δ})`` (order 1, 2 or 3).

    Parameters
    ----------
    delta : float
        The point.
    order : {1, 2, 3}
        Which derivative.

    Returns
    -------
    float
        ``g(1 − g)``, ``g(1 − g)(1 − 2g)`` or ``g(1 − g)(1 − 6g(1 − g))``; ``|g'''| ≤ 1/8``.

    Examples
    --------
    >>> barker_derivative(0.0, 1), barker_derivative(0.0, 3)
    (0.25, -0.125)

    """
    g = barker_probability(delta)  # plain math: a ufunc call on a scalar costs ~1 µs
    v = g * (1.0 - g)
    if order == 1:
        return v
    if order == 2:
        return v * (1.0 - 2.0 * g)
    if order == 3:
        return v * (1.0 - 6.0 * v)
    raise ValueError("order must be 1, 2 or 3")


@numba.njit(cache=True)
def acceptance_derivative(kind: int, delta: float, sigma: float, order: int) -> float:
    """The ``order``-th derivative of the test's acceptance function at Δ.

    ``kind`` is :data:`~pymc_minibatch_mh.core.penalty.BARKER` (``g``,
    :func:`barker_derivative`) or :data:`~pymc_minibatch_mh.core.penalty.PENALTY`
    (``h_σ``, :func:`~pymc_minibatch_mh.core.penalty.penalty_derivative`).

    Examples
    --------
    >>> acceptance_derivative(0, 0.0, 1.0, 1)
    0.25

    """
    if kind == BARKER:
        return barker_derivative(delta, order)
    return penalty_derivative(delta, sigma, order)


@numba.njit(cache=True)
def _envelope(kind: int, delta: float, sigma: float) -> float:
    # A smooth bound of the third derivative's size near Δ: g' for Barker (|g‴| ≤ g'
    # everywhere); for the penalty function max(h', |h‴|) (h‴ changes sign, and h'
    # falls faster than |h‴| for Δ > 0).
    first = acceptance_derivative(kind, delta, sigma, 1)
    if kind == BARKER:
        return first
    return max(first, abs(acceptance_derivative(kind, delta, sigma, 3)))


def barker_accept_probability(
    delta_star: float, variance: float, correction: CorrectionSampler | None, *, exact: bool,
    skew: float = 0.0,
) -> float:
    """The minibatch Barker test's acceptance probability given its minibatch.

    Parameters
    ----------
    delta_star : float
        Δ*.
    variance : float
        s²(Δ*).
    correction : CorrectionDistribution
        The test's ``C_σ`` (its ``support``, ``weights`` and ``sigma`` are used).
    exact : bool
        Whether the test decided with a logistic draw (all rows used, or ``s² ≥ σ²``
        after an early decision): the probability is then ``g(Δ*)``.
    skew : float
        Third cumulant of the top-up the skew-corrected test drew (its ``skew`` stat);
        0: the Gaussian top-up.

    Returns
    -------
    float
        ``P(Δ* + X_nc + X_corr > 0 | Δ*, s²)`` with ``X_nc`` the top-up (variance
        ``σ² − s²``, third cumulant ``skew``) and ``X_corr ~ C_σ``, as
        :func:`~pymc_minibatch_mh.core.barker.barker_decision` decides
        (:func:`~pymc_minibatch_mh.core.skew.acceptance_probability`); 0 for a
        non-finite or NaN Δ* other than ``+inf`` (such steps reject).

    Examples
    --------
    >>> from pymc_minibatch_mh.core.correction import get_correction
    >>> c = get_correction(1.0)
    >>> abs(barker_accept_probability(0.3, 0.0, c, exact=False) - barker_probability(0.3)) < 1e-6
    True

    """
    if not math.isfinite(delta_star) or math.isnan(variance):
        return 0.0
    if isinstance(correction, PenaltyCorrection):
        if skew:
            raise ValueError("The penalty test has no skew-corrected top-up.")
        return correction.accept_probability(delta_star, variance, exact=exact)
    if exact or correction is None:
        return barker_probability(delta_star)
    return float(acceptance_probability(
        delta_star, variance, correction.support, correction.weights,  # type: ignore[attr-defined]
        correction.sigma, skew,
    ))


@numba.njit(cache=True)
def third_cumulant(mu3: float, n: int, n_total: int) -> float:
    """Third cumulant of ``Δ* = (N/n) Σ_B l_i`` for ``n`` of ``N`` rows drawn without replacement.

    Parameters
    ----------
    mu3 : float
        Third central moment of the N values ``l_i`` (divisor N), or an estimate of it.
    n, n_total : int
        Minibatch size and N.

    Returns
    -------
    float
        ``(N/n)³ · n μ₃ (N − n)(N − 2n) / ((N − 1)(N − 2))`` (0 at ``n = N``; for ``n ≪ N``
        about ``N³ μ₃ / n²``).

    Examples
    --------
    >>> third_cumulant(1.0, 10, 10)
    0.0

    """
    if n >= n_total or n < 1 or n_total < 3:
        return 0.0
    factor = (n_total - n) * (n_total - 2.0 * n) / ((n_total - 1.0) * (n_total - 2.0))
    return (n_total / n) ** 3 * n * mu3 * factor


def population_third_cumulant(values: np.ndarray, n: int) -> float:
    """``κ₃`` of Δ* at minibatch size ``n`` from all N values (the audit's full pass).

    Parameters
    ----------
    values : numpy.ndarray
        The N values ``l_i``.
    n : int
        The minibatch size the test used.

    Returns
    -------
    float
        :func:`third_cumulant` with the values' third central moment (SciPy's ``moment``).

    """
    return third_cumulant(float(moment(values, 3)), n, values.shape[0])


def edgeworth_bias(delta: float, kappa3: float) -> float:
    """The first Edgeworth term of the test's acceptance-probability error: ``κ₃ g'''(Δ)/6``.

    Parameters
    ----------
    delta : float
        Δ (or an estimate).
    kappa3 : float
        Third cumulant of Δ* (:func:`third_cumulant`).

    Returns
    -------
    float
        The signed first-order error ``E[p(Δ*, s²)] − g(Δ)`` due to the skewness of Δ*.

    """
    return kappa3 * barker_derivative(delta, 3) / 6.0


@numba.njit(cache=True)
def barker_error_estimate(
    delta_star: float,
    variance: float,
    skew: float,
    n: int,
    n_total: int,
    table_error: float,
    sigma: float,
    early: bool = False,
    kind: int = BARKER,
    kurtosis: float = 0.0,
) -> float:  # compiled: it runs every step
    r"""Per-step estimate of ``|E[p(Δ*, s²)] − g(Δ)|``, the test's acceptance-probability error.

    For the penalty test (``kind``), ``g`` stands for its acceptance function ``h_σ``
    throughout and ``g'`` for ``max(h_σ', |h_σ‴|)`` (``|h_σ‴| ≤ h_σ'`` does not hold
    for Δ > 0); its correction is exact (``table_error`` 0). It has a fourth term: the
    test tops the noise up to ``σ²`` with ``σ² − ŝ²``, so an error ``δ = s² − ŝ²`` of the
    variance estimate moves its acceptance probability by ``h_σ''(Δ) δ/2``, and
    ``h_σ''(0) ≠ 0`` (−0.37 at σ = 0.5; Barker's ``g''(0) = 0``, where that term is of
    second order and left to the error budget's guard); the estimate adds
    ``|h_σ''(Δ*)| s² sd(ŝ²/s²)/2`` with ``sd(ŝ²/s²) = √(2/(n − 1) + κ̂₄⁺/n)`` (``κ̂₄⁺``:
    the minibatch's excess kurtosis, at least 0).

    The sum of three terms, each from what the step observed:

    - the correction table's L∞ error (when the table was used);
    - ``|κ̂₃| g'(Δ*)``, the first-order (in the skewness of Δ*) size of three terms: the
      skewness of Δ* itself, ``κ₃ g'''(Δ)/6`` (:func:`edgeworth_bias`); the correlation
      of the variance estimate with Δ* that a skewed population creates
      (``Cov(s², Δ*) ≈ κ₃``; the test adds less noise when ``s²`` is large), about
      ``−κ₃ g'''(Δ)/2``; both at most ``(2/3)|κ₃| g'`` since ``|g'''| ≤ g'``; and the
      bias of the growth rule (a minibatch whose ``s²`` is too large is grown, and with
      skewed ratios its Δ* was large too), which has no closed form: simulated with
      exponential ratios at ``s ≈ 0.9σ`` it was ``0.1–0.3 |κ₃| g'(Δ)``. ``κ̂₃ = γ̂ s³/√n``
      times the finite-population factor (:func:`third_cumulant`), ``γ̂`` the skewness of
      the minibatch's values;
    - after an early decision with ``s² ≥ σ²``, the variance left in Δ*:
      ``s² |g''(Δ*)| / 2``.

    It is an *estimate*, not a bound: higher-order terms are left out, and the plug-in
    ``γ̂`` underestimates the skewness when a few rare, large rows dominate it (heavy
    tails), since most minibatches miss them. The audit (``audit_every``) measures the
    actual error.

    Parameters
    ----------
    delta_star, variance : float
        Δ* and s² of the step.
    skew : float
        Skewness ``γ̂`` of the minibatch's values (its sign does not matter).
    n, n_total : int
        Rows used and N.
    table_error : float
        L∞ error of the correction table.
    sigma : float
        σ of the test.
    early : bool
        Whether the early-decision rule ended the step.
    kind : int
        The acceptance function (:func:`acceptance_derivative`).
    kurtosis : float
        Excess kurtosis of the minibatch's values (used by the penalty test's term).

    Returns
    -------
    float
        The estimate; 0 at full data, NaN for a non-finite Δ*.

    Examples
    --------
    >>> barker_error_estimate(0.0, 0.5, 0.0, 100, 10_000, 1e-7, sigma=1.0)
    1e-07

    """
    if n >= n_total:
        return 0.0
    if not (math.isfinite(delta_star) and math.isfinite(variance) and math.isfinite(skew)):
        return math.nan
    estimate = 0.0
    if variance > 0.0 and n > 1:
        # σ̂² behind s² (the inverse of moments.delta_star_variance), then μ̂₃ = γ̂ σ̂³.
        sd = math.sqrt(population_variance(variance, n, n_total))
        kappa3 = third_cumulant(abs(skew) * sd**3, n, n_total)
        estimate += abs(kappa3) * _envelope(kind, delta_star, sigma)  # κ₃ < 0 for n > N/2
    if variance < sigma * sigma:
        estimate += table_error
        if kind != BARKER and variance > 0.0 and n > 1:
            estimate += 0.5 * abs(acceptance_derivative(kind, delta_star, sigma, 2)) * (
                variance * math.sqrt(2.0 / (n - 1.0) + max(kurtosis, 0.0) / n))
    elif early:
        estimate += 0.5 * variance * abs(acceptance_derivative(kind, delta_star, sigma, 2))
    return estimate


def threshold_error_estimate(mean: float, threshold: float, std: float, n: int,
                             n_total: int) -> float:
    """Per-step estimate of the probability that a threshold test (AustereMH, MHSubLhd) erred.

    The threshold tests accept iff the mean ratio of their rows exceeds a threshold
    (``μ0`` or ``ψ``); the exact test with the same ``u`` compares the full-data mean μ.
    The estimate is the probability that μ lies on the other side of the threshold given
    the minibatch, with the Student-t approximation of the minibatch mean (flat prior):
    ``P(T_{n−1} > |l̄ − threshold| / s)`` with ``s = σ̂/√n · √(1 − (n − 1)/(N − 1))``. For
    AustereMH it is the p-value its test stopped at.

    Parameters
    ----------
    mean, threshold : float
        ``l̄`` and the threshold.
    std : float
        The sample standard deviation of the rows used.
    n, n_total : int
        Rows used and N.

    Returns
    -------
    float
        The estimate: 0 at full data, NaN if a value is not finite.

    Examples
    --------
    >>> round(threshold_error_estimate(0.0, 0.0, 1.0, 100, 10_000), 3)
    0.5

    """
    if n >= n_total:
        return 0.0
    if not (math.isfinite(mean) and math.isfinite(threshold) and math.isfinite(std)) or n < 2:
        return math.nan
    se = std / math.sqrt(n) * math.sqrt(finite_population_factor(n, n_total))
    if se <= 0.0:
        return 0.0 if mean != threshold else 0.5
    return float(stdtr(n - 1, -abs(mean - threshold) / se))  # the Student t CDF
