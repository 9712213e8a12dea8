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
:mod:`~pymc_minibatch_mh.estimators.predictor_taylor`.

What is found, for every observed variable (a univariate PyMC ``RandomVariable`` with one
value per row):

- **Quantities.** Each distribution parameter that depends on the sampled variables. A
  final elementwise link (``sigmoid``, ``exp``, ``softplus``) is peeled, so the quantity
  is η itself (PyMC stores ``p = sigmoid(η)`` as the Bernoulli's parameter; the expansion
  in η is far better than in p). A negative binomial's ``p = a / (μ + a)`` (PyMC 5's
  form of ``mu=μ, alpha=a``) is ``sigmoid(log a − log μ)`` (PyMC 6's form), and peeled so.
  Parameters that depend on θ alone (``sigma``) are quantities with one constant feature (``exp``
  peeled: the expansion is in ``log σ``); so are those positive by their form (``1/φ``,
  ``φ**2``, ``a * b``, ``sqrt(φ)`` of log-transformed scales: their logarithm,
  :func:`~pymc_minibatch_mh.estimators.predictor_walk.log_form`, is affine in the
  unconstrained values as a scale's is, so a GLM is one whatever the form of its
  dispersion). Parameters of data only stay as they are.
- **Decomposition.** The graph of η is walked from the top: ``+``, ``−``, unary ``−``;
  ``×`` of a sum of terms by factors of θ alone (scalars) and by per-row data; ``/`` by
  either; ``v(θ)[idx]`` with ``idx`` per-row integer data (``AdvancedSubtensor``), and
  a column or row of a matrix, ``M(θ)[idx, k]`` or ``M(θ)[k, idx]`` with a fixed integer
  ``k`` (LKJ-correlated intercepts and slopes, ``effects[g, 0] + effects[g, 1] * x``);
  ``dot(X, w(θ))`` and ``X @ w(θ)``; ``sum(X * w(θ), axis=1)``; ``log(exp(u))`` as ``u``
  (that negative binomial's ``log μ`` with ``μ = exp(η)``); casts
  and broadcasting wrappers. Parts of data alone go to the offset ``o`` (never needed numerically).
  Any other operation on a part that depends on both θ and the rows (``exp(b * x)`` inside a
  sum, a product of two such parts, a θ-dependent vector of length N) makes the analysis
  fail with a :class:`~pymc_minibatch_mh.estimators.predictor_walk.DecompositionError`
  that says where.

Graphs here are the model's own (value variables after ``model.replace_rvs_by_values``,
the model's data variables); :meth:`Predictors.to_rows` rebuilds them on the row batches
and the flat state of :mod:`~pymc_minibatch_mh.model.split`.
The walk itself is :mod:`~pymc_minibatch_mh.estimators.predictor_walk`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pymc as pm
import pytensor.tensor as pt
from pytensor.graph.basic import Constant, Variable
from pytensor.graph.traversal import ancestors
from pytensor.scalar.basic import EQ, Add, Exp, Switch, TrueDiv
from pytensor.scalar.math import Sigmoid, Softplus
from pytensor.tensor.random.op import RandomVariable

from pymc_minibatch_mh.estimators.predictor_walk import (
    DecompositionError,
    Linear,
    Term,
    _is_elemwise,
    _is_scalar_like,
    _n_rows,
    _row_twin,
    _strip,
    _Walker,
    log_form,
    row_batch,
)
from pymc_minibatch_mh.model.graph import clone_replace, shape_constant_replacements

__all__ = [
    "LINKS",
    "DecompositionError",
    "Predictors",
    "Quantity",
    "Term",
    "analyse",
    "coefficient_vector",
]

#: Elementwise links peeled from a parameter: name -> (the scalar Op class that
#: recognises it, the link as a function of the quantity).
LINKS: dict[str, tuple[type, Callable[[Any], Any]]] = {
    "Sigmoid": (Sigmoid, pt.sigmoid),
    "Exp": (Exp, pt.exp),
    "Softplus": (Softplus, pt.softplus),
}

#: Largest number of coefficients (features) accepted: the closed form needs a K × K
#: matrix, and every step evaluates it.
MAX_FEATURES = 4096


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
                    repl[param] = LINKS[link][1](q[k]) if link else q[k]
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
        inputs = [var for var in ancestors(outs) if var.owner is None and var not in repl]
        for var in inputs:
            twin = _row_twin(var, row_vars, n)
            if twin is not None:
                repl[var] = row_batch(var, twin, batches[twin])
            elif _is_row_constant(var, n):
                repl[var] = _first_row(var)
        repl.update(shape_constant_replacements(
            [var for var in inputs if var not in repl], n, n_batch))
        repl.update(value_repl)
        result = clone_replace(outs, repl, rows=(n, n_batch))
        return result[0] if single else result


def _is_row_constant(var: Variable, n: int) -> bool:
    """Whether ``var`` is a constant with one entry per row, the same in every row.

    bambi multiplies a group effect by a column of its design matrix, a column of ones for
    ``(1|g)``; the column is a constant of the graph, not data of the row store.
    """
    if not (isinstance(var, Constant) and var.ndim >= 1 and var.type.shape[0] == n):
        return False
    data = np.asarray(var.data)
    return bool(n > 0 and np.all(data == data[:1]))


def _first_row(var: Constant) -> Variable:
    """The first row of a constant that is the same in every row, broadcastable in rows."""
    data = np.asarray(var.data)[:1]
    return pt.as_tensor(data, dtype=var.dtype)


def _peel(param: Variable, theta_only: bool = False) -> tuple[str | None, Variable]:
    """The link of a parameter and its quantity.

    ``theta_only``: the parameter depends on θ alone; a positive-by-form one
    (:func:`~pymc_minibatch_mh.estimators.predictor_walk.log_form`: ``1/φ``, ``φ**2``,
    ``a * b`` of log-transformed scales) is ``exp`` of its logarithm, as a scale itself is.
    """
    var = _unclamped(_strip(param))
    for name, (op_class, _) in LINKS.items():
        if _is_elemwise(var, op_class):
            return name, _strip(var.owner.inputs[0])
    odds = _odds_quantity(var)
    if odds is not None:
        return "Sigmoid", odds
    if theta_only and all(var.type.broadcastable):
        log_var = log_form(var)
        if log_var is not None:
            return "Exp", log_var
    return None, var


def _unclamped(var: Variable) -> Variable:
    """``r`` where ``var`` is ``switch(eq(r, c), d, r)`` with constants ``c``, ``d``, repeated.

    bambi's inverse links keep a probability off 0 and 1 this way (``sigmoid(η)`` with
    exact 0 and 1 replaced by machine epsilon and ``1 − eps``): the guard changes the
    value only where the link itself rounds to 0 or 1 (``|η| > 36`` for the logistic),
    and the link under it is peeled as any other.
    """
    while _is_elemwise(var, Switch):
        cond, then, other = (_strip(v) for v in var.owner.inputs)
        if not (_is_elemwise(cond, EQ) and isinstance(then, Constant)):
            break
        left, right = (_strip(v) for v in cond.owner.inputs)
        if not (left is other and isinstance(right, Constant)):
            break
        var = other
    return var


def _odds_quantity(var: Variable) -> Variable | None:
    """``log a − log μ`` where ``var`` is ``a / (μ + a)``, else None.

    That is ``sigmoid(log a − log μ)``, the form PyMC 6 writes itself: PyMC 5's
    ``NegativeBinomial(mu=μ, alpha=a)`` stores its ``p`` as ``a / (μ + a)``. The walk
    reads ``log(exp(η))`` as ``η``, so with ``μ = exp(η)`` the quantity is linear in the
    features of η (``log a`` a coefficient of the constant feature when ``a`` depends on θ
    alone); another ``μ`` is refused there.
    """
    if not _is_elemwise(var, TrueDiv):
        return None
    num, den = (_strip(v) for v in var.owner.inputs)
    if not _is_elemwise(den, Add) or len(den.owner.inputs) != 2:
        return None
    for mu, other in (den.owner.inputs, den.owner.inputs[::-1]):
        if _strip(other) is num:
            return pt.log(num) - pt.log(_strip(mu))
    return None


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
            link, eta = _peel(graph, theta_only=not walker.per_row(graph))
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
