r"""What ``MinibatchBarker`` chooses itself: the rows per round, the test, the transitions.

With ``batch_size="auto"`` the step measures its test's error on tuning transitions (and
on a pilot at the set-up, with a Crank–Nicolson proposal) and sizes m by the error budget
(:mod:`~pymc_minibatch_mh.core.batch_budget`); with ``acceptance="auto"`` it chooses
between the penalty test at each σ of :data:`PENALTY_SIGMAS` and Barker's test by
predicted work per effective sample (:func:`choose_test`); with ``steps_per_draw="auto"``
the transitions per draw follow the test. :class:`AutoChoices` holds these rules for
:class:`~pymc_minibatch_mh.MinibatchBarker`, whose settings page in the
guide says what each choice measures.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pymc_minibatch_mh.core.barker import BarkerOutcome
from pymc_minibatch_mh.core.batch_budget import (
    AUTO_START_ROWS,
    MEASURE_EVERY,
    MEASURE_FIRST,
    MIN_RECORDS,
    RECHOOSE_EVERY,
    ErrorBudget,
    RowsChoice,
)
from pymc_minibatch_mh.core.buffered import BufferedGenerator
from pymc_minibatch_mh.core.penalty import DEFAULT_PENALTY_SIGMA, PenaltyCorrection, acceptance_kind
from pymc_minibatch_mh.estimators.ratio import RatioEstimator
from pymc_minibatch_mh.proposals.crank_nicolson import CrankNicolsonProposal
from pymc_minibatch_mh.transition.inner_steps import cost_per_effective_sample, transition_cost

__all__ = [
    "OVERRELAX_ACCEPT",
    "PENALTY_PROPOSALS",
    "PENALTY_SIGMAS",
    "PILOT_SEED",
    "STEP_CHOOSING_PROPOSALS",
    "AcceptanceOption",
    "AutoChoices",
    "choose_test",
    "perfect_accept",
]

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
    budget), and so are fewer transitions per draw, whose draws have fewer effective
    samples. (Without a cap below N the step's choices always have an option within the
    budget: all N rows leave only the correction table's error.)
    """
    within = [option for option in options if option.choice.within_budget]
    if within:
        return min(within, key=lambda option: option.cost)
    most = max(option.steps for option in options)
    fallback = [option for option in options if option.steps == most and (
        option.correction is options[0].correction or option.acceptance == "barker")]
    return min(fallback, key=lambda option: option.choice.predicted_error)


class AutoChoices:
    """The choices of m, of the test and of the transitions per draw (a mixin).

    For :class:`~pymc_minibatch_mh.step_methods.minibatch_barker.MinibatchBarker`, which holds the
    settings these methods read (``auto_rows``, ``error_tolerance``, the tests'
    corrections) and builds the core tests (``_update_kernel_settings``).
    """

    def _proposal_chosen(self, proposal: Any) -> None:
        #: The ``min_rho`` of a Crank–Nicolson proposal chosen by name, which the step may
        #: use where its test accepts at least :data:`OVERRELAX_ACCEPT` of perfect
        #: proposals (:meth:`_rhos_for`); None for other proposals and for one given as an
        #: object (whose own ``min_rho`` stays).
        self._overrelaxed_rho = (
            proposal.min_rho if isinstance(proposal, CrankNicolsonProposal)
            and isinstance(self.move_settings.proposal, str | None) else None)
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
                                       kind=acceptance_kind(self.correction))
        else:  # the records describe the rows, not the test: they are kept
            self._budget.sigma, self._budget.table_error = self.sigma, self.correction.error
            self._budget.kind = acceptance_kind(self.correction)

    def _start_chain_on_data(self, rng: Any) -> None:
        if self._acceptance_setting == "auto":  # the last chain may have chosen another test
            self._set_acceptance(self.initial_acceptance)
        if self.auto_rows:  # each chain measures afresh, on the data it starts with
            self._measure_pilot()  # the set-up's, unless the data or the test changed
            self.batch_size = min(AUTO_START_ROWS, self._n_rows)
            self._budget.reset()  # the pilot's records
            self._start_measuring(self.batch_size,
                                  max(0, MEASURE_FIRST - self._budget.pilot_records))
        super()._start_chain_on_data(rng)

    def _start_measuring(self, rows: int, measure_first: int) -> None:
        """A chain's measuring state: its first m, its counters, no choice of m due yet.

        ``measure_first``: the tuning transitions that measure before the first choice of
        m (fewer after a pilot: :meth:`_measure_pilot`).
        """
        self._measure_rows = rows
        #: With ``batch_size="auto"``, the rows per round of the tuning transitions that do
        #: not measure: the cheapest for the records so far, whatever the error (their
        #: draws are not kept; the growth rule still runs).
        self.tuning_rows = self._rows_used = rows
        self._measure_first = measure_first
        self._skew_floor = 0.0
        # The chain's tuning transitions, and the rows they read since the last measuring
        # one.
        self._tuning_transitions = self._rows_since_measured = 0
        # Whether the records call for a choice of m before the next transition's test.
        self._choice_due = measure_first == 0

    def stop_tuning(self) -> None:
        """End tuning; with ``batch_size="auto"`` the chain's m is chosen here."""
        super().stop_tuning()
        self._choice_due = False  # the final choice replaces one due
        if self.auto_rows and self.uses_minibatches:
            self._choose_rows(final=True)

    def _tuning_decision(self, estimator: RatioEstimator, data_free: float) -> BarkerOutcome:
        """A tuning transition's test with ``batch_size="auto"``.

        The measuring transitions (the first ``_measure_first``, then one each time the
        others have read :data:`~pymc_minibatch_mh.core.batch_budget.MEASURE_EVERY` times the
        measuring rows) use the first m and are recorded; the others use the cheapest m for the
        records so far (chosen with m every
        :data:`~pymc_minibatch_mh.core.batch_budget.RECHOOSE_EVERY` transitions): their draws are
        not kept, so the error budget does not size them.
        """
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


    def _measure_pilot(self) -> None:
        """The error budget's first records, measured once per set-up and shared by chains.

        With ``batch_size="auto"`` and a Crank–Nicolson proposal (which moves around the
        Laplace fit ``N(θ̂, Σ)`` of the control variates),
        :data:`~pymc_minibatch_mh.core.batch_budget.MEASURE_FIRST` moves are measured as a chain's
        first tuning transitions would measure them, but from ``θ ~ N(θ̂, Σ)`` (the law the
        proposal's moves keep; a chain starts at θ̂) to the proposal's move at the largest scale
        its tuner may reach with the most negative ρ any of the step's tests may run with (at
        ``scaling`` without tuning): the test at
        :data:`~pymc_minibatch_mh.core.batch_budget.AUTO_START_ROWS` rows per round on the
        data-free part and the minibatch of ``(θ, θ′)``. Every chain starts with these records
        (:meth:`~pymc_minibatch_mh.core.batch_budget.ErrorBudget.keep_as_pilot`), so it chooses m
        from its first transition and measures only as chains without a pilot do after their first
        50 (:data:`~pymc_minibatch_mh.core.batch_budget.MEASURE_EVERY`); its own records then
        replace the pilot's from the oldest (``ErrorBudget.choose`` keeps the latest half, at least
        :data:`~pymc_minibatch_mh.core.batch_budget.MIN_RECORDS`). A pilot move that read all N
        rows records nothing, and the chain measures as many of its first transitions as records
        are missing.

        The moves come from a generator of fixed seed (:data:`PILOT_SEED`), not from a
        chain's: the pilot is part of the set-up, deterministic like it, and a chain's
        draws do not depend on which chain or process made it. It is made again when the
        set-up (``follow_data``), the temperature or the test's over-relaxation changed
        since the last; its rows are counted in :attr:`pilot_rows`. Without a pilot (other
        proposals; variables of other steps in the likelihood, which the Laplace draw
        would not move) each chain measures its first
        :data:`~pymc_minibatch_mh.core.batch_budget.MEASURE_FIRST` transitions.
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
            # and each is an option per number of transitions per draw.
            best = choose_test([
                AcceptanceOption(c, budget.choose(
                    self._n_rows, sigma=c.sigma, table_error=c.error, kind=acceptance_kind(c),
                    rho=rho), steps, rho)
                for c in (*self._penalty_corrections, self._barker_correction)
                for rho in self._rhos_for(c) for steps in self._steps_options(c)])
            if best.correction is not self.correction or best.rho != self.overrelaxation:
                self._set_acceptance(best.acceptance, best.correction, best.rho)
            self.steps_per_draw = best.steps
            choice = best.choice
        else:
            choice = budget.choose(self._n_rows, rho=self.overrelaxation)
        self.rows_choice = choice
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
        strongly autocorrelated: fewer effective samples for about the same rows (Barker's
        test at N = 10⁵, d = 100 within the budget at 156 rows per round: a third of the
        effective samples of 3 transitions per draw at 100 rows).
        """
        most = self._most_steps()
        if not self._chooses_steps() or perfect_accept(correction) < OVERRELAX_ACCEPT:
            return (most,)
        return tuple(sorted({1, most}))

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
