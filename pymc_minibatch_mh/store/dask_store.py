"""Per-row data in Dask arrays, on a local machine or a cluster.

:class:`DaskRowStore` is the row store for ``data=`` entries that are Dask arrays (NumPy
arrays next to them are wrapped with ``dask.array.from_array``). Dask runs on whatever
scheduler is active: a ``distributed.Client`` (a ``LocalCluster`` or a real cluster) when
one was created, else Dask's threads.

- **Checks** at each chain start: the number of rows, and the arrays' stamps (shape and
  graph name). New arrays get a **first look**, one pass on the cluster that refuses
  missing values and records a two-byte fingerprint of every row
  (:func:`row_fingerprint`; 2 bytes × N kept here, 200 MB for 10⁸ rows).
- **Rows checked at every read.** Every later read (each block of the per-step stream,
  each full pass) compares the rows' fingerprints with the first look's, and rows that
  differ raise :class:`~pymc_minibatch_mh.errors.DataChangedError` (a changed row passes
  unnoticed with probability about 2⁻¹⁶). Dask reads the files under an array again
  whenever it needs blocks it does not hold (an array not persisted, at every read; a
  persisted one, for blocks lost with a worker), so rows from files changed under a
  running chain are refused rather than mixed with the old ones. The next chain start
  after such an error looks at the data afresh.
- **Full passes** whose results are sums (the start-point check, the MAP search, the
  control variates' sums) are Dask reductions on the cluster (:meth:`DaskRowStore.reduce`):
  the model's compiled functions are sent to each worker once (pickled; PyTensor compiles
  them again there, from its cache when the workers share it), each task evaluates one
  block of about :data:`~pymc_minibatch_mh.store.row_store.FULL_PASS_CHUNK` rows where the
  block is, and only the sums come back. The audit's pass needs every row's value: it
  streams the blocks here (:meth:`DaskRowStore.chunks`), the next one computed on the
  cluster while this one is used (two blocks in memory at most).
- **Per-step rows** come from a local buffer that a background thread refills
  (:class:`~pymc_minibatch_mh.store.row_stream.StreamBuffer`): it draws blocks of
  :data:`~pymc_minibatch_mh.store.row_stream.STREAM_BLOCK` row indices i.i.d. uniformly
  from all N, fetches those rows from the cluster (sorted, so each Dask chunk is read once
  per block) and queues them, :data:`~pymc_minibatch_mh.store.row_stream.STREAM_DEPTH`
  blocks ahead. The thread ends when no step has taken rows for a second (after a chain
  ends or is interrupted) and starts again, where it stopped, when one does. A step takes
  the next rows of this stream, skipping any row already in the step, which makes its rows
  a uniformly random sample without replacement of all N rows, independent of every other
  step (sequential rejection of repeats is exactly sampling without replacement).

Faults of a ``distributed`` cluster (worker processes that die, data lost with them): Dask
itself computes again what a lost worker held and reruns a task whose worker died (up to
``distributed.scheduler.allowed-failures``), so where the data can be read again (arrays
built from files or NumPy arrays, persisted or not) the computation completes with the
values of an undisturbed run (rows read again from files that changed are refused, as
above), and the step logs a WARNING on the logger ``pymc_minibatch_mh`` naming the workers
that left. Where Dask cannot (data that lived only on a lost worker, a task that kept
killing its workers, a cluster with no worker for
:data:`~pymc_minibatch_mh.store.dask_compute.NO_WORKERS_TIMEOUT` seconds, where Dask would
wait forever), the full pass or the row stream raises
:class:`~pymc_minibatch_mh.errors.DataStoreError` naming the data. Arrays that come back
from a worker process are made aligned (PyTensor refuses the unaligned views that Dask's
protocol may give). Every computation on the cluster goes through
:func:`~pymc_minibatch_mh.store.dask_compute.compute`, which bounds these waits.

Reproducibility: the row indices come from a generator seeded by one draw from the chain's
generator at the chain start, so the same seed gives the same rows and the same draws,
whatever the cluster's size, speed or timing (these only change *when* a block arrives).
The rows differ from those of the in-memory store (which draws them by partial
Fisher–Yates from the chain's generator directly), so the draws are not the in-memory
sampler's draws; their law is the same.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from numpy.typing import NDArray
from pytensor.graph.basic import Variable

from pymc_minibatch_mh.errors import DataChangedError, DataStoreError
from pymc_minibatch_mh.store.dask_compute import aligned, compute
from pymc_minibatch_mh.store.row_store import FULL_PASS_CHUNK, RowStore, cast_rows, pass_chunks
from pymc_minibatch_mh.store.row_stream import StreamBuffer
from pymc_minibatch_mh.store.sources import check_missing, is_dask

__all__ = ["DaskRowStore", "row_fingerprint"]


class DaskRowStore(RowStore):
    """The row store of Dask arrays (see the module docstring).

    Parameters
    ----------
    row_vars : sequence of Variable
        The model's per-row data variables.
    data : dict
        Position in ``row_vars`` → (name, Dask or NumPy array); every position is given.

    """

    def __init__(self, row_vars: Sequence[Variable],
                 data: Mapping[int, tuple[str, Any]]) -> None:
        self._buffer: StreamBuffer | None = None
        # (stamps of the arrays, the rows' fingerprints, their sums per block of a full
        # pass) from the first look at them, and whether the next chain start must look
        # again (rows were found changed).
        self._first_look: tuple[Any, NDArray[np.uint16], NDArray[np.int64]] | None = None
        self._look_again = False
        super().__init__(row_vars, data)

    def _what(self, task: str) -> str:
        """``task`` "of the data 'X', 'y'" (for messages)."""
        return f"{task} of the data " + ", ".join(repr(name) for name, _ in self.data.values())

    def _open(self, i: int) -> Any:
        import dask.array as da

        name, value = self.data[i]
        self._check_placeholder(i)
        if not is_dask(value):
            if not isinstance(value, np.ndarray):
                raise DataStoreError(
                    f"data[{name!r}] is a {type(value).__name__}; next to Dask arrays give "
                    "Dask or NumPy arrays (e.g. dask.array.from_zarr for a Zarr array)."
                )
            value = da.from_array(value, chunks=(FULL_PASS_CHUNK, *value.shape[1:]))
        if any(np.isnan(c) for c in value.shape):
            raise DataStoreError(
                f"data[{name!r}] has chunks of unknown size (shape {value.shape}); call "
                "compute_chunk_sizes() on it first."
            )
        self._check_array(i, value)
        self._opened[i] = ((value.shape, value.name), value, None, None)
        return value

    def refresh(self) -> int:
        """Read the current arrays (see :meth:`.RowStore.refresh`); look at new ones.

        The first look at arrays (at the first chain start, and again when an array or
        N changed, or after a :class:`~pymc_minibatch_mh.errors.DataChangedError`) is one
        pass on the cluster that refuses missing values
        (:func:`~pymc_minibatch_mh.store.sources.check_missing`) and records each row's
        fingerprint (:func:`row_fingerprint`), against which every later read is checked.
        """
        n = super().refresh()
        stamps = tuple(self._opened[i][0] for i in sorted(self._opened))
        if self._first_look is None or self._first_look[0] != stamps or self._look_again:
            self._first_look, self._look_again = None, False
            names = [self.name(i) for i in range(len(self.arrays))]
            parts = self._blockwise("the first look", _look, names)
            sums = np.array([part.sum(dtype=np.int64) for part in parts], dtype=np.int64)
            self._first_look = (stamps, np.concatenate(parts), sums)
        return n

    def _check_rows(self, rows: Sequence[NDArray[Any]], positions: Any, what: str) -> None:
        """Raise :class:`~pymc_minibatch_mh.errors.DataChangedError` for changed rows.

        ``rows`` were read now, at ``positions`` (indices or a slice); they are compared
        with the rows of the first look.
        """
        first = self._first_look
        if first is None:
            return
        changed = np.flatnonzero(row_fingerprint(*rows) != first[1][positions])
        if changed.size:
            self._look_again = True
            at = (changed + positions.start if isinstance(positions, slice)
                  else np.asarray(positions)[changed])
            raise _changed(self._what(what), f"rows {_rows_text(at)} differ")

    def _check_sums(self, sums: Sequence[Any], what: str) -> None:
        """The same check for a full pass on the cluster.

        Its tasks return the sums of their blocks' fingerprints (``_apply``).
        """
        first = self._first_look
        if first is None:
            return
        starts = np.arange(0, self.n_rows, FULL_PASS_CHUNK)
        changed = np.flatnonzero(np.asarray(sums, dtype=np.int64) != first[2])
        if changed.size:
            self._look_again = True
            blocks = ", ".join(f"{s:,}–{min(s + FULL_PASS_CHUNK, self.n_rows) - 1:,}"
                               for s in starts[changed[:3]])
            more = f" and {changed.size - 3} more" if changed.size > 3 else ""
            raise _changed(self._what(what), f"the blocks of rows {blocks}{more} differ")

    @staticmethod
    def _stamp(source: Any, array: Any) -> Any:
        return (array.shape, array.name)

    @property
    def nbytes(self) -> int:
        """Bytes of the data on the cluster."""
        return sum(int(a.nbytes) for a in self.arrays)

    # ------------------------------------------------------------ per step
    def start_chain(self, rng: np.random.Generator) -> None:
        """Start the chain's stream of rows, seeded by one draw from ``rng``."""
        self.close()
        seed = int(rng.integers(0, 2**63 - 1))
        # A weak reference: a store nobody uses any more (e.g. its step was dropped) is
        # collected, and its thread ends, without a close().
        self._buffer = StreamBuffer(self.n_rows, seed, weakref.WeakMethod(self._fetch))
        self._idx: NDArray[np.int64] = np.empty(0, dtype=np.int64)
        self._block_rows: tuple[NDArray[Any], ...] = ()
        self._pos = 0
        self._seen: set[int] = set()

    def close(self) -> None:
        """Stop the background thread of the current chain, if any."""
        if self._buffer is not None:
            self._buffer.close()
            self._buffer = None

    def start_step(self) -> None:
        """Open a step: rows taken from now on are new to it."""
        self._seen.clear()

    def take(self, count: int) -> tuple[NDArray[Any], ...]:
        """``count`` rows new to this step, the next ones of the uniform stream."""
        if count > self.n_rows - len(self._seen):
            raise ValueError(f"cannot take {count} more rows: {len(self._seen)} of "
                             f"{self.n_rows} rows are already used in this step")
        parts: list[tuple[NDArray[Any], ...]] = []
        need = count
        while need > 0:
            if self._pos >= self._idx.shape[0]:
                self._idx, self._block_rows = self._buffer.next_block()  # type: ignore[union-attr]
                self._pos = 0
            start = self._pos
            stop = min(start + need, self._idx.shape[0])
            candidates = self._idx[start:stop].tolist()
            self._pos = stop
            seen = self._seen
            if seen.isdisjoint(candidates) and len(set(candidates)) == stop - start:
                seen.update(candidates)
                parts.append(tuple([a[start:stop] for a in self._block_rows]))  # views
                need -= stop - start
                continue
            keep = []  # a row already in the step: skip it (rejection of repeats)
            for k, row in enumerate(candidates):
                if row not in seen:
                    seen.add(row)
                    keep.append(start + k)
            parts.append(tuple([a[keep] for a in self._block_rows]))
            need -= len(keep)
        if len(parts) == 1:
            return parts[0]
        return tuple([np.concatenate(p) for p in zip(*parts, strict=True)])

    def _fetch(self, positions: NDArray[np.int64]) -> tuple[NDArray[Any], ...]:
        rows = compute(self._what("the per-step rows"), *[a[positions] for a in self.arrays])
        self._check_rows(rows, positions, "the per-step rows")
        return self._cast(list(rows)) if self._casts else tuple(rows)

    def rows(self, positions: NDArray[np.int64]) -> tuple[NDArray[Any], ...]:
        """The rows at ``positions``, computed by Dask (slow; not used per step)."""
        order = np.argsort(positions, kind="stable")
        out = []
        for part in self._fetch(np.asarray(positions)[order]):
            rows = np.empty_like(part)
            rows[order] = part
            out.append(rows)
        return tuple(out)

    # ------------------------------------------------------------ full passes
    def reduce(self, fn: Callable[..., Any], *args: Any) -> list[Any]:
        """``fn(*args, *block)`` for each block of a full pass, computed on the cluster.

        ``fn`` is sent to each worker once (a data dependency of the tasks, not part of
        every task); each task reads its block where the data are and returns only
        ``fn``'s result.
        """
        self.check_unchanged()
        results = self._blockwise("a full pass", _apply, fn, args, self._casts)
        self._check_sums([sum_ for _, sum_ in results], "a full pass")
        self.check_unchanged()
        return [part for result, _ in results for part in result]

    def _blockwise(self, what: str, task: Callable[..., Any], *args: Any) -> list[Any]:
        """``task(*args, start, *block)`` for each block of ``FULL_PASS_CHUNK`` rows.

        Computed on the cluster; callable arguments are sent to each worker once (data
        dependencies of the tasks, not part of every task).
        """
        import dask

        shipped = [dask.delayed(a, pure=True) if callable(a) else a for a in args]
        run = dask.delayed(task, pure=True)
        tasks = [run(*shipped, start, *[a[start:start + FULL_PASS_CHUNK] for a in self.arrays])
                 for start in range(0, self.n_rows, FULL_PASS_CHUNK)]
        return list(compute(self._what(what), *tasks))

    def chunks(self, size: int = FULL_PASS_CHUNK) -> Iterator[tuple[NDArray[Any], ...]]:
        """A full pass, block by block (the next block computed while this one is used).

        In calls of :func:`~pymc_minibatch_mh.store.row_store.pass_rows` rows.
        """
        n = self.n_rows
        self.check_unchanged()
        bounds = [(start, min(n, start + size)) for start in range(0, n, size)]
        what = self._what("a full pass")
        with ThreadPoolExecutor(max_workers=1) as ahead:
            def submit(b: tuple[int, int]) -> Any:
                return ahead.submit(compute, what, *[a[b[0]:b[1]] for a in self.arrays])

            pending = submit(bounds[0])
            for k in range(len(bounds)):
                chunk = list(pending.result())
                if k + 1 < len(bounds):
                    pending = submit(bounds[k + 1])
                self._check_rows(chunk, slice(*bounds[k]), "a full pass")
                yield from pass_chunks(self._cast(chunk) if self._casts else chunk)
        self.check_unchanged()


def _apply(fn: Callable[..., Any], args: tuple[Any, ...], casts: list[Any], start: int,
           *block: NDArray[Any]) -> tuple[Any, int]:
    """One task of :meth:`DaskRowStore.reduce`: ``fn`` on a block, and its fingerprint sum.

    ``fn`` gets the block cast as the store casts, in the store's calls of
    :func:`~pymc_minibatch_mh.store.row_store.pass_rows` rows (a list of its results); the
    sum is of the block's row fingerprints (:func:`row_fingerprint`). Arrays sent to a
    worker process may arrive unaligned (see
    :func:`~pymc_minibatch_mh.store.dask_compute.aligned`).
    """
    args, block = aligned(args), aligned(block)
    parts = pass_chunks(cast_rows(block, casts) if casts else block)
    return [fn(*args, *part) for part in parts], int(row_fingerprint(*block).sum(dtype=np.int64))


def _look(names: list[str], start: int, *block: NDArray[Any]) -> NDArray[np.uint16]:
    """One task of the first look at the arrays: refuse missing values, fingerprint rows."""
    for name, part in zip(names, block, strict=True):
        check_missing(name, part, start)
    return row_fingerprint(*block)


def row_fingerprint(*blocks: NDArray[Any]) -> NDArray[np.uint16]:
    """Two bytes per row of ``blocks`` (arrays of the same rows), from the rows' bits.

    A multiply–shift hash (Dietzfelbinger et al. 1997): each row's words (its values' bits
    as unsigned integers) are multiplied by fixed odd 64-bit weights, one per word, and
    summed modulo 2⁶⁴ (one integer matrix–vector product), and the top 16 bits are kept.
    A row whose bits changed keeps its fingerprint with probability about 2⁻¹⁶; cost: well
    under a nanosecond per value.
    """
    total = np.zeros(blocks[0].shape[0], dtype=np.uint64)
    column = 0
    for block in blocks:
        values = np.ascontiguousarray(block).reshape(block.shape[0], -1)
        size = values.dtype.itemsize
        words = (values.view(np.uint64) if size % 8 == 0
                 else values.view(f"u{size}").astype(np.uint64))
        k = words.shape[1]
        total += words @ _weights(column, k)
        column += k
    return (total >> np.uint64(48)).astype(np.uint16)


def _weights(start: int, k: int) -> NDArray[np.uint64]:
    """The hash's weights of words ``start .. start + k − 1``: fixed, odd."""
    every = np.random.default_rng(0).integers(0, 2**64, size=start + k, dtype=np.uint64)
    return every[start:] | np.uint64(1)


def _rows_text(rows: NDArray[Any]) -> str:
    shown = ", ".join(f"{int(r):,}" for r in rows[:3])
    return shown + (f" and {rows.size - 3:,} more" if rows.size > 3 else "")


def _changed(what: str, how: str) -> DataChangedError:
    return DataChangedError(
        f"The rows read for {what} are not the rows first read: {how}. The files under a "
        "Dask array changed while the step used it (an array that is not persisted reads "
        "its files again at each read, and Dask reads them again for a block lost with a "
        "worker). Rows from before and after the change must not be mixed: let the files "
        "be while a chain runs. The next chain start reads the data afresh."
    )
