"""A progress line for a step's set-up, shown only when the set-up takes a while.

Building a step compiles functions and, with control variates, makes full passes over the
data (the MAP search and the sums at θ̂), which can take seconds on tall data.
:func:`setup_progress` wraps the set-up; code inside it calls :func:`note` at each phase
or pass. Nothing is shown for the first ``delay`` seconds, nor when standard error is not
a terminal (logs and CI stay clean); after that a spinner line (``rich``, which PyMC
uses for its own progress bars) says what is running and for how long.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

__all__ = ["note", "setup_progress"]

_ACTIVE: ContextVar[_SetupProgress | None] = ContextVar("setup_progress", default=None)


class _SetupProgress:
    def __init__(self, what: str, delay: float, enabled: bool) -> None:
        self.what = what
        self.delay = delay
        self.enabled = enabled
        self.started = time.perf_counter()
        self.text = "starting"
        self._status: Any = None

    def update(self, text: str) -> None:
        self.text = text
        if not self.enabled:
            return
        elapsed = time.perf_counter() - self.started
        if self._status is None and elapsed >= self.delay:
            from rich.console import Console

            self._status = Console(stderr=True).status(self._line())
            self._status.start()
        elif self._status is not None:
            self._status.update(self._line())

    def _line(self) -> str:
        return f"{self.what} set-up: {self.text}"

    def close(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None


@contextmanager
def setup_progress(what: str, delay: float = 1.5) -> Iterator[_SetupProgress]:
    """Show the set-up's phases after ``delay`` seconds (on a terminal only).

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
