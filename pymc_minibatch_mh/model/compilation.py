"""Compiling PyTensor functions, never in Numba's object mode.

:func:`compile_function` and :func:`compile_derived` compile a graph for the requested
PyTensor mode unless Numba would run one of its ops in object mode (its Python
``perform``, element by element, at every call); such a graph is compiled for PyTensor's C
backend (:data:`C_MODE`) instead, and the ops are logged. For Numba they put the
package's own digamma and trigamma in place of PyTensor's
(:mod:`~pymc_minibatch_mh.model.special_functions`), and a second process loads the
compiled function from :mod:`~pymc_minibatch_mh.model.function_cache`.
"""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Callable
from typing import Any

import pytensor
from pytensor.compile.mode import get_mode

from pymc_minibatch_mh.model.function_cache import cached_build
from pymc_minibatch_mh.model.special_functions import cacheable_special_functions

__all__ = [
    "C_MODE",
    "OBJECT_MODE_WARNING",
    "build_without_object_mode",
    "compile_derived",
    "compile_function",
    "object_mode_ops",
    "uses_numba",
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
    with it.

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


def uses_numba(mode: Any) -> bool:
    """Whether PyTensor's ``mode`` (a name or a Mode) compiles with the Numba linker."""
    linker = get_mode(mode).linker
    return type(linker).__name__ == "NumbaLinker"
