"""``MHSubLhd``: the adaptive subsampling test of Bardenet, Doucet and Holmes (2014)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from pymc_minibatch_mh.core.subsampling import (
    MHSubLhdOutcome,
    mhsublhd_error_estimate,
    mhsublhd_test,
)
from pymc_minibatch_mh.estimators.ratio import RatioEstimator
from pymc_minibatch_mh.transition.schedule import TemperatureSchedule
from pymc_minibatch_mh.transition.settings import MoveSettings, StepSettings, document_parameters
from pymc_minibatch_mh.transition.step import MinibatchStep

__all__ = ["MHSubLhd"]

RangeBound = Callable[[Mapping[str, Any], Mapping[str, Any]], float]


@document_parameters
class MHSubLhd(MinibatchStep):
    r"""Random-walk Metropolis-Hastings with MHSubLhd's concentration-bound test.

    Each step draws ``u ~ U(0, 1)``, sets ``ψ = (log u − c)/N`` and grows the minibatch
    geometrically (``n ← ⌈γ n⌉``) until an empirical Bernstein(-Serfling) bound ``c_k``
    separates the mean ratio from ψ (``|l̄ − ψ| > c_k``), with the error split as
    ``δ_k = δ (p − 1)/(p k^p)`` over the rounds; it makes the exact Metropolis decision
    at n = N. See :func:`pymc_minibatch_mh.core.subsampling.mhsublhd_test`.

    Parameters
    ----------
    vars : list of Variable, optional
        Continuous variables to sample as one block (default: all free variables).
    batch_size : int, default 100
        Initial minibatch size.
    delta : float, default 0.01
        Total error probability δ of the test.
    gamma : float, default 1.5
        Geometric growth factor γ > 1.
    p : float, default 2.0
        Exponent p > 1 of the error split over rounds.
    range_bound : callable, optional
        ``range_bound(point, proposed_point) -> float``, a bound on
        ``max_i l_i − min_i l_i`` over the whole data set for the pair (points are dicts
        of the sampled variables' transformed values; the temperature is already applied
        to the l_i, so include the 1/K factor). Without it, the range is computed by a
        pass over all N rows every step (what the original code and Seita et al. did),
        and that pass is counted in the ``extra_evaluations`` stat.
    bernstein_serfling : bool, default True
        Multiply the first term of the bound by ``√(1 − (n − 1)/N)`` (sampling without
        replacement).
    {shared_parameters}

    Notes
    -----
    Test-specific sample stats: ``psi`` (ψ), ``mean_ratio`` (l̄), ``bound`` (the last
    c_k), ``delta_k`` and ``range_bound`` (C_{θ,θ'}). ``error_estimate`` is the test's own
    guarantee, a bound on the probability of a wrong decision over the whole sequence of
    checks (:func:`~pymc_minibatch_mh.core.subsampling.mhsublhd_error_estimate`; below δ).

    References
    ----------
    .. [1] Bardenet, R., Doucet, A., Holmes, C. (2014). Towards scaling up Markov chain
       Monte Carlo: an adaptive subsampling approach. ICML 2014.
    """

    name = "mhsublhd"
    test_stats = {
        "psi": (np.float64, []),
        "mean_ratio": (np.float64, []),
        "bound": (np.float64, []),
        "delta_k": (np.float64, []),
        "range_bound": (np.float64, []),
    }

    def __init__(
        self,
        vars: Sequence[Any] | None = None,
        *,
        batch_size: int = 100,
        delta: float = 0.01,
        gamma: float = 1.5,
        p: float = 2.0,
        range_bound: RangeBound | None = None,
        bernstein_serfling: bool = True,
        temperature: float | TemperatureSchedule = 1.0,
        S: ArrayLike | str | None = None,
        scaling: float = 1.0,
        tune: bool = True,
        target_accept: float | None = None,
        control_variate: str | None = None,
        reference: Mapping[str, Any] | None = None,
        recenter: float | None = None,
        proposal: Any = None,
        audit_every: int | None = None,
        steps_per_draw: int | str = "auto",
        model: Any = None,
        rng: Any = None,
        initial_point: Mapping[str, Any] | None = None,
        mode: str | None = None,
        check_start: bool = True,
        prefetch: int | str = "auto",
        blocked: bool = True,
        data: Mapping[str, Any] | None = None,
        shuffled_copy: bool = False,
    ) -> None:
        if not (0.0 < delta < 1.0):
            raise ValueError(f"delta must be in (0, 1), got {delta!r}.")
        if not gamma > 1.0:
            raise ValueError(f"gamma must be > 1, got {gamma!r}.")
        if not p > 1.0:
            raise ValueError(f"p must be > 1, got {p!r}.")
        self.delta = float(delta)
        self.gamma = float(gamma)
        self.p = float(p)
        self.range_bound = range_bound
        self.bernstein_serfling = bool(bernstein_serfling)
        super().__init__(vars, settings=StepSettings.take(locals()),
                         move_settings=MoveSettings.take(locals()))

    def _decide(self, estimator: RatioEstimator, data_free: float) -> MHSubLhdOutcome:
        bound: Any = None
        if self.range_bound is not None:
            user = self.range_bound
            pmap = self.likelihood.point_map

            def bound() -> float:
                cur = pmap.to_point(estimator.x_cur, {})
                prop = pmap.to_point(estimator.x_prop, {})
                return float(user(cur, prop))

        return mhsublhd_test(
            self.rng,
            estimator,
            data_free,
            batch_size=self.batch_size,
            delta=self.delta,
            gamma=self.gamma,
            p=self.p,
            range_bound=bound,
            bernstein_serfling=self.bernstein_serfling,
        )

    def _error_estimate(self, outcome: MHSubLhdOutcome) -> float:
        return mhsublhd_error_estimate(
            outcome, self._n_rows, batch_size=self.batch_size, delta=self.delta,
            gamma=self.gamma, p=self.p,
        )

    def _test_stat_values(self, outcome: MHSubLhdOutcome) -> dict[str, Any]:
        return {
            "psi": outcome.psi,
            "mean_ratio": outcome.mean,
            "bound": outcome.bound,
            "delta_k": outcome.delta_k,
            "range_bound": outcome.range_bound,
        }
