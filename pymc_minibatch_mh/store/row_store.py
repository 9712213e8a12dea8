"""The row store: the one owner of a model's per-row data and of each chain's row draws.

The observed data and the covariates of length N live in the model (``pm.Data`` shared
variables or NumPy constants), or, for data larger than memory, in arrays given to the step
with ``data=`` (``.npy`` files, Zarr arrays, Parquet columns; see
:mod:`~pymc_minibatch_mh.store.sources`, and :mod:`~pymc_minibatch_mh.store.dask_store`
for Dask arrays). :class:`RowStore` reads their *current* values at every chain start
(:meth:`RowStore.refresh`), so whatever ``pm.set_data`` put there, at any size, is what the
chain uses; no other copy of the data exists in the package. The compiled per-row functions
take the rows themselves as inputs (see :mod:`~pymc_minibatch_mh.model.split`), and the
store hands them out:

- :meth:`RowStore.take`: the rows of the current step, drawn uniformly without
  replacement, afresh for each step
  (:class:`~pymc_minibatch_mh.core.rows.PartialShuffleRows`), O(rows) per step; from a
  ``.npy`` file only those rows are read;
- :meth:`RowStore.rows`: rows by position;
- :meth:`RowStore.chunks`: a full pass in chunks of :func:`pass_rows` rows (views of
  arrays in memory; ``.npy`` files read with ``pread`` in blocks of
  :data:`FULL_PASS_CHUNK` rows), for the start-point check, the MAP search, the control
  variates' sums and tests that need every row;
- ``RowStore.n_rows``: N.

Data given with ``data=`` carry a stamp (shape, file sizes and modification times),
compared at each chain start and before and after each full pass: a change is followed
at a chain start (a new N included) and refused during a chain.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Variable

from pymc_minibatch_mh.core.rows import PartialShuffleRows
from pymc_minibatch_mh.errors import DataChangedError, DataStoreError, ModelNotSupportedError
from pymc_minibatch_mh.store.shuffled import BLOCK_ROWS, ShufflePlan, write_shuffled
from pymc_minibatch_mh.store.sources import NpyFile, check_missing, open_source

__all__ = [
    "FULL_PASS_CHUNK",
    "PASS_CALL_BYTES",
    "RowStore",
    "cast_rows",
    "data_value",
    "pass_chunks",
    "pass_rows",
]

#: Rows read at a time in a full pass over the data (bounded memory), and the most rows of
#: one call of a pass's compiled function.
FULL_PASS_CHUNK = 1 << 18

#: Bytes of one call's rows of a full pass, counted in float64 (:func:`pass_rows`).
PASS_CALL_BYTES = 1 << 21


def pass_rows(arrays: Sequence[NDArray[Any]]) -> int:
    """Rows of one call of a full pass's compiled function: about :data:`PASS_CALL_BYTES`.

    A power of two from 1,024 to :data:`FULL_PASS_CHUNK`, so that the rows of one call,
    counted in float64, take about 2 MiB and the call's intermediates stay in the cache.
    What this is for: a product of a float32 design with float64 coefficients converts the
    design to float64 first (NumPy in PyTensor's ``Dot``, and PyTensor 3's Numba ``Dot``),
    and on 2¹⁸ rows, d = 100 that conversion went through main memory. Measured at
    N = 10⁶, d = 100, float32 (``bench_tall_glm.py``'s logistic data), the step built in
    5.9 s with calls of 2¹⁸ rows and 4.2 s with 2,048 (PyTensor 2; 8.4 and 3.6 s on
    PyTensor 3); with float64 data, d = 10 (16,384 rows a call), 1.2–1.6 s either way.
    """
    width = sum(8 * int(np.prod(a.shape[1:], dtype=np.int64)) for a in arrays)
    rows = PASS_CALL_BYTES // max(width, 1)
    return int(min(FULL_PASS_CHUNK, max(1 << 10, 1 << (int(rows).bit_length() - 1))))


def pass_chunks(block: Sequence[NDArray[Any]]) -> Iterator[tuple[NDArray[Any], ...]]:
    """A block of rows of a full pass in consecutive views of :func:`pass_rows` rows."""
    n = block[0].shape[0] if block else 0
    step = pass_rows(block)
    for start in range(0, n, step):
        yield tuple([a[start:start + step] for a in block])


def data_value(var: Variable) -> np.ndarray:
    """The current value of a data variable."""
    if isinstance(var, SharedVariable):
        return np.asarray(var.get_value(borrow=True))
    return np.asarray(var.data)


class RowStore:
    """The per-row data of a model (observed data and covariates), read at chain start.

    Parameters
    ----------
    row_vars : sequence of Variable
        The model's per-row data variables (shared variables or constants), in the order
        of the compiled functions' row inputs.
    data : dict, optional
        Position in ``row_vars`` → (name, array): data read instead of the model's values
        (see :func:`~pymc_minibatch_mh.store.registry.resolve_data` and
        :mod:`~pymc_minibatch_mh.store.sources`); the model then holds a slice of the rows, for
        shapes and dtypes.
    shuffled_copy : bool
        Write the ``data=`` arrays to a local copy in a uniformly random row order and read
        blocks of rows from it (:mod:`~pymc_minibatch_mh.store.shuffled`): one read per
        block instead of one per row. Positions (:meth:`rows`, :meth:`chunks`) are then
        positions in the copy.

    Attributes
    ----------
    arrays : tuple of numpy.ndarray
        The current data, one C-contiguous array per row variable (the model's own arrays
        when they are already C-contiguous, a copy otherwise; read-only maps of ``.npy``
        files for data given with ``data=``).
    n_rows : int
        N, the common leading length.

    """

    def __init__(
        self, row_vars: Sequence[Variable], data: Mapping[int, tuple[str, Any]] | None = None,
        shuffled_copy: bool = False,
    ) -> None:
        self.row_vars = tuple(row_vars)
        self.data = dict(data or {})
        #: Rows per block read by a step: :data:`~pymc_minibatch_mh.store.shuffled.BLOCK_ROWS`
        #: from a shuffled copy (``shuffled_copy=True``), else 1 (rows at random positions).
        self.block_rows = BLOCK_ROWS if shuffled_copy else 1
        self._left: tuple[NDArray[Any], ...] = ()
        self.arrays: tuple[NDArray[Any], ...] = ()
        self.n_rows = 0
        self._sampler: PartialShuffleRows | None = None
        # The model's placeholders of the data= entries: pm.Data on them is refused.
        self._placeholders = {i: data_value(self.row_vars[i]) for i in self.data}
        # Position → (stamp, array, source with a stamp, mapped local file).
        self._opened: dict[int, tuple[Any, Any, Any, NpyFile | None]] = {}
        # data= arrays not yet checked for missing values (at their first full pass).
        self._unchecked: set[int] = set()
        self._casts: tuple[np.dtype | None, ...] = ()
        self.refresh()

    def name(self, i: int) -> str:
        """The name of the ``i``-th per-row array (for messages)."""
        return self.data[i][0] if i in self.data else (self.row_vars[i].name or f"data {i}")

    def lengths(self) -> dict[str, int | None]:
        """Leading lengths of the data variables' current values, by name."""
        out: dict[str, int | None] = {}
        for i, var in enumerate(self.row_vars):
            value = self._opened[i][1] if i in self._opened else data_value(var)
            out.setdefault(self.name(i), int(value.shape[0]) if value.ndim else None)
        return out

    # -------------------------------------------------------------- data= sources
    def _open(self, i: int) -> Any:
        """The array of a ``data=`` entry, or its source when it is new or its stamp changed.

        A source still has to be made local (:meth:`_local`), after the lengths are checked.
        """
        name, value = self.data[i]
        self._check_placeholder(i)
        opened = self._opened.get(i)
        if opened is not None and opened[0] == self._stamp(opened[2], opened[1]):
            return opened[1]
        return _Source(open_source(name, value))

    def _local(self, i: int, opened: Any) -> NDArray[Any]:
        """A new source as the store reads it: mapped, copied, or shuffled and copied."""
        if not isinstance(opened, _Source):
            return opened
        name, source = self.data[i][0], opened.source
        like = _array_like(source)
        self._check_array(i, like)  # before any copy: a copy keeps the shape and dtype
        if self.block_rows > 1:
            local = write_shuffled(name, source, like.shape, like.dtype, ShufflePlan(len(opened)))
        else:
            local = source.copy_to_npy() if hasattr(source, "copy_to_npy") else source
        array = local.array if isinstance(local, NpyFile) else local
        stamp_of = source if hasattr(source, "stamp") else _ArrayStamp(source)
        self._opened[i] = (self._stamp(stamp_of, array), array, stamp_of,
                           local if isinstance(local, NpyFile) else None)
        if local is source:  # read in place: checked for missing values at its first pass
            self._unchecked.add(i)
        return array

    def _check_placeholder(self, i: int) -> None:
        """Refuse ``pm.set_data`` on a model variable whose rows come from ``data=``."""
        name = self.data[i][0]
        now = data_value(self.row_vars[i])
        old = self._placeholders[i]
        if now is not old and (now.shape != old.shape or not np.array_equal(now, old)):
            raise DataStoreError(
                f"pm.set_data changed {name!r}, but this step reads {name!r} from data=, "
                "so the change would be ignored. Change the array given in data= (the step "
                "follows it at the next chain start) or build the step again."
            )

    @staticmethod
    def _stamp(source: Any, array: NDArray[Any]) -> Any:
        return source.stamp() if source is not None else (array.shape, id(array))

    def _check_array(self, i: int, array: NDArray[Any]) -> None:
        name, var = self.name(i), self.row_vars[i]
        slice_ = self._placeholders[i]
        if len(array.shape) != slice_.ndim or tuple(array.shape[1:]) != slice_.shape[1:]:
            raise DataStoreError(
                f"data[{name!r}] has rows of shape {array.shape[1:]}, but the model's "
                f"{name!r} has rows of shape {slice_.shape[1:]}. Build the model on a slice "
                f"of the same array (e.g. pm.Data({name!r}, store[:1000]))."
            )
        # Integers into a narrower integer type (PyMC makes integer pm.Data int32) are
        # accepted: cast_rows checks each value as it is read.
        if not (np.can_cast(array.dtype, var.dtype, "safe")
                or _integer_cast(np.dtype(array.dtype), np.dtype(var.dtype))):
            raise DataStoreError(
                f"data[{name!r}] has dtype {array.dtype}, which cannot be cast safely to the "
                f"model's {var.dtype}. Store the data as {var.dtype} (e.g. "
                f"array.astype({str(var.dtype)!r}))."
            )

    def check_unchanged(self, what: str = "a full pass") -> None:
        """Raise :class:`~pymc_minibatch_mh.errors.DataChangedError` on a change."""
        for i, (stamp, array, source, _) in self._opened.items():
            if stamp != self._stamp(source, array):
                raise DataChangedError(
                    f"The data {self.name(i)!r} changed on disk during {what} of a running "
                    "chain (its shape, size or modification time differs from the chain "
                    "start). Rows from before and after the change must not be mixed: let "
                    "the store be, or start the sampling again after changing it."
                )

    def snapshot(self) -> tuple[Any, ...]:
        """What identifies the current data: the arrays, or the stamps of ``data=`` sources."""
        return tuple(self._opened[i][0] if i in self._opened else a
                     for i, a in enumerate(self.arrays))

    def changed_since(self, snapshot: tuple[Any, ...]) -> list[str]:
        """Names of the per-row arrays that differ from ``snapshot`` (:meth:`snapshot`)."""
        changed = []
        for i, (old, now) in enumerate(zip(snapshot, self.snapshot(), strict=True)):
            if i in self._opened:
                same = old == now
            else:
                same = now is old or (now.shape == old.shape and np.array_equal(now, old))
            if not same:
                changed.append(self.name(i))
        return changed

    # -------------------------------------------------------------- chain start
    def refresh(self) -> int:
        """Read the data variables' current values (after ``pm.set_data``); return N.

        Raises
        ------
        ModelNotSupportedError
            If the arrays no longer share one leading length.
        DataStoreError
            For ``data=`` entries of the wrong shape or dtype, with missing values, or
            whose model placeholder was changed with ``pm.set_data``.

        """
        values = [self._open(i) if i in self.data else data_value(var)
                  for i, var in enumerate(self.row_vars)]
        lengths = {
            self.name(i): len(v) if isinstance(v, _Source) else int(v.shape[0]) if v.ndim
            else None for i, v in enumerate(values)
        }
        distinct = set(lengths.values())
        if len(distinct) != 1 or None in distinct:
            how = ("Give arrays with the same number of rows in data=." if self.data else
                   "When you change data with pm.set_data, change every array of the "
                   "observation dimension together (one pm.set_data call with all of them).")
            raise ModelNotSupportedError(
                f"The observed data and covariates have different numbers of rows: {lengths}. "
                + how
            )
        n = distinct.pop()
        if n < 2:  # type: ignore[operator]
            raise ModelNotSupportedError(
                f"The observed data has {n} rows; a minibatch step needs at least 2."
            )
        self.arrays = tuple(self._local(i, v) if i in self.data else np.ascontiguousarray(v)
                            for i, v in enumerate(values))
        # How rows at given positions, and consecutive rows, are read: pread(2) for .npy
        # files (never through their mapping, whose pages a truncated file turns into a
        # bus error), else indexing.
        files = [self._opened[i][3] if i in self._opened else None
                 for i in range(len(self.arrays))]
        self._readers = tuple(a.__getitem__ if f is None else f.read_rows
                              for f, a in zip(files, self.arrays, strict=True))
        self._slicers = tuple((lambda start, stop, a=a: a[start:stop]) if f is None
                              else f.read_block for f, a in zip(files, self.arrays, strict=True))
        # The user's .npy files read in place (not local copies): checked at each step.
        self._watched = tuple(o[3] for o in self._opened.values()
                              if o[3] is not None and o[3] is o[2])
        self._casts = tuple(None if a.dtype == var.dtype else np.dtype(var.dtype)
                            for a, var in zip(self.arrays, self.row_vars, strict=True))
        if not any(self._casts):
            self._casts = ()
        self.n_rows = int(n)  # type: ignore[arg-type]
        if self.block_rows > 1:  # every row variable is a shuffled copy
            self._blocks = tuple(self._opened[i][3].read_runs  # type: ignore[union-attr]
                                 for i in range(len(self.row_vars)))
        return self.n_rows

    @property
    def nbytes(self) -> int:
        """Memory (or mapped file bytes) taken by the data arrays."""
        return sum(int(a.nbytes) for a in self.arrays)

    def release(self, start: int = 0, stop: int | None = None) -> None:
        """Hand the pages of mapped ``.npy`` files back to the kernel (rows start:stop)."""
        for opened in self._opened.values():
            if opened[3] is not None:
                opened[3].release(start, stop)

    # ------------------------------------------------------------ chain and step
    def start_chain(self, rng: np.random.Generator) -> None:
        """Start a chain's row draws (randomness from the chain's generator only)."""
        b = self.block_rows
        self._sampler = PartialShuffleRows(-(-self.n_rows // b), rng)

    def start_step(self) -> None:
        """Open a step: rows taken from now on are new to it.

        Raises
        ------
        DataChangedError
            If a ``.npy`` file read in place was written to since the chain start (one
            ``fstat`` per file, :meth:`~pymc_minibatch_mh.store.sources.NpyFile.check_unchanged`).

        """
        for file in self._watched:
            file.check_unchanged()
        self._sampler.start_step()  # type: ignore[union-attr]
        self._left = ()

    def _cast(self, rows: list[NDArray[Any]]) -> tuple[NDArray[Any], ...]:
        return cast_rows(rows, self._casts)

    def take(self, count: int) -> tuple[NDArray[Any], ...]:
        """``count`` rows not yet taken in this step, uniformly at random, one per array.

        From a shuffled copy: the rows of blocks drawn uniformly at random (without
        replacement) in order; the rest of a block waits for the step's next take.
        """
        if self.block_rows > 1:
            return self._take_blocks(count)
        idx = self._sampler.take(count)  # type: ignore[union-attr]
        if self.data:
            return self._read(idx)
        return tuple([a[idx] for a in self.arrays])  # fancy indexing: cheaper than np.take

    def _take_blocks(self, count: int) -> tuple[NDArray[Any], ...]:
        b, left = self.block_rows, self._left
        have = left[0].shape[0] if left else 0
        if count > have:
            sampler = self._sampler
            parts = [left] if have else []
            while have < count:  # once, unless the short last block was drawn
                starts = sampler.take(-(-(count - have) // b)) * b  # type: ignore[union-attr]
                new = [read(starts, b) for read in self._blocks]
                parts.append(new)
                have += new[0].shape[0]
            left = (tuple(parts[0]) if len(parts) == 1
                    else tuple([np.concatenate(p) for p in zip(*parts, strict=True)]))
        self._left = tuple([a[count:] for a in left])
        rows = [a[:count] for a in left]
        return self._cast(rows) if self._casts else tuple(rows)

    def _read(self, idx: NDArray[np.int64]) -> tuple[NDArray[Any], ...]:
        rows = [read(idx) for read in self._readers]
        return self._cast(rows) if self._casts else tuple(rows)

    def rows(self, positions: NDArray[np.int64]) -> tuple[NDArray[Any], ...]:
        """The rows at ``positions`` (row indices of the data), one array per variable."""
        return self._read(np.asarray(positions, dtype=np.int64))

    def reduce(self, fn: Callable[..., Any], *args: Any) -> list[Any]:
        """``fn(*args, *chunk)`` for each chunk of a full pass (:meth:`chunks`), in order.

        For passes whose per-chunk results are small (sums, counts): the Dask store runs
        ``fn`` on the cluster, next to the data, and only the results come back; ``fn``
        must then be picklable (e.g. an object holding compiled PyTensor functions).
        """
        return [fn(*args, *chunk) for chunk in self.chunks()]

    def chunks(self, size: int = FULL_PASS_CHUNK) -> Iterator[tuple[NDArray[Any], ...]]:
        """A full pass: consecutive chunks of :func:`pass_rows` rows, read ``size`` at a time.

        Chunks of arrays in memory are views (no copy); chunks of ``.npy`` files (given
        with ``data=``, or local copies) are read with ``pread(2)``, one chunk at a time,
        so a file truncated during the pass gives
        :class:`~pymc_minibatch_mh.errors.DataChangedError`. For data given with
        ``data=``: the stamps are checked before and after the pass, and the first
        complete pass after opening an array checks it for missing values (NaN).
        """
        n = self.n_rows
        sourced = bool(self.data)
        if sourced:
            self.check_unchanged()
        unchecked = sorted(self._unchecked)
        for start in range(0, n, size):
            stop = min(n, start + size)
            chunk = [read(start, stop) for read in self._slicers]
            for i in unchecked:
                check_missing(self.name(i), chunk[i], start)
            yield from pass_chunks(self._cast(chunk) if self._casts else chunk)
            if sourced:
                self.release(start, stop)
        if sourced:
            self.check_unchanged()
            self._unchecked.difference_update(unchecked)


class _Source:
    """A ``data=`` source opened and not yet read by the store (see ``RowStore._open``)."""

    def __init__(self, source: Any) -> None:
        self.source = source

    def __len__(self) -> int:
        return int(_array_like(self.source).shape[0])


class _ArrayStamp:
    """The stamp of an in-memory ``data=`` array: its shape and identity."""

    def __init__(self, array: NDArray[Any]) -> None:
        self.array = array

    def stamp(self) -> tuple[Any, ...]:
        return (self.array.shape, id(self.array))


def _array_like(source: Any) -> Any:
    """What has the source's shape and dtype (an array, or a chunked source itself)."""
    return source.array if isinstance(source, NpyFile) else source


def cast_rows(rows: Sequence[NDArray[Any]], casts: Sequence[Any]) -> tuple[NDArray[Any], ...]:
    """``rows`` with ``rows[i]`` cast to ``casts[i]`` (None: as it is).

    A cast of integers to a narrower integer type is checked to keep every value.

    Raises
    ------
    DataStoreError
        If an integer value does not fit in the type it is cast to.

    """
    return tuple([r if c is None else _checked_cast(r, c)
                  for r, c in zip(rows, casts, strict=True)])


def _integer_cast(have: np.dtype, want: np.dtype) -> bool:
    """Whether integers of ``have`` are cast to ``want``, which may not hold them all."""
    return have.kind in "iu" and want.kind in "iu" and not np.can_cast(have, want, "safe")


def _checked_cast(rows: NDArray[Any], dtype: np.dtype) -> NDArray[Any]:
    out = rows.astype(dtype)
    if _integer_cast(rows.dtype, dtype) and not np.array_equal(out, rows):
        value = rows[out != rows].flat[0]
        info = np.iinfo(dtype)
        raise DataStoreError(
            f"Integer data given with data= ({rows.dtype}) has the value {value}, outside "
            f"the range of the model's {dtype} variable ({info.min} to {info.max}). Store "
            f"values that fit in {dtype} (e.g. labels recoded to 0, 1, ..., K - 1)."
        )
    return out
