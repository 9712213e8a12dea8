"""Every reach into PyTensor's and PyMC's private attributes, in one module.

A compiled PyTensor function costs about 4–10 µs per call around its jitted graph
(``Function.__call__`` and the linker's thunk), several times the work on a small
minibatch. With the Numba backend (PyTensor 2.x and 3.x alike) the jitted graph is
``fn.vm.jit_fn``, the storage cells of the function's shared variables are the trailing
entries of ``fn.vm.inputs`` (after the explicit inputs), and ``fn.maker.inputs`` tells
which inputs are shared. :func:`direct_call` uses exactly these three facts, and nothing
else in the package touches PyTensor's private attributes. A Ctrl-C while such a call
runs comes back as a ``SystemError``; :func:`raise_wrapped_interrupt` turns it back into
the ``KeyboardInterrupt`` PyMC expects.

The PyMC section below holds the rest: the private hooks PyMC's sampler reads on a step
method, the NUTS step's density, mass matrix, momentum, tree settings and trajectory
hooks, the experimental dense mass-matrix adaptation and its window, a step's ``tune``
flag, the op classes of ``pm.Minibatch`` and ``total_size``, and which parameter checks
PyMC itself turns into ``-inf``.

Compiling functions (and keeping Numba out of object mode) is
:mod:`~pymc_minibatch_mh.model.compilation`'s, with the package's digamma and trigamma in
:mod:`~pymc_minibatch_mh.model.special_functions`.

``tests/test_pytensor_internals.py`` checks each fact on the installed PyTensor and PyMC
(outputs of the direct call equal the wrapper's, shared values are read at call time, the
explicit inputs come first, functions with updates are refused; PyMC reads the hooks, the
window doubles and survives ``reset()``, ...), so an upgrade that changes their meaning
fails loudly there instead of giving silently wrong numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from pymc.data import MinibatchIndexRV, MinibatchOp
from pymc.logprob.utils import CheckParameterValue
from pymc.variational.minibatch_rv import MinibatchRandomVariable

__all__ = [
    "MINIBATCH_OPS",
    "DirectCall",
    "GivenNutsDensity",
    "PyMCStepHooks",
    "adaptation_window",
    "diag_adapt_potential",
    "direct_call",
    "explicit_inputs_first",
    "fast_momentum",
    "full_adapt_potential",
    "hamiltonian_step_data",
    "is_ninf_check",
    "jitted_parts",
    "nuts_iteration",
    "nuts_mass",
    "nuts_tree_settings",
    "raise_wrapped_interrupt",
    "raveled_point_info",
    "set_adaptation_window",
    "set_step_tuning",
    "tuned_nuts_end",
    "tuned_nuts_start",
]


def explicit_inputs_first(fn: Any) -> bool:
    """Whether the explicit (non-shared) inputs of ``fn`` come before all shared ones."""
    explicit = [not getattr(i, "shared", False) for i in fn.maker.inputs]
    return not any(explicit[sum(explicit):])


def jitted_parts(fn: Any) -> tuple[Any, tuple[Any, ...], bool] | None:
    """``(jit_fn, shared_cells, single_output)`` of a Numba-compiled function, or None.

    None for any function this module cannot call directly: another backend, updates of
    shared variables, named outputs, no outputs, or shared inputs before explicit ones.
    """
    vm = getattr(fn, "vm", None)
    maker = getattr(fn, "maker", None)
    if (
        getattr(vm, "jit_fn", None) is None
        or getattr(vm, "inputs", None) is None
        or maker is None
        or maker.fgraph.update_mapping
        or getattr(fn, "return_none", False)
        or getattr(fn, "output_keys", None) is not None
        or not explicit_inputs_first(fn)
    ):
        return None
    n_explicit = sum(not getattr(i, "shared", False) for i in maker.inputs)
    return vm.jit_fn, tuple(vm.inputs[n_explicit:]), bool(getattr(fn, "unpack_single", False))


def raise_wrapped_interrupt(err: SystemError) -> None:
    """Raise the Ctrl-C that a jitted function's ``SystemError`` wraps (else return).

    A Ctrl-C while a jitted graph runs sets Python's ``KeyboardInterrupt``; the Numba
    dispatcher then returns its result with that exception set, which CPython reports as
    ``SystemError: CPUDispatcher(...) returned a result with an exception set``, chained
    from the ``KeyboardInterrupt``. PyMC keeps the draws made so far only on a
    ``KeyboardInterrupt``, so this raises one in its place. Every direct call of a jitted
    graph (:class:`DirectCall`) goes through here.

    Parameters
    ----------
    err : SystemError
        The error raised by the call.

    Raises
    ------
    KeyboardInterrupt
        When ``err`` was caused by one.
    """
    if isinstance(err.__cause__ or err.__context__, KeyboardInterrupt):
        raise KeyboardInterrupt from err


class DirectCall:
    """Calls the jitted graph of a Numba-compiled PyTensor function directly.

    See :func:`direct_call`. Pickles as the PyTensor function alone (a jitted graph does
    not survive pickling; it is looked up again after unpickling, e.g. in a spawned
    process of ``pm.sample``).
    """

    __slots__ = ("_cells", "_jit", "_single", "fn")

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self._bind()

    def _bind(self) -> None:
        parts = jitted_parts(self.fn)
        if parts is None:  # pragma: no cover - direct_call checked it
            raise TypeError("DirectCall needs a Numba-compiled function (see direct_call)")
        self._jit, self._cells, self._single = parts

    @property
    def jit(self) -> Any:
        """The jitted graph (callable from other Numba functions).

        ``jit(*explicit inputs, *shared values)`` returns its outputs as a tuple.
        """
        return self._jit

    def shared_values(self) -> tuple[Any, ...]:
        """The current values of the shared variables, in the jitted graph's order."""
        return tuple(cell[0] for cell in self._cells)

    def __call__(self, *args: Any) -> Any:
        """Call the function with its explicit inputs (the shared values are read now)."""
        cells = self._cells
        try:
            if len(cells) == 1:  # the common case: no list built per call
                out = self._jit(*args, cells[0][0])
            else:
                out = self._jit(*args, *[c[0] for c in cells])
        except SystemError as err:
            raise_wrapped_interrupt(err)
            raise
        return out[0] if self._single else out

    def __getstate__(self) -> dict[str, Any]:
        return {"fn": self.fn}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.fn = state["fn"]
        self._bind()


def direct_call(fn: Any) -> Any:
    """A faster way to call a compiled PyTensor function of the Numba backend.

    Returns a :class:`DirectCall` that passes the explicit inputs and the current values
    of the shared variables' storage cells straight to the jitted graph (so ``set_value``
    on a shared variable is seen). The explicit inputs must already have the exact types
    (``trust_input``). Any other function is returned unchanged (see :func:`jitted_parts`).

    Parameters
    ----------
    fn : pytensor.compile.function.types.Function
        A compiled function.

    Returns
    -------
    callable
        Same arguments and outputs as ``fn`` (a tuple for several outputs).

    """
    return fn if jitted_parts(fn) is None else DirectCall(fn)


# --------------------------------------------------------------------------- PyMC
# The private names of PyMC that the package relies on. Each is checked on the installed
# PyMC by tests/test_pytensor_internals.py, so an upgrade that renames or changes one
# fails there, not in a user's run.


class PyMCStepHooks:
    """The private hooks PyMC's sampler reads on a step method, under their public names.

    A step method sets ``state_class`` (its resumable state, PyMC's ``_state_class``) and
    implements :meth:`progress_bar_columns` and :meth:`progress_bar_updates`; PyMC's
    progress bar calls them through ``_progressbar_config`` and
    ``_make_progressbar_update_functions``.
    """

    state_class: Any = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("state_class") is not None:
            cls._state_class = cls.state_class

    def progress_bar_columns(self, n_chains: int) -> tuple[list[Any], dict[str, list[Any]]]:
        """``(columns, initial values)`` the step adds to PyMC's progress bar."""
        raise NotImplementedError

    def progress_bar_updates(self) -> tuple[Any, ...]:
        """The functions ``stats -> fields`` of the step's progress-bar columns."""
        raise NotImplementedError

    def _progressbar_config(self, n_chains: int = 1) -> tuple[list[Any], dict[str, list[Any]]]:
        return self.progress_bar_columns(n_chains)

    def _make_progressbar_update_functions(self) -> tuple[Any, ...]:
        return self.progress_bar_updates()


def full_adapt_potential(dim: int, mean: Any, cov: Any, initial_weight: int) -> Any:
    """PyMC's dense, adapted NUTS mass matrix, started from ``cov`` with weight ``initial_weight``.

    ``QuadPotentialFullAdapt`` is marked experimental; its warning is silenced here, where
    the package tests it.
    """
    import warnings

    from pymc.step_methods.hmc.quadpotential import QuadPotentialFullAdapt

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "QuadPotentialFullAdapt", UserWarning)
        return QuadPotentialFullAdapt(dim, mean, cov, initial_weight=initial_weight)


def diag_adapt_potential(dim: int, mean: Any, var: Any, initial_weight: int) -> Any:
    """PyMC's adapted diagonal mass matrix, started from ``var`` (weight ``initial_weight``)."""
    from pymc.step_methods.hmc.quadpotential import QuadPotentialDiagAdapt

    return QuadPotentialDiagAdapt(dim, mean, var, initial_weight)


def adaptation_window(potential: Any) -> int | None:
    """The adaptation window of a ``QuadPotentialFullAdapt`` (it doubles while tuning), or None."""
    window = getattr(potential, "adaptation_window", None)
    return None if window is None else int(window)


def set_adaptation_window(potential: Any, window: int | None) -> None:
    """Set the adaptation window of a ``QuadPotentialFullAdapt`` (PyMC's reset keeps the last)."""
    if window is not None:
        potential.adaptation_window = int(window)


class GivenNutsDensity:
    """A density in place of the ``ValueGradFunction`` PyMC's NUTS would compile.

    Passed as ``logp_dlogp_func`` to ``pm.NUTS`` (PyMC's ``GradientSharedStep`` takes it,
    on PyMC 5 and 6): PyMC then compiles no density of its own, which for the
    surrogate's NUTS would be a second compilation of the same graph (7.7 s for a bambi
    model with 51 state intercepts, and a Numba compilation anew in every new process).
    It holds what PyMC reads from a ``ValueGradFunction`` there: the shared variables of
    the model's other variables (none), the function its leapfrog integrator calls on a
    raveled point (``density(q) -> (logp, grad)``), that the inputs are raveled, and the
    dtype. The integrator evaluates ``density`` and nothing else.
    """

    def __init__(self, density: Callable[[Any], tuple[Any, Any]]) -> None:
        self._extra_vars_shared: dict[str, Any] = {}
        self._pytensor_function = density
        self._raveled_inputs = True
        self.dtype = "float64"


def nuts_mass(potential: Any) -> tuple[Any, bool] | None:
    """PyMC's NUTS mass matrix as the velocity ``M⁻¹p`` uses it, or None.

    ``(covariance, True)`` for a dense potential (``velocity = cov @ p``), ``(var[None],
    False)`` for a diagonal one (``velocity = var * p``); None for any other potential.
    The arrays are the potential's own (adapted in place or replaced while tuning: read
    them at every trajectory).
    """
    from pymc.step_methods.hmc.quadpotential import QuadPotentialDiagAdapt, QuadPotentialFull

    if isinstance(potential, QuadPotentialFull):
        return np.ascontiguousarray(potential._cov, dtype=np.float64), True
    if isinstance(potential, QuadPotentialDiagAdapt):
        return np.ascontiguousarray(potential._var[None, :], dtype=np.float64), False
    return None


class _TriangularMomentum:
    """``QuadPotentialFull.random`` with LAPACK's ``trtrs`` called directly.

    The same normal draws from the potential's generator and the same triangular solve
    ``Lᵀ p = ξ`` (``L`` the lower Cholesky factor of the mass matrix) as PyMC's, without
    SciPy's ``solve_triangular`` wrapper and its finiteness check: 12.5 → 2.7 µs a draw
    at d = 25. A class, not a closure, so that the potential still pickles.
    """

    __slots__ = ("potential",)

    def __init__(self, potential: Any) -> None:
        self.potential = potential

    def __call__(self) -> Any:
        import scipy.linalg.lapack

        potential = self.potential
        vals = potential.rng.normal(size=potential._n).astype(potential.dtype)
        solved, info = scipy.linalg.lapack.dtrtrs(potential._chol, vals, lower=1, trans=1,
                                                  overwrite_b=1)
        if info != 0:  # pragma: no cover - a Cholesky factor has a non-zero diagonal
            raise np.linalg.LinAlgError(f"trtrs failed (info={info})")
        return solved


def fast_momentum(potential: Any) -> None:
    """Draw a dense PyMC potential's momenta through LAPACK directly (same draws).

    Replaces ``potential.random`` of a ``QuadPotentialFull`` (and its adapting subclass)
    by a callable that makes PyMC's draw with LAPACK's ``trtrs`` (about 10 µs less per
    draw); any other potential is left as it is.
    """
    from pymc.step_methods.hmc.quadpotential import QuadPotentialFull

    if isinstance(potential, QuadPotentialFull) and np.dtype(potential.dtype) == np.float64:
        potential.random = _TriangularMomentum(potential)


def nuts_tree_settings(nuts: Any) -> tuple[int, float, Any]:
    """The largest tree depth this NUTS iteration may reach, ``Emax`` and its generator.

    PyMC's NUTS limits the depth to ``early_max_treedepth`` for the first 200 tuning
    iterations of a chain, to ``max_treedepth`` after.
    """
    early = nuts.tune and nuts.iter_count < 200
    depth = nuts.early_max_treedepth if early else nuts.max_treedepth
    return int(depth), float(nuts.Emax), nuts.rng


def tuned_nuts_start(nuts: Any) -> tuple[Any, Any, float, float]:
    """What PyMC's NUTS computes before a trajectory once it no longer adapts.

    ``BaseHMC.astep`` with ``tune`` off draws the momentum from its potential, computes
    its velocity ``M⁻¹p`` and kinetic energy with the potential's own methods, and takes
    the dual averaging's averaged step size (jittered when the step has a
    ``step_rand``; PyMC's NUTS has none). The same calls in the same order, so the same
    numbers from the same generators. Returns ``(p, velocity, kinetic energy, step
    size)``; the step's ``step_size`` is set as ``astep`` sets it.
    """
    potential = nuts.potential
    p0 = potential.random()
    velocity = potential.velocity(p0, out=None)
    kinetic = potential.energy(p0, velocity=velocity)
    step_size = nuts.step_adapt.current(False)
    nuts.step_size = step_size
    if nuts._step_rand is not None:
        step_size = nuts._step_rand(step_size, rng=nuts.rng)
    return p0, velocity, float(kinetic), float(step_size)


def tuned_nuts_end(nuts: Any, diverging: bool) -> None:
    """PyMC's counts after a tuned NUTS iteration.

    ``astep``'s ``divergences`` and ``iter_count``.

    The mass matrix's update is a no-op once tuning is over; the step size's only
    records the acceptance statistic for PyMC's own end-of-sampling warnings, which an
    inner step does not give.
    """
    nuts.divergences += bool(diverging)
    nuts.iter_count += 1


def raveled_point_info(name: str, dim: int) -> Any:
    """PyMC's ``point_map_info`` of a point with one vector variable ``name`` of ``dim``."""
    from pymc.blocking import DictToArrayBijection

    return DictToArrayBijection.map({name: np.zeros(dim)}).point_map_info


def nuts_iteration(nuts: Any, q: Any, info: Any) -> Any:
    """One iteration of PyMC's NUTS ``nuts`` from the raveled point ``q`` (its ``astep``).

    ``pm.NUTS.step`` maps a point dictionary to the raveled vector and back around the
    same call; ``info`` is the ``point_map_info`` (:func:`raveled_point_info`). Returns
    the new raveled point.
    """
    from pymc.blocking import RaveledVars

    end, _ = nuts.astep(RaveledVars(q, info))
    return end.data


def hamiltonian_step_data(start: Any, q: Any, grad: Any, logp: float, energy: float,
                          accept_stat: float, divergence: str | None,
                          stats: dict[str, Any]) -> Any:
    """PyMC's ``HMCStepData`` for a trajectory that ended at the raveled point ``q``.

    ``divergence`` is the message of a divergence (None: none). ``stats`` are NUTS's tree
    stats (``depth``, ``tree_size``, ...).
    """
    from pymc.blocking import RaveledVars
    from pymc.step_methods.hmc.base_hmc import DivergenceInfo, HMCStepData
    from pymc.step_methods.hmc.nuts import Proposal

    end = Proposal(RaveledVars(q, start.q.point_map_info), grad, energy, logp,
                   stats["index_in_trajectory"])
    info = None if divergence is None else DivergenceInfo(divergence, None, start, None)
    return HMCStepData(end, accept_stat, info, stats)


def set_step_tuning(step: Any, tune: bool) -> None:
    """Whether a PyMC step method used inside another step adapts (its ``tune`` flag)."""
    step.tune = bool(tune)


#: The op classes PyMC puts in a model's graph for ``pm.Minibatch`` data
#: (``MinibatchOp``, drawing rows with ``MinibatchIndexRV``) and for an observed variable
#: with ``total_size`` (``MinibatchRandomVariable``).
MINIBATCH_OPS: tuple[type, ...] = (MinibatchOp, MinibatchIndexRV, MinibatchRandomVariable)


def is_ninf_check(op: Any) -> bool:
    """Whether ``op`` is a parameter check of PyMC that PyMC itself may turn into ``-inf``.

    PyMC's log-probability graphs check parameters with ``CheckParameterValue`` ops; those
    with ``can_be_replaced_by_ninf`` (``sigma > 0`` and the like, not the checks of
    ``icdf``) are replaced by a switch to ``-inf`` when PyMC compiles a log-probability.
    """
    return isinstance(op, CheckParameterValue) and bool(op.can_be_replaced_by_ninf)
