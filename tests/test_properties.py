"""Property-based tests (hypothesis) of the core minibatch Barker test and its row sampler.

Over random populations of l_i (sizes 2..2000; normal, heavy-tailed, skewed, two-point
and constant values, with large offsets), batch sizes, data-free parts, σ in the shipped
set, tolerance and early-decision settings, over several consecutive steps on one source:

- a step never reads a row past N nor the same row twice (rows recorded at the sampler);
- the minibatch grows by ``batch_size`` rows per round, the last round only being smaller
  to reach N, and ``batch_size`` (the stat) equals the rows drawn;
- the test stops only for a reason it reports (s² < σ², tolerance met, early decision,
  or all rows used);
- with all rows, Δ* is N·mean + c, s² = 0, and the decision is the exact Barker decision
  ``Δ + X_log > 0`` with the logistic draw reproduced from the same generator state;
- the same seeds give identical results.

Runs are reproducible (``derandomize=True``) and bounded (a few seconds each).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pymc_minibatch_mh.core.barker import barker_test
from pymc_minibatch_mh.core.correction import get_correction
from pymc_minibatch_mh.core.rows import PartialShuffleRows
from pymc_minibatch_mh.core.source import ArraySource

SHIPPED_SIGMAS = (0.8, 0.9, 1.0, 1.1, 1.2, 1.5)
SETTINGS = dict(
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


class RecordingRows(PartialShuffleRows):
    """A PartialShuffleRows that records, per step, every row it hands out (copies)."""

    def __init__(self, n_rows, rng):
        super().__init__(n_rows, rng)
        self.steps: list[list[np.ndarray]] = []

    def start_step(self):
        super().start_step()
        self.steps.append([])

    def take(self, count):
        rows = super().take(count)
        self.steps[-1].append(np.array(rows, copy=True))
        return rows

    def give_back(self, count):  # pragma: no cover - the core test never gives back
        super().give_back(count)
        taken = np.concatenate(self.steps[-1])[: self.used]
        self.steps[-1] = [taken]


class RecordingSource(ArraySource):
    """An ArraySource that records the sizes of the draws of each step."""

    def __init__(self, values, rows):
        super().__init__(values, rows=rows)
        self.draws: list[list[int]] = []

    def start_step(self):
        super().start_step()
        self.draws.append([])

    def draw_values(self, count):
        self.draws[-1].append(count)
        return super().draw_values(count)


# ---------------------------------------------------------------- strategies
@st.composite
def populations(draw):
    n = draw(st.integers(2, 2000))
    kind = draw(st.sampled_from(["normal", "constant", "heavy", "skewed", "two-point", "tiny"]))
    scale = draw(st.sampled_from([1e-6, 1e-4, 1e-3, 1e-2, 0.1, 1.0]))
    offset = draw(st.sampled_from([0.0, 0.0, 1e-3, -0.5, 3.0, 1e4, -1e6]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if kind == "normal":
        values = rng.normal(0.0, scale, size=n)
    elif kind == "constant":
        values = np.zeros(n)
    elif kind == "heavy":
        values = scale * rng.standard_t(2.5, size=n)
    elif kind == "skewed":
        values = scale * (rng.exponential(size=n) - 1.0)
    elif kind == "two-point":
        values = np.where(rng.random(n) < 0.01, scale * 50.0, 0.0)
    else:  # a few rows far out, the rest nearly constant
        values = rng.normal(0.0, 1e-9, size=n)
        values[rng.integers(n, size=3)] += scale
    # Offsets are per row, scaled so that N·offset spans "decided at once" to "huge".
    return values + offset / n if abs(offset) < 1e3 else values + offset


@st.composite
def barker_cases(draw):
    values = draw(populations())
    n = values.size
    batch_size = draw(st.one_of(st.integers(1, min(n, 8)), st.integers(1, n)))
    data_free = draw(
        st.one_of(
            st.floats(-20.0, 20.0, allow_nan=False),
            st.sampled_from([0.0, -math.inf, 1e3, -1e3]),
        )
    )
    sigma = draw(st.sampled_from(SHIPPED_SIGMAS))
    tolerance = draw(st.sampled_from([None, None, 0.9, 0.5]))
    early = draw(st.sampled_from([None, None, 5.0, 2.0]))
    steps = draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**32 - 1))
    return dict(
        values=values, batch_size=batch_size, data_free=data_free, sigma=sigma,
        tolerance=tolerance, early=early, steps=steps, seed=seed,
    )


# ------------------------------------------------------------------- helpers
def run_steps(case):
    """Run ``case["steps"]`` consecutive tests on one source; return what was recorded."""
    rows_rng, test_rng = np.random.default_rng(case["seed"]).spawn(2)
    rows = RecordingRows(case["values"].size, rows_rng)
    source = RecordingSource(case["values"], rows)
    correction = get_correction(case["sigma"])
    results = []
    for _ in range(case["steps"]):
        source.start_step()
        state = test_rng.bit_generator.state
        drawn_before = source.rows_drawn
        outcome = barker_test(
            test_rng, source, case["data_free"], batch_size=case["batch_size"],
            correction=correction, tolerance=case["tolerance"],
            early_decision=case["early"],
        )
        results.append((outcome, state, source.rows_drawn - drawn_before))
    return results, rows, source, correction


def reproduce_decision(outcome, state, sigma, correction):
    """The decision the test must make given Δ* and s², from the same generator state."""
    rng = np.random.default_rng()
    rng.bit_generator.state = state
    if outcome.full_data or outcome.variance >= sigma * sigma:
        return outcome.delta_star + rng.logistic() > 0.0
    x_nc = rng.normal(0.0, math.sqrt(sigma * sigma - outcome.variance))
    return outcome.delta_star + x_nc + correction.sample(rng) > 0.0


# --------------------------------------------------------------------- tests
@settings(max_examples=250, **SETTINGS)
@given(barker_cases())
def test_barker_test_properties(case):
    values, b, c = case["values"], case["batch_size"], case["data_free"]
    n = values.size
    sigma2 = case["sigma"] ** 2
    results, rows, source, correction = run_steps(case)
    for (outcome, state, drawn), step_rows, sizes in zip(
        results, rows.steps, source.draws, strict=True
    ):
        drawn_rows = np.concatenate(step_rows) if step_rows else np.empty(0, dtype=np.int64)
        # Rows: within [0, N), never twice in a step; the test used the first ones drawn.
        assert drawn_rows.size == drawn == sum(sizes) >= outcome.batch_size
        assert drawn_rows.size <= n
        assert np.unique(drawn_rows).size == drawn_rows.size
        assert drawn_rows.size == 0 or (drawn_rows.min() >= 0 and drawn_rows.max() < n)
        taken = drawn_rows[: outcome.batch_size]
        if c == -math.inf:
            # Outside the prior's support: rejected without touching the data.
            assert not outcome.accepted and outcome.batch_size == 0 and not outcome.nonfinite
            assert drawn == 0
            continue
        # Growth: batch_size per round; only the last round may be smaller, to reach N.
        assert outcome.batch_size == min(outcome.rounds * b, n)
        # Draws are whole rounds (or reach N), so no drawn row is left between rounds.
        assert all(size % b == 0 or start + size == n
                   for start, size in zip(np.cumsum([0, *sizes[:-1]]), sizes, strict=True))
        assert outcome.full_data == (outcome.batch_size == n)
        assert not outcome.nonfinite
        # The test stopped for a reason it reports.
        event(
            "full data" if outcome.full_data else "early" if outcome.early else "s² < σ²"
        )
        event(f"rounds {'1' if outcome.rounds == 1 else '2-9' if outcome.rounds < 10 else '10+'}")
        if outcome.full_data:
            np.testing.assert_array_equal(np.sort(taken), np.arange(n))
            assert outcome.variance == 0.0 and outcome.epsilon == 0.0
            exact = math.fsum(values) + c
            assert outcome.delta_star == pytest.approx(exact, rel=1e-11, abs=1e-9)
        elif outcome.early:
            assert abs(outcome.delta_star) >= case["early"] * math.sqrt(outcome.variance)
        else:
            assert outcome.variance < sigma2
            if case["tolerance"] is not None:
                assert outcome.epsilon <= case["tolerance"]
        # Δ* = N · (mean of the rows used) + c.
        mean = values[taken].mean()
        assert outcome.delta_star == pytest.approx(n * mean + c, rel=1e-9, abs=1e-9)
        # The decision, reproduced from the same generator state (exact Barker at full data).
        assert outcome.accepted == reproduce_decision(outcome, state, case["sigma"], correction)
    # Identical results for the same seeds.
    again, rows_again, _, _ = run_steps(case)
    assert [r[0] for r in again] == [r[0] for r in results]
    for first, second in zip(rows.steps, rows_again.steps, strict=True):
        assert all(np.array_equal(a, b) for a, b in zip(first, second, strict=True))


@settings(max_examples=80, **SETTINGS)
@given(
    values=populations(),
    data_free=st.floats(-30.0, 30.0, allow_nan=False),
    sigma=st.sampled_from(SHIPPED_SIGMAS),
    seed=st.integers(0, 2**32 - 1),
)
def test_full_data_is_the_exact_barker_decision(values, data_free, sigma, seed):
    """batch_size = N: one round, Δ* = Δ exactly summed, and accept iff Δ + X_log > 0."""
    n = values.size
    rng = np.random.default_rng(seed)
    source = ArraySource(values, rng=np.random.default_rng(seed + 1))
    source.start_step()
    state = rng.bit_generator.state
    outcome = barker_test(rng, source, data_free, batch_size=n, correction=get_correction(sigma))
    assert outcome.full_data and outcome.rounds == 1 and outcome.batch_size == n
    assert outcome.variance == 0.0 and outcome.epsilon == 0.0 and outcome.edgeworth == 0.0
    delta = math.fsum(values) + data_free
    assert outcome.delta_star == pytest.approx(delta, rel=1e-11, abs=1e-9)
    replay = np.random.default_rng()
    replay.bit_generator.state = state
    assert outcome.accepted == (outcome.delta_star + replay.logistic() > 0.0)


# ------------------------------------------------------------ ShuffledRows
@st.composite
def row_programs(draw):
    n = draw(st.integers(1, 300))
    ops = draw(
        st.lists(
            st.tuples(
                st.sampled_from(["start", "take", "take", "take", "give_back"]),
                st.integers(0, n + 2),
            ),
            min_size=1,
            max_size=60,
        )
    )
    return n, ops, draw(st.integers(0, 2**32 - 1))


@settings(max_examples=300, **SETTINGS)
@given(row_programs())
def test_partial_shuffle_rows_take_and_give_back(program):
    """A step never sees a row twice; given-back rows come first in the next take; the
    sampler refuses to hand out more than N rows in a step or to take back more than it
    gave; and the same seed gives the same rows."""

    def run():
        n, ops, seed = program
        rows = PartialShuffleRows(n, np.random.default_rng(seed))
        rows.start_step()
        held: list[int] = []  # rows of the current step, in order, net of give-backs
        returned: list[int] = []  # the rows most recently given back, in order
        log = []
        for op, k in ops:
            if op == "start":
                rows.start_step()
                held, returned = [], []
            elif op == "take":
                if len(held) + k > n:
                    with pytest.raises(ValueError, match="cannot take"):
                        rows.take(k)
                    continue
                got = np.array(rows.take(k), copy=True).tolist()
                assert len(got) == k and all(0 <= r < n for r in got)
                head = min(k, len(returned))
                assert got[:head] == returned[:head]
                returned = returned[head:]
                held += got
                assert len(set(held)) == len(held)
                log.append(got)
            else:
                if k > len(held):
                    with pytest.raises(ValueError, match="cannot give back"):
                        rows.give_back(k)
                    continue
                rows.give_back(k)
                returned = held[len(held) - k :] + returned if k else returned
                held = held[: len(held) - k]
            assert rows.used_in_step == len(held)
        return log

    assert run() == run()


@settings(max_examples=100, **SETTINGS)
@given(
    n=st.integers(1, 500),
    sizes=st.lists(st.integers(1, 500), min_size=1, max_size=40),
    seed=st.integers(0, 2**32 - 1),
)
def test_partial_shuffle_rows_full_steps(n, sizes, seed):
    """Over many steps, each step's rows are distinct and a step of N rows is a
    permutation of all rows."""
    rows = PartialShuffleRows(n, np.random.default_rng(seed))
    for size in sizes:
        size = min(size, n)
        rows.start_step()
        first = np.array(rows.take(size // 2), copy=True)
        second = np.array(rows.take(size - size // 2), copy=True)
        got = np.concatenate([first, second])
        assert got.size == size and np.unique(got).size == size
        assert got.min() >= 0 and got.max() < n
        if size == n:
            np.testing.assert_array_equal(np.sort(got), np.arange(n))
        with pytest.raises(ValueError):
            rows.take(n - size + 1)
    # Whatever the steps before, a new step can draw every row once.
    rows.start_step()
    np.testing.assert_array_equal(np.sort(rows.take(n)), np.arange(n))
