"""Do the row windows bias the chain? Stationary θ under three row samplers, compared.

The question: ``ShuffledRows`` gives each step a window of one shared random order; within
a pass, later windows reuse rows whose values drove earlier stopping decisions, so the
order is hidden state and θ alone may not follow the intended kernel. ``PartialShuffleRows``
draws a fresh uniform sample per step (partial Fisher–Yates), so it cannot have this
problem. Here each acceptance test (AustereMH, MHSubLhd, minibatch Barker at temperature 1
without control variates) drives a small pure-NumPy chain, at small N where the tests use a
large share of the rows, with

(a) ``ShuffledRows`` windows, (b) ``PartialShuffleRows``, (c) a reference sampler that
draws an independent uniformly random permutation every step (``rng.permutation(N)``).

The statistics are the stationary mean and second moment of the standardised θ
(``(θ − posterior mean) / posterior sd``); the check is a z-score of the difference between
two chains, each standard error from batch means (chains of ≥ 40 k steps, 40 batches, far
longer than the integrated autocorrelation times of about 5-15 steps). With fixed seeds
the outcome is deterministic; |z| ≤ 4 is the pass mark (12 comparisons per run, so a
correct sampler fails by chance with probability about 1e-3 at a fresh seed).

The check can fail: a deliberately broken sampler, ``FixedWindowRows`` (the same window of
one fixed order every step), is rejected by the same check (|z| > 6 for every test).
``ContinuingRows`` (continue where the previous step stopped, no random start) is only
measured in the slow runs: at these sizes it shows no detectable bias. The model's data
are fixed, so the exact posterior is known; the Barker chain is close enough to exact to
be compared with it too (with a small allowance).

Measured (slow runs, 4 × 10⁵ steps per chain; effect = difference from independent rows;
x in posterior sds, so E[x²] in posterior variances): ShuffledRows with AustereMH
inflates E[x²] by +0.055 ± 0.013 (z = 4.1; a replicate with new seeds and 8 × 10⁵
steps: +0.046 ± 0.009, z = 5.0), about 3.5% of the stationary variance 1.4; with
MHSubLhd (C = 0) +0.026 ± 0.010 (z = 2.5); with Barker −0.003 ± 0.008. E[x] shows
nothing (|z| < 1.6). PartialShuffleRows: all |z| < 1 (the replicate: E[x²]
−0.004 ± 0.009); ContinuingRows: |z| ≤ 1.7.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from pymc_minibatch_mh.core.austere import austere_test
from pymc_minibatch_mh.core.barker import barker_test
from pymc_minibatch_mh.core.correction import get_correction
from pymc_minibatch_mh.core.moments import chunk_moments
from pymc_minibatch_mh.core.rows import PartialShuffleRows
from pymc_minibatch_mh.core.subsampling import mhsublhd_test

# ------------------------------------------------------------------------------ the model
#: y_i ~ N(θ, 1), θ ~ N(0, 10²): the posterior is normal with precision N + 1/100.
PRIOR_PRECISION = 0.01
N_ROWS = 40


def make_data(n_rows: int = N_ROWS, seed: int = 20240611) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.5, 1.0, size=n_rows)


def posterior(y: np.ndarray) -> tuple[float, float]:
    """Exact posterior mean and sd of θ."""
    precision = y.shape[0] + PRIOR_PRECISION
    return float(y.sum() / precision), 1.0 / math.sqrt(precision)


# -------------------------------------------------------------------------- row samplers
class IndependentRows:
    """Reference sampler: an independent uniformly random permutation every step (O(N))."""

    def __init__(self, n_rows: int, rng: np.random.Generator) -> None:
        self.n_rows = n_rows
        self.rng = rng
        self.perm = np.arange(n_rows)
        self.used = 0

    def start_step(self) -> None:
        self.perm = self.rng.permutation(self.n_rows)
        self.used = 0

    @property
    def used_in_step(self) -> int:
        return self.used

    def take(self, count: int) -> np.ndarray:
        if self.used + count > self.n_rows:
            raise ValueError("past N")
        out = self.perm[self.used : self.used + count]
        self.used += count
        return out


# ------------------------------------------------------------- the former design
# The package's row sampler until the row-window question was measured (here as a test
# double): windows of one random order, reshuffled once per N rows used.
#: ``shuffle(order, rng)``: permute the int64 array ``order`` in place, uniformly at random,
#: drawing only from ``rng``.
Shuffle = Callable[[NDArray[np.int64], np.random.Generator], None]


def numpy_shuffle(order: NDArray[np.int64], rng: np.random.Generator) -> None:
    """``rng.shuffle(order)``."""
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
        package's step passed a compiled one (NumPy's costs about 47 ms per 10⁶ rows, a large
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




class ContinuingRows(ShuffledRows):
    """BROKEN on purpose: each step continues the order where the previous step stopped.

    Like :class:`ShuffledRows` (reshuffled once per N rows used) but without the random
    start: the rows a step leaves unused are exactly the next step's first rows, so the
    next step inherits the previous step's selection.
    """

    __slots__ = ()

    def start_step(self) -> None:
        end = (self.start + self.used) % self.n_rows
        self.since_shuffle += self.used
        if self.since_shuffle >= self.n_rows:
            self._shuffle(self.order, self.rng)
            self.since_shuffle = 0
            self.shuffles += 1
            end = 0
        self.start = end
        self.used = 0


class FixedWindowRows(ShuffledRows):
    """BROKEN on purpose: the same window of one fixed order every step (start 0, never
    reshuffled), so a step's first rows are always the same rows."""

    __slots__ = ()

    def start_step(self) -> None:
        self.start = 0
        self.used = 0


SAMPLERS: dict[str, Callable[[int, np.random.Generator], Any]] = {
    "independent": IndependentRows,
    "shuffled": ShuffledRows,
    "partial": PartialShuffleRows,
    "continuing": ContinuingRows,
    "fixed": FixedWindowRows,
}


# -------------------------------------------------------------------------------- source
class RowSource:
    """``MinibatchSource`` for the normal-mean model: ``l_i = log N(y_i|θ',1) − log N(y_i|θ,1)``.

    ``l_i = d · y_i − d (θ + θ') / 2`` with ``d = θ' − θ``; the rows come from ``rows``.
    """

    def __init__(self, y: np.ndarray, rows: Any) -> None:
        self.y = y
        self.rows = rows
        self.slope = 0.0
        self.offset = 0.0

    @property
    def n_total(self) -> int:
        return self.y.shape[0]

    def set_pair(self, theta: float, proposal: float) -> None:
        self.slope = proposal - theta
        self.offset = self.slope * 0.5 * (theta + proposal)

    buffered = 0  # nothing is evaluated ahead of the test

    def draw_values(self, count: int) -> np.ndarray:
        return self.slope * self.y[self.rows.take(count)] - self.offset

    def draw(self, count: int) -> tuple[np.ndarray, float, float]:
        values = self.draw_values(count)
        mean, m2 = chunk_moments(values)
        return values, mean, m2

    def full_pass(self) -> np.ndarray:
        return self.slope * self.y - self.offset


# ------------------------------------------------------------------------- the MH tests
def _austere(rng, source, data_free):
    return austere_test(rng, source, data_free, batch_size=4, epsilon=0.05)


def _mhsublhd(rng, source, data_free):
    # At N = 40 the concentration bound with the true range C (even a quarter of it) does
    # not stop before about 97% of the rows: the test is then nearly exact and the row
    # order can hardly matter. To exercise the sequential rule, C is scaled by
    # RANGE_FRACTION = 0 (only the empirical-Bernstein variance term is left): not a valid
    # bound, but the same stopping rule on the same rows, which is all a row sampler sees.
    y = source.y
    c_range = abs(source.slope) * float(y.max() - y.min()) * RANGE_FRACTION
    return mhsublhd_test(
        rng, source, data_free, batch_size=4, delta=0.1, gamma=1.5, range_bound=c_range
    )


RANGE_FRACTION = 0.0
_CORRECTION = get_correction(1.0)


def _barker(rng, source, data_free):
    return barker_test(rng, source, data_free, batch_size=4, correction=_CORRECTION)


#: name -> (test, proposal sd in posterior sds)
TESTS: dict[str, tuple[Callable[..., Any], float]] = {
    "austere": (_austere, 2.4),
    "mhsublhd": (_mhsublhd, 2.4),
    "barker": (_barker, 2.4),
}


# -------------------------------------------------------------------------------- chains
@dataclass
class Chain:
    """Standardised draws ``(θ − posterior mean) / posterior sd`` and the rows used."""

    x: np.ndarray
    mean_batch: float
    seconds: float


def run_chain(
    test: str, sampler: str, n_steps: int, seed: int, *, y: np.ndarray | None = None,
    burn: int = 1000,
) -> Chain:
    """Random-walk MH on θ with one acceptance test and one row sampler (fixed seed)."""
    y = make_data() if y is None else y
    n_rows = y.shape[0]
    mu, sd = posterior(y)
    fn, scale = TESTS[test]
    seeds = np.random.SeedSequence([seed, list(TESTS).index(test)]).spawn(2)
    rng = np.random.default_rng(seeds[0])
    rows = SAMPLERS[sampler](n_rows, np.random.default_rng(seeds[1]))
    source = RowSource(y, rows)
    theta = mu + sd * rng.standard_normal()
    steps = np.empty(burn + n_steps)
    moves = scale * sd * rng.standard_normal(burn + n_steps)
    half_prior = 0.5 * PRIOR_PRECISION
    used = 0
    start = time.perf_counter()
    for t in range(burn + n_steps):
        proposal = theta + moves[t]
        data_free = half_prior * (theta * theta - proposal * proposal)
        source.set_pair(theta, proposal)
        rows.start_step()
        out = fn(rng, source, data_free)
        if t >= burn:
            used += out.batch_size
        if out.accepted:
            theta = proposal
        steps[t] = theta
    seconds = time.perf_counter() - start
    return Chain((steps[burn:] - mu) / sd, used / (n_steps * n_rows), seconds)


# ---------------------------------------------------------------------------- statistics
N_BATCHES = 40


def batch_means(values: np.ndarray, n_batches: int = N_BATCHES) -> tuple[float, float]:
    """Mean and its batch-means standard error."""
    size = values.shape[0] // n_batches
    means = values[: size * n_batches].reshape(n_batches, size).mean(axis=1)
    return float(values.mean()), float(means.std(ddof=1) / math.sqrt(n_batches))


def moments(chain: Chain) -> dict[str, tuple[float, float]]:
    """Stationary E[x] and E[x²] of the standardised θ, with standard errors."""
    return {"mean": batch_means(chain.x), "second": batch_means(chain.x * chain.x)}


def z_scores(a: Chain, b: Chain) -> dict[str, float]:
    """z of the difference a − b per statistic (independent chains: errors add)."""
    ma, mb = moments(a), moments(b)
    return {
        k: (ma[k][0] - mb[k][0]) / math.hypot(ma[k][1], mb[k][1]) for k in ma
    }


def z_exact(chain: Chain) -> dict[str, float]:
    """z against the exact posterior (E[x] = 0, E[x²] = 1, no Monte Carlo error)."""
    m = moments(chain)
    return {"mean": m["mean"][0] / m["mean"][1], "second": (m["second"][0] - 1) / m["second"][1]}


# ------------------------------------------------------------------------------- checks
Z_MAX = 4.0
FAST_STEPS = 25_000
SLOW_STEPS = 400_000
REF_SEED, SAMPLER_SEED = 101, 202


@pytest.fixture(scope="module")
def reference_chains() -> dict[str, Chain]:
    return {test: run_chain(test, "independent", FAST_STEPS, REF_SEED) for test in TESTS}


def _describe(chain: Chain, other: Chain) -> str:
    a, b = moments(chain), moments(other)
    return ", ".join(
        f"{k}: {a[k][0]:+.4f} ± {a[k][1]:.4f} vs {b[k][0]:+.4f} ± {b[k][1]:.4f}" for k in a
    )


@pytest.mark.parametrize("test", list(TESTS))
@pytest.mark.parametrize("sampler", ["partial", "shuffled"])
def test_sampler_matches_independent_rows(test, sampler, reference_chains):
    """Stationary mean and second moment of θ agree with independent row sampling."""
    ref = reference_chains[test]
    chain = run_chain(test, sampler, FAST_STEPS, SAMPLER_SEED)
    # The tests use a large share of the rows (this is the regime of the question).
    assert chain.mean_batch > 0.45
    z = z_scores(chain, ref)
    assert max(abs(v) for v in z.values()) <= Z_MAX, (z, _describe(chain, ref))


@pytest.mark.parametrize("test", list(TESTS))
def test_check_detects_a_broken_sampler(test, reference_chains):
    """The same check rejects a sampler that reuses one fixed window every step."""
    ref = reference_chains[test]
    chain = run_chain(test, "fixed", FAST_STEPS, SAMPLER_SEED)
    z = z_scores(chain, ref)
    # Far beyond the pass mark, so that the detection is not a matter of the seed.
    assert max(abs(v) for v in z.values()) > 1.5 * Z_MAX, (z, _describe(chain, ref))


def test_barker_with_partial_rows_is_near_exact(reference_chains):
    """Barker at temperature 1 uses most rows; its chain is close to the exact posterior.

    Not exact: at 4 × 10⁵ steps (slow run) the reference chain's E[x] and E[x²] differ
    from 0 and 1 by 4.5 and 8.3 standard errors, a bias of the test's own normal
    approximation at N = 40 of a few hundredths of a posterior sd. Hence an allowance of
    0.05 on top of 4 standard errors.
    """
    chain = run_chain("barker", "partial", FAST_STEPS, SAMPLER_SEED)
    for c in (chain, reference_chains["barker"]):
        m = moments(c)
        assert abs(m["mean"][0]) <= 0.05 + Z_MAX * m["mean"][1], m
        assert abs(m["second"][0] - 1.0) <= 0.05 + Z_MAX * m["second"][1], m


def test_independent_rows_reference_is_uniform():
    """The reference sampler and PartialShuffleRows give each row the same inclusion rate."""
    n_rows, steps, take = 10, 20_000, 3
    for cls in (IndependentRows, PartialShuffleRows):
        rows = cls(n_rows, np.random.default_rng(5))
        counts = np.zeros((take, n_rows))
        for _ in range(steps):
            rows.start_step()
            counts[np.arange(take), rows.take(take)] += 1
        # Each (position, row) cell is Binomial(steps, 1/N): z-scores of all cells.
        p = 1.0 / n_rows
        z = (counts - steps * p) / math.sqrt(steps * p * (1 - p))
        assert np.abs(z).max() < 4.5, z


@pytest.mark.slow
@pytest.mark.newest_line
@pytest.mark.parametrize("test", list(TESTS))
def test_row_windows_bias_long_runs(test, capsys):
    """Long runs: effect sizes of ShuffledRows, PartialShuffleRows and ContinuingRows.

    Only PartialShuffleRows is asserted; the others are measured and printed (run with
    ``-s``). See the report in the commit message for the numbers of one run.
    """
    ref = run_chain(test, "independent", SLOW_STEPS, REF_SEED + 1)
    lines = [f"{test}: reference share {ref.mean_batch:.3f}, exact z {z_exact(ref)}"]
    failures = {}
    for k, sampler in enumerate(["shuffled", "partial", "continuing"]):
        chain = run_chain(test, sampler, SLOW_STEPS, SAMPLER_SEED + 1 + k)
        a, b = moments(chain), moments(ref)
        z = z_scores(chain, ref)
        for stat in a:
            diff = a[stat][0] - b[stat][0]
            se = math.hypot(a[stat][1], b[stat][1])
            lines.append(
                f"  {sampler:10s} {stat:6s} diff {diff:+.5f} ± {se:.5f} (z {z[stat]:+.2f})"
            )
        if sampler == "partial":
            failures[sampler] = max(abs(v) for v in z.values())
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    assert all(v <= Z_MAX for v in failures.values()), failures
