"""``AustereMH``: the sequential t-test of Korattikara, Chen and Welling (2014) as a PyMC step."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike

from pymc_minibatch_mh.core import austere
from pymc_minibatch_mh.core.austere import DEFAULT_BATCH_SIZES, DEFAULT_EPSILONS, AustereOutcome
from pymc_minibatch_mh.estimators.ratio import RatioEstimator
from pymc_minibatch_mh.transition.schedule import TemperatureSchedule
from pymc_minibatch_mh.transition.settings import MoveSettings, StepSettings, document_parameters
from pymc_minibatch_mh.transition.step import MinibatchStep

__all__ = ["AustereMH"]


@document_parameters
class AustereMH(MinibatchStep):
    r"""Random-walk Metropolis-Hastings with AustereMH's sequential t-test.

    Each step draws ``u ~ U(0, 1)``, sets ``μ0 = (log u − c)/N`` and tests whether the
    mean ratio ``μ`` exceeds ``μ0`` with a t-test on a growing minibatch (``batch_size``
    rows per round): it decides as soon as the p-value is below ``epsilon`` and makes
    the exact Metropolis decision when all N rows are used. See
    :func:`pymc_minibatch_mh.core.austere.austere_test`.

    Parameters
    ----------
    vars : list of Variable, optional
        Continuous variables to sample as one block (default: all free variables).
    batch_size : int, default 100
        Rows per round m (with ``design="fixed"``).
    epsilon : float, default 0.05
        Per-test threshold ε of the p-value (with ``design="fixed"``).
    design : {"fixed", "conservative", "adaptive"}, default "fixed"
        ``"fixed"``: the user's ``(batch_size, epsilon)``. ``"conservative"``
        (AustereMH(c)): the ``(m, ε)`` of ``batch_sizes × epsilons`` with the least
        expected data whose worst-case error (standardised mean 0; the dynamic program of
        the Austerity appendix) is at most ``error_bound``, chosen once.
        ``"adaptive"`` (AustereMH(nc)): the design is chosen per step from the actual
        standardised mean, which needs a pass over all N rows per step; that pass is
        counted in the ``extra_evaluations`` stat.
    error_bound : float, default 0.05
        Bound on the test's error used by the conservative and adaptive designs.
    batch_sizes, epsilons : sequence
        The design grid (default: Seita et al.'s, m ∈ {50, ..., 500}, ε ∈ {0.001, ..., 0.2}).
    {shared_parameters}

    Notes
    -----
    Test-specific sample stats: ``mean_ratio`` (l̄), ``mu0``, ``t_statistic``,
    ``p_value``, ``design_epsilon``, ``design_batch_size``, ``mu_std`` (adaptive design
    only, else NaN) and ``design_feasible``. The acceptance test is Metropolis', so the
    ``accept`` stat is the 0/1 decision. ``error_estimate`` accounts for every look of
    the sequential test (:func:`~pymc_minibatch_mh.core.austere.austere_error_estimate`):
    with the adaptive design, the error of the whole test at the actual standardised
    mean; with a fixed or conservative design, an upper bound (the worst proposal with
    the step's spread of ratios, averaged over ``u``). ``p_value`` is the last look's
    alone and understates the error.

    References
    ----------
    .. [1] Korattikara, A., Chen, Y., Welling, M. (2014). Austerity in MCMC Land:
       Cutting the Metropolis-Hastings Budget. ICML 2014.
    """

    name = "austere_mh"
    test_stats = {
        "mean_ratio": (np.float64, []),
        "mu0": (np.float64, []),
        "t_statistic": (np.float64, []),
        "p_value": (np.float64, []),
        "design_epsilon": (np.float64, []),
        "design_batch_size": (np.int64, []),
        "mu_std": (np.float64, []),
        "design_feasible": (bool, []),
    }

    def __init__(
        self,
        vars: Sequence[Any] | None = None,
        *,
        batch_size: int = 100,
        epsilon: float = 0.05,
        design: Literal["fixed", "conservative", "adaptive"] = "fixed",
        error_bound: float = 0.05,
        batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
        epsilons: Sequence[float] = DEFAULT_EPSILONS,
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
        if design not in ("fixed", "conservative", "adaptive"):
            raise ValueError(
                f"design must be 'fixed', 'conservative' or 'adaptive', got {design!r}."
            )
        if not (0.0 < epsilon < 0.5):
            raise ValueError(f"epsilon must be in (0, 0.5), got {epsilon!r}.")
        if not (0.0 < error_bound < 1.0):
            raise ValueError(f"error_bound must be in (0, 1), got {error_bound!r}.")
        self.design = design
        self.epsilon = float(epsilon)
        self.error_bound = float(error_bound)
        self.batch_sizes = tuple(int(m) for m in batch_sizes)
        self.epsilons = tuple(float(e) for e in epsilons)
        self.chosen_design: austere.AustereDesign | None = None
        self._design_n: int | None = None
        self._table: Any = None
        if design != "fixed":
            batch_size = min(self.batch_sizes)
        super().__init__(vars, settings=StepSettings.take(locals()),
                         move_settings=MoveSettings.take(locals()))

    def _start_chain(self, rng: Any) -> None:
        super()._start_chain(rng)
        n = self._n_rows
        if self._design_n == n:
            return
        # Designs depend on N only; computed once per N (cached in the core).
        if self.design == "conservative":
            self.chosen_design = austere.conservative_design(
                n, self.error_bound, self.batch_sizes, self.epsilons
            )
            self.batch_size = self.chosen_design.batch_size
            self.epsilon = self.chosen_design.epsilon
            self.policy.reset(self.batch_size)
        elif self.design == "adaptive":
            self._table = austere.design_table(
                n, self.error_bound, self.batch_sizes, self.epsilons
            )
        if self.design != "adaptive" and n > 1:
            # Tabulate the error estimate's bound now (cached per design and N, 1-3 s),
            # not in the first step.
            austere.averaged_error_bound(1.0, self.batch_size, self.epsilon, n)
        self._design_n = n

    def _decide(self, estimator: RatioEstimator, data_free: float) -> AustereOutcome:
        if self.design == "adaptive":
            return austere.austere_nc_test(
                self.rng, estimator, data_free, design_table=self._table
            )
        return austere.austere_test(
            self.rng, estimator, data_free, batch_size=self.batch_size, epsilon=self.epsilon
        )

    def _error_estimate(self, outcome: AustereOutcome) -> float:
        return austere.austere_error_estimate(outcome, self._n_rows)

    def _test_stat_values(self, outcome: AustereOutcome) -> dict[str, Any]:
        return {
            "mean_ratio": outcome.mean,
            "mu0": outcome.mu0,
            "t_statistic": outcome.t_statistic,
            "p_value": outcome.p_value,
            "design_epsilon": outcome.epsilon,
            "design_batch_size": outcome.design_batch_size,
            "mu_std": outcome.mu_std if math.isfinite(outcome.mu_std) else math.nan,
            "design_feasible": outcome.design_feasible,
        }
