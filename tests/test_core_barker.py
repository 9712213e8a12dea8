"""Unit and statistical tests of the minibatch Barker test in the core (no PyMC)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special, stats

from pymc_minibatch_mh.core import (
    ArraySource,
    PartialShuffleRows,
    RunningMoments,
    barker_probability,
    barker_test,
    clt_error_bound,
)
from pymc_minibatch_mh.core.correction import get_correction
from pymc_minibatch_mh.core.moments import EDGEWORTH_SUP, chunk_moments


def gaussian_population(n: int, delta: float, s2: float, b: int, data_free: float, rng):
    """l_i ~ Gaussian with N·mean(l) + c = delta exactly and Var(Δ*) = s2 at batch size b."""
    fpc = 1 - (b - 1) / (n - 1)
    tau = math.sqrt(s2 * b / (n * n * fpc))
    values = rng.normal(size=n)
    values = (values - values.mean()) / values.std(ddof=1) * tau
    values += (delta - data_free) / n
    return values


class _WrongCorrection:
    """A correction with the right σ but no correction at all (X_corr = 0)."""

    sigma = 1.0
    error = 0.0

    def sample(self, rng):
        return 0.0


def acceptance_rate(values, data_free, batch_size, correction, reps, seed, **kwargs):
    rng = np.random.default_rng(seed)
    source = ArraySource(values, rng=rng)
    accepted = 0
    sizes = []
    for _ in range(reps):
        source.start_step()
        out = barker_test(
            rng, source, data_free, batch_size=batch_size, correction=correction, **kwargs
        )
        accepted += out.accepted
        sizes.append(out.batch_size)
    return accepted / reps, np.asarray(sizes)


# ---------------------------------------------------------------- building blocks
def test_running_moments_match_numpy():
    rng = np.random.default_rng(0)
    chunks = [rng.normal(1e6, 1.0, size=k) for k in (5, 17, 1, 40)]
    m = RunningMoments()
    for c in chunks:
        m.add(c, *chunk_moments(c))
    allv = np.concatenate(chunks)
    assert m.count == allv.size
    assert m.mean == pytest.approx(allv.mean(), rel=1e-14)
    assert m.sample_variance() == pytest.approx(allv.var(ddof=1), rel=1e-9)
    np.testing.assert_array_equal(m.values(), allv)
    n_total = 1000
    expected = allv.var(ddof=1) / allv.size * (1 - (allv.size - 1) / (n_total - 1))
    assert m.mean_variance(n_total) == pytest.approx(expected, rel=1e-9)
    assert m.mean_variance(allv.size) == 0.0


def test_clt_error_bound_values():
    values = np.array([-1.0, 1.0, -1.0, 1.0])
    eps, edge = clt_error_bound(values, 0.0)
    # z = ±1: mean|z|^3 = mean|z| = 1, skew 0.
    assert eps == pytest.approx((6.4 + 2.0) / 2.0)
    assert edge == 0.0
    skewed = np.array([0.0, 0.0, 0.0, 4.0])
    z = (skewed - 1.0) / math.sqrt(3.0)
    eps, edge = clt_error_bound(skewed, 1.0)
    assert eps == pytest.approx((6.4 * np.mean(np.abs(z) ** 3) + 2 * np.mean(np.abs(z))) / 2)
    assert edge == pytest.approx(abs(np.mean(z**3)) * EDGEWORTH_SUP / 12.0)
    assert clt_error_bound(np.full(10, 3.0), 3.0) == (0.0, 0.0)
    # Scale-free.
    rng = np.random.default_rng(1)
    v = rng.gamma(2.0, size=300)
    w = 1e-5 * v + 7
    assert clt_error_bound(w, w.mean())[0] == pytest.approx(
        clt_error_bound(v, v.mean())[0], rel=1e-9
    )
    # Never below 6.4 / sqrt(b) for non-degenerate values.
    assert clt_error_bound(v, v.mean())[0] >= 6.4 / math.sqrt(v.size)


def test_edgeworth_constant():
    x = np.linspace(-5, 5, 200001)
    assert EDGEWORTH_SUP == pytest.approx(np.max((2 * x**2 + 1) * stats.norm.pdf(x)), rel=1e-9)


def test_partial_shuffle_rows_no_repeat_within_step_and_wraps():
    rng = np.random.default_rng(2)
    rows = PartialShuffleRows(97, rng)
    for step in range(300):
        rows.start_step()
        taken = []
        for _ in range(int(rng.integers(1, 6))):
            k = min(int(rng.integers(1, 40)), 97 - rows.used_in_step)
            if k == 0:
                break
            taken.append(rows.take(k).copy())
        taken = np.concatenate(taken)
        assert len(set(taken.tolist())) == taken.size, f"row repeated in step {step}"
        assert taken.min() >= 0 and taken.max() < 97
    # A whole-data step draws every row exactly once.
    rows.start_step()
    allrows = np.concatenate([rows.take(50).copy(), rows.take(47).copy()])
    assert sorted(allrows.tolist()) == list(range(97))
    with pytest.raises(ValueError, match="already used"):
        rows.take(1)
    rows.give_back(47)
    np.testing.assert_array_equal(rows.take(47), allrows[50:])


def test_partial_shuffle_rows_marginally_uniform_and_independent_of_previous_use():
    """Every row is equally likely in a step, whatever the previous steps consumed."""
    n, reps = 40, 40_000
    rows = PartialShuffleRows(n, np.random.default_rng(3))
    counts = np.zeros(n)
    for _ in range(reps):
        rows.start_step()
        first = rows.take(5)
        counts[first] += 1
        if first[0] < 10:  # a data-dependent stop: grow only for some rows
            rows.take(20)
    assert stats.chisquare(counts).pvalue > 1e-3


def test_partial_shuffle_rows_sparse_and_dense_steps_alternate():
    """Rejection draws (below a quarter of N) and Fisher–Yates draws (past it), mixed.

    Steps of a few rows (rejection), steps that grow past N/4 within the step (the switch
    to the dense list, with the previous step's rows still to be forgotten), and whole-data
    steps, in a random sequence: every step's rows are distinct, and over the sparse steps
    every row is equally likely, and consecutive steps share rows as often as independent
    samples do (b₁b₂/N rows on average; a row of the previous step left in the set would
    make the overlap 0).
    """
    n = 1000
    rng = np.random.default_rng(8)
    rows = PartialShuffleRows(n, np.random.default_rng(9))
    counts = np.zeros(n)
    overlap = expected = variance = 0.0
    previous = np.empty(0, dtype=np.int64)
    for _ in range(6000):
        rows.start_step()
        kind = rng.integers(0, 10)
        sizes = [n] if kind == 0 else [100, 300] if kind == 1 else [int(rng.integers(1, 60))]
        taken = np.concatenate([rows.take(k).copy() for k in sizes])
        assert np.unique(taken).size == taken.size == sum(sizes)
        assert 0 <= taken.min() and taken.max() < n
        if kind > 1:
            counts[taken] += 1
            # Hypergeometric overlap with the previous step's rows.
            k1, k2 = previous.size, taken.size
            overlap += np.intersect1d(previous, taken).size
            expected += k1 * k2 / n
            variance += k1 * k2 / n * (1 - k1 / n) * (n - k2) / (n - 1)
        previous = taken
    assert stats.chisquare(counts).pvalue > 1e-3
    assert abs(overlap - expected) < 4 * math.sqrt(variance), (overlap, expected)


def test_partial_shuffle_rows_reproducible():
    a = PartialShuffleRows(1000, np.random.default_rng(4))
    b = PartialShuffleRows(1000, np.random.default_rng(4))
    for _ in range(300):
        a.start_step()
        b.start_step()
        np.testing.assert_array_equal(a.take(7), b.take(7))


def test_barker_probability():
    for d in (-800.0, -3.0, 0.0, 2.5, 800.0):
        assert barker_probability(d) == pytest.approx(float(special.expit(d)), rel=1e-14)


# ------------------------------------------------------------------ the test
def test_full_data_is_exact_barker_decision():
    """With batch_size = N the test uses every row, s² = 0, and accepts w.p. g(Δ)."""
    rng = np.random.default_rng(5)
    n = 40
    correction = get_correction(1.0)
    for delta in (-2.0, 0.3, 1.5):
        values = rng.normal(size=n)
        values += (delta - 0.2 - values.sum()) / n
        reps = 20000
        rate, sizes = acceptance_rate(values, 0.2, n, correction, reps, seed=6)
        assert np.all(sizes == n)
        p = barker_probability(delta)
        assert abs(rate - p) < 4 * math.sqrt(p * (1 - p) / reps)
    source = ArraySource(values, rng=rng)
    source.start_step()
    out = barker_test(rng, source, 0.2, batch_size=n, correction=correction)
    assert out.full_data and out.variance == 0.0 and out.epsilon == 0.0
    assert out.delta_star == pytest.approx(values.sum() + 0.2)


def test_growth_reaches_full_data_when_variance_too_large():
    rng = np.random.default_rng(7)
    values = rng.normal(0, 1.0, size=300)  # s² with b = 10: 300² / 10 ≫ 1
    source = ArraySource(values, rng=rng)
    source.start_step()
    out = barker_test(rng, source, 0.0, batch_size=10, correction=get_correction(1.0))
    assert out.full_data and out.batch_size == 300 and out.rounds == 30
    assert source.rows_drawn == 300


@pytest.mark.parametrize("s2", [0.05, 0.5, 0.9])
def test_acceptance_frequency_matches_barker_probability(s2):
    """Gaussian l_i: P(accept) = g(Δ) within binomial error, over a grid of Δ."""
    n, b, c = 100_000, 400, -0.7
    correction = get_correction(1.0)
    reps = 12_000
    for i, delta in enumerate((-3.0, -1.0, 0.0, 0.8, 2.5)):
        values = gaussian_population(n, delta, s2, b, c, np.random.default_rng(10 + i))
        rate, sizes = acceptance_rate(values, c, b, correction, reps, seed=100 + i)
        p = barker_probability(delta)
        tol = 4 * math.sqrt(p * (1 - p) / reps) + correction.error + 2e-3
        assert abs(rate - p) < tol, (delta, s2, rate, p)
        # The first batch satisfies s² < σ² unless the estimate of s² exceeds 1:
        # P(0.9 · χ²_399 / 399 > 1) ≈ 6% at s² = 0.9, ≈ 0 at the other values.
        assert np.mean(sizes == b) > 0.9


def test_acceptance_frequency_check_can_fail():
    """The same comparison detects a test without the correction variable."""
    n, b, c, s2 = 100_000, 400, 0.0, 0.5
    reps = 12_000
    delta = 2.5
    values = gaussian_population(n, delta, s2, b, c, np.random.default_rng(20))
    rate, _ = acceptance_rate(values, c, b, _WrongCorrection(), reps, seed=21)
    p = barker_probability(delta)
    assert abs(rate - p) > 4 * math.sqrt(p * (1 - p) / reps) + 2e-3


def test_decision_noise_is_logistic():
    """Δ* + X_nc + X_corr − Δ is standard logistic when l_i are Gaussian (KS test)."""
    # With Δ = 0 and Gaussian l_i, P(Δ* + X_nc + X_corr > t) = 1 - S(t) for every t.
    # Estimate the law of the noise via many thresholds: shift the data-free part.
    rng = np.random.default_rng(30)
    correction = get_correction(1.0)
    n, b, s2 = 50_000, 250, 0.6
    values = gaussian_population(n, 0.0, s2, b, 0.0, rng)
    source = ArraySource(values, rng=rng)
    noise = np.empty(40_000)
    for k in range(noise.size):
        source.start_step()
        chunk, mean, m2 = source.draw(b)
        var = n * n * (m2 / (b - 1)) / b * (1 - (b - 1) / (n - 1))
        noise[k] = n * mean + rng.normal(0, math.sqrt(1 - var)) + correction.sample(rng)
    assert stats.kstest(noise, stats.logistic.cdf).pvalue > 0.01
    assert stats.kstest(noise, stats.norm(scale=1.7).cdf).pvalue < 0.01


def test_nonfinite_and_minus_inf():
    rng = np.random.default_rng(40)
    correction = get_correction(1.0)
    values = np.zeros(100)
    values[:] = np.nan
    src = ArraySource(values, rng=rng)
    src.start_step()
    out = barker_test(rng, src, 0.0, batch_size=10, correction=correction)
    assert not out.accepted and out.nonfinite
    values[:] = -np.inf
    src = ArraySource(values, rng=rng)
    src.start_step()
    out = barker_test(rng, src, 0.0, batch_size=10, correction=correction)
    assert not out.accepted and not out.nonfinite and out.batch_size == 10
    src.start_step()
    out = barker_test(rng, src, -np.inf, batch_size=10, correction=correction)
    assert not out.accepted and not out.nonfinite and out.batch_size == 0
    out = barker_test(rng, src, np.nan, batch_size=10, correction=correction)
    assert not out.accepted and out.nonfinite


def test_tolerance_grows_batch_until_epsilon_met():
    rng = np.random.default_rng(50)
    values = rng.normal(0, 1e-6, size=200_000)
    src = ArraySource(values, rng=rng)
    src.start_step()
    out = barker_test(rng, src, 0.0, batch_size=100, correction=get_correction(1.0))
    assert out.batch_size == 100 and out.epsilon > 0.5
    src.start_step()
    out = barker_test(
        rng, src, 0.0, batch_size=100, correction=get_correction(1.0), tolerance=0.1
    )
    assert out.epsilon <= 0.1
    assert out.batch_size >= (6.4 / 0.1) ** 2


def test_early_decision_stops_growth():
    rng = np.random.default_rng(60)
    n = 100_000
    values = rng.normal(1e-3, 1e-3, size=n)  # Δ ≈ 100, s² ≈ 1e4 * 0.01/b
    src = ArraySource(values, rng=rng)
    src.start_step()
    out = barker_test(rng, src, 0.0, batch_size=50, correction=get_correction(1.0))
    assert out.batch_size > 50 and not out.early
    src.start_step()
    out = barker_test(
        rng, src, 0.0, batch_size=50, correction=get_correction(1.0), early_decision=5.0
    )
    assert out.early and out.batch_size == 50 and out.accepted


def test_same_seed_same_decisions():
    values = gaussian_population(10_000, 0.3, 0.5, 100, 0.0, np.random.default_rng(70))
    runs = []
    for _ in range(2):
        rng = np.random.default_rng(71)
        src = ArraySource(values, rng=rng)
        outs = []
        for _ in range(200):
            src.start_step()
            outs.append(barker_test(rng, src, 0.0, batch_size=50, correction=get_correction(1.0)))
        runs.append(outs)
    assert runs[0] == runs[1]
