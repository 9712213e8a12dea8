"""Where a minibatch test gets its per-observation log-likelihood ratios from.

A test never sees data or parameters: it asks a *source* for the ratios
``l_i = (1/K) [log p(x_i | θ') − log p(x_i | θ)]`` of ``count`` rows it has not seen yet
in this step, and receives them together with their mean and sum of squared deviations
(which a compiled PyTensor function computes in the same call). The PyMC adapter
provides a source for a model; :class:`ArraySource` serves a precomputed population,
for tests and simulations of the acceptance tests themselves.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from pymc_minibatch_mh.core.moments import chunk_moments
from pymc_minibatch_mh.core.rows import PartialShuffleRows

__all__ = ["ArraySource", "MinibatchSource"]


class MinibatchSource(Protocol):
    """Protocol of a minibatch source for one step (see the module docstring)."""

    @property
    def n_total(self) -> int:
        """Population size N."""
        ...

    @property
    def buffered(self) -> int:
        """Rows already evaluated for this step and not yet drawn (0 if none)."""
        ...

    def draw_values(self, count: int) -> NDArray[np.float64]:
        """The values of ``count`` rows not drawn before in this step."""
        ...

    def draw(self, count: int) -> tuple[NDArray[np.float64], float, float]:
        """Return ``(values, mean, m2)`` for ``count`` rows not drawn before in this step."""
        ...

    def full_pass(self) -> NDArray[np.float64]:
        """All N values, for tests that need a pass over the whole data (counted)."""
        ...


class ArraySource:
    """A source over a precomputed population of l_i values.

    Parameters
    ----------
    values : numpy.ndarray
        The N per-observation values ``l_i`` (temperature already applied).
    rows : PartialShuffleRows, optional
        Row sampler; by default a new one is made from ``rng``.
    rng : numpy.random.Generator, optional
        Used only when ``rows`` is not given.

    Notes
    -----
    Call :meth:`start_step` before each simulated test, exactly like the step methods do.

    Examples
    --------
    >>> import numpy as np
    >>> src = ArraySource(np.arange(5.0), rng=np.random.default_rng(1))
    >>> src.start_step()
    >>> values, mean, m2 = src.draw(5)
    >>> float(values.sum()), mean, m2
    (10.0, 2.0, 10.0)

    """

    def __init__(
        self,
        values: NDArray[np.float64],
        rows: PartialShuffleRows | None = None,
        rng: np.random.Generator | None = None,
    ) -> None:
        self.values = np.ascontiguousarray(values, dtype=np.float64)
        if self.values.ndim != 1:
            raise ValueError("values must be one-dimensional")
        if rows is None:
            rows = PartialShuffleRows(self.values.shape[0], rng or np.random.default_rng())
        self.rows = rows
        self.rows_drawn = 0
        self.full_passes = 0

    @property
    def n_total(self) -> int:
        """Population size N."""
        return self.values.shape[0]

    def start_step(self) -> None:
        """Start a new step (rows drawn from now on are new to it)."""
        self.rows.start_step()

    #: Nothing is evaluated ahead of the test.
    buffered = 0

    def draw_values(self, count: int) -> NDArray[np.float64]:
        """The values of ``count`` new rows."""
        chunk = self.values[self.rows.take(count)]
        self.rows_drawn += count
        return chunk

    def draw(self, count: int) -> tuple[NDArray[np.float64], float, float]:
        """Return ``(values, mean, m2)`` of ``count`` new rows."""
        chunk = self.draw_values(count)
        mean, m2 = chunk_moments(chunk)
        return chunk, mean, m2

    def full_pass(self) -> NDArray[np.float64]:
        """All N values (counted in ``full_passes``)."""
        self.full_passes += 1
        return self.values
