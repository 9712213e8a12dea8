"""The row store: the one owner of a model's per-row data and of each chain's row draws.

The observed data and the covariates of length N live in the model (``pm.Data`` shared
variables or NumPy constants). :class:`RowStore` reads their *current* values at every
chain start (:meth:`RowStore.refresh`), so whatever ``pm.set_data`` put there, at any
size, is what the chain uses; no other copy of the data exists in the package. The
compiled per-row functions take the rows themselves as inputs (see
:mod:`~pymc_minibatch_mh.adapter.split`), and the store hands them out:

- :meth:`RowStore.take`: the rows of the current step, drawn uniformly without
  replacement, afresh for each step
  (:class:`~pymc_minibatch_mh.core.rows.PartialShuffleRows`), O(rows) per step;
- :meth:`RowStore.rows`: rows by position;
- :meth:`RowStore.chunks`: a full pass in chunks of :data:`FULL_PASS_CHUNK` rows (views,
  no copy), for the start-point check, the MAP search, the control variates' sums and
  tests that need every row;
- ``RowStore.n_rows``: N.

That interface is the seam where data that do not fit in memory can plug in.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray
from pytensor.graph.basic import Variable

from pymc_minibatch_mh.adapter.checks import ModelNotSupportedError
from pymc_minibatch_mh.adapter.graph import data_value
from pymc_minibatch_mh.core.rows import PartialShuffleRows

__all__ = ["FULL_PASS_CHUNK", "RowStore"]

#: Rows per call when a whole pass over the data is evaluated (bounded memory).
FULL_PASS_CHUNK = 1 << 18


class RowStore:
    """The per-row data of a model (observed data and covariates), read at chain start.

    Parameters
    ----------
    row_vars : sequence of Variable
        The model's per-row data variables (shared variables or constants), in the order
        of the compiled functions' row inputs.

    Attributes
    ----------
    arrays : tuple of numpy.ndarray
        The current data, one C-contiguous array per row variable (the model's own arrays
        when they are already C-contiguous; a copy otherwise).
    n_rows : int
        N, the common leading length.

    """

    def __init__(self, row_vars: Sequence[Variable]) -> None:
        self.row_vars = tuple(row_vars)
        self.arrays: tuple[NDArray[Any], ...] = ()
        self.n_rows = 0
        self._sampler: PartialShuffleRows | None = None
        self.refresh()

    def lengths(self) -> dict[str, int | None]:
        """Leading lengths of the data variables' current values, by name."""
        out: dict[str, int | None] = {}
        for var in self.row_vars:
            value = data_value(var)
            out.setdefault(var.name or "data", int(value.shape[0]) if value.ndim else None)
        return out

    def refresh(self) -> int:
        """Read the data variables' current values (after ``pm.set_data``); return N.

        Raises
        ------
        ModelNotSupportedError
            If the arrays no longer share one leading length.

        """
        values = [data_value(var) for var in self.row_vars]
        lengths = {
            var.name or f"data {i}": int(v.shape[0]) if v.ndim else None
            for i, (var, v) in enumerate(zip(self.row_vars, values, strict=True))
        }
        distinct = set(lengths.values())
        if len(distinct) != 1 or None in distinct:
            raise ModelNotSupportedError(
                f"The observed data and covariates have different numbers of rows: {lengths}. "
                "When you change data with pm.set_data, change every array of the "
                "observation dimension together (one pm.set_data call with all of them)."
            )
        n = distinct.pop()
        if n < 2:  # type: ignore[operator]
            raise ModelNotSupportedError(
                f"The observed data has {n} rows; a minibatch step needs at least 2."
            )
        self.arrays = tuple(np.ascontiguousarray(v) for v in values)
        self.n_rows = int(n)  # type: ignore[arg-type]
        return self.n_rows

    @property
    def nbytes(self) -> int:
        """Memory taken by the data arrays, in bytes."""
        return sum(int(a.nbytes) for a in self.arrays)

    # ------------------------------------------------------------ chain and step
    def start_chain(self, rng: np.random.Generator) -> None:
        """Start a chain's row draws (randomness from the chain's generator only)."""
        self._sampler = PartialShuffleRows(self.n_rows, rng)

    def start_step(self) -> None:
        """Open a step: rows taken from now on are new to it."""
        self._sampler.start_step()  # type: ignore[union-attr]

    def take(self, count: int) -> tuple[NDArray[Any], ...]:
        """``count`` rows not yet taken in this step, uniformly at random, one per array."""
        idx = self._sampler.take(count)  # type: ignore[union-attr]
        return tuple([a[idx] for a in self.arrays])  # fancy indexing: cheaper than np.take

    def rows(self, positions: NDArray[np.int64]) -> tuple[NDArray[Any], ...]:
        """The rows at ``positions`` (row indices of the data), one array per variable."""
        return tuple([a[positions] for a in self.arrays])

    def chunks(self, size: int = FULL_PASS_CHUNK) -> Iterator[tuple[NDArray[Any], ...]]:
        """A full pass: consecutive chunks of at most ``size`` rows (views, no copies)."""
        n = self.n_rows
        for start in range(0, n, size):
            stop = min(n, start + size)
            yield tuple([a[start:stop] for a in self.arrays])
