r"""The decomposition walk of :mod:`~pymc_minibatch_mh.estimators.predictor`.

``_Walker`` writes a graph that depends on θ and on per-row data as
``Σ_k F_k c_k(θ) + o`` (:class:`Term` blocks of features and coefficients, an offset of
data only), walking it from the top through the operations listed in
:mod:`~pymc_minibatch_mh.estimators.predictor`, and raises a :class:`DecompositionError`
that says where it cannot. :func:`~pymc_minibatch_mh.estimators.predictor.analyse` applies
it to the quantities of each observed variable.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytensor.tensor as pt
from pytensor.compile.ops import ViewOp
from pytensor.graph.basic import Constant, Variable
from pytensor.graph.traversal import ancestors, io_toposort
from pytensor.scalar.basic import (
    Add,
    Exp,
    Identity,
    Log,
    Mul,
    Neg,
    Pow,
    Reciprocal,
    Sqrt,
    Sub,
    TrueDiv,
)
from pytensor.scalar.basic import Cast as ScalarCast
from pytensor.tensor.blockwise import Blockwise
from pytensor.tensor.elemwise import CAReduce, DimShuffle, Elemwise
from pytensor.tensor.math import Dot
from pytensor.tensor.shape import SpecifyShape

from pymc_minibatch_mh.model.compat import ADVANCED_INDEX_OPS

__all__ = ["DecompositionError", "Term", "log_form", "row_batch"]


class DecompositionError(ValueError):
    """A per-row quantity is not a sum of data features times functions of θ."""


@dataclass(frozen=True)
class Term:
    """One block of features and its coefficients.

    ``kind == "dense"``: ``feature`` is None (the constant 1), a per-row vector (with a
    coefficient of size 1) or a per-row matrix ``(N, K)`` (with ``K`` coefficients).
    ``kind == "index"``: the one-hot features of ``index`` (per-row integers), each row
    scaled by ``feature`` (None: 1); ``coef`` has one entry per index value.
    """

    kind: str
    coef: Variable
    feature: Variable | None = None
    index: Variable | None = None


@dataclass
class Linear:
    """``Σ terms + offset`` during the walk (offset: data only, None for 0)."""

    terms: list[Term] = field(default_factory=list)
    offset: Variable | None = None



# ---------------------------------------------------------------------------- walk
def _is_scalar_like(var: Variable) -> bool:
    return all(var.type.broadcastable)


def _is_elemwise(var: Variable, op_class: type) -> bool:
    """Whether ``var`` is the output of an elementwise ``op_class`` (a scalar op class)."""
    return (var.owner is not None and isinstance(var.owner.op, Elemwise)
            and isinstance(var.owner.op.scalar_op, op_class))


def _strip(var: Variable) -> Variable:
    """Remove wrappers that change nothing per row: casts, SpecifyShape, views, broadcasting.

    A view is what ``pm.Deterministic`` puts around its expression (bambi's group effects
    ``Deterministic(offset * sigma)`` and its ``mu``).
    """
    while var.owner is not None:
        op = var.owner.op
        if isinstance(op, SpecifyShape | ViewOp):
            var = var.owner.inputs[0]
        elif isinstance(op, Elemwise) and isinstance(op.scalar_op, ScalarCast):
            var = var.owner.inputs[0]
        elif isinstance(op, DimShuffle) and _is_scalar_like(var.owner.inputs[0]):
            var = var.owner.inputs[0]
        else:
            break
    return var


def log_form(var: Variable) -> Variable | None:
    """``log(var)`` with every ``log(exp(u))`` read as ``u``, for a positive-by-form ``var``.

    ``var`` is positive by its form when it is ``exp(u)``, a positive constant, or a
    product, quotient, reciprocal, constant power or square root of such: a
    log-transformed scale written as ``1/φ``, ``φ**2``, ``a * b`` or ``sqrt(φ)``, whose
    logarithm is then ``−v``, ``2v``, ``v_a + v_b``, ``v/2`` in the unconstrained values:
    affine, as that of the scale itself. None for any other form.
    """
    var = _strip(var)
    if isinstance(var, Constant):
        value = np.asarray(var.data, dtype=np.float64)
        return pt.log(value) if value.size == 1 and float(value) > 0.0 else None
    if var.owner is None or not isinstance(var.owner.op, Elemwise):
        return None
    scalar_op, inputs = var.owner.op.scalar_op, var.owner.inputs
    if isinstance(scalar_op, Exp):
        return _strip(inputs[0])
    if isinstance(scalar_op, Pow):
        base, exponent = inputs[0], _strip(inputs[1])
        inner = log_form(base)
        if not isinstance(exponent, Constant) or np.size(exponent.data) != 1 or inner is None:
            return None
        return float(np.asarray(exponent.data)) * inner
    parts = [log_form(i) for i in inputs]
    if any(part is None for part in parts):
        return None
    if isinstance(scalar_op, Mul):
        total = parts[0]
        for part in parts[1:]:
            total = total + part
        return total
    if isinstance(scalar_op, TrueDiv):
        return parts[0] - parts[1]
    if isinstance(scalar_op, Reciprocal):
        return -parts[0]
    if isinstance(scalar_op, Sqrt):
        return 0.5 * parts[0]
    return None


def _n_rows(row_vars: Sequence[Variable]) -> int:
    var = row_vars[0]
    value = var.get_value(borrow=True) if hasattr(var, "get_value") else var.data
    return int(np.shape(value)[0])


def _row_twin(var: Variable, row_vars: Sequence[Variable], n: int) -> Variable | None:
    """The row variable ``var`` stands for: itself, or an equal constant.

    PyTensor may merge equal constants in the log-probability graph that the row store
    was built from, so a model graph can hold a constant (a covariate written twice as
    NumPy) that is not one of the row store's variables but equals one. A one-column
    matrix equal to a row vector counts too (bambi's design matrix of one covariate,
    which the log-probability's rewrites turn into the vector): :func:`row_batch` gives
    its batch the column's shape.
    """
    if var in row_vars:
        return var
    if not (isinstance(var, Constant) and var.ndim >= 1 and var.type.shape[0] == n):
        return None
    column = var.ndim == 2 and var.type.shape[1] == 1
    for row in row_vars:
        if not isinstance(row, Constant) or row.dtype != var.dtype:
            continue
        if row.type == var.type and np.array_equal(row.data, var.data):
            return row
        if column and row.ndim == 1 and np.array_equal(row.data, var.data[:, 0]):
            return row
    return None


def row_batch(var: Variable, twin: Variable, batch: Variable) -> Variable:
    """The batch of ``twin`` (a row variable) in the shape of ``var``, which stands for it."""
    return batch[:, None] if var.ndim == twin.ndim + 1 else batch


class _Walker:
    """Decomposes graphs given which variables are θ and which are per-row data."""

    def __init__(self, theta_vars: Sequence[Variable], row_vars: Sequence[Variable]) -> None:
        self.theta_vars = set(theta_vars)
        self.row_list = list(row_vars)
        self.n = _n_rows(self.row_list)
        self.row_vars = {v for v in self.row_list}
        self._theta: dict[Variable, bool] = {}
        self._rows: dict[Variable, bool] = {}

    def _flags(self, var: Variable) -> tuple[bool, bool]:
        if var not in self._theta:
            inputs = [v for v in ancestors([var]) if v.owner is None]
            for node in io_toposort(inputs, [var]):
                for out in node.outputs:
                    self._theta[out] = any(self._flag(i, self._theta, self.theta_vars)
                                           for i in node.inputs)
                    self._rows[out] = any(self._flag(i, self._rows, None)
                                          for i in node.inputs)
            if var.owner is None:
                self._theta[var] = var in self.theta_vars
                self._rows[var] = self._flag(var, self._rows, None)
        return self._theta[var], self._rows[var]

    def _flag(self, var: Variable, memo: dict[Variable, bool],
              roots: set[Variable] | None) -> bool:
        if var.owner is None:
            if roots is None:
                return _row_twin(var, self.row_list, self.n) is not None
            return var in roots
        return memo.get(var, False)

    def depends_on_theta(self, var: Variable) -> bool:
        return self._flags(var)[0]

    def per_row(self, var: Variable) -> bool:
        return self._flags(var)[1]

    # ----------------------------------------------------------------- algebra
    @staticmethod
    def _add(a: Linear, b: Linear) -> Linear:
        if a.offset is None:
            offset = b.offset
        elif b.offset is None:
            offset = a.offset
        else:
            offset = a.offset + b.offset
        return Linear(a.terms + b.terms, offset)

    @staticmethod
    def _negate(lin: Linear) -> Linear:
        terms = [Term(t.kind, -t.coef, t.feature, t.index) for t in lin.terms]
        return Linear(terms, None if lin.offset is None else -lin.offset)

    @staticmethod
    def _scale_theta(lin: Linear, s: Variable) -> Linear:
        """Multiply by a θ-only scalar: coefficients change; a data offset becomes a term."""
        terms = [Term(t.kind, t.coef * s, t.feature, t.index) for t in lin.terms]
        if lin.offset is not None:
            terms.append(Term("dense", s, lin.offset))
        return Linear(terms, None)

    @staticmethod
    def _scale_data(lin: Linear, f: Variable) -> Linear:
        """Multiply by data (a per-row vector or a scalar): features change."""
        terms = []
        for t in lin.terms:
            if t.feature is None:
                feature = f
            elif t.kind == "dense" and t.feature.ndim == 2:
                feature = t.feature * (f[:, None] if f.ndim == 1 else f)
            else:
                feature = t.feature * f
            terms.append(Term(t.kind, t.coef, feature, t.index))
        return Linear(terms, None if lin.offset is None else lin.offset * f)

    # -------------------------------------------------------------------- walk
    def decompose(self, var: Variable) -> Linear:
        """``var`` as ``Σ features × coefficients + offset`` (raises DecompositionError)."""
        theta, rows = self._flags(var)
        if not theta:
            return Linear([], var)
        if not rows:
            if not _is_scalar_like(var):
                raise DecompositionError(
                    f"{self._describe(var)} depends on the parameters only but is not a "
                    f"scalar (shape {self._shape(var)}): a parameter vector used directly as "
                    "a per-row quantity (e.g. one latent value per row) has no data "
                    "features."
                )
            return Linear([Term("dense", self._theta_coefficient(var))], None)
        node = var.owner
        op = node.op
        if isinstance(op, SpecifyShape | ViewOp):
            return self.decompose(node.inputs[0])
        if isinstance(op, Elemwise):
            return self._elemwise(var)
        if isinstance(op, DimShuffle):
            return self._dimshuffle(var)
        if isinstance(op, ADVANCED_INDEX_OPS):
            return self._index(var)
        if self._is_dot(op):
            return self._dot(node.inputs[0], node.inputs[1], var)
        if isinstance(op, CAReduce) and isinstance(op.scalar_op, Add):
            return self._sum(var)
        raise self._refuse(var)

    @staticmethod
    def _theta_coefficient(var: Variable) -> Variable:
        """A θ-only coefficient; ``log`` of a positive-by-form scale read by :func:`log_form`.

        A negative binomial's ``log a`` with ``a = 1/φ``: ``−v``, not ``log(1/exp(v))``,
        whose derivatives PyTensor does not simplify (the affinity check then sees
        rounding instead of a zero curvature).
        """
        stripped = _strip(var)
        if _is_elemwise(stripped, Log):
            inner = log_form(stripped.owner.inputs[0])
            if inner is not None:
                return inner
        return var

    def _refuse(self, var: Variable, why: str = "") -> DecompositionError:
        return DecompositionError(
            f"{self._describe(var)} depends on both the parameters and the rows through "
            f"{self._op_name(var)}{why}, which is not a sum of data features times "
            "functions of the parameters."
        )

    @staticmethod
    def _op_name(var: Variable) -> str:
        op = var.owner.op
        if isinstance(op, Elemwise):
            return f"the elementwise {type(op.scalar_op).__name__.lower()}"
        return f"{type(op).__name__}"

    @staticmethod
    def _shape(var: Variable) -> tuple[Any, ...]:
        return tuple(var.type.shape)

    @staticmethod
    def _describe(var: Variable) -> str:
        return f"The expression {var.name!r}" if var.name else "An expression"

    @staticmethod
    def _is_dot(op: Any) -> bool:
        if isinstance(op, Dot):
            return True
        return isinstance(op, Blockwise) and isinstance(op.core_op, Dot)

    def _elemwise(self, var: Variable) -> Linear:
        node = var.owner
        scalar_op = node.op.scalar_op
        inputs = node.inputs
        if isinstance(scalar_op, ScalarCast | Identity):
            lin = self.decompose(inputs[0])
            return Linear(lin.terms, lin.offset)
        if isinstance(scalar_op, Add):
            out = Linear()
            for i in inputs:
                out = self._add(out, self.decompose(i))
            return out
        if isinstance(scalar_op, Sub):
            return self._add(self.decompose(inputs[0]), self._negate(self.decompose(inputs[1])))
        if isinstance(scalar_op, Neg):
            return self._negate(self.decompose(inputs[0]))
        if isinstance(scalar_op, Log) and _is_elemwise(_strip(inputs[0]), Exp):
            # log(exp(u)) = u: a negative binomial's p = sigmoid(log a − log μ), μ = exp(η).
            return self.decompose(_strip(inputs[0]).owner.inputs[0])
        if isinstance(scalar_op, Mul):
            return self._mul(var, list(inputs))
        if isinstance(scalar_op, TrueDiv):
            num, den = inputs
            if self.depends_on_theta(den) and self.per_row(den):
                raise self._refuse(var, " (a denominator that depends on θ and the rows)")
            lin = self.decompose(num)
            if self.depends_on_theta(den):
                if not _is_scalar_like(den):
                    raise self._refuse(var, " (a non-scalar θ-dependent denominator)")
                return self._scale_theta(lin, 1.0 / _strip(den))
            return self._scale_data(lin, 1.0 / self._data_factor(den))
        raise self._refuse(var)

    def _data_factor(self, var: Variable) -> Variable:
        """A data factor as a scalar or a per-row vector (broadcasting wrappers removed)."""
        var = _strip(var) if _is_scalar_like(var) else var
        if var.ndim > 1:
            if var.ndim == 2 and var.type.broadcastable[1]:
                return var[:, 0]
            raise DecompositionError(
                f"A data factor of shape {self._shape(var)} multiplies a per-row quantity; "
                "only per-row vectors and scalars are supported."
            )
        return var

    def _mul(self, var: Variable, inputs: list[Variable]) -> Linear:
        mixed = [i for i in inputs if self.depends_on_theta(i) and self.per_row(i)]
        theta_only = [i for i in inputs if self.depends_on_theta(i) and not self.per_row(i)]
        data = [i for i in inputs if not self.depends_on_theta(i)]
        if len(mixed) > 1:
            raise self._refuse(var, " (a product of two parts that both depend on θ and "
                               "the rows)")
        for t in theta_only:
            if not _is_scalar_like(t):
                raise self._refuse(var, f" (a θ-dependent factor of shape {self._shape(t)})")
        if mixed:
            lin = self.decompose(mixed[0])
        else:  # θ-only scalars times per-row data: one column feature
            s = _strip(theta_only[0])
            for t in theta_only[1:]:
                s = s * _strip(t)
            theta_only = []
            lin = Linear([Term("dense", s)], None)
        for t in theta_only:
            lin = self._scale_theta(lin, _strip(t))
        for d in data:
            lin = self._scale_data(lin, self._data_factor(d))
        return lin

    def _dimshuffle(self, var: Variable) -> Linear:
        op = var.owner.op
        (inp,) = var.owner.inputs
        order = tuple(op.new_order)
        if order == tuple(range(inp.ndim)):
            return self.decompose(inp)
        # (N, 1) -> (N,): the column of a matrix-vector product written as X @ w[:, None].
        if inp.ndim == 2 and order == (0,) and inp.type.broadcastable[1] and inp.owner:
            if self._is_dot(inp.owner.op):
                x, w = inp.owner.inputs
                if w.ndim == 2 and w.type.broadcastable[1]:
                    if w.owner is not None and isinstance(w.owner.op, DimShuffle) and \
                            w.owner.inputs[0].ndim == 1:
                        return self._dot(x, w.owner.inputs[0], var)
                    return self._dot(x, w[:, 0], var)
        raise self._refuse(var)

    def _dot(self, x: Variable, w: Variable, var: Variable) -> Linear:
        """``X @ w(θ)``: X per-row data ``(N, K)``, w of θ only ``(K,)``."""
        if self.depends_on_theta(x) or self.per_row(w):
            raise self._refuse(var, " (the data must be the left factor: X @ w(θ))")
        if x.ndim != 2 or w.ndim != 1:
            raise self._refuse(var, f" (shapes {self._shape(x)} @ {self._shape(w)})")
        return Linear([Term("dense", w, x)], None)

    def _sum(self, var: Variable) -> Linear:
        """``sum(X * w(θ), axis=1)`` with X per-row data (N, K) and w of θ only (K,)."""
        op = var.owner.op
        (inp,) = var.owner.inputs
        axis = tuple(op.axis) if op.axis is not None else tuple(range(inp.ndim))
        if inp.ndim != 2 or axis != (1,) or inp.owner is None:
            raise self._refuse(var)
        if not (isinstance(inp.owner.op, Elemwise)
                and isinstance(inp.owner.op.scalar_op, Mul)
                and len(inp.owner.inputs) == 2):
            raise self._refuse(var)
        a, b = inp.owner.inputs
        if self.depends_on_theta(a):
            a, b = b, a
        if self.depends_on_theta(a) or self.per_row(b) or a.ndim != 2:
            raise self._refuse(var)
        if b.ndim == 2 and b.type.broadcastable[0]:
            b = b[0]
        if b.ndim != 1:
            raise self._refuse(var)
        return Linear([Term("dense", b, a)], None)

    def _index(self, var: Variable) -> Linear:
        """``v(θ)[idx]``, and a column or row of a matrix: ``M(θ)[idx, k]`` or ``M(θ)[k, idx]``.

        ``k`` is a scalar integer of neither θ nor the rows (an LKJ model's correlated
        intercepts and slopes, ``effects[g, 0] + effects[g, 1] * x``): the term indexes
        the vector ``M[:, k]`` (or ``M[k, :]``) by ``idx``.
        """
        node = var.owner
        if len(node.inputs) == 3 and var.ndim == 1:
            return self._matrix_index(var)
        if len(node.inputs) != 2:
            raise self._refuse(var, " (only v[idx] and M[idx, k] with an integer index "
                               "are supported)")
        v, idx = node.inputs
        self._check_index(var, idx)
        if self.per_row(v) or v.ndim != 1:
            raise self._refuse(var, " (the indexed vector must depend on the parameters "
                               "only and be 1-d)")
        return Linear([Term("index", v, None, idx)], None)

    def _check_index(self, var: Variable, idx: Variable) -> None:
        if self.depends_on_theta(idx) or not self.per_row(idx):
            raise self._refuse(var, " (the index must be per-row data)")
        if idx.ndim != 1 or idx.dtype[:3] not in ("int", "uin"):
            raise self._refuse(var, " (the index must be a 1-d integer array)")

    def _matrix_index(self, var: Variable) -> Linear:
        m, first, second = var.owner.inputs
        rows_first = self.per_row(first)
        idx, k = (first, second) if rows_first else (second, first)
        self._check_index(var, idx)
        if (self.per_row(m) or m.ndim != 2 or k.ndim != 0 or self.depends_on_theta(k)
                or self.per_row(k) or k.dtype[:3] not in ("int", "uin")):
            raise self._refuse(var, " (M[idx, k] needs a matrix M of the parameters only, "
                               "per-row integers idx and a fixed integer k)")
        return Linear([Term("index", m[:, k] if rows_first else m[k, :], None, idx)], None)
