"""A shuffled local copy of the ``data=`` arrays, read by the step in blocks of rows.

Each step of a minibatch test reads about a hundred random rows. From a ``.npy`` file that
is a hundred ``pread(2)`` calls per array (about 1 µs each), several times the cost of the
step's arithmetic. With ``shuffled_copy=True`` the row store instead writes every ``data=``
array once to a local ``.npy`` file whose rows are in a uniformly random order (the same
order for every array), and a step reads *blocks* of :data:`BLOCK_ROWS` consecutive rows of
that copy: one ``pread`` per block and array.

What a step sees: the blocks of a step are drawn uniformly without replacement among the
⌈N / B⌉ blocks (:class:`~pymc_minibatch_mh.core.rows.PartialShuffleRows` on blocks), and the
test takes their rows in order. The positions read depend only on the chain's generator,
never on the data, and the copy's order is a uniform random permutation independent of
them: so the rows a step sees, in order, are *exactly* a uniformly random ordered sample
without replacement of the data — the same law as without blocks — for each step taken
alone. What blocks add is that the order is fixed for the chain: two steps that draw the
same block see the same B rows together. Within a step the test estimates the variance of
the mean from the rows, which is right on average over the shuffle; for the one shuffle
the chain uses, the variance of a block sum differs from B times the row variance by a
relative O(√(B/N)) (about 10⁻³ at N = 10⁷, B = 32), far below the test's own error.

How the copy is written (:func:`write_shuffled`), with memory bounded by a chunk and no
disk beyond the copy: the rows are dealt into K = ⌈N / chunk⌉ buckets by independent
uniform draws; pass 1 reads the source in order and appends each row to its bucket's
region of the output file (the regions' sizes are known beforehand: the draws come from
fixed seeds, per chunk of rows); pass 2 reads each region, permutes its rows uniformly
and writes them back in place. A uniform bucket for each row followed by a uniform order
within each bucket is a uniform permutation of the N rows. Cost: the copy's size on disk
(in ``TMPDIR``), one read of the source, and two writes and one read of the copy. The
seeds are fixed (:data:`SHUFFLE_SEED`), so the copy, and the draws of a seeded chain, are
reproducible; arrays of the same N get the same order.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from functools import cached_property
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pymc_minibatch_mh.errors import DataChangedError, DataStoreError
from pymc_minibatch_mh.store import sources
from pymc_minibatch_mh.store.sources import NpyFile, _local_file, _pwrite, check_missing

__all__ = ["BLOCK_ROWS", "SHUFFLE_SEED", "ShufflePlan", "source_blocks", "write_shuffled"]

#: Rows per block that a step reads from a shuffled copy (one ``pread`` per block).
BLOCK_ROWS = 32
#: The seed of the shuffle (a fixed layout of the copy, not a chain's randomness).
SHUFFLE_SEED = 2017


class ShufflePlan:
    """The random order of N rows: bucket of each row, and each bucket's region.

    Parameters
    ----------
    n_rows : int
        N.
    seed : int
        The shuffle's seed.
    chunk : int, optional
        Rows per chunk of bucket draws, and the mean bucket size (default: the rows per
        block of a copy, ``sources.COPY_BLOCK``).

    """

    def __init__(self, n_rows: int, seed: int = SHUFFLE_SEED, chunk: int | None = None) -> None:
        self.n_rows = int(n_rows)
        self.seed = int(seed)
        self.chunk = int(sources.COPY_BLOCK if chunk is None else chunk)
        self.buckets = max(1, -(-self.n_rows // self.chunk))

    def _generator(self, *key: int) -> np.random.Generator:
        return np.random.default_rng(np.random.SeedSequence([self.seed, *key]))

    def bucket_ids(self, start: int, stop: int) -> NDArray[np.int64]:
        """The buckets of rows ``start:stop`` (the same whatever the source's chunking)."""
        parts = []
        for c in range(start // self.chunk, (stop - 1) // self.chunk + 1):
            first = c * self.chunk
            size = min(self.chunk, self.n_rows - first)
            ids = self._generator(0, c).integers(self.buckets, size=size)
            parts.append(ids[max(0, start - first) : stop - first])
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    @cached_property
    def bounds(self) -> NDArray[np.int64]:
        """Row offsets of the buckets' regions in the copy (K + 1 values)."""
        counts = np.zeros(self.buckets, np.int64)
        for start in range(0, self.n_rows, self.chunk):
            counts += np.bincount(self.bucket_ids(start, min(self.n_rows, start + self.chunk)),
                                  minlength=self.buckets)
        return np.concatenate(([0], np.cumsum(counts)))

    def permutation(self, bucket: int, size: int) -> NDArray[np.int64]:
        """The order of the rows within a bucket."""
        return self._generator(1, bucket).permutation(size)


def source_blocks(source: Any, size: int | None = None) -> Iterator[NDArray[Any]]:
    """The rows of an opened source in order, in blocks (bounded memory)."""
    size = sources.COPY_BLOCK if size is None else size
    if hasattr(source, "blocks"):  # Zarr, Parquet: decoded chunk by chunk
        yield from source.blocks(size)
        return
    if isinstance(source, NpyFile):  # read with pread(2): a truncated file is an error
        for start in range(0, source.array.shape[0], size):
            yield source.read_block(start, start + size)
            source.release(start, start + size)
        return
    for start in range(0, source.shape[0], size):
        yield source[start : start + size]


def write_shuffled(name: str, source: Any, shape: tuple[int, ...], dtype: np.dtype,
                   plan: ShufflePlan) -> NpyFile:
    """Write the rows of ``source`` in the plan's random order to a local ``.npy`` file.

    Parameters
    ----------
    name : str
        The data's name (messages, file name).
    source : numpy.ndarray, NpyFile or a chunked source
        The opened source (:func:`~pymc_minibatch_mh.store.sources.open_source`).
    shape, dtype
        Its shape and dtype.
    plan : ShufflePlan
        The order (the same plan for every array of the store).

    Returns
    -------
    NpyFile
        The copy, deleted with the step. The rows are checked for missing values.

    """
    from pymc_minibatch_mh.progress import note

    n = shape[0]
    if n != plan.n_rows:
        raise DataStoreError(f"data[{name!r}] has {n:,} rows, the shuffle {plan.n_rows:,}.")
    row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
    with _local_file(name, n * row_bytes, f"The shuffled copy of {name!r}") as path:
        header = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)
        offset = header.offset
        del header
        bounds = plan.bounds
        filled = bounds[:-1].copy()
        fd = os.open(path, os.O_RDWR)
        try:
            start = 0
            # Pass 1: each row to its bucket's region.
            for block in source_blocks(source, plan.chunk):
                note(f"shuffled copy of {name!r}: dealing rows {start:,} of {n:,}")
                block = np.ascontiguousarray(block, dtype=dtype)
                stop = start + block.shape[0]
                if stop > n:
                    break
                check_missing(name, block, start)
                ids = plan.bucket_ids(start, stop)
                order = np.argsort(ids, kind="stable")
                counts = np.bincount(ids, minlength=plan.buckets)
                ends = np.cumsum(counts)
                dealt = block[order]
                for k in np.flatnonzero(counts).tolist():
                    _pwrite(fd, dealt[ends[k] - counts[k] : ends[k]],
                            offset + int(filled[k]) * row_bytes)
                filled += counts
                start = stop
            if start != n or not np.array_equal(filled, bounds[1:]):
                raise DataChangedError(
                    f"The data {name!r} gave a different number of rows while it was copied "
                    f"than the {n:,} it had when opened: it changed while being read."
                )
            for k in range(plan.buckets):  # pass 2: a random order within each bucket
                note(f"shuffled copy of {name!r}: bucket {k + 1:,} of {plan.buckets:,}")
                lo, hi = int(bounds[k]), int(bounds[k + 1])
                rows = np.empty((hi - lo, *shape[1:]), dtype)
                if os.preadv(fd, [memoryview(rows).cast("B")],
                             offset + lo * row_bytes) != rows.nbytes:
                    raise DataChangedError(f"The shuffled copy {path} was changed while written.")
                _pwrite(fd, rows[plan.permutation(k, hi - lo)], offset + lo * row_bytes)
        finally:
            os.close(fd)
        return NpyFile(path, owned=True)
