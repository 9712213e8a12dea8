"""Map between a PyMC point (a dict of arrays) and the flat float64 vector a step works on."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = ["PointMap"]

_FLOAT64 = np.dtype(np.float64)


@dataclass(frozen=True)
class _Entry:
    name: str
    shape: tuple[int, ...]
    size: int
    start: int
    dtype: str


class PointMap:
    """Fast map between a PyMC point (dict) and the flat float64 vector of some variables.

    Parameters
    ----------
    names : sequence of str
        Value-variable names, in the order of the flat vector.
    point : dict
        A point giving each variable's shape and dtype.

    """

    def __init__(self, names: Sequence[str], point: Mapping[str, Any]) -> None:
        entries = []
        start = 0
        for name in names:
            value = np.asarray(point[name])
            entries.append(_Entry(name, value.shape, value.size, start, str(value.dtype)))
            start += value.size
        self.entries: tuple[_Entry, ...] = tuple(entries)
        self.size = start
        self._single = len(entries) == 1
        # One float64 vector variable: its value and the flat vector are the same array
        # (to_point stores the vector as is, flat_view reads the value as is).
        self._whole = (
            self._single and entries[0].dtype == "float64" and entries[0].shape == (start,)
        )

    def to_flat(self, point: Mapping[str, Any]) -> NDArray[np.float64]:
        """Flat float64 copy of the variables' values in ``point``."""
        if self._single:
            return np.array(point[self.entries[0].name], dtype=np.float64).reshape(-1)
        return np.concatenate(
            [np.asarray(point[e.name], dtype=np.float64).reshape(-1) for e in self.entries]
        )

    def flat_view(self, point: Mapping[str, Any]) -> NDArray[np.float64]:
        """The flat vector of ``point``'s variables, read only: not copied when it can be.

        For one float64 vector variable held as a contiguous array of the right shape,
        the point's own array (the caller must not modify it); otherwise :meth:`to_flat`.
        Saves the copy (about 1.5 µs) on a hot path that only reads the state.
        """
        if self._whole:
            e = self.entries[0]
            value = point[e.name]
            if (
                type(value) is np.ndarray
                and value.dtype is _FLOAT64
                and value.shape == e.shape
                and value.flags.c_contiguous
            ):
                return value
        return self.to_flat(point)

    def to_point(self, flat: NDArray[np.float64], point: Mapping[str, Any]) -> dict[str, Any]:
        """A new point: ``point`` with the variables replaced by the values in ``flat``.

        The new values may be views of ``flat``, or ``flat`` itself (no copy when the
        dtype is float64), so ``flat`` must not be modified afterwards.
        """
        new = dict(point)
        if self._whole:
            new[self.entries[0].name] = flat  # the vector itself (the common case)
            return new
        for e in self.entries:
            new[e.name] = flat[e.start : e.start + e.size].reshape(e.shape).astype(
                e.dtype, copy=False
            )
        return new
