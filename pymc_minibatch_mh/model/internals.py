"""Every reach into PyTensor's and PyMC's internals, in one small module.

A compiled PyTensor function costs about 4–10 µs per call around its jitted graph
(``Function.__call__`` and the linker's thunk), several times the work on a small
minibatch. With the Numba backend (PyTensor 2.x and 3.x alike) the jitted graph is
``fn.vm.jit_fn``, the storage cells of the function's shared variables are the trailing
entries of ``fn.vm.inputs`` (after the explicit inputs), and ``fn.maker.inputs`` tells
which inputs are shared. :func:`direct_call` uses exactly these three facts, and nothing
else in the package touches PyTensor's private attributes.

The PyMC section below holds the rest: the private hooks PyMC's sampler reads on a step
method, the experimental dense mass-matrix adaptation and its window, a step's ``tune``
flag, the op classes of ``pm.Minibatch`` and ``total_size``, and which parameter checks
PyMC itself turns into ``-inf``.

``tests/test_pytensor_internals.py`` checks each fact on the installed PyTensor and PyMC
(outputs of the direct call equal the wrapper's, shared values are read at call time, the
explicit inputs come first, functions with updates are refused; PyMC reads the hooks, the
window doubles and survives ``reset()``, ...), so an upgrade that changes their meaning
fails loudly there instead of giving silently wrong numbers.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import logging
import math
import re
import warnings
from collections.abc import Callable
from typing import Any

import numba
import numpy as np
import pytensor
from pymc.data import MinibatchIndexRV, MinibatchOp
from pymc.logprob.utils import CheckParameterValue
from pymc.variational.minibatch_rv import MinibatchRandomVariable
from pytensor.compile.mode import get_mode
from pytensor.scalar.math import Psi, TriGamma

from pymc_minibatch_mh.model.compat import register_numba_scalar
from pymc_minibatch_mh.model.function_cache import cached_build

__all__ = [
    "MINIBATCH_OPS",
    "C_MODE",
    "OBJECT_MODE_WARNING",
    "build_without_object_mode",
    "object_mode_ops",
    "CephesPsi",
    "AS121TriGamma",
    "cacheable_special_functions",
    "digamma",
    "tri_gamma",
    "compile_function",
    "compile_derived",
    "uses_numba",
    "DirectCall",
    "PyMCStepHooks",
    "adaptation_window",
    "direct_call",
    "raise_wrapped_interrupt",
    "explicit_inputs_first",
    "full_adapt_potential",
    "is_ninf_check",
    "jitted_parts",
    "set_adaptation_window",
    "set_step_tuning",
    "fast_momentum",
    "hamiltonian_step_data",
    "nuts_density",
    "nuts_iteration",
    "nuts_mass",
    "nuts_tree_settings",
    "raveled_point_info",
    "set_hamiltonian_step",
    "set_nuts_density",
    "tuned_nuts_end",
    "tuned_nuts_start",
]


_log = logging.getLogger("pymc_minibatch_mh")

#: PyTensor's C backend under the same name on PyTensor 2 and 3 (``"FAST_RUN"`` is the C
#: virtual machine on PyTensor 2 and Numba on PyTensor 3): ``fast_run`` rewrites, C thunks.
C_MODE = "CVM"

#: What PyTensor's Numba backend says when an op has no Numba implementation and its
#: Python ``perform`` would run in Numba's object mode (the same text on PyTensor 2 and 3).
OBJECT_MODE_WARNING = re.compile(r"Numba will use object mode to run (.+?)'s perform method")


def compile_function(inputs: list[Any], outputs: Any, mode: Any) -> tuple[Any, list[str]]:
    """``pytensor.function(inputs, outputs, mode=mode)``, never in Numba's object mode.

    With ``mode="NUMBA"``, an op of the graph without a Numba implementation (for example
    ``TriGamma``, in the gradients of a Student-t's ν or a negative binomial's α) would
    run its Python ``perform`` method in object mode, element by element, at every call.
    The function is then compiled with PyTensor's C backend (:data:`C_MODE`) instead, and
    the ops are logged. The same holds for ``"FAST_RUN"`` where it means Numba (the
    default linker of PyTensor 3). Returns the function and the names of those ops (empty when the
    requested backend was kept).

    A second process with the same graph and mode loads the function from
    :mod:`~pymc_minibatch_mh.model.function_cache` instead of rewriting the graph again.
    """
    return compile_derived(inputs, outputs, "", lambda: (inputs, outputs), mode)[:2]


def compile_derived(inputs: list[Any], outputs: Any, recipe: str,
                    derive: Callable[[], tuple[Any, ...]],
                    mode: Any) -> tuple[Any, list[str], Any]:
    """:func:`compile_function` of the graph ``derive()`` returns (its inputs and outputs).

    ``derive()`` derives it from the graph of ``inputs`` and ``outputs`` by the derivation
    ``recipe`` names.

    A second process finds the function by the source graph and ``recipe``, and neither
    derives the graph (``pytensor.grad``) nor rewrites it: ``derive`` is called only when
    the function is compiled. It must derive the same graph from the same source whenever
    ``recipe`` is the same (see
    :func:`~pymc_minibatch_mh.model.function_cache.cached_build`). ``derive`` may return
    a third item, facts about the derived graph that the caller needs (they must pickle:
    they are kept with the function).

    Returns the function, the names of the ops that sent it to C (see
    :func:`compile_function`) and the facts (``None`` when ``derive`` gave none).
    """
    def build() -> tuple[Any, list[str], Any]:
        fn_inputs, fn_outputs, *facts = derive()
        # For Numba, digamma and trigamma as ops that Numba compiles and caches
        numba_outputs = cacheable_special_functions(fn_outputs) if uses_numba(mode) \
            else fn_outputs
        fn, ops = build_without_object_mode(
            lambda m: pytensor.function(fn_inputs, numba_outputs if uses_numba(m)
                                        else fn_outputs, mode=m, on_unused_input="ignore"),
            mode, outputs=numba_outputs, log=False)
        return fn, ops, (facts[0] if facts else None)

    fn, ops, facts = cached_build(inputs, outputs, mode, build, recipe=recipe)
    _log_object_mode(ops)
    return fn, ops, facts


def build_without_object_mode(build: Callable[[Any], Any], mode: Any,
                              outputs: Any = None, log: bool = True) -> tuple[Any, list[str]]:
    """``build(mode)``, or ``build(C_MODE)`` if Numba's object mode would run some op.

    ``build`` compiles PyTensor functions: :func:`compile_function` builds one function
    with it; the surrogate's NUTS, which PyMC compiles, is its other use.

    Given the graph's ``outputs``, the ops of its elementwise nodes are asked first
    (:func:`object_mode_ops`), before any rewriting: a graph with such an op is built for
    the C backend at once, not rewritten for Numba in vain (1.0–1.6 s for the per-step
    function of a Student-t's ν or a negative binomial's α). PyTensor's warnings during
    the build decide the rest (an op that only the rewrites bring in, or that is not
    elementwise).

    Returns what ``build`` returned and the names of the ops that had no Numba
    implementation (empty when ``mode`` was kept); ``log`` logs those names.
    """
    if not uses_numba(mode):
        return build(mode), []
    ops = object_mode_ops(outputs) if outputs is not None else []
    if not ops:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            built = build(mode)
        others = []
        for w in caught:
            match = OBJECT_MODE_WARNING.search(str(w.message))
            if match:
                ops.append(match.group(1))
            else:
                others.append(w)
        for w in others:  # the other warnings are the user's to see
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        if not ops:
            return built, []
    ops = sorted(set(ops))
    if log:
        _log_object_mode(ops)
    return build(C_MODE), ops


def _log_object_mode(ops: list[str]) -> None:
    if ops:
        _log.info("No Numba implementation of %s: a per-step function runs on PyTensor's C "
                  "backend instead of Numba's object mode.", ", ".join(ops))


def object_mode_ops(outputs: Any) -> list[str]:
    """The scalar ops of ``outputs``' elementwise nodes that Numba would run in object mode.

    Asks PyTensor's own Numba dispatch (``numba_funcify``, which warns with
    :data:`OBJECT_MODE_WARNING` where it falls back to an op's Python ``perform``), once
    per distinct scalar op of the graph as given, before rewriting: a few milliseconds.
    """
    from pytensor.graph.basic import Variable
    from pytensor.graph.traversal import io_toposort
    from pytensor.link.numba.dispatch import numba_funcify
    from pytensor.scalar import get_scalar_type
    from pytensor.tensor.elemwise import Elemwise

    outs = outputs if isinstance(outputs, list | tuple) else [outputs]
    nodes: dict[Any, Any] = {}
    for node in io_toposort([], [o for o in outs if isinstance(o, Variable)]):
        if isinstance(node.op, Elemwise):
            nodes.setdefault(node.op.scalar_op, node)
    unasked: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for scalar_op, node in nodes.items():
            try:
                numba_funcify(scalar_op, node=scalar_op.make_node(
                    *[get_scalar_type(dtype=i.type.dtype)() for i in node.inputs]))
            except Exception as exc:  # noqa: BLE001 - warned below; the build then decides
                unasked.append(f"{scalar_op} ({type(exc).__name__}: {exc})")
    if unasked:
        warnings.warn(
            f"PyTensor's Numba backend could not be asked ahead of compiling whether it "
            f"runs {', '.join(unasked)} in object mode; the compilation's own warnings "
            "decide (a function may then be compiled twice, once for PyTensor's C backend).",
            RuntimeWarning, stacklevel=2,
        )
    return sorted({m.group(1) for w in caught
                   if (m := OBJECT_MODE_WARNING.search(str(w.message)))})


@numba.njit(cache=True)
def tri_gamma(x: float) -> float:  # pragma: no cover (compiled)
    """ψ′(x), the trigamma function, as PyTensor's C backend computes its ``tri_gamma``.

    Algorithm AS 121 (Schneider 1978), the algorithm and constants of PyTensor's C
    implementation: the recurrence ψ′(z) = ψ′(z + 1) + 1/z² up to z ≥ 5, then the
    asymptotic series; 1/x² below 10⁻⁴, and 0 for x ≤ 0 (as in C). Within about 2·10⁻⁸
    (relative) of ``scipy.special.polygamma(1, x)`` for x > 0. The Numba implementation of
    :class:`AS121TriGamma` (PyTensor has none for ``tri_gamma``); the C code of PyTensor 2
    and 3 is this algorithm, so the two backends agree to rounding.
    """
    if x <= 0.0:
        return 0.0
    if x <= 1e-4:
        return 1.0 / x / x
    value = 0.0
    z = x
    while z < 5.0:
        value += 1.0 / z / z
        z += 1.0
    y = 1.0 / z / z
    return value + 0.5 * y + (1.0 + y * (0.1666666667 + y * (
        -0.03333333333 + y * (0.02380952381 + y * -0.03333333333)))) / z


@numba.njit(cache=True)
def _digamma_positive(x: float) -> float:  # pragma: no cover (compiled)
    value = 0.0
    y = x
    while y < 10.0:
        value -= 1.0 / y
        y += 1.0
    r = 1.0 / y
    value += math.log(y) - 0.5 * r
    r = r * r
    return value - r * (1.0 / 12 - r * (1.0 / 120 - r * (1.0 / 252 - r * (
        1.0 / 240 - r * (1.0 / 132 - r * (691.0 / 32760 - r / 12))))))


@numba.njit(cache=True)
def digamma(x: float) -> float:  # pragma: no cover (compiled)
    """ψ(x), the digamma function, as PyTensor 3's C backend computes its ``psi``.

    Cephes' algorithm, as in PyTensor 3's C implementation: the recurrence
    ψ(y) = ψ(y + 1) − 1/y up to y ≥ 10, then the asymptotic series to the seventh
    Bernoulli term; for x ≤ 0 the reflection formula, and +∞ at 0 and the negative
    integers (as in C; SciPy gives −∞ and NaN there). Within about 10⁻¹⁴ of
    ``scipy.special.psi`` elsewhere (PyTensor 2's C code, Algorithm AS 103, is within
    about 10⁻⁹). The Numba implementation of :class:`CephesPsi`.
    """
    if x <= 0.0:
        if x == math.floor(x):
            return math.inf
        pi_x = math.pi * x
        return _digamma_positive(1.0 - x) - math.pi * math.cos(pi_x) / math.sin(pi_x)
    return _digamma_positive(x)


class CephesPsi(Psi):
    """PyTensor's ``psi`` (digamma) with :func:`digamma` as its Numba implementation.

    PyTensor's Numba backend calls SciPy's compiled ``psi`` through a function pointer,
    which Numba cannot keep in its cache: a function with ``psi`` (the gradient of a
    Student-t's ν, a negative binomial's α) is compiled anew in every process (3–4 s for
    the per-step function of the zoo's negative binomial). This op computes SciPy's values
    to about 10⁻¹⁴ with the algorithm of PyTensor 3's C code. :func:`compile_derived` puts
    it in place of ``psi`` in the graphs it compiles for Numba
    (:func:`cacheable_special_functions`); PyTensor's own op is left as it is.
    """


class AS121TriGamma(TriGamma):
    """PyTensor's ``tri_gamma`` with :func:`tri_gamma` as its Numba implementation.

    PyTensor has no Numba implementation of ``tri_gamma`` (the second derivative of
    ``gammaln``): a function with it ran its Python code in Numba's object mode, or was
    compiled for the C backend, where without a linked BLAS every product runs in Python.
    Same role and scope as :class:`CephesPsi`.
    """


_CACHEABLE: dict[type, tuple[type, Any]] = {Psi: (CephesPsi, digamma),
                                            TriGamma: (AS121TriGamma, tri_gamma)}


@functools.cache
def _source_digest(implementation: Any) -> str:
    """A digest of an implementation's source and its helper's.

    Read when a graph with the op is first compiled (not at import).
    """
    source = "".join(inspect.getsource(f.py_func) for f in (implementation, _digamma_positive))
    return hashlib.sha256(source.encode()).hexdigest()


def _register_numba_implementations() -> None:
    from pytensor.link.numba.dispatch.scalar import scalar_op_cache_key

    for op_class, implementation in _CACHEABLE.values():
        # PyTensor's Numba cache keeps compiled graphs by this key: the source is in it,
        # so an edit of the implementation is not answered with the old code.
        def funcify(op: Any, node: Any = None, _impl: Any = implementation,
                    **kwargs: Any) -> tuple[Any, str]:
            return _impl, scalar_op_cache_key(op, implementation=_source_digest(_impl))

        register_numba_scalar(op_class, funcify)


_register_numba_implementations()


def cacheable_special_functions(outputs: Any) -> Any:
    """``outputs`` with ``psi`` and ``tri_gamma`` as :class:`CephesPsi` and :class:`AS121TriGamma`.

    A copy of the graph: its inputs, shared variables and constants are kept, the given
    graph is not changed. Anything else: ``outputs``.
    """
    from pytensor.graph.basic import Variable, clone_get_equiv
    from pytensor.graph.traversal import graph_inputs, io_toposort
    from pytensor.tensor.elemwise import Elemwise

    single = isinstance(outputs, Variable)
    outs = [outputs] if single else list(outputs)
    swapped = [n for n in io_toposort([], outs)
               if isinstance(n.op, Elemwise) and type(n.op.scalar_op) in _CACHEABLE]
    if not swapped:
        return outputs
    equiv = clone_get_equiv(list(graph_inputs(outs)), outs, copy_inputs=False,
                            copy_orphans=False)
    for node in swapped:
        scalar = node.op.scalar_op
        op_class = _CACHEABLE[type(scalar)][0]
        equiv[node].op = Elemwise(op_class(scalar.output_types_preference, name=scalar.name))
    new = [equiv[o] for o in outs]
    return new[0] if single else new


def uses_numba(mode: Any) -> bool:
    """Whether PyTensor's ``mode`` (a name or a Mode) compiles with the Numba linker."""
    linker = get_mode(mode).linker
    return type(linker).__name__ == "NumbaLinker"


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


def nuts_density(nuts: Any) -> Callable[[Any], tuple[Any, Any]]:
    """``q -> (log density, gradient)``, called directly.

    What PyMC's NUTS step ``nuts`` evaluates at its raveled point ``q``.

    PyMC's leapfrog integrator calls the compiled function of the step's
    ``ValueGradFunction`` (``nuts._logp_dlogp_func._pytensor_function``) with the raveled
    point. It is returned through :func:`direct_call` (about 3 µs less per call than
    PyTensor's wrapper, measured on the zoo's random intercepts). A step whose function
    does not take raveled points (``_raveled_inputs`` false, not what this package builds)
    is refused.
    """
    value_grad = nuts._logp_dlogp_func
    if not value_grad._raveled_inputs:
        raise ValueError("This PyMC NUTS step's density does not take raveled points.")
    return direct_call(value_grad._pytensor_function)


def set_nuts_density(nuts: Any, density: Callable[[Any, Any], tuple[Any, Any]]) -> None:
    """Make PyMC's leapfrog integrator of ``nuts`` evaluate ``density(q, info)``."""
    nuts.integrator._logp_dlogp_func = density


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


def set_hamiltonian_step(nuts: Any, trajectory: Callable[..., Any]) -> None:
    """Make PyMC's NUTS build its trajectories with ``trajectory``.

    ``trajectory(start, p0, step_size)`` receives PyMC's start ``State`` (``q`` raveled,
    ``p``, ``v``, ``q_grad``, ``energy``, ``model_logp``), the momentum and the (jittered)
    step size, and returns the values of :func:`hamiltonian_step_data`. Everything around
    the trajectory (momentum, step-size and mass-matrix adaptation, stats) stays PyMC's.
    """
    nuts._hamiltonian_step = trajectory


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
