"""Turn a PyMC model into fast per-observation log-likelihood functions of row indices.

The model's observed variables must share a leading observation dimension of length N.
Their elementwise log-likelihood graphs are rewritten once so that the observed data and
every covariate of length N (``pm.Data`` or NumPy constants) are indexed by the same
vector of row indices, the sampled variables are read from one flat float64 vector and
all other free variables from shared variables set at each step. Everything a step needs
is then one call of a function compiled once:

``delta(x_cur, x_prop, rows, inv_temperature) -> (l, cumsum(l − l₀), cumsum((l − l₀)²), c)``
with
``l_i = (1/K) [log p(x_i | θ') − log p(x_i | θ)]``, and the data-free part
``prior_delta(x_cur, x_prop) = log p0(θ') − log p0(θ)`` (priors, Jacobians, Potentials).

No O(N) work is done per step and ``pm.set_data`` is never called; data replaced with
``pm.set_data`` between runs (even with a new N) is picked up at the next chain start.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
from numpy.typing import NDArray
from pymc.logprob.utils import CheckParameterValue
from pymc.pytensorf import make_shared_replacements
from pymc.util import get_value_vars_from_user_vars
from pymc.vartypes import discrete_types
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Constant, Variable
from pytensor.graph.traversal import ancestors, graph_inputs, io_toposort
from pytensor.scalar.basic import Cast as ScalarCast
from pytensor.tensor.elemwise import Elemwise
from pytensor.tensor.shape import SpecifyShape

from pymc_minibatch_mh.adapter.compat import default_mode, direct_call
from pymc_minibatch_mh.adapter.kernel import shuffle_fast
from pymc_minibatch_mh.core.rows import ShuffledRows

__all__ = ["LikelihoodGraphs", "MinibatchLikelihood", "ModelNotSupportedError", "PointMap"]

_FLOAT64 = np.dtype(np.float64)

#: Rows per call when a whole pass over the data is evaluated (bounded memory).
FULL_PASS_CHUNK = 1 << 18


class ModelNotSupportedError(ValueError):
    """The model cannot be sampled by a minibatch step; the message says why and what to do."""


@dataclass(frozen=True)
class _Entry:
    name: str
    shape: tuple[int, ...]
    size: int
    start: int
    dtype: str


class PointMap:
    """Fast map between a PyMC point (dict) and the flat float64 vector of some variables.

    Parameters
    ----------
    names : sequence of str
        Value-variable names, in the order of the flat vector.
    point : dict
        A point giving each variable's shape and dtype.

    """

    def __init__(self, names: Sequence[str], point: Mapping[str, Any]) -> None:
        entries = []
        start = 0
        for name in names:
            value = np.asarray(point[name])
            entries.append(_Entry(name, value.shape, value.size, start, str(value.dtype)))
            start += value.size
        self.entries: tuple[_Entry, ...] = tuple(entries)
        self.size = start
        self._single = len(entries) == 1
        # One float64 vector variable: its value and the flat vector are the same array
        # (to_point stores the vector as is, flat_view reads the value as is).
        self._whole = (
            self._single and entries[0].dtype == "float64" and entries[0].shape == (start,)
        )

    def to_flat(self, point: Mapping[str, Any]) -> NDArray[np.float64]:
        """Flat float64 copy of the variables' values in ``point``."""
        if self._single:
            return np.array(point[self.entries[0].name], dtype=np.float64).reshape(-1)
        return np.concatenate(
            [np.asarray(point[e.name], dtype=np.float64).reshape(-1) for e in self.entries]
        )

    def flat_view(self, point: Mapping[str, Any]) -> NDArray[np.float64]:
        """The flat vector of ``point``'s variables, read only: not copied when it can be.

        For one float64 vector variable held as a contiguous array of the right shape,
        the point's own array (the caller must not modify it); otherwise :meth:`to_flat`.
        Saves the copy (about 1.5 µs) on a hot path that only reads the state.
        """
        if self._whole:
            e = self.entries[0]
            value = point[e.name]
            if (
                type(value) is np.ndarray
                and value.dtype is _FLOAT64
                and value.shape == e.shape
                and value.flags.c_contiguous
            ):
                return value
        return self.to_flat(point)

    def to_point(self, flat: NDArray[np.float64], point: Mapping[str, Any]) -> dict[str, Any]:
        """A new point: ``point`` with the variables replaced by the values in ``flat``.

        The new values may be views of ``flat``, or ``flat`` itself (no copy when the
        dtype is float64), so ``flat`` must not be modified afterwards.
        """
        new = dict(point)
        if self._whole:
            new[self.entries[0].name] = flat  # the vector itself (the common case)
            return new
        for e in self.entries:
            new[e.name] = flat[e.start : e.start + e.size].reshape(e.shape).astype(
                e.dtype, copy=False
            )
        return new


def _observed_source(var: Variable) -> Variable:
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


def _is_data(var: Variable) -> bool:
    return isinstance(var, SharedVariable | Constant) and getattr(var, "ndim", 0) >= 1


def _data_value(var: Variable) -> np.ndarray:
    if isinstance(var, SharedVariable):
        return np.asarray(var.get_value(borrow=True))
    return np.asarray(var.data)


def _op_names(outputs: Sequence[Variable]) -> set[str]:
    return {type(v.owner.op).__name__ for v in ancestors(outputs) if v.owner is not None}


def clone_replace(
    outputs: Any, replace: Mapping[Variable, Variable], rebuild_strict: bool = False
) -> Any:
    """Rebuild ``outputs`` with ``replace`` applied, letting types change, without SpecifyShape.

    Like ``pytensor.graph.replace.clone_replace(..., rebuild_strict=False)``, but every
    ``SpecifyShape`` node is dropped: PyMC's log-probability graphs pin the static length
    of the observed data (N), which no longer holds once the data are indexed by rows.
    Nodes whose inputs are unchanged are reused, not copied.
    """
    single = isinstance(outputs, Variable)
    outs = [outputs] if single else list(outputs)
    memo: dict[Variable, Variable] = dict(replace)
    roots = [v for v in graph_inputs(outs) if v not in memo]
    for node in io_toposort(roots + list(memo), outs):
        new_inputs = [memo.get(i, i) for i in node.inputs]
        if isinstance(node.op, SpecifyShape):
            memo[node.outputs[0]] = new_inputs[0]
            continue
        if all(n is o for n, o in zip(new_inputs, node.inputs, strict=True)):
            continue
        # Calling the Op (not make_node) lets symbolic Ops such as PyTensor 3's LogSumExp
        # rebuild their inner graph for the new input types.
        new_outputs = node.op(*new_inputs, return_list=True)
        for old, new in zip(node.outputs, new_outputs, strict=True):
            memo[old] = new
    result = [memo.get(o, o) for o in outs]
    return result[0] if single else result


def _checks_as_ninf(outputs: Sequence[Variable]) -> list[Variable]:
    """Rebuild ``outputs`` with PyMC's parameter checks turned into ``-inf``, not errors.

    PyMC's log-probability graphs raise ``ParameterValueError`` for invalid parameters
    (``sigma <= 0``, ...); PyMC's own compiled functions (``pymc.pytensorf.compile``) turn
    those checks into a switch to ``-inf`` (the same rewrite, applied here to the graph), so
    such a proposal is rejected instead of stopping the chain with an exception. The graph
    is rebuilt, not rewritten in place: nodes shared with the model are left untouched.
    """
    outs = list(outputs)
    memo: dict[Variable, Variable] = {}
    for node in io_toposort(list(graph_inputs(outs)), outs):
        new_inputs = [memo.get(i, i) for i in node.inputs]
        if isinstance(node.op, CheckParameterValue) and node.op.can_be_replaced_by_ninf:
            expr, *conds = new_inputs
            if all(isinstance(c, Constant) and np.all(c.data) for c in conds):
                memo[node.outputs[0]] = expr  # checks that always pass
                continue
            cond = conds[0] if len(conds) == 1 else pt.all(pt.stack(conds))
            out = pt.switch(cond, expr, -np.inf)
            memo[node.outputs[0]] = out.astype(node.outputs[0].dtype)
            continue
        if all(n is o for n, o in zip(new_inputs, node.inputs, strict=True)):
            continue
        new_outputs = node.op(*new_inputs, return_list=True)
        for old, new in zip(node.outputs, new_outputs, strict=True):
            memo[old] = new
    return [memo.get(o, o) for o in outs]


def _is_shape_constant(var: Constant, n: int) -> bool:
    data = np.asarray(var.data)
    return (
        data.dtype.kind in "iu" and data.ndim == 1 and 1 <= data.size <= 8 and int(data[0]) == n
    )


def _leading_length(var: Variable) -> int | None:
    value = _data_value(var)
    return int(value.shape[0]) if value.ndim >= 1 else None


@dataclass(frozen=True)
class LikelihoodGraphs:
    """The symbolic graphs behind :class:`MinibatchLikelihood`'s compiled functions.

    Inputs: ``flat`` (one state), ``x_cur``/``x_prop`` (a pair of states), ``rows``
    (int64 row indices), ``inv_temperature`` (0-d). Outputs: ``row_loglik`` (the
    untempered per-row log-likelihood at ``flat`` on ``rows``), ``prior`` (log prior with
    Jacobians and Potentials at ``flat``), ``ratios`` (the tempered ``l_i`` of the pair on
    ``rows``) and ``prior_delta`` (the data-free part of the pair). PyMC's parameter
    checks are still in these graphs; ``_checks_as_ninf`` turns them into ``-inf``.
    """

    flat: Variable
    rows: Variable
    row_loglik: Variable
    prior: Variable
    x_cur: Variable
    x_prop: Variable
    inv_temperature: Variable
    ratios: Variable
    prior_delta: Variable


class MinibatchLikelihood:
    """Compiled per-observation log-likelihood of a PyMC model, evaluated on row indices.

    Parameters
    ----------
    model : pymc.Model
        The model; its observed variables must share a leading dimension of length N.
    vars : sequence of Variable
        The variables the step samples (random or value variables).
    initial_point : dict, optional
        Point used for shapes and for the checks; ``model.initial_point()`` by default.
    mode : str or pytensor.compile.Mode, optional
        Compilation mode of the per-step functions (default:
        :func:`~pymc_minibatch_mh.adapter.compat.default_mode`).
    step_name : str
        Used in error messages.

    Raises
    ------
    ModelNotSupportedError
        With a message saying what is wrong and what to do, for: discrete sampled
        variables, no observed variable, ``pm.Minibatch``/``total_size``, imputed missing
        values, a likelihood term that cannot be split per observation, observed
        variables or covariates of disagreeing lengths, Potentials that use the data.

    """

    def __init__(
        self,
        model: pm.Model,
        vars: Sequence[Variable],
        *,
        initial_point: Mapping[str, Any] | None = None,
        mode: Any = None,
        step_name: str = "MinibatchBarker",
    ) -> None:
        self.model = model
        self.step_name = step_name
        self.mode = mode if mode is not None else default_mode()
        point = dict(initial_point) if initial_point is not None else model.initial_point()
        #: The point used for shapes and checks (and as the start of searches).
        self.initial_point: dict[str, Any] = point
        self.value_vars: list[Variable] = get_value_vars_from_user_vars(vars, model)
        self._check_variables()
        observed = list(model.observed_RVs)
        self._check_observed(observed)

        terms = model.logp(vars=observed, sum=False)
        if not isinstance(terms, list | tuple):
            terms = [terms]
        self._check_terms_split(observed, terms)
        self.observed_names = [rv.name for rv in observed]
        self._observed_data = [_observed_source(model.rvs_to_values[rv]) for rv in observed]
        self.n_rows_initial = self._observed_length(self._observed_data)

        # Replace every length-N data array by data[rows], and the observation
        # dimension's length (RV sizes, dim lengths) by the number of rows.
        rows = pt.vector("rows", dtype="int64")
        n_batch = rows.shape[0]
        replacements: dict[Variable, Variable] = {}
        self._row_data: list[SharedVariable] = []
        n = self.n_rows_initial
        for var in graph_inputs(terms):
            if isinstance(var, Constant) and _is_shape_constant(var, n):
                # A static shape (RV size, broadcast shape) whose first entry is N.
                rest = pt.as_tensor(var.data[1:].astype(var.dtype))
                replacements[var] = pt.concatenate([pt.cast(n_batch, var.dtype)[None], rest])
                continue
            if _is_data(var) and _leading_length(var) == n:
                # A NumPy constant keeps its static trailing shape (a column x[:, None]
                # must stay broadcastable), with the leading length left free.
                shared = var if isinstance(var, SharedVariable) else pytensor.shared(
                    _data_value(var),
                    name=(var.name or "data") + "_rows",
                    borrow=True,
                    shape=(None, *var.type.shape[1:]),
                )
                self._row_data.append(shared)
                replacements[var] = shared[rows]
        for rv in observed:
            dims = model.named_vars_to_dims.get(rv.name)
            if dims:
                length = model.dim_lengths.get(dims[0])
                if isinstance(length, SharedVariable) and int(length.get_value()) == n:
                    replacements[length] = pt.cast(n_batch, length.dtype)

        # Sampled variables come from a flat vector; the other free variables from shared
        # variables set from the point at each step.
        self.point_map = PointMap([v.name for v in self.value_vars], point)
        flat = pt.vector("x", dtype="float64")
        value_repl: dict[Variable, Variable] = {}
        for var, e in zip(self.value_vars, self.point_map.entries, strict=True):
            value_repl[var] = flat[e.start : e.start + e.size].reshape(e.shape).astype(var.dtype)
        other_repl = make_shared_replacements(point, self.value_vars, model)
        self.other_shared: dict[str, SharedVariable] = {
            var.name: shared for var, shared in other_repl.items()
        }

        def per_row(graphs: Sequence[Variable]) -> Variable:
            total = None
            for g in graphs:
                g = g if g.ndim <= 1 else g.reshape((g.shape[0], -1)).sum(axis=1)
                total = g if total is None else total + g
            return pt.as_tensor(total).astype("float64")

        sliced = clone_replace(list(terms), {**replacements}, rebuild_strict=False)
        row_loglik = per_row(
            clone_replace(sliced, {**value_repl, **other_repl}, rebuild_strict=False)
        )
        full_loglik = per_row(
            clone_replace(list(terms), {**value_repl, **other_repl}, rebuild_strict=False)
        )

        # Data-free part: priors with Jacobians, and Potentials.
        prior_terms = list(model.free_RVs) + list(model.potentials)
        prior = model.logp(vars=prior_terms, sum=True, jacobian=True) if prior_terms else None
        if prior is not None:
            self._check_potentials(model, replacements)
            prior = clone_replace(prior, {**value_repl, **other_repl}, rebuild_strict=False)
        else:
            prior = pt.constant(0.0, dtype="float64")
        prior = pt.as_tensor(prior).astype("float64")

        x_cur = pt.vector("x_cur", dtype="float64")
        x_prop = pt.vector("x_prop", dtype="float64")
        inv_temperature = pt.scalar("inv_temperature", dtype="float64")
        lik_prop = clone_replace(row_loglik, {flat: x_prop}, rebuild_strict=False)
        lik_cur = clone_replace(row_loglik, {flat: x_cur}, rebuild_strict=False)
        ratios = (lik_prop - lik_cur) * inv_temperature
        prior_delta = clone_replace(prior, {flat: x_prop}, rebuild_strict=False) - clone_replace(
            prior, {flat: x_cur}, rebuild_strict=False
        )

        def compile_fn(inputs: list[Variable], outputs: Any, mode: Any = None) -> Any:
            if isinstance(outputs, Variable):
                (outputs,) = _checks_as_ninf([outputs])
            else:
                outputs = _checks_as_ninf(outputs)
            fn = pytensor.function(
                inputs, outputs, mode=mode or self.mode, on_unused_input="ignore"
            )
            fn.trust_input = True
            return fn

        # The per-step function reads the rows from its own copies of the data, which
        # :meth:`arrange_rows` stores in a chain's random row order: a minibatch is then a
        # run of consecutive rows in memory, not scattered reads over all N rows (several
        # times faster per row at N = 10⁶, where the data do not fit in the CPU caches).
        self._step_data: list[SharedVariable] = [
            pytensor.shared(
                shared.get_value(borrow=True), name=f"{shared.name or 'data'}_arranged",
                borrow=True, shape=(None, *shared.type.shape[1:]),
            )
            for shared in self._row_data
        ]
        self._arranged = False
        # The data-free part comes with every block of rows: one call per block, and no
        # separate call for it per step (it costs a few scalar operations).
        step_outputs = clone_replace(
            [ratios, prior_delta],
            dict(zip(self._row_data, self._step_data, strict=True)),
            rebuild_strict=False,
        )
        self._delta_fn = compile_fn([x_cur, x_prop, rows, inv_temperature], step_outputs)
        #: :meth:`delta` without PyTensor's per-call wrapper (see
        #: :func:`~pymc_minibatch_mh.adapter.compat.direct_call`); used on every step.
        self.delta_fast = direct_call(self._delta_fn)
        self._prior_delta_fn = compile_fn([x_cur, x_prop], prior_delta)
        self._rows_fn = compile_fn([flat, rows], row_loglik)
        self._prior_fn = compile_fn([flat], prior)
        self._full_fn = compile_fn([flat], full_loglik, mode="FAST_COMPILE")
        # The symbolic graphs, for estimators that build other per-step functions on the
        # same sliced likelihood (e.g. control variates, adapter/control_variate.py).
        self.graphs = LikelihoodGraphs(
            flat=flat, rows=rows, row_loglik=row_loglik, prior=prior, x_cur=x_cur,
            x_prop=x_prop, inv_temperature=inv_temperature, ratios=ratios,
            prior_delta=prior_delta,
        )
        self._validate_split(point)
        self._structure = self._model_structure()

    # ------------------------------------------------------------------ checks
    def _check_variables(self) -> None:
        discrete = [v.name for v in self.value_vars if v.dtype in discrete_types]
        if discrete:
            raise ModelNotSupportedError(
                f"{self.step_name} samples continuous variables only, but {discrete} "
                "are discrete. Give them to a step method for discrete variables and the "
                f"continuous ones to {self.step_name}, e.g. "
                f"step=[{self.step_name}([...continuous...]), pm.Metropolis({discrete})]."
            )

    def _check_observed(self, observed: Sequence[Variable]) -> None:
        model = self.model
        if not observed:
            raise ModelNotSupportedError(
                f"The model has no observed variables, so {self.step_name} has no data to "
                "subsample. Pass observed=... to the likelihood, or use pm.Metropolis or "
                "NUTS for a model without data."
            )
        names = _op_names(observed)
        if any("Minibatch" in name for name in names) or any(
            getattr(model, "rvs_to_total_sizes", {}).get(rv) is not None for rv in observed
        ):
            raise ModelNotSupportedError(
                f"The model uses pm.Minibatch or total_size. {self.step_name} draws its own "
                "minibatches from the full data set: pass the full data as observed (and as "
                "pm.Data or arrays for the covariates) without pm.Minibatch and total_size."
            )
        free_names = {rv.name for rv in model.free_RVs}
        imputed = [
            rv.name
            for rv in observed
            if rv.name.endswith("_observed")
            and rv.name[: -len("_observed")] + "_unobserved" in free_names
        ]
        if imputed:
            raise ModelNotSupportedError(
                f"The observed variables {imputed} have missing values that PyMC imputes "
                "with one latent variable per missing observation; a minibatch step cannot "
                "subsample those. Drop the rows with missing values (or impute them "
                "beforehand) and pass complete data."
            )
        for rv, data in ((rv, _observed_source(model.rvs_to_values[rv])) for rv in observed):
            if not isinstance(data, SharedVariable | Constant):
                raise ModelNotSupportedError(
                    f"The observed data of {rv.name!r} is a computed expression, not an array "
                    "or pm.Data; a minibatch step must index it by rows. Pass the data "
                    "itself as observed (compute any transformation beforehand)."
                )
            if data.ndim == 0:
                raise ModelNotSupportedError(
                    f"The observed variable {rv.name!r} is a scalar: there are no rows to "
                    "subsample. Observed variables must have a leading observation dimension."
                )

    def _check_terms_split(self, observed: Sequence[Variable], terms: Sequence[Variable]) -> None:
        for rv, term in zip(observed, terms, strict=True):
            data_ndim = self.model.rvs_to_values[rv].ndim
            if term.ndim == 0 or data_ndim == 0:
                raise ModelNotSupportedError(
                    f"The likelihood of {rv.name!r} ({type(rv.owner.op).__name__}) is one "
                    "joint term over all rows, so it cannot be split per observation. A "
                    "minibatch step needs independent rows: use a distribution whose "
                    "log-probability has one term per row (for a multivariate normal, one "
                    "row per observation with shape (N, k)), or sample this model with NUTS."
                )

    def _observed_length(self, data: Sequence[Variable]) -> int:
        lengths = {
            name: _leading_length(d) for name, d in zip(self.observed_names, data, strict=True)
        }
        if len(set(lengths.values())) != 1:
            raise ModelNotSupportedError(
                f"The observed variables have different numbers of rows: {lengths}. A "
                "minibatch step slices all of them by the same rows: give them a common "
                "leading observation dimension (or model them in separate models)."
            )
        n = next(iter(lengths.values()))
        if n is None or n < 2:
            raise ModelNotSupportedError(
                f"The observed data has {n} rows; a minibatch step needs at least 2."
            )
        return n

    def _check_potentials(self, model: pm.Model, replacements: Mapping[Variable, Any]) -> None:
        for pot in model.potentials:
            used = [v for v in graph_inputs([pot]) if v in replacements]
            if used:
                raise ModelNotSupportedError(
                    f"The Potential {pot.name!r} uses the observed data or covariates, so it "
                    "would be evaluated on all rows at every step. Write that term as an "
                    "observed variable (e.g. pm.CustomDist with observed=...) so it can be "
                    "split per observation."
                )

    def data_lengths(self) -> dict[str, int | None]:
        """Leading lengths of the observed data and every length-N covariate, by name."""
        out: dict[str, int | None] = {}
        for name, d in zip(self.observed_names, self._observed_data, strict=True):
            out[f"observed {name}"] = _leading_length(d)
        for shared in self._row_data:
            out.setdefault(shared.name or "data", _leading_length(shared))
        return out

    def _model_structure(self) -> dict[str, list[str]]:
        model = self.model
        return {
            "observed variables": [rv.name for rv in model.observed_RVs],
            "Potentials": [pot.name for pot in model.potentials],
        }

    def check_model_unchanged(self) -> None:
        """Refuse a model that gained observed variables or Potentials after compilation.

        The likelihood and the data-free part are compiled once, when the step is built; a
        term added to the model afterwards would be silently left out of every step.
        """
        now = self._model_structure()
        changed = {k: (v, now[k]) for k, v in self._structure.items() if now[k] != v}
        if changed:
            detail = "; ".join(
                f"{k}: {old} when built, {new} now" for k, (old, new) in changed.items()
            )
            raise ModelNotSupportedError(
                f"The model changed after this {self.step_name} was built ({detail}). The "
                "step compiles the model's terms once and would leave the new ones out: "
                f"create the {self.step_name} after the model is complete (build it again "
                "after adding variables)."
            )

    def n_rows(self) -> int:
        """Current number of rows N (reads the data; checks that all lengths agree).

        Called at each chain start; also checks that the model has not gained observed
        variables or Potentials since the step was built (:meth:`check_model_unchanged`).
        """
        self.check_model_unchanged()
        lengths = {k: v for k, v in self.data_lengths().items() if v is not None}
        distinct = set(lengths.values())
        if len(distinct) != 1:
            raise ModelNotSupportedError(
                f"The observed data and covariates have different numbers of rows: {lengths}. "
                "When you change data with pm.set_data, change every array of the "
                "observation dimension together (one pm.set_data call with all of them)."
            )
        return distinct.pop()

    def _validation_points(
        self, point: Mapping[str, Any], rng: np.random.Generator
    ) -> list[dict[str, Any]]:
        """``point`` and two random points around it (continuous variables jittered).

        Checking at the start point alone can miss a term that does not split per
        observation when a parameter happens to hide it there (``b * (x - x.mean())``
        with ``b = 0`` at the start point).
        """
        points = [dict(point)]
        for scale in (0.5, 1.5):
            jittered = dict(point)
            for var in self.model.value_vars:
                value = np.asarray(point.get(var.name))
                if var.name in point and value.dtype.kind == "f":
                    noise = rng.standard_normal(value.shape) * scale * (1.0 + 0.1 * np.abs(value))
                    jittered[var.name] = (value + noise).astype(value.dtype)
            points.append(jittered)
        return points

    @staticmethod
    def _validation_subsets(n: int, rng: np.random.Generator) -> list[NDArray[np.int64]]:
        """Row subsets that differ from the whole data set, in the orders a step uses.

        A prefix, single rows, and random subsets in random (unsorted) order, all of them
        proper subsets of the N rows: with N ≤ 64 a subset of 64 rows would be all rows
        in their own order and would not reveal cumulative sums or whole-data summaries.
        """
        k = max(1, min(n - 1, 64))
        subsets = [
            np.arange(min(n - 1, 3), dtype=np.int64),
            np.array([n - 1], dtype=np.int64),
            rng.permutation(n)[:k].astype(np.int64),
            rng.permutation(n)[: max(1, min(n - 1, 5))].astype(np.int64),
        ]
        subsets += [np.array([i], dtype=np.int64) for i in rng.choice(n, min(n, 4), replace=False)]
        return subsets

    def _validate_split(self, point: Mapping[str, Any]) -> None:
        """Check that the sliced per-row terms equal the model's own terms.

        At the start point and at two random points around it, on proper subsets of the
        rows (prefix, single rows, random subsets in random order).
        """
        rng = np.random.default_rng(20170811)
        n = self.n_rows_initial
        subsets = self._validation_subsets(n, rng)
        try:
            for i, vpoint in enumerate(self._validation_points(point, rng)):
                self.set_others(vpoint)
                x = self.point_map.to_flat(vpoint)
                try:
                    full = np.asarray(self._full_fn(x))
                except Exception as err:  # noqa: BLE001 - re-raised with context
                    if i > 0:
                        continue  # a random point the model cannot evaluate: skip it
                    raise ModelNotSupportedError(
                        "Evaluating the model's log-likelihood failed ("
                        f"{err.__class__.__name__}: {str(err).splitlines()[0]}). Lengths of "
                        f"the observation dimension found: {self.data_lengths()}. Check that "
                        "the observed data and all covariates have the same number of rows."
                    ) from err
                if full.shape != (n,):
                    raise ModelNotSupportedError(
                        f"The likelihood has shape {full.shape}, not one value per row of the "
                        f"{n} observations, so it cannot be split per observation."
                    )
                for rows in subsets:
                    self._validate_rows(x, rows, full)
        finally:
            self.set_others(point)

    def _validate_rows(
        self, x: NDArray[np.float64], rows: NDArray[np.int64], full: NDArray[np.float64]
    ) -> None:
        try:
            part = np.asarray(self._rows_fn(x, rows))
        except Exception as err:  # noqa: BLE001 - re-raised with context
            raise ModelNotSupportedError(
                "The likelihood cannot be split per observation: evaluating it on a subset "
                f"of rows failed ({err.__class__.__name__}: {str(err).splitlines()[0]}). "
                "Every term of an observed variable must depend on its own row of the "
                "data and covariates only (no per-observation latent variables, no "
                "whole-data summaries such as x - x.mean() inside the model)."
            ) from err
        if part.shape != rows.shape or not np.isclose(
            part, full[rows], rtol=1e-8, atol=1e-10, equal_nan=True
        ).all():
            raise ModelNotSupportedError(
                "The likelihood cannot be split per observation: its value for a row "
                "changes when it is evaluated with other rows. Every term must depend "
                "on its own row of the data only; compute whole-data summaries (means, "
                "scalings, sorting, cumulative sums, lags) beforehand and pass them as data, "
                "or sample this model with NUTS."
            )

    # --------------------------------------------------------------- per step
    def set_others(self, point: Mapping[str, Any]) -> None:
        """Set the free variables not sampled by this step from ``point``."""
        for name, shared in self.other_shared.items():
            shared.set_value(point[name], borrow=True)

    def prior_delta(self, x_cur: NDArray[np.float64], x_prop: NDArray[np.float64]) -> float:
        """``log p0(θ') − log p0(θ)`` (priors, Jacobians and Potentials)."""
        return float(self._prior_delta_fn(x_cur, x_prop))

    def delta(
        self,
        x_cur: NDArray[np.float64],
        x_prop: NDArray[np.float64],
        rows: NDArray[np.int64],
        inv_temperature: NDArray[np.float64],
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Tempered ratios ``l_i`` of the given rows, and the data-free part.

        ``rows`` are rows of the data, or positions in the order last given to
        :meth:`arrange_rows`.

        Returns
        -------
        tuple of numpy.ndarray
            ``(l, log p0(θ') − log p0(θ))``, the second a 0-d array (the data-free part,
            see :meth:`prior_delta`).

        """
        return self._delta_fn(x_cur, x_prop, rows, inv_temperature)

    def arrange_rows(self, order: NDArray[np.int64] | None) -> None:
        """Store the rows seen by :meth:`delta` in ``order`` (``None``: the data's order).

        After this, row ``k`` of :meth:`delta` is row ``order[k]`` of the data, so a run of
        positions of a random order is a uniformly random set of rows read from
        consecutive memory. Costs one O(N) copy of the data's rows.
        """
        for shared, view in zip(self._row_data, self._step_data, strict=True):
            data = shared.get_value(borrow=True)
            view.set_value(data if order is None else np.take(data, order, axis=0), borrow=True)
        self._arranged = order is not None

    def on_arranged_rows(self, outputs: Sequence[Variable]) -> list[Variable]:
        """``outputs`` (graphs indexed by ``rows``) rebuilt on the arranged copies of the data.

        A per-step function built from ``graphs`` must read the rows where
        :meth:`delta` reads them: the step passes positions in the chain's row order
        (:meth:`arrange_rows`), not rows of the data.
        """
        return clone_replace(
            list(outputs), dict(zip(self._row_data, self._step_data, strict=True)),
            rebuild_strict=False,
        )

    @property
    def row_bytes(self) -> int:
        """Memory taken by the data's row arrays (observed data and covariates), in bytes."""
        return sum(int(np.asarray(s.get_value(borrow=True)).nbytes) for s in self._row_data)

    def row_loglik(self, x: NDArray[np.float64], rows: NDArray[np.int64]) -> NDArray[np.float64]:
        """Per-row log-likelihood at one state."""
        return self._rows_fn(x, rows)

    def full_loglik(self, x: NDArray[np.float64], n_rows: int) -> NDArray[np.float64]:
        """Per-row log-likelihood at one state over all rows, in bounded-memory chunks."""
        out = np.empty(n_rows)
        for start in range(0, n_rows, FULL_PASS_CHUNK):
            stop = min(n_rows, start + FULL_PASS_CHUNK)
            out[start:stop] = self._rows_fn(x, np.arange(start, stop, dtype=np.int64))
        return out

    def check_point(self, point: Mapping[str, Any], n_rows: int) -> None:
        """Raise a clear error if the log-probability at ``point`` is not finite (O(N) once)."""
        missing = [name for name in self.other_shared if name not in point]
        if missing:
            raise ModelNotSupportedError(
                f"The point has no values for {missing}, which the model of this "
                f"{self.step_name} has: the step was built for another model. Create the "
                "step inside `with model:` of the model you sample."
            )
        self.set_others(point)
        x = self.point_map.to_flat(point)
        prior = float(self._prior_fn(x))
        bad_vars = [k for k, v in point.items() if not np.all(np.isfinite(np.asarray(v, float)))]
        if bad_vars:
            raise ModelNotSupportedError(
                f"The start point has non-finite values for {bad_vars}. Give finite initial "
                "values (initvals=...) or let PyMC choose them."
            )
        if not math.isfinite(prior):
            raise ModelNotSupportedError(
                f"The prior log-probability (with Jacobians and Potentials) is {prior} at the "
                f"start point {dict(point)}. Choose initial values inside the support "
                "(initvals=...)."
            )
        loglik = self.full_loglik(x, n_rows)
        bad = np.flatnonzero(~np.isfinite(loglik))
        if bad.size:
            raise ModelNotSupportedError(
                f"The log-likelihood is not finite at the start point for {bad.size} of "
                f"{n_rows} observations (first at row {int(bad[0])}: {loglik[bad[0]]}). "
                "Choose initial values under which every observation has positive "
                "likelihood (initvals=...), or check the data for invalid values."
            )

    def make_rows(self, n_rows: int, rng: np.random.Generator) -> ShuffledRows:
        """A row sampler for one chain (its orders made by the compiled shuffle)."""
        return ShuffledRows(n_rows, rng, shuffle_fast)
