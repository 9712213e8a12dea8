r"""The base of every step method of the package: :class:`MinibatchStepBase`.

It holds what they all share: the constructor's wiring (the compiled likelihood, the
prefetch policy, the Δ\* estimator, the generator and the checks of the settings), the
temperature, the chain's start and its checks, the warning for a non-finite ratio, the rule
of the ``accept`` stat, the common stats and their declaration, the draw as a sequence of
transitions whose stats :func:`~pymc_minibatch_mh.transition.inner_steps.merge_stats`
merges, and PyMC's hooks. A subclass supplies the transitions of a draw (``_transitions``),
the acceptance test (``_decide``) and its own stats:
:class:`~pymc_minibatch_mh.transition.step.MinibatchStep` for the Metropolis-Hastings
steps, :class:`~pymc_minibatch_mh.step_methods.minibatch_gibbs.MinibatchGibbs` for discrete
variables (a coordinate update per transition, a scan per draw).
"""

from __future__ import annotations

import logging
import time
import warnings
from abc import abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
from pymc.model import modelcontext
from pymc.step_methods.compound import BlockedStep, Competence, StepMethodState
from pymc.step_methods.state import dataclass_state
from pymc.util import get_random_generator
from pymc.vartypes import continuous_types, discrete_types

from pymc_minibatch_mh.core.barker import TestOutcome
from pymc_minibatch_mh.core.buffered import BufferedGenerator
from pymc_minibatch_mh.estimators.ratio import PrefetchPolicy, RatioEstimator
from pymc_minibatch_mh.estimators.registry import make_estimator
from pymc_minibatch_mh.estimators.taylor import TaylorEstimator
from pymc_minibatch_mh.model.checks import (
    check_batch_size,
    check_same_model,
    check_temperature,
)
from pymc_minibatch_mh.model.compat import ChainSetupMixin, call_cost_rows
from pymc_minibatch_mh.model.graph import frozen_heap
from pymc_minibatch_mh.model.internals import PyMCStepHooks, raise_wrapped_interrupt
from pymc_minibatch_mh.model.likelihood import MinibatchLikelihood
from pymc_minibatch_mh.progress import note, setup_progress
from pymc_minibatch_mh.transition.inner_steps import merge_stats
from pymc_minibatch_mh.transition.rows_watch import RowsWatch, grinding_message
from pymc_minibatch_mh.transition.settings import StepSettings

__all__ = ["MinibatchStepBase", "MinibatchStepBaseState"]

_log = logging.getLogger("pymc_minibatch_mh")


@dataclass_state
class MinibatchStepBaseState(StepMethodState):
    """Resumable state of every step method: generator, tuning flag, temperature.

    The row store's permutation is not part of it (it is O(N)); a resumed chain draws
    its rows afresh, which changes no distribution.
    """

    tune: bool
    temperature: float


def _all_stats(step_stats: dict[str, Any]) -> dict[str, Any]:
    return step_stats


class MinibatchStepBase(ChainSetupMixin, PyMCStepHooks, BlockedStep):
    """Base class of every minibatch step method (not used directly).

    A draw (:meth:`step`) is a sequence of transitions, each deciding one move with an
    acceptance test on the Δ* estimator; a subclass supplies them (``_transitions``), the
    test (``_decide``) and the test's own stats (``test_stats``, ``_test_stat_values``).

    Parameters
    ----------
    vars : list of Variable, optional
        Variables to sample, as one block. Default: the subclass's (``_sampled_vars``).
    settings : StepSettings
        What every step method takes (:class:`~pymc_minibatch_mh.transition.settings.StepSettings`:
        ``batch_size``, ``temperature``, ``model``, ``rng``, ``initial_point``, ``mode``,
        ``check_start``, ``prefetch``, ``blocked``, ``data``, ``shuffled_copy``; the
        public step methods document each).

    """

    name: ClassVar[str] = "minibatch"
    default_blocked = True
    state_class = MinibatchStepBaseState

    #: Whether the step samples discrete variables (else continuous ones).
    samples_discrete: ClassVar[bool] = False
    #: Whether the test grows minibatches of ``batch_size`` rows (False: full passes only;
    #: a class attribute, or an instance one where a setting decides).
    uses_minibatches: bool = True
    #: What a rejected move is called in the warning for a non-finite ratio.
    move_name: ClassVar[str] = "proposal"

    #: Stats every minibatch step reports; dtypes match PyMC's samplers where names clash.
    common_stats: ClassVar[dict[str, tuple[Any, list[int]]]] = {
        "accept": (np.float64, []),
        "batch_size": (np.int64, []),
        "growth_rounds": (np.int64, []),
        "nonfinite": (bool, []),
        "extra_evaluations": (np.int64, []),
        "temperature": (np.float64, []),
        "tune": (bool, []),
        "mean_batch_size": (np.float64, []),
        "grinding": (bool, []),
    }
    #: Stats specific to the test, declared by subclasses.
    test_stats: ClassVar[dict[str, tuple[Any, list[int]]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.stats_dtypes_shapes = {**cls.common_stats, **cls.test_stats}

    def __init__(self, vars: Sequence[Any] | None = None, *, settings: StepSettings) -> None:
        batch_size, temperature = settings.batch_size, settings.temperature
        step_name = type(self).__name__
        with setup_progress(step_name), frozen_heap():
            started = time.perf_counter()
            model = modelcontext(settings.model)
            self._validate_settings(batch_size=batch_size, temperature=temperature)
            self.batch_size = int(batch_size)
            point = (dict(settings.initial_point) if settings.initial_point is not None
                     else model.initial_point())
            vars = self._sampled_vars(model, vars, point)
            note("compiling the per-row likelihood")
            self.likelihood = MinibatchLikelihood(
                model, vars, initial_point=point, mode=settings.mode, step_name=step_name,
                allow_discrete=self.samples_discrete, data=settings.data,
                shuffled_copy=settings.shuffled_copy,
            )
            self.vars = self.likelihood.value_vars
            self.model = model
            self.tune = True  # PyMC's tuning phase (its end: stop_tuning)
            self._tune_enabled = True
            self.temperature = float(temperature)
            self.check_start = bool(settings.check_start)
            self.rng = get_random_generator(settings.rng)
            self.policy = PrefetchPolicy(settings.prefetch, call_cost_rows(self.likelihood.mode))
            #: The Δ* estimator (plain ratios, or Taylor residuals with ``control_variate``).
            note("the Δ* estimator")
            self.estimator: RatioEstimator = self._make_estimator()
            #: The estimator when it has control variates, else None.
            self.control_variate: TaylorEstimator | None = (
                self.estimator if isinstance(self.estimator, TaylorEstimator) else None
            )
            self._setup_transitions()
            self._declare_stats()
            #: Wall-clock seconds the step took to build (checks, compilation, and with
            #: control variates the MAP search and full-data passes).
            self.setup_seconds = time.perf_counter() - started
            #: Full passes over the data made while building (with control variates: the MAP
            #: search and the pass at θ̂; the validation of the split uses a few rows only),
            #: plus those of each set-up repeated on changed data (:meth:`follow_data`),
            #: each in passes over the data it was made on.
            self.setup_passes = (
                getattr(self.estimator, "setup_evaluations", 0) / self.likelihood.n_rows_initial
            )
            self._tuning = True
            self._started = False
            self._n_rows = self.likelihood.n_rows_initial
            self._warned_nonfinite = False
            self._chain_started = False

    def _sampled_vars(
        self, model: Any, vars: Sequence[Any] | None, point: Mapping[str, Any]
    ) -> Sequence[Any]:
        """The variables to sample (a subclass chooses its default and checks them early)."""
        return model.value_vars if vars is None else vars

    def _make_estimator(self) -> RatioEstimator:
        """The Δ* estimator (a hook; default: the plain ratios)."""
        return make_estimator(None, self.likelihood, self.policy)

    def _setup_transitions(self) -> None:
        """Build what the subclass's transitions need besides the estimator (a hook)."""

    def _declare_stats(self, unused: Iterable[str] = ()) -> None:
        """Declare only the stats this step reports (each costs time on every draw).

        ``unused`` and the subclass's :meth:`_unused_stats` are left out.
        """
        unused = {*unused, *self._unused_stats()}
        shapes = {k: v for k, v in type(self).stats_dtypes_shapes.items() if k not in unused}
        self.stats_dtypes_shapes = shapes
        self.stats_dtypes = [{name: dtype for name, (dtype, _) in shapes.items()}]

    def _unused_stats(self) -> Sequence[str]:
        """Test-specific stats (``test_stats``) this step's settings leave constant."""
        return ()

    # ----------------------------------------------------------------- settings
    def _validate_settings(self, *, batch_size: Any, temperature: Any) -> None:
        check_batch_size(batch_size)
        check_temperature(temperature)

    @property
    def temperature(self) -> float:
        """K: the likelihood is raised to ``1/K``."""
        return self._temperature

    @temperature.setter
    def temperature(self, value: float) -> None:
        check_temperature(value)
        self._temperature = float(value)
        self._inv_temperature = np.array(1.0 / self._temperature)

    # ------------------------------------------------------------- chain hooks
    def follow_data(self) -> bool:
        """Read the data as they are now; repeat the set-up that belongs to older data.

        Called at every chain start. The row store reads the current data (after
        ``pm.set_data``, or a changed ``data=`` store, at any N); if the estimator's set-up
        (with control variates: the MAP search and the full-data sums at θ̂) was made on
        other data, it is made again, and what was built on it (``_data_followed``:
        the surrogate posterior and the proposal). That is logged (logger
        ``pymc_minibatch_mh``, level INFO) and added to :attr:`setup_passes` and
        :attr:`setup_seconds`. It runs once per change of the data: the chains that follow
        share it, and :meth:`progress_bar_columns` calls it when ``pm.sample`` starts, in
        its own process, before it sends the step to worker processes (``cores > 1``).
        The set-up is deterministic, so a chain's draws do not depend on where it ran.

        Returns
        -------
        bool
            Whether the set-up was repeated.

        """
        self._n_rows = self.likelihood.n_rows()  # the data as they are now (pm.set_data)
        started = time.perf_counter()
        step_name = type(self).__name__
        with setup_progress(step_name), frozen_heap():
            if not self.estimator.follow_data():
                return False
            note("rebuilding what depends on the set-up")
            self._data_followed()
        seconds = time.perf_counter() - started
        passes = self.estimator.setup_evaluations / self._n_rows
        self.setup_passes += passes
        self.setup_seconds += seconds
        _log.info(
            "%s: the data changed since the control variates' set-up (now N = %d): set-up "
            "repeated on the new data (%.1f passes over the data, %.1f s).",
            step_name, self._n_rows, passes, seconds,
        )
        return True

    def _data_followed(self) -> None:
        """Rebuild what was built on the estimator's set-up after it was repeated (a hook)."""

    def _start_chain(self, rng: Any) -> None:
        self.follow_data()  # first: what the chain starts with may be built again
        self._start_chain_on_data(rng)

    def _start_chain_on_data(self, rng: Any) -> None:
        """A chain's start once the data are followed (subclasses extend this part)."""
        # Every draw of the chain comes from this generator's state, single values in
        # blocks (see BufferedGenerator: a step's few scalar draws cost ~0.8 µs each).
        self.rng = rng = BufferedGenerator(rng)
        if self.uses_minibatches and self.batch_size > self._n_rows:
            raise ValueError(
                f"batch_size={self.batch_size} is larger than the number of observations "
                f"N={self._n_rows}. Use a batch_size between 1 and N."
            )
        self.estimator.start_chain(rng, self.batch_size)
        self._started = True
        self._tuning = True
        self._chain_started = False
        self._warned_nonfinite = False
        self._chain_steps = 0
        self._chain_batch_total = 0
        self._rows_watch = RowsWatch()

    def stop_tuning(self) -> None:
        """End of PyMC's tuning phase (recorded in the ``tune`` stat)."""
        self.tune = False
        self._tuning = False

    def _begin_chain(self, point: Mapping[str, Any]) -> Mapping[str, Any]:
        """The chain's first step: checks of the point (and a start outside pm.sample)."""
        if not self._started:
            self._start_chain(self.rng)  # used outside pm.sample (no chain hook was called)
        check_same_model(self, point)
        point = self._start_point(point)
        if self.check_start:
            at_setup = self._read_at_setup(point)
            prior = self.control_variate.initial_reference.log_prior if at_setup else None
            self.likelihood.check_point(point, rows=not at_setup, prior=prior)
        self._chain_started = True
        return point

    def _read_at_setup(self, point: Mapping[str, Any]) -> bool:
        """Whether the set-up's pass at θ̂ read every row at this start point.

        True at the control variates' reference of the last set-up (a tuned chain starts
        there, see :meth:`~pymc_minibatch_mh.proposals.base.Proposal.start_point`), on the
        data it was made on (followed at this chain's start) and with no variables of
        other steps in the likelihood: the start check then needs no pass of its own.
        """
        cv, lik = self.control_variate, self.likelihood
        if cv is None or lik.other_shared:
            return False
        return lik.point_map.to_flat(point).tobytes() == cv.initial_reference.theta.tobytes()

    def _start_point(self, point: Mapping[str, Any]) -> Mapping[str, Any]:
        """The point the chain starts from, given PyMC's (a hook; default: PyMC's)."""
        return point

    # --------------------------------------------------------------------- step
    def step(self, point: Mapping[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """One draw: the subclass's transitions, their stats merged.

        A Ctrl-C that a jitted function reports as a ``SystemError`` is raised as the
        ``KeyboardInterrupt`` it is, so that PyMC keeps the draws made so far
        (:func:`~pymc_minibatch_mh.model.internals.raise_wrapped_interrupt`).
        """
        try:
            if not self._chain_started:
                point = self._begin_chain(point)
            point, transitions = self._transitions(point)
        except SystemError as err:
            raise_wrapped_interrupt(err)
            raise
        return point, [self._draw_stats(transitions)]

    @abstractmethod
    def _transitions(
        self, point: Mapping[str, Any]
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """A draw's transitions from ``point``: the new point and each transition's stats."""

    def _draw_stats(self, transitions: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """A draw's stats from its transitions'.

        :func:`~pymc_minibatch_mh.transition.inner_steps.merge_stats` merges them.
        """
        return merge_stats(transitions)

    @abstractmethod
    def _decide(self, estimator: RatioEstimator, data_free: float) -> TestOutcome:
        """Run the acceptance test on the opened estimator."""

    def _test_stat_values(self, outcome: Any) -> dict[str, Any]:
        """The test-specific stats of one outcome (see ``test_stats``)."""
        return {}

    def _outcome_stats(self, outcome: TestOutcome, extra: int = 0) -> dict[str, Any]:
        """The stats of one transition's test: the common ones and the test's own.

        ``accept`` is g(Δ*) for the Barker tests, the decision itself for the others;
        ``extra`` counts rows evaluated besides the test's (a re-centring, an audit). The
        first non-finite ratio of a chain is reported with a warning.
        """
        if outcome.nonfinite and not self._warned_nonfinite:
            self._warned_nonfinite = True
            warnings.warn(
                f"{type(self).__name__}: a NaN or infinite log-likelihood ratio was met in a "
                f"minibatch; the {self.move_name} was rejected. Steps with this fault are "
                "counted in the 'nonfinite' sample stat (this warning is shown once per "
                "chain).",
                RuntimeWarning,
                stacklevel=4,
            )
        accepted = outcome.accepted
        accept = getattr(outcome, "accept_prob", None)
        if accept is None:
            accept = 1.0 if accepted else 0.0
        return {
            "accepted": 1.0 if accepted else 0.0,
            "accept": accept,
            "batch_size": outcome.batch_size,
            "growth_rounds": outcome.rounds,
            "full_data": outcome.full_data,
            "nonfinite": outcome.nonfinite,
            "extra_evaluations": outcome.extra_evaluations + extra,
            **self._test_stat_values(outcome),
        }

    def _add_chain_stats(self, stats: dict[str, Any]) -> dict[str, Any]:
        """Count one step of ``stats["batch_size"]`` rows; add the chain's common stats."""
        steps = self._chain_steps = self._chain_steps + 1
        self._chain_batch_total += stats["batch_size"]
        stats["temperature"] = self._temperature
        stats["tune"] = self.tune
        stats["mean_batch_size"] = self._chain_batch_total / steps
        stats["grinding"] = self._watch_rows(stats["batch_size"])
        return stats

    def _watch_rows(self, rows: int) -> bool:
        """Whether the last transitions read over a share of N (:mod:`.rows_watch`).

        The first time in a chain, a warning says what was measured and what to try.
        """
        watch = self._rows_watch
        if not self.uses_minibatches or not watch.update(rows, self._n_rows):
            return False
        if not watch.warned:
            watch.warned = True
            warnings.warn(
                grinding_message(type(self).__name__, watch.mean, self._n_rows, watch.window,
                                 self.tune, self.control_variate is not None),
                RuntimeWarning, stacklevel=5,
            )
        return True

    # --------------------------------------------------------- progress bar
    def progress_bar_columns(self, n_chains: int) -> tuple[list[Any], dict[str, list[Any]]]:
        """No columns of its own (PyMC's default); a subclass adds some."""
        return [], {}

    def progress_bar_updates(self) -> tuple[Any, ...]:
        """PyMC's default: the stats are passed on as they are."""
        return (_all_stats,)

    @classmethod
    def competence(cls, var: Any, has_grad: bool) -> Competence:
        """Never chosen automatically: a minibatch test is an explicit choice."""
        types = discrete_types if cls.samples_discrete else continuous_types
        if var.dtype in types:
            return Competence.COMPATIBLE
        return Competence.INCOMPATIBLE


