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

The minibatch Barker test's compiled path (:meth:`PairSource.barker_step`) sizes the calls
after the first one differently: from the test's variance so far it predicts the rows it
will need and evaluates them in one call (on the Gaussian-mixture benchmark this cut the
calls per step from 1.57 to 1.30 at the same rows evaluated). Neither rule changes a
draw: rows evaluated but unused are given back.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pymc_minibatch_mh.adapter.compat import DirectCall
from pymc_minibatch_mh.adapter.kernel import NEED_MORE, barker_rounds, chunk_moments_fast
from pymc_minibatch_mh.adapter.likelihood import FULL_PASS_CHUNK, MinibatchLikelihood
from pymc_minibatch_mh.core.rows import ShuffledRows

__all__ = ["ARRANGE_MAX_BYTES", "PairSource", "PrefetchPolicy"]

#: Largest data (observed and covariates, in bytes) that a chain copies in its row order.
ARRANGE_MAX_BYTES: int = 2**30


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
        #: Whether calls after a step's first are sized from the test's variance (set by
        #: the step method; it changes the cost model of ``"auto"``, never a draw).
        self.sized_growth = False
        self.reset()

    def reset(self, batch_size: int = 1) -> None:
        """Forget the chain's history (start of a chain); ``batch_size`` is rows per round."""
        self.batch_size = batch_size
        self.rounds = self.fixed
        # A list: incrementing a Python int is cheaper than a NumPy element, every step.
        self.counts = [0] * (self.max_rounds * 4 + 2)
        self.steps = 0

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

        A step that needs ``r`` rounds with blocks of ``k`` costs one call of ``k`` rounds
        when ``r ≤ k``. Otherwise, with ``sized_growth`` (the minibatch Barker test's
        compiled path, :meth:`PairSource.barker_step`), about one more call that brings
        the rows to ``1.15 r`` rounds; without, ``⌈r/k⌉`` calls of ``k`` rounds each.
        """
        counts = np.asarray(self.counts, dtype=np.float64)
        p = counts / max(1.0, counts.sum())
        m, c = self.batch_size, self.call_cost_rows
        # One row per block size k = 1..max_rounds, one column per rounds needed r: all
        # costs at once (this runs every UPDATE_EVERY steps of every chain).
        k = np.arange(1, self.max_rounds + 1, dtype=np.float64)[:, None]
        r = np.arange(counts.size, dtype=np.float64)[None, :]
        if self.sized_growth:
            grown = k + np.maximum(1.0, np.ceil(1.15 * r - k))
            costs = np.where(r <= k, c + k * m, 2.0 * c + grown * m)
        else:
            costs = np.ceil(np.maximum(r, 1.0) / k) * (c + k * m)
        expected = costs @ p
        # The smallest block among those of least cost (up to rounding).
        return int(np.flatnonzero(expected <= expected.min() + 1e-12)[0]) + 1


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
        "policy", "_block", "_pos", "_len", "_used", "_data_free", "_buf",
        "arrange", "_arranged_at", "full_pass_fn", "_take",
    )

    def __init__(self, lik: MinibatchLikelihood, policy: PrefetchPolicy) -> None:
        self.lik = lik
        #: ``(x_cur, x_prop, rows, inv_temperature) -> (l, ..., data_free)``: the ratios
        #: of the rows first and the data-free part (0-d) last; by default
        #: :meth:`~pymc_minibatch_mh.adapter.likelihood.MinibatchLikelihood.delta`,
        #: called directly; an estimator may replace it (control variates: residuals).
        self.delta_fn = lik.delta_fast
        #: ``(x_cur, x_prop, inv_temperature, n) -> values of all N rows`` when an
        #: estimator replaces the ratios (control variates: residuals); None: the ratios.
        self.full_pass_fn: Any = None
        self._buf = np.empty(0)
        #: Keep the rows of the per-step function in the chain's row order (see
        #: :meth:`~pymc_minibatch_mh.adapter.likelihood.MinibatchLikelihood.arrange_rows`);
        #: on when the data take at most :data:`ARRANGE_MAX_BYTES` (the copy doubles their
        #: memory).
        self.arrange = lik.row_bytes <= ARRANGE_MAX_BYTES
        self._arranged_at = -1
        self._take: Any = None  # the open step's row-taking function (see _open_step)
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

    def start_chain(self, rows: ShuffledRows, n_total: int, batch_size: int) -> None:
        """Start a chain: its row sampler, N and the rows per round of its test."""
        self.rows = rows
        self.n_total = n_total
        self.policy.reset(batch_size)
        self._arranged_at = -1
        self._reset_block()

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
        self._len = self._pos = self._used = 0
        self._take = self._open_step()
        self._fetch(self.policy.batch_size)
        return self._data_free

    def _open_step(self) -> Any:
        """Start a step on the row order; return the function that takes its rows.

        After a reshuffle of the order, the data are first arranged in the new order
        (with ``arrange``); the function then takes positions in it, else row indices.
        """
        rows = self.rows
        rows.start_step()  # type: ignore[union-attr]
        if self.arrange and rows.shuffles != self._arranged_at:  # type: ignore[union-attr]
            self.lik.arrange_rows(rows.order)  # type: ignore[union-attr]
            self._arranged_at = rows.shuffles  # type: ignore[union-attr]
        return rows.take_positions if self.arrange else rows.take  # type: ignore[union-attr]

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
        out = self.delta_fn(self.x_cur, self.x_prop, self._take(size), self.inv_temperature)
        self._block = out[0]
        self._data_free = float(out[-1])
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
        # The same arithmetic as the compiled Barker loop (so both give the same draws);
        # −inf, +inf or NaN ratios give a non-finite mean or m2 that the test sees as is.
        mean, m2 = chunk_moments_fast(values)
        return values, mean, m2

    def barker_step(
        self, x_cur: NDArray[np.float64], x_prop: NDArray[np.float64],
        inv_temperature: NDArray[np.float64], batch_size: int, sigma2: float,
        tolerance: float, early_decision: float,
    ) -> tuple[float, tuple[int, int, int, float, float, int, float, float, float, float] | None]:
        """One whole minibatch Barker step's rows and growth loop, with the compiled kernel.

        :meth:`begin`, the growth loop, then :meth:`finish`: the same rows, arithmetic and
        stopping rules as :func:`~pymc_minibatch_mh.core.barker.barker_test` drawing from
        this source, with one call of
        :func:`~pymc_minibatch_mh.adapter.kernel.barker_rounds` per block of evaluated
        rows. ``tolerance`` and ``early_decision`` are off when ≤ 0.

        Returns
        -------
        tuple
            ``(data_free, result)`` with ``result`` the kernel's ``(status, used, n, mean,
            m2, rounds, delta_star, variance, epsilon, edgeworth)`` for the final block, or
            ``None`` when the data-free part is not finite (no rows are then used).

        """
        # The bookkeeping of begin(), _fetch() and finish(), inlined: this runs once per
        # MCMC step, where a few method calls cost as much as a hundred rows.
        take = self._open_step()
        rows = self.rows
        call, extra = self._call()
        n_total = self.n_total
        per_call = batch_size * self.policy.rounds
        size = min(n_total, per_call)
        out = call(x_cur, x_prop, take(size), inv_temperature, *extra)
        evaluated = size
        data_free = float(out[-1])
        if not math.isfinite(data_free):
            rows.give_back(size)  # type: ignore[union-attr]
            self.evaluated = evaluated
            self.policy.record(0)
            return data_free, None
        block = out[0]
        buf = self._buf
        n = rounds = 0
        mean = m2 = 0.0
        while True:
            if buf.shape[0] < n + size:
                grown = np.empty(max(n + size, 2 * buf.shape[0], 1024))
                grown[:n] = buf[:n]
                buf = self._buf = grown
            result = barker_rounds(
                block, buf, n, mean, m2, rounds, n_total, batch_size, data_free, sigma2,
                tolerance, early_decision,
            )
            status, used, n, mean, m2, rounds, _, _, _, _ = result
            if used < size:
                rows.give_back(size - used)  # type: ignore[union-attr]
            if status != NEED_MORE:
                self.evaluated = evaluated
                self.policy.record(rounds)
                return data_free, result
            size = min(n_total - n, self._growth_rows(result, n_total, batch_size, sigma2))
            block = call(x_cur, x_prop, take(size), inv_temperature, *extra)[0]
            evaluated += size

    def _growth_rows(
        self, result: tuple[Any, ...], n_total: int, batch_size: int, sigma2: float
    ) -> int:
        """Rows to evaluate in the next call of a step that needs more than its first block.

        The rows the test will need are predicted from its variance so far: ``s²`` at
        ``n'`` rows is about ``s²(n) · [(N − n')/n'] / [(N − n)/n]``, which falls below σ²
        at ``n' = N / (1 + σ²(N − n) / (n s²(n)))``. The call evaluates 15 % more than
        that, in whole rounds, so that most growing steps need one extra call instead of
        one per block of ``prefetch`` rounds; at most ``FULL_PASS_CHUNK`` rows per call, so
        that memory stays bounded. Only the cost depends on this: unused rows are given
        back.
        """
        n, variance = result[2], result[7]
        if not (0.0 < variance < math.inf):
            return batch_size * self.policy.rounds
        target = n_total / (1.0 + sigma2 * (n_total - n) / (n * variance))
        need = int(1.15 * target) - n
        chunk = max(batch_size, FULL_PASS_CHUNK - FULL_PASS_CHUNK % batch_size)
        return min(chunk, max(batch_size, -(-need // batch_size) * batch_size))

    def _call(self) -> tuple[Any, tuple[Any, ...]]:
        """``(fn, extra)``: calling ``fn(*args, *extra)`` is calling ``delta_fn(*args)``.

        For a :class:`~pymc_minibatch_mh.adapter.compat.DirectCall`, its jitted graph and
        the shared values (so no wrapper runs per call).
        """
        fn = self.delta_fn
        if isinstance(fn, DirectCall):
            parts = fn.unwrapped()
            if parts is not None:
                return parts
        return fn, ()

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
