"""Measure the minibatch Barker test's acceptance-probability error on a population.

The exact Barker test accepts with probability ``g(Δ)``; the minibatch test with
``P_test(accept | Δ) = E[p(Δ*, s², κ)]``, the mean over minibatches of its acceptance
probability given the minibatch (:func:`~pymc_minibatch_mh.core.skew.acceptance_probability`,
in closed form, so that only the minibatch is simulated). :func:`barker_acceptance_error`
runs the package's test (:class:`~pymc_minibatch_mh.core.barker.BarkerTest`, with its
stopping rules and skew correction) on a fixed population of ratios ``l_i`` and estimates
``P_test(accept | Δ) − g(Δ)`` for several Δ from the same minibatches.

Two control variates with exactly known means reduce the Monte Carlo error: the first
round's error ``e₁ = N·mean(l_B₁) − Σ l_i`` (mean 0) and ``e₁²`` (mean the variance of a
mean of ``b`` rows drawn without replacement). The error of the final Δ* is not used: the
test grows the minibatch when ``s² ≥ σ²``, and a stopped mean is not unbiased.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from pymc_minibatch_mh.core.barker import BarkerTest
from pymc_minibatch_mh.core.correction import CorrectionDistribution, get_correction
from pymc_minibatch_mh.core.logistic import barker_probability
from pymc_minibatch_mh.core.moments import finite_population_factor
from pymc_minibatch_mh.core.skew import acceptance_probability
from pymc_minibatch_mh.core.source import ArraySource

__all__ = ["AcceptanceError", "barker_acceptance_error"]


@dataclass(frozen=True)
class AcceptanceError:
    """Estimated acceptance-probability error of a test at several Δ.

    Attributes
    ----------
    delta : numpy.ndarray
        The log acceptance ratios Δ.
    error : numpy.ndarray
        Estimates of ``P_test(accept | Δ) − g(Δ)``.
    standard_error : numpy.ndarray
        Their Monte Carlo standard errors.
    fallback_rate : float
        Fraction of the replications in which the skew correction fell back.
    mean_batch_size : float
        Mean rows used per replication.

    """

    delta: NDArray[np.float64]
    error: NDArray[np.float64]
    standard_error: NDArray[np.float64]
    fallback_rate: float
    mean_batch_size: float


class _FirstRound:
    """An :class:`ArraySource` that records the mean of each step's first block."""

    def __init__(self, source: ArraySource) -> None:
        self.source = source
        self.n_total = source.n_total
        self.buffered = 0
        self.first_mean = math.nan
        self._first = True

    def start_step(self) -> None:
        self.source.start_step()
        self._first = True

    def draw_values(self, count: int) -> NDArray[np.float64]:
        values = self.source.draw_values(count)
        if self._first:
            self.first_mean = float(values.mean())
            self._first = False
        return values


def barker_acceptance_error(
    values: ArrayLike,
    delta: ArrayLike,
    *,
    batch_size: int,
    replications: int,
    rng: np.random.Generator,
    skew_correction: bool = False,
    correction: CorrectionDistribution | None = None,
    skew_sign: float = 1.0,
) -> AcceptanceError:
    """Estimate ``P_test(accept | Δ) − g(Δ)`` of the minibatch Barker test.

    Parameters
    ----------
    values : array_like
        The population of per-row ratios ``l_i`` (N values, at least two distinct).
    delta : array_like
        Log acceptance ratios Δ at which to measure (the data-free part is set to
        ``Δ − Σ l_i``; the minibatches do not depend on it, so one run serves every Δ).
    batch_size : int
        The test's ``batch_size`` (first minibatch and growth increment).
    replications : int
        Minibatches simulated.
    rng : numpy.random.Generator
        Two generators are spawned from it: one draws the rows, the other the test's own
        noise (which the closed form makes unnecessary, but the test draws all the same).
        Two calls with generators in the same state therefore see the same minibatches,
        whatever the test: their errors are paired.
    skew_correction : bool, optional
        Measure the skew-corrected test.
    correction : CorrectionDistribution, optional
        Default: the σ = 1 table.
    skew_sign : float, optional
        Multiplies the third cumulant the test chose, in the closed form only: ``-1``
        measures a deliberately wrong correction (for tests).

    Returns
    -------
    AcceptanceError
        Regression-adjusted Monte Carlo estimates with their standard errors.

    """
    population = np.ascontiguousarray(values, dtype=np.float64)
    deltas = np.atleast_1d(np.asarray(delta, dtype=np.float64))
    corr = correction if correction is not None else get_correction(1.0)
    test = BarkerTest(batch_size, corr, skew_correction=skew_correction)
    row_rng, test_rng = rng.spawn(2)
    source = _FirstRound(ArraySource(population, rng=row_rng))
    n_total = population.size
    total = math.fsum(population.tolist())
    out = np.empty((replications, 6))
    for r in range(replications):
        source.start_step()
        o = test(test_rng, source, 0.0)
        variance = math.inf if o.full_data else o.variance
        out[r] = (o.delta_star - total, variance, o.skew, o.skew_fallback, o.batch_size,
                  n_total * source.first_mean - total)
    error, kappa, e1 = out[:, 0], skew_sign * out[:, 2], out[:, 5]
    # Control variates: e₁ (mean 0) and e₁² (mean the variance of N times a mean of b rows
    # drawn without replacement, N² σ²/b · (1 − (b − 1)/(N − 1)), σ² the population's).
    b = min(batch_size, n_total)
    first_variance = n_total**2 * np.var(population) / b * finite_population_factor(b, n_total)
    controls = np.column_stack([e1, e1 * e1 - first_variance])
    centred = controls - controls.mean(axis=0)
    estimates, standard_errors = [], []
    for d in deltas:
        y = acceptance_probability(d + error, out[:, 1], corr.support, corr.weights,
                                   corr.sigma, kappa) - barker_probability(d)
        beta = np.linalg.lstsq(centred, y - y.mean(), rcond=None)[0]
        adjusted = y - controls @ beta
        estimates.append(adjusted.mean())
        standard_errors.append(adjusted.std(ddof=controls.shape[1] + 1) / math.sqrt(replications))
    return AcceptanceError(
        delta=deltas, error=np.array(estimates), standard_error=np.array(standard_errors),
        fallback_rate=float(out[:, 3].mean()), mean_batch_size=float(out[:, 4].mean()),
    )
