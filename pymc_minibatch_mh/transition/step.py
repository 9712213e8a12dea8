r"""The shared PyMC step methods of all minibatch acceptance tests.

:class:`~pymc_minibatch_mh.transition.step.MinibatchStepBase` is the base of every step method of
the package. It holds what they all share: the constructor's wiring (the compiled likelihood, the
prefetch policy, the Δ\* estimator, the generator and the checks of the settings), the temperature,
the chain's start and its checks, the warning for a non-finite ratio, the rule of the ``accept``
stat, the common stats and their declaration, the draw as a sequence of transitions whose stats
:func:`~pymc_minibatch_mh.transition.inner_steps.merge_stats` merges, and PyMC's hooks. A subclass
supplies the transitions of a draw (``_transitions``), the acceptance test (``_decide``) and its own
stats.

:class:`MinibatchStep` adds what the Metropolis-Hastings steps share: the proposal, the
scale tuner, the surrogate start point, the audit and the temperature schedule. It runs
one transition (``MinibatchStep._transition``; a draw is ``steps_per_draw`` of them), a
composition of four parts:

1. map the point to the flat state θ (:class:`~pymc_minibatch_mh.model.pointmap.PointMap`);
2. **propose** ``(state′, info)`` from the proposal's state at θ
   (:mod:`~pymc_minibatch_mh.proposals`; ``info`` holds the log-q ratio);
3. **open the Δ\* estimator** for (θ, θ′) and get its data-free part
   (:mod:`~pymc_minibatch_mh.estimators.ratio`; its rows come from the **row store**,
   :mod:`~pymc_minibatch_mh.store.row_store`);
4. run the **acceptance test** on the estimator (a core test; the subclass's ``_decide``),
   update the **tuner**, and return the outcome's stats plus the common ones.

A subclass of :class:`MinibatchStep` supplies ``_decide(estimator, data_free)`` and the
declaration and extraction of its own stats;
:class:`~pymc_minibatch_mh.step_methods.gibbs.MinibatchGibbs` is the other subclass of
:class:`~pymc_minibatch_mh.transition.step.MinibatchStepBase` (a coordinate update per transition, a
scan per draw).
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from abc import abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
from numpy.typing import ArrayLike
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
from pymc_minibatch_mh.proposals.base import Proposal, ProposalState
from pymc_minibatch_mh.proposals.registry import PROPOSAL_CODES, make_proposal
from pymc_minibatch_mh.proposals.surrogate import (
    Centring,
    GaussianSurrogate,
    SurrogatePosterior,
)
from pymc_minibatch_mh.proposals.tuning import ScalingTuner
from pymc_minibatch_mh.transition.audit import AUDIT_STATS, Audit, check_audit_every
from pymc_minibatch_mh.transition.inner_steps import merge_stats, resolve_steps_per_draw
from pymc_minibatch_mh.transition.mixing_watch import MixingWatch, mixing_message
from pymc_minibatch_mh.transition.progress_bar import (
    progressbar_config,
    progressbar_update_functions,
)
from pymc_minibatch_mh.transition.rows_watch import RowsWatch, grinding_message
from pymc_minibatch_mh.transition.schedule import TemperatureSchedule

__all__ = ["MinibatchStep", "MinibatchStepBase", "MinibatchStepBaseState", "MinibatchStepState"]

_log = logging.getLogger("pymc_minibatch_mh")


@dataclass_state
class MinibatchStepBaseState(StepMethodState):
    """Resumable state of every step method: generator, tuning flag, temperature.

    The row store's permutation is not part of it (it is O(N)); a resumed chain draws
    its rows afresh, which changes no distribution.
    """

    tune: bool
    temperature: float


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
    batch_size : int
        Rows drawn per round (the first minibatch has this size too).
    temperature : float
        K > 0: the likelihood is raised to 1/K; the prior is not.
    model : pymc.Model, optional
        Default: the model in context.
    rng : RandomGenerator, optional
        Seed or generator; ``pm.sample`` replaces it per chain with one spawned from
        ``random_seed``.
    initial_point : dict, optional
        Point used for shapes and checks (default ``model.initial_point()``).
    mode : str, optional
        PyTensor compilation mode of the per-step functions.
    check_start : bool
        Check the log-probability at each chain's start point and raise a clear error if
        it is not finite: one O(N) pass per chain, except at the control variates'
        reference θ̂, where tuned chains start and the set-up's pass already read every
        row (a set-up that meets a non-finite row names it).
    prefetch : int or "auto"
        Rounds of rows evaluated per compiled call (see
        :mod:`~pymc_minibatch_mh.estimators.ratio`); changes the cost and which random rows
        are drawn, not their law.
    blocked : bool
        Ignored (the variables are always one block); PyMC passes it.
    data : dict, optional
        Per-row data larger than memory, ``{name: array}`` with names of the model's
        ``pm.Data`` (or observed) variables and arrays that are ``.npy`` paths or memmaps,
        Zarr arrays, :class:`~pymc_minibatch_mh.store.sources.ParquetColumn` or Dask
        arrays. The model is built on a small in-memory slice of the rows (for shapes and
        dtypes); every per-row array must be given. See the guide's "Data bigger than
        memory" page.
    shuffled_copy : bool
        With ``data=``: read a step's rows in blocks of a shuffled local copy, written at
        set-up (:mod:`~pymc_minibatch_mh.store.shuffled`; pays off on long runs).

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

    def __init__(
        self,
        vars: Sequence[Any] | None = None,
        *,
        batch_size: int = 100,
        temperature: float = 1.0,
        model: Any = None,
        rng: Any = None,
        initial_point: Mapping[str, Any] | None = None,
        mode: Any = None,
        check_start: bool = True,
        prefetch: int | str = "auto",
        blocked: bool = True,
        data: Mapping[str, Any] | None = None,
        shuffled_copy: bool = False,
    ) -> None:
        step_name = type(self).__name__
        with setup_progress(step_name), frozen_heap():
            started = time.perf_counter()
            model = modelcontext(model)
            self._validate_settings(batch_size=batch_size, temperature=temperature)
            self.batch_size = int(batch_size)
            point = dict(initial_point) if initial_point is not None else model.initial_point()
            vars = self._sampled_vars(model, vars, point)
            note("compiling the per-row likelihood")
            self.likelihood = MinibatchLikelihood(
                model, vars, initial_point=point, mode=mode, step_name=step_name,
                allow_discrete=self.samples_discrete, data=data, shuffled_copy=shuffled_copy,
            )
            self.vars = self.likelihood.value_vars
            self.model = model
            self.tune = True  # PyMC's tuning phase (its end: stop_tuning)
            self._tune_enabled = True
            self.temperature = float(temperature)
            self.check_start = bool(check_start)
            self.rng = get_random_generator(rng)
            self.policy = PrefetchPolicy(prefetch, call_cost_rows(self.likelihood.mode))
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
        """A draw's stats from its transitions' (:func:`merge_stats`)."""
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


class MinibatchStep(MinibatchStepBase):
    """Base class of the minibatch Metropolis-Hastings step methods (not used directly).

    Adds to :class:`~pymc_minibatch_mh.transition.step.MinibatchStepBase` the proposal, its scale
    tuner, the surrogate start point, the audit and the temperature schedule; a draw is
    ``steps_per_draw`` transitions (``_transition``).

    Parameters
    ----------
    vars : list of Variable, optional
        Continuous variables to sample, as one block. Default: all free variables.
    temperature : float or TemperatureSchedule
        K > 0: the likelihood is raised to 1/K; the prior is not. A
        :class:`~pymc_minibatch_mh.transition.schedule.TemperatureSchedule` changes K (and
        multiplies the proposal scale) at given iterations of each chain.
    S : array_like or "laplace", optional
        Proposal standard deviations (vector) or covariance (matrix) on the flattened,
        transformed space, as in ``pm.Metropolis``. Default: ones. ``"laplace"`` (with
        ``control_variate``): the Laplace covariance at θ̂ at the initial temperature;
        use it with ``scaling`` about ``2.38/√d``.
    scaling : float
        Multiplies the proposal; tuned during PyMC's tuning phase when ``tune=True``.
    tune : bool
        Tune ``scaling`` towards ``target_accept`` during tuning (see
        :class:`~pymc_minibatch_mh.proposals.tuning.ScalingTuner`).
    target_accept : float
        Target acceptance probability for tuning (default: 0.4 with a surrogate
        proposal, else 0.25; times ``target_accept_factor``, which the penalty test of
        :class:`~pymc_minibatch_mh.MinibatchBarker` sets to ``h_σ(0)/(1/2)``).
    control_variate : {None, "auto", "taylor", "taylor_theta", "taylor_predictor"}
        ``"taylor"``: estimate Δ with second-order Taylor control variates around a
        reference point θ̂ (the closed-form full-data sum of the expansions plus a
        minibatch estimate of the residuals), in the per-row quantities where the rows see
        θ through a non-linear function of it (hierarchical models), else in θ; see
        :class:`~pymc_minibatch_mh.estimators.taylor.TaylorEstimator` and the
        guide's "Control variates" page. ``"taylor_theta"`` and ``"taylor_predictor"``
        force one of the two expansions. ``"auto"``: ``"taylor"`` where control variates
        apply, else None with a warning at temperature 1 (see
        :func:`~pymc_minibatch_mh.estimators.registry.make_estimator`). None: the plain
        estimate (the papers' tests). Default None here; ``MinibatchBarker``'s is
        ``"auto"``. Only where ``supports_control_variate`` (not ``ExactMH``).
    reference : dict, optional
        θ̂ as a point dict (e.g. from ``pm.find_MAP()``); default: the MAP, found when the
        step is built. Only with ``control_variate``.
    recenter : float, optional
        Re-centre θ̂ at the current state during tuning when the chain is farther than
        this from θ̂ (Laplace metric, per dimension; about 1 for a posterior draw). Only
        with ``control_variate``; default: never.
    proposal : str, object or callable, optional
        ``"auto"`` (default: with ``control_variate``, ``"crank_nicolson"`` around the
        control variates' Laplace fit for GLMs and ``"surrogate_nuts"`` for hierarchical
        models; else ``"random_walk"``), ``"random_walk"``, ``"crank_nicolson"``,
        ``"mala"``, ``"hmc"``, ``"surrogate_transition"``, ``"surrogate_nuts"``,
        ``"blackjax_nuts"`` (NUTS on the surrogate compiled with JAX; the ``jax`` extra), a
        proposal object or a callable ``step -> proposal``; see
        :mod:`~pymc_minibatch_mh.proposals.registry`. With a surrogate proposal and
        tuning, each chain starts at θ̂, where the set-up's pass read every row.
    audit_every : int, optional
        Every this many steps, also decide the proposal on the full data, coupled to the
        minibatch decision (:mod:`~pymc_minibatch_mh.transition.audit`; the pass is counted
        in ``extra_evaluations``; the chain's draws are the same). Default: never.
    steps_per_draw : int or "auto"
        Transitions per draw (:mod:`~pymc_minibatch_mh.transition.inner_steps`, which says how
        a draw's stats combine them). ``"auto"``: 9 with NUTS on the surrogate, 3 with
        another surrogate proposal, else 1.
    **kwargs
        ``batch_size``, ``model``, ``rng``, ``initial_point``, ``mode``, ``check_start``,
        ``prefetch``, ``data``, ``shuffled_copy``: as for every step method
        (:class:`~pymc_minibatch_mh.transition.step.MinibatchStepBase`).

    """

    name: ClassVar[str] = "minibatch"
    state_class = MinibatchStepState
    #: Whether ``control_variate=`` applies to this step method.
    supports_control_variate: ClassVar[bool] = True
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
        self,
        vars: Sequence[Any] | None = None,
        *,
        temperature: float | TemperatureSchedule = 1.0,
        S: ArrayLike | None = None,
        scaling: float = 1.0,
        tune: bool = True,
        target_accept: float | None = None,
        control_variate: str | None = None,
        reference: Mapping[str, Any] | None = None,
        recenter: float | None = None,
        proposal: Any = None,
        audit_every: int | None = None,
        steps_per_draw: int | str = "auto",
        **kwargs: Any,
    ) -> None:
        self.schedule = temperature if isinstance(temperature, TemperatureSchedule) else None
        if self.schedule is not None:
            temperature = self.schedule(0)[0]
        # Read by the hooks that the base's set-up calls (_validate_settings,
        # _make_estimator, _setup_transitions).
        self._transition_settings = dict(
            S=S, scaling=scaling, tune=tune, target_accept=target_accept,
            control_variate=control_variate, reference=reference, recenter=recenter,
            proposal=proposal, audit_every=audit_every, steps_per_draw=steps_per_draw,
        )
        super().__init__(vars, temperature=temperature, **kwargs)
        # What follow_data needs to build the proposal again on a new set-up.
        self._proposal_settings = {k: self._transition_settings[k] for k in ("proposal", "S")}
        del self._transition_settings

    def _validate_settings(self, *, batch_size: Any, temperature: Any) -> None:
        super()._validate_settings(batch_size=batch_size, temperature=temperature)
        self.audit = Audit(check_audit_every(
            self._transition_settings["audit_every"], type(self).__name__,
            self.uses_minibatches,
        ))

    def _make_estimator(self) -> RatioEstimator:
        """The plain ratios, or Taylor residuals with ``control_variate``."""
        settings = self._transition_settings
        return make_estimator(
            settings["control_variate"], self.likelihood, self.policy,
            reference=settings["reference"], recenter=settings["recenter"],
            step_name=type(self).__name__, supported=self.supports_control_variate,
            tempered_schedule=self.schedule is not None, temperature=self.temperature,
        )

    def _setup_transitions(self) -> None:
        """The tuning flag, the proposal, its scale tuner and the transitions per draw."""
        settings = self._transition_settings
        self.tune = self._tune_enabled = bool(settings["tune"])
        scaling = float(settings["scaling"])
        self.scaling = scaling
        self._posterior: SurrogatePosterior | None = None
        self.proposal: Proposal = self._make_proposal(settings["proposal"], settings["S"])
        surrogate = self.proposal.surrogate is not None
        if surrogate and self.schedule is not None:
            raise ValueError(
                f"proposal={self.proposal.name!r} follows the Laplace fit at one temperature; "
                "a TemperatureSchedule changes it. Use proposal='random_walk' with a schedule."
            )
        self._proposal_chosen(self.proposal)
        self.steps_per_draw = resolve_steps_per_draw(settings["steps_per_draw"], self.proposal)
        #: Whether ``target_accept`` is the default (:meth:`default_target_accept`).
        self.default_target = settings["target_accept"] is None
        target_accept = (self.default_target_accept() if self.default_target
                         else settings["target_accept"])
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
        setting, S = self._proposal_settings["proposal"], self._proposal_settings["S"]
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
        """The step's attributes, after :meth:`follow_data`.

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
        (:meth:`~MinibatchStepBase.follow_data`), so a set-up repeated on new data is made
        once and shared by every chain.
        """
        self.follow_data()
        return progressbar_config(n_chains, self._tuned_stat())

    def progress_bar_updates(self) -> tuple[Any, ...]:
        """The function that maps a draw's stats to the progress bar's fields."""
        return progressbar_update_functions(self._tuned_stat())

