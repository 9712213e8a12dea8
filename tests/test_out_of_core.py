"""Data bigger than memory: ``data=`` with .npy memmaps, Zarr, Parquet and Dask arrays.

The stores must give exactly the rows asked for, copy no more than a chunk at a time,
refuse bad data with a clear message, follow or refuse data that change, and sample the
same posterior as the in-memory store: the same draws for the same seed where the rows are
drawn the same way (memmap, Zarr and Parquet read through a local .npy copy), and
reproducible draws of the same law for Dask (whose rows come from a background stream).
"""

from __future__ import annotations

import gc
import os
import time
import tracemalloc

import numpy as np
import pymc as pm
import pytest
from conftest import sample_kwargs

from pymc_minibatch_mh import MinibatchBarker
from pymc_minibatch_mh.errors import DataChangedError, DataStoreError
from pymc_minibatch_mh.model.compat import posterior, sample_stats
from pymc_minibatch_mh.store import sources
from pymc_minibatch_mh.store.registry import make_store, resolve_data
from pymc_minibatch_mh.store.row_store import RowStore
from pymc_minibatch_mh.store.sources import ParquetColumn

N, D = 3000, 3
STORES = ["numpy", "npy", "zarr", "parquet", "dask"]


def logistic_data(n=N, seed=0):
    """X whose first column is the row number (so a row says where it came from), and y."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, D))
    x[:, 0] = np.arange(n) / n
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-(x @ np.array([1.0, -1.0, 0.5]))))).astype(float)
    return x, y


def write_store(kind, x, y, folder):
    """The arrays of one store kind, for data={"X": ..., "y": ...}."""
    if kind == "numpy":
        return {"X": x, "y": y}
    if kind == "npy":
        np.save(folder / "X.npy", x)
        np.save(folder / "y.npy", y)
        return {"X": str(folder / "X.npy"), "y": np.load(folder / "y.npy", mmap_mode="r")}
    if kind == "zarr":
        zarr = pytest.importorskip("zarr")
        out = {}
        for name, a in (("X", x), ("y", y)):
            z = zarr.create_array(str(folder / f"{name}.zarr"), shape=a.shape,
                                  chunks=(500, *a.shape[1:]), dtype=a.dtype)
            z[:] = a
            out[name] = z
        return out
    if kind == "parquet":
        pa = pytest.importorskip("pyarrow")
        pq = pytest.importorskip("pyarrow.parquet")
        table = pa.table({**{f"x{j}": x[:, j] for j in range(x.shape[1])}, "y": y})
        pq.write_table(table, folder / "data.parquet", row_group_size=700)
        cols = [f"x{j}" for j in range(x.shape[1])]
        return {"X": ParquetColumn(folder / "data.parquet", cols),
                "y": ParquetColumn(folder / "data.parquet", "y")}
    da = pytest.importorskip("dask.array")
    return {"X": da.from_array(x, chunks=(700, x.shape[1])), "y": da.from_array(y, chunks=700)}


def logistic_model(x, y):
    with pm.Model() as model:
        xd = pm.Data("X", x)
        yd = pm.Data("y", y)
        b = pm.Normal("b", 0.0, 5.0, shape=x.shape[1])
        pm.Bernoulli("obs", logit_p=xd @ b, observed=yd)
    return model


def row_vars(model):
    """The model's per-row data variables and their other names (as the likelihood finds them)."""
    from pymc_minibatch_mh.model.graph import observed_source
    from pymc_minibatch_mh.model.split import split_model

    split = split_model(model, model.value_vars, model.initial_point(), "test")
    aliases = {rv.name: observed_source(model.rvs_to_values[rv]) for rv in model.observed_RVs}
    return split.row_vars, aliases


def store_of(model, data):
    """The row store a step would build for ``data`` (no compilation)."""
    variables, aliases = row_vars(model)
    return make_store(variables, resolve_data(variables, data, aliases))


def x_and_y(store, rows):
    """(X rows, y rows) from a store's tuple, whichever order the model lists them in."""
    names = [store.name(i) for i in range(len(rows))]
    return rows[names.index("X")], rows[names.index("y")]


@pytest.fixture
def data():
    return logistic_data()


@pytest.mark.parametrize("kind", STORES)
def test_each_store_gives_exactly_the_rows_asked_for(kind, data, tmp_path):
    x, y = data
    store = store_of(logistic_model(x[:50], y[:50]), write_store(kind, x, y, tmp_path))
    assert store.n_rows == N
    positions = np.array([N - 1, 0, 17, 1234, 17, 2999, 500])
    got_x, got_y = x_and_y(store, store.rows(positions))
    np.testing.assert_array_equal(got_x, x[positions])
    np.testing.assert_array_equal(got_y, y[positions])
    full = [np.concatenate(parts) for parts in zip(*store.chunks(size=400), strict=True)]
    np.testing.assert_array_equal(x_and_y(store, full)[0], x)
    np.testing.assert_array_equal(x_and_y(store, full)[1], y)
    # Per-step rows: distinct within a step, and the very rows of X and y they claim to be.
    store.start_chain(np.random.default_rng(5))
    try:
        for count in (100, 250, 1):
            store.start_step()
            taken = [store.take(count), store.take(count)]
            tx = np.concatenate([x_and_y(store, t)[0] for t in taken])
            ty = np.concatenate([x_and_y(store, t)[1] for t in taken])
            ids = np.rint(tx[:, 0] * N).astype(int)
            assert np.unique(ids).size == 2 * count
            np.testing.assert_array_equal(tx, x[ids])
            np.testing.assert_array_equal(ty, y[ids])
    finally:
        getattr(store, "close", lambda: None)()


@pytest.mark.parametrize("kind", ["npy", "zarr", "parquet"])
def test_steps_draw_the_same_rows_as_the_in_memory_store(kind, data, tmp_path):
    x, y = data
    model = logistic_model(x[:50], y[:50])
    store = store_of(model, write_store(kind, x, y, tmp_path))
    memory = store_of(logistic_model(x, y), None)
    for s in (store, memory):
        s.start_chain(np.random.default_rng(11))
    for count in (100, 7, 300):
        store.start_step()
        memory.start_step()
        for a, b in zip(store.take(count), memory.take(count), strict=True):
            np.testing.assert_array_equal(a, b)


def test_dask_rows_are_uniform_over_all_rows(data):
    pytest.importorskip("dask.array")
    x, y = data
    store = store_of(logistic_model(x[:50], y[:50]), write_store("dask", x, y, None))
    store.start_chain(np.random.default_rng(3))
    counts = np.zeros(N)
    try:
        for _ in range(400):
            store.start_step()
            ids = np.rint(x_and_y(store, store.take(150))[0][:, 0] * N).astype(int)
            counts += np.bincount(ids, minlength=N)
    finally:
        store.close()
    # 60,000 draws over 3,000 rows: each count is about Binomial(60000, 1/3000) (sd ≈ 4.5);
    # a chi-square test with N − 1 degrees of freedom.
    expected = counts.sum() / N
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert abs(chi2 - (N - 1)) < 5 * np.sqrt(2 * (N - 1)), chi2


@pytest.mark.parametrize("dtype", ["float64", "float32", "int8", "int64"])
@pytest.mark.parametrize("shape", [(1000,), (1000, 3), (1000, 2, 5)])
def test_npy_rows_are_read_exactly_and_a_truncated_file_is_refused(tmp_path, dtype, shape):
    """Per-step rows of a .npy file come from pread(2): the same values as indexing."""
    a = (np.random.default_rng(1).normal(size=shape) * 50).astype(dtype)
    np.save(tmp_path / "a.npy", a)
    f = sources.NpyFile(tmp_path / "a.npy")
    idx = np.array([999, 0, 5, 5, 500, 1], dtype=np.int64)
    np.testing.assert_array_equal(f.read_rows(idx), a[idx])
    assert f.read_rows(idx[:0]).shape == (0, *shape[1:])
    with open(tmp_path / "a.npy", "r+b") as handle:  # cut the file under the reader
        handle.truncate(os.path.getsize(tmp_path / "a.npy") - a[0].nbytes)
    with pytest.raises(DataChangedError, match="shorter than when it was opened"):
        f.read_rows(np.array([999], dtype=np.int64))
    np.testing.assert_array_equal(f.read_rows(idx[1:3]), a[idx[1:3]])


@pytest.mark.parametrize("kind", ["npy", "zarr", "parquet", "dask"])
def test_a_full_pass_copies_no_more_than_a_chunk(kind, tmp_path, monkeypatch):
    """tracemalloc: the peak of new allocations stays near one chunk (data: 80 chunks)."""
    n, chunk = 400_000, 5000
    x, y = logistic_data(n=n)
    monkeypatch.setattr(sources, "COPY_BLOCK", chunk)
    data = write_store(kind, x, y, tmp_path)
    data_bytes = x.nbytes + y.nbytes
    del x, y
    chunk_bytes = data_bytes * chunk // n
    variables, aliases = row_vars(logistic_model(*logistic_data(n=50)))
    if kind != "dask":  # the first pread of a process compiles its Numba kernel (MBs, not
        # the pass's); Zarr and Parquet are read from a local .npy copy with it too
        (tmp_path / "warm").mkdir()
        warm = write_store("npy", *logistic_data(n=50), tmp_path / "warm")
        make_store(variables, resolve_data(variables, warm, aliases)).rows(np.array([0]))
    gc.collect()  # earlier tests' dropped Dask stores end their threads (they allocate)
    tracemalloc.start()
    try:
        # Zarr and Parquet are copied to a local file here, block by block.
        store = make_store(variables, resolve_data(variables, data, aliases))
        _, opening_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        total = 0.0
        for part in store.chunks(size=chunk):
            total += float(part[0].sum())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert np.isfinite(total)
    # One chunk, the next one read ahead (Dask), and slack; Dask's graphs and scheduler
    # take about 0.6 MB whatever the size. The data are 12.8 MB.
    limit = 4 * chunk_bytes + (1_000_000 if kind == "dask" else 0)
    assert peak - base < limit, (peak - base, chunk_bytes)
    if kind in ("zarr", "parquet"):
        assert opening_peak < limit + 1_000_000, (opening_peak, chunk_bytes)


# ----------------------------------------------------------------------- bad input
def test_unknown_and_missing_names_are_refused(data):
    x, y = data
    model = logistic_model(x[:50], y[:50])
    with pytest.raises(DataStoreError, match=r"\['Z'\].*per-row data are \['X', 'obs', 'y'\]"):
        store_of(model, {"X": x, "Z": y})
    with pytest.raises(DataStoreError, match=r"missing: \['y'\]"):
        store_of(model, {"X": x})
    # The observed variable's name stands for its data.
    store = store_of(model, {"X": x, "obs": y})
    assert store.n_rows == N


@pytest.mark.parametrize("kind", ["numpy", "npy", "zarr", "dask"])
def test_lengths_that_disagree_are_refused(kind, data, tmp_path):
    x, y = data
    arrays = write_store(kind, x, y[:-1], tmp_path)
    with pytest.raises(Exception, match=r"different numbers of rows(?=.*'X': 3000)(?=.*'y': 2999)"):
        store_of(logistic_model(x[:50], y[:50]), arrays)


def test_dtypes_and_row_shapes_that_do_not_fit_are_refused(data, tmp_path):
    x, y = data
    model = logistic_model(x[:50], y[:50])
    with pytest.raises(DataStoreError, match="dtype complex128.*cannot be cast"):
        store_of(model, {"X": x.astype(complex), "y": y})
    with pytest.raises(DataStoreError, match=r"rows of shape \(2,\).*\(3,\)"):
        store_of(model, {"X": x[:, :2], "y": y})
    # A safe cast (float32 rows for a float64 model) is read and cast.
    store = store_of(model, {"X": x.astype(np.float32), "y": y})
    assert x_and_y(store, store.rows(np.array([3])))[0].dtype == np.float64
    with pytest.raises(DataStoreError, match="must name a .npy file"):
        store_of(model, {"X": str(tmp_path / "X.csv"), "y": y})


@pytest.mark.parametrize("kind", ["npy", "zarr", "parquet", "dask"])
def test_missing_values_are_refused_with_their_rows(kind, data, tmp_path):
    x, y = data
    x = x.copy()
    x[2345, 1] = np.nan
    arrays = write_store(kind, x, y, tmp_path)
    model = logistic_model(x[:50], y[:50])
    with pytest.raises(DataStoreError, match=r"missing values.*2,345"):
        store = store_of(model, arrays)
        for _ in store.chunks(size=500):  # .npy files are checked at their first pass
            pass


# ----------------------------------------------------------------------- changes
def test_pm_set_data_on_a_placeholder_is_refused(data):
    x, y = data
    model = logistic_model(x[:50], y[:50])
    store = store_of(model, {"X": x, "y": y})
    with model:
        pm.set_data({"X": x[:60], "y": y[:60]})
    with pytest.raises(DataStoreError, match="pm.set_data changed '(X|y)'.*data="):
        store.refresh()


def _rewrite(path, array):
    """Replace a .npy file by a new one (as the guide says: never truncate a mapped file)."""
    stamp = os.stat(path).st_mtime_ns
    new = path.with_name("new_" + path.name)
    np.save(new, array)
    os.utime(new, ns=(stamp + 10**9, stamp + 10**9))  # visibly newer on any file system
    os.replace(new, path)


def test_a_store_changed_under_a_running_chain_is_refused(data, tmp_path):
    x, y = data
    arrays = write_store("npy", x, y, tmp_path)
    store = store_of(logistic_model(x[:50], y[:50]), arrays)
    for _ in store.chunks():
        pass
    x2 = x.copy()
    x2[:, 1] += 1.0
    _rewrite(tmp_path / "X.npy", x2)
    with pytest.raises(DataChangedError, match="'X' changed on disk during a full pass"):
        for _ in store.chunks():
            pass
    # ... and is read afresh at the next chain start.
    store.refresh()
    np.testing.assert_array_equal(x_and_y(store, store.rows(np.array([5])))[0], x2[[5]])


@pytest.mark.parametrize("new_n", [1200, 4500], ids=["shorter", "longer"])
def test_a_changed_store_is_followed_between_chains(new_n, tmp_path):
    """The plain estimator follows a new .npy file of any length; with control variates
    their set-up is repeated on it (tests/test_set_data_setup.py checks the draws)."""
    x, y = logistic_data()
    arrays = write_store("npy", x, y, tmp_path)
    model = logistic_model(x[:50], y[:50])
    with model:
        step = MinibatchBarker(batch_size=100, S=[0.05] * D, tune=False, data=arrays)
        taylor = MinibatchBarker(batch_size=100, S="laplace", scaling=1.0, tune=False,
                                 control_variate="taylor", data=arrays)
    x2, y2 = logistic_data(n=new_n, seed=9)
    _rewrite(tmp_path / "X.npy", x2)
    _rewrite(tmp_path / "y.npy", y2)
    with model:
        pm.sample(draws=20, tune=0, step=step, chains=1, **sample_kwargs())
    assert step._n_rows == new_n == step.likelihood.store.n_rows
    with model:
        pm.sample(draws=20, tune=0, step=taylor, chains=1, **sample_kwargs())
    assert taylor._n_rows == new_n == taylor.likelihood.store.n_rows
    assert taylor.control_variate.setups == 2


# ----------------------------------------------------------------------- posteriors
def sample_b(kind, x, y, folder, seed=3, draws=300, tune=0):
    data = None if kind == "in-memory" else write_store(kind, x, y, folder)
    model = logistic_model(x, y) if data is None else logistic_model(x[:50], y[:50])
    with model:
        step = MinibatchBarker(batch_size=100, control_variate="taylor", S="laplace",
                               scaling=2.38 / np.sqrt(D), tune=False, data=data)
        idata = pm.sample(draws=draws, tune=tune, step=step, chains=1,
                          **sample_kwargs(random_seed=seed))
    if hasattr(step.likelihood.store, "close"):
        step.likelihood.store.close()
    return np.asarray(posterior(idata)["b"])[0]


@pytest.mark.parametrize("kind", ["numpy", "npy", "zarr", "parquet"])
def test_the_posterior_draws_equal_the_in_memory_draws(kind, data, tmp_path):
    x, y = data
    expected = sample_b("in-memory", x, y, tmp_path)
    np.testing.assert_array_equal(sample_b(kind, x, y, tmp_path), expected)


def test_dask_draws_are_reproducible_on_a_local_cluster(data, tmp_path):
    distributed = pytest.importorskip("distributed")
    x, y = data
    threads = sample_b("dask", x, y, tmp_path)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster):
        on_cluster = sample_b("dask", x, y, tmp_path)
        again = sample_b("dask", x, y, tmp_path)
    np.testing.assert_array_equal(on_cluster, again)
    np.testing.assert_array_equal(on_cluster, threads)  # the scheduler changes no draw
    other_seed = sample_b("dask", x, y, tmp_path, seed=4)
    assert not np.array_equal(other_seed, threads)


@pytest.mark.parametrize("control_variate", ["taylor", "taylor_theta"])
def test_dask_set_up_passes_are_reductions_on_the_cluster(data, monkeypatch, control_variate):
    """The start check, MAP search and control-variate sums run as tasks on the workers
    (the model's functions pickled there): no block comes back, and θ̂ is the in-memory one."""
    distributed = pytest.importorskip("distributed")
    from pymc_minibatch_mh.store.dask_store import DaskRowStore

    x, y = data
    with logistic_model(x, y):
        expected = MinibatchBarker(control_variate=control_variate, tune=False)

    def refuse(self, size=None):
        raise AssertionError("a full pass brought its blocks back to the client")

    monkeypatch.setattr(DaskRowStore, "chunks", refuse)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client, distributed.get_task_stream(client) as ts:
        with logistic_model(x[:50], y[:50]) as model:
            step = MinibatchBarker(control_variate=control_variate, tune=False,
                                   data=write_store("dask", x, y, None))
            step.likelihood.check_point(model.initial_point())
        workers = set(cluster.scheduler.workers)
    tasks = [t for t in ts.data if "_apply" in str(t["key"])]
    passes = round(step.setup_passes) + 1  # and the start check
    assert len(tasks) == passes * 1  # N = 3,000 rows: one block per pass
    assert {t["worker"] for t in tasks} <= workers
    np.testing.assert_allclose(step.control_variate.reference.theta,
                               expected.control_variate.reference.theta, rtol=1e-9, atol=1e-9)
    step.likelihood.store.close()


def test_dask_posterior_agrees_with_the_in_memory_posterior(tmp_path):
    """Means within 4 combined MCSE and sds within 15 % (4,000 draws, N = 3,000)."""
    from pymc_minibatch_mh.model.compat import mcse

    x, y = logistic_data()
    draws = {k: sample_b(k, x, y, tmp_path, draws=4000, tune=500)
             for k in ("in-memory", "dask")}
    a, b = draws["in-memory"], draws["dask"]
    for j in range(D):
        se = np.hypot(mcse(a[:, j]), mcse(b[:, j]))
        assert abs(a[:, j].mean() - b[:, j].mean()) < 4 * se, j
        assert abs(a[:, j].std() / b[:, j].std() - 1) < 0.15, j


def test_the_stream_thread_stops(data):
    pytest.importorskip("dask.array")
    import threading

    x, y = data
    store = store_of(logistic_model(x[:50], y[:50]), write_store("dask", x, y, None))
    store.start_chain(np.random.default_rng(0))
    store.start_step()
    store.take(10)
    store.close()
    time.sleep(0.3)
    assert not [t for t in threading.enumerate() if t.name == "pymc_minibatch_mh-stream"]
    # A store nobody holds any more (its step was dropped) ends its thread without close().
    store.start_chain(np.random.default_rng(1))
    store.start_step()
    store.take(10)
    assert [t for t in threading.enumerate() if t.name == "pymc_minibatch_mh-stream"]
    del store
    gc.collect()
    time.sleep(0.3)
    assert not [t for t in threading.enumerate() if t.name == "pymc_minibatch_mh-stream"]


def test_row_store_without_data_is_unchanged(data):
    x, y = data
    store = store_of(logistic_model(x, y), None)
    assert type(store) is RowStore and not store.data


@pytest.mark.parametrize("kind", ["npy", "zarr"])
def test_the_audit_reads_the_store_and_equals_the_in_memory_audit(kind, data, tmp_path):
    """audit_every with data=: the full-data pass streams through the store's chunks."""
    x, y = data

    def audit_stats(kind):
        store = None if kind == "in-memory" else write_store(kind, x, y, tmp_path)
        model = logistic_model(x, y) if store is None else logistic_model(x[:50], y[:50])
        with model:
            step = MinibatchBarker(batch_size=100, control_variate="taylor", S="laplace",
                                   scaling=2.38 / np.sqrt(D), tune=False, data=store,
                                   audit_every=5)
            idata = pm.sample(draws=60, tune=0, step=step, chains=1,
                              **sample_kwargs(random_seed=4))
        ss = sample_stats(idata)
        return {k: np.asarray(ss[k]) for k in ("audited", "audit_delta", "audit_error",
                                              "extra_evaluations")}

    expected, got = audit_stats("in-memory"), audit_stats(kind)
    assert expected["audited"].sum() == 12
    for key, value in expected.items():
        np.testing.assert_allclose(got[key], value, rtol=1e-9, err_msg=key)
