"""Faults of a Dask cluster with worker processes: a worker killed during a set-up pass or
during the per-step row stream, data lost with their worker, a cluster with no worker.

The cluster is a ``LocalCluster(processes=True)`` (each worker a process under a nanny, which
starts a killed worker again); the tests kill a worker *inside* one of its tasks
(``SIGKILL`` from a block of the data, armed for one chosen computation), so the kill falls
in that computation whatever the timing. Where the data can be computed again, Dask does it
and the draws are those of an undisturbed run; where they cannot, or no worker is left, the
step raises :class:`~pymc_minibatch_mh.errors.DataStoreError` naming the data, in bounded
time. Rows that Dask reads again from files that changed in the meantime are refused
with :class:`~pymc_minibatch_mh.errors.DataChangedError`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import signal
import time

import numpy as np
import pymc as pm
import pytest
from conftest import sample_kwargs
from test_out_of_core import D, logistic_data, logistic_model, store_of, write_store

from pymc_minibatch_mh import MinibatchBarker
from pymc_minibatch_mh.errors import DataChangedError, DataStoreError
from pymc_minibatch_mh.model.compat import posterior
from pymc_minibatch_mh.store.dask_store import DaskRowStore

distributed = pytest.importorskip("distributed")
da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")

# Faults of the cluster and its data: the store's, not the PyMC line's (the Dask store's
# sampling through pm.sample runs on both lines in test_out_of_core.py).
pytestmark = pytest.mark.newest_line

#: Seconds the tests wait for the cluster (start, workers back after a kill): generous on
#: a loaded machine, but bounded.
WAIT = 120


def _local_cluster():
    """Two worker processes, one thread each, no dashboard; yields (cluster, client)."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as cluster, \
            distributed.Client(cluster) as client:
        client.wait_for_workers(2, timeout=WAIT)
        yield cluster, client


@pytest.fixture(scope="module")
def cluster():
    """Two worker processes, one thread each (started once: about 3 s)."""
    yield from _local_cluster()


@pytest.fixture
def own_cluster():
    """A cluster of its own for a test that leaves it with no worker (every worker killed,
    or scaled to none): the module's cluster never waits for workers to come back from it,
    which the nannies do in their own time on a loaded machine."""
    yield from _local_cluster()


@pytest.fixture
def client(cluster):
    """The cluster's client, with both workers up (a killed one is started again)."""
    cluster, client = cluster
    if len(cluster.workers) < 2:
        cluster.scale(2)
    client.wait_for_workers(2, timeout=WAIT)
    return client


def _wait_for_new_workers(client, killed: set[str]) -> None:
    """Wait until two workers other than the ``killed`` addresses are up: the scheduler
    lists a killed worker until it notices, so ``wait_for_workers`` alone can return at once
    and leave the next computation waiting for the nannies (slow on a loaded machine)."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if len(set(client.nthreads()) - killed) >= 2:
            return
        time.sleep(0.1)
    raise AssertionError(f"the nannies did not start two workers again within {WAIT} s")


def _killer(flag, parent):
    """A block function that kills its worker process once, after ``flag + ".armed"``
    exists (never in the test's own process). Defined here so that it is pickled by value."""

    def kill_once(block):
        if os.getpid() != parent and os.path.exists(flag + ".armed"):
            try:
                os.close(os.open(flag + ".killed", os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return block
            os.kill(os.getpid(), signal.SIGKILL)
        return block

    return kill_once


def _sample(data, on_cluster=("set-up", "chain")):
    """The draws of b: a Taylor-corrected Barker chain on ``data`` (N = 3,000 rows).

    The set-up passes and the chain run on the cluster, or on Dask's threads (faster) when
    not in ``on_cluster``: the scheduler changes no draw.
    """
    def where(part):
        return (contextlib.nullcontext() if part in on_cluster
                else dask.config.set(scheduler="threads"))

    x, y = logistic_data()
    with logistic_model(x[:50], y[:50]) as model, where("set-up"):
        # check_start=False: no full pass during the chain (only the row stream computes).
        step = MinibatchBarker(batch_size=100, control_variate="taylor", S="laplace",
                               scaling=2.38 / np.sqrt(D), tune=False, check_start=False,
                               data=data)
    with model, where("chain"):
        idata = pm.sample(draws=300, tune=0, step=step, chains=1,
                          **sample_kwargs(random_seed=3))
    step.likelihood.store.close()
    return np.asarray(posterior(idata)["b"])[0]


@pytest.fixture(scope="module")
def undisturbed():
    """The draws of an undisturbed run (Dask's threads: the scheduler changes no draw)."""
    x, y = logistic_data()
    return _sample(write_store("dask", x, y, None), on_cluster=())


def _killing_data(tmp_path):
    """The test data as Dask arrays whose X blocks kill their worker once, when armed."""
    x, y = logistic_data()
    flag = str(tmp_path / "worker")
    kill_once = _killer(flag, os.getpid())
    data = write_store("dask", x, y, None)
    data["X"] = data["X"].map_blocks(kill_once, dtype=x.dtype)
    return data, flag


def _worker_left(caplog, what):
    """The step's log lines saying that a worker left during ``what``."""
    return [r.getMessage() for r in caplog.records if r.name == "pymc_minibatch_mh"
            and f"left the cluster while {what} was computed" in r.getMessage()]


@pytest.mark.slow
def test_a_worker_killed_during_a_set_up_pass_is_replaced_and_the_draws_are_unchanged(
        client, undisturbed, tmp_path, monkeypatch, caplog):
    """The first full pass (of the MAP search) loses a worker mid-task: Dask runs the task
    again on the other worker, the step logs it, and the draws equal the undisturbed ones."""
    data, flag = _killing_data(tmp_path)
    reduce = DaskRowStore.reduce

    def arm_then_reduce(self, fn, *args):
        if not os.path.exists(flag + ".armed"):
            os.close(os.open(flag + ".armed", os.O_CREAT))
        return reduce(self, fn, *args)

    monkeypatch.setattr(DaskRowStore, "reduce", arm_then_reduce)
    caplog.set_level(logging.WARNING, logger="pymc_minibatch_mh")
    draws = _sample(data, on_cluster=("set-up",))
    assert os.path.exists(flag + ".killed")  # a worker died in the first pass
    assert _worker_left(caplog, "a full pass of the data 'X', 'y'")
    np.testing.assert_array_equal(draws, undisturbed)


@pytest.mark.slow
def test_a_worker_killed_during_the_row_stream_is_replaced_and_the_draws_are_unchanged(
        client, undisturbed, tmp_path, monkeypatch, caplog):
    """The stream's second block (fetched while the chain's first steps use the first)
    loses a worker mid-task: Dask computes the rows again, the step logs it, and the draws
    are unchanged."""
    data, flag = _killing_data(tmp_path)
    fetch = DaskRowStore._fetch
    fetches = []

    def arm_then_fetch(self, positions):
        fetches.append(len(positions))
        if len(fetches) == 2:
            os.close(os.open(flag + ".armed", os.O_CREAT))
        return fetch(self, positions)

    monkeypatch.setattr(DaskRowStore, "_fetch", arm_then_fetch)
    caplog.set_level(logging.WARNING, logger="pymc_minibatch_mh")
    draws = _sample(data, on_cluster=("chain",))
    assert len(fetches) >= 2
    assert os.path.exists(flag + ".killed")  # a worker died in the stream's second block
    assert _worker_left(caplog, "the per-step rows of the data 'X', 'y'")
    np.testing.assert_array_equal(draws, undisturbed)


#: A full pass's function: the rows of a block (a lambda: pickled by value, so that the
#: workers need not import this module).
_rows_of = lambda x_rows, y_rows: x_rows.shape[0]  # noqa: E731


def test_data_lost_with_their_worker_are_refused_naming_them(client):
    """Scattered arrays live only on a worker: killed, Dask cannot compute them again. A
    full pass and the row stream then raise DataStoreError naming the data (Dask's own
    error, a FutureCancelledError, chained), not Dask's bare error or a hang."""
    x, y = logistic_data()
    futures = {"X": client.scatter(x), "y": client.scatter(y)}
    data = {k: da.from_delayed(dask.delayed(f), v.shape, v.dtype)
            for (k, f), v in zip(futures.items(), (x, y), strict=True)}
    store = store_of(logistic_model(x[:50], y[:50]), data)
    assert store.reduce(_rows_of) == [len(x)]
    holders = {a for addresses in client.who_has(list(futures.values())).values()
               for a in addresses}
    pids = client.run(os.getpid, workers=sorted(holders))
    for pid in pids.values():
        os.kill(pid, signal.SIGKILL)
    message = r"Dask lost data needed for .* of the data 'X', 'y' and cannot compute them"
    with pytest.raises(DataStoreError, match=message) as info:
        store.reduce(_rows_of)
    assert isinstance(info.value.__cause__, concurrent.futures.CancelledError)
    # Rows of its own: Dask keys the tasks of a block by its rows, and an error kept on the
    # scheduler for a key would reach another test's block with the same rows.
    store.start_chain(np.random.default_rng(1))
    try:
        store.start_step()
        with pytest.raises(DataStoreError, match=message):
            store.take(100)
    finally:
        store.close()
    _wait_for_new_workers(client, holders)


def test_a_persisted_array_recomputed_from_changed_files_is_refused(client, tmp_path):
    """A persisted Dask array keeps its rows in its workers when its Zarr files change; a
    worker that dies takes its blocks with it, and Dask reads them again, from the changed
    files. Those rows differ from their first read: a full pass and the row stream raise
    DataChangedError (before: the new rows reached the chain unnoticed)."""
    zarr = pytest.importorskip("zarr")
    x, y = logistic_data()
    write_store("zarr", x, y, tmp_path)
    data = {k: da.from_zarr(str(tmp_path / f"{k}.zarr")).persist() for k in ("X", "y")}
    store = store_of(logistic_model(x[:50], y[:50]), data)
    assert store.reduce(_rows_of) == [len(x)]
    zarr.open_array(str(tmp_path / "X.zarr"), mode="r+")[:] = -x  # the workers hold the rows
    assert store.reduce(_rows_of) == [len(x)]
    pids = client.run(os.getpid)
    for pid in pids.values():
        os.kill(pid, signal.SIGKILL)
    _wait_for_new_workers(client, set(pids))
    with pytest.raises(DataChangedError, match="a full pass of the data 'X', 'y'"), \
            dask.config.set({"pymc-minibatch-mh.no-workers-timeout": WAIT}):
        store.reduce(_rows_of)
    store.start_chain(np.random.default_rng(4))
    try:
        store.start_step()
        with pytest.raises(DataChangedError, match="the per-step rows of the data 'X', 'y'"):
            store.take(100)
    finally:
        store.close()


def test_a_task_that_kills_every_worker_it_runs_on_is_refused_naming_the_data(own_cluster):
    """Dask reruns a task whose worker died, up to its allowed failures (here none), then
    gives up (KilledWorker): the full pass raises DataStoreError naming the data."""
    cluster, client = own_cluster
    x, y = logistic_data()
    data = write_store("dask", x, y, None)
    parent = os.getpid()

    def kill(block):
        if os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
        return block

    data["y"] = data["y"].map_blocks(kill, dtype=y.dtype)
    with dask.config.set(scheduler="threads"):  # the checks at the start: here
        store = store_of(logistic_model(x[:50], y[:50]), data)
    cluster.scheduler.allowed_failures = 0
    message = r"Each Dask worker that ran one task of a full pass of the data 'X', 'y' died"
    with pytest.raises(DataStoreError, match=message) as info:
        store.reduce(_rows_of)
    assert isinstance(info.value.__cause__, distributed.KilledWorker)


def test_a_cluster_with_no_worker_left_is_refused_in_bounded_time(own_cluster):
    """Dask waits for workers forever; a step waits for the no-workers timeout (here 2 s),
    then raises DataStoreError, in a full pass and in the row stream."""
    cluster, client = own_cluster
    x, y = logistic_data()
    store = store_of(logistic_model(x[:50], y[:50]), write_store("dask", x, y, None))
    try:
        cluster.scale(0)
        deadline = time.monotonic() + WAIT
        while client.nthreads() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not client.nthreads()
        message = r"no worker for \d+ s while .* of the data 'X', 'y' was computed"
        with dask.config.set({"pymc-minibatch-mh.no-workers-timeout": 2}):
            start = time.monotonic()
            with pytest.raises(DataStoreError, match=message):
                store.reduce(_rows_of)
            store.start_chain(np.random.default_rng(2))  # rows (and keys) of its own
            store.start_step()
            with pytest.raises(DataStoreError, match=message):
                store.take(100)
            assert time.monotonic() - start < 30
    finally:
        store.close()
