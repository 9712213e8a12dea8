"""``MinibatchBarker``: the minibatch Barker test of Seita et al. (2017) as a PyMC step."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from pymc_minibatch_mh.core.barker import BarkerOutcome, BarkerTest
from pymc_minibatch_mh.core.batch_budget import (
    AUTO_START_ROWS,
    DEFAULT_ERROR_TOLERANCE,
    MEASURE_FIRST,
    ErrorBudget,
    RowsChoice,
)
from pymc_minibatch_mh.core.correction import CorrectionDistribution
from pymc_minibatch_mh.core.penalty import DEFAULT_PENALTY_SIGMA, PenaltyCorrection
from pymc_minibatch_mh.estimators.ratio import RatioEstimator
from pymc_minibatch_mh.step_methods.auto_choices import PENALTY_SIGMAS, AutoChoices
from pymc_minibatch_mh.step_methods.barker_checks import (
    DEFAULT_BARKER_SIGMA,
    barker_correction,
    check_acceptance,
    check_barker_settings,
    check_rows_setting,
)
from pymc_minibatch_mh.transition.schedule import TemperatureSchedule
from pymc_minibatch_mh.transition.settings import MoveSettings, StepSettings, document_parameters
from pymc_minibatch_mh.transition.step import MinibatchStep

__all__ = ["MinibatchBarker"]


@document_parameters
class MinibatchBarker(AutoChoices, MinibatchStep):
    r"""Metropolis-Hastings with the minibatch Barker acceptance test.

    Each transition proposes ``θ′`` (by default around the control variates' Laplace fit,
    or by NUTS on their data-free surrogate posterior for hierarchical models), evaluates
    the per-row log-likelihood ratios (or, with control variates, their Taylor residuals)
    on a random minibatch of m rows drawn without replacement, grows it by m rows until
    the estimate ``Δ*`` of the log acceptance ratio has variance ``s² < σ²`` (never past
    N), and accepts iff ``Δ* + X_nc + X_corr > 0`` with ``X_nc ~ N(0, σ² − s²)`` and
    ``X_corr`` drawn from the correction distribution. With the whole data set it makes
    the exact decision. See :func:`pymc_minibatch_mh.core.barker.barker_test` and the
    guide's settings page, which says what each ``"auto"`` measures.

    Parameters
    ----------
    vars : list of Variable, optional
        Continuous variables to sample as one block (default: all free variables).
    batch_size : int or "auto", default "auto"
        Rows per round m: the first minibatch's size and the growth increment. ``"auto"``:
        tuning transitions (and, with Crank–Nicolson, a pilot at the set-up:
        ``step.pilot_rows``) measure the test's error at m = 100; at the end of tuning
        the sampled draws get the smallest m whose predicted per-step error of the
        acceptance probability is within ``error_tolerance``
        (:mod:`~pymc_minibatch_mh.core.batch_budget`), up to N. With control variates
        at large N it falls to a few rows; where they fit the rows poorly it grows past
        100 (the zoo's LKJ model at N = 3·10⁴: about 3,000). The ``rows_per_round`` stat
        has each draw's m.
    error_tolerance : float, default 1e-3
        The per-step budget on the acceptance-probability error that ``batch_size="auto"``
        sizes m for. Only with ``batch_size="auto"``.
    sigma : float, optional
        σ of the normal part: 1 for Barker's test (``0 < σ < π/√3``), 0.5 for the penalty
        test (any ``σ > 0``; with ``acceptance="auto"`` chosen from
        :data:`~pymc_minibatch_mh.step_methods.auto_choices.PENALTY_SIGMAS`). Larger σ
        allows smaller minibatches at the price of a larger correction-table error
        (Barker) or a lower acceptance (penalty: ``2Φ(−σ/2)`` for a perfect proposal).
    acceptance : {"auto", "barker", "penalty"}, default "auto"
        The acceptance function. ``"barker"``: ``g(Δ) = 1/(1 + e^{−Δ})``, which accepts at
        most half of even a perfect proposal. ``"penalty"``: Ceperley and Dewing's
        ``h_σ(Δ) = E[min(1, exp(Δ + σZ − σ²/2))]``, Metropolis' rule smoothed by a normal of
        sd σ (:mod:`~pymc_minibatch_mh.core.penalty`): it accepts more often, its
        correction is drawn exactly, and it needs more rows for the same error.
        ``"auto"``: with the proposals of
        :data:`~pymc_minibatch_mh.step_methods.auto_choices.PENALTY_PROPOSALS` each chain
        starts with the penalty test at σ = 0.5 and, with ``batch_size="auto"``, chooses
        between the penalty test at each σ and Barker's test by predicted work per
        effective sample whenever it chooses m
        (:func:`~pymc_minibatch_mh.step_methods.auto_choices.choose_test`); else Barker's.
        The ``penalty_test`` and ``test_sigma`` stats say which test each draw used.
    control_variate : {"auto", "taylor", "taylor_theta", "taylor_predictor", None}, default "auto"
        How Δ is estimated. ``"auto"``: second-order Taylor control variates around the
        mode (``"taylor"``) where they apply, so that a few rows per step suffice at
        temperature 1; where they do not (no smooth mode, other step methods' variables
        in the likelihood, a temperature schedule), the plain minibatch estimate, with a
        warning at temperature 1. ``"taylor"`` insists on them (an error says why they
        cannot be built); ``"taylor_theta"`` and ``"taylor_predictor"`` force the
        expansion in θ or in the per-row quantities; None is the paper's plain test. See
        the guide's "Control variates" page.
    proposal : str, Proposal or callable, default "auto"
        ``"auto"``: with control variates, Crank–Nicolson moves around their Laplace fit
        when the per-row quantities are affine in θ (GLMs) and the surrogate posterior is
        close to that fit, and NUTS on the surrogate posterior when not (hierarchical
        models); without them, the random walk. Also ``"random_walk"``,
        ``"crank_nicolson"``, ``"mala"``, ``"hmc"``, ``"surrogate_transition"``,
        ``"surrogate_nuts"``, a
        :class:`~pymc_minibatch_mh.proposals.base.Proposal` or a callable
        ``step -> Proposal`` (:mod:`~pymc_minibatch_mh.proposals.registry`).
    tolerance : float, optional
        If given, the minibatch also grows until the error estimate ε is at most this
        value (ε > 6.4/√b always, so this needs ``b > (6.4/tolerance)²``). Default: ε is
        reported on every step without stopping on it, as in the paper's experiments.
    early_decision : float, optional
        Stop growing when ``|Δ*|/s`` reaches this value (the authors' code uses 5) and
        decide with probability ``g(Δ*)``. This trades accuracy for data: with threshold 5
        the acceptance probability can be off by up to 7e-3 (at s = σ = 1). Off by default.
    correction : CorrectionDistribution, optional
        The correction distribution of Barker's test; by default the table shipped for
        ``sigma``. Its L∞ error is ``step.correction.error``.
    skew_correction : bool, default False
        The skew-corrected Barker test: the top-up noise is a centred gamma variable whose
        third cumulant cancels the first Edgeworth term of the test's error
        (:mod:`~pymc_minibatch_mh.core.skew`; the guide's calibration page).
    {shared_parameters}

    Notes
    -----
    Sample stats (all scalars): ``accepted`` (1.0/0.0), ``accept`` (``g(Δ*)``; ``h_σ(Δ*)``
    for the penalty test), ``batch_size`` (rows used by the test), ``epsilon`` (plug-in
    estimate of Novak's bound on the normal-approximation error; above 1 the normal
    approximation cannot be trusted), ``edgeworth`` (a sharper estimate of the same
    error), ``delta_star`` (Δ*), ``delta_variance`` (s²), with ``skew_correction`` only
    ``skew`` and ``skew_fallback``, ``growth_rounds``, ``full_data``, ``early_decision``,
    ``nonfinite``, ``extra_evaluations`` (rows read besides the test's minibatch),
    ``scaling``, ``temperature``, ``rows_per_round`` (m), ``penalty_test``,
    ``test_sigma``, and the chain's running ``mean_batch_size`` and ``accept_rate`` (shown
    in the progress bar). The guide's sample-stats page lists them all.

    References
    ----------
    .. [1] Seita, D., Pan, X., Chen, H., Canny, J. (2017). An Efficient Minibatch
       Acceptance Test for Metropolis-Hastings. UAI 2017.
    .. [2] Barker, A. A. (1965). Monte Carlo calculations of the radial distribution
       functions for a proton-electron plasma. Australian Journal of Physics 18.

    Examples
    --------
    N = 10,000 observations, proposal sd δ = 0.002 (a fifth of the posterior sd). The
    estimate's variance is ``s² ≈ N²δ²ξ²/b = 400ξ²/b`` for a move ``δξ``, so the test
    stops at the first multiple of 100 rows above ``400ξ²``: about 460 rows on average
    (4.6 % of N; never growing gives 100, the full data 10,000). For small moves Barker's
    test accepts about half of the proposals (Metropolis-Hastings would accept about 90 %):

    >>> import numpy as np, pymc as pm
    >>> from pymc_minibatch_mh import MinibatchBarker
    >>> y = np.random.default_rng(0).normal(1.0, 1.0, size=10_000)
    >>> with pm.Model():
    ...     mu = pm.Normal("mu", 0, 10)
    ...     _ = pm.Normal("y", mu, 1, observed=y)
    ...     step = MinibatchBarker(control_variate=None, batch_size=100, S=[0.002], tune=False)
    ...     idata = pm.sample(draws=300, tune=0, step=step, chains=1, progressbar=False,
    ...                       initvals={"mu": 1.0}, random_seed=1,
    ...                       compute_convergence_checks=False)
    >>> stats = idata.sample_stats
    >>> 250 < float(stats["batch_size"].mean()) < 700
    True
    >>> 0.4 < float(stats["accepted"].mean()) < 0.6
    True
    >>> abs(float(idata.posterior["mu"].mean()) - float(y.mean())) < 0.03  # 3 posterior sds
    True

    """

    name = "minibatch_barker"
    test_stats = {
        "epsilon": (np.float64, []),
        "edgeworth": (np.float64, []),
        "delta_star": (np.float64, []),
        "delta_variance": (np.float64, []),
        "early_decision": (bool, []),
        "skew": (np.float64, []),
        "skew_fallback": (bool, []),
        "rows_per_round": (np.int64, []),
        "penalty_test": (bool, []),
        "test_sigma": (np.float64, []),
    }

    def __init__(
        self,
        vars: Sequence[Any] | None = None,
        *,
        batch_size: int | str = "auto",
        error_tolerance: float | None = None,
        sigma: float | None = None,
        acceptance: str = "auto",
        control_variate: str | None = "auto",
        proposal: Any = "auto",
        tolerance: float | None = None,
        early_decision: float | None = None,
        correction: CorrectionDistribution | None = None,
        skew_correction: bool = False,
        temperature: float | TemperatureSchedule = 1.0,
        S: ArrayLike | str | None = None,
        scaling: float = 1.0,
        tune: bool = True,
        target_accept: float | None = None,
        reference: Mapping[str, Any] | None = None,
        recenter: float | None = None,
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
        check_acceptance(acceptance, sigma, correction, skew_correction)
        barker_sigma = DEFAULT_BARKER_SIGMA if sigma is None else sigma
        check_barker_settings(DEFAULT_BARKER_SIGMA if acceptance == "penalty" else barker_sigma,
                              tolerance, early_decision)
        self._acceptance_setting = acceptance
        # Each test's correction (its sigma is the test's σ), when the test may run.
        self._barker_correction = None if acceptance == "penalty" else barker_correction(
            barker_sigma, correction)
        # The penalty test's σ: chosen from the ladder with "auto" unless given.
        ladder = (PENALTY_SIGMAS if acceptance == "auto" and sigma is None else
                  (DEFAULT_PENALTY_SIGMA if sigma is None else sigma,))
        self._penalty_corrections = () if acceptance == "barker" else tuple(
            PenaltyCorrection(float(value)) for value in ladder)
        self._steps_auto = isinstance(steps_per_draw, str)
        self._correction_given = correction is not None
        self.skew_correction = bool(skew_correction)
        self._tolerance = tolerance
        self._early_decision = early_decision
        #: Whether m is sized by the error budget (``batch_size="auto"``).
        self.auto_rows = check_rows_setting(
            batch_size, error_tolerance,
            0.0 if self._barker_correction is None else self._barker_correction.error)
        #: The per-step error budget of ``batch_size="auto"`` (None with a fixed m).
        self.error_tolerance = (
            None if not self.auto_rows else
            DEFAULT_ERROR_TOLERANCE if error_tolerance is None else float(error_tolerance)
        )
        # The records and the choice of m (None with a fixed m).
        self._budget: ErrorBudget | None = None
        # Crank–Nicolson's over-relaxed min_rho (set with the proposal: _proposal_chosen).
        self._overrelaxed_rho: float | None = None
        #: The acceptance function each chain starts with (``"barker"`` or ``"penalty"``).
        self.initial_acceptance = acceptance
        if acceptance != "auto":
            self._set_acceptance(acceptance)
        #: Each chain's choice of m at the end of its tuning (the last chain's; None before).
        self.rows_choice: RowsChoice | None = None
        self._start_measuring(AUTO_START_ROWS, MEASURE_FIRST)
        #: Rows the error budget's pilots evaluated, all set-ups of this step together
        #: (the set-up's pilot, see the guide's settings page; 0 without one). Not in any
        #: draw's stats.
        self.pilot_rows = 0
        self._pilot_key: tuple[Any, ...] | None = None
        batch_size = AUTO_START_ROWS if self.auto_rows else batch_size
        super().__init__(vars, settings=StepSettings.take(locals()),
                         move_settings=MoveSettings.take(locals()))
        self._match_steps()
        self._update_kernel_settings()
        self._measure_pilot()

    @property
    def pilot_records(self) -> int:
        """The error budget's records from the set-up's pilot that every chain starts with.

        :data:`~pymc_minibatch_mh.core.batch_budget.MEASURE_FIRST` (50) when the pilot ran
        and none of its moves read all N rows; fewer: each chain measures as many of its
        first tuning transitions as are missing; 0 without a pilot (a fixed
        ``batch_size``, a proposal other than Crank–Nicolson, or variables of other steps
        in the likelihood).
        """
        return 0 if self._budget is None else self._budget.pilot_records

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
        # The core tests with the step's settings (rebuilt when one of them changes): the
        # chain's, and with batch_size="auto" the tuning's measuring one (its first m).
        def test(rows: int, skew_floor: float) -> BarkerTest:
            return BarkerTest(
                rows, self.correction, tolerance=self._tolerance,
                early_decision=self._early_decision, skew_correction=self.skew_correction,
                skew_floor=skew_floor,
            )

        self._test = test(self.batch_size, self._skew_floor)
        self._measure_test = test(self._measure_rows, 0.0) if self.auto_rows else self._test
        self._tuning_test = (test(self.tuning_rows, self._skew_floor) if self.auto_rows
                             else self._test)

    def _start_chain(self, rng: Any) -> None:
        super()._start_chain(rng)
        self._update_kernel_settings()  # the chain's batch size

    def _decide(self, estimator: RatioEstimator, data_free: float) -> BarkerOutcome:
        if self._choice_due:  # made here, so that a transition's test, stats and audit agree
            self._choice_due = False
            self._choose_rows(final=False)
        if self.auto_rows and self._tuning:
            return self._tuning_decision(estimator, data_free)
        self._rows_used = self._test.batch_size
        return self._test(self.rng, estimator, data_free)

    def _error_estimate(self, outcome: BarkerOutcome) -> float:
        return outcome.error_estimate  # computed by the compiled rounds

    def _unused_stats(self) -> tuple[str, ...]:
        return () if self.skew_correction else ("skew", "skew_fallback")

    def _test_stat_values(self, outcome: BarkerOutcome) -> dict[str, Any]:
        values = {
            "epsilon": outcome.epsilon,
            "edgeworth": outcome.edgeworth,
            "delta_star": outcome.delta_star,
            "delta_variance": outcome.variance,
            "early_decision": outcome.early,
            "rows_per_round": self._rows_used,
            "penalty_test": self.acceptance == "penalty",
            "test_sigma": self.sigma,
        }
        if self.skew_correction:
            values["skew"] = outcome.skew
            values["skew_fallback"] = outcome.skew_fallback
        return values


