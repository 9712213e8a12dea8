"""Which row store a step reads: the model's in-memory rows, or the ``data=`` sources.

:func:`~pymc_minibatch_mh.store.registry.resolve_data` matches the entries of ``data=`` to the
model's per-row data variables; :func:`make_store` builds the store: a
:class:`~pymc_minibatch_mh.store.row_store.RowStore` (in memory, ``.npy``, Zarr, Parquet,
optionally a shuffled local copy) or, for Dask arrays, a
:class:`~pymc_minibatch_mh.store.dask_store.DaskRowStore`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pytensor.graph.basic import Variable

from pymc_minibatch_mh.errors import DataStoreError
from pymc_minibatch_mh.store.dask_store import DaskRowStore
from pymc_minibatch_mh.store.row_store import RowStore
from pymc_minibatch_mh.store.sources import is_dask

__all__ = ["make_store", "resolve_data"]


def resolve_data(
    row_vars: Sequence[Variable], data: Mapping[str, Any] | None,
    aliases: Mapping[str, Variable] | None = None,
) -> dict[int, tuple[str, Any]]:
    """Match the entries of ``data=`` to the model's per-row data variables.

    Parameters
    ----------
    row_vars : sequence of Variable
        The model's per-row data variables.
    data : mapping, optional
        ``{name: array}``; a name is a ``pm.Data`` name or the name of an observed
        variable (for its observed data).
    aliases : mapping, optional
        Other names of row variables (observed variable name → its data).

    Returns
    -------
    dict
        Position in ``row_vars`` → (name, value).

    Raises
    ------
    DataStoreError
        For names the model does not have as per-row data, or per-row data left out.

    """
    if not data:
        return {}
    names = {var.name: var for var in row_vars if var.name}
    names.update({k: v for k, v in (aliases or {}).items() if v in row_vars})
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise DataStoreError(
            f"data= names {unknown}, which are not per-row data of the model (its per-row "
            f"data are {sorted(names)}). Use the names of the pm.Data variables (or of the "
            "observed variables) whose rows the arrays hold."
        )
    out: dict[int, tuple[str, Any]] = {}
    for name, value in data.items():
        i = list(row_vars).index(names[name])
        if i in out:
            raise DataStoreError(f"data= gives {out[i][0]!r} and {name!r} for the same data.")
        out[i] = (name, value)
    missing = [var.name or next((k for k, v in names.items() if v is var), "observed data")
               for i, var in enumerate(row_vars) if i not in out]
    if missing:
        raise DataStoreError(
            f"data= must give every per-row array of the model; missing: {missing}. The "
            "model holds only a slice of the rows, so these would have the wrong length: "
            "add them to data= (e.g. as pm.Data built on the same slice)."
        )
    return out


def make_store(
    row_vars: Sequence[Variable], data: Mapping[int, tuple[str, Any]] | None = None,
    shuffled_copy: bool = False,
) -> RowStore:
    """The row store for the data.

    A :class:`~pymc_minibatch_mh.store.row_store.RowStore`, or a Dask store for Dask arrays.

    Parameters
    ----------
    row_vars : sequence of Variable
        The model's per-row data variables.
    data : dict, optional
        From :func:`~pymc_minibatch_mh.store.registry.resolve_data`.
    shuffled_copy : bool
        Read the ``data=`` arrays from a shuffled local copy, in blocks
        (:mod:`~pymc_minibatch_mh.store.shuffled`).

    Returns
    -------
    RowStore
        :class:`~pymc_minibatch_mh.store.dask_store.DaskRowStore` when one of the
        arrays is a Dask array (the others are then read through Dask too).

    """
    if shuffled_copy not in (True, False):
        raise ValueError(f"shuffled_copy must be True or False, got {shuffled_copy!r}.")
    if shuffled_copy and not data:
        raise DataStoreError(
            "shuffled_copy=True copies the arrays given with data=, and there are none: the "
            "model's in-memory rows are read at random positions cheaply. Drop "
            "shuffled_copy, or give the per-row data with data=."
        )
    if data and any(is_dask(value) for _, value in data.values()):
        if shuffled_copy:
            raise DataStoreError(
                "shuffled_copy=True does not apply to Dask arrays: their store reads rows "
                "through a local buffer refilled in the background. Drop shuffled_copy."
            )
        return DaskRowStore(row_vars, data)
    return RowStore(row_vars, data, shuffled_copy=bool(shuffled_copy))
