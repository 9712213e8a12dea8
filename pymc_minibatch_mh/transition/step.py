r"""The Metropolis-Hastings steps' shared base: :class:`MinibatchStep`.

It adds to :class:`~pymc_minibatch_mh.transition.step_base.MinibatchStepBase` the
proposal, the scale tuner, the surrogate start point, the audit and the temperature
schedule. It runs one transition (``MinibatchStep._transition``; a draw is
``steps_per_draw`` of them), a composition of four parts:

1. map the point to the flat state θ (:class:`~pymc_minibatch_mh.model.pointmap.PointMap`);
2. **propose** ``(state′, info)`` from the proposal's state at θ
   (:mod:`~pymc_minibatch_mh.proposals`; ``info`` holds the log-q ratio);
3. **open the Δ\* estimator** for (θ, θ′) and get its data-free part
   (:mod:`~pymc_minibatch_mh.estimators.ratio`; its rows come from the **row store**,
   :mod:`~pymc_minibatch_mh.store.row_store`);
4. run the **acceptance test** on the estimator (a core test; the subclass's ``_decide``),
   update the **tuner**, and return the outcome's stats plus the common ones.

A subclass supplies ``_decide(estimator, data_free)`` and the declaration and extraction
of its own stats.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np
from pymc.step_methods.state import dataclass_state

from pymc_minibatch_mh.core.barker import TestOutcome
from pymc_minibatch_mh.estimators.ratio import RatioEstimator
from pymc_minibatch_mh.estimators.registry import make_estimator
from pymc_minibatch_mh.proposals.base import Proposal, ProposalState
from pymc_minibatch_mh.proposals.registry import PROPOSAL_CODES, make_proposal
from pymc_minibatch_mh.proposals.surrogate import (
    Centring,
    GaussianSurrogate,
    SurrogatePosterior,
)
from pymc_minibatch_mh.proposals.tuning import ScalingTuner
from pymc_minibatch_mh.transition.audit import AUDIT_STATS, Audit, check_audit_every
from pymc_minibatch_mh.transition.inner_steps import resolve_steps_per_draw
from pymc_minibatch_mh.transition.mixing_watch import MixingWatch, mixing_message
from pymc_minibatch_mh.transition.progress_bar import (
    progressbar_config,
    progressbar_update_functions,
)
from pymc_minibatch_mh.transition.schedule import TemperatureSchedule
from pymc_minibatch_mh.transition.settings import MoveSettings, StepSettings
from pymc_minibatch_mh.transition.step_base import MinibatchStepBase, MinibatchStepBaseState

__all__ = ["MinibatchStep", "MinibatchStepState"]


@dataclass_state
class MinibatchStepState(MinibatchStepBaseState):
    """Resumable state of the Metropolis-Hastings steps: the base's, proposal scale, tuning."""

    tuner: ScalingTuner
    scaling: float


#: Default ``target_accept`` of the random walk (Barker's test accepts less often than
#: Metropolis'; see :class:`~pymc_minibatch_mh.proposals.tuning.ScalingTuner`).
RANDOM_WALK_TARGET_ACCEPT = 0.25
#: Default ``target_accept`` of the surrogate-guided proposals (Barker's acceptance is at
#: most 1/2 for moves the surrogate makes exact).
SURROGATE_TARGET_ACCEPT = 0.4



class MinibatchStep(MinibatchStepBase):
    """Base class of the minibatch Metropolis-Hastings step methods (not used directly).

    Adds to :class:`~pymc_minibatch_mh.transition.step_base.MinibatchStepBase` the
    proposal, its scale tuner, the surrogate start point, the audit and the temperature
    schedule; a draw is ``steps_per_draw`` transitions (``_transition``).

    Parameters
    ----------
    vars : list of Variable, optional
        Continuous variables to sample, as one block. Default: all free variables.
    settings : StepSettings
        What every step method takes
        (:class:`~pymc_minibatch_mh.transition.settings.StepSettings`).
    move_settings : MoveSettings
        The proposal, its tuning, the control variates and the audit
        (:class:`~pymc_minibatch_mh.transition.settings.MoveSettings`); the public step
        methods document each keyword.

    """

    name: ClassVar[str] = "minibatch"
    state_class = MinibatchStepState
    #: The default ``target_accept`` (0.4 with a surrogate proposal, else 0.25, set for
    #: Barker's test, which accepts at most half of a perfect proposal) times this: a
    #: test that accepts more of a perfect proposal sets it higher.
    target_accept_factor: float = 1.0

    #: Stats shared by every Metropolis-Hastings step (those of every step among them).
    common_stats: ClassVar[dict[str, tuple[Any, list[int]]]] = {
        "accepted": (np.float64, []),
        **MinibatchStepBase.common_stats,
        "full_data": (bool, []),
        **ScalingTuner.stats_dtypes_shapes,
        "accept_rate": (np.float64, []),
        "recentered": (bool, []),
        # Which proposal ran (adapter.proposal_choice.PROPOSAL_CODES) and its parameters.
        "proposal": (np.int64, []),
        "rho": (np.float64, []),
        "step_size": (np.float64, []),
        **AUDIT_STATS,  # error_estimate and the audit's stats
    }

    def __init__(
        self, vars: Sequence[Any] | None = None, *, settings: StepSettings,
        move_settings: MoveSettings,
    ) -> None:
        temperature = settings.temperature
        self.schedule = temperature if isinstance(temperature, TemperatureSchedule) else None
        if self.schedule is not None:
            settings = replace(settings, temperature=self.schedule(0)[0])
        #: The proposal's and the estimator's settings (the base's set-up hooks read them;
        #: after a change of the data,
        #: :meth:`~pymc_minibatch_mh.transition.step_base.MinibatchStepBase.follow_data`
        #: builds the proposal again from them).
        self.move_settings = move_settings
        super().__init__(vars, settings=settings)

    def _validate_settings(self, *, batch_size: Any, temperature: Any) -> None:
        super()._validate_settings(batch_size=batch_size, temperature=temperature)
        self.audit = Audit(check_audit_every(self.move_settings.audit_every))

    def _make_estimator(self) -> RatioEstimator:
        """The plain ratios, or Taylor residuals with ``control_variate``."""
        settings = self.move_settings
        return make_estimator(
            settings.control_variate, self.likelihood, self.policy,
            reference=settings.reference, recenter=settings.recenter,
            step_name=type(self).__name__,
            tempered_schedule=self.schedule is not None, temperature=self.temperature,
        )

    def _setup_transitions(self) -> None:
        """The tuning flag, the proposal, its scale tuner and the transitions per draw."""
        settings = self.move_settings
        self.tune = self._tune_enabled = bool(settings.tune)
        scaling = float(settings.scaling)
        self.scaling = scaling
        self._posterior: SurrogatePosterior | None = None
        self.proposal: Proposal = self._make_proposal(settings.proposal, settings.S)
        surrogate = self.proposal.surrogate is not None
        if surrogate and self.schedule is not None:
            raise ValueError(
                f"proposal={self.proposal.name!r} follows the Laplace fit at one temperature; "
                "a TemperatureSchedule changes it. Use proposal='random_walk' with a schedule."
            )
        self._proposal_chosen(self.proposal)
        self.steps_per_draw = resolve_steps_per_draw(settings.steps_per_draw, self.proposal)
        #: Whether ``target_accept`` is the default (:meth:`default_target_accept`).
        self.default_target = settings.target_accept is None
        target_accept = (self.default_target_accept() if self.default_target
                         else settings.target_accept)
        self.tuner = ScalingTuner(scaling, target=target_accept,
                                  maximum=self.proposal.max_scale)
        self.scaling = self.tuner.scaling
        #: The proposal's state at the current point (None: to be built).
        self._proposal_state: ProposalState | None = None

    def default_target_accept(self) -> float:
        """The default ``target_accept``.

        0.4 with a surrogate proposal, else 0.25, times ``target_accept_factor``.
        """
        surrogate = self.proposal.surrogate is not None
        return self.target_accept_factor * (
            SURROGATE_TARGET_ACCEPT if surrogate else RANDOM_WALK_TARGET_ACCEPT)

    def _proposal_chosen(self, proposal: Proposal) -> None:
        """Hook: the proposal is known, the tuner and ``steps_per_draw`` not yet.

        A step whose test depends on the proposal chooses it here
        (``MinibatchBarker(acceptance="auto")``).
        """

    def _make_proposal(self, proposal: Any, S: Any) -> Proposal:
        """The proposal for the ``proposal`` and ``S`` settings, on the current set-up."""
        built = make_proposal(
            proposal, S, dim=self.likelihood.point_map.size,
            control_variate=self.control_variate, posterior=self.surrogate_posterior,
            step=self,
        )
        self._built_proposal = built  # to tell it from one the user put in its place
        return built

    def _data_followed(self) -> None:
        """After a repeated set-up: the surrogate posterior and the proposal built again.

        Both hold the Laplace fit (and the surrogate the control variates' tables) of the
        old set-up; a proposal without a surrogate (the random walk with given ``S``, SGLD,
        which reads the row store's N itself) is built again too, or kept when the user
        set it.

        Raises
        ------
        ValueError
            If the proposal was given as an object (or set on the step) and moves around
            the old Laplace fit, or if ``proposal="auto"`` chooses another proposal on the
            new data (the chains' stats were declared for the old one).

        """
        self._posterior = None
        self._proposal_state = None
        old = self.proposal
        setting, S = self.move_settings.proposal, self.move_settings.S
        if old is not self._built_proposal or isinstance(setting, Proposal):
            if old.surrogate is not None:
                raise ValueError(
                    f"The data changed, so the control variates' set-up was repeated, but "
                    f"this {type(self).__name__}'s proposal {old.name!r} is an object built "
                    "around the old Laplace fit. Give proposal= as a name or as a callable "
                    "step -> Proposal (the step then builds it again after a change of the "
                    "data), or build the step again."
                )
            return
        new = self._make_proposal(setting, S)
        if type(new) is not type(old):
            raise ValueError(
                f"The data changed and, on the new data, proposal={setting or 'auto'!r} "
                f"chooses {new.name!r} instead of {old.name!r} (the Laplace fit or the shape "
                f"of the model's quantities differs). Build the {type(self).__name__} again, "
                f"or give proposal={old.name!r} explicitly."
            )
        self.proposal = new

    def __getstate__(self) -> dict[str, Any]:
        """The step's attributes, after following the data.

        :meth:`~pymc_minibatch_mh.transition.step_base.MinibatchStepBase.follow_data`
        runs first.

        ``pm.sample`` pickles the step in its own process to send it to workers started
        with "spawn" or "forkserver" (before it asks for the progress-bar columns): a
        set-up repeated here is shared by all chains instead of made in each worker.
        """
        if "estimator" in self.__dict__:
            self.follow_data()
        return self.__dict__.copy()

    def surrogate_posterior(self) -> SurrogatePosterior:
        """The data-free surrogate posterior π̃ of the control variates (built on first use).

        ``log π̃ = log p0 + proxy / K`` at the step's temperature K, with the Laplace fit at
        θ̂; the one place where the control variates, the likelihood and the temperature
        are joined for the proposals.

        Raises
        ------
        ValueError
            Without control variates, or when the Hessian at θ̂ is not negative definite
            (no Laplace fit).

        """
        if self._posterior is None:
            cv, lik = self.control_variate, self.likelihood
            if cv is None:
                raise ValueError("The surrogate posterior needs control_variate='taylor'.")
            inv_t = 1.0 / self._temperature
            mean, cov = cv.reference.laplace_fit(self._temperature)
            laplace = GaussianSurrogate(mean, cov, reference=cv.reference.theta)
            flat = lik.graphs.flat

            def log_density(x: np.ndarray) -> float:
                return cv.proxy_value(x) * inv_t + lik.prior(x)

            def gradient(x: np.ndarray) -> np.ndarray:
                return cv.proxy_gradient(x) * inv_t + lik.prior_gradient(x)

            chosen = cv.centring(self._temperature)
            self._posterior = SurrogatePosterior(
                laplace, log_density, gradient, flat,
                lik.graphs.prior + cv.proxy_graph(flat) * inv_t,
                functools.partial(cv.data_free, inv_temperature=self._inv_temperature),
                None if chosen is None else Centring(flat, *chosen),
            )
        return self._posterior

    def _declare_stats(self, unused: Iterable[str] = ()) -> None:
        """Declare only the stats this step reports (each costs time on every draw).

        The audit's stats need ``audit_every``; the proposal's code, ρ and step size a
        proposal other than the random walk; ``scaling`` a proposal that uses the tuned
        scale; subclasses drop more in :meth:`_unused_stats`.
        """
        self._proposal_stats = self.proposal.reports_parameters
        unused = set(unused)
        if self.audit.every is None:
            unused |= Audit.NOT_AUDITED.keys()
        if not self._proposal_stats:
            unused |= {"proposal", "rho", "step_size"}
        if not self.proposal.uses_scale:
            unused.add("scaling")
        super()._declare_stats(unused)

    # ------------------------------------------------------------- chain hooks
    def _start_chain_on_data(self, rng: Any) -> None:
        # After follow_data, which may have built the proposal again.
        self.audit.start_chain(rng)  # its own generator, spawned: the chain's draws stay
        self.proposal.start_chain(rng)  # restarts its adaptation; spawns its own generators
        super()._start_chain_on_data(rng)
        self.proposal.set_tuning(self._tune_enabled)  # a proposal that adapts itself
        self._proposal_state = None
        #: The last tuning draws of the chain, measured at the end of tuning
        #: (:mod:`~pymc_minibatch_mh.transition.mixing_watch`).
        self.mixing_watch = MixingWatch(self.likelihood.point_map.size)
        self._chain_accepted = 0
        self._step_factor = 1.0
        self._next_change: int | None = None
        if self.schedule is not None:
            self.temperature, self._step_factor = self.schedule(0)
            self._next_change = self.schedule.next_change(0)

    def reset_tuning(self) -> None:
        """Reset the proposal scale to its initial value (called by PyMC per chain)."""
        self.tuner.reset()
        self.scaling = self.tuner.scaling

    def stop_tuning(self) -> None:
        """End tuning: the proposal scale (and the control variates' θ̂) is fixed from now on.

        A chain whose last tuning draws barely moved is reported with a warning
        (:mod:`~pymc_minibatch_mh.transition.mixing_watch`).
        """
        if self._tuning and self._started:
            self._check_mixing()
        super().stop_tuning()
        self.proposal.set_tuning(False)

    def _check_mixing(self) -> None:
        """Warn if the chain's last tuning draws have a tiny effective sample size."""
        watch = self.mixing_watch
        entries = self.likelihood.point_map.entries
        scalars = [e.start for e in entries if e.size == 1]
        if not watch.measure(scalars):
            return
        entry = next(e for e in entries if e.start <= watch.worst < e.start + e.size)
        where = "" if entry.size == 1 else str(
            [int(i) for i in np.unravel_index(watch.worst - entry.start, entry.shape)])
        warnings.warn(
            mixing_message(type(self).__name__, watch, f"{entry.name!r}{where}",
                           self.proposal.name, self.control_variate is not None),
            RuntimeWarning, stacklevel=3,
        )

    def _start_point(self, point: Mapping[str, Any]) -> Mapping[str, Any]:
        """With tuning, the proposal's start point; else PyMC's.

        :meth:`~pymc_minibatch_mh.proposals.base.Proposal.start_point` is a draw of the
        Laplace fit for a surrogate proposal and None (PyMC's start) for the random walk:
        tuning draws are discarded.
        """
        if self._tuning and self._tune_enabled:
            draw = self.proposal.start_point(self.rng)
            if draw is not None:
                return self.likelihood.point_map.to_point(draw, point)
        return point

    # --------------------------------------------------------------------- step
    def _error_estimate(self, outcome: Any) -> float:
        """The ``error_estimate`` stat of one outcome (NaN: the test gives none)."""
        return math.nan

    def _transitions(
        self, point: Mapping[str, Any]
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """``steps_per_draw`` transitions (``_transition``)."""
        if self.likelihood.other_shared:
            # Other steps of a compound step may have moved the variables the surrogate's
            # prior reads: its value and gradient at the point are recomputed.
            self._proposal_state = None
        transitions = []
        for _ in range(self.steps_per_draw):
            point, (stats,) = self._transition(point)
            transitions.append(stats)
        if self._tuning:
            self.mixing_watch.record(self.likelihood.point_map.flat_view(point))
        return point, transitions

    def _transition(self, point: Mapping[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """One transition: map the point, propose, open the estimator, test, tune."""
        if self._next_change is not None and self._chain_steps >= self._next_change:
            self.temperature, self._step_factor = self.schedule(self._chain_steps)
            self._next_change = self.schedule.next_change(self._chain_steps)
        lik = self.likelihood
        if lik.other_shared:
            lik.set_others(point)
        x_cur = lik.point_map.flat_view(point)  # only read below
        estimator = self.estimator
        recentered, changed = 0, False
        if self._tuning:
            before = estimator.recenterings
            recentered = estimator.maybe_recenter(x_cur)  # rows of a pass, even a failed one
            changed = estimator.recenterings > before
        state = self._proposal_state
        # Bytes, not np.array_equal (about 2 µs a call): a bitwise match is what counts.
        if changed or state is None or state.x.tobytes() != x_cur.tobytes():
            # A chain start, a re-centring (the surrogate moved with θ̂), or a point this
            # proposal did not produce: the state is built afresh at the point.
            state = self.proposal.init(np.array(x_cur, dtype=np.float64))
        new_state, info = self.proposal.propose(
            self.rng, state, self.scaling * self._step_factor
        )
        x_prop = new_state.x
        data_free = estimator.open(
            x_cur, x_prop, self._inv_temperature, info.log_q_ratio,
            self.policy.rows if self.uses_minibatches else 0,
        )
        outcome = self._decide(estimator, data_free)
        audit = self.audit(estimator, data_free, outcome, getattr(self, "correction", None))
        estimator.close(outcome.rounds)
        self._proposal_state = new_state if outcome.accepted else state
        stats = self._complete_step(point, x_prop, outcome, recentered + self.audit.rows, audit)
        new_point, (step_stats,) = stats
        step_stats["recentered"] = changed
        if self.proposal.uses_scale:
            step_stats["scaling"] = info.scale
        if self._proposal_stats:
            step_stats["proposal"] = self._proposal_code
            step_stats["rho"] = info.rho
            step_stats["step_size"] = info.step_size
        return stats

    @property
    def _proposal_code(self) -> int:
        return PROPOSAL_CODES.get(self.proposal.name, -1)

    def _complete_step(
        self, point: Mapping[str, Any], x_prop: np.ndarray, outcome: TestOutcome, extra: int,
        audit: Mapping[str, Any],
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The second half of ``_transition``: the new point, the stats, the tuning.

        ``extra`` counts the rows of a re-centring and of the audit (``audit``, its stats).
        """
        stats = self._outcome_stats(outcome, extra)
        accepted = outcome.accepted
        new_point = self.likelihood.point_map.to_point(x_prop, point) if accepted else point
        if accepted:
            self._chain_accepted += 1
        self._add_chain_stats(stats)
        stats["accept_rate"] = self._chain_accepted / self._chain_steps
        stats["error_estimate"] = self._error_estimate(outcome)
        stats.update(audit)
        if self.tune and self._tune_enabled and self.proposal.uses_scale:
            self.scaling = self.tuner.update(stats["accept"])
        return new_point, [stats]

    # --------------------------------------------------------- progress bar
    def _tuned_stat(self) -> str | None:
        """The stat of the progress bar's third column: what the proposal tuned."""
        if self.proposal.uses_scale:
            return "scaling"
        return "step_size" if self._proposal_stats else None

    def progress_bar_columns(self, n_chains: int) -> tuple[list[Any], dict[str, list[Any]]]:
        """The running mean batch size, acceptance rate and tuned parameter, per chain.

        ``pm.sample`` asks for them in its own process before it starts any chain (and
        before it forks workers): the data are followed first
        (:meth:`~pymc_minibatch_mh.transition.step_base.MinibatchStepBase.follow_data`),
        so a set-up repeated on new data is made once and shared by every chain.
        """
        self.follow_data()
        return progressbar_config(n_chains, self._tuned_stat())

    def progress_bar_updates(self) -> tuple[Any, ...]:
        """The function that maps a draw's stats to the progress bar's fields."""
        return progressbar_update_functions(self._tuned_stat())

