"""``shuffled_copy=True``: ``data=`` arrays copied once in a random row order, read in blocks.

The copy must hold every row once, in one uniformly random order shared by all arrays and
independent of the source's chunking; a step's rows must be whole blocks drawn uniformly
without replacement; the memory of the copy is bounded by a few chunks; bad settings and
a full disk are refused; a changed source is followed between chains; and the sampler
must give the posterior of the in-memory sampler (Barker and Gibbs).
"""

from __future__ import annotations

import itertools
import tracemalloc
from collections import Counter

import numpy as np
import pymc as pm
import pytest
from conftest import sample_kwargs
from scipy import stats
from test_out_of_core import _rewrite, logistic_data, logistic_model, row_vars, write_store

from pymc_minibatch_mh import MinibatchBarker, MinibatchGibbs
from pymc_minibatch_mh.errors import DataStoreError
from pymc_minibatch_mh.model.compat import posterior
from pymc_minibatch_mh.store import shuffled, sources
from pymc_minibatch_mh.store.registry import make_store, resolve_data
from pymc_minibatch_mh.store.shuffled import BLOCK_ROWS, ShufflePlan, write_shuffled

N, D = 3000, 3


def shuffled_store(model, data, shuffled_copy=True):
    variables, aliases = row_vars(model)
    return make_store(variables, resolve_data(variables, data, aliases),
                      shuffled_copy=shuffled_copy)


def ids_and_y(store):
    """Original row numbers of the copy's rows (X's first column), and its y."""
    names = [store.name(i) for i in range(len(store.arrays))]
    x, y = store.arrays[names.index("X")], store.arrays[names.index("y")]
    return np.rint(np.asarray(x[:, 0]) * N).astype(int), np.asarray(y)


@pytest.mark.parametrize("kind", ["numpy", "npy", "zarr", "parquet"])
def test_the_copy_holds_every_row_once_in_one_random_order(kind, tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "COPY_BLOCK", 1024)  # 3 buckets, chunks unlike the sources'
    x, y = logistic_data()
    store = shuffled_store(logistic_model(x[:50], y[:50]), write_store(kind, x, y, tmp_path))
    ids, y_copy = ids_and_y(store)
    assert store.n_rows == N and store.block_rows == BLOCK_ROWS
    np.testing.assert_array_equal(np.sort(ids), np.arange(N))
    np.testing.assert_array_equal(y_copy, y[ids])  # X and y in the same order
    np.testing.assert_array_equal(store.arrays[0][:, 1:] if store.name(0) == "X"
                                  else store.arrays[1][:, 1:], x[ids, 1:])
    # The plan's order, whatever the source's chunks (Zarr: 500 rows, Parquet: 700).
    plan = ShufflePlan(N)
    order = np.concatenate([
        np.flatnonzero(plan.bucket_ids(0, N) == k)[plan.permutation(k, c)]
        for k, c in enumerate(np.diff(plan.bounds))
    ])
    np.testing.assert_array_equal(ids, order)
    assert np.abs(np.corrcoef(ids, np.arange(N))[0, 1]) < 0.1


def test_the_order_is_a_uniform_permutation(tmp_path):
    """All 24 orders of 4 rows (2 buckets) over 2,400 seeds: χ² against uniform.

    A copy that dealt the rows into buckets but kept their order within a bucket gives
    only 16 of the 24 orders and fails.
    """
    rows = np.arange(4, dtype=np.float64)
    seen = Counter()
    for seed in range(2400):
        plan = ShufflePlan(4, seed=seed, chunk=2)
        order = np.concatenate([
            np.flatnonzero(plan.bucket_ids(0, 4) == k)[plan.permutation(k, c)]
            for k, c in enumerate(np.diff(plan.bounds))
        ])
        seen[tuple(order)] += 1
    counts = np.array([seen[p] for p in itertools.permutations(range(4))])
    assert counts.sum() == 2400
    assert stats.chisquare(counts).pvalue > 1e-3, counts
    # The written copy is that order.
    plan = ShufflePlan(4, seed=7, chunk=2)
    copy = write_shuffled("r", rows, rows.shape, rows.dtype, plan).array
    order = np.concatenate([
        np.flatnonzero(plan.bucket_ids(0, 4) == k)[plan.permutation(k, c)]
        for k, c in enumerate(np.diff(plan.bounds))
    ])
    np.testing.assert_array_equal(copy, rows[order])


def test_a_step_takes_whole_blocks_uniformly_without_replacement(tmp_path):
    x, y = logistic_data()
    store = shuffled_store(logistic_model(x[:50], y[:50]), write_store("npy", x, y, tmp_path))
    ids, _ = ids_and_y(store)
    position = np.empty(N, int)
    position[ids] = np.arange(N)
    n_blocks = -(-N // BLOCK_ROWS)  # 94: the last block has 24 rows
    store.start_chain(np.random.default_rng(2))
    first_blocks = np.zeros(n_blocks)
    names = [store.name(i) for i in range(2)]
    for _ in range(3000):
        store.start_step()
        taken = [store.take(c) for c in (7, 50, 1, 40)]
        got = np.concatenate([np.rint(t[names.index("X")][:, 0] * N).astype(int)
                              for t in taken])
        pos = position[got]
        assert np.unique(pos).size == pos.size == 98
        # Runs of consecutive positions of the copy, each starting at a block's start.
        breaks = np.flatnonzero(np.diff(pos) != 1) + 1
        starts = pos[np.concatenate(([0], breaks))]
        assert np.all(starts % BLOCK_ROWS == 0)
        first_blocks[pos[0] // BLOCK_ROWS] += 1
    assert stats.chisquare(first_blocks).pvalue > 1e-3
    # Every row, in a step that takes them all; then nothing is left to take.
    store.start_step()
    i = names.index("X")
    every = np.concatenate([store.take(N - 5)[i], store.take(5)[i]])
    assert np.unique(every, axis=0).shape[0] == N


def test_the_copy_allocates_no_more_than_a_few_chunks(tmp_path, monkeypatch):
    n, chunk = 400_000, 5000
    x, y = logistic_data(n=n)
    monkeypatch.setattr(sources, "COPY_BLOCK", chunk)
    data = write_store("npy", x, y, tmp_path)
    chunk_bytes = (x.nbytes + y.nbytes) * chunk // n
    del x, y
    variables, aliases = row_vars(logistic_model(*logistic_data(n=50)))
    tracemalloc.start()
    try:
        store = make_store(variables, resolve_data(variables, data, aliases),
                           shuffled_copy=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert store.n_rows == n
    assert peak < 6 * chunk_bytes, (peak, chunk_bytes)  # the data are 80 chunks


def test_bad_settings_and_a_full_disk_are_refused(tmp_path, monkeypatch):
    x, y = logistic_data()
    model = logistic_model(x[:50], y[:50])
    with pytest.raises(DataStoreError, match="shuffled_copy=True copies the arrays given with"):
        shuffled_store(logistic_model(x, y), None)
    with pytest.raises(ValueError, match="shuffled_copy must be True or False"):
        shuffled_store(model, {"X": x, "y": y}, shuffled_copy="yes")
    pytest.importorskip("dask.array")
    with pytest.raises(DataStoreError, match="does not apply to Dask arrays"):
        shuffled_store(model, write_store("dask", x, y, tmp_path))

    class Usage:
        free = 1000

    monkeypatch.setattr(shuffled.sources.shutil, "disk_usage", lambda path: Usage)
    with pytest.raises(DataStoreError, match=r"shuffled copy of '(X|y)' needs .* GiB.*TMPDIR"):
        shuffled_store(model, {"X": x, "y": y})


def test_missing_values_are_refused_with_their_original_rows(tmp_path):
    x, y = logistic_data()
    x = x.copy()
    x[2345, 1] = np.nan
    with pytest.raises(DataStoreError, match=r"missing values.*2,345"):
        shuffled_store(logistic_model(x[:50], y[:50]), write_store("npy", x, y, tmp_path))


@pytest.mark.parametrize("new_n", [1200, 4500], ids=["shorter", "longer"])
def test_a_changed_source_is_shuffled_again_at_the_next_chain_start(new_n, tmp_path):
    x, y = logistic_data()
    store = shuffled_store(logistic_model(x[:50], y[:50]), write_store("npy", x, y, tmp_path))
    x2, y2 = logistic_data(n=new_n, seed=9)
    x2[:, 0] = np.arange(new_n) / N
    _rewrite(tmp_path / "X.npy", x2)
    with pytest.raises(Exception, match="different numbers of rows"):
        store.refresh()  # y still has N rows
    _rewrite(tmp_path / "y.npy", y2)
    assert store.refresh() == new_n
    ids, y_copy = ids_and_y(store)
    np.testing.assert_array_equal(np.sort(ids), np.arange(new_n))
    np.testing.assert_array_equal(y_copy, y2[ids])
    store.start_chain(np.random.default_rng(0))
    store.start_step()
    taken = store.take(new_n)[[store.name(i) for i in range(2)].index("X")]
    assert np.unique(taken, axis=0).shape[0] == new_n


# ----------------------------------------------------------------------- posteriors
def test_barker_posterior_agrees_with_the_in_memory_posterior(tmp_path):
    """Means within 4 combined MCSE (ArviZ, from the draws' ESS), sds within 10 %.

    The plain estimator (no control variates, whose residuals would hide row errors): a
    copy whose X and y rows were misaligned by a block fails.
    """
    az = pytest.importorskip("arviz")
    x, y = logistic_data()
    draws = {}
    for kind in ("in-memory", "shuffled"):
        model = logistic_model(x, y) if kind == "in-memory" else logistic_model(x[:50], y[:50])
        data = None if kind == "in-memory" else write_store("npy", x, y, tmp_path)
        with model:
            step = MinibatchBarker(batch_size=100, S=[0.06] * D, tune=False, data=data,
                                   shuffled_copy=kind == "shuffled")
            idata = pm.sample(draws=6000, tune=0, step=step, chains=2,
                              **sample_kwargs(random_seed=8))
        draws[kind] = np.asarray(posterior(idata)["b"])
    mean = {k: v.reshape(-1, D).mean(0) for k, v in draws.items()}
    sd = {k: v.reshape(-1, D).std(0) for k, v in draws.items()}
    mcse = {k: np.array([az.mcse(v[..., j]) for j in range(D)]) for k, v in draws.items()}
    z = np.abs(mean["shuffled"] - mean["in-memory"]) / np.hypot(mcse["shuffled"],
                                                                 mcse["in-memory"])
    assert z.max() < 4.0, z
    assert np.abs(sd["shuffled"] / sd["in-memory"] - 1).max() < 0.1


def gibbs_model(x, y):
    """A Bernoulli indicator per covariate; the posterior is spread over its 8 states."""
    with pm.Model() as model:
        xd = pm.Data("X", x)
        yd = pm.Data("y", y)
        g = pm.Bernoulli("g", p=0.5, shape=D)
        pm.Normal("obs", pm.math.dot(xd, g * np.array([0.05, 0.04, -0.03])), 1.0,
                  observed=yd)
    return model


def gibbs_data(n=N, seed=4):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, D))
    return x, x @ np.array([0.05, 0.0, -0.03]) + rng.normal(size=n)


@pytest.mark.parametrize("shuffled_copy", [False, True])
def test_gibbs_reads_data_and_agrees_with_the_in_memory_gibbs(shuffled_copy, tmp_path):
    """Without a shuffle: the same draws; with it: the same state frequencies (z < 4)."""
    x, y = gibbs_data()
    data = write_store("npy", x, y, tmp_path)
    runs = {}
    for kind, model, arrays in (("memory", gibbs_model(x, y), None),
                                ("data", gibbs_model(x[:50], y[:50]), data)):
        with model:
            step = MinibatchGibbs(batch_size=200, data=arrays,
                                  shuffled_copy=shuffled_copy and arrays is not None)
            idata = pm.sample(draws=3000, tune=0, step=step, chains=1,
                              **sample_kwargs(random_seed=3))
        runs[kind] = np.asarray(posterior(idata)["g"])[0] @ np.array([1, 2, 4])
    if not shuffled_copy:
        np.testing.assert_array_equal(runs["data"], runs["memory"])
        return
    freq = {k: np.bincount(v, minlength=8) / v.size for k, v in runs.items()}
    batches = {k: np.stack([np.bincount(b, minlength=8) / b.size
                            for b in np.array_split(v, 20)]) for k, v in runs.items()}
    se = np.hypot(*(b.std(0, ddof=1) / np.sqrt(20) for b in batches.values()))
    z = np.abs(freq["data"] - freq["memory"]) / np.maximum(se, 0.01)
    assert z.max() < 4.0, (freq, z)
