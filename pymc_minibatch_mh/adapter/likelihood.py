"""Turn a PyMC model into fast per-observation log-likelihood functions of row indices.

The model's observed variables must share a leading observation dimension of length N.
Their elementwise log-likelihood graphs are rewritten once so that the observed data and
every covariate of length N (``pm.Data`` or NumPy constants) are indexed by the same
vector of row indices, the sampled variables are read from one flat float64 vector and
all other free variables from shared variables set at each step. Everything a step needs
is then one call of a function compiled once:

``delta(x_cur, x_prop, rows, inv_temperature) -> (l, cumsum(l − l₀), cumsum((l − l₀)²))``
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
from pymc.pytensorf import make_shared_replacements
from pymc.util import get_value_vars_from_user_vars
from pymc.vartypes import discrete_types
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Constant, Variable
from pytensor.graph.traversal import ancestors, graph_inputs, io_toposort
from pytensor.tensor.shape import SpecifyShape

from pymc_minibatch_mh.adapter.compat import default_mode
from pymc_minibatch_mh.core.rows import ShuffledRows

__all__ = ["MinibatchLikelihood", "ModelNotSupportedError", "PointMap"]

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

    def to_flat(self, point: Mapping[str, Any]) -> NDArray[np.float64]:
        """Flat float64 copy of the variables' values in ``point``."""
        if self._single:
            return np.array(point[self.entries[0].name], dtype=np.float64).reshape(-1)
        return np.concatenate(
            [np.asarray(point[e.name], dtype=np.float64).reshape(-1) for e in self.entries]
        )

    def to_point(self, flat: NDArray[np.float64], point: Mapping[str, Any]) -> dict[str, Any]:
        """A new point: ``point`` with the variables replaced by the values in ``flat``."""
        new = dict(point)
        for e in self.entries:
            new[e.name] = flat[e.start : e.start + e.size].reshape(e.shape).astype(e.dtype)
        return new


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


def _is_shape_constant(var: Constant, n: int) -> bool:
    data = np.asarray(var.data)
    return (
        data.dtype.kind in "iu" and data.ndim == 1 and 1 <= data.size <= 8 and int(data[0]) == n
    )


def _leading_length(var: Variable) -> int | None:
    value = _data_value(var)
    return int(value.shape[0]) if value.ndim >= 1 else None


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
        self.value_vars: list[Variable] = get_value_vars_from_user_vars(vars, model)
        self._check_variables()
        observed = list(model.observed_RVs)
        self._check_observed(observed)

        terms = model.logp(vars=observed, sum=False)
        if not isinstance(terms, list | tuple):
            terms = [terms]
        self._check_terms_split(observed, terms)
        self.observed_names = [rv.name for rv in observed]
        self._observed_data = [model.rvs_to_values[rv] for rv in observed]
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
                shared = var if isinstance(var, SharedVariable) else pytensor.shared(
                    _data_value(var), name=(var.name or "data") + "_rows", borrow=True
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
        # Cumulative sums of the ratios shifted by the first one: the mean and sum of
        # squared deviations of any run of consecutive rows then cost O(1), accurately
        # (the shift is within a few standard deviations of the mean).
        shifted = ratios - ratios[0]
        csum = pt.cumsum(shifted)
        csum_sq = pt.cumsum(shifted * shifted)
        prior_delta = clone_replace(prior, {flat: x_prop}, rebuild_strict=False) - clone_replace(
            prior, {flat: x_cur}, rebuild_strict=False
        )

        def compile_fn(inputs: list[Variable], outputs: Any, mode: Any = None) -> Any:
            fn = pytensor.function(
                inputs, outputs, mode=mode or self.mode, on_unused_input="ignore"
            )
            fn.trust_input = True
            return fn

        self._delta_fn = compile_fn([x_cur, x_prop, rows, inv_temperature], [ratios, csum, csum_sq])
        self._prior_delta_fn = compile_fn([x_cur, x_prop], prior_delta)
        self._rows_fn = compile_fn([flat, rows], row_loglik)
        self._prior_fn = compile_fn([flat], prior)
        self._full_fn = compile_fn([flat], full_loglik, mode="FAST_COMPILE")
        self._validate_split(point)

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
        for rv, data in ((rv, model.rvs_to_values[rv]) for rv in observed):
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

    def n_rows(self) -> int:
        """Current number of rows N (reads the data; checks that all lengths agree)."""
        lengths = {k: v for k, v in self.data_lengths().items() if v is not None}
        distinct = set(lengths.values())
        if len(distinct) != 1:
            raise ModelNotSupportedError(
                f"The observed data and covariates have different numbers of rows: {lengths}. "
                "When you change data with pm.set_data, change every array of the "
                "observation dimension together (one pm.set_data call with all of them)."
            )
        return distinct.pop()

    def _validate_split(self, point: Mapping[str, Any]) -> None:
        """Check once that the sliced per-row terms equal the model's own terms."""
        self.set_others(point)
        x = self.point_map.to_flat(point)
        try:
            full = np.asarray(self._full_fn(x))
        except Exception as err:  # noqa: BLE001 - re-raised with context
            raise ModelNotSupportedError(
                f"Evaluating the model's log-likelihood failed ({err.__class__.__name__}: "
                f"{str(err).splitlines()[0]}). Lengths of the observation dimension found: "
                f"{self.data_lengths()}. Check that the observed data and all covariates have "
                "the same number of rows."
            ) from err
        n = self.n_rows_initial
        if full.shape != (n,):
            raise ModelNotSupportedError(
                f"The likelihood has shape {full.shape}, not one value per row of the {n} "
                "observations, so it cannot be split per observation."
            )
        rng = np.random.default_rng(20170811)
        k = min(n, 64)
        subsets = [np.arange(min(n, 3), dtype=np.int64), np.sort(rng.choice(n, k, replace=False))]
        for rows in subsets:
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
            ok = np.isclose(part, full[rows], rtol=1e-8, atol=1e-10) | (
                ~np.isfinite(full[rows]) & (part == full[rows])
            )
            if part.shape != rows.shape or not ok.all():
                raise ModelNotSupportedError(
                    "The likelihood cannot be split per observation: its value for a row "
                    "changes when it is evaluated with other rows. Every term must depend "
                    "on its own row of the data only; compute whole-data summaries (means, "
                    "scalings, sorting, lags) beforehand and pass them as data."
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
    ) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
        """Tempered ratios ``l_i`` of the given rows and their shifted cumulative sums.

        Returns
        -------
        tuple of numpy.ndarray
            ``(l, cumsum(l − l[0]), cumsum((l − l[0])²))``.
        """
        return self._delta_fn(x_cur, x_prop, rows, inv_temperature)

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
        """A row sampler for one chain."""
        return ShuffledRows(n_rows, rng)
