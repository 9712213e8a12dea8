"""The checks that refuse models a minibatch step cannot split, and the split's validation.

Every refusal is a :class:`~pymc_minibatch_mh.errors.ModelNotSupportedError` whose message
says what is wrong and what to do.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pymc as pm
from numpy.typing import NDArray
from pymc.vartypes import discrete_types
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Constant, Variable
from pytensor.graph.traversal import ancestors, graph_inputs

from pymc_minibatch_mh.core.common import check_batch_size  # the one rule, re-exported
from pymc_minibatch_mh.errors import ModelNotSupportedError
from pymc_minibatch_mh.model.graph import (
    has_op,
    is_data,
    is_shape_constant,
    leading_length,
    observed_source,
)
from pymc_minibatch_mh.model.internals import MINIBATCH_OPS
from pymc_minibatch_mh.store.row_store import data_value

__all__ = [
    "IMPUTED_SUFFIX",
    "check_batch_size",
    "check_observed",
    "check_potentials",
    "check_same_model",
    "check_temperature",
    "check_terms_split",
    "check_variables",
    "observed_length",
    "validate_split",
]


def check_variables(
    value_vars: Sequence[Variable], step_name: str, *, allow_discrete: bool = False
) -> None:
    """Refuse discrete sampled variables, unless the step samples them (``allow_discrete``).

    Only :class:`~pymc_minibatch_mh.step_methods.minibatch_gibbs.MinibatchGibbs` passes
    ``allow_discrete=True`` (and checks the distributions itself); the continuous steps
    keep the refusal.
    """
    discrete = [v.name for v in value_vars if v.dtype in discrete_types]
    # PyMC's imputation of missing observed values: the discrete ones are refused here,
    # before the refusal as discrete variables, which would not name their cause.
    imputed = {v.name.removesuffix(IMPUTED_SUFFIX): _size(v) for v in value_vars
               if v.name in discrete and v.name.endswith(IMPUTED_SUFFIX)}
    if imputed:
        raise _imputed_refusal(imputed, step_name)
    if discrete and not allow_discrete:
        raise ModelNotSupportedError(
            f"{step_name} samples continuous variables only, but {discrete} "
            "are discrete. Give them to a step method for discrete variables and the "
            f"continuous ones to {step_name}, e.g. "
            f"step=[{step_name}([...continuous...]), pm.Metropolis({discrete})] (or "
            "MinibatchGibbs for Bernoulli and Categorical variables)."
        )

#: The name ending of the free variable of a PyMC-imputed observed variable's missing values.
IMPUTED_SUFFIX = "_unobserved"


def _size(var: Variable) -> int | None:
    """The number of values of a variable of static shape (else None)."""
    shape = var.type.shape
    return None if None in shape else math.prod(shape)


def _imputed_refusal(imputed: Mapping[str, int | None], step_name: str) -> ModelNotSupportedError:
    """The refusal of observed data with missing values (``imputed``: name to their count)."""
    counts = ", ".join(
        f"{name!r} contain {'some' if n is None else n} missing value{'' if n == 1 else 's'}"
        for name, n in imputed.items()
    )
    free = [name + IMPUTED_SUFFIX for name in imputed]
    return ModelNotSupportedError(
        f"The observed data of {counts} (NaN or masked), which PyMC imputes as the free "
        f"variables {free}, one per missing value. {step_name} subsamples complete rows "
        "and cannot sample a model with imputed observations, whichever step samples "
        "the imputed values. Drop the rows with missing values (from the observed data "
        "and the covariates alike, e.g. keep = ~np.isnan(y)) or impute them beforehand, "
        "and pass complete data."
    )


def check_observed(model: pm.Model, observed: Sequence[Variable], step_name: str) -> None:
    """Refuse models without observed rows to subsample, or with rows PyMC treats specially."""
    if not observed:
        with_data = [_potential_label(pot) for pot in model.potentials
                     if any(is_data(v) for v in graph_inputs([pot]))]
        if with_data:
            raise ModelNotSupportedError(
                f"The model has no observed variables: its likelihood is written as the "
                f"Potential {', '.join(with_data)}, which uses data arrays and is one term "
                f"over all rows, so {step_name} cannot subsample it. Write the likelihood "
                "as an observed variable with one term per row: a distribution with "
                "observed=..., or pm.CustomDist(..., logp=..., observed=...) for a "
                "log-likelihood of your own."
            )
        raise ModelNotSupportedError(
            f"The model has no observed variables, so {step_name} has no data to "
            "subsample. Pass observed=... to the likelihood, or use pm.Metropolis or "
            "NUTS for a model without data."
        )
    # total_size wraps the observed variable in a MinibatchRandomVariable (PyMC 5 and 6).
    if has_op(observed, MINIBATCH_OPS):
        raise ModelNotSupportedError(
            f"The model uses pm.Minibatch or total_size. {step_name} draws its own "
            "minibatches from the full data set: pass the full data as observed (and as "
            "pm.Data or arrays for the covariates) without pm.Minibatch and total_size."
        )
    free = {rv.name: rv for rv in model.free_RVs}
    imputed = {
        base: _size(free[base + IMPUTED_SUFFIX])
        for base in (rv.name.removesuffix("_observed") for rv in observed
                     if rv.name.endswith("_observed"))
        if base + IMPUTED_SUFFIX in free
    }
    if imputed:
        raise _imputed_refusal(imputed, step_name)
    for rv, data in ((rv, observed_source(model.rvs_to_values[rv])) for rv in observed):
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

def check_terms_split(
    model: pm.Model, observed: Sequence[Variable], terms: Sequence[Variable]
) -> None:
    """Refuse likelihood terms that are one joint term over all rows."""
    for rv, term in zip(observed, terms, strict=True):
        data_ndim = model.rvs_to_values[rv].ndim
        if term.ndim == 0 or data_ndim == 0:
            raise ModelNotSupportedError(
                f"The likelihood of {rv.name!r} ({type(rv.owner.op).__name__}) is one "
                "joint term over all rows, so it cannot be split per observation. A "
                "minibatch step needs independent rows: use a distribution whose "
                "log-probability has one term per row (for a multivariate normal, one "
                "row per observation with shape (N, k)), or sample this model with NUTS."
            )

def observed_length(names: Sequence[str], data: Sequence[Variable]) -> int:
    """The common number of rows N of the observed variables."""
    lengths = {name: leading_length(d) for name, d in zip(names, data, strict=True)}
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

def _potential_label(pot: Variable) -> str:
    """A Potential as a message names it: its name, or its expression if it has none."""
    return repr(pot.name) if pot.name else f"(unnamed: {pot})"


def _data_label(var: Variable) -> str:
    if isinstance(var, SharedVariable) and var.name:
        return repr(var.name)
    return f"a NumPy array of shape {data_value(var).shape}"


def check_potentials(model: pm.Model, replacements: Mapping[Variable, Any], n_rows: int) -> None:
    """Refuse Potentials that use the per-row data, naming the Potential and what it uses.

    A Potential is in the data-free part, evaluated whole at every step. It is refused
    when its graph (through Deterministics too) uses the likelihood's per-row data, any
    other array of N rows (a covariate only the Potential uses, a NumPy copy of the
    observed data), or an observed variable (whose value is its data).
    """
    observed = set(model.observed_RVs)
    for pot in model.potentials:
        inputs = list(graph_inputs([pot]))
        used = [v for v in inputs if v in replacements]
        rows = [v for v in inputs
                if v not in replacements and is_data(v) and leading_length(v) == n_rows]
        observed_used = [v.name for v in ancestors([pot]) if v in observed]
        if observed_used:
            what = f"the observed variable {observed_used} (whose value is the observed data)"
        elif used:
            data = [_data_label(v) for v in used if is_data(v)
                    and not (isinstance(v, Constant) and is_shape_constant(v, n_rows))]
            what = "the observed data or covariates" + (
                f" ({', '.join(data)})" if data else " (their number of rows)")
        elif rows:
            what = (f"an array of N = {n_rows} rows, the length of the observed data "
                    f"({', '.join(_data_label(v) for v in rows)})")
        else:
            continue
        raise ModelNotSupportedError(
            f"The Potential {_potential_label(pot)} uses {what}, so it would be evaluated "
            f"on all {n_rows} rows at every step. Write that term as an observed variable "
            "(e.g. pm.CustomDist with observed=...) so it can be split per observation; if "
            "it is a prior term, compute what it needs from the data beforehand and pass "
            "that (a number or a short array) instead."
        )


def _validation_points(
    model: pm.Model, point: Mapping[str, Any], rng: np.random.Generator
) -> list[dict[str, Any]]:
    """``point`` and two random points around it (continuous variables jittered).

    Checking at the start point alone can miss a term that does not split per
    observation when a parameter happens to hide it there (``b * (x - x.mean())``
    with ``b = 0`` at the start point).

    The jitter's size is divided by √(number of jittered scalars), so a linear predictor
    over d of them moves by O(1) whatever d is. Measured: a fixed per-scalar jitter at
    d = 50 moved η by about 10, and at η ≈ 25 the model's own (unstabilised) Bernoulli
    term was off by 2·10⁻⁶ while the split graph was exact, which failed the check on a
    plain logistic regression.
    """
    jittered_vars = [
        var.name
        for var in model.value_vars
        if var.name in point and np.asarray(point[var.name]).dtype.kind == "f"
    ]
    k = sum(np.size(point[name]) for name in jittered_vars)
    points = [dict(point)]
    for scale in (0.5, 1.5):
        jittered = dict(point)
        for name in jittered_vars:
            value = np.asarray(point[name])
            size = scale / math.sqrt(max(k, 1)) * (1.0 + 0.1 * np.abs(value))
            noise = rng.standard_normal(value.shape) * size
            jittered[name] = (value + noise).astype(value.dtype)
        points.append(jittered)
    return points


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


def validate_split(
    model: pm.Model,
    point: Mapping[str, Any],
    *,
    n_rows: int,
    set_point: Callable[[Mapping[str, Any]], NDArray[np.float64]],
    full_loglik: Callable[[NDArray[np.float64]], NDArray[np.float64]],
    rows_loglik: Callable[[NDArray[np.float64], NDArray[np.int64]], NDArray[np.float64]],
    data_lengths: Callable[[], Mapping[str, int | None]],
) -> None:
    """Check that the sliced per-row terms equal the model's own terms.

    At the start point and at two random points around it, on proper subsets of the
    rows (prefix, single rows, random subsets in random order).

    Parameters
    ----------
    model : pymc.Model
        The model.
    point : dict
        The start point.
    n_rows : int
        N.
    set_point : callable
        ``set_point(point) -> flat``: sets the other steps' variables from a point and
        returns the flat state of the sampled ones.
    full_loglik : callable
        The model's own per-row log-likelihood at a flat state, over all rows.
    rows_loglik : callable
        The sliced per-row log-likelihood at a flat state, on given rows.
    data_lengths : callable
        The leading lengths of the data, by name (for the error message).

    Raises
    ------
    ModelNotSupportedError
        When a term does not split per observation.

    """
    rng = np.random.default_rng(20170811)
    subsets = _validation_subsets(n_rows, rng)
    points = _validation_points(model, point, rng)
    skipped: list[str] = []
    try:
        for i, vpoint in enumerate(points):
            x = set_point(vpoint)
            try:
                full = np.asarray(full_loglik(x))
            except Exception as err:
                if i > 0:  # a random point the model cannot evaluate: said below
                    skipped.append(f"{err.__class__.__name__}: {str(err).splitlines()[0]}")
                    continue
                raise ModelNotSupportedError(
                    "Evaluating the model's log-likelihood failed ("
                    f"{err.__class__.__name__}: {str(err).splitlines()[0]}). Lengths of "
                    f"the observation dimension found: {dict(data_lengths())}. Check that "
                    "the observed data and all covariates have the same number of rows."
                ) from err
            if full.shape != (n_rows,):
                raise ModelNotSupportedError(
                    f"The likelihood has shape {full.shape}, not one value per row of the "
                    f"{n_rows} observations, so it cannot be split per observation."
                )
            for rows in subsets:
                _validate_rows(rows_loglik, x, rows, full)
    finally:
        set_point(point)
    if skipped:
        warnings.warn(
            f"The split of the likelihood per row was checked at the start point but not "
            f"at {len(skipped)} of the {len(points) - 1} random points around it, where the "
            f"model's own log-likelihood raised ({skipped[0]}); a term that does not "
            "split per row and is hidden at the start point (e.g. b * (x - x.mean()) "
            "with b = 0) would go unnoticed. Start from a point where such parameters "
            "are not zero (initvals=...) to have it checked.",
            RuntimeWarning, stacklevel=2,
        )


def _validate_rows(
    rows_loglik: Callable[[NDArray[np.float64], NDArray[np.int64]], NDArray[np.float64]],
    x: NDArray[np.float64],
    rows: NDArray[np.int64],
    full: NDArray[np.float64],
) -> None:
    try:
        part = np.asarray(rows_loglik(x, rows))
    except Exception as err:
        raise ModelNotSupportedError(
            "The likelihood cannot be split per observation: evaluating it on a subset "
            f"of rows failed ({err.__class__.__name__}: {str(err).splitlines()[0]}). "
            "Every term of an observed variable must depend on its own row of the "
            "data and covariates only (no per-observation latent variables, no "
            "whole-data summaries such as x - x.mean() inside the model)."
        ) from err
    # Rows the model's own (unstabilised) graph cannot evaluate finitely at a jittered
    # point, e.g. log1p(-sigmoid(η)) for a large η, say nothing about the split: compared
    # are the rows where it gives a finite value (a term that does not split shows there).
    reference = full[rows]
    finite = np.isfinite(reference)
    if part.shape != rows.shape or not np.isclose(
        part[finite], reference[finite], rtol=1e-8, atol=1e-10
    ).all():
        raise ModelNotSupportedError(
            "The likelihood cannot be split per observation: its value for a row "
            "changes when it is evaluated with other rows. Every term must depend "
            "on its own row of the data only; compute whole-data summaries (means, "
            "scalings, sorting, cumulative sums, lags) beforehand and pass them as data, "
            "or sample this model with NUTS."
        )


def check_temperature(temperature: Any) -> float:
    """A temperature K as a float; ValueError unless it is a positive finite number."""
    if isinstance(temperature, bool) or not (
        isinstance(temperature, int | float | np.integer | np.floating)
        and math.isfinite(temperature)
    ):
        raise ValueError(f"temperature must be a positive finite number, got {temperature!r}.")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}.")
    return float(temperature)


def check_same_model(step: Any, point: Mapping[str, Any]) -> None:
    """Refuse a point (or model context) that does not belong to ``step``'s model.

    Parameters
    ----------
    step : MinibatchStep or MinibatchGibbs
        The step method (its ``likelihood`` and ``model`` are read).
    point : dict
        The point the chain starts from.

    Raises
    ------
    ModelNotSupportedError
        If a variable is missing or has another shape, or the sampling model's context
        is another model with the same variables.

    """
    entries = step.likelihood.point_map.entries
    wrong = [e.name for e in entries if e.name not in point or np.shape(point[e.name]) != e.shape]
    wrong += [
        name
        for name, shared in step.likelihood.other_shared.items()
        if name not in point or np.shape(point[name]) != np.shape(shared.get_value())
    ]
    context = pm.Model.get_context(error_if_none=False)
    other = (
        context is not None
        and context is not step.model
        and {v.name for v in context.value_vars} == {v.name for v in step.model.value_vars}
    )
    if wrong or other:
        raise ModelNotSupportedError(
            f"This {type(step).__name__} was built for another model"
            + (f" (variables {wrong} are missing or have other shapes)" if wrong else "")
            + ": its compiled likelihood uses that model's data. Create the step inside "
            "`with model:` of the model you sample (or pass model=...)."
        )
