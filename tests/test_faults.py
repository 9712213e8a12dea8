"""Faults during sampling: NaN likelihoods, exceptions inside parallel chains, data changed
under a running chain, a full disk while a local copy is written."""

from __future__ import annotations

import errno
import gc
import glob
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pymc as pm
import pytest
from conftest import nan_model, sample_kwargs
from test_out_of_core import (
    D,
    N,
    _rewrite,
    logistic_data,
    logistic_model,
    row_vars,
    write_store,
    x_and_y,
)

from pymc_minibatch_mh import MinibatchBarker
from pymc_minibatch_mh.errors import DataChangedError, DataStoreError
from pymc_minibatch_mh.model.compat import posterior, sample_stats
from pymc_minibatch_mh.store import sources
from pymc_minibatch_mh.store.registry import make_store, resolve_data


def test_nan_loglik_rejects_counts_and_warns_once():
    model = nan_model()
    with model:
        step = MinibatchBarker(batch_size=50, temperature=50.0, S=[0.3], tune=False)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            idata = pm.sample(draws=300, tune=0, step=step, chains=1, **sample_kwargs())
    ss = sample_stats(idata)
    nonfinite = np.asarray(ss["nonfinite"])
    assert nonfinite.sum() > 5  # proposals beyond 0.3 happen often
    assert np.all(np.asarray(ss["accepted"])[nonfinite] == 0.0)
    assert np.all(np.asarray(posterior(idata)["mu"]) <= 0.3)
    ours = [w for w in caught if "NaN or infinite log-likelihood" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in caught]


class FailingBarker(MinibatchBarker):
    """Raises inside the chain after a few steps (to test error propagation)."""

    def step(self, point):
        if self._chain_steps >= 5:
            raise RuntimeError("deliberate failure inside the step")
        return super().step(point)


def test_exception_in_parallel_chain_reaches_user_with_chain_number():
    data = np.random.default_rng(1).normal(size=300)
    with pm.Model():
        mu = pm.Normal("mu")
        pm.Normal("y", mu, 1, observed=data)
        step = FailingBarker(batch_size=50, temperature=10.0, S=[0.1], tune=False)
        with pytest.raises(Exception) as info:
            pm.sample(draws=20, tune=0, step=step, chains=2, cores=2, mp_ctx="fork",
                      **sample_kwargs())
    # PyMC's ParallelSamplingError: "Chain 1 failed with: <cause>", cause chained.
    assert re.search(r"Chain \d failed with: deliberate failure inside the step", str(info.value))
    assert isinstance(info.value.__cause__, RuntimeError)


# --------------------------------------------------- data changed under a running chain
# Faults of the data given with data= (docs: the guide's "Faults" page). A change while a
# chain runs is refused with DataChangedError at the next read, or, where the chain reads
# a local copy, has no effect on the chain (the documented safe behaviour); it never gives
# rows from before and after the change, nor a bus error.


class ChangingBarker(MinibatchBarker):
    """Calls ``change()`` once, before the chain's sixth step (a file written mid-chain)."""

    change = None

    def step(self, point):
        if self._chain_steps == 5 and self.change is not None:
            change, self.change = self.change, None
            change()
        return super().step(point)


def _truncate(path):
    os.truncate(path, os.path.getsize(path) - 4096)


def _append(path):
    with open(path, "ab") as f:
        f.write(b"\0" * 4096)


def _overwrite(path):
    """np.save over the mapped file itself: the same size, other values."""
    np.save(path, -np.load(path))


IN_PLACE = {"truncated": _truncate, "appended": _append, "overwritten": _overwrite}


@pytest.mark.parametrize("change", list(IN_PLACE))
def test_a_npy_file_written_to_under_a_running_chain_is_refused_at_the_next_step(
        change, tmp_path):
    x, y = logistic_data()
    data = write_store("npy", x, y, tmp_path)
    with logistic_model(x[:50], y[:50]):
        step = ChangingBarker(batch_size=100, S=[0.05] * D, tune=False, data=data)
        step.change = lambda: IN_PLACE[change](tmp_path / "X.npy")
        with pytest.raises(DataChangedError, match=r"X\.npy (was written to|is shorter)"):
            pm.sample(draws=50, tune=0, step=step, chains=1, **sample_kwargs())


def test_a_npy_file_replaced_under_a_running_chain_leaves_the_chain_as_it_was(tmp_path):
    """A new file renamed over the old one (os.replace): the chain reads the file it
    opened to its end (the same draws as undisturbed), the next chain reads the new one."""
    x, y = logistic_data()
    data = write_store("npy", x, y, tmp_path)
    x2, y2 = logistic_data(n=1200, seed=9)
    draws = {}
    for kind in ("undisturbed", "replaced"):
        with logistic_model(x[:50], y[:50]) as model:
            step = ChangingBarker(batch_size=100, S=[0.05] * D, tune=False, data=data)
            if kind == "replaced":
                step.change = lambda: (_rewrite(tmp_path / "X.npy", x2),
                                       _rewrite(tmp_path / "y.npy", y2))
            idata = pm.sample(draws=30, tune=0, step=step, chains=1, **sample_kwargs())
        draws[kind] = np.asarray(posterior(idata)["b"])
    np.testing.assert_array_equal(draws["replaced"], draws["undisturbed"])
    assert step._n_rows == N
    with model:
        pm.sample(draws=5, tune=0, step=step, chains=1, **sample_kwargs())
    assert step._n_rows == 1200


_BUS_ERROR_SCRIPT = """
import os, sys
import numpy as np
import pytensor
from pymc_minibatch_mh.errors import DataChangedError, DataStoreError
from pymc_minibatch_mh.store.row_store import RowStore
from pymc_minibatch_mh.store.shuffled import source_blocks
from pymc_minibatch_mh.store.sources import NpyFile

path = sys.argv[1]
x = np.arange(30_000, dtype=np.float64).reshape(10_000, 3)
for what in ("a full pass", "a shuffled copy's read of its source"):
    np.save(path, x)
    if what == "a full pass":
        store = RowStore([pytensor.shared(x[:50], name="X")], {0: ("X", path)})
        blocks = (c[0] for c in store.chunks(size=1000))
    else:
        blocks = source_blocks(NpyFile(path), 1000)
    next(blocks)
    os.truncate(path, 4096)  # the rest of the file is gone: its pages raise SIGBUS
    try:
        print(sum(float(block.sum()) for block in blocks))
    except DataChangedError as err:
        print(what, "refused:", err)
"""


def test_a_npy_file_truncated_under_a_pass_is_refused_not_a_bus_error(tmp_path):
    """In a child process: reads through a memory mapping would kill the interpreter with
    SIGBUS here; reads through pread(2) raise a clear error instead."""
    out = subprocess.run([sys.executable, "-c", _BUS_ERROR_SCRIPT, str(tmp_path / "X.npy")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    assert "a full pass refused: " in out.stdout and "shorter than when" in out.stdout
    assert "a shuffled copy's read of its source refused: " in out.stdout


def _zarr_change(change, folder, x):
    zarr = pytest.importorskip("zarr")
    z = zarr.open_array(str(folder / "X.zarr"), mode="r+")
    if change == "replaced":
        z[:] = -x
    elif change == "appended":
        z.append(x[:700])
    else:
        z.resize((N // 2, D))


def _parquet_change(change, folder, x, y):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = folder / "data.parquet"
    if change == "truncated":
        os.truncate(path, os.path.getsize(path) // 2)
        return
    rows = 2 * N if change == "appended" else N
    xx, yy = np.resize(-x, (rows, D)), np.resize(y, rows)
    table = pa.table({**{f"x{j}": xx[:, j] for j in range(D)}, "y": yy})
    pq.write_table(table, folder / "new.parquet", row_group_size=700)
    os.replace(folder / "new.parquet", path)


def _npy_change(change, folder, x):
    if change == "replaced":
        _rewrite(folder / "X.npy", -x)
    else:
        IN_PLACE[change](folder / "X.npy")


@pytest.mark.parametrize("change", ["replaced", "appended", "truncated"])
@pytest.mark.parametrize("kind", ["zarr", "parquet", "shuffled copy"])
def test_a_copied_source_changed_under_a_running_chain_leaves_its_rows_and_stops_a_pass(
        kind, change, tmp_path):
    """Zarr and Parquet data are read from a local copy, shuffled copies too: the chain's
    rows stay the rows it started with; a full pass in the chain is refused."""
    x, y = logistic_data()
    source = "npy" if kind == "shuffled copy" else kind
    data = write_store(source, x, y, tmp_path)
    variables, aliases = row_vars(logistic_model(x[:50], y[:50]))
    store = make_store(variables, resolve_data(variables, data, aliases),
                       shuffled_copy=kind == "shuffled copy")
    store.start_chain(np.random.default_rng(5))

    def check_rows():
        store.start_step()
        tx, ty = x_and_y(store, store.take(300))
        ids = np.rint(tx[:, 0] * N).astype(int)
        np.testing.assert_array_equal(tx, x[ids])
        np.testing.assert_array_equal(ty, y[ids])

    check_rows()
    if kind == "zarr":
        _zarr_change(change, tmp_path, x)
    elif kind == "parquet":
        _parquet_change(change, tmp_path, x, y)
    else:
        _npy_change(change, tmp_path, x)
    for _ in range(3):
        check_rows()
    with pytest.raises(DataChangedError, match="changed on disk during a full pass"):
        for _ in store.chunks():
            pass
    if kind == "parquet" and change == "truncated":  # the next chain start: a clear error
        with pytest.raises(DataStoreError, match=r"data\['(X|y)'\]: .*data\.parquet cannot "
                           "be read as a Parquet file"):
            store.refresh()


# ------------------------------------------------------------------------ a full disk
def _copies(folder):
    """The step's temporary folders (local and shuffled copies) in ``folder``."""
    return sorted(p for p in folder.iterdir() if p.name.startswith("pymc_minibatch_mh_"))


_REAL_PWRITE = os.pwrite


def _disk_full_after(monkeypatch, calls):
    """os.pwrite writes half of its bytes at its ``calls``-th call, then fails with ENOSPC."""
    real = _REAL_PWRITE
    count = [0]

    def pwrite(fd, data, offset):
        count[0] += 1
        if count[0] < calls:
            return real(fd, data, offset)
        if count[0] == calls and len(data) > 1:
            return real(fd, memoryview(data)[: len(data) // 2], offset)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "pwrite", pwrite)
    return count


@pytest.mark.parametrize("kind", ["zarr", "parquet", "shuffled copy"])
def test_a_full_disk_while_a_local_copy_is_written_is_refused_and_leaves_no_file(
        kind, tmp_path, monkeypatch):
    """The local copy (Zarr, Parquet) and the shuffled copy: the disk fills part-way
    (simulated: the write fails with ENOSPC); a clear error, no partial file, and the next
    try writes a whole new copy."""
    monkeypatch.setattr(sources, "COPY_BLOCK", 1024)  # several writes per copy
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    x, y = logistic_data()
    source = "npy" if kind == "shuffled copy" else kind
    data = write_store(source, x, y, tmp_path)
    variables, aliases = row_vars(logistic_model(x[:50], y[:50]))

    def build():
        return make_store(variables, resolve_data(variables, data, aliases),
                          shuffled_copy=kind == "shuffled copy")

    count = _disk_full_after(monkeypatch, 2)
    with pytest.raises(DataStoreError, match=r"(local|shuffled) copy of '(X|y)' ran out of "
                       r"disk space in .*No space left on device.*partial copy was deleted"
                       r".*TMPDIR"):
        build()
    assert count[0] > 2  # it failed part-way, after writing
    gc.collect()
    assert _copies(temp) == []
    monkeypatch.setattr(os, "pwrite", _REAL_PWRITE)  # space again
    store = build()
    positions = np.arange(N)
    tx, ty = x_and_y(store, store.rows(positions))
    ids = np.rint(tx[:, 0] * N).astype(int)
    np.testing.assert_array_equal(np.sort(ids), positions)
    np.testing.assert_array_equal(tx, x[ids])
    np.testing.assert_array_equal(ty, y[ids])
    assert len(_copies(temp)) == 2  # X and y, each in its folder
    del store
    gc.collect()
    assert _copies(temp) == []  # deleted with the store



def _dask_zarr_store(tmp_path, persisted):
    da = pytest.importorskip("dask.array")
    x, y = logistic_data()
    write_store("zarr", x, y, tmp_path)
    data = {k: da.from_zarr(str(tmp_path / f"{k}.zarr")) for k in ("X", "y")}
    if persisted:
        data = {k: v.persist() for k, v in data.items()}
    variables, aliases = row_vars(logistic_model(x[:50], y[:50]))
    return x, y, make_store(variables, resolve_data(variables, data, aliases))


def _take_until_refused(store, x, y, steps=2500):
    """Steps of 100 rows (past the blocks fetched before a change); every row handed out
    is an original row. The number of steps taken before a DataChangedError, else None."""
    for k in range(steps):
        store.start_step()
        try:
            tx, ty = x_and_y(store, store.take(100))
        except DataChangedError:
            return k
        ids = np.rint(tx[:, 0] * N).astype(int)
        np.testing.assert_array_equal(tx, x[ids])
        np.testing.assert_array_equal(ty, y[ids])
    return None


@pytest.mark.parametrize("persisted", [True, False], ids=["persisted", "not persisted"])
@pytest.mark.parametrize("change", ["replaced", "appended", "truncated"])
def test_a_dask_array_whose_files_change_gives_its_rows_or_is_refused(change, persisted,
                                                                      tmp_path):
    """A persisted Dask array keeps its rows in the workers when the Zarr files its graph
    read change: the chain's stream goes on with the rows it started with. One that is not
    persisted reads the files again: rows that differ from their first read (a Zarr array
    resized smaller gives its fill value) are refused at the next read of the stream, and
    at the next full pass, with DataChangedError (before: handed to the chain unnoticed).
    Rows appended to the files are not in the array, whose shape is its graph's: nothing
    changes for it."""
    x, y, store = _dask_zarr_store(tmp_path, persisted)
    store.start_chain(np.random.default_rng(5))
    try:
        _zarr_change(change, tmp_path, x)
        refused_at = _take_until_refused(store, x, y)
        if persisted or change == "appended":
            assert refused_at is None
            assert sum(float(x_and_y(store, c)[0].sum()) for c in store.chunks()) == pytest.approx(
                x.sum())
        else:
            assert refused_at is not None  # after the blocks fetched before, if any
            with pytest.raises(DataChangedError, match=r"rows read for the per-step rows "
                               r"of the data 'X', 'y' are not the rows first read: rows "):
                store.take(100)  # the stream ended with the error
            with pytest.raises(DataChangedError, match="a full pass of the data 'X', 'y'.*"
                               "blocks of rows 0–2,999 differ"):
                store.reduce(lambda *block: 0.0)
            with pytest.raises(DataChangedError, match=r"a full pass .* rows [\d,]+, [\d,]+, "
                               r"[\d,]+ and [\d,]+ more differ"):
                next(iter(store.chunks()))
            # A new chain start looks at the (new) data afresh.
            store.refresh()
            store.start_chain(np.random.default_rng(5))
            store.start_step()
            store.take(100)
    finally:
        store.close()


# ------------------------------------------------------------------- interrupted runs
def test_the_stream_thread_ends_when_idle_and_resumes_the_same_rows():
    """A chain that stops taking rows (it ended, or was interrupted) leaves no thread; the
    stream resumes where it stopped, so the rows are those of a stream that never paused."""
    from pymc_minibatch_mh.store.row_stream import StreamBuffer

    def fetch(idx):
        return (idx.astype(float),)

    def streams():
        return [t for t in threading.enumerate() if t.name == "pymc_minibatch_mh-stream"]

    paused = StreamBuffer(1000, 3, fetch, block=50, depth=2, idle=0.3)
    got = [paused.next_block()[0] for _ in range(3)]
    deadline = time.monotonic() + 10
    while streams() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not streams()
    got += [paused.next_block()[0] for _ in range(5)]
    paused.close()
    steady = StreamBuffer(1000, 3, fetch, block=50, depth=2, idle=60.0)
    expected = [steady.next_block()[0] for _ in range(8)]
    steady.close()
    np.testing.assert_array_equal(np.concatenate(got), np.concatenate(expected))
    assert not streams()


class InterruptingBarker(MinibatchBarker):
    """Sends SIGINT (Ctrl-C) to the sampling process once, at a chain's step ``at``."""

    at = None
    flag = None
    sampler_pid = None

    def step(self, point):
        _interrupt_once(self, self._chain_steps)
        return super().step(point)


class InterruptingMetropolis(pm.Metropolis):
    """The same interruption in PyMC's own step, for what PyMC returns."""

    at = None
    flag = None
    sampler_pid = None

    def astep(self, q0):
        self._steps = getattr(self, "_steps", -1) + 1
        _interrupt_once(self, self._steps)
        return super().astep(q0)


def _interrupt_once(step, steps):
    """At step ``at`` of a chain: Ctrl-C, once; in parallel, when both chains are there (so
    that what PyMC keeps of them does not depend on their speeds)."""
    if step.at is None or steps != step.at:
        return
    if step.sampler_pid != os.getpid():  # a worker process: wait for the other chain
        os.close(os.open(f"{step.flag}.{os.getpid()}", os.O_CREAT))
        deadline = time.monotonic() + 60
        while len(glob.glob(f"{glob.escape(step.flag)}.*")) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    try:
        os.close(os.open(step.flag, os.O_CREAT | os.O_EXCL))  # the first chain there only
    except FileExistsError:
        return
    os.kill(step.sampler_pid, signal.SIGINT)


def _outcome(run):
    """What pm.sample gave: the error's type, or (chains, whether every draw is there)."""
    try:
        idata = run()
    except Exception as err:  # noqa: BLE001 - compared with PyMC's own outcome
        return type(err).__name__
    post = posterior(idata)
    return (post.sizes["chain"], post.sizes["draw"] == 60)


_PYMC_OUTCOME = {}


def _stream_threads():
    return [t for t in threading.enumerate() if t.name == "pymc_minibatch_mh-stream"]


@pytest.mark.parametrize("phase", ["tuning", "sampling"])
@pytest.mark.parametrize(("where", "cores"), [
    ("memory", 1), ("disk", 2),
    # The rest of the matrix in the slow suite, on the newest PyMC line (2-3 s each; Dask
    # 13 s: its chain starts): the cases above run on both lines.
    pytest.param("memory", 2, marks=[pytest.mark.slow, pytest.mark.newest_line]),
    pytest.param("disk", 1, marks=[pytest.mark.slow, pytest.mark.newest_line]),
    pytest.param("dask", 1, marks=[pytest.mark.slow, pytest.mark.newest_line]),
])
def test_an_interrupted_run_returns_what_pymc_returns_and_leaves_nothing_behind(
        where, cores, phase, tmp_path, monkeypatch):
    """Ctrl-C during tuning or sampling, one or two processes, data in memory, read from a
    local copy (Zarr) or from Dask: pm.sample gives what it gives with PyMC's Metropolis;
    no thread or process is left; the same step samples again exactly as a new one; the
    local copies go with the step."""
    if where == "dask":
        pytest.importorskip("dask.array")
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    x, y = logistic_data()
    at = 10 if phase == "tuning" else 40
    run = dict(draws=60, tune=20, chains=2, cores=cores, mp_ctx="fork",
               **sample_kwargs(random_seed=7))
    threads = set(threading.enumerate())
    if (cores, phase) not in _PYMC_OUTCOME:
        with logistic_model(x, y):
            metropolis = InterruptingMetropolis()
            metropolis.at, metropolis.sampler_pid = at, os.getpid()
            metropolis.flag = str(tmp_path / "metropolis")
            _PYMC_OUTCOME[cores, phase] = _outcome(lambda: pm.sample(step=metropolis, **run))

    def build():
        folder = Path(tempfile.mkdtemp(dir=tmp_path))
        data = None if where == "memory" else write_store(
            "zarr" if where == "disk" else "dask", x, y, folder)
        model = logistic_model(x, y) if data is None else logistic_model(x[:50], y[:50])
        with model:
            return model, InterruptingBarker(batch_size=100, S=[0.05] * D, data=data)

    model, step = build()
    step.at, step.sampler_pid, step.flag = at, os.getpid(), str(tmp_path / "ours")
    with model:
        assert _outcome(lambda: pm.sample(step=step, **run)) == _PYMC_OUTCOME[cores, phase]
    assert multiprocessing.active_children() == []
    deadline = time.monotonic() + 10
    while _stream_threads() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert set(threading.enumerate()) <= threads | set(_library_threads())
    assert not _stream_threads()
    # The interrupted step samples again as a new one would (its local copies reused).
    step.at = None
    again = dict(draws=30, tune=20, chains=1, cores=1, **sample_kwargs(random_seed=5))
    with model:
        after = np.asarray(posterior(pm.sample(step=step, **again))["b"])
    new_model, new_step = build()
    with new_model:
        fresh = np.asarray(posterior(pm.sample(step=new_step, **again))["b"])
    np.testing.assert_array_equal(after, fresh)
    for store in (step.likelihood.store, new_step.likelihood.store):
        getattr(store, "close", lambda: None)()
    step = new_step = model = new_model = store = None
    gc.collect()
    assert _copies(temp) == []


def _library_threads():
    """The pools that Dask's scheduler and Zarr's I/O keep for the process."""
    return [t for t in threading.enumerate()
            if t.name.startswith(("ThreadPoolExecutor", "asyncio_", "zarr_io"))]
