"""A NumPy ``Generator`` whose scalar draws are taken in blocks.

A minibatch step draws a handful of single random numbers (the proposal's increments,
the uniforms of its row draws, ``X_nc``, ``X_corr`` or a logistic value). Each call of a
``Generator`` method costs about 0.8 µs, mostly call overhead, and these calls add up
to several per cent of a step that costs 40–60 µs. :class:`BufferedGenerator` draws
them in blocks (1024 values by default) and hands them out one at a
time for about 0.1 µs each.

It *is* a ``Generator`` on the same bit generator (state shared, no copy): every method
it does not override draws directly from that state, and every value it hands out was
drawn from it, in an order fixed by the sequence of calls. The same seed therefore gives
the same values, but not the same values as an unbuffered ``Generator`` would give for
the same calls (blocks are drawn ahead).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["BufferedGenerator"]

_FLOAT64 = np.float64  # a global name: read on every draw
_MAX_VECTOR = 64


class BufferedGenerator(np.random.Generator):
    """``Generator`` on ``generator``'s bit generator, with scalar draws taken in blocks.

    Overridden, with the same distributions: ``standard_normal``, ``random`` and
    ``logistic`` for a single value (``size=None``, the default ``dtype``, no ``out``),
    and ``standard_normal(k)`` for ``k ≤ 64`` values (a proposal's increments). Other
    calls, and other sizes, go to ``Generator`` itself. Pickling gives a plain
    ``Generator`` in the bit generator's current state (the unused part of the blocks is
    dropped).

    Parameters
    ----------
    generator : numpy.random.Generator
        The generator whose bit generator (and state) is used.
    block : int
        Values drawn per block.

    Examples
    --------
    >>> import numpy as np
    >>> rng = BufferedGenerator(np.random.default_rng(0))
    >>> isinstance(rng, np.random.Generator)
    True
    >>> x = rng.standard_normal()
    >>> a = BufferedGenerator(np.random.default_rng(1)).random()
    >>> a == BufferedGenerator(np.random.default_rng(1)).random()
    True

    """

    __slots__ = ("block", "_normals", "_uniforms", "_vectors", "_vector_pos")

    #: Largest ``size`` of ``standard_normal(size)`` served from a block.
    MAX_VECTOR = _MAX_VECTOR

    def __init__(self, generator: np.random.Generator, block: int = 1024) -> None:
        super().__init__(generator.bit_generator)
        if block < self.MAX_VECTOR:
            raise ValueError(f"block must be at least {self.MAX_VECTOR}, got {block}.")
        self.block = int(block)
        self._normals: Any = iter(())
        self._uniforms: Any = iter(())
        self._vectors = np.empty(0)
        self._vector_pos = self.block  # empty: the first vector draws a block

    def standard_normal(  # type: ignore[override]
        self, size: Any = None, dtype: Any = np.float64, out: Any = None
    ) -> Any:
        """Standard normal draws; see ``numpy.random.Generator.standard_normal``."""
        if out is None and dtype is _FLOAT64:
            if size is None:
                for z in self._normals:
                    return z
                self._normals = iter(super().standard_normal(self.block).tolist())
                return next(self._normals)
            if type(size) is int and 0 <= size <= _MAX_VECTOR:
                a = self._vector_pos
                b = a + size
                if b > self.block:
                    self._vectors = super().standard_normal(self.block)
                    a, b = 0, size
                self._vector_pos = b
                # A view of a block that is never written again: later draws come from
                # other entries or a new block, so callers may modify it in place.
                return self._vectors[a:b]
        return super().standard_normal(size, dtype, out)

    def random(self, size: Any = None, dtype: Any = np.float64, out: Any = None) -> Any:
        """Uniform draws on [0, 1); see ``numpy.random.Generator.random``."""
        if size is None and out is None and dtype is _FLOAT64:
            for u in self._uniforms:
                return u
            self._uniforms = iter(super().random(self.block).tolist())
            return next(self._uniforms)
        return super().random(size, dtype, out)

    def logistic(self, loc: Any = 0.0, scale: Any = 1.0, size: Any = None) -> Any:
        """Logistic draws; see ``numpy.random.Generator.logistic``.

        A single value is ``loc + scale · log(U / (1 − U))`` with ``U`` from
        :meth:`random` (``U = 0`` is drawn again), the inverse CDF.
        """
        if size is None and type(loc) is float and type(scale) is float:
            u = self.random()
            while u == 0.0:
                u = self.random()
            return loc + scale * math.log(u / (1.0 - u))
        return super().logistic(loc, scale, size)

    def __reduce__(self) -> Any:
        plain = np.random.Generator(self.bit_generator)
        return plain.__reduce__()
