"""The discrete variables a Gibbs step updates: their coordinates and numbers of categories.

:func:`category_counts` reads, for each value variable of the step, its distribution
(``pm.Bernoulli``: K = 2; ``pm.Categorical``: K = the length of ``p`` at the initial
point) and returns K for every coordinate of the step's flat vector (the
:class:`~pymc_minibatch_mh.model.pointmap.PointMap` order). Anything else is refused
with a message saying what to do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pymc as pm
from numpy.typing import NDArray
from pymc.vartypes import discrete_types
from pytensor.graph.basic import Variable
from pytensor.tensor.random.basic import BernoulliRV, CategoricalRV

from pymc_minibatch_mh.errors import ModelNotSupportedError

__all__ = ["category_counts"]


def _categories(model: pm.Model, value: Variable, point: Mapping[str, Any], step_name: str) -> int:
    rv = model.values_to_rvs[value]
    op = getattr(rv.owner, "op", None)
    if value.dtype not in discrete_types:
        raise ModelNotSupportedError(
            f"{step_name} samples Bernoulli and Categorical variables, but {value.name!r} is "
            f"continuous. Give it to a continuous step method (e.g. MinibatchBarker or NUTS) "
            f"in a compound step: step=[{step_name}([...discrete...]), "
            f"MinibatchBarker([{value.name!r}])]."
        )
    if isinstance(op, BernoulliRV):
        return 2
    if isinstance(op, CategoricalRV):
        k_graph = rv.owner.inputs[-1].shape[-1]
        (k_graph,) = model.replace_rvs_by_values((k_graph,))
        fn = model.compile_fn(k_graph, inputs=model.value_vars, on_unused_input="ignore")
        return int(fn(point))
    raise ModelNotSupportedError(
        f"{step_name} updates pm.Bernoulli and pm.Categorical variables only, but "
        f"{value.name!r} is {type(op).__name__ if op is not None else 'not a random variable'}"
        " (an unbounded or other discrete distribution has no finite set of values to "
        "flip between). Give it to pm.Metropolis in a compound step."
    )


def category_counts(
    model: pm.Model,
    value_vars: Sequence[Variable],
    point: Mapping[str, Any],
    step_name: str,
) -> NDArray[np.int64]:
    """K for every coordinate of the flat vector of ``value_vars`` (PointMap order).

    Parameters
    ----------
    model : pymc.Model
        The model.
    value_vars : sequence of Variable
        The step's value variables, in the order of its flat vector.
    point : dict
        A point giving each variable's size (and ``p`` of Categorical variables).
    step_name : str
        Used in error messages.

    Returns
    -------
    numpy.ndarray
        One int64 entry per coordinate, each at least 2.

    Raises
    ------
    ModelNotSupportedError
        For a continuous variable or a discrete one that is neither Bernoulli nor
        Categorical, or a Categorical with fewer than 2 categories.

    """
    counts: list[NDArray[np.int64]] = []
    for value in value_vars:
        k = _categories(model, value, point, step_name)
        if k < 2:
            raise ModelNotSupportedError(
                f"{value.name!r} has {k} category: there is nothing to update. Remove it or "
                "give it at least 2 categories."
            )
        counts.append(np.full(np.asarray(point[value.name]).size, k, dtype=np.int64))
    return np.concatenate(counts) if counts else np.empty(0, dtype=np.int64)
