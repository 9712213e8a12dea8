"""Drawing minibatch rows without replacement, at the cost of a slice.

A minibatch test needs, within one step, rows drawn uniformly *without replacement* and
possibly grown several times. Calling ``Generator.choice(N, b, replace=False)`` every
step costs O(b) with a large constant, and ``permutation(N)[:b]`` costs O(N). Instead
:class:`ShuffledRows` keeps one random order of the N rows per chain and hands out
consecutive slices of it. When a pass over the data is exhausted, the rows not used by
the current step are reshuffled (O(N) once per pass, O(1) amortised per row) while the
rows already used by the current step are kept apart, so a step never sees a row twice.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

__all__ = ["ShuffledRows"]


class ShuffledRows:
    """Row sampler: contiguous slices of a random order, reshuffled once per pass.

    Parameters
    ----------
    n_rows : int
        Number of rows (observations) N.
    rng : numpy.random.Generator
        Generator used for the initial order and every reshuffle.

    Notes
    -----
    Every call of :meth:`start_step` opens a new step; :meth:`take` then returns rows not
    yet returned in this step. Marginally, the rows of a step are a uniformly random
    subset of size b (a window of a uniformly random order). Within a pass, consecutive
    steps see disjoint rows, which makes successive estimates slightly negatively
    correlated but does not change the distribution of any single step.

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

    __slots__ = ("n_rows", "rng", "order", "cursor", "step_start", "passes")

    def __init__(self, n_rows: int, rng: np.random.Generator) -> None:
        if n_rows < 1:
            raise ValueError(f"n_rows must be at least 1, got {n_rows}.")
        self.n_rows = int(n_rows)
        self.rng = rng
        self.order: NDArray[np.int64] = rng.permutation(self.n_rows).astype(np.int64)
        self.cursor = 0
        self.step_start = 0
        self.passes = 0

    def start_step(self) -> None:
        """Begin a new step: rows returned from now on are new to this step."""
        self.step_start = self.cursor

    @property
    def used_in_step(self) -> int:
        """Number of rows returned since the last :meth:`start_step`."""
        return self.cursor - self.step_start

    def take(self, count: int) -> NDArray[np.int64]:
        """Return ``count`` row indices not yet returned in this step.

        Parameters
        ----------
        count : int
            Number of rows; ``used_in_step + count`` must not exceed ``n_rows``.

        Returns
        -------
        numpy.ndarray
            A contiguous int64 view of the internal order. It is valid until the next call
            of :meth:`take`; copy it to keep it.
        """
        end = self.cursor + count
        if end > self.n_rows:
            if self.used_in_step + count > self.n_rows:
                raise ValueError(
                    f"cannot take {count} more rows: {self.used_in_step} of {self.n_rows} "
                    "rows are already used in this step"
                )
            self._new_pass()
            end = self.cursor + count
        rows = self.order[self.cursor : end]
        self.cursor = end
        return rows

    def give_back(self, count: int) -> None:
        """Return the last ``count`` rows taken in this step, unused, to the pool.

        They will be the first rows of the next :meth:`take`, as if never taken (used when
        rows were evaluated ahead of need and the test stopped before using them).
        """
        if not 0 <= count <= self.used_in_step:
            raise ValueError(f"cannot give back {count} rows; {self.used_in_step} were taken")
        self.cursor -= count

    def _new_pass(self) -> None:
        """Reshuffle the rows not used in the current step; keep the current step's rows."""
        current = self.order[self.step_start : self.cursor].copy()
        rest = np.concatenate((self.order[: self.step_start], self.order[self.cursor :]))
        self.rng.shuffle(rest)
        k = current.size
        self.order[:k] = current
        self.order[k:] = rest
        self.step_start = 0
        self.cursor = k
        self.passes += 1
