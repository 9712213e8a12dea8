"""Drawing minibatch rows without replacement, at the cost of a slice.

A minibatch test needs, within one step, rows drawn uniformly *without replacement* and
possibly grown several times. Calling ``Generator.choice(N, b, replace=False)`` every
step costs O(b) with a large constant, and ``permutation(N)[:b]`` costs O(N). Instead
:class:`ShuffledRows` keeps one random order of the N rows and gives each step a window
of it, starting at a fresh uniformly random position and growing forwards (cyclically).
The order is reshuffled whenever the steps since the last shuffle have used N rows in
total, so the cost is O(1) amortised per row.

Why a random start, rather than continuing where the previous step stopped: the tests
stop growing when the rows they have seen decide the outcome, so the rows a step leaves
unused in a pass depend on the values it saw. Steps that consume a pass in sequence would
inherit that selection (measurably, for sequential tests that use a large share of N);
with an independent uniform start every step's rows are a uniformly random subset,
whatever earlier steps did.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

__all__ = ["ShuffledRows", "numpy_shuffle"]

#: ``shuffle(order, rng)``: permute the int64 array ``order`` in place, uniformly at random,
#: drawing only from ``rng``.
Shuffle = Callable[[NDArray[np.int64], np.random.Generator], None]


def numpy_shuffle(order: NDArray[np.int64], rng: np.random.Generator) -> None:
    """``rng.shuffle(order)``: the default ``shuffle`` of :class:`ShuffledRows`."""
    rng.shuffle(order)


class ShuffledRows:
    """Row sampler: random windows of a random order, reshuffled once per N rows used.

    Parameters
    ----------
    n_rows : int
        Number of rows (observations) N.
    rng : numpy.random.Generator
        Generator used for the orders and the windows' starts.
    shuffle : callable, optional
        ``shuffle(order, rng)`` permutes ``order`` in place uniformly at random (default
        :func:`numpy_shuffle`). Every order, the first included, is made by it; the
        adapter passes a compiled one (NumPy's costs about 47 ms per 10⁶ rows, a large
        share of a step's cost when amortised over the steps of a pass).

    Notes
    -----
    Every call of :meth:`start_step` opens a new step at a uniformly random position;
    :meth:`take` then returns the next rows of the order (wrapping around at the end), so
    a step never sees a row twice and a step of N rows sees every row once. Marginally,
    the rows of a step are a uniformly random subset of their size.

    Examples
    --------
    >>> import numpy as np
    >>> rows = ShuffledRows(10, np.random.default_rng(0))
    >>> rows.start_step()
    >>> first = rows.take(4).copy()
    >>> second = rows.take(6)
    >>> sorted(np.concatenate([first, second]).tolist())
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]

    """

    __slots__ = (
        "n_rows", "rng", "order", "start", "used", "since_shuffle", "shuffles", "_positions",
        "_shuffle",
    )

    def __init__(
        self, n_rows: int, rng: np.random.Generator, shuffle: Shuffle | None = None
    ) -> None:
        if n_rows < 1:
            raise ValueError(f"n_rows must be at least 1, got {n_rows}.")
        self.n_rows = int(n_rows)
        self.rng = rng
        self._shuffle = numpy_shuffle if shuffle is None else shuffle
        self.order: NDArray[np.int64] = np.arange(self.n_rows, dtype=np.int64)
        self._shuffle(self.order, rng)
        self.start = 0
        self.used = 0
        self.since_shuffle = 0
        self.shuffles = 0
        self._positions: NDArray[np.int64] | None = None

    def start_step(self) -> None:
        """Begin a new step at a uniformly random position of the order."""
        self.since_shuffle += self.used
        if self.since_shuffle >= self.n_rows:
            self._shuffle(self.order, self.rng)
            self.since_shuffle = 0
            self.shuffles += 1
        # One uniform draw (cheaper than Generator.integers for a scalar); exact for N < 2**53.
        self.start = min(int(self.rng.random() * self.n_rows), self.n_rows - 1)
        self.used = 0

    @property
    def used_in_step(self) -> int:
        """Number of rows returned since the last :meth:`start_step`."""
        return self.used

    def take(self, count: int) -> NDArray[np.int64]:
        """Return ``count`` row indices not yet returned in this step.

        Parameters
        ----------
        count : int
            Number of rows; ``used_in_step + count`` must not exceed ``n_rows``.

        Returns
        -------
        numpy.ndarray
            Contiguous int64 indices (a view of the internal order unless the window wraps
            around its end); valid until the order is reshuffled, at the next step.

        """
        n = self.n_rows
        if self.used + count > n:
            raise ValueError(
                f"cannot take {count} more rows: {self.used} of {n} rows are already used "
                "in this step"
            )
        a = (self.start + self.used) % n
        b = a + count
        self.used += count
        if b <= n:
            return self.order[a:b]
        return np.concatenate((self.order[a:], self.order[: b - n]))

    def take_positions(self, count: int) -> NDArray[np.int64]:
        """Like :meth:`take`, but return positions in ``order`` instead of rows.

        For data stored in the current order (``data[order]``), the positions select the
        same rows as :meth:`take` would, and they are consecutive (except where the
        window wraps around). ``shuffles`` (the number of reshuffles so far) tells when
        the order has changed.
        """
        n = self.n_rows
        if self.used + count > n:
            raise ValueError(
                f"cannot take {count} more rows: {self.used} of {n} rows are already used "
                "in this step"
            )
        if self._positions is None:
            self._positions = np.arange(n, dtype=np.int64)
        a = (self.start + self.used) % n
        b = a + count
        self.used += count
        if b <= n:
            return self._positions[a:b]
        return np.concatenate((self._positions[a:], self._positions[: b - n]))

    def give_back(self, count: int) -> None:
        """Return the last ``count`` rows taken in this step, unused.

        They will be the first rows of the next :meth:`take` of this step, as if never
        taken (used when rows were evaluated ahead of need and the test stopped before
        using them), and do not count as used.
        """
        if not 0 <= count <= self.used:
            raise ValueError(f"cannot give back {count} rows; {self.used} were taken")
        self.used -= count
