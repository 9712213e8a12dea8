"""Tests of the correction distribution C_σ (pymc_minibatch_mh.core.correction)."""

from __future__ import annotations

import dataclasses
import functools
import math
import time

import numpy as np
import pytest
from scipy import stats
from scipy.special import expit, ndtr

from pymc_minibatch_mh.core.correction import (
    LOGISTIC_SD,
    CorrectionDistribution,
    get_correction,
    ridge_correction,
    shipped_sigmas,
)

REQUIRED_SIGMAS = (0.8, 0.9, 1.0, 1.2, 1.5)
# An evaluation grid independent of the default one ([-40, 40], step 0.002): wider, with an
# incommensurate step, so it shares (almost) no points with it.
INDEPENDENT_GRID = np.linspace(-45.0, 45.0, 52_001)  # step ~0.00173


@functools.cache
def _paper_ridge(sigma: float, lam: float) -> tuple[np.ndarray, np.ndarray, float]:
    return ridge_correction(sigma, n=2000, V=20.0, lam=lam)


def _independent_error(dist: CorrectionDistribution, x: np.ndarray) -> float:
    """Sup |F - S| recomputed from scratch (lower tails for x < 0, upper tails for x >= 0)."""
    y, w, s = dist.support, dist.weights, dist.sigma
    neg, pos = x[x < 0], x[x >= 0]
    e_neg = ndtr((neg[:, None] - y[None, :]) / s) @ w - expit(neg)
    e_pos = ndtr((y[None, :] - pos[:, None]) / s) @ w - expit(-pos)
    return float(max(np.abs(e_neg).max(), np.abs(e_pos).max()))


# --------------------------------------------------------------------------------------
# the paper's procedure (Table 3)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("sigma", "lam", "paper"), [(1.0, 10.0, 1.3e-3), (0.8, 1.0, 6.7e-5)])
def test_paper_ridge_reproduces_table3(sigma: float, lam: float, paper: float) -> None:
    support, u, err = _paper_ridge(sigma, lam)
    assert support.shape == u.shape == (4001,)
    assert np.all(u >= 0)
    assert abs(err - paper) <= 0.10 * paper, err


def test_paper_ridge_fast_path_matches_dense_formulation() -> None:
    for sigma, n, V, lam, clip in [(1.0, 40, 20.0, 10.0, True), (0.7, 25, 4.0, 0.1, False)]:
        support, u, err = ridge_correction(sigma, n=n, V=V, lam=lam, clip=clip)
        h = V / n
        i = np.arange(-2 * n, 2 * n + 1)
        j = np.arange(-n, n + 1)
        m = ndtr((i[:, None] - j[None, :]) * h / sigma)
        v = expit(i * h)
        u_dense = np.linalg.solve(m.T @ m + lam * np.eye(2 * n + 1), m.T @ v)
        if clip:
            u_dense = np.clip(u_dense, 0.0, None)
        np.testing.assert_allclose(support, j * h, rtol=0, atol=1e-12)
        np.testing.assert_allclose(u, u_dense, rtol=1e-7, atol=1e-10)
        assert err == pytest.approx(np.abs(m @ u_dense - v).max(), rel=1e-6)
        if not clip:
            assert np.any(u < 0)  # the raw ridge solution is not a distribution


def test_ridge_clip_build_is_normalised_and_far_worse_than_lp() -> None:
    dist = CorrectionDistribution.build(1.0, method="ridge-clip", n=150, V=20.0, lam=10.0)
    assert dist.method == "ridge-clip"
    assert math.fsum(dist.weights) == pytest.approx(1.0, abs=1e-12)
    assert np.all(dist.weights > 0)
    assert dist.error == pytest.approx(dist.cdf_error(), rel=1e-12)
    assert dist.info["paper_error"] > 1e-4
    assert dist.error > 100 * get_correction(1.0).error


# --------------------------------------------------------------------------------------
# shipped tables
# --------------------------------------------------------------------------------------


def test_required_tables_are_shipped() -> None:
    shipped = shipped_sigmas()
    assert shipped == tuple(sorted(shipped))
    for sigma in REQUIRED_SIGMAS:
        assert any(abs(s - sigma) < 1e-12 for s in shipped), (sigma, shipped)


@pytest.mark.parametrize("sigma", shipped_sigmas())
def test_shipped_table_is_a_valid_symmetric_distribution(sigma: float) -> None:
    dist = get_correction(sigma)
    assert dist.sigma == sigma
    assert dist.method == "lp"
    assert dist.support.dtype == dist.weights.dtype == np.float64
    assert np.all(np.diff(dist.support) > 0)
    assert np.all(dist.weights >= 0)
    assert abs(math.fsum(dist.weights) - 1.0) <= 1e-12
    np.testing.assert_array_equal(dist.support, -dist.support[::-1])
    np.testing.assert_array_equal(dist.weights, dist.weights[::-1])
    # X_norm + X_corr has the logistic variance pi^2/3 up to the table's accuracy
    var_corr = float(dist.weights @ dist.support**2)
    assert var_corr + sigma**2 == pytest.approx(LOGISTIC_SD**2, rel=1e-2)


@pytest.mark.parametrize("sigma", shipped_sigmas())
def test_shipped_table_error_reverified_on_independent_grid(sigma: float) -> None:
    dist = get_correction(sigma)
    independent = _independent_error(dist, INDEPENDENT_GRID)
    assert independent <= 1.05 * dist.error
    assert independent >= dist.error / 1.05  # and the stored error is not overstated
    assert dist.cdf_error() == pytest.approx(dist.error, rel=1e-9)
    # far beyond the grid both tails are negligible against the stored error
    assert abs(dist.sf(np.array([45.0]))[0] - expit(-45.0)) < 1e-18


def test_shipped_table_files() -> None:
    from pymc_minibatch_mh.core.correction import table_path

    for sigma in shipped_sigmas():
        path = table_path(sigma)
        assert path.stat().st_size < 200 * 1024
        with np.load(path, allow_pickle=False) as data:
            assert {"sigma", "support", "weights", "error", "method", "info"} <= set(data.files)
            assert str(data["method"]) == "lp"
            assert float(data["error"]) > 0


def test_sigma_one_error_requirement() -> None:
    dist = get_correction(1.0)
    assert dist.error <= 1e-6
    assert dist.error < 8.9e-4 / 1000  # three orders of magnitude below the paper's Table 3
    assert _independent_error(dist, INDEPENDENT_GRID) <= 1e-6


def test_errors_increase_with_sigma() -> None:
    errors = [get_correction(s).error for s in REQUIRED_SIGMAS[1:]]
    assert errors == sorted(errors)


# --------------------------------------------------------------------------------------
# the distribution of X_norm + X_corr
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("sigma", [0.8, 1.0, 1.5])
def test_sum_is_logistic_ks(sigma: float) -> None:
    dist = get_correction(sigma)
    rng = np.random.default_rng(20170811)
    n = 200_000
    x = rng.normal(0.0, sigma, n) + dist.sample_many(rng, n)
    assert stats.kstest(x, stats.logistic.cdf).pvalue > 0.01


def test_sum_is_logistic_ks_with_scalar_sampler() -> None:
    dist = get_correction(1.0)
    rng = np.random.default_rng(7)
    n = 100_000
    corr = np.array([dist.sample(rng) for _ in range(n)])
    x = rng.normal(0.0, 1.0, n) + corr
    assert stats.kstest(x, stats.logistic.cdf).pvalue > 0.01


def test_ks_detects_wrong_distributions() -> None:
    rng = np.random.default_rng(20170811)
    n = 200_000
    # the best single normal (sd 1.7) is within 1% of the logistic CDF, yet detected
    normal_only = rng.normal(0.0, 1.7, n)
    assert stats.kstest(normal_only, stats.logistic.cdf).pvalue < 1e-6
    # the sigma = 1 correction paired with a normal part of the wrong sd
    mismatched = rng.normal(0.0, 0.8, n) + get_correction(1.0).sample_many(rng, n)
    assert stats.kstest(mismatched, stats.logistic.cdf).pvalue < 1e-6


def test_cdf_properties() -> None:
    dist = get_correction(1.0)
    x = np.linspace(-30, 30, 6001)
    f = dist.cdf(x)
    assert np.all(np.diff(f) >= 0)
    assert dist.cdf(np.array([0.0]))[0] == pytest.approx(0.5, abs=1e-15)
    np.testing.assert_allclose(f + dist.sf(x), 1.0, rtol=0, atol=1e-15)
    assert np.max(np.abs(f - expit(x))) <= dist.error * 1.05
    assert dist.cdf(np.zeros((2, 3))).shape == (2, 3)


# --------------------------------------------------------------------------------------
# sampling
# --------------------------------------------------------------------------------------


def test_sample_is_reproducible_and_consumes_one_uniform() -> None:
    dist = get_correction(1.0)
    a = [dist.sample(np.random.default_rng(123)) for _ in range(3)]
    assert a[0] == a[1] == a[2]
    r1, r2 = np.random.default_rng(99), np.random.default_rng(99)
    draws1 = [dist.sample(r1) for _ in range(500)]
    draws2 = [dist.sample(r2) for _ in range(500)]
    assert draws1 == draws2
    assert all(isinstance(d, float) for d in draws1)
    assert set(draws1) <= set(dist.support.tolist())
    # exactly one rng.random() per draw
    r3, r4 = np.random.default_rng(5), np.random.default_rng(5)
    for _ in range(10):
        dist.sample(r3)
        r4.random()
    assert r3.random() == r4.random()


def test_sample_many_agrees_with_sample() -> None:
    dist = get_correction(1.0)
    r1, r2 = np.random.default_rng(11), np.random.default_rng(11)
    loop = np.array([dist.sample(r1) for _ in range(2000)])
    many = dist.sample_many(r2, 2000)
    assert many.shape == (2000,) and many.dtype == np.float64
    np.testing.assert_array_equal(loop, many)  # same uniforms, same inverse-CDF lookup
    # and in distribution: two independent large samples agree (two-sample KS)
    a = dist.sample_many(np.random.default_rng(1), 50_000)
    b = np.array([dist.sample(r1) for _ in range(50_000)])
    assert stats.ks_2samp(a, b).pvalue > 0.01
    assert np.mean(a) == pytest.approx(0.0, abs=0.03)


def test_sample_matches_weights() -> None:
    dist = get_correction(1.2)
    draws = dist.sample_many(np.random.default_rng(3), 400_000)
    counts = np.array([(draws == y).sum() for y in dist.support])
    assert counts.sum() == draws.size
    expected = dist.weights * draws.size
    big = expected > 50
    chi2 = float(np.sum((counts[big] - expected[big]) ** 2 / expected[big]))
    assert stats.chi2.sf(chi2, big.sum() - 1) > 1e-3


def test_sample_is_fast() -> None:
    dist = get_correction(1.0)
    rng = np.random.default_rng(0)
    best = math.inf
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(10_000):
            dist.sample(rng)
        best = min(best, (time.perf_counter() - start) / 10_000)
    assert best < 10e-6  # target ~1 µs; generous bound for loaded machines


# --------------------------------------------------------------------------------------
# validation, building, persistence
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sigma", [0.0, -1.0, LOGISTIC_SD, 1.9, math.nan, math.inf, -math.inf, None, "1.0"]
)
def test_invalid_sigma_raises(sigma: object) -> None:
    with pytest.raises(ValueError, match=r"0 < sigma < pi/sqrt\(3\)") as info:
        get_correction(sigma)  # type: ignore[arg-type]
    assert "got sigma=" in str(info.value) and "sigma=1.0" in str(info.value)
    with pytest.raises(ValueError, match="sigma"):
        CorrectionDistribution.build(sigma)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sigma"):
        ridge_correction(sigma, n=10)  # type: ignore[arg-type]


def test_unknown_method_and_option() -> None:
    with pytest.raises(ValueError, match="unknown method"):
        CorrectionDistribution.build(1.0, method="magic")
    with pytest.raises(TypeError):
        CorrectionDistribution.build(1.0, method="lp", bogus=1)


def test_get_correction_builds_unshipped_sigma_and_caches() -> None:
    assert all(abs(s - 0.95) > 1e-12 for s in shipped_sigmas())
    start = time.perf_counter()
    dist = get_correction(0.95)
    assert time.perf_counter() - start < 30
    assert dist.sigma == 0.95 and dist.method == "lp"
    assert 0 < dist.error <= 1e-6
    assert dist.error == pytest.approx(dist.cdf_error(), rel=1e-12)
    assert _independent_error(dist, INDEPENDENT_GRID) <= 1.05 * dist.error
    assert get_correction(0.95) is dist  # cached in memory


def test_shipped_tables_used_when_sigma_matches() -> None:
    near = get_correction(1.0 + 1e-13)
    assert near is get_correction(1.0)
    assert near.info.get("lp_bound") is not None  # provenance survived the file round trip


def test_build_is_deterministic_and_reproduces_shipped_table() -> None:
    a = CorrectionDistribution.build(1.5)
    b = CorrectionDistribution.build(1.5)
    np.testing.assert_array_equal(a.support, b.support)
    np.testing.assert_array_equal(a.weights, b.weights)
    assert a.error == b.error
    shipped = get_correction(1.5)
    assert a.error == pytest.approx(shipped.error, rel=1e-3)
    x = np.linspace(-20, 20, 2001)
    assert np.max(np.abs(a.cdf(x) - shipped.cdf(x))) <= 2 * shipped.error


def test_save_load_round_trip_is_exact_and_byte_reproducible(tmp_path) -> None:
    dist = get_correction(1.2)
    p1, p2 = tmp_path / "a.npz", tmp_path / "b.npz"
    dist.save(p1)
    dist.save(p2)
    assert p1.read_bytes() == p2.read_bytes()
    back = CorrectionDistribution.load(p1)
    np.testing.assert_array_equal(back.support, dist.support)
    np.testing.assert_array_equal(back.weights, dist.weights)
    assert (back.sigma, back.error, back.method) == (dist.sigma, dist.error, dist.method)
    assert back.info == dist.info


def test_distribution_is_immutable_and_validated() -> None:
    dist = get_correction(1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        dist.sigma = 2.0  # type: ignore[misc]
    with pytest.raises(ValueError):
        dist.weights[0] = 0.5
    with pytest.raises(ValueError, match="sum to 1"):
        CorrectionDistribution(1.0, np.array([-1.0, 1.0]), np.array([0.5, 0.6]), 0.1, "x")
    with pytest.raises(ValueError, match="non-negative"):
        CorrectionDistribution(1.0, np.array([-1.0, 1.0]), np.array([-0.5, 1.5]), 0.1, "x")
    with pytest.raises(ValueError, match="increasing"):
        CorrectionDistribution(1.0, np.array([1.0, -1.0]), np.array([0.5, 0.5]), 0.1, "x")
