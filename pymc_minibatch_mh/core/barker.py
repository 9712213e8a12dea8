"""The minibatch Barker acceptance test (Seita et al. 2017, Algorithm 1).

Barker's acceptance function ``g(s) = 1 / (1 + e^{-s})`` satisfies detailed balance, and
accepting with probability ``g(Δ)`` is the same as accepting iff ``Δ + X_log > 0`` with
``X_log`` standard logistic. Write ``X_log ≈ X_norm + X_corr`` with ``X_norm ~ N(0, σ²)``
and ``X_corr`` drawn from a precomputed correction distribution ``C_σ``. The minibatch
estimate ``Δ* = (N/b) Σ_B l_i + c`` is approximately ``N(Δ, s²)``; once ``s² < σ²``,
``Δ* + X_nc + X_corr`` with ``X_nc ~ N(0, σ² − s²)`` has approximately the law of
``Δ + X_log``, so the test ``Δ* + X_nc + X_corr > 0`` approximates the exact Barker test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np

from pymc_minibatch_mh.core.acceptance_error import barker_error_estimate
from pymc_minibatch_mh.core.arrays import copy_into
from pymc_minibatch_mh.core.common import TestOutcome, check_batch_size
from pymc_minibatch_mh.core.correction import CorrectionSampler
from pymc_minibatch_mh.core.logistic import barker_accepts, barker_probability
from pymc_minibatch_mh.core.moments import (
    chunk_moments,
    clt_error_bound,
    delta_star_variance,
    excess_kurtosis,
    merge_moments,
    merge_third_moment,
    rows_for_variance,
    skew_from_edgeworth,
    third_moment_sum,
)
from pymc_minibatch_mh.core.penalty import BARKER, PenaltyCorrection, acceptance_kind
from pymc_minibatch_mh.core.skew import skew_topup, skew_topup_cumulant
from pymc_minibatch_mh.core.source import MinibatchSource

__all__ = [
    "DONE",
    "EARLY",
    "GROWTH_FACTOR",
    "NEED_MORE",
    "STOPPED",
    "BarkerOutcome",
    "BarkerTest",
    "CorrectionSampler",
    "TestOutcome",  # defined in core.common (the fields every test reports)
    "barker_decision",
    "barker_probability",  # defined in core.logistic (the Barker function g)
    "barker_rounds",
    "barker_test",
    "growth_rows",
]

#: The block ran out before the test decided: evaluate more rows and call again.
NEED_MORE = 0
#: The test stopped: ``s² < σ²`` (and ``ε ≤ tolerance`` if set), or all N rows were used.
DONE = 1
#: The early-decision rule stopped the test.
EARLY = 2
#: A non-finite Δ* (or NaN spread) stopped the test; the proposal is rejected.
STOPPED = 3

#: A growing minibatch draws this many times the rows its variance predicts it needs
#: (:func:`growth_rows`), so that most growing steps need one more evaluation, not one
#: per round; the estimators' block-size policy assumes the same growth.
GROWTH_FACTOR: float = 1.15


@dataclass(slots=True)
class BarkerOutcome(TestOutcome):
    """Result of one minibatch Barker test.

    Attributes
    ----------
    delta_star : float
        The estimate Δ* of the log acceptance ratio Δ.
    variance : float
        Its estimated variance s²(Δ*) (0 when all data were used).
    epsilon : float
        Plug-in estimate of Novak's bound on the normal-approximation error of Δ*,
        from the minibatch's own moments (an estimate, not a bound; above 1 it says the
        normal approximation cannot be trusted at this batch size; standardised; see
        :func:`~pymc_minibatch_mh.core.moments.clt_error_bound`); 0 at full data.
    edgeworth : float
        First-order Edgeworth estimate of the same error (sharper, not a bound).
    early : bool
        Whether the early-decision rule ended the step.
    accept_prob : float
        ``g(Δ*)``, the Barker acceptance probability at the estimate.
    skew : float
        Third cumulant of the top-up noise the decision used (0: Gaussian or none).
    skew_fallback : bool
        Whether the skew-corrected test fell back to the Gaussian top-up (``σ² − s²`` too
        small for the third cumulant needed, :mod:`~pymc_minibatch_mh.core.skew`).
    error_estimate : float
        The step's estimate of its acceptance-probability error
        (:func:`~pymc_minibatch_mh.core.acceptance_error.barker_error_estimate`; 0 at full
        data, NaN when a non-finite ratio stopped the test).
    kurtosis : float
        The excess kurtosis of the minibatch's values at a stop with ``s² < σ²`` (the
        penalty test's error estimate uses it; the error budget records it); else 0.

    """

    delta_star: float
    variance: float
    epsilon: float
    edgeworth: float
    early: bool
    accept_prob: float
    skew: float = 0.0
    skew_fallback: bool = False
    error_estimate: float = math.nan
    kurtosis: float = 0.0


def barker_decision(
    rng: np.random.Generator,
    delta_star: float,
    variance: float,
    correction: CorrectionSampler,
    *,
    full_data: bool,
    skew: float = 0.0,
) -> bool:
    """The decision of the minibatch Barker test once the minibatch is fixed.

    Parameters
    ----------
    rng : numpy.random.Generator
        Source of ``X_nc`` and ``X_corr`` (or of the logistic draw).
    delta_star : float
        The estimate Δ*.
    variance : float
        Its variance s².
    correction : CorrectionSampler
        ``C_σ``; its ``sigma`` is σ. A :class:`~pymc_minibatch_mh.core.penalty.PenaltyCorrection`
        makes this the penalty test (its exact decision draws ``σZ + X_corr``).
    full_data : bool
        Whether Δ* = Δ (every row was used).
    skew : float, optional
        Third cumulant of the top-up ``X_nc`` (:func:`~.skew_topup`); 0: ``N(0, σ² − s²)``.

    Returns
    -------
    bool
        ``Δ* + X_nc + X_corr > 0`` when ``s² < σ²``; otherwise (all data used, or an early
        decision) the Barker decision given Δ*, ``Δ* + X_log > 0``.

    """
    sigma2 = correction.sigma * correction.sigma
    if full_data or variance >= sigma2:
        # The exact decision given Δ* (exact when Δ* = Δ, i.e. at full data).
        if isinstance(correction, PenaltyCorrection):
            return correction.exact_accepts(rng, delta_star)
        return barker_accepts(rng, delta_star)
    # sd · N(0, 1) (the same value as rng.normal(0, sd)), or the skewed top-up.
    x_nc = skew_topup(rng, sigma2 - variance, skew)
    return bool(delta_star + x_nc + correction.sample(rng) > 0.0)


@numba.njit(cache=True, nogil=True)
def barker_rounds(
    block: np.ndarray, buf: np.ndarray, n: int, mean: float, m2: float, rounds: int,
    n_total: int, batch_size: int, data_free: float, sigma2: float, tolerance: float,
    early_decision: float, skew: bool = False, m3: float = 0.0, table_error: float = 0.0,
    skew_floor: float = 0.0, kind: int = BARKER,
) -> tuple[Any, ...]:  # pragma: no cover
    """Run rounds of the minibatch Barker test on one block of evaluated ratios (compiled).

    The stopping rules of the test, implemented once: rounds of ``min(batch_size, N − n)``
    rows, the running moments, ``Δ* = N·mean + c``, ``s²`` of
    :func:`~pymc_minibatch_mh.core.moments.delta_star_variance`, stop when ``s² < σ²``
    (and ``ε ≤ tolerance`` if set), or on the early-decision rule, or at N rows.

    Parameters
    ----------
    block : numpy.ndarray
        Ratios ``l_i`` of rows not yet used in this step, in the order drawn.
    buf : numpy.ndarray
        The ratios used so far in this step (first ``n`` entries); the rounds append to
        it, so it must hold ``n + len(block)`` values.
    n, mean, m2, rounds : int, float, float, int
        The test's state: rows used, their mean and sum of squared deviations, rounds.
    n_total, batch_size : int
        N and the rows added per round (m).
    data_free : float
        The data-free part of Δ (finite).
    sigma2 : float
        σ² of the test.
    tolerance : float
        Stop only once ``ε ≤ tolerance`` too; a value ≤ 0 turns this off.
    early_decision : float
        Threshold of the early-decision rule; a value ≤ 0 turns it off.
    skew, m3 : bool, float, optional
        The skew-corrected test, and its state (the sum of cubed deviations so far): at a
        stop with ``s² < σ²``, :func:`~pymc_minibatch_mh.core.skew.skew_topup_cumulant`.
    table_error : float, optional
        The correction table's L∞ error, for the step's error estimate.
    skew_floor : float, optional
        The least skewness ``|γ̂|`` the error estimate uses (the minibatch's own when
        larger): with a budget-sized minibatch of a few rows, the skewness measured on
        the tuning minibatches (:mod:`~pymc_minibatch_mh.core.batch_budget`).
    kind : int, optional
        The acceptance function, for the error estimate
        (:func:`~pymc_minibatch_mh.core.penalty.acceptance_kind`: Barker's or the
        penalty test's).

    Returns
    -------
    tuple
        ``(status, used, n, mean, m2, rounds, delta_star, variance, epsilon, edgeworth,
        m3, kappa, fallback, error, kurtosis)`` with ``status`` one of :data:`NEED_MORE`,
        :data:`DONE`, :data:`EARLY`, :data:`STOPPED` and ``used`` the rows of ``block``
        consumed. ``epsilon`` and ``edgeworth`` (see
        :func:`~pymc_minibatch_mh.core.moments.clt_error_bound`) are computed when the test
        stops short of N rows; ``kappa`` is the top-up's third cumulant (0 on a fallback);
        ``error`` the step's
        :func:`~pymc_minibatch_mh.core.acceptance_error.barker_error_estimate` (0 at full
        data, NaN on a stop); ``kurtosis`` the minibatch's excess kurtosis at a stop with
        ``s² < σ²`` (the penalty test's error estimate uses it), else 0.

    """
    pos = 0
    length = block.shape[0]
    variance = math.inf
    delta_star = math.nan
    while True:
        count = min(batch_size, n_total - n)
        if pos + count > length:
            return (NEED_MORE, pos, n, mean, m2, rounds, delta_star, variance, 0.0, 0.0, m3,
                    0.0, False, 0.0, 0.0)
        chunk = block[pos : pos + count]
        copy_into(buf[n : n + count], chunk)
        c_mean, c_m2 = chunk_moments(chunk)
        pos += count
        rounds += 1
        if skew:
            c_m3 = third_moment_sum(chunk, c_mean)
            m3 = merge_third_moment(n, mean, m2, m3, count, c_mean, c_m2, c_m3)
        n, mean, m2 = merge_moments(n, mean, m2, count, c_mean, c_m2)
        delta_star = n_total * mean + data_free
        if not math.isfinite(delta_star) or math.isnan(m2):
            return (STOPPED, pos, n, mean, m2, rounds, delta_star, math.nan, math.nan, math.nan,
                    m3, 0.0, False, math.nan, 0.0)
        if n >= n_total:
            return (DONE, pos, n, mean, m2, rounds, delta_star, 0.0, 0.0, 0.0, m3, 0.0, False,
                    0.0, 0.0)
        variance = delta_star_variance(m2, n, n_total)  # inf for n < 2
        if variance < sigma2:
            epsilon, edgeworth = clt_error_bound(buf[:n], mean)
            if tolerance <= 0.0 or epsilon <= tolerance:
                kappa, fallback = 0.0, False
                if skew:
                    kappa, fallback = skew_topup_cumulant(n, n_total, m3, sigma2 - variance)
                kurtosis = excess_kurtosis(buf[:n], mean)
                error = _error(delta_star, variance, edgeworth, n, n_total, table_error,
                               sigma2, False, skew_floor, kind, kurtosis)
                return (DONE, pos, n, mean, m2, rounds, delta_star, variance, epsilon,
                        edgeworth, m3, 0.0 if fallback else kappa, fallback, error, kurtosis)
        if early_decision > 0.0 and abs(delta_star) >= early_decision * math.sqrt(variance):
            epsilon, edgeworth = clt_error_bound(buf[:n], mean)
            error = _error(delta_star, variance, edgeworth, n, n_total, table_error, sigma2,
                           True, skew_floor, kind, 0.0)
            return (EARLY, pos, n, mean, m2, rounds, delta_star, variance, epsilon, edgeworth,
                    m3, 0.0, False, error, 0.0)


@numba.njit(cache=True, nogil=True)
def _error(delta_star: float, variance: float, edgeworth: float, n: int, n_total: int,
           table_error: float, sigma2: float, early: bool,
           skew_floor: float, kind: int, kurtosis: float) -> float:  # pragma: no cover
    skew = max(skew_from_edgeworth(edgeworth, n), skew_floor)
    return barker_error_estimate(delta_star, variance, skew, n, n_total, table_error,
                                 math.sqrt(sigma2), early, kind, kurtosis)


def growth_rows(n: int, variance: float, n_total: int, batch_size: int, sigma2: float) -> int:
    """Rows to draw next when the test needs more than it has (whole rounds, ≤ N − n).

    The rows the test will need are predicted from its variance so far: ``s²`` falls
    below σ² at ``n' = N / (1 + σ²(N − n) / (n s²(n)))``
    (:func:`~pymc_minibatch_mh.core.moments.rows_for_variance`). The next draw asks for
    :data:`GROWTH_FACTOR`
    (1.15) times that, in whole rounds, so that most growing steps need one more
    evaluation instead of one per round. Only the cost and which random rows are drawn
    depend on this: rows drawn but not used take no part in the decision and are not
    counted.
    """
    if 0.0 < variance < math.inf:
        target = rows_for_variance(n, variance, n_total, sigma2)
        rounds = -(-(int(GROWTH_FACTOR * target) - n) // batch_size)  # ceiling division
        need = max(batch_size, rounds * batch_size)
    else:
        need = batch_size
    return min(n_total - n, need)


class BarkerTest:
    """The minibatch Barker test with fixed settings, reusable across steps.

    Parameters
    ----------
    batch_size : int
        Rows added per round (the paper's m); the first minibatch has this size too.
    correction : CorrectionSampler
        The correction distribution ``C_σ``; its ``sigma`` is the σ of the test. A
        :class:`~pymc_minibatch_mh.core.penalty.PenaltyCorrection` runs the penalty test
        (a Metropolis-type acceptance function, :mod:`~pymc_minibatch_mh.core.penalty`)
        with the same rounds.
    tolerance : float, optional
        If given, also grow the minibatch while ``epsilon > tolerance``. Note that
        ``epsilon > 6.4/√b`` always, so a tolerance δ needs ``b > (6.4/δ)²`` rows.
    early_decision : float, optional
        If given (the authors' code uses 5), stop growing as soon as
        ``|Δ*| / s ≥ early_decision`` and, if ``s² ≥ σ²`` still, decide with probability
        ``g(Δ*)`` (a logistic draw that ignores the remaining noise of Δ*). If Δ is
        normal around Δ* with sd s, the acceptance probability of that step is off by
        ``E|g(Δ*) − g(Δ)|``: with threshold 5 this is 7.3e-3 at s = 1, 1.5e-3 at
        s = 1.5, 3.2e-4 at s = 2 and 2.6e-5 at s = 3 (and 4.4e-2 at s = 1 with threshold
        3), far above the correction table's error; hence off by default.
    skew_correction : bool, default False
        Draw the top-up ``X_nc`` skewed (a centred gamma variable with the variance
        ``σ² − s²`` and the third cumulant estimated from the minibatch) so that the first
        Edgeworth term of the test's error cancels; see :mod:`~pymc_minibatch_mh.core.skew`.
    skew_floor : float, default 0
        The least skewness the per-step error estimate uses (see :func:`barker_rounds`).

    Notes
    -----
    Calling the test runs :func:`barker_rounds` on blocks of ratios from the source: the
    rows the source has already evaluated (``source.buffered``, e.g. evaluated together
    with the data-free part), then blocks sized by :func:`growth_rows`. The minibatch
    grows by ``batch_size`` rows while ``s² ≥ σ²`` (and, with a tolerance, while
    ``epsilon > tolerance``), never past N. With ``s² < σ²`` it accepts iff
    ``Δ* + X_nc + X_corr > 0`` with ``X_nc ~ N(0, σ² − s²)``, ``X_corr ~ C_σ``. When every
    row has been used, ``Δ* = Δ`` and it makes the exact Barker decision with a logistic
    draw (no correction table, hence no table error). A ``−inf`` ratio rejects (the
    proposal has zero likelihood); NaN or ``+inf`` rejects and sets ``nonfinite``.

    References
    ----------
    .. [1] Seita, D., Pan, X., Chen, H., Canny, J. (2017). An Efficient Minibatch
       Acceptance Test for Metropolis-Hastings. UAI 2017, Algorithm 1.

    """

    __slots__ = ("batch_size", "correction", "early_decision", "tolerance", "skew_correction",
                 "skew_floor", "_buf", "_settings")

    def __init__(
        self,
        batch_size: int,
        correction: CorrectionSampler,
        tolerance: float | None = None,
        early_decision: float | None = None,
        skew_correction: bool = False,
        skew_floor: float = 0.0,
    ) -> None:
        self.batch_size = check_batch_size(batch_size)
        self.skew_floor = float(skew_floor)
        self.correction = correction
        self.tolerance = tolerance
        self.early_decision = early_decision
        self.skew_correction = bool(skew_correction)
        sigma = correction.sigma
        # σ², tolerance and threshold as the compiled rounds take them (≤ 0: off).
        self._settings = (
            sigma * sigma,
            float(tolerance) if tolerance is not None else -1.0,
            float(early_decision) if early_decision is not None else -1.0,
            self.skew_correction,
            float(correction.error),  # the table's L∞ error
            self.skew_floor,
            acceptance_kind(correction),
        )
        self._buf = np.empty(1024)

    def __call__(
        self, rng: np.random.Generator, source: MinibatchSource, data_free: float
    ) -> BarkerOutcome:
        """Run one test.

        Parameters
        ----------
        rng : numpy.random.Generator
            Source of the test's randomness (``X_nc``, ``X_corr`` or the logistic draw).
        source : MinibatchSource
            Gives the ratios ``l_i`` of new rows (temperature applied), see
            :mod:`pymc_minibatch_mh.core.source`. The caller has opened the step.
        data_free : float
            The data-free part ``c(θ, θ') = log p0(θ') − log p0(θ) + log q(θ|θ') −
            log q(θ'|θ)``.

        Returns
        -------
        BarkerOutcome
            The decision and the test's statistics.

        """
        sigma2, tolerance, early, skew, table_error, skew_floor, kind = self._settings
        n = rounds = 0
        delta_star, variance, epsilon, edgeworth, error = data_free, 0.0, 0.0, 0.0, math.nan
        # -inf: the proposal is outside the prior's support; no data are needed.
        status = STOPPED if not math.isfinite(data_free) else NEED_MORE
        n_total = source.n_total
        m = self.batch_size
        buffered = source.buffered
        count = min(n_total, max(m, buffered - buffered % m))
        buf = self._buf
        mean = m2 = m3 = kappa = kurtosis = 0.0
        fallback = False
        while status == NEED_MORE:
            if buf.shape[0] < n + count:
                grown = np.empty(max(n + count, 2 * buf.shape[0]))
                grown[:n] = buf[:n]
                buf = self._buf = grown
            (status, _, n, mean, m2, rounds, delta_star, variance, epsilon, edgeworth, m3,
             kappa, fallback, error, kurtosis) = barker_rounds(
                source.draw_values(count), buf, n, mean, m2, rounds, n_total, m, data_free,
                sigma2, tolerance, early, skew, m3, table_error, skew_floor, kind,
            )
            if status == NEED_MORE:
                count = growth_rows(n, variance, n_total, m, sigma2)
        if status == STOPPED:
            # A rejection: −inf cleanly (zero likelihood or prior), NaN or +inf as a fault.
            # Before any row was used the spread stats are 0; after, they are NaN.
            accepted, nonfinite, accept_prob = False, not delta_star == -math.inf, 0.0
            variance = epsilon = edgeworth = 0.0 if n == 0 else math.nan
        else:
            accepted = barker_decision(
                rng, delta_star, variance, self.correction, full_data=n >= n_total, skew=kappa
            )
            nonfinite = False
            accept_prob = (self.correction.probability(delta_star) if kind != BARKER
                           else barker_probability(delta_star))
        return BarkerOutcome(
            accepted=accepted, batch_size=n, rounds=rounds, full_data=n >= n_total,
            nonfinite=nonfinite, extra_evaluations=0, delta_star=delta_star,
            variance=variance, epsilon=epsilon, edgeworth=edgeworth, early=status == EARLY,
            accept_prob=accept_prob, skew=kappa, skew_fallback=fallback, error_estimate=error,
            kurtosis=kurtosis,
        )


def barker_test(
    rng: np.random.Generator,
    source: MinibatchSource,
    data_free: float,
    *,
    batch_size: int,
    correction: CorrectionSampler,
    tolerance: float | None = None,
    early_decision: float | None = None,
    skew_correction: bool = False,
) -> BarkerOutcome:
    """Run one minibatch Barker test (see :class:`BarkerTest` for the settings).

    Parameters
    ----------
    rng : numpy.random.Generator
        Source of the test's randomness.
    source : MinibatchSource
        Gives the ratios of new rows; the caller has opened the step.
    data_free : float
        The data-free part of Δ.
    batch_size : int
        Rows added per round (m).
    correction : CorrectionSampler
        ``C_σ``.
    tolerance : float, optional
        See :class:`BarkerTest`.
    early_decision : float, optional
        See :class:`BarkerTest`.
    skew_correction : bool, optional
        See :class:`BarkerTest`.

    Returns
    -------
    BarkerOutcome
        The decision and the test's statistics.

    """
    test = BarkerTest(
        batch_size, correction, tolerance=tolerance, early_decision=early_decision,
        skew_correction=skew_correction,
    )
    return test(rng, source, data_free)
