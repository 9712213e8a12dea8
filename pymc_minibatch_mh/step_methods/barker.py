"""``MinibatchBarker``: the minibatch Barker test of Seita et al. (2017) as a PyMC step."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pymc_minibatch_mh.core.barker import BarkerOutcome, BarkerTest
from pymc_minibatch_mh.core.batch_budget import (
    AUTO_START_ROWS,
    DEFAULT_ERROR_TOLERANCE,
    MEASURE_EVERY,
    MEASURE_FIRST,
    MIN_RECORDS,
    ONE_TRANSITION_SHARE,
    RECHOOSE_EVERY,
    ErrorBudget,
    RowsChoice,
)
from pymc_minibatch_mh.core.buffered import BufferedGenerator
from pymc_minibatch_mh.core.correction import LOGISTIC_SD, CorrectionDistribution, get_correction
from pymc_minibatch_mh.core.penalty import (
    DEFAULT_PENALTY_SIGMA,
    PenaltyCorrection,
    acceptance_kind,
)
from pymc_minibatch_mh.estimators.ratio import RatioEstimator
from pymc_minibatch_mh.proposals.crank_nicolson import CrankNicolsonProposal
from pymc_minibatch_mh.transition.inner_steps import cost_per_effective_sample, transition_cost
from pymc_minibatch_mh.transition.step import MinibatchStep

__all__ = [
    "DEFAULT_BARKER_SIGMA",
    "OVERRELAX_ACCEPT",
    "PENALTY_PROPOSALS",
    "STEP_CHOOSING_PROPOSALS",
    "PENALTY_SIGMAS",
    "PILOT_SEED",
    "AcceptanceOption",
    "MinibatchBarker",
    "choose_test",
    "perfect_accept",
]

#: σ of Barker's test unless given (its correction table's error is 5e-8 there).
DEFAULT_BARKER_SIGMA: float = 1.0

#: The σ values of the penalty test that ``acceptance="auto"`` chooses from when ``sigma``
#: is not given (:func:`choose_test`); a chain starts with the first. A smaller σ accepts a
#: near-perfect proposal more often (``h_σ(0)``: 0.80, 0.90, 0.96) and needs more rows for
#: the same error; measured in ``benchmarks/bench_past_ceiling.py``.
PENALTY_SIGMAS: tuple[float, ...] = (DEFAULT_PENALTY_SIGMA, 0.25, 0.1)

#: The proposals with which ``acceptance="auto"`` runs the penalty test (the others keep
#: Barker's): measured in ``benchmarks/bench_past_ceiling.py``.
PENALTY_PROPOSALS: tuple[str, ...] = ("crank_nicolson", "surrogate_nuts")

#: The proposals with which ``steps_per_draw="auto"`` chooses between one transition per
#: draw and the proposal's own number, by predicted work per effective sample. Not NUTS on the
#: surrogate: on a group scale near its boundary one of its transitions moves little (bambi
#: ``y ~ x + (x|g)``, 4,000 rows: bulk ESS of the intercepts' scale 118 at one transition
#: per draw against about 1,260 at nine), so it keeps its nine.
STEP_CHOOSING_PROPOSALS: tuple[str, ...] = ("crank_nicolson",)

#: The least share of perfect proposals a test must accept for a Crank–Nicolson proposal
#: chosen by name to over-relax (ρ down to its ``min_rho``; below it, ρ ≥ 0): the penalty
#: test at σ ≤ 0.25 (0.90 and 0.96), not at σ = 0.5 (0.80) nor Barker's. With
#: ``acceptance="auto"`` such a test is two options of :func:`choose_test`, with and
#: without over-relaxation (whose larger moves need more rows). Measured on
#: logistic regressions (PyMC 5, 2 × 2000 draws; ``benchmarks/bench_past_ceiling.py``): the
#: penalty test at σ = 0.1 (0.96) with ρ = −0.5 gave 2.2–2.9 times the bulk effective
#: samples of ρ = 0, the tail's about the same, the standard deviation's 0.4–0.65 times
#: (nutpie's profile); Barker's test (0.5) at N = 10⁵ and 10⁶, d = 100 gave 1.1–1.2 times
#: the bulk's, 0.9–1.0 the tail's and 0.65–0.7 the standard deviation's at 3 transitions
#: per draw, and at one the tail's fell to 0.3–0.75 times. It is also the least share
#: with which ``steps_per_draw="auto"`` may run one transition per draw of Crank–Nicolson
#: (``MinibatchBarker._steps_options``).
OVERRELAX_ACCEPT: float = 0.9

#: The seed of the error budget's pilot moves (``MinibatchBarker._measure_pilot``): set-up
#: randomness, the same for every chain.
PILOT_SEED: int = 20170829


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
    batch_size : int or "auto", default "auto"
        Rows per round: the first minibatch's size and the growth increment (the paper's
        m). ``"auto"``: during PyMC's tuning phase, the first 50 transitions, and after
        them one each time the others have read 6,400 rows (one in 64 where they read 100
        rows each), use m = 100 and measure the test's error (with a Crank–Nicolson
        proposal the first 50 are measured once, at the set-up, for every chain, from
        draws of the Laplace fit: the guide's settings page; ``step.pilot_rows`` counts
        the rows); the others, and at the end of
        tuning the sampled draws, use the smallest m whose predicted per-step error of the
        acceptance probability, from those measurements, is within ``error_tolerance``
        (:mod:`~pymc_minibatch_mh.core.batch_budget`). With the default budget m is at
        most 100 at the most transitions per draw the step may run (Crank–Nicolson's
        three), so those first rounds never read more rows than fixed 100-row rounds
        would (where the cap does not meet the budget, a warning at the end of tuning
        gives the predicted error and the m an explicit budget would take); one
        transition per draw, chosen by predicted work per effective sample for a test
        that accepts at least 0.9 of perfect proposals, takes at most a tenth of N (at
        least 300). With control variates at large N m falls to a few rows. Without
        tuning steps m is the pilot's choice, or 100 without a pilot.
        The ``rows_per_round`` stat says which m each draw used.
    error_tolerance : float, optional
        The per-step budget on the acceptance-probability error that ``batch_size="auto"``
        sizes m for (default 1e-3; then m is capped as above). Given explicitly, m may
        exceed the cap (up to N) to meet it. Only with ``batch_size="auto"``.
    sigma : float, optional
        σ of the normal part: 1 for Barker's test (``0 < σ < π/√3``), 0.5 for the penalty
        test (any ``σ > 0``; chosen from
        :data:`~pymc_minibatch_mh.step_methods.barker.PENALTY_SIGMAS` with ``acceptance="auto"``
        and ``batch_size="auto"``). Larger σ allows smaller minibatches (the test needs
        ``s² < σ²``) at the price of a larger correction-table error (Barker) or a lower
        acceptance (penalty: ``2Φ(−σ/2)`` for a perfect proposal). Given with
        ``acceptance="auto"``, it is the σ of whichever test runs.
    acceptance : {"auto", "barker", "penalty"}, default "auto"
        The acceptance function. ``"auto"``: with the Crank–Nicolson proposal and NUTS on
        the surrogate (:data:`~pymc_minibatch_mh.step_methods.barker.PENALTY_PROPOSALS`,
        zero-config's for GLMs and for hierarchical models) each chain starts with the
        penalty test at σ = 0.5 and, with
        ``batch_size="auto"``, chooses between the penalty test at each σ of
        :data:`~pymc_minibatch_mh.step_methods.barker.PENALTY_SIGMAS` (unless ``sigma``
        is given) and Barker's test by predicted work per effective sample whenever it
        chooses m (the first time after 50 tuning transitions, then every 100 and at the
        end of tuning; :func:`~pymc_minibatch_mh.step_methods.barker.choose_test`); with
        ``steps_per_draw="auto"`` the transitions per draw follow the test (one with the
        penalty test at σ ≤ 0.25, Crank–Nicolson's 3 with σ = 0.5 and with Barker's), and
        the default ``target_accept`` follows it too; with the other proposals, or with
        ``skew_correction`` or ``correction``, Barker's test. The ``penalty_test`` and
        ``test_sigma`` stats say which test each draw used, ``step.acceptance`` and
        ``step.sigma`` which one the last chain ran. ``"barker"``:
        ``g(Δ) = 1/(1 + e^{−Δ})``, which accepts at most half of even a perfect proposal.
        ``"penalty"``: Ceperley and Dewing's penalty function
        ``h_σ(Δ) = E[min(1, exp(Δ + σZ − σ²/2))]``, Metropolis' rule smoothed by a normal
        of sd σ; it accepts a perfect proposal with probability ``2Φ(−σ/2)`` (0.62
        at σ = 1), its correction ``X_corr = E − σ²/2`` is drawn exactly (no table), but
        its error per step is larger for the same minibatch (``max|h_σ‴| = 0.22`` at
        σ = 1 against ``max|g‴| = 1/8``), so ``batch_size="auto"`` picks larger m. With
        ``steps_per_draw=1`` it turns about half of its transitions into effective samples
        at σ = 0.5, about four fifths at σ = 0.1 (Barker's: a fifth). See
        :mod:`~pymc_minibatch_mh.core.penalty`. Not with ``skew_correction`` or
        ``correction``.
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
        :class:`~pymc_minibatch_mh.proposals.tuning.ScalingTuner`), then fixed.
    tune : bool, default True
        Whether to tune ``scaling`` during the tuning phase.
    target_accept : float, default 0.25
        Target acceptance probability of the tuning.
    tolerance : float, optional
        If given, the minibatch also grows until the error estimate ε is at most this value
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
    skew_correction : bool, default False
        The skew-corrected test: the top-up noise ``X_nc`` is a centred gamma variable with
        the variance ``σ² − s²`` and the third cumulant that cancels the first Edgeworth
        term of the test's error, estimated from the minibatch (falling back to the
        Gaussian top-up when ``σ² − s²`` is too small for it). See
        :mod:`~pymc_minibatch_mh.core.skew` and the guide's calibration page.
    control_variate : {"auto", "taylor", "taylor_theta", "taylor_predictor", None}, default "auto"
        How Δ is estimated. ``"auto"``: second-order Taylor control variates around the
        mode (``"taylor"``) where they apply, so that a few rows per step suffice at
        temperature 1; where they do not (no smooth mode, other step methods' variables
        in the likelihood, a temperature schedule), the plain minibatch estimate, with a
        warning at temperature 1. ``"taylor"`` insists on them (an error says why they
        cannot be built); ``"taylor_theta"`` and ``"taylor_predictor"`` force the expansion
        in θ or in the per-row quantities; None is the paper's plain test. See
        :class:`~pymc_minibatch_mh.transition.step.MinibatchStep` and the guide's
        "Control variates" page.
    proposal : str, Proposal or callable, default "auto"
        ``"auto"``: with control variates, Crank–Nicolson moves around their Laplace fit
        when the per-row quantities are affine in θ (GLMs) and one iteration of NUTS on
        the surrogate posterior when they are not (hierarchical models); without them,
        the random walk. Also ``"random_walk"``, ``"crank_nicolson"``, ``"mala"``,
        ``"hmc"``, ``"surrogate_transition"``, ``"surrogate_nuts"``, ``"blackjax_nuts"``,
        a :class:`~pymc_minibatch_mh.proposals.base.Proposal` or a callable
        ``step -> Proposal`` (:mod:`~pymc_minibatch_mh.proposals.registry`).
    model, rng, initial_point, mode, check_start, prefetch
        See :class:`~pymc_minibatch_mh.transition.step.MinibatchStep`; every step method
        takes these, and ``temperature``, ``S``, ``scaling``, ``tune``, ``target_accept``.

    Notes
    -----
    Sample stats (all scalars): ``accepted`` (1.0/0.0), ``accept`` (``g(Δ*)``; ``h_σ(Δ*)``
    for the penalty test),
    ``batch_size`` (observations used by this step's test), ``epsilon`` (plug-in estimate
    of Novak's bound on the normal-approximation error: an estimate from the minibatch's
    own moments, not a bound; above 1 the normal approximation cannot be trusted),
    ``edgeworth`` (sharper Edgeworth estimate of the same error),
    ``delta_star`` (Δ*), ``delta_variance`` (s²), with ``skew_correction`` only ``skew``
    (third cumulant of the top-up noise) and ``skew_fallback``, ``growth_rounds``, ``full_data``,
    ``early_decision``, ``nonfinite``, ``extra_evaluations`` (rows read besides the test's
    minibatch: a re-centring's pass, the audit's),
    ``scaling`` (the effective proposal scale), ``temperature``, ``rows_per_round`` (m),
    ``penalty_test`` (whether the penalty test decided), and the chain's running
    ``mean_batch_size`` and ``accept_rate`` (shown in the progress bar).

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
        tolerance: float | None = None,
        early_decision: float | None = None,
        correction: CorrectionDistribution | None = None,
        skew_correction: bool = False,
        acceptance: str = "auto",
        control_variate: str | None = "auto",
        proposal: Any = "auto",
        **kwargs: Any,
    ) -> None:
        check_acceptance(acceptance, sigma, correction, skew_correction)
        kwargs.update(control_variate=control_variate, proposal=proposal)
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
        self._steps_auto = isinstance(kwargs.get("steps_per_draw", "auto"), str)
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
        # With the default budget m is at most AUTO_START_ROWS.
        self._rows_cap = AUTO_START_ROWS if error_tolerance is None else 2**62
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
        self._over_budget_warned = False
        self._skew_floor = 0.0
        self._measure_rows = AUTO_START_ROWS
        #: With ``batch_size="auto"``, the rows per round of the tuning transitions that do
        #: not measure: the cheapest for the records so far, whatever the error (their
        #: draws are not kept; the growth rule still runs).
        self.tuning_rows = AUTO_START_ROWS
        self._rows_used = AUTO_START_ROWS
        # Whether the records call for a choice of m before the next transition's test.
        self._choice_due = False
        self._tuning_transitions = 0
        # Rows the chain's tuning transitions read since its last measuring one.
        self._rows_since_measured = 0
        # The tuning transitions of a chain that measure before its first choice of m
        # (fewer after a pilot: _measure_pilot).
        self._measure_first = MEASURE_FIRST
        #: Rows the error budget's pilots evaluated, all set-ups of this step together
        #: (the set-up's pilot, see the guide's settings page; 0 without one). Not in any
        #: draw's stats.
        self.pilot_rows = 0
        self._pilot_key: tuple[Any, ...] | None = None
        super().__init__(
            vars, batch_size=AUTO_START_ROWS if self.auto_rows else batch_size, **kwargs
        )
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

    def _proposal_chosen(self, proposal: Any) -> None:
        #: The ``min_rho`` of a Crank–Nicolson proposal chosen by name, which the step may
        #: use where its test accepts at least :data:`OVERRELAX_ACCEPT` of perfect
        #: proposals (:meth:`_rhos_for`); None for other proposals and for one given as an
        #: object (whose own ``min_rho`` stays).
        self._overrelaxed_rho = (
            proposal.min_rho if isinstance(proposal, CrankNicolsonProposal)
            and isinstance(self._transition_settings["proposal"], str | None) else None)
        if self._acceptance_setting == "auto":
            self.initial_acceptance = (
                "penalty" if proposal.name in PENALTY_PROPOSALS and not self.skew_correction
                and not self._correction_given else "barker")
            self._set_acceptance(self.initial_acceptance)
        else:  # the test was set before the proposal existed: its over-relaxation now
            self._set_acceptance(self.acceptance, self.correction)

    def _set_acceptance(self, acceptance: str, correction: Any = None,
                        rho: float | None = None) -> None:
        """Run ``acceptance``'s test from now on (its σ, correction and error budget).

        ``correction``: the penalty test's of the σ chosen (default: the chain's first);
        ``rho``: Crank–Nicolson's ``min_rho`` with it, one of :meth:`_rhos_for` (default:
        the most negative).
        """
        #: The acceptance function in use: ``"barker"`` or ``"penalty"`` (the
        #: ``penalty_test`` stat says which one each draw used).
        self.acceptance = acceptance
        if acceptance == "penalty":
            self.correction = self._penalty_corrections[0] if correction is None else correction
        else:
            self.correction = self._barker_correction
        # The tuner's default target, scaled by the most a perfect proposal is accepted:
        # h_σ(0) against Barker's 1/2.
        self.target_accept_factor = 2.0 * perfect_accept(self.correction)
        #: σ of the test in use (the ``test_sigma`` stat has each draw's).
        self.sigma = float(self.correction.sigma)
        #: Crank–Nicolson's ``min_rho`` with the test in use (0 where it does not
        #: over-relax).
        self.overrelaxation = min(self._rhos_for(self.correction)) if rho is None else rho
        self._match_steps()
        if getattr(self, "tuner", None) is not None and self.default_target:
            self.tuner.target = self.default_target_accept()  # a switch during tuning
        if self.error_tolerance is None:
            return
        if self._budget is None:
            self._budget = ErrorBudget(self.error_tolerance, self.sigma, self.correction.error,
                                       self._rows_cap, acceptance_kind(self.correction))
        else:  # the records describe the rows, not the test: they are kept
            self._budget.sigma, self._budget.table_error = self.sigma, self.correction.error
            self._budget.kind = acceptance_kind(self.correction)

    def _start_chain_on_data(self, rng: Any) -> None:
        if self._acceptance_setting == "auto":  # the last chain may have chosen another test
            self._set_acceptance(self.initial_acceptance)
        if self.auto_rows:  # each chain measures afresh, on the data it starts with
            self._measure_pilot()  # the set-up's, unless the data or the test changed
            self.batch_size = self._measure_rows = min(AUTO_START_ROWS, self._n_rows)
            self.tuning_rows = self.batch_size
            self._budget.reset()  # the pilot's records
            self._measure_first = max(0, MEASURE_FIRST - self._budget.pilot_records)
            self._skew_floor = 0.0
            self._tuning_transitions = self._rows_since_measured = 0
            self._choice_due = self._measure_first == 0
        super()._start_chain_on_data(rng)

    def _measure_pilot(self) -> None:
        """The error budget's first records, measured once per set-up and shared by chains.

        With ``batch_size="auto"`` and a Crank–Nicolson proposal (which moves around the
        Laplace fit ``N(θ̂, Σ)`` of the control variates), :data:`MEASURE_FIRST` moves are
        measured as a chain's first tuning transitions would measure them, but from
        ``θ ~ N(θ̂, Σ)`` (the law the proposal's moves keep; a chain starts at θ̂) to
        the proposal's move at the largest scale its tuner may reach with the most
        negative ρ any of the step's tests may run with (at ``scaling`` without tuning):
        the test at :data:`AUTO_START_ROWS` rows per round on the data-free part and the
        minibatch of ``(θ, θ′)``. Every chain starts with these records
        (:meth:`~pymc_minibatch_mh.core.batch_budget.ErrorBudget.keep_as_pilot`), so it
        chooses m from its first transition and measures only as chains without a pilot do
        after their first 50 (:data:`MEASURE_EVERY`); its own records then replace the
        pilot's from the
        oldest (``ErrorBudget.choose`` keeps the latest half, at least
        :data:`MIN_RECORDS`). A pilot move that read all N rows records nothing, and the
        chain measures as many of its first transitions as records are missing.

        The moves come from a generator of fixed seed (:data:`PILOT_SEED`), not from a
        chain's: the pilot is part of the set-up, deterministic like it, and a chain's
        draws do not depend on which chain or process made it. It is made again when the
        set-up (``follow_data``), the temperature or the test's over-relaxation changed
        since the last; its rows are counted in :attr:`pilot_rows`. Without a pilot (other
        proposals; variables of other steps in the likelihood, which the Laplace draw
        would not move) each chain measures its first :data:`MEASURE_FIRST` transitions.
        """
        if not (self.auto_rows and self.uses_minibatches):
            return
        proposal = self.proposal
        if not isinstance(proposal, CrankNicolsonProposal) or self.likelihood.other_shared:
            if self._pilot_key is not None:
                self._budget.clear()
                self._pilot_key = None
            return
        # The moves: at the largest scale the tuner may reach with the most negative ρ any
        # of the step's tests may run with (the over-relaxed moves of a chain that chooses
        # such a test; for the others the choice keeps the records' spreads, an upper
        # bound: ErrorBudget.choose).
        most = min(min(self._rhos_for(c)) for c in (*self._penalty_corrections,
                                                     self._barker_correction) if c is not None)
        key = (proposal, self.control_variate.reference, self._temperature,
               most if self._tune_enabled else self.scaling, self._n_rows)
        if self._pilot_key is not None and all(
                a is b or a == b for a, b in zip(key, self._pilot_key, strict=True)):
            return
        if self._tune_enabled:
            kept = proposal.min_rho  # the current test's (_match_steps): put back below
            proposal.min_rho = min(kept, most)
            try:
                self._run_pilot(proposal.max_scale)
            finally:
                proposal.min_rho = kept
        else:
            self._run_pilot(self.scaling)
        self._pilot_key = key

    def _run_pilot(self, scale: float) -> None:
        """The pilot's moves at ``scale`` (see :meth:`_measure_pilot`)."""
        proposal, estimator = self.proposal, self.estimator
        budget = self._budget
        budget.clear()
        self._measure_rows = min(AUTO_START_ROWS, self._n_rows)
        self._update_kernel_settings()
        test = self._measure_test
        rng = BufferedGenerator(np.random.default_rng(PILOT_SEED))
        estimator.start_chain(rng, self._measure_rows)
        rho = 0.0 if self._overrelaxed_rho is None else proposal.rho(scale)
        for _ in range(MEASURE_FIRST):
            state = proposal.init(self._pilot_point(rng))
            new_state, info = proposal.propose(rng, state, scale)
            data_free = estimator.open(state.x, new_state.x, self._inv_temperature,
                                       info.log_q_ratio, estimator.policy.rows)
            outcome = test(rng, estimator, data_free)
            estimator.close(outcome.rounds)
            self.pilot_rows += estimator.evaluated
            budget.record(outcome.batch_size, estimator.n_total, outcome.variance,
                          outcome.edgeworth, outcome.delta_star, outcome.kurtosis, rho)
        budget.keep_as_pilot()

    def _pilot_point(self, rng: Any) -> np.ndarray:
        """A pilot move's θ: a draw of the Laplace fit ``N(θ̂, Σ)``.

        The law the Crank–Nicolson moves keep, and near a chain's. Not θ̂ itself: the
        residuals grow away from θ̂, and moves from θ̂ measured about a third of a chain's
        spread (at a tight budget Barker's test then chose 151 rows per round where it
        needs about 220).
        """
        laplace = self.proposal.surrogate
        return laplace.theta_hat + laplace.chol @ rng.standard_normal(laplace.dim)

    def stop_tuning(self) -> None:
        """End tuning; with ``batch_size="auto"`` the chain's m is chosen here."""
        super().stop_tuning()
        self._choice_due = False  # the final choice replaces one due
        if self.auto_rows and self.uses_minibatches:
            self._choose_rows(final=True)

    def _choose_rows(self, final: bool) -> None:
        budget = self._budget
        if len(budget) < MIN_RECORDS:
            if final and len(budget):  # none at all: no tuning steps, m stays as documented
                warnings.warn(
                    f"{type(self).__name__}: batch_size='auto' keeps {self.batch_size} rows "
                    f"per round: only {len(budget)} tuning transitions measured the "
                    f"test's error, and sizing m needs {MIN_RECORDS}. Tune longer, or give "
                    "batch_size as an int.", RuntimeWarning, stacklevel=3,
                )
            return
        if self._acceptance_setting == "auto" and self.initial_acceptance == "penalty":
            # At every choice (the first after MEASURE_FIRST transitions, so that the rest
            # of tuning runs the test chosen): every test's choice from the same records,
            # which describe the rows, not the test.
            # A test that may over-relax Crank–Nicolson is an option with and without it,
            # and each is an option per number of transitions per draw, with its own cap.
            best = choose_test([
                AcceptanceOption(c, budget.choose(
                    self._n_rows, sigma=c.sigma, table_error=c.error, kind=acceptance_kind(c),
                    rho=rho, cap=self._cap_for(steps)), steps, rho)
                for c in (*self._penalty_corrections, self._barker_correction)
                for rho in self._rhos_for(c) for steps in self._steps_options(c)])
            if best.correction is not self.correction or best.rho != self.overrelaxation:
                self._set_acceptance(best.acceptance, best.correction, best.rho)
            self.steps_per_draw = best.steps
            choice = best.choice
        else:
            choice = budget.choose(self._n_rows, rho=self.overrelaxation)
        self.rows_choice = choice
        if final and not choice.within_budget:
            self._warn_over_budget(choice)
        self.batch_size = choice.rows
        self._skew_floor = choice.skew
        if not final:
            # The draws of the tuning transitions that do not measure are not kept.
            self.tuning_rows = budget.cheapest(self._n_rows, transition_cost,
                                               rho=self.overrelaxation)
        # The rows per round of the transitions to come (the measuring ones aside).
        rows = choice.rows if final else self.tuning_rows
        if rows != self.policy.batch_size:
            self.policy.reset(rows)  # the prefetch's history was for another m
        self._update_kernel_settings()

    def _steps_for(self, correction: Any, rho: float = 0.0) -> int:
        """The transitions per draw that the test of ``correction`` runs with.

        With ``steps_per_draw="auto"`` and a proposal of
        :data:`STEP_CHOOSING_PROPOSALS`, one or the proposal's own number, whichever
        :func:`~pymc_minibatch_mh.transition.inner_steps.cost_per_effective_sample`
        predicts cheaper for the test's acceptance of a perfect proposal and
        Crank–Nicolson's ``rho``; else the setting.
        """
        accept, rows = perfect_accept(correction), float(self.batch_size)
        return min(self._steps_options(correction),
                   key=lambda k: cost_per_effective_sample(accept, rows, k, rho=rho))

    def _most_steps(self) -> int:
        """The most transitions per draw the step may run.

        The proposal's own number with ``steps_per_draw="auto"`` and a proposal of
        :data:`STEP_CHOOSING_PROPOSALS`, else the setting.
        """
        if not self._chooses_steps():
            return self.steps_per_draw
        return int(self.proposal.transitions_per_draw)

    def _chooses_steps(self) -> bool:
        """Whether the step chooses its transitions per draw.

        With ``steps_per_draw="auto"`` and a proposal of :data:`STEP_CHOOSING_PROPOSALS`.
        """
        return self._steps_auto and self.proposal.name in STEP_CHOOSING_PROPOSALS

    def _steps_options(self, correction: Any) -> tuple[int, ...]:
        """The transitions per draw the test of ``correction`` may run with.

        One and :meth:`_most_steps` where the test accepts at least
        :data:`OVERRELAX_ACCEPT` of perfect proposals, ``steps_per_draw="auto"`` and the
        proposal is of :data:`STEP_CHOOSING_PROPOSALS`; else
        :meth:`_most_steps` alone. A test that accepts less leaves one transition's draws
        strongly autocorrelated, and one per draw would buy only the rows above the cap
        of :meth:`_cap_for`: a smaller error for fewer effective samples (Barker's test
        at N = 10⁵, d = 100 within the budget at 156 rows per round: a third of the
        effective samples of 3 transitions per draw at 100 rows).
        """
        most = self._most_steps()
        if not self._chooses_steps() or perfect_accept(correction) < OVERRELAX_ACCEPT:
            return (most,)
        return tuple(sorted({1, most}))

    def _cap_for(self, steps: int) -> int:
        """The most rows per round a choice of m may take with ``steps`` transitions per draw.

        With the default budget, :data:`AUTO_START_ROWS` at the most transitions per draw
        the step may run (:meth:`_most_steps`): there the first rounds never read more rows
        than the fixed 100-row rounds of earlier versions. At one transition per draw of
        several (an option only for a test that accepts at least :data:`OVERRELAX_ACCEPT`
        of perfect proposals, chosen against the others by predicted work per effective
        sample), :data:`ONE_TRANSITION_SHARE` of N, and at least as many rows as the most
        transitions per draw read at 100 each. With an explicit ``error_tolerance``, no cap
        below N.
        """
        if self._rows_cap > AUTO_START_ROWS:
            return self._rows_cap
        most = self._most_steps()
        if steps < most:
            return max(AUTO_START_ROWS * most, int(ONE_TRANSITION_SHARE * self._n_rows))
        return AUTO_START_ROWS

    def _rhos_for(self, correction: Any) -> tuple[float, ...]:
        """Crank–Nicolson's ``min_rho`` values the test of ``correction`` may run with.

        ``(over-relaxed min_rho, 0)`` where the test accepts at least
        :data:`OVERRELAX_ACCEPT` of perfect proposals and the proposal is Crank–Nicolson
        chosen by name, else ``(0,)``.
        """
        if self._overrelaxed_rho is None or perfect_accept(correction) < OVERRELAX_ACCEPT:
            return (0.0,)
        return (self._overrelaxed_rho, 0.0)

    def _move_rho(self) -> float:
        """The autoregression coefficient of this transition's move (0 unless Crank–Nicolson)."""
        if self._overrelaxed_rho is None:
            return 0.0
        return self.proposal.rho(self.scaling * self._step_factor)

    def _match_steps(self) -> None:
        """The transitions per draw and Crank–Nicolson's ``min_rho`` of the test in use."""
        if self._overrelaxed_rho is not None:
            self.proposal.min_rho = self.overrelaxation
            if getattr(self, "tuner", None) is not None:  # else it is made with this maximum
                self.tuner.set_maximum(self.proposal.max_scale)
        # Before the base has resolved steps_per_draw (the test chosen with the proposal)
        # there is nothing to match.
        if hasattr(self, "steps_per_draw"):
            self.steps_per_draw = self._steps_for(self.correction, self.overrelaxation)

    def _warn_over_budget(self, choice: RowsChoice) -> None:
        """Say once that at the default budget's cap the predicted error exceeds the budget.

        Only the default budget has a cap below N (:data:`AUTO_START_ROWS`); the warning
        names the rows per round that an explicit ``error_tolerance`` would take, predicted
        from the same records.
        """
        if self._over_budget_warned or self._rows_cap >= self._n_rows:
            return
        from pymc_minibatch_mh.core.batch_budget import BUDGET_CONFIDENCE
        from pymc_minibatch_mh.errors import compared

        self._over_budget_warned = True
        needed = self._budget.choose(self._n_rows, cap=self._n_rows, rho=self.overrelaxation)
        bound, tolerance = compared(choice.error_bound, self.error_tolerance)
        mean, _ = compared(choice.predicted_error, self.error_tolerance)
        warnings.warn(
            f"{type(self).__name__}: batch_size='auto' keeps {choice.rows} rows per round, "
            "the most the default error budget takes: when error_tolerance is not given, "
            f"m is capped at {choice.rows} rows per round. There the predicted per-step "
            f"error of the acceptance probability is {mean} on average over the "
            f"{choice.records} measured transitions, and {bound} with "
            f"{BUDGET_CONFIDENCE:g} standard errors of that mean added (what the budget "
            f"holds), above the default error_tolerance={tolerance} (the error_estimate "
            "stat has each draw's). An explicit error_tolerance has no such cap, even at "
            "the default value: "
            f"error_tolerance={self.error_tolerance:g} given explicitly lets m grow to "
            f"about {needed.rows} rows per round, predicted from the same measurements. "
            "Or compare the posterior with a run at a larger batch_size.",
            RuntimeWarning, stacklevel=3,
        )

    def _decide(self, estimator: RatioEstimator, data_free: float) -> BarkerOutcome:
        if self._choice_due:  # made here, so that a transition's test, stats and audit agree
            self._choice_due = False
            self._choose_rows(final=False)
        if not (self.auto_rows and self._tuning):
            self._rows_used = self._test.batch_size
            return self._test(self.rng, estimator, data_free)
        # Tuning with batch_size="auto": the measuring transitions (the first
        # _measure_first, then one each time the others have read MEASURE_EVERY times the
        # measuring rows) use the first m and are recorded; the others use the cheapest m
        # for the records so far (chosen with m every RECHOOSE_EVERY transitions): their
        # draws are not kept, so the error budget does not size them.
        count = self._tuning_transitions = self._tuning_transitions + 1
        measuring = (count <= self._measure_first
                     or self._rows_since_measured >= MEASURE_EVERY * self._measure_rows)
        test = self._measure_test if measuring else self._tuning_test
        self._rows_used = test.batch_size
        outcome = test(self.rng, estimator, data_free)
        if measuring:
            self._rows_since_measured = 0
            self._budget.record(outcome.batch_size, estimator.n_total, outcome.variance,
                                outcome.edgeworth, outcome.delta_star, outcome.kurtosis,
                                self._move_rho())
        else:
            self._rows_since_measured += outcome.batch_size
        if count == self._measure_first or (
                count > MEASURE_FIRST and count % RECHOOSE_EVERY == 0):
            self._choice_due = True
        return outcome

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


def check_barker_settings(sigma: Any, tolerance: Any, early_decision: Any) -> None:
    """Validate the settings of the minibatch Barker test (also ``MinibatchGibbs``'s).

    Parameters
    ----------
    sigma, tolerance, early_decision
        As for :class:`MinibatchBarker`.

    Raises
    ------
    ValueError
        For a value out of its range.

    """
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


def perfect_accept(correction: Any) -> float:
    """The test's acceptance probability of a perfect proposal (Δ = 0).

    ``h_σ(0) = 2Φ(−σ/2)`` for the penalty test (a
    :class:`~pymc_minibatch_mh.core.penalty.PenaltyCorrection`), ``g(0) = 1/2`` for
    Barker's.
    """
    if isinstance(correction, PenaltyCorrection):
        return correction.probability(0.0)
    return 0.5


@dataclass(frozen=True)
class AcceptanceOption:
    """A test ``acceptance="auto"`` may run from a choice of m on (:func:`choose_test`).

    Attributes
    ----------
    correction : PenaltyCorrection or CorrectionDistribution
        The test's correction (its ``sigma`` is the test's σ).
    choice : RowsChoice
        The error budget's choice of m for this test, from the chain's records.
    steps : int
        The transitions per draw it would run with.
    rho : float
        Crank–Nicolson's most negative ρ with it (0: not over-relaxed).

    """

    correction: Any
    choice: RowsChoice
    steps: int
    rho: float = 0.0

    @property
    def acceptance(self) -> str:
        """``"penalty"`` or ``"barker"``: the test of ``correction``."""
        return "penalty" if isinstance(self.correction, PenaltyCorrection) else "barker"

    @property
    def cost(self) -> float:
        """Predicted work per effective sample, in transitions.

        :func:`~pymc_minibatch_mh.transition.inner_steps.cost_per_effective_sample` at the
        test's acceptance of a perfect proposal, the choice's predicted rows and rounds, and
        ``rho``.
        """
        choice = self.choice
        return cost_per_effective_sample(perfect_accept(self.correction),
                                         choice.predicted_rows, self.steps,
                                         choice.predicted_rows / max(choice.rows, 1), self.rho)


def choose_test(options: Sequence[AcceptanceOption]) -> AcceptanceOption:
    """``acceptance="auto"``: the test to run from this choice of m on.

    ``options`` are the penalty test at each σ in :data:`PENALTY_SIGMAS`' order, then
    Barker's. Among those within the error budget, the one with the least predicted work
    per effective sample (:attr:`AcceptanceOption.cost`: a draw's work besides its
    transitions, each transition's fixed work, rows and growth rounds, over the effective
    samples per draw of a perfect proposal accepted with the test's probability; the first
    on a tie). With none within it, the one with the smaller predicted error of the first
    test's and Barker's, at the most transitions per draw of the options (Barker's test is
    smoother, the penalty test stops growing at a smaller ``s²``); the smaller σ are left
    out there, since they grow the minibatch past m (at N = 10⁵, d = 100, σ = 0.1 read 750
    rows per transition against Barker's 100, for a predicted error still over the
    budget), and so are fewer transitions per draw, whose larger cap would buy a smaller
    error with draws of fewer effective samples.
    """
    within = [option for option in options if option.choice.within_budget]
    if within:
        return min(within, key=lambda option: option.cost)
    most = max(option.steps for option in options)
    fallback = [option for option in options if option.steps == most and (
        option.correction is options[0].correction or option.acceptance == "barker")]
    return min(fallback, key=lambda option: option.choice.predicted_error)


def check_acceptance(acceptance: Any, sigma: Any, correction: Any, skew_correction: Any) -> None:
    """Validate ``acceptance`` and the settings that go with it.

    Raises
    ------
    ValueError
        For an unknown acceptance function; with ``"penalty"``, a ``sigma`` that is not a
        positive finite number, a ``correction`` table, or ``skew_correction``. (With
        ``"barker"`` or ``"auto"``, :func:`check_barker_settings` checks ``sigma``.)

    """
    if acceptance not in ("auto", "barker", "penalty"):
        raise ValueError(
            f"acceptance must be 'auto', 'barker' or 'penalty', got {acceptance!r}."
        )
    if acceptance != "penalty":
        return
    if sigma is not None and not (isinstance(sigma, int | float) and 0.0 < sigma
                                  and math.isfinite(sigma)):
        raise ValueError(f"sigma must be a positive number, got {sigma!r}.")
    if correction is not None:
        raise ValueError(
            "acceptance='penalty' draws its correction exactly (an exponential shifted by "
            "-sigma**2/2); a correction table is for Barker's test. Leave correction unset."
        )
    if skew_correction:
        raise ValueError(
            "skew_correction is implemented for Barker's test only; use it with "
            "acceptance='barker', or leave it off with acceptance='penalty'."
        )


def check_rows_setting(batch_size: Any, error_tolerance: Any, table_error: float) -> bool:
    """Validate ``batch_size`` and ``error_tolerance``; whether m is sized by the budget.

    Raises
    ------
    ValueError
        For a string other than ``"auto"``, an ``error_tolerance`` with a fixed
        ``batch_size``, or one outside (table error, 1). A fixed ``batch_size`` is checked
        by the step's base.

    """
    auto = isinstance(batch_size, str)
    if auto and batch_size != "auto":
        raise ValueError(f"batch_size must be a positive integer or 'auto', got {batch_size!r}.")
    if error_tolerance is None:
        return auto
    if not auto:
        raise ValueError(
            f"error_tolerance sizes the minibatch, but batch_size={batch_size!r} fixes it. "
            "Give error_tolerance with batch_size='auto' (the default), or a fixed "
            "batch_size alone."
        )
    if not (isinstance(error_tolerance, int | float) and table_error < error_tolerance < 1.0):
        raise ValueError(
            f"error_tolerance must be a number in ({table_error:.1e}, 1), got "
            f"{error_tolerance!r}: it bounds the acceptance probability's error per step, "
            f"and the correction table's error alone is {table_error:.1e}."
        )
    return True


def barker_correction(
    sigma: float, correction: CorrectionDistribution | None
) -> CorrectionDistribution:
    """The correction distribution for ``sigma``: ``correction`` if given, else the table.

    Parameters
    ----------
    sigma, correction
        As for :class:`MinibatchBarker`.

    Returns
    -------
    CorrectionDistribution
        ``correction``, or :func:`~pymc_minibatch_mh.core.correction.get_correction`'s.

    Raises
    ------
    ValueError
        If ``correction`` was built for another ``sigma``.

    """
    if correction is not None and not math.isclose(correction.sigma, sigma):
        raise ValueError(
            f"The correction distribution was built for sigma={correction.sigma}, "
            f"but sigma={sigma} was given."
        )
    return correction if correction is not None else get_correction(float(sigma))
