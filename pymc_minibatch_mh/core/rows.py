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

Marginally, yes; jointly, the windows of one pass share the order, which is then hidden
state of the chain. :class:`PartialShuffleRows` removes it: each step draws its rows by a
partial Fisher–Yates pass over a persistent order, O(1) per row and never O(N) after
construction, so every step's rows are a uniformly random ordered sample that is
independent of all earlier steps.
"""

from __future__ import annotations

from collections.abc import Callable

import numba
import numpy as np
from numpy.typing import NDArray

__all__ = ["PartialShuffleRows", "ShuffledRows", "numpy_shuffle"]

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


@numba.njit(cache=True, nogil=True)
def _partial_fisher_yates(
    order: NDArray[np.int64], start: int, u: NDArray[np.float64]
) -> None:  # pragma: no cover - compiled
    """Fisher–Yates swaps for positions ``start .. start + len(u) − 1`` of ``order``.

    Position ``i`` receives the element at ``j = i + ⌊u·(N − i)⌋`` (``j ≤ N − 1``).
    """
    n = order.shape[0]
    for k in range(u.shape[0]):
        i = start + k
        j = i + int(u[k] * (n - i))
        if j > n - 1:
            j = n - 1
        tmp = order[i]
        order[i] = order[j]
        order[j] = tmp


class PartialShuffleRows:
    """Row sampler: a fresh uniformly random sample per step, by partial Fisher–Yates draws.

    Parameters
    ----------
    n_rows : int
        Number of rows (observations) N.
    rng : numpy.random.Generator
        The only source of randomness (one uniform per row drawn).

    Notes
    -----
    The sampler keeps a permutation ``order`` of ``0 .. N − 1`` (the identity at first;
    it never needs to be random). :meth:`start_step` only resets the step's cursor.
    :meth:`take` draws the next ``count`` positions ``i = used, ..., used + count − 1`` of
    the step by one Fisher–Yates swap each: ``order[i]`` is exchanged with ``order[j]``,
    ``j = i + ⌊u_i (N − i)⌋``, ``u_i`` uniform on [0, 1), and ``order[used:used + count]``
    is returned. The cost is O(count) per take, never O(N).

    Why the rows are uniform and independent of earlier steps: when position ``i`` is
    drawn, ``order[:i]`` holds the rows already taken in this step and ``order[i:]``
    exactly the others, in *some* arrangement. The swap puts a uniformly random one of
    those at position ``i`` whatever that arrangement is, since ``j`` is uniform on
    ``i .. N − 1`` and the ``u_i`` are fresh. So for every fixed starting permutation the
    step's rows, in order, are a uniformly random ordered sample without replacement; as
    the permutation left by earlier steps is independent of the new ``u_i``, so is the
    sample (whatever the earlier steps' rows, values and decisions were). A sequential
    test that stops when its rows decide leaves no trace on the rows of later steps,
    unlike windows of one shared order (:class:`ShuffledRows`).

    The arrays returned by :meth:`take` are views of ``order``: valid until the next
    :meth:`start_step` (later takes of the same step only swap positions after them).

    Examples
    --------
    >>> import numpy as np
    >>> rows = PartialShuffleRows(10, np.random.default_rng(0))
    >>> rows.start_step()
    >>> first = rows.take(4).copy()
    >>> second = rows.take(6)
    >>> sorted(np.concatenate([first, second]).tolist())
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    >>> rows.used_in_step
    10
    >>> rows.start_step()
    >>> len(set(rows.take(5).tolist()))
    5

    """

    __slots__ = ("n_rows", "rng", "order", "used", "drawn", "_u")

    def __init__(self, n_rows: int, rng: np.random.Generator) -> None:
        if n_rows < 1:
            raise ValueError(f"n_rows must be at least 1, got {n_rows}.")
        self.n_rows = int(n_rows)
        self.rng = rng
        self.order: NDArray[np.int64] = np.arange(self.n_rows, dtype=np.int64)
        #: Rows returned in this step (positions ``order[:used]``).
        self.used = 0
        #: Positions already drawn in this step (``≥ used`` after :meth:`give_back`).
        self.drawn = 0
        self._u: NDArray[np.float64] = np.empty(0)

    def start_step(self) -> None:
        """Begin a new step (O(1): the next rows are drawn afresh by :meth:`take`)."""
        self.used = 0
        self.drawn = 0

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
            int64 row indices, a view of ``order`` valid until the next
            :meth:`start_step`.

        """
        used = self.used
        stop = used + count
        if stop > self.n_rows:
            raise ValueError(
                f"cannot take {count} more rows: {used} of {self.n_rows} rows are already "
                "used in this step"
            )
        fresh = stop - self.drawn
        if fresh > 0:
            if self._u.shape[0] < fresh:
                self._u = np.empty(max(fresh, 2 * self._u.shape[0]))
            u = self._u[:fresh]
            self.rng.random(out=u)
            _partial_fisher_yates(self.order, self.drawn, u)
            self.drawn = stop
        self.used = stop
        return self.order[used:stop]

    def give_back(self, count: int) -> None:
        """Return the last ``count`` rows taken in this step, unused.

        They stay drawn: the next :meth:`take` of this step returns them first, as if
        never taken (the step's sample stays a uniformly random ordered sample).
        """
        if not 0 <= count <= self.used:
            raise ValueError(f"cannot give back {count} rows; {self.used} were taken")
        self.used -= count
