"""``MinibatchBarker``: the minibatch Barker test of Seita et al. (2017) as a PyMC step."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pymc_minibatch_mh.adapter.base import MinibatchStep
from pymc_minibatch_mh.adapter.kernel import EARLY, STOPPED
from pymc_minibatch_mh.adapter.source import PairSource
from pymc_minibatch_mh.core.barker import (
    BarkerOutcome,
    barker_decision,
    barker_probability,
    barker_test,
    decided_outcome,
    rejected_outcome,
)
from pymc_minibatch_mh.core.correction import LOGISTIC_SD, CorrectionDistribution, get_correction

__all__ = ["MinibatchBarker"]


class MinibatchBarker(MinibatchStep):
    r"""Random-walk Metropolis-Hastings with the minibatch Barker acceptance test.

    Each step proposes ``θ' = θ + scaling · ξ`` on the transformed space, evaluates the
    per-observation log-likelihood ratios on a random minibatch of ``batch_size`` rows
    (drawn without replacement), grows it by ``batch_size`` rows until the estimate
    ``Δ*`` of the log acceptance ratio has variance ``s² < σ²`` (never past N), and
    accepts iff ``Δ* + X_nc + X_corr > 0`` with ``X_nc ~ N(0, σ² − s²)`` and ``X_corr``
    drawn from the correction distribution ``C_σ``. With the whole data set it makes the
    exact Barker decision. See :func:`pymc_minibatch_mh.core.barker.barker_test`.

    Parameters
    ----------
    vars : list of Variable, optional
        Continuous variables to sample as one block (default: all free variables).
    batch_size : int, default 100
        Initial minibatch size and growth increment (the paper's m).
    sigma : float, default 1.0
        σ of the normal part, ``0 < σ < π/√3``. Larger σ allows smaller minibatches
        (the test needs ``s² < σ²``) at the price of a larger correction-table error.
    temperature : float or TemperatureSchedule, default 1.0
        K: the likelihood is raised to ``1/K`` (the prior is not). Since ``s²`` scales as
        ``1/K²``, high temperatures allow small minibatches. A
        :class:`~pymc_minibatch_mh.TemperatureSchedule` changes K (and the proposal scale)
        at given iterations, e.g. tempered exploration followed by sampling at K = 1.
    S : array_like, optional
        Proposal standard deviations (vector) or covariance matrix on the flattened,
        transformed space, as in ``pm.Metropolis``. Default: ones.
    scaling : float, default 1.0
        Multiplies the proposal. With ``tune=True`` it is adapted during PyMC's tuning
        phase towards ``target_accept`` (see
        :class:`~pymc_minibatch_mh.adapter.proposal.ScalingTuner`), then fixed.
    tune : bool, default True
        Whether to tune ``scaling`` during the tuning phase.
    target_accept : float, default 0.25
        Target acceptance probability of the tuning.
    tolerance : float, optional
        If given, the minibatch also grows until the error bound ε is at most this value
        (ε > 6.4/√b always, so this needs ``b > (6.4/tolerance)²``). Default: report ε on
        every step without stopping on it, as the paper's experiments do.
    early_decision : float, optional
        Stop growing when ``|Δ*|/s`` reaches this value (the authors' code uses 5) and
        decide with probability ``g(Δ*)``. This trades accuracy for data: with threshold 5
        the step's acceptance probability can be off by up to 7e-3 (at s = σ = 1); see
        :func:`~pymc_minibatch_mh.core.barker.barker_test`. Off by default.
    correction : CorrectionDistribution, optional
        The correction distribution; by default the table shipped for ``sigma`` (or one
        built on the fly). Its L∞ error is ``step.correction.error``.
    model, rng, initial_point, mode, check_start, prefetch
        See :class:`~pymc_minibatch_mh.adapter.base.MinibatchStep`; every step method
        takes these, and ``temperature``, ``S``, ``scaling``, ``tune``, ``target_accept``.

    Notes
    -----
    Sample stats (all scalars): ``accepted`` (1.0/0.0), ``accept`` (``g(Δ*)``),
    ``batch_size`` (observations used by this step's test), ``epsilon`` (Novak bound on
    the normal-approximation error), ``edgeworth`` (sharper Edgeworth estimate of it),
    ``delta_star`` (Δ*), ``delta_variance`` (s²), ``growth_rounds``, ``full_data``,
    ``early_decision``, ``nonfinite``, ``extra_evaluations`` (always 0 here),
    ``scaling`` (the effective proposal scale), ``temperature``, and the chain's running
    ``mean_batch_size`` and ``accept_rate`` (shown in the progress bar).

    References
    ----------
    .. [1] Seita, D., Pan, X., Chen, H., Canny, J. (2017). An Efficient Minibatch
       Acceptance Test for Metropolis-Hastings. UAI 2017.
    .. [2] Barker, A. A. (1965). Monte Carlo calculations of the radial distribution
       functions for a proton-electron plasma. Australian Journal of Physics 18.

    Examples
    --------
    >>> import numpy as np, pymc as pm
    >>> from pymc_minibatch_mh import MinibatchBarker
    >>> y = np.random.default_rng(0).normal(1.0, 1.0, size=10_000)
    >>> with pm.Model():
    ...     mu = pm.Normal("mu", 0, 10)
    ...     _ = pm.Normal("y", mu, 1, observed=y)
    ...     step = MinibatchBarker(batch_size=100, S=[0.002], tune=False)
    ...     idata = pm.sample(draws=300, tune=0, step=step, chains=1, progressbar=False,
    ...                       random_seed=1, compute_convergence_checks=False)
    >>> 100 <= int(idata.sample_stats["batch_size"].mean()) <= 10_000
    True

    """

    name = "minibatch_barker"
    test_stats = {
        "epsilon": (np.float64, []),
        "edgeworth": (np.float64, []),
        "delta_star": (np.float64, []),
        "delta_variance": (np.float64, []),
        "early_decision": (bool, []),
    }

    def __init__(
        self,
        vars: Sequence[Any] | None = None,
        *,
        batch_size: int = 100,
        sigma: float = 1.0,
        tolerance: float | None = None,
        early_decision: float | None = None,
        correction: CorrectionDistribution | None = None,
        **kwargs: Any,
    ) -> None:
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
        self.correction = correction if correction is not None else get_correction(float(sigma))
        if correction is not None and not math.isclose(correction.sigma, sigma):
            raise ValueError(
                f"The correction distribution was built for sigma={correction.sigma}, "
                f"but sigma={sigma} was given."
            )
        self.sigma = float(sigma)
        self._tolerance = tolerance
        self._early_decision = early_decision
        self._update_kernel_settings()
        super().__init__(vars, batch_size=batch_size, **kwargs)

    @property
    def tolerance(self) -> float | None:
        """Stop growing only once ε ≤ tolerance as well (``None``: off)."""
        return self._tolerance

    @tolerance.setter
    def tolerance(self, value: float | None) -> None:
        self._tolerance = value
        self._update_kernel_settings()

    @property
    def early_decision(self) -> float | None:
        """Threshold of the early-decision rule (``None``: off)."""
        return self._early_decision

    @early_decision.setter
    def early_decision(self, value: float | None) -> None:
        self._early_decision = value
        self._update_kernel_settings()

    def _update_kernel_settings(self) -> None:
        # σ², tolerance and threshold as the kernel takes them (≤ 0: off).
        self._kernel_settings = (
            self.sigma * self.sigma,
            float(self._tolerance) if self._tolerance is not None else -1.0,
            float(self._early_decision) if self._early_decision is not None else -1.0,
        )

    #: Run the growth loop with the compiled kernel
    #: (:mod:`~pymc_minibatch_mh.adapter.kernel`); ``False`` uses the NumPy reference
    #: :func:`~pymc_minibatch_mh.core.barker.barker_test`. Both give the same draws.
    use_kernel: bool = True

    def _start_chain(self, rng: Any) -> None:
        super()._start_chain(rng)
        self._source.policy.sized_growth = self.use_kernel
        # The lean path of step() covers the plain case: no temperature schedule, no
        # control variates, no likelihood parameters sampled by another step.
        self._lean = (
            self.schedule is None
            and self.control_variate is None
            and not self.likelihood.other_shared
        )

    def step(self, point: Mapping[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """One Metropolis-Hastings transition with the minibatch Barker test.

        After a chain's first step, plain settings take a lean path: the base class's
        :meth:`~pymc_minibatch_mh.adapter.base.MinibatchStep.step` with its branches for
        schedules, control variates and other steps' variables left out, and the outcome
        kept in local variables (this runs once per draw, where every Python call shows).
        It draws the same random numbers and returns the same point and stats.
        """
        if not (self._chain_started and self._lean and self.use_kernel):
            return super().step(point)
        point_map = self.likelihood.point_map
        source = self._source
        x_cur = point_map.flat_view(point)  # only read below
        x_prop = self.proposal.propose(x_cur, self.scaling, self.rng)
        data_free, result = source.barker_step(
            x_cur, x_prop, self._inv_temperature, self.batch_size, *self._kernel_settings
        )
        if result is None or result[0] == STOPPED:
            return self._complete_step(point, x_prop, self._kernel_outcome(data_free, result), 0)
        status, _, n, _, _, rounds, delta_star, variance, epsilon, edgeworth = result
        full_data = n >= source.n_total
        accepted = barker_decision(
            self.rng, delta_star, variance, self.correction, full_data=full_data
        )
        accept = barker_probability(delta_star)
        steps = self._chain_steps = self._chain_steps + 1
        self._chain_batch_total += n
        if accepted:
            self._chain_accepted += 1
            point = point_map.to_point(x_prop, point)
        stats = {
            "accepted": 1.0 if accepted else 0.0,
            "accept": accept,
            "batch_size": n,
            "growth_rounds": rounds,
            "full_data": full_data,
            "nonfinite": False,
            "extra_evaluations": 0,
            "scaling": self.scaling,
            "temperature": self._temperature,
            "tune": self.tune,
            "mean_batch_size": self._chain_batch_total / steps,
            "accept_rate": self._chain_accepted / steps,
            "recentered": False,
            "epsilon": epsilon,
            "edgeworth": edgeworth,
            "delta_star": delta_star,
            "delta_variance": variance,
            "early_decision": status == EARLY,
        }
        if self.tune and self._tune_enabled:
            self.scaling = self.tuner.update(accept)
        return point, [stats]

    def _run_test(self, x_cur: np.ndarray, x_prop: np.ndarray) -> BarkerOutcome:
        if not self.use_kernel:
            return super()._run_test(x_cur, x_prop)
        return self._kernel_outcome(
            *self._source.barker_step(
                x_cur, x_prop, self._inv_temperature, self.batch_size, *self._kernel_settings
            )
        )

    def _kernel_outcome(self, data_free: float, result: tuple[Any, ...] | None) -> BarkerOutcome:
        """The outcome of a step from ``PairSource.barker_step``'s return value."""
        if result is None:
            return rejected_outcome(data_free)
        status, _, n, _, _, rounds, delta_star, variance, epsilon, edgeworth = result
        full_data = n >= self._source.n_total
        if status == STOPPED:
            return rejected_outcome(delta_star, batch_size=n, rounds=rounds, full_data=full_data)
        return decided_outcome(
            self.rng, self.correction, delta_star=delta_star, variance=variance, batch_size=n,
            rounds=rounds, full_data=full_data, epsilon=epsilon, edgeworth=edgeworth,
            early=status == EARLY,
        )

    def _decide(self, source: PairSource, data_free: float) -> BarkerOutcome:
        return barker_test(
            self.rng,
            source,
            data_free,
            batch_size=self.batch_size,
            correction=self.correction,
            tolerance=self.tolerance,
            early_decision=self.early_decision,
        )

    def _test_stat_values(self, outcome: BarkerOutcome) -> dict[str, Any]:
        return {
            "epsilon": outcome.epsilon,
            "edgeworth": outcome.edgeworth,
            "delta_star": outcome.delta_star,
            "delta_variance": outcome.variance,
            "early_decision": outcome.early,
        }
