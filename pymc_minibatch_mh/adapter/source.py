"""The step methods' minibatch source: log-likelihood ratios between θ and θ' by rows.

A core test asks for ``count`` new rows at a time (the paper's m). Each call of the
compiled function has a fixed cost (about 7 µs with PyTensor 3, 20 µs with PyTensor 2's C
backend) that is larger than the cost of a few hundred rows, while tests often grow the
minibatch several times. :class:`PairSource` therefore evaluates rows in blocks of
``prefetch_rounds`` requests and serves the test from the block; rows evaluated but not
used by the test are given back to the row order untouched, so they are not counted as
used, take no part in the decision and come first in the next step. The decisions and
stats are the same as with ``prefetch_rounds = 1``: only the cost changes.

With ``prefetch="auto"`` the block size is chosen every 256 steps from the distribution of
growth rounds seen so far in the chain, minimising ``calls · r + rows evaluated`` with
``r`` the function's fixed cost in rows (a deterministic rule, so draws stay reproducible).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pymc_minibatch_mh.adapter.likelihood import MinibatchLikelihood
from pymc_minibatch_mh.core.moments import chunk_moments
from pymc_minibatch_mh.core.rows import ShuffledRows

__all__ = ["PairSource", "PrefetchPolicy"]


class PrefetchPolicy:
    """Chooses how many test rounds of rows to evaluate per compiled call.

    Parameters
    ----------
    prefetch : int or "auto"
        A fixed number of rounds per call, or ``"auto"``.
    call_cost_rows : float
        Fixed cost of one call expressed in rows (used by ``"auto"``).
    max_rounds : int
        Largest block, in rounds, that ``"auto"`` considers.

    """

    UPDATE_EVERY = 256

    def __init__(self, prefetch: int | str = "auto", call_cost_rows: float = 150.0,
                 max_rounds: int = 16) -> None:
        if prefetch != "auto" and not (isinstance(prefetch, int) and prefetch >= 1):
            raise ValueError(f"prefetch must be a positive integer or 'auto', got {prefetch!r}")
        self.auto = prefetch == "auto"
        self.fixed = 1 if self.auto else int(prefetch)
        self.call_cost_rows = call_cost_rows
        self.max_rounds = max_rounds
        self.reset()

    def reset(self, batch_size: int = 1) -> None:
        """Forget the chain's history (start of a chain); ``batch_size`` is rows per round."""
        self.batch_size = batch_size
        self.rounds = self.fixed
        self.counts = np.zeros(self.max_rounds * 4 + 2, dtype=np.int64)
        self.steps = 0

    def record(self, rounds: int) -> None:
        """Record the number of rounds a step needed."""
        if not self.auto:
            return
        self.counts[min(rounds, self.counts.size - 1)] += 1
        self.steps += 1
        if self.steps % self.UPDATE_EVERY == 0:
            self.rounds = self.best_rounds()

    def best_rounds(self) -> int:
        """The block size (in rounds) of least expected cost under the recorded rounds."""
        r = np.arange(self.counts.size)
        p = self.counts / max(1, self.counts.sum())
        best, best_cost = 1, math.inf
        for k in range(1, self.max_rounds + 1):
            calls = np.ceil(np.maximum(r, 1) / k)
            cost = float(p @ (calls * (self.call_cost_rows + k * self.batch_size)))
            if cost < best_cost - 1e-12:
                best, best_cost = k, cost
        return best


class PairSource:
    """Ratios ``l_i`` between the current and proposed states, for one chain's steps.

    Parameters
    ----------
    lik : MinibatchLikelihood
        The compiled model functions.
    policy : PrefetchPolicy
        Block-size policy.

    """

    __slots__ = (
        "lik", "delta_fn", "rows", "x_cur", "x_prop", "inv_temperature", "n_total", "evaluated",
        "policy", "_block", "_csum", "_csum_sq", "_pos", "_len", "_used", "_data_free",
        "full_pass_fn",
    )

    def __init__(self, lik: MinibatchLikelihood, policy: PrefetchPolicy) -> None:
        self.lik = lik
        #: ``(x_cur, x_prop, rows, inv_temperature) -> (l, cumsum(l − l0), cumsum((l − l0)²),
        #: data_free)``: :meth:`MinibatchLikelihood.delta` unless an estimator replaces it.
        self.delta_fn = lik.delta
        #: ``(x_cur, x_prop, inv_temperature, n) -> values of all N rows`` when an
        #: estimator replaces the ratios (control variates: residuals); None: the ratios.
        self.full_pass_fn: Any = None
        self.policy = policy
        self.rows: ShuffledRows | None = None
        self.x_cur: NDArray[np.float64] = np.empty(0)
        self.x_prop: NDArray[np.float64] = np.empty(0)
        self.inv_temperature = np.array(1.0)
        self.n_total = 0
        self.evaluated = 0
        self._reset_block()

    def _reset_block(self) -> None:
        self._block: Any = None
        self._pos = 0
        self._len = 0
        self._used = 0

    def begin(
        self, x_cur: NDArray[np.float64], x_prop: NDArray[np.float64],
        inv_temperature: NDArray[np.float64],
    ) -> float:
        """Open a step for the pair (θ, θ') and return its data-free part ``c(θ, θ')``.

        The first block of rows is evaluated in the same compiled call as the data-free
        part; the test uses as much of it as it needs.
        """
        self.x_cur = x_cur
        self.x_prop = x_prop
        self.inv_temperature = inv_temperature
        self.evaluated = 0
        self._reset_block()
        self.rows.start_step()  # type: ignore[union-attr]
        self._fetch(self.policy.batch_size)
        return self._data_free

    def finish(self, rounds: int) -> None:
        """Close the step: give unused evaluated rows back, record the rounds used."""
        unused = self._len - self._pos
        if unused:
            self.rows.give_back(unused)  # type: ignore[union-attr]
        self._reset_block()
        self.policy.record(rounds)

    def _fetch(self, count: int) -> None:
        rows = self.rows
        unused = self._len - self._pos
        if unused:
            rows.give_back(unused)  # type: ignore[union-attr]
        room = self.n_total - self._used
        size = min(room, count * self.policy.rounds)
        idx = rows.take(size)  # type: ignore[union-attr]
        self._block, self._csum, self._csum_sq, data_free = self.delta_fn(
            self.x_cur, self.x_prop, idx, self.inv_temperature
        )
        self._data_free = float(data_free)
        self.evaluated += size
        self._pos = 0
        self._len = size

    def draw(self, count: int) -> tuple[NDArray[np.float64], float, float]:
        """``count`` new rows: their ratios, mean and sum of squared deviations."""
        if self._pos + count > self._len:
            self._fetch(count)
        a = self._pos
        b = a + count
        self._pos = b
        self._used += count
        values = self._block[a:b]
        s1 = float(self._csum[b - 1])
        s2 = float(self._csum_sq[b - 1])
        if a:
            s1 -= float(self._csum[a - 1])
            s2 -= float(self._csum_sq[a - 1])
        mean = float(self._block[0]) + s1 / count
        m2 = s2 - s1 * s1 / count
        if not (math.isfinite(mean) and math.isfinite(m2)):
            # −inf, +inf or NaN ratios: let the test see them as they are.
            return (values, *chunk_moments(values))
        return values, mean, max(m2, 0.0)

    def full_pass(self) -> NDArray[np.float64]:
        """All N ratios (for tests that need a full pass; counted in ``evaluated``).

        With control variates (``full_pass_fn`` set), all N residuals instead.
        """
        n = self.n_total
        self.evaluated += n
        if self.full_pass_fn is not None:
            return self.full_pass_fn(self.x_cur, self.x_prop, self.inv_temperature, n)
        cur = self.lik.full_loglik(self.x_cur, n)
        prop = self.lik.full_loglik(self.x_prop, n)
        return (prop - cur) * float(self.inv_temperature)
