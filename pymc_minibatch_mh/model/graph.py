"""Graph utilities for the surgery of :mod:`~pymc_minibatch_mh.model.split`.

Rebuilding graphs with replacements (without PyMC's static-shape pins), turning PyMC's
parameter checks into ``-inf``, and reading data variables.
"""

from __future__ import annotations

import contextlib
import gc
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.compile.mode import Mode
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Apply, Constant, Variable
from pytensor.graph.op import Op
from pytensor.graph.replace import vectorize_graph
from pytensor.graph.traversal import ancestors, graph_inputs, io_toposort
from pytensor.scalar.basic import Cast as ScalarCast
from pytensor.tensor.basic import Alloc, AllocEmpty
from pytensor.tensor.elemwise import Elemwise
from pytensor.tensor.math import Dot
from pytensor.tensor.shape import SpecifyShape

from pymc_minibatch_mh.model.internals import is_ninf_check
from pymc_minibatch_mh.store.row_store import data_value, pass_rows

__all__ = [
    "LOOP_PRODUCTS",
    "BatchedProducts",
    "frozen_heap",
    "UpcastDot",
    "checks_as_ninf",
    "clone_replace",
    "has_op",
    "is_data",
    "is_shape_constant",
    "leading_length",
    "observed_source",
    "reference_graph",
    "shape_constant_replacements",
]


#: Vector products that :class:`BatchedProducts` makes one call at a time before it compiles
#: their batched graph (about 0.1 s; one product of the set-up's functions costs
#: 0.5–1.5 ms), so a model whose search needs few of them does not pay that compilation.
LOOP_PRODUCTS: int = 64


_frozen_depth = 0


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Python's cyclic garbage collector confined to the objects made inside the block.

    Building and loading PyTensor graphs makes hundreds of thousands of objects, whose
    allocations trigger the collector's full collections, and each one scans every
    object of the process (PyMC, PyTensor, Numba, the user's data). The objects that
    exist when the block starts are frozen (``gc.freeze``): collections skip them, and
    new objects are collected as usual; at the end they are unfrozen (``gc.unfreeze``),
    so garbage among them is collected again. Measured on the model zoo at N = 3·10⁴,
    eight steps built in one process with their functions cached: 11.5 s in all, 8.3 s
    with this. Pausing the collector instead gave about the same times, but would keep
    the set-up's cyclic garbage (graphs that may hold large constants) until its end.

    The block ends with one full collection while the old objects are still frozen
    (none where the process has disabled the collector): it frees the set-up's cyclic
    garbage at once and scans only the new objects (10–100 ms). A full collection
    becomes due once the long-lived objects grow by a quarter of the number the last one
    kept; inside the block that number counts only unfrozen objects, and the set-up's
    last automatic one may have kept few. Without this collection the next full one
    could come at once and, after the unfreeze, scan the whole process: 0.3 s of the
    0.55 s of ``pm.sample`` on the zoo's normal regression at N = 3·10⁴, where this
    leaves 0.25 s.

    Nested blocks freeze nothing more. ``gc.unfreeze`` unfreezes every frozen object,
    including any the process froze itself before (Python 3.12 starts with a few hundred,
    and a server may freeze its objects before forking workers): they stay live, only
    collectable again.
    """
    global _frozen_depth
    if _frozen_depth == 0:
        gc.freeze()
    _frozen_depth += 1
    try:
        yield
    finally:
        _frozen_depth -= 1
        if _frozen_depth == 0:
            if gc.isenabled():
                gc.collect()  # the new objects only: the old are still frozen
            gc.unfreeze()


class BatchedProducts:
    """``output``, linear in ``vector``, for every row of a matrix.

    ``graph()`` returns ``(inputs, output, vector)``; it is called only when the batched
    graph is compiled (so a process that makes few products, or loads ``one`` from the
    function cache, builds no graph). ``products(*args, matrix)`` returns an array whose
    row ``k`` is ``output`` at the ``inputs`` ``args`` and ``vector = matrix[k]``. The first
    :data:`LOOP_PRODUCTS` products are made by ``one(*args, row)``, one call per row; after that in
    one call of the batched graph (PyTensor's ``vectorize_graph``), unless PyTensor cannot
    vectorise it (then one call per row throughout, with a log message naming ``what``).

    For the Jacobians and Hessians of the set-up's data-free parts, assembled from d
    vector products at each Newton step of the MAP search. The batched graph is compiled
    for PyTensor's Python backend without rewrites: measured on the crossed random
    intercepts' curvature (d = 125), 0.17 s as 125 calls of the ``FAST_COMPILE``
    function, 0.13 s in one ``FAST_COMPILE`` call (its rewrites merge products into
    three-input ones, which the Python backend runs one element at a time), 0.010 s
    without rewrites (0.1–0.2 s to compile), 0.2 ms with Numba after 0.6 s to compile.
    """

    def __init__(self, graph: Callable[[], tuple[list[Variable], Variable, Variable]],
                 what: str, one: Callable[..., Any]) -> None:
        self._graph = graph
        self.what = what
        self._one = one
        self._made = 0
        self._batched: Any = None

    def __call__(self, *args: Any) -> np.ndarray:
        """The products for ``(*inputs, matrix)``: one row per row of ``matrix``."""
        *inputs, matrix = args
        if self._batched is None and self._made >= LOOP_PRODUCTS:
            self._batched = self._compile() or False
        if self._batched:
            return np.asarray(self._batched(*inputs, matrix))
        self._made += len(matrix)
        return np.array([np.asarray(self._one(*inputs, row)) for row in matrix])

    def _compile(self) -> Any:
        inputs, output, vector = self._graph()
        matrix = pt.matrix(f"{vector.name or 'v'}_rows", dtype=vector.dtype)
        try:
            rows = vectorize_graph(output, replace={vector: matrix})
        except Exception as exc:  # noqa: BLE001 - any op PyTensor cannot vectorise: warned
            warnings.warn(
                f"The {self.what} are computed one vector product at a time, a slower "
                f"set-up: PyTensor could not vectorise the graph ({type(exc).__name__}: "
                f"{exc}).", RuntimeWarning, stacklevel=2,
            )
            return None
        if rows.ndim == output.ndim:
            # The output does not depend on the vector (a flat prior's Hessian products
            # are zeros): the same row for every row of the matrix.
            rows = pt.broadcast_to(rows, (matrix.shape[0], *(rows.shape[i]
                                                             for i in range(rows.ndim))))
        return pytensor.function([*inputs, matrix], rows,
                                 mode=Mode(linker="py", optimizer=None),
                                 on_unused_input="ignore")


def observed_source(var: Variable) -> Variable:
    """The array behind an observed value: ``var`` with dtype casts removed.

    PyMC casts observed data to the variable's dtype (``pm.Data`` stores integers as int32,
    a Poisson or Bernoulli variable is int64), so the value of an observed variable given
    as ``pm.Data`` is often ``Cast(shared)``; the cast is applied row by row as well.
    """
    while (
        var.owner is not None
        and isinstance(var.owner.op, Elemwise)
        and isinstance(var.owner.op.scalar_op, ScalarCast)
    ):
        var = var.owner.inputs[0]
    return var


def is_data(var: Variable) -> bool:
    """Whether ``var`` is an array of data (a shared variable or a constant, ≥ 1-d)."""
    return isinstance(var, SharedVariable | Constant) and getattr(var, "ndim", 0) >= 1


def has_op(outputs: Sequence[Variable], op_types: tuple[type, ...]) -> bool:
    """Whether the graphs of ``outputs`` contain an Op of one of the classes ``op_types``."""
    return any(v.owner is not None and isinstance(v.owner.op, op_types)
               for v in ancestors(outputs))


def _rebuild(
    outputs: list[Variable],
    replace: Mapping[Variable, Variable],
    node_rule: Callable[[Any, list[Variable]], Variable | None],
) -> list[Variable]:
    """Rebuild ``outputs`` with ``replace`` applied; ``node_rule`` may replace a node.

    ``node_rule(node, new_inputs)`` returns the new variable for the node's (single)
    output, or None to rebuild the node as it is. Nodes whose inputs are unchanged are
    reused, not copied, so nodes shared with the model are left untouched.
    """
    memo: dict[Variable, Variable] = dict(replace)
    roots = [v for v in graph_inputs(outputs) if v not in memo]
    for node in io_toposort(roots + list(memo), outputs):
        new_inputs = [memo.get(i, i) for i in node.inputs]
        ruled = node_rule(node, new_inputs)
        if ruled is not None:
            memo[node.outputs[0]] = ruled
            continue
        if all(n is o for n, o in zip(new_inputs, node.inputs, strict=True)):
            continue
        # Calling the Op (not make_node) lets symbolic Ops such as PyTensor 3's LogSumExp
        # rebuild their inner graph for the new input types.
        new_outputs = node.op(*new_inputs, return_list=True)
        for old, new in zip(node.outputs, new_outputs, strict=True):
            memo[old] = new
    return [memo.get(o, o) for o in outputs]


def _drop_specify_shape(node: Any, new_inputs: list[Variable]) -> Variable | None:
    return new_inputs[0] if isinstance(node.op, SpecifyShape) else None


#: Position of the leading length among the inputs of the Ops that build an array of a
#: given shape (``pt.zeros``, ``pt.ones``, ``pt.full``, ``pt.alloc``, ``pt.broadcast_to``,
#: ``pt.empty``).
_ALLOC_LEADING_INPUT = {Alloc: 1, AllocEmpty: 0}


def _rows_rule(n: int, length: Variable) -> Callable[[Any, list[Variable]], Variable | None]:
    """A node rule: drop SpecifyShape, and let arrays allocated with N rows have ``length``."""

    def rule(node: Any, new_inputs: list[Variable]) -> Variable | None:
        dropped = _drop_specify_shape(node, new_inputs)
        if dropped is not None:
            return dropped
        position = _ALLOC_LEADING_INPUT.get(type(node.op))
        if position is None or len(new_inputs) <= position:
            return None
        dim = new_inputs[position]
        if not (isinstance(dim, Constant) and dim.ndim == 0 and int(dim.data) == n):
            return None
        inputs = list(new_inputs)
        inputs[position] = length
        return node.op(*inputs)

    return rule


def clone_replace(
    outputs: Any,
    replace: Mapping[Variable, Variable],
    *,
    rows: tuple[int, Variable] | None = None,
) -> Any:
    """Rebuild ``outputs`` with ``replace`` applied, letting types change, without SpecifyShape.

    Like ``pytensor.graph.replace.clone_replace(..., rebuild_strict=False)``, but every
    ``SpecifyShape`` node is dropped: PyMC's log-probability graphs pin the static length
    of the observed data (N), which no longer holds once the data are row batches.

    Parameters
    ----------
    outputs : Variable or sequence of Variable
        The graphs to rebuild.
    replace : dict
        Variables and their replacements.
    rows : tuple of (int, Variable), optional
        ``(N, length)``: arrays allocated with a leading length of the constant N
        (``pt.zeros((X.shape[0], 1))``, ``pt.ones(N)``, ``pt.full``, ``pt.broadcast_to``)
        are allocated with ``length`` rows instead. PyMC's log-probability graphs fold
        ``X.shape[0]`` of a NumPy ``X`` into the constant N, so this is how such a column
        follows a row batch; a graph in which the constant means something else is caught
        by :func:`~pymc_minibatch_mh.model.checks.validate_split`.

    Returns
    -------
    Variable or list of Variable
        The rebuilt graphs (one variable for one variable).

    """
    single = isinstance(outputs, Variable)
    rule = _drop_specify_shape if rows is None else _rows_rule(*rows)
    result = _rebuild([outputs] if single else list(outputs), replace, rule)
    return result[0] if single else result


def _check_as_ninf(node: Any, new_inputs: list[Variable]) -> Variable | None:
    if not is_ninf_check(node.op):
        return None
    expr, *conds = new_inputs
    if all(isinstance(c, Constant) and np.all(c.data) for c in conds):
        return expr  # checks that always pass
    cond = conds[0] if len(conds) == 1 else pt.all(pt.stack(conds))
    return pt.switch(cond, expr, -np.inf).astype(node.outputs[0].dtype)


def checks_as_ninf(outputs: Sequence[Variable]) -> list[Variable]:
    """Rebuild ``outputs`` with PyMC's parameter checks turned into ``-inf``, not errors.

    PyMC's log-probability graphs raise ``ParameterValueError`` for invalid parameters
    (``sigma <= 0``, ...); PyMC's own compiled functions (``pymc.pytensorf.compile``) turn
    those checks into a switch to ``-inf`` (the same rewrite, applied here to the graph), so
    such a proposal is rejected instead of stopping the chain with an exception. The graph
    is rebuilt, not rewritten in place.
    """
    return _rebuild(list(outputs), {}, _check_as_ninf)


def is_shape_constant(var: Constant, n: int) -> bool:
    """Whether ``var`` is a static shape (a short integer vector) whose first entry is ``n``."""
    data = np.asarray(var.data)
    return (
        data.dtype.kind in "iu" and data.ndim == 1 and 1 <= data.size <= 8 and int(data[0]) == n
    )


def shape_constant_replacements(
    variables: Iterable[Variable], n: int, length: Variable
) -> dict[Variable, Variable]:
    """The static shapes among ``variables`` whose first entry is ``n``, with ``length`` first.

    RV sizes and broadcast shapes of the observation dimension are constants once PyMC has
    built the graph; on a row batch their first entry must be the batch's ``length``.
    """
    replace: dict[Variable, Variable] = {}
    for var in variables:
        if isinstance(var, Constant) and is_shape_constant(var, n):
            rest = pt.as_tensor(var.data[1:].astype(var.dtype))
            replace[var] = pt.concatenate([pt.cast(length, var.dtype)[None], rest])
    return replace


def leading_length(var: Variable) -> int | None:
    """Leading length of a data variable's current value (None for a scalar)."""
    value = data_value(var)
    return int(value.shape[0]) if value.ndim >= 1 else None


class UpcastDot(Op):
    """PyTensor's ``Dot`` of two matrices that converts the narrower one block by block.

    One of the two has a narrower dtype than the product.

    NumPy (in ``Dot.perform``) converts the whole narrower matrix before the product: for
    the split's reference on a float32 design of N = 10⁷, d = 100, a float64 copy of 8 GB
    per evaluation. Here the narrower matrix is converted in blocks of
    :func:`~pymc_minibatch_mh.store.row_store.pass_rows` rows, each multiplied while it is
    in the cache; the result is the same as ``Dot``'s (each block's product is NumPy's).
    Only :func:`reference_graph` puts it in a graph.
    """

    __props__ = ()

    def make_node(self, a: Variable, b: Variable) -> Apply:
        """The node of ``a @ b``, typed as PyTensor's ``Dot`` types it."""
        out = Dot()(a, b)
        return Apply(self, [a, b], [out.type()])

    def perform(self, node: Apply, inputs: list[Any], output_storage: list[Any]) -> None:
        """The product of the two inputs, in the output's dtype."""
        a, b = inputs
        output_storage[0][0] = _upcast_product(a, b, np.dtype(node.outputs[0].type.dtype))


def _upcast_product(a: np.ndarray, b: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``a @ b`` in ``dtype``, the narrower factor converted in blocks of rows."""
    if a.dtype == dtype:
        return _upcast_product(b.T, a.T, dtype).T if b.dtype != dtype else a @ b
    b = b.astype(dtype, copy=False)
    out = np.empty((a.shape[0], b.shape[1]), dtype=dtype)
    step = pass_rows([a])
    for start in range(0, a.shape[0], step):
        np.dot(a[start:start + step].astype(dtype), b, out=out[start:start + step])
    return out


def _upcast_dot(node: Any, new_inputs: list[Variable]) -> Variable | None:
    if type(node.op) is not Dot:
        return None
    dtype = node.outputs[0].dtype
    if all(i.dtype == dtype for i in new_inputs):
        return None
    return UpcastDot()(*new_inputs)


def reference_graph(outputs: Sequence[Variable], row_vars: Sequence[Variable]) -> list[Variable]:
    """The model's own terms on all rows, as the split's check evaluates them.

    The data arrays among ``row_vars`` that are constants become shared variables of the
    same arrays (not copied): PyTensor's rewrites inspect constants (hashing, looking for
    a unique value or a NaN), which took about 7 s on a float32 design of N = 10⁷,
    d = 100. Products of a narrower dtype with the output's become :class:`UpcastDot`.
    The values are the model's; only the work to compute them changes.
    """
    shared = {
        var: pytensor.shared(data_value(var), name=var.name, borrow=True, shape=var.type.shape)
        for var in row_vars
        if isinstance(var, Constant)
    }
    return _rebuild(list(outputs), shared, _upcast_dot)
