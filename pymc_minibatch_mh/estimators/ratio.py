"""Δ* estimators: where a step's acceptance test gets its per-row values from.

An estimator of the log acceptance ratio ``Δ = c(θ, θ') + Σ_i l_i`` has one interface,
whatever it estimates the sum from:

- :meth:`RatioEstimator.open` opens a step for the pair (θ, θ′) and returns its
  *data-free part* ``c``: the prior and Jacobian difference, the proposal's log-q ratio,
  and for control variates the closed-form full-data sum of the proxies;
- :meth:`~RatioEstimator.draw_values` / :meth:`~RatioEstimator.draw` give the values of
  new rows of the step (drawn by the row store uniformly without replacement);
- :meth:`~RatioEstimator.full_pass` gives all N values, in bounded-memory chunks;
- :meth:`~RatioEstimator.close` ends the step.

This is the core's :class:`~pymc_minibatch_mh.core.source.MinibatchSource` protocol, so a
core test runs on an estimator directly. Two implementations today: the plain ratios
``l_i = (1/K)[log p(x_i|θ') − log p(x_i|θ)]`` (:class:`RatioEstimator`) and the Taylor
residuals (:class:`~pymc_minibatch_mh.estimators.taylor.TaylorEstimator`). A new
estimator is one class: it supplies its compiled per-row function (and, if it needs them,
per-chain checks or a data-free term).

Each compiled call has a fixed cost (about 4–7 µs with Numba) that is larger than the cost
of a hundred rows, while tests often grow the minibatch several times. The estimator
therefore evaluates rows in blocks: with the data-free part it evaluates ``prefetch``
rounds of rows (:class:`PrefetchPolicy`), and serves the test from that block. Rows
evaluated but not drawn by the test take no part in the decision and are not counted.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from pymc_minibatch_mh.core.barker import GROWTH_FACTOR
from pymc_minibatch_mh.core.moments import chunk_moments
from pymc_minibatch_mh.model.likelihood import MinibatchLikelihood

__all__ = ["PrefetchPolicy", "RatioEstimator"]

#: The row index with which :meth:`RatioEstimator.data_free` calls the per-step function.
_FIRST_ROW = np.zeros(1, dtype=np.int64)


class PrefetchPolicy:
    """Chooses how many test rounds of rows to evaluate with a step's data-free part.

    Parameters
    ----------
    prefetch : int or "auto"
        A fixed number of rounds, or ``"auto"``: chosen every 256 steps from the
        distribution of rounds the chain's steps needed so far, minimising the expected
        ``calls · r + rows evaluated`` with ``r`` the function's fixed cost in rows (a
        deterministic rule, so draws stay reproducible).
    call_cost_rows : float
        Fixed cost of one call expressed in rows (used by ``"auto"``).
    max_rounds : int
        Largest block, in rounds, that ``"auto"`` considers.

    """

    UPDATE_EVERY = 256

    def __init__(self, prefetch: int | str = "auto", call_cost_rows: float = 150.0,
                 max_rounds: int = 16) -> None:
        if prefetch != "auto" and not (
            isinstance(prefetch, int) and not isinstance(prefetch, bool) and prefetch >= 1
        ):
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
        # A list: incrementing a Python int is cheaper than a NumPy element, every step.
        self.counts = [0] * (self.max_rounds * 4 + 2)
        self.steps = 0

    @property
    def rows(self) -> int:
        """Rows of the first block of a step."""
        return self.rounds * self.batch_size

    def record(self, rounds: int) -> None:
        """Record the number of rounds a step needed."""
        if not self.auto:
            return
        counts = self.counts
        counts[rounds if rounds < len(counts) else -1] += 1
        self.steps += 1
        if not self.steps % self.UPDATE_EVERY:
            self.rounds = self.best_rounds()

    def best_rounds(self) -> int:
        """The block size (in rounds) of least expected cost under the recorded rounds.

        A step that needs ``r`` rounds with a first block of ``k`` costs one call of ``k``
        rounds when ``r ≤ k``, else about one more call that brings the rows to
        :data:`~pymc_minibatch_mh.core.barker.GROWTH_FACTOR` ``· r`` rounds (the growth of
        :func:`~pymc_minibatch_mh.core.barker.growth_rows`).
        """
        counts = np.asarray(self.counts, dtype=np.float64)
        p = counts / max(1.0, counts.sum())
        m, c = self.batch_size, self.call_cost_rows
        # One row per block size k = 1..max_rounds, one column per rounds needed r: all
        # costs at once (this runs every UPDATE_EVERY steps of every chain).
        k = np.arange(1, self.max_rounds + 1, dtype=np.float64)[:, None]
        r = np.arange(counts.size, dtype=np.float64)[None, :]
        grown = k + np.maximum(1.0, np.ceil(GROWTH_FACTOR * r - k))
        costs = np.where(r <= k, c + k * m, 2.0 * c + grown * m)
        expected = costs @ p
        # The smallest block among those of least cost (up to rounding).
        return int(np.flatnonzero(expected <= expected.min() + 1e-12)[0]) + 1


class RatioEstimator:
    """Δ* from the plain per-row ratios ``l_i`` (see the module docstring).

    Parameters
    ----------
    likelihood : MinibatchLikelihood
        The compiled model functions and the row store.
    policy : PrefetchPolicy
        Size of the first block of a step.
    fn : callable, optional
        ``fn(x_cur, x_prop, inv_temperature, *rows) -> (values, data_free)``: the per-row
        values of the rows and the data-free part (0-d) in one call. Default: the
        likelihood's ratios and prior difference.

    """

    #: The estimator's name (``step.estimator.name``).
    name: ClassVar[str] = "ratios"
    #: Re-centrings of the control variates' reference so far (none without them).
    recenterings: int = 0

    __slots__ = ("likelihood", "store", "policy", "fn", "n_total", "x_cur", "x_prop",
                 "inv_temperature", "evaluated", "_block", "_pos", "_taken")

    def __init__(
        self, likelihood: MinibatchLikelihood, policy: PrefetchPolicy, fn: Any = None
    ) -> None:
        self.likelihood = likelihood
        self.store = likelihood.store
        self.policy = policy
        self.fn = likelihood.delta_fast if fn is None else fn
        self.n_total = 0
        self.x_cur: NDArray[np.float64] = np.empty(0)
        self.x_prop: NDArray[np.float64] = np.empty(0)
        self.inv_temperature = np.array(1.0)
        #: Rows evaluated in the current step (drawn by the test or not).
        self.evaluated = 0
        self._block: NDArray[np.float64] = np.empty(0)
        self._pos = 0
        self._taken = 0

    # ------------------------------------------------------------------ chain
    def start_chain(self, rng: np.random.Generator, batch_size: int) -> None:
        """Start a chain: N from the row store, its row draws, the policy's history."""
        self.store.start_chain(rng)
        self.n_total = self.store.n_rows
        self.policy.reset(batch_size)

    def follow_data(self) -> bool:
        """Repeat the estimator's set-up if the data changed (a chain start; a hook).

        Returns whether it did; the plain ratios have no set-up (their rows are read
        afresh at each chain start), so never.
        """
        return False

    def maybe_recenter(self, x: NDArray[np.float64]) -> int:
        """Move the estimator's reference towards ``x`` if it has one (tuning only).

        Returns the rows evaluated for it (0: nothing to move here).
        """
        return 0

    # ------------------------------------------------------------------- step
    def open(
        self,
        x_cur: NDArray[np.float64],
        x_prop: NDArray[np.float64],
        inv_temperature: NDArray[np.float64],
        log_q_ratio: float,
        rows: int,
    ) -> float:
        """Open a step for the pair (θ, θ′); return its data-free part.

        The first ``rows`` rows (at most N) are evaluated in the same call as the
        data-free part and wait for the test (:attr:`buffered`).
        """
        self.x_cur = x_cur
        self.x_prop = x_prop
        self.inv_temperature = inv_temperature
        store = self.store
        store.start_step()
        rows = min(rows, self.n_total)
        out = self.fn(x_cur, x_prop, inv_temperature, *store.take(rows))
        self._block = out[0]
        self._pos = 0
        self._taken = self.evaluated = rows
        return float(out[1]) + log_q_ratio

    def data_free(self, x_cur: NDArray[np.float64], x_prop: NDArray[np.float64],
                  inv_temperature: NDArray[np.float64]) -> float:
        """The data-free part of Δ for the pair (θ, θ′), outside a chain and its step.

        ``fn`` on the data's first row, whose residual is dropped: no row draws, and no
        function compiled besides the per-step one.
        """
        return float(self.fn(x_cur, x_prop, inv_temperature, *self.store.rows(_FIRST_ROW))[1])

    @property
    def buffered(self) -> int:
        """Rows evaluated for this step and not yet drawn."""
        return self._block.shape[0] - self._pos

    def draw_values(self, count: int) -> NDArray[np.float64]:
        """The values of ``count`` rows not drawn before in this step."""
        block = self._block
        pos = self._pos
        stop = pos + count
        if stop <= block.shape[0]:
            self._pos = stop
            return block[pos:stop]
        have = block[pos:]
        size = min(self.n_total - self._taken, max(count - have.shape[0], self.policy.rows))
        new = self.fn(self.x_cur, self.x_prop, self.inv_temperature, *self.store.take(size))[0]
        self._taken += size
        self.evaluated += size
        block = self._block = np.concatenate((have, new)) if have.shape[0] else new
        self._pos = count
        return block[:count]

    def draw(self, count: int) -> tuple[NDArray[np.float64], float, float]:
        """``count`` new rows: their values, mean and sum of squared deviations."""
        values = self.draw_values(count)
        mean, m2 = chunk_moments(values)
        return values, mean, m2

    def full_pass(self) -> NDArray[np.float64]:
        """The values of all N rows, in bounded-memory chunks (counted in ``evaluated``)."""
        self.evaluated += self.n_total
        fn, x_cur, x_prop, inv_t = self.fn, self.x_cur, self.x_prop, self.inv_temperature
        return np.concatenate(
            [fn(x_cur, x_prop, inv_t, *chunk)[0] for chunk in self.store.chunks()]
        )

    def close(self, rounds: int) -> None:
        """End the step (the policy records the rounds it needed)."""
        self.policy.record(rounds)
