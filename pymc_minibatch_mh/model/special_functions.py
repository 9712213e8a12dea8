"""Digamma and trigamma as ops whose Numba implementations Numba caches.

PyTensor's Numba backend calls SciPy's compiled ``psi`` through a function pointer, which
Numba cannot keep in its cache, and has no implementation of ``tri_gamma`` at all.
:class:`CephesPsi` and :class:`AS121TriGamma` are PyTensor's ops with :func:`digamma` and
:func:`tri_gamma` (the algorithms of PyTensor's C code, compiled by Numba) as their Numba
implementations; :func:`cacheable_special_functions` puts them into a graph compiled for
Numba (:func:`~pymc_minibatch_mh.model.compilation.compile_derived` does).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import math
from typing import Any

import numba
from pytensor.scalar.math import Psi, TriGamma

from pymc_minibatch_mh.model.compat import register_numba_scalar

__all__ = [
    "AS121TriGamma",
    "CephesPsi",
    "cacheable_special_functions",
    "digamma",
    "tri_gamma",
]


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
    to about 10⁻¹⁴ with the algorithm of PyTensor 3's C code.
    :func:`~pymc_minibatch_mh.model.compilation.compile_derived` puts
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
