r"""A minibatch sized by an error budget: the rows per round that keep the test's error small.

The minibatch Barker test reads at least one round of ``m`` rows per step, then grows in
rounds of ``m`` until ``s² < σ²``. With control variates at large N the residuals are tiny
and ``s²`` is far below σ² after a handful of rows, so a fixed floor of 100 rows reads
rows the decision does not need. This module sizes ``m`` from what the test measured
during tuning instead, for a given budget on the per-step acceptance-probability error.

Each tuning transition that stopped on a minibatch gives the population spread of its
per-row values, ``σ̂² = s² n / (N² f(n))`` with ``f`` the finite-population factor, their
skewness ``γ̂`` and ``Δ*``. From these the error the same proposal would have at another
``m`` is predicted (:func:`predicted_error`):

- the rows it would use: ``m``, or the first multiple of ``m`` where
  ``s²(n) = N² σ̂² f(n)/n`` falls below σ² (the growth rule), at most N;
- at those rows, the mean of the step's own error estimate
  (:func:`~pymc_minibatch_mh.core.acceptance_error.barker_error_estimate`: the correction
  table's error plus ``|κ̂₃| g'(Δ*)``, with ``κ̂₃`` scaling as ``1/n²``), whose plug-in
  ``σ̂³`` from ``n`` rows is ``E[(χ²_k/k)^{3/2}]`` times ``σ³`` on average (``k = n − 1``;
  1.6 at ``n = 2``, 1.1 at ``n = 10``), so that the mean ``error_estimate`` stat of the
  sampled draws stays within the budget too;
- plus a guard that the per-step estimate does not carry: ``s²`` is itself estimated
  from the ``n`` rows (relative sd ``√(2/(n − 1))`` for near-normal values), and the
  growth rule stops on the rounds where it came out low, which shifts the acceptance
  probability by about ``½ |g''(Δ*)| · (s² − ŝ²)``. The guard
  ``½ |g''(Δ*)| s² √(2/(n − 1))`` keeps ``m`` from falling where ``s²`` is not small
  next to σ² but few rows estimate it; where control variates make ``s²`` tiny it is
  negligible and ``m`` may fall to :data:`MIN_ROWS`.

:func:`choose_rows` takes the smallest ``m`` on a grid whose mean predicted error over the
recorded transitions, plus :data:`BUDGET_CONFIDENCE` standard errors of that mean, is
within the budget. The records are a sample (about 50 tuning transitions) of a
heavy-tailed quantity: the error of a step grows with its spread, and a few wide moves
dominate the mean; the mean alone put the sampled draws' mean estimate at 0.88–1.19 times
the budget over seven seeds (the penalty test at σ = 0.1, N = 10⁴, d = 10), half of the
chains over it. The prediction rests on the error estimate,
which is optimistic for heavy-tailed values (a few rare, large rows; see the guide's "How
wrong" page): the audit (``audit_every``) measures the truth.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numba
import numpy as np

from pymc_minibatch_mh.core.acceptance_error import acceptance_derivative, barker_error_estimate
from pymc_minibatch_mh.core.moments import (
    delta_star_variance,
    population_variance,
    rows_for_variance,
    skew_from_edgeworth,
)
from pymc_minibatch_mh.core.penalty import BARKER

__all__ = [
    "AUTO_START_ROWS",
    "BUDGET_CONFIDENCE",
    "DEFAULT_ERROR_TOLERANCE",
    "MEASURE_EVERY",
    "MEASURE_FIRST",
    "MIN_RECORDS",
    "MIN_ROWS",
    "RECHOOSE_EVERY",
    "ErrorBudget",
    "RowsChoice",
    "cheapest_rows",
    "choose_rows",
    "predicted_error",
]

#: Rows per round while ``batch_size="auto"`` measures (tuning): the first rounds of the
#: measuring transitions, whose records the choice of m is made from.
AUTO_START_ROWS: int = 100
#: The fewest rows per round: two rows are the fewest with a variance.
MIN_ROWS: int = 2
#: The default per-step budget on the acceptance-probability error.
DEFAULT_ERROR_TOLERANCE: float = 1e-3
#: The fewest recorded tuning transitions the choice is made from.
MIN_RECORDS: int = 50
#: Tuning transitions that measure at :data:`AUTO_START_ROWS` rows per round: the first
#: this many, then one each time the others (which use the m chosen so far, so that
#: tuning reads few rows too) have read :data:`MEASURE_EVERY` times as many rows as a
#: measuring transition's first round.
MEASURE_FIRST: int = 50
#: See :data:`MEASURE_FIRST`: one measuring transition in 64 where the others read as many
#: rows as it does, and its rows at most about 1/64 of the tuning's wherever they read
#: fewer (with control variates at N = 10⁷, d = 10, 2 rows each: none in a chain of
#: PyMC's 1000 tuning draws).
MEASURE_EVERY: int = 64
#: During tuning m is chosen again from the records every this many transitions.
RECHOOSE_EVERY: int = 100
#: The chosen m keeps the mean predicted error plus this many of its standard errors
#: (over the records) within the budget: a one-sided bound at about 98 %.
BUDGET_CONFIDENCE: float = 2.0


@numba.njit(cache=True)
def _grown(m: int, n_total: int, spread: float,
           sigma2: float) -> tuple[int, float]:  # pragma: no cover (compiled)
    """The rows a step reads at ``m`` rows per round, and the variance of its Δ* there.

    The growth rule for values of population variance ``spread``: the first round past the
    rows where ``s²`` falls below ``σ² = sigma2`` (the rows may exceed N).
    """
    n = m
    variance = delta_star_variance(spread * (n - 1.0), n, n_total)
    if sigma2 <= variance < math.inf:
        n = m * (int(rows_for_variance(m, variance, n_total, sigma2) / m) + 1)
        variance = delta_star_variance(spread * (n - 1.0), n, n_total)
    return n, variance


@numba.njit(cache=True)
def _mean_rows(m: int, n_total: int, spread: np.ndarray,
               sigma: float) -> float:  # pragma: no cover (compiled)
    """The mean over the records of the rows a step reads at ``m`` rows per round (at most N)."""
    total = 0.0
    for i in range(spread.shape[0]):
        total += min(_grown(m, n_total, spread[i], sigma * sigma)[0], n_total)
    return total / spread.shape[0]


@numba.njit(cache=True)
def predicted_error(
    m: int, n_total: int, delta_star: np.ndarray, spread: np.ndarray, skew: np.ndarray,
    table_error: float, sigma: float, kind: int = BARKER, kurtosis: float = 0.0,
) -> tuple[float, float, float]:  # pragma: no cover (compiled)
    """Mean predicted error and rows per step at ``m`` rows per round (see the module).

    Parameters
    ----------
    m : int
        Rows per round (≥ 2).
    n_total : int
        N.
    delta_star, spread, skew : numpy.ndarray
        Per recorded transition: Δ*, the population variance ``σ̂²`` of its values and
        their skewness ``|γ̂|``.
    table_error : float
        The correction table's L∞ error.
    sigma : float
        σ of the test.
    kind : int
        Its acceptance function (:func:`~pymc_minibatch_mh.core.penalty.acceptance_kind`).
    kurtosis : float
        The values' excess kurtosis (the records' mean): the penalty test's estimate has a
        term for the error of ``ŝ²``, which stands in for the guard below.

    Returns
    -------
    tuple of float
        The mean over the records of the predicted error (the per-step estimate plus the
        variance-estimate guard; 0 for a step that would read all N rows), of the rows,
        and the standard error of the first mean (0 with one record).

    """
    sigma2 = sigma * sigma
    total_error = 0.0
    total_square = 0.0
    total_rows = 0.0
    count = delta_star.shape[0]
    for i in range(count):
        n, variance = _grown(m, n_total, spread[i], sigma2)
        if n >= n_total:
            total_rows += n_total
            continue  # an error of 0
        # The step's estimate plugs in the spread of its n rows: with k = n − 1 degrees of
        # freedom E[σ̂³] = σ³ (2/k)^{3/2} Γ((k + 3)/2)/Γ(k/2) (1.6 σ³ at n = 2).
        k = n - 1.0
        plug_in = math.exp(1.5 * math.log(2.0 / k) + math.lgamma(0.5 * (k + 3.0))
                           - math.lgamma(0.5 * k))
        error = plug_in * barker_error_estimate(delta_star[i], variance, skew[i], n, n_total,
                                                table_error, sigma, False, kind, kurtosis)
        if kind == BARKER:  # the penalty test's own estimate has this term
            error += 0.5 * abs(acceptance_derivative(kind, delta_star[i], sigma, 2)) * (
                variance * math.sqrt(2.0 / (n - 1.0)))
        total_error += error
        total_square += error * error
        total_rows += n
    mean = total_error / count
    spread_of_mean = 0.0
    if count > 1:
        spread_of_mean = math.sqrt(max(total_square / count - mean * mean, 0.0)
                                   * count / (count - 1.0) / count)
    return mean, total_rows / count, spread_of_mean


@dataclass(frozen=True, slots=True)
class RowsChoice:
    """The rows per round chosen for a budget, and what they were predicted to give.

    Attributes
    ----------
    rows : int
        Rows per round ``m`` (the first minibatch and the growth increment).
    predicted_error : float
        Mean predicted acceptance-probability error per step at ``rows``.
    predicted_rows : float
        Mean predicted rows per step at ``rows``.
    within_budget : bool
        Whether ``error_bound`` is within the budget (False: no ``m`` up to the cap
        meets it, and the cap was taken).
    records : int
        Transitions the choice was made from.
    skew : float
        Their mean ``|γ̂|``: with few rows per round a minibatch's own skewness says
        little, and the step's error estimate then uses at least this one, measured on the
        tuning minibatches.
    error_bound : float
        ``predicted_error`` plus :data:`BUDGET_CONFIDENCE` standard errors of it over the
        records: what the choice holds to the budget.

    """

    rows: int
    predicted_error: float
    predicted_rows: float
    within_budget: bool
    records: int
    skew: float
    error_bound: float = math.nan


@functools.lru_cache(maxsize=64)
def _candidates(cap: int) -> tuple[int, ...]:
    """Rows per round to consider: :data:`MIN_ROWS`, ``cap`` and about 20 per decade between.

    Kept per ``cap``: a tuning choice asks for them once per option (about ten) each time.
    """
    decades = max(1.0, math.log10(cap / MIN_ROWS))
    grid = np.unique(np.round(np.geomspace(MIN_ROWS, cap, int(20 * decades) + 2)).astype(int))
    return tuple(int(m) for m in grid)


def cheapest_rows(
    n_total: int, spread: np.ndarray, sigma: float, cap: int,
    cost: Callable[[float, float], float],
) -> int:
    """The rows per round of least predicted ``cost(rows, rounds)`` per step, whatever the error.

    For steps whose draws are not kept (tuning's that do not measure): their test still
    grows until ``s² < σ²``, so the rows follow the growth rule of :func:`predicted_error`
    (mean over the records of their population variances ``spread``), and the rounds are
    those rows over ``m``. The candidates are those of :func:`choose_rows`; the smallest on
    a tie.
    """
    cap = max(MIN_ROWS, min(int(cap), int(n_total)))
    spread = np.ascontiguousarray(spread, dtype=np.float64)
    best, best_cost = MIN_ROWS, math.inf
    for m in _candidates(cap):
        rows = _mean_rows(m, int(n_total), spread, float(sigma))
        value = cost(rows, rows / m)
        if value < best_cost:
            best, best_cost = m, value
    return best


def choose_rows(
    n_total: int, delta_star: np.ndarray, spread: np.ndarray, skew: np.ndarray,
    budget: float, table_error: float, sigma: float, cap: int, kind: int = BARKER,
    kurtosis: float = 0.0,
) -> RowsChoice:
    """The smallest rows per round whose predicted error bound is within ``budget``.

    The bound is the mean predicted error over the records plus :data:`BUDGET_CONFIDENCE`
    standard errors of that mean.

    Each record's skewness is taken as at least the records' mean (as the step's error
    estimate will: ``RowsChoice.skew``). The candidates are :data:`MIN_ROWS`, ``cap``
    (at most N) and about 20 values per decade between them; the first that meets the
    budget is refined by bisection against the one before it (the predicted error falls
    with m, so the result is the smallest m within the budget; a smaller m reads fewer
    rows).

    Parameters
    ----------
    n_total : int
        N.
    delta_star, spread, skew : numpy.ndarray
        The records (see :func:`predicted_error`).
    budget : float
        The per-step error budget.
    table_error, sigma : float
        Of the test's correction table.
    cap : int
        The most rows per round to consider.
    kind : int, optional
        The test's acceptance function (:func:`~pymc_minibatch_mh.core.penalty.acceptance_kind`).
    kurtosis : float, optional
        The records' mean excess kurtosis (see :func:`predicted_error`).

    Returns
    -------
    RowsChoice
        The choice (``cap`` if no candidate meets the budget).

    """
    cap = max(MIN_ROWS, min(int(cap), int(n_total)))
    # The step's estimate uses at least the records' mean skewness (a few rows cannot
    # measure it, RowsChoice.skew), so the prediction does too.
    mean_skew = float(np.mean(skew))
    skew = np.maximum(skew, mean_skew)
    grid = _candidates(cap)
    args = (np.ascontiguousarray(delta_star, dtype=np.float64),
            np.ascontiguousarray(spread, dtype=np.float64),
            np.ascontiguousarray(skew, dtype=np.float64), float(table_error), float(sigma),
            int(kind), float(kurtosis))
    error = rows = bound = math.nan
    count, low = int(delta_star.shape[0]), MIN_ROWS - 1
    for m in grid:
        error, rows, se = predicted_error(m, int(n_total), *args)
        bound = error + BUDGET_CONFIDENCE * se
        if bound <= budget:
            high = m
            # Bisection between the last candidate over the budget and this one.
            while high - low > 1:
                mid = (low + high) // 2
                mid_error, mid_rows, mid_se = predicted_error(mid, int(n_total), *args)
                mid_bound = mid_error + BUDGET_CONFIDENCE * mid_se
                if mid_bound <= budget:
                    high, error, rows, bound = mid, mid_error, mid_rows, mid_bound
                else:
                    low = mid
            return RowsChoice(high, error, rows, True, count, mean_skew, bound)
        low = m
    return RowsChoice(grid[-1], error, rows, False, count, mean_skew, bound)


class ErrorBudget:
    """Records a chain's tuning transitions and chooses its rows per round from them.

    Parameters
    ----------
    tolerance : float
        The per-step budget on the acceptance-probability error.
    sigma : float
        σ of the test.
    table_error : float
        The correction table's L∞ error.
    kind : int, optional
        The test's acceptance function (:func:`~pymc_minibatch_mh.core.penalty.acceptance_kind`).

    """

    __slots__ = ("tolerance", "sigma", "table_error", "kind", "_records", "_array", "_pilot")

    def __init__(self, tolerance: float, sigma: float, table_error: float,
                 kind: int = BARKER) -> None:
        self.kind = int(kind)
        self.tolerance = float(tolerance)
        self.sigma = float(sigma)
        self.table_error = float(table_error)
        self._records: list[tuple[float, float, float, float, float]] = []
        self._array: np.ndarray | None = None  # the records as an array, once asked for
        # The records every chain starts with (:meth:`keep_as_pilot`).
        self._pilot: list[tuple[float, float, float, float, float]] = []

    def reset(self) -> None:
        """Forget the chain's records (a chain's start): back to the pilot's, if any."""
        self._records = list(self._pilot)
        self._array = None

    def clear(self) -> None:
        """Forget every record, the pilot's too."""
        self._pilot = []
        self.reset()

    def keep_as_pilot(self) -> None:
        """Make the records so far the ones every chain starts with (:meth:`reset`)."""
        self._pilot = list(self._records)

    @property
    def pilot_records(self) -> int:
        """The records every chain starts with (0 without a pilot)."""
        return len(self._pilot)

    def __len__(self) -> int:
        return len(self._records)

    def record(self, n: int, n_total: int, variance: float, edgeworth: float,
               delta_star: float, kurtosis: float = 0.0, rho: float = 0.0) -> None:
        """Record one transition that stopped on ``n`` rows with ``s² = variance``.

        Transitions that read all N rows, or fewer than two, or stopped on a non-finite
        value, carry no spread and are skipped. ``edgeworth`` is the test's Edgeworth stat,
        ``kurtosis`` the penalty test's excess kurtosis of its values, ``rho`` the
        autoregression coefficient of the move (Crank–Nicolson's; 0 for the others).
        """
        if not (1 < n < n_total and 0.0 < variance < math.inf and math.isfinite(delta_star)
                and math.isfinite(edgeworth)):
            return
        skew = skew_from_edgeworth(edgeworth, n)
        self._array = None
        self._records.append((delta_star, population_variance(variance, n, n_total), abs(skew),
                              kurtosis if math.isfinite(kurtosis) else 0.0, float(rho)))

    def choose(self, n_total: int, *, sigma: float | None = None,
               table_error: float | None = None, kind: int | None = None,
               rho: float | None = None) -> RowsChoice:
        """The rows per round for the budget, from the second half of the records.

        The first half is left out (the proposal's scale is still being tuned there), but
        at least the last :data:`MIN_RECORDS` records are used. The records describe the
        rows, not the test: ``sigma``, ``table_error`` and ``kind`` choose for another
        test than the budget's own; ``rho`` for moves with
        another autoregression coefficient than the records': a record of a move with a
        larger ρ has its spread scaled up by ``(1 − rho)/(1 − ρ)``, the ratio of the
        moves' mean squared lengths in the surrogate's whitened coordinates (``2 − 2ρ``
        per coordinate), and one of a move with a smaller ρ keeps its spread (an upper
        bound: the residuals of over-relaxed moves were measured 1.0–1.5 times as
        spread as those of the independence sampler's).
        """
        kept, spread = self._kept(rho)
        return choose_rows(
            n_total, kept[:, 0], spread, kept[:, 2], self.tolerance,
            self.table_error if table_error is None else table_error,
            self.sigma if sigma is None else sigma, n_total,
            self.kind if kind is None else kind, float(np.mean(kept[:, 3])))

    def cheapest(self, n_total: int, cost: Callable[[float, float], float], *,
                 rho: float | None = None) -> int:
        """The rows per round of least predicted ``cost(rows, rounds)``, whatever the error.

        :func:`cheapest_rows` for the budget's test, from the records :meth:`choose` uses
        (``rho`` as there).
        """
        return cheapest_rows(n_total, self._kept(rho)[1], self.sigma, n_total, cost)

    def _kept(self, rho: float | None) -> tuple[np.ndarray, np.ndarray]:
        """The records a choice is made from, and their spreads for moves of ``rho``."""
        count = len(self._records)
        first = max(0, min(count // 2, count - MIN_RECORDS))
        if self._array is None:  # one conversion for the options of a choice
            self._array = np.asarray(self._records, dtype=np.float64)
        kept = self._array[first:]
        spread = kept[:, 1]
        if rho is not None:
            spread = spread * np.maximum(1.0, (1.0 - rho) / (1.0 - kept[:, 4]))
        return kept, spread
