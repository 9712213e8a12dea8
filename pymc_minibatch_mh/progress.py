"""A progress line for a step's set-up, shown only when the set-up takes a while.

Building a step compiles functions and, with control variates, makes full passes over the
data (the MAP search and the sums at θ̂), which can take seconds on tall data.
:func:`setup_progress` wraps the set-up; code inside it calls :func:`note` at each phase
or pass. Nothing is shown for the first ``delay`` seconds (quick set-ups stay quiet); after
that each phase is logged at INFO on the ``pymc_minibatch_mh`` logger (a line per phase,
and one at least every :data:`LOG_EVERY` seconds within a long phase), which the package
shows as PyMC shows its own "Sequential sampling ..." lines (see
:mod:`pymc_minibatch_mh`), so the phases reach logs and notebooks. On a terminal a spinner
line (``rich``, which PyMC uses for its own progress bars) also says what is running and
for how long.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

__all__ = ["LOG_EVERY", "note", "setup_progress"]

#: Seconds between logged lines within one phase of a long set-up.
LOG_EVERY = 10.0

_log = logging.getLogger("pymc_minibatch_mh")

_ACTIVE: ContextVar[_SetupProgress | None] = ContextVar("setup_progress", default=None)


class _SetupProgress:
    def __init__(self, what: str, delay: float, enabled: bool) -> None:
        self.what = what
        self.delay = delay
        self.enabled = enabled
        self.started = time.perf_counter()
        self.text = "starting"
        self._status: Any = None
        self._logged_phase: str | None = None
        self._logged_at = 0.0
        self._lock = threading.Lock()
        self._closed = False
        # The phase running at ``delay`` is shown then, not only at the next note.
        self._timer = threading.Timer(delay, self.show)
        self._timer.daemon = True
        self._timer.start()

    def show(self) -> None:
        """Show the current phase (if ``delay`` has passed)."""
        self.update(self.text)

    def update(self, text: str) -> None:
        with self._lock:
            self._update(text)

    def _update(self, text: str) -> None:
        self.text = text
        elapsed = time.perf_counter() - self.started
        if elapsed < self.delay or self._closed:
            return
        phase = re.sub(r"\d[\d,.]*", "#", text)  # the same phase at another row or pass
        if phase != self._logged_phase or elapsed - self._logged_at >= LOG_EVERY:
            self._logged_phase, self._logged_at = phase, elapsed
            self._log(f"{self._line()} (at {elapsed:.0f} s)")
        if not self.enabled:
            return
        if self._status is None:
            from rich.console import Console

            self._status = Console(stderr=True).status(self._line())
            self._status.start()
        else:
            self._status.update(self._line())

    def _line(self) -> str:
        return f"{self.what} set-up: {self.text}"

    def _log(self, message: str) -> None:
        """Log ``message`` at INFO, above the spinner line when there is one."""
        if self._status is None:
            _log.info(message)
            return
        self._status.stop()
        _log.info(message)
        self._status.start()

    def close(self) -> None:
        self._timer.cancel()
        self._timer.join()  # no thread outlives the set-up
        with self._lock:
            self._closed = True
            if self._logged_phase is not None:
                elapsed = time.perf_counter() - self.started
                self._log(f"{self.what} set-up: done in {elapsed:.0f} s")
            if self._status is not None:
                self._status.stop()
                self._status = None


@contextmanager
def setup_progress(what: str, delay: float = 1.5) -> Iterator[_SetupProgress]:
    """Log the set-up's phases after ``delay`` seconds (and show them on a terminal).

    Parameters
    ----------
    what : str
        What is being set up (e.g. the step method's name).
    delay : float
        Seconds before anything is shown.

    Yields
    ------
    object
        The progress line; :func:`note` reaches it from anywhere inside the block.

    """
    progress = _SetupProgress(what, delay, enabled=sys.stderr.isatty())
    token = _ACTIVE.set(progress)
    try:
        yield progress
    finally:
        _ACTIVE.reset(token)
        progress.close()


def note(text: str) -> None:
    """Say what the set-up is doing now (no effect outside :func:`setup_progress`)."""
    progress = _ACTIVE.get()
    if progress is not None:
        progress.update(text)
