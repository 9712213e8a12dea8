r"""Graph analysis for control variates in per-row quantities ("linear predictors").

A generalised linear model's rows see the parameters θ only through a few per-row
quantities: ``pm.Bernoulli(logit_p=η)``, ``pm.Poisson(mu=exp(η))``,
``pm.Normal(mu=η, sigma=s)``. :func:`analyse` finds them and writes each one as

.. math::

    q_i(θ) = \sum_k F_{ik}\, c_k(θ) + o_i,

with per-row *data* features ``F`` (a design matrix, a covariate, the one-hot encoding of
a per-row integer index, a constant 1) and coefficients ``c(θ)`` that are any function
of θ alone (``mu + exp(log_tau) * z`` is the coefficient vector of the one-hot features
of ``(mu + tau * z)[group]``). The estimator that expands each row's log-likelihood to
second order in these quantities is
:mod:`~pymc_minibatch_mh.adapter.control_variate_glm`.

What is found, for every observed variable (a univariate PyMC ``RandomVariable`` with one
value per row):

- **Quantities.** Each distribution parameter that depends on the sampled variables. A
  final elementwise link (``sigmoid``, ``exp``, ``softplus``) is peeled, so the quantity
  is η itself (PyMC stores ``p = sigmoid(η)`` as the Bernoulli's parameter; the expansion
  in η is far better than in p). Parameters that depend on θ alone (``sigma``) are
  quantities with one constant feature (``exp`` peeled: the expansion is in ``log σ``).
  Parameters of data only stay as they are.
- **Decomposition.** The graph of η is walked from the top: ``+``, ``−``, unary ``−``;
  ``×`` of a sum of terms by factors of θ alone (scalars) and by per-row data; ``/`` by
  either; ``v(θ)[idx]`` with ``idx`` per-row integer data (``AdvancedSubtensor``);
  ``dot(X, w(θ))`` and ``X @ w(θ)``; ``sum(X * w(θ), axis=1)``; casts and broadcasting
  wrappers. Parts of data alone go to the offset ``o`` (never needed numerically). Any
  other operation on a part that depends on both θ and the rows (``exp(b * x)`` inside a
  sum, a product of two such parts, a θ-dependent vector of length N) makes the analysis
  fail with a :class:`DecompositionError` that says where.

Graphs here are the model's own (value variables after ``model.replace_rvs_by_values``,
the model's data variables); :meth:`Predictors.to_rows` rebuilds them on the row batches
and the flat state of :mod:`~pymc_minibatch_mh.adapter.split`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pymc as pm
import pytensor.tensor as pt
from pytensor.graph.basic import Constant, Variable
from pytensor.graph.traversal import ancestors, io_toposort
from pytensor.scalar.basic import Cast as ScalarCast
from pytensor.tensor.blockwise import Blockwise
from pytensor.tensor.elemwise import CAReduce, DimShuffle, Elemwise
from pytensor.tensor.math import Dot
from pytensor.tensor.random.op import RandomVariable
from pytensor.tensor.shape import SpecifyShape
from pytensor.tensor.subtensor import AdvancedSubtensor

try:  # PyTensor 2.x; PyTensor 3 has AdvancedSubtensor only
    from pytensor.tensor.subtensor import AdvancedSubtensor1

    _ADVANCED_INDEX: tuple[type, ...] = (AdvancedSubtensor, AdvancedSubtensor1)
except ImportError:  # pragma: no cover - depends on the installed line
    _ADVANCED_INDEX = (AdvancedSubtensor,)

from pymc_minibatch_mh.adapter.graph import clone_replace, is_shape_constant

__all__ = [
    "LINKS",
    "DecompositionError",
    "Predictors",
    "Quantity",
    "Term",
    "analyse",
    "coefficient_vector",
]

#: Elementwise links peeled from a parameter (scalar Op class name -> the link).
LINKS: dict[str, Callable[[Any], Any]] = {
    "Sigmoid": pt.sigmoid,
    "Exp": pt.exp,
    "Softplus": pt.softplus,
}

#: Largest number of coefficients (features) accepted: the closed form needs a K × K
#: matrix, and every step evaluates it.
MAX_FEATURES = 4096


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


@dataclass(frozen=True)
class Quantity:
    """A per-row quantity of an observed variable and its decomposition.

    Attributes
    ----------
    observed : str
        Name of the observed variable.
    position : int
        Position of the parameter among the distribution's parameters.
    param : Variable
        The parameter as the random variable's input (model graph, with random
        variables).
    link : str or None
        Name of the peeled link (a key of :data:`LINKS`), or None.
    eta : Variable
        The quantity (value-variable graph): ``param = link(eta)`` up to broadcasting.
    terms : tuple of Term
        ``eta = Σ_k F_k c_k(θ) + offset``.

    """

    observed: str
    position: int
    param: Variable
    link: str | None
    eta: Variable
    terms: tuple[Term, ...]


# ---------------------------------------------------------------------------- walk
def _is_scalar_like(var: Variable) -> bool:
    return all(var.type.broadcastable)


def _strip(var: Variable) -> Variable:
    """Remove wrappers that change nothing per row: casts, SpecifyShape, broadcasting."""
    while var.owner is not None:
        op = var.owner.op
        if isinstance(op, SpecifyShape):
            var = var.owner.inputs[0]
        elif isinstance(op, Elemwise) and isinstance(op.scalar_op, ScalarCast):
            var = var.owner.inputs[0]
        elif isinstance(op, DimShuffle) and _is_scalar_like(var.owner.inputs[0]):
            var = var.owner.inputs[0]
        else:
            break
    return var


def _n_rows(row_vars: Sequence[Variable]) -> int:
    var = row_vars[0]
    value = var.get_value(borrow=True) if hasattr(var, "get_value") else var.data
    return int(np.shape(value)[0])


def _row_twin(var: Variable, row_vars: Sequence[Variable], n: int) -> Variable | None:
    """The row variable ``var`` stands for: itself, or an equal constant.

    PyTensor may merge equal constants in the log-probability graph that the row store
    was built from, so a model graph can hold a constant (a covariate written twice as
    NumPy) that is not one of the row store's variables but equals one.
    """
    if var in row_vars:
        return var
    if not (isinstance(var, Constant) and var.ndim >= 1 and var.type.shape[0] == n):
        return None
    for row in row_vars:
        if isinstance(row, Constant) and row.type == var.type and np.array_equal(
            row.data, var.data
        ):
            return row
    return None


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
            return Linear([Term("dense", var)], None)
        node = var.owner
        op = node.op
        if isinstance(op, SpecifyShape):
            return self.decompose(node.inputs[0])
        if isinstance(op, Elemwise):
            return self._elemwise(var)
        if isinstance(op, DimShuffle):
            return self._dimshuffle(var)
        if isinstance(op, _ADVANCED_INDEX):
            return self._index(var)
        if self._is_dot(op):
            return self._dot(node.inputs[0], node.inputs[1], var)
        if isinstance(op, CAReduce) and type(op.scalar_op).__name__ == "Add":
            return self._sum(var)
        raise self._refuse(var)

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
        name = type(node.op.scalar_op).__name__
        inputs = node.inputs
        if isinstance(node.op.scalar_op, ScalarCast) or name == "Identity":
            lin = self.decompose(inputs[0])
            return Linear(lin.terms, lin.offset)
        if name == "Add":
            out = Linear()
            for i in inputs:
                out = self._add(out, self.decompose(i))
            return out
        if name == "Sub":
            return self._add(self.decompose(inputs[0]), self._negate(self.decompose(inputs[1])))
        if name == "Neg":
            return self._negate(self.decompose(inputs[0]))
        if name == "Mul":
            return self._mul(var, list(inputs))
        if name == "TrueDiv":
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
                and type(inp.owner.op.scalar_op).__name__ == "Mul"
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
        node = var.owner
        if len(node.inputs) != 2:
            raise self._refuse(var, " (only v[idx] with one integer index is supported)")
        v, idx = node.inputs
        if self.depends_on_theta(idx) or not self.per_row(idx):
            raise self._refuse(var, " (the index must be per-row data)")
        if self.per_row(v) or v.ndim != 1:
            raise self._refuse(var, " (the indexed vector must depend on the parameters "
                               "only and be 1-d)")
        if idx.ndim != 1 or idx.dtype[:3] not in ("int", "uin"):
            raise self._refuse(var, " (the index must be a 1-d integer array)")
        return Linear([Term("index", v, None, idx)], None)


# --------------------------------------------------------------------- the model
@dataclass(frozen=True)
class Predictors:
    """The per-row quantities of a model's likelihood and their decompositions.

    Attributes
    ----------
    quantities : tuple of Quantity
        All quantities, over all observed variables.
    observed : tuple
        ``(rv, value, params)`` per observed variable, ``params`` the distribution's
        parameters with the index of their quantity (None for data parameters).

    """

    quantities: tuple[Quantity, ...]
    observed: tuple[tuple[Variable, Variable, tuple[tuple[Variable, int | None], ...]], ...]

    def loglik(self, q: Sequence[Variable]) -> Variable:
        """The per-row log-likelihood as a graph of quantity vectors ``q`` (model graph)."""
        total = None
        for rv, value, params in self.observed:
            repl = {}
            for param, k in params:
                if k is not None:
                    link = self.quantities[k].link
                    repl[param] = LINKS[link](q[k]) if link else q[k]
            logp = pm.logp(rv, value)
            logp = clone_replace(logp, repl)
            total = logp if total is None else total + logp
        return pt.as_tensor(total).astype("float64")

    def to_rows(self, graphs: Any, row_vars: Sequence[Variable], value_repl: dict,
                outputs: Any) -> Any:
        """Rebuild model graphs on row batches and the flat state (as split_model does)."""
        n_batch = graphs.data[0].shape[0]
        row_vars = list(row_vars)
        batches = dict(zip(row_vars, graphs.data, strict=True))
        repl: dict[Variable, Variable] = dict(batches)
        n = _n_rows(row_vars)
        single = isinstance(outputs, Variable)
        outs = [outputs] if single else list(outputs)
        for var in ancestors(outs):
            if var.owner is not None or var in repl:
                continue
            twin = _row_twin(var, row_vars, n)
            if twin is not None:
                repl[var] = batches[twin]
            elif isinstance(var, Constant) and is_shape_constant(var, n):
                rest = pt.as_tensor(var.data[1:].astype(var.dtype))
                repl[var] = pt.concatenate([pt.cast(n_batch, var.dtype)[None], rest])
        repl.update(value_repl)
        result = clone_replace(outs, repl)
        return result[0] if single else result


def _peel(param: Variable) -> tuple[str | None, Variable]:
    var = _strip(param)
    if (var.owner is not None and isinstance(var.owner.op, Elemwise)
            and type(var.owner.op.scalar_op).__name__ in LINKS):
        return type(var.owner.op.scalar_op).__name__, _strip(var.owner.inputs[0])
    return None, var


def _check_terms(quantity_name: str, lin: Linear) -> tuple[Term, ...]:
    if not lin.terms:
        raise DecompositionError(f"{quantity_name} has no term that depends on θ.")
    for t in lin.terms:
        if t.kind == "dense" and t.feature is not None and t.feature.ndim == 2:
            if t.coef.ndim != 1:
                raise DecompositionError(f"{quantity_name}: a matrix feature needs a "
                                         "coefficient vector.")
        elif t.kind == "dense" and not _is_scalar_like(t.coef):
            raise DecompositionError(f"{quantity_name}: a column feature with a "
                                     "non-scalar coefficient.")
        if t.feature is not None and t.feature.ndim > 2:
            raise DecompositionError(f"{quantity_name}: a feature of more than 2 dims.")
    return tuple(lin.terms)


def analyse(model: pm.Model, value_vars: Sequence[Variable],
            row_vars: Sequence[Variable]) -> Predictors:
    """Find the per-row quantities of a model's likelihood and decompose them.

    Parameters
    ----------
    model : pymc.Model
        The model.
    value_vars : sequence of Variable
        The value variables the step samples (θ).
    row_vars : sequence of Variable
        The per-row data variables (the row store's).

    Returns
    -------
    Predictors
        The quantities and their decompositions.

    Raises
    ------
    DecompositionError
        With the reason, when any observed variable's likelihood is not of that form.

    """
    walker = _Walker(value_vars, row_vars)
    quantities: list[Quantity] = []
    observed = []
    n_rows = walker.n
    for rv in model.observed_RVs:
        op = rv.owner.op
        where = f"observed variable {rv.name!r}"
        if not isinstance(op, RandomVariable):
            raise DecompositionError(
                f"The {where} is a {type(op).__name__}, not a plain distribution: its "
                "log-likelihood is not read from per-row parameters here."
            )
        if op.ndim_supp != 0 or rv.ndim != 1:
            raise DecompositionError(
                f"The {where} is not a univariate variable with one value per row "
                f"(shape {tuple(rv.type.shape)}, support dims {op.ndim_supp})."
            )
        value = model.rvs_to_values[rv]
        params = list(op.dist_params(rv.owner))
        replaced = model.replace_rvs_by_values(params)
        entries = []
        for position, (param, graph) in enumerate(zip(params, replaced, strict=True)):
            foreign = [v for v in ancestors([graph])
                       if v in model.value_vars and v not in walker.theta_vars]
            if foreign:
                raise DecompositionError(
                    f"Parameter {position} of the {where} depends on "
                    f"{[v.name for v in foreign]}, which this step does not sample."
                )
            if not walker.depends_on_theta(graph):
                if any(v in model.free_RVs for v in ancestors([param])):
                    raise DecompositionError(
                        f"Parameter {position} of the {where} depends on free variables "
                        "this step does not sample."
                    )
                entries.append((param, None))
                continue
            if graph.ndim > 1 or (graph.ndim == 1 and not graph.type.broadcastable[0]
                                  and graph.type.shape[0] not in (None, n_rows)):
                raise DecompositionError(
                    f"Parameter {position} of the {where} has shape "
                    f"{tuple(graph.type.shape)}, not one value per row."
                )
            link, eta = _peel(graph)
            try:
                lin = walker.decompose(eta)
            except DecompositionError as err:
                raise DecompositionError(f"Parameter {position} of the {where}: {err}") from None
            terms = _check_terms(f"Parameter {position} of the {where}", lin)
            entries.append((param, len(quantities)))
            quantities.append(Quantity(rv.name, position, param, link, eta, terms))
        observed.append((rv, value, tuple(entries)))
    if not quantities:
        raise DecompositionError("No distribution parameter depends on the parameters.")
    return Predictors(tuple(quantities), tuple(observed))


def coefficient_vector(predictors: Predictors) -> Variable:
    """All coefficients, flattened and concatenated (model graph of the value variables)."""
    parts = [pt.as_tensor(t.coef).astype("float64").flatten()
             for q in predictors.quantities for t in q.terms]
    return parts[0] if len(parts) == 1 else pt.concatenate(parts)

