"""The per-step stream of rows of the Dask row store, fetched ahead by a background thread.

:class:`StreamBuffer` draws blocks of :data:`STREAM_BLOCK` row indices i.i.d. uniformly
from all N with its own generator, fetches their rows through the store's ``fetch``
(sorted indices, so each chunk of the data is read once per block) and queues them in
stream order, :data:`STREAM_DEPTH` blocks ahead of the steps. The thread ends when no step
has taken rows for a while and starts again where it stopped, so the stream of rows does
not depend on the pauses. Its store is
:class:`~pymc_minibatch_mh.store.dask_store.DaskRowStore`.
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = ["STREAM_BLOCK", "STREAM_DEPTH", "StreamBuffer"]

#: Row indices drawn (and rows fetched) per refill of the per-step buffer.
STREAM_BLOCK = 1 << 16
#: Blocks fetched ahead of the steps.
STREAM_DEPTH = 3


class StreamBuffer:
    """A background thread that fetches blocks of uniformly drawn rows, in order.

    Parameters
    ----------
    n_rows : int
        N: indices are drawn uniformly from ``0 .. N − 1`` (with replacement; repeats
        within a step are skipped by the store).
    seed : int
        Seed of the indices' generator (one draw from the chain's generator).
    fetch : callable or weakref.WeakMethod
        ``fetch(sorted_indices) -> tuple of arrays``: the rows at sorted indices. A weak
        method lets its owner (the row store) be garbage collected while the thread runs;
        the thread then ends.
    block, depth : int
        Rows per block, blocks queued ahead.
    idle : float
        Seconds with ``depth`` blocks queued and none taken after which the thread ends
        (a chain that ended or was interrupted leaves no thread behind);
        :meth:`next_block` starts it again where it stopped, so the stream of rows is the
        same whether or not it paused.

    """

    def __init__(self, n_rows: int, seed: int, fetch: Callable[[NDArray[np.int64]], Any],
                 block: int = STREAM_BLOCK, depth: int = STREAM_DEPTH,
                 idle: float = 1.0) -> None:
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        # The indices' generator, used by one thread at a time: a thread started again
        # continues its sequence.
        self._args = (self._queue, self._stop, np.random.default_rng(seed), n_rows, fetch,
                      block, idle)
        self._thread: list[threading.Thread] = []
        self._error: BaseException | None = None
        self._finalizer = weakref.finalize(self, _halt, self._stop, self._thread)
        self._start()

    def _start(self) -> None:
        thread = threading.Thread(target=_fill, args=self._args,
                                  name="pymc_minibatch_mh-stream", daemon=True)
        self._thread[:] = [thread]
        thread.start()

    def next_block(self) -> tuple[NDArray[np.int64], tuple[NDArray[Any], ...]]:
        """The next block: its row indices (in stream order) and their rows.

        A block whose fetch failed raises its error, now and at every later call.
        """
        if self._error is not None:  # the fetch failed: so does every later block
            raise self._error
        if self._stop.is_set():
            raise RuntimeError("The stream of rows was closed; start a new chain.")
        while True:
            try:
                item = self._queue.get(timeout=_POLL)
                break
            except queue.Empty:
                if not self._thread[0].is_alive():  # it ended while idle: start it again
                    self._start()
        if isinstance(item, BaseException):
            self._error = item
            raise item
        return item

    def close(self) -> None:
        """Stop the thread (it ends within a fraction of a second)."""
        self._finalizer()


#: Seconds between the stream thread's checks for a stop, and the consumer's for a thread.
_POLL = 0.1


def _halt(stop: threading.Event, thread: list[threading.Thread]) -> None:
    stop.set()
    if thread and thread[0] is not threading.current_thread():
        thread[0].join(timeout=10)


def _fill(q: queue.Queue[Any], stop: threading.Event, rng: np.random.Generator, n_rows: int,
          fetch: Callable[[NDArray[np.int64]], Any], block: int, idle: float) -> None:
    while not stop.is_set():
        waited = 0.0
        while q.full():  # depth blocks ahead: wait for a step to take one
            if stop.wait(_POLL):
                return
            waited += _POLL
            if waited >= idle:  # no step takes rows: end (started again when one does)
                return
        idx = rng.integers(0, n_rows, size=block, dtype=np.int64)
        fetch_now = fetch() if isinstance(fetch, weakref.WeakMethod) else fetch
        if fetch_now is None:  # the store was garbage collected: nothing to fetch for
            return
        try:
            order = np.argsort(idx, kind="stable")
            fetched = fetch_now(idx[order])
            del fetch_now  # hold the store only while fetching
            rows = []
            for part in fetched:
                out = np.empty_like(part)
                out[order] = part  # back to stream order
                rows.append(out)
            item: Any = (idx, tuple(rows))
        except BaseException as err:  # noqa: BLE001 - handed to the sampling thread
            item = err
        q.put(item)  # never waits: this thread alone puts, and there is room
        if isinstance(item, BaseException):
            return
