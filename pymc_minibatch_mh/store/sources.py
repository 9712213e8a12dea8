"""Per-row data outside the model: ``.npy`` memmaps, Zarr arrays, Parquet columns.

A step given ``data={"X": ..., "y": ...}`` reads those arrays instead of the model's
``pm.Data`` values (the model is built on a small in-memory slice, for shapes). This module
opens each array as a *source* for the row store
(:class:`~pymc_minibatch_mh.store.row_store.RowStore`):

- a NumPy array is used as it is;
- a ``.npy`` file (a path, or an array from ``np.load(path, mmap_mode="r")``) is mapped
  read-only (:class:`NpyFile`): a step reads only its rows (random rows from the page
  cache), a full pass reads the file in order, and the pages a pass touched are handed
  back to the kernel after each chunk, so the resident memory stays bounded;
- a Zarr array or a :class:`ParquetColumn` is stored compressed in chunks, where one
  random row costs decoding a whole chunk. Such a source is therefore copied *once*, in
  order and chunk by chunk, to an uncompressed ``.npy`` file in the temporary directory
  (``TMPDIR``): N × row bytes of disk (8 GB for N = 10⁸, d = 10, float64) and one
  sequential pass at set-up, during which the data are also checked for missing values.
  The copy is then read like any ``.npy`` file and deleted with the step.

Every source has a *stamp* (shape, size and modification times of its files) that the row
store compares at each chain start and at each full pass, so a source that changes is
noticed, never silently mixed with the old data. Dask arrays have their own store
(:mod:`~pymc_minibatch_mh.store.dask_store`). The optional dependencies (zarr, pyarrow,
dask) are imported only when such an array is given.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import shutil
import tempfile
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numba
import numpy as np
from numpy.typing import NDArray

from pymc_minibatch_mh.errors import DataChangedError, DataStoreError

__all__ = [
    "NpyFile",
    "ParquetColumn",
    "check_disk",
    "check_missing",
    "is_dask",
    "open_source",
]

#: Rows per block when a chunked source is copied to its uncompressed local file.
COPY_BLOCK = 1 << 18


@dataclass(frozen=True)
class ParquetColumn:
    """One or more numeric columns of a Parquet file, as one per-row array.

    Parameters
    ----------
    path : str or Path
        The Parquet file.
    columns : str or sequence of str
        One column (a 1-d array of N rows) or several (an ``(N, len(columns))`` array, in
        this order).

    Examples
    --------
    >>> from pymc_minibatch_mh.store.sources import ParquetColumn
    >>> ParquetColumn("data.parquet", ["x0", "x1"]).columns
    ('x0', 'x1')

    """

    path: str | Path
    columns: str | Sequence[str]

    def __post_init__(self) -> None:
        cols = self.columns
        object.__setattr__(self, "columns", cols if isinstance(cols, str) else tuple(cols))

    @property
    def names(self) -> list[str]:
        """The column names, as a list."""
        return [self.columns] if isinstance(self.columns, str) else list(self.columns)


def is_dask(value: Any) -> bool:
    """Whether ``value`` is a Dask array (without importing Dask)."""
    return type(value).__module__.startswith("dask.") and hasattr(value, "chunks")


def _file_stamp(path: Path) -> tuple[Any, ...]:
    """Size and modification time of a file, or of every file under a directory."""
    if path.is_file():
        st = path.stat()
        return (st.st_size, st.st_mtime_ns)
    count = size = latest = 0
    for root, _, names in os.walk(path):  # streamed: O(1) memory for any number of chunks
        for name in names:
            st = os.stat(os.path.join(root, name))
            count, size, latest = count + 1, size + st.st_size, max(latest, st.st_mtime_ns)
    return (count, size, latest)


def check_missing(name: str, block: NDArray[Any], start: int) -> None:
    """Raise :class:`~pymc_minibatch_mh.errors.DataStoreError` if a block has missing values.

    Missing: NaN in any of its rows.

    Parameters
    ----------
    name : str
        The data's name (for the message).
    block : numpy.ndarray
        Rows ``start, start + 1, ...`` of the data.
    start : int
        The first row's index.

    """
    if block.dtype.kind not in "fc":
        return
    bad = np.isnan(block)
    if not bad.any():
        return
    rows = np.flatnonzero(bad.reshape(block.shape[0], -1).any(axis=1))
    raise DataStoreError(
        f"The data {name!r} has missing values (NaN) in {rows.size} rows of the chunk of rows "
        f"{start:,}–{start + block.shape[0] - 1:,} (first at row {start + int(rows[0]):,}). "
        "A minibatch step cannot skip rows: drop or impute them in the store, then build "
        "the step again."
    )


def check_disk(folder: Path, nbytes: int, what: str) -> None:
    """Raise :class:`~pymc_minibatch_mh.errors.DataStoreError` if ``folder`` lacks room.

    Room: ``nbytes`` free on its file system.
    """
    free = shutil.disk_usage(folder).free
    if free < nbytes:
        raise DataStoreError(
            f"{what} needs {nbytes / 2**30:.2f} GiB in {folder}, which has "
            f"{free / 2**30:.2f} GiB free. Point TMPDIR to a larger disk, or free space."
        )


@contextmanager
def _local_file(name: str, nbytes: int, what: str) -> Iterator[Path]:
    """The path of a new local ``.npy`` file for ``name``, in a new temporary folder.

    The free space is checked first (:func:`check_disk`). On any error while the file is
    written, the folder is deleted with what was written, so no partial copy is left
    behind; a full disk (``ENOSPC``, ``EDQUOT``) is raised as a
    :class:`~pymc_minibatch_mh.errors.DataStoreError` that says so.
    """
    folder = Path(tempfile.mkdtemp(prefix="pymc_minibatch_mh_"))
    try:
        check_disk(folder, nbytes, what)
        yield folder / f"{name}.npy"
    except OSError as err:
        shutil.rmtree(folder, ignore_errors=True)
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DataStoreError(
                f"{what} ran out of disk space in {folder} while it was written "
                f"({err.strerror}); the partial copy was deleted. Point TMPDIR to a larger "
                "disk, or free space."
            ) from err
        raise
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


def _pwrite(fd: int, data: NDArray[Any], offset: int) -> None:
    """Write all of ``data`` at byte ``offset`` of the open file ``fd``."""
    view = memoryview(np.ascontiguousarray(data)).cast("B")
    while view.nbytes:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _libc_pread() -> Any:
    """``pread(2)`` of the C library (None where there is none, e.g. on Windows)."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).pread
    except (OSError, TypeError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_longlong]
    fn.restype = ctypes.c_ssize_t
    return fn


_PREAD = _libc_pread()


@numba.njit(nogil=True)
def _pread_runs(fd: int, offset: int, row_bytes: int, starts: NDArray[np.int64], run: int,
                n_rows: int, out: NDArray[Any]) -> int:  # pragma: no cover - compiled
    # One pread per run of rows starts[k] .. min(starts[k] + run, n_rows) - 1, packed into
    # the rows of out; the number of rows read (less than asked when the file is short).
    address = out.ctypes.data
    k_rows = 0
    for k in range(starts.shape[0]):
        count = min(run, n_rows - starts[k])
        size = count * row_bytes
        if _PREAD(fd, address + k_rows * row_bytes, size,
                  offset + starts[k] * row_bytes) != size:
            return -1
        k_rows += count
    return k_rows


class NpyFile:
    """A ``.npy`` file mapped read-only, with its pages handed back after reading.

    Parameters
    ----------
    path : str or Path
        The file (written by ``np.save``, ``np.lib.format.open_memmap`` or a copy made by
        this module), in C order.
    owned : bool
        Delete the file when this object is garbage collected (local copies only).

    Attributes
    ----------
    array : numpy.ndarray
        The file's data (a read-only view of the mapping; no copy).

    """

    def __init__(self, path: str | Path, *, owned: bool = False) -> None:
        self.path = Path(path)
        with open(self.path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            shape, fortran, dtype = read_header(f)
            offset = f.tell()
            if fortran and len(shape) > 1:
                raise DataStoreError(
                    f"{self.path} is stored in Fortran order, so a row is not contiguous on "
                    "disk. Save it in C order (np.save(path, np.ascontiguousarray(x)))."
                )
            size = int(np.prod(shape)) * dtype.itemsize
            self._mmap = (mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None)
        # Per-step rows are read with pread(2): a page fault on the mapping would map the
        # pages around the row too (the kernel's fault-around), 3 × the time per row here,
        # and count them in the resident memory.
        self._fd = os.open(self.path, os.O_RDONLY) if _PREAD is not None and size else -1
        if self._fd >= 0:
            weakref.finalize(self, os.close, self._fd)
        self._opened_as = self._state()
        self.offset = offset
        self.row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
        buffer = self._mmap if self._mmap is not None else b""
        self.array: NDArray[Any] = np.ndarray(shape, dtype, buffer=buffer,
                                              offset=offset if size else 0)
        if self._mmap is not None and hasattr(mmap, "MADV_RANDOM"):
            self._mmap.madvise(mmap.MADV_RANDOM)  # per-step rows: no read-ahead
        if owned:
            weakref.finalize(self, _remove, self.path)

    def stamp(self) -> tuple[Any, ...]:
        """Shape, size and modification time of the file."""
        return (self.array.shape, *_file_stamp(self.path))

    def _state(self) -> tuple[int, int]:
        st = os.fstat(self._fd) if self._fd >= 0 else os.stat(self.path)
        return (st.st_size, st.st_mtime_ns)

    def check_unchanged(self) -> None:
        """Raise :class:`~pymc_minibatch_mh.errors.DataChangedError` if the file was written to.

        One ``fstat`` of the open file (its size and modification time against those at
        opening): a file truncated, appended to or overwritten in place is refused. A file
        replaced by renaming a new one over it is not seen here: the old file stays open
        and is read unchanged (the path's :meth:`stamp` sees the replacement).
        """
        if self._state() != self._opened_as:
            raise DataChangedError(
                f"{self.path} was written to (truncated, appended to or overwritten) while "
                "a chain was reading it, so its rows can no longer be trusted. Do not write "
                "to a data file while a chain uses it: write a new file and rename it over "
                "the old one (os.replace), which the next chain start follows."
            )

    def read_rows(self, idx: NDArray[np.int64]) -> NDArray[Any]:
        """The rows at ``idx`` (int64), read with ``pread(2)`` (no pages mapped).

        Where the C library has no ``pread`` the rows are read through the mapping.

        Raises
        ------
        DataChangedError
            If the file is shorter than its header says (it changed).

        """
        return self.read_runs(idx, 1)

    def read_runs(self, starts: NDArray[np.int64], run: int) -> NDArray[Any]:
        """Rows ``s, s + 1, …, s + run − 1`` for each ``s`` in ``starts`` (int64), in order.

        A run stops at the last row of the file. One ``pread(2)`` per run.

        Raises
        ------
        DataChangedError
            If the file is shorter than its header says (it changed).

        """
        array = self.array
        if self._fd < 0:
            if run == 1:
                return array[starts]
            return np.concatenate([array[s:s + run] for s in starts.tolist()])
        out = np.empty((starts.shape[0] * run, *array.shape[1:]), array.dtype)
        got = _pread_runs(self._fd, self.offset, self.row_bytes, starts, run, array.shape[0],
                          out)
        if got < 0:
            raise DataChangedError(
                f"{self.path} is shorter than when it was opened: it changed while a step "
                "was reading it. Do not write to a data file while a chain uses it."
            )
        return out if got == out.shape[0] else out[:got]

    def read_block(self, start: int, stop: int) -> NDArray[Any]:
        """Rows ``start:stop``, read with one ``pread(2)`` into a new array (no page mapped).

        A full pass reads the file this way, so a file truncated under it gives
        :class:`~pymc_minibatch_mh.errors.DataChangedError`, not the bus error (SIGBUS)
        of a read through the mapping. Where the C library has no ``pread`` (Windows, which
        does not let a mapped file be truncated) this is a view of the mapping.

        Raises
        ------
        DataChangedError
            If the file is shorter than its header says (it changed).

        """
        stop = min(stop, self.array.shape[0])
        if self._fd < 0:
            return self.array[start:stop]
        return self.read_runs(np.array([start], dtype=np.int64), max(0, stop - start))

    def release(self, start: int = 0, stop: int | None = None) -> None:
        """Hand the mapped pages of rows ``start:stop`` back to the kernel.

        They stay in the page cache (a later read is cheap) but no longer count in this
        process's resident memory.
        """
        if self._mmap is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        stop = self.array.shape[0] if stop is None else stop
        page = mmap.PAGESIZE
        first = (self.offset + start * self.row_bytes) // page * page
        last = min(len(self._mmap), self.offset + stop * self.row_bytes)
        if last > first:
            self._mmap.madvise(mmap.MADV_DONTNEED, first, last - first)


def _remove(path: Path) -> None:
    shutil.rmtree(path.parent, ignore_errors=True)


class _Chunked:
    """A compressed, chunked source (Zarr array or Parquet columns) read in order."""

    def __init__(self, name: str, shape: tuple[int, ...], dtype: np.dtype,
                 path: Path | None) -> None:
        self.name = name
        self.shape = shape
        self.dtype = dtype
        self.path = path

    def stamp(self) -> tuple[Any, ...]:
        return (self.shape, *(_file_stamp(self.path) if self.path is not None else ()))

    def blocks(self, size: int) -> Iterator[NDArray[Any]]:  # pragma: no cover - abstract
        raise NotImplementedError

    def copy_to_npy(self) -> NpyFile:
        """Copy the rows in order to an uncompressed ``.npy`` file; check missing values."""
        from pymc_minibatch_mh.progress import note

        row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize
        what = f"The local copy of {self.name!r}"
        with _local_file(self.name, self.shape[0] * row_bytes, what) as path:
            out = np.lib.format.open_memmap(path, mode="w+", dtype=self.dtype, shape=self.shape)
            offset = out.offset
            del out
            start = 0
            fd = os.open(path, os.O_RDWR)
            try:
                for block in self.blocks(COPY_BLOCK):
                    note(f"copying {self.name!r} to a local file: row {start:,} of "
                         f"{self.shape[0]:,}")
                    block = np.ascontiguousarray(block, dtype=self.dtype)
                    check_missing(self.name, block, start)
                    _pwrite(fd, block, offset + start * row_bytes)
                    start += block.shape[0]
            finally:
                os.close(fd)
            if start != self.shape[0]:
                raise DataChangedError(
                    f"The data {self.name!r} gave {start:,} rows while it was copied, not the "
                    f"{self.shape[0]:,} it had when opened: it changed while being read."
                )
            return NpyFile(path, owned=True)


class _ZarrSource(_Chunked):
    def __init__(self, name: str, array: Any) -> None:
        root = getattr(array.store, "root", None)
        path = Path(root) / array.path if root is not None else None
        super().__init__(name, tuple(array.shape), np.dtype(array.dtype), path)
        self.array = array

    def blocks(self, size: int) -> Iterator[NDArray[Any]]:
        step = max(1, size // self.array.chunks[0]) * self.array.chunks[0]  # whole chunks
        for start in range(0, self.shape[0], step):
            yield np.asarray(self.array[start : start + step])


class _ParquetSource(_Chunked):
    def __init__(self, name: str, column: ParquetColumn) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.column = column
        try:
            self.file = pq.ParquetFile(column.path)
        except pa.ArrowInvalid as err:  # not a whole Parquet file (e.g. truncated)
            raise DataStoreError(
                f"data[{name!r}]: {column.path} cannot be read as a Parquet file ({err}). If "
                "it was being written or replaced, wait until it is complete; else write it "
                "again."
            ) from err
        schema = self.file.schema_arrow
        missing = [c for c in column.names if c not in schema.names]
        if missing:
            raise DataStoreError(
                f"The Parquet file {column.path} has no columns {missing} (it has "
                f"{schema.names}). Name existing columns in ParquetColumn."
            )
        types = {schema.field(c).type.to_pandas_dtype() for c in column.names}
        if len(types) != 1:
            raise DataStoreError(
                f"The columns {column.names} of {column.path} have different types "
                f"({sorted(map(str, types))}); one array needs one dtype. Store them with one "
                "type."
            )
        dtype = np.dtype(types.pop())
        n = self.file.metadata.num_rows
        shape = (n,) if isinstance(column.columns, str) else (n, len(column.names))
        super().__init__(name, shape, dtype, Path(column.path))

    def blocks(self, size: int) -> Iterator[NDArray[Any]]:
        start = 0
        for batch in self.file.iter_batches(batch_size=size, columns=self.column.names):
            if any(col.null_count for col in batch.columns):
                raise DataStoreError(
                    f"The data {self.name!r} ({self.column.path}) has missing values (nulls) "
                    f"in the rows {start:,}–{start + batch.num_rows - 1:,}. A minibatch step "
                    "cannot skip rows: drop or impute them, then build the step again."
                )
            cols = [col.to_numpy(zero_copy_only=False) for col in batch.columns]
            start += batch.num_rows
            yield cols[0] if isinstance(self.column.columns, str) else np.column_stack(cols)


def open_source(name: str, value: Any) -> NDArray[Any] | NpyFile | _Chunked:
    """Open one entry of ``data=``: an array, a mapped ``.npy`` file or a chunked source.

    Parameters
    ----------
    name : str
        The data's name in the model.
    value : array_like, str, Path, zarr.Array or ParquetColumn
        The data. A memmap of a ``.npy`` file stands for the file (a replaced file is
        read afresh at the next chain start).

    Returns
    -------
    numpy.ndarray, NpyFile or a chunked source
        A chunked source (Zarr, Parquet) still has to be copied with ``copy_to_npy``.

    Raises
    ------
    DataStoreError
        For a value of a type that is not supported.

    """
    if isinstance(value, str | os.PathLike):
        if not str(value).endswith(".npy"):
            raise DataStoreError(
                f"data[{name!r}] = {str(value)!r}: a path must name a .npy file (np.save). "
                "Give Zarr arrays as zarr.open_array(...) and Parquet columns as "
                "ParquetColumn(path, columns)."
            )
        return NpyFile(value)
    if isinstance(value, np.memmap) and getattr(value, "filename", None):
        if not str(value.filename).endswith(".npy"):
            raise DataStoreError(
                f"data[{name!r}] is a memmap of {value.filename}, not of a .npy file: save "
                "the data with np.save and give its path (or np.load(path, mmap_mode='r'))."
            )
        return NpyFile(value.filename)  # the file, followed when it is replaced
    if isinstance(value, ParquetColumn):
        return _ParquetSource(name, value)
    if type(value).__module__.startswith("zarr"):
        return _ZarrSource(name, value)
    if isinstance(value, np.ndarray):
        return value
    raise DataStoreError(
        f"data[{name!r}] is a {type(value).__name__}; expected a NumPy array, the path of a "
        ".npy file, a zarr array, a ParquetColumn or a Dask array."
    )
