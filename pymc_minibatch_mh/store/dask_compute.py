"""Computing on a Dask cluster with every wait bounded and its faults named.

:func:`compute` is ``dask.compute`` on Dask's local schedulers. On a ``distributed``
cluster it logs the workers that left during a computation, refuses to wait longer than
:data:`NO_WORKERS_TIMEOUT` for a cluster with no worker, and turns Dask's errors for data
it cannot compute again into :class:`~pymc_minibatch_mh.errors.DataStoreError`;
:func:`aligned` copies the unaligned arrays that come back from a worker process. Used by
:class:`~pymc_minibatch_mh.store.dask_store.DaskRowStore`.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from pymc_minibatch_mh.errors import DataStoreError

__all__ = ["NO_WORKERS_TIMEOUT", "aligned", "compute"]

#: Seconds between looks at the cluster's workers while a computation on it runs.
_WAIT_SLICE = 1.0
#: Seconds a computation waits with no worker in the cluster before it is refused (Dask
#: itself waits for workers forever). The Dask config key
#: ``pymc-minibatch-mh.no-workers-timeout`` overrides it (seconds, or a duration such as
#: ``"5 minutes"``).
NO_WORKERS_TIMEOUT = 60.0

_log = logging.getLogger("pymc_minibatch_mh")


def aligned(value: Any) -> Any:
    """``value`` with every NumPy array in it aligned (copied if it is not).

    Dask's distributed protocol hands arrays over as views of its message frames, which
    need not be aligned for their dtype; PyTensor's compiled functions refuse those.
    """
    if isinstance(value, np.ndarray):
        return value if value.flags.aligned else value.copy()
    if isinstance(value, (tuple, list)):
        return type(value)(aligned(v) for v in value)
    return value


def _client() -> Any:
    """The ``distributed.Client`` that ``dask.compute`` would use now, else None."""
    import sys

    if "distributed" not in sys.modules:  # no client can exist
        return None
    import dask.base
    from distributed import Client

    try:
        scheduler = dask.base.get_scheduler()
    except (RuntimeError, ValueError):
        return None
    client = getattr(scheduler, "__self__", scheduler)  # Client.get, or the client
    return client if isinstance(client, Client) else None


def _no_workers_timeout() -> float:
    import dask
    from dask.utils import parse_timedelta

    value = dask.config.get("pymc-minibatch-mh.no-workers-timeout", NO_WORKERS_TIMEOUT)
    return float(parse_timedelta(value, default="s"))


def compute(what: str, *collections: Any) -> tuple[Any, ...]:
    """``dask.compute(*collections)``, every wait bounded on a ``distributed`` cluster.

    On Dask's local schedulers this is ``dask.compute``. On a ``distributed`` cluster the
    tasks are submitted and waited for in slices of ``_WAIT_SLICE`` seconds. Dask
    itself computes again what a lost worker held, and reruns a task whose worker died (up
    to its ``distributed.scheduler.allowed-failures``); this function logs (logger
    ``pymc_minibatch_mh``, level WARNING) that workers left during the computation,
    refuses to wait longer than the no-workers timeout (:data:`NO_WORKERS_TIMEOUT`) for a
    cluster with no worker, and turns Dask's errors for data it cannot compute again into
    :class:`~pymc_minibatch_mh.errors.DataStoreError` saying ``what`` was computed.
    """
    import dask

    client = _client()
    if client is None:
        return dask.compute(*collections)
    from concurrent.futures import CancelledError

    from distributed import KilledWorker
    from distributed import wait as wait_for

    start = set(client.nthreads())
    left: set[str] = set()
    futures = client.compute(list(collections))
    done = False
    try:
        empty_since = None
        while True:
            try:
                wait_for(futures, timeout=_WAIT_SLICE)
                break
            except TimeoutError:
                pass
            now = set(client.nthreads())
            left |= start - now
            if now:
                empty_since = None
                continue
            empty_since = time.monotonic() if empty_since is None else empty_since
            if time.monotonic() - empty_since >= _no_workers_timeout():
                gone = f" ({', '.join(sorted(left))} left during it)" if left else ""
                raise DataStoreError(
                    f"The Dask cluster has had no worker for "
                    f"{time.monotonic() - empty_since:.0f} s while {what} was computed"
                    f"{gone}. Start workers (or restart the cluster) and sample again; to "
                    "wait longer for workers, set the Dask config "
                    "'pymc-minibatch-mh.no-workers-timeout' (seconds)."
                )
        results = client.gather(futures)
        done = True
    except KilledWorker as err:
        raise DataStoreError(
            f"Each Dask worker that ran one task of {what} died ({err.allowed_failures + 1} "
            f"in all; distributed.KilledWorker for {err.task!r}), and Dask gave up on it. A "
            "task that kills its worker is often one out of memory: give the workers more "
            "memory or make the Dask arrays' chunks smaller, then sample again."
        ) from err
    except CancelledError as err:
        raise DataStoreError(
            f"Dask lost data needed for {what} and cannot compute them again ({err}). "
            "Data held only by workers (put there with client.scatter, or arrays built "
            "from futures) are lost with a worker that held them. Build the Dask arrays "
            "from files or arrays that Dask can read again (dask.array.from_zarr, "
            "from_array; .persist() keeps them so), then build the step again."
        ) from err
    finally:
        if not done:
            client.cancel(futures)
    left |= start - set(client.nthreads())
    if left:
        _log.warning(
            "%d Dask worker(s) left the cluster while %s was computed (%s). Dask computed "
            "what they held again, or moved it, and the computation completed: its values "
            "are those of an undisturbed run (rows read again from files that changed "
            "are refused).", len(left), what, ", ".join(sorted(left)))
    return tuple(aligned(list(results)))
