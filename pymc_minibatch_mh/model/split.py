"""Graph surgery: a PyMC model's likelihood as per-row functions of row batches.

The model's observed variables must share a leading observation dimension of length N.
:func:`split_model` rewrites their elementwise log-likelihood graphs once so that the
observed data and every covariate of length N (``pm.Data`` or NumPy constants) become
symbolic *row batches* (inputs with a free leading length), the observation dimension's
length becomes the batch length (arrays allocated with N rows, such as a baseline column
``pt.zeros((X.shape[0], 1))``, too), the sampled variables are read from one flat float64
vector and all other free variables from shared variables set at each step. The compiled
functions (:mod:`~pymc_minibatch_mh.model.likelihood`) then take the rows themselves,
handed out by the row store (:mod:`~pymc_minibatch_mh.store.row_store`), the only owner of
the data: whatever ``pm.set_data`` put in the model is what the store reads at each chain
start.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pymc as pm
import pytensor.tensor as pt
from pymc.pytensorf import make_shared_replacements
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Variable
from pytensor.graph.traversal import graph_inputs

from pymc_minibatch_mh.model.checks import (
    check_observed,
    check_potentials,
    check_terms_split,
    check_variables,
    observed_length,
)
from pymc_minibatch_mh.model.graph import (
    clone_replace,
    is_data,
    leading_length,
    observed_source,
    reference_graph,
    shape_constant_replacements,
)
from pymc_minibatch_mh.model.pointmap import PointMap

__all__ = ["LikelihoodGraphs", "ModelSplit", "split_model"]


@dataclass(frozen=True)
class LikelihoodGraphs:
    """The symbolic graphs behind the compiled per-row functions.

    Inputs: ``flat`` (one state), ``x_cur``/``x_prop`` (a pair of states), ``data`` (one
    symbolic row batch per per-row data array, in the row store's order) and
    ``inv_temperature`` (0-d). Outputs: ``row_loglik`` (the untempered per-row
    log-likelihood at ``flat`` on the batch), ``prior`` (log prior with Jacobians and
    Potentials at ``flat``), ``ratios`` (the tempered ``l_i`` of the pair on the batch) and
    ``prior_delta`` (the data-free part of the pair). PyMC's parameter checks are still in
    these graphs; :func:`~pymc_minibatch_mh.model.graph.checks_as_ninf` turns them into
    ``-inf``.
    """

    flat: Variable
    data: tuple[Variable, ...]
    row_loglik: Variable
    prior: Variable
    x_cur: Variable
    x_prop: Variable
    inv_temperature: Variable
    ratios: Variable
    prior_delta: Variable
    full_loglik: Variable


@dataclass(frozen=True)
class ModelSplit:
    """What :func:`split_model` finds in a model.

    Attributes
    ----------
    graphs : LikelihoodGraphs
        The symbolic per-row graphs.
    row_vars : tuple of Variable
        The model's per-row data (observed data and covariates of length N, as shared
        variables or constants), one per entry of ``graphs.data``: the row store reads
        their current values.
    observed_names : tuple of str
        Names of the observed variables.
    other_shared : dict
        Shared variables standing for the free variables the step does not sample.
    point_map : PointMap
        The flat vector of the sampled variables.
    n_rows : int
        N when the step was built.

    """

    graphs: LikelihoodGraphs
    row_vars: tuple[Variable, ...]
    observed_names: tuple[str, ...]
    other_shared: dict[str, SharedVariable]
    point_map: PointMap
    n_rows: int


def _per_row(graphs: Sequence[Variable]) -> Variable:
    total = None
    for g in graphs:
        g = g if g.ndim <= 1 else g.reshape((g.shape[0], -1)).sum(axis=1)
        total = g if total is None else total + g
    return pt.as_tensor(total).astype("float64")


def split_model(
    model: pm.Model,
    value_vars: Sequence[Variable],
    point: Mapping[str, Any],
    step_name: str,
    *,
    allow_discrete: bool = False,
) -> ModelSplit:
    """Check a model and rewrite its likelihood as per-row graphs of row batches.

    Parameters
    ----------
    model : pymc.Model
        The model.
    value_vars : sequence of Variable
        The value variables the step samples.
    point : dict
        A point for shapes and dtypes.
    step_name : str
        Used in error messages.
    allow_discrete : bool, optional
        Accept discrete sampled variables (read from the flat float64 vector and cast
        back to their integer dtype); only the discrete step methods set it.

    Returns
    -------
    ModelSplit
        The graphs and what they are made of.

    Raises
    ------
    ModelNotSupportedError
        With a message saying what is wrong and what to do, for: discrete sampled
        variables, no observed variable, ``pm.Minibatch``/``total_size``, imputed missing
        values, a likelihood term that cannot be split per observation, observed
        variables of disagreeing lengths, Potentials that use the data.

    """
    check_variables(value_vars, step_name, allow_discrete=allow_discrete)
    observed = list(model.observed_RVs)
    check_observed(model, observed, step_name)
    # One call for the observed terms and the prior's (each call rewrites the model's
    # graph, 10–20 ms on the zoo's families): PyMC keeps the order of ``vars``.
    prior_terms = list(model.free_RVs) + list(model.potentials)
    all_terms = model.logp(vars=observed + prior_terms, sum=False, jacobian=True)
    terms, prior_factors = list(all_terms[: len(observed)]), all_terms[len(observed):]
    check_terms_split(model, observed, terms)
    observed_names = tuple(rv.name for rv in observed)
    observed_data = tuple(observed_source(model.rvs_to_values[rv]) for rv in observed)
    n = observed_length(observed_names, observed_data)

    # Every length-N data array becomes a row batch; the observation dimension's length
    # (RV sizes, dim lengths, arrays allocated with N rows) becomes the batch length.
    row_vars: list[Variable] = []
    batches: list[Variable] = []
    for var in graph_inputs(terms):
        if is_data(var) and leading_length(var) == n:
            row_vars.append(var)
            batches.append(
                pt.tensor(
                    name=f"{var.name or 'data'}_rows", dtype=var.dtype,
                    shape=(None, *var.type.shape[1:]),
                )
            )
    n_batch = batches[0].shape[0]
    replacements: dict[Variable, Variable] = dict(zip(row_vars, batches, strict=True))
    replacements.update(shape_constant_replacements(graph_inputs(terms), n, n_batch))
    for rv in observed:
        dims = model.named_vars_to_dims.get(rv.name)
        if dims:
            length = model.dim_lengths.get(dims[0])
            if isinstance(length, SharedVariable) and int(length.get_value()) == n:
                replacements[length] = pt.cast(n_batch, length.dtype)

    # Sampled variables come from a flat vector; the other free variables from shared
    # variables set from the point at each step.
    point_map = PointMap([v.name for v in value_vars], point)
    flat = pt.vector("x", dtype="float64")
    value_repl: dict[Variable, Variable] = {}
    for var, e in zip(value_vars, point_map.entries, strict=True):
        value_repl[var] = flat[e.start : e.start + e.size].reshape(e.shape).astype(var.dtype)
    other_repl = make_shared_replacements(point, list(value_vars), model)
    other_shared = {var.name: shared for var, shared in other_repl.items()}

    sliced = clone_replace(list(terms), replacements, rows=(n, n_batch))
    row_loglik = _per_row(clone_replace(sliced, {**value_repl, **other_repl}))
    full_loglik = _per_row(
        reference_graph(clone_replace(list(terms), {**value_repl, **other_repl}), row_vars)
    )

    # Data-free part: priors with Jacobians, and Potentials.
    if prior_factors:
        check_potentials(model, replacements, n)
        sums = [pt.as_tensor(f).sum() for f in prior_factors]
        prior = clone_replace(sums[0] if len(sums) == 1 else pt.add(*sums),
                              {**value_repl, **other_repl})
    else:
        prior = pt.constant(0.0, dtype="float64")
    prior = pt.as_tensor(prior).astype("float64")

    x_cur = pt.vector("x_cur", dtype="float64")
    x_prop = pt.vector("x_prop", dtype="float64")
    inv_temperature = pt.scalar("inv_temperature", dtype="float64")
    lik_prop = clone_replace(row_loglik, {flat: x_prop})
    lik_cur = clone_replace(row_loglik, {flat: x_cur})
    ratios = (lik_prop - lik_cur) * inv_temperature
    prior_delta = clone_replace(prior, {flat: x_prop}) - clone_replace(prior, {flat: x_cur})
    graphs = LikelihoodGraphs(
        flat=flat, data=tuple(batches), row_loglik=row_loglik, prior=prior, x_cur=x_cur,
        x_prop=x_prop, inv_temperature=inv_temperature, ratios=ratios,
        prior_delta=prior_delta, full_loglik=full_loglik,
    )
    return ModelSplit(
        graphs=graphs, row_vars=tuple(row_vars), observed_names=observed_names,
        other_shared=other_shared, point_map=point_map,
        n_rows=n,
    )
