"""The skew-corrected minibatch Barker test: its top-up noise, its rule and its error."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pymc as pm
import pytest
from conftest import sample_kwargs
from scipy import stats

from pymc_minibatch_mh import MinibatchBarker
from pymc_minibatch_mh.core import barker_decision, get_correction
from pymc_minibatch_mh.core.barker import DONE, barker_rounds
from pymc_minibatch_mh.core.calibration import barker_acceptance_error
from pymc_minibatch_mh.core.moments import chunk_moments, merge_third_moment, third_moment_sum
from pymc_minibatch_mh.core.skew import (
    LOGISTIC_D3_MAX,
    LOGISTIC_D4_MAX,
    SKEW_LIMIT,
    acceptance_probability,
    skew_topup,
    skew_topup_cumulant,
)
from pymc_minibatch_mh.model.compat import sample_stats

CORRECTION = get_correction(1.0)


def test_logistic_derivative_maxima():
    g = np.linspace(1e-9, 1 - 1e-9, 2_000_001)  # g = logistic CDF, g' = g(1 − g)
    d3 = g * (1 - g) * (1 - 6 * g + 6 * g * g)
    d4 = g * (1 - g) * (1 - 2 * g) * (1 - 12 * g + 12 * g * g)
    assert np.abs(d3).max() == pytest.approx(LOGISTIC_D3_MAX, rel=1e-9)
    assert np.abs(d4).max() == pytest.approx(LOGISTIC_D4_MAX, rel=1e-9)
    assert SKEW_LIMIT == pytest.approx(4 / 3 * LOGISTIC_D3_MAX / LOGISTIC_D4_MAX)


def test_third_moment_merge_matches_numpy():
    x = np.random.default_rng(0).lognormal(size=257)
    n, mean, m2, m3 = 0, 0.0, 0.0, 0.0
    for chunk in np.array_split(x, [10, 11, 100, 200]):
        c_mean, c_m2 = chunk_moments(chunk)
        m3 = merge_third_moment(n, mean, m2, m3, chunk.size, c_mean, c_m2,
                                third_moment_sum(chunk, c_mean))
        n, mean, m2 = n + chunk.size, (n * mean + chunk.sum()) / (n + chunk.size), (
            ((x[: n + chunk.size] - x[: n + chunk.size].mean()) ** 2).sum())
    assert m3 == pytest.approx(((x - x.mean()) ** 3).sum(), rel=1e-10)


def test_needed_cumulant_is_estimated_without_bias():
    """Over every sample of n rows from N, E[κ̂_a] = 3 cov(Δ*, s²) − κ₃(Δ*) exactly."""
    big_n, n = 14, 5
    y = np.random.default_rng(3).lognormal(size=big_n)
    samples = y[np.array(list(itertools.combinations(range(big_n), n)))]
    delta = big_n * samples.mean(axis=1)
    s2 = big_n**2 / (big_n - 1) * samples.var(axis=1, ddof=1) * (big_n - n) / n
    e = delta - delta.mean()
    kappa3 = (e**3).mean()
    cov = (e * (s2 - s2.mean())).mean()
    m3 = ((samples - samples.mean(axis=1, keepdims=True)) ** 3).sum(axis=1)
    estimates = [skew_topup_cumulant(n, big_n, value, 1e300)[0] for value in m3]
    assert np.mean(estimates) == pytest.approx(3 * cov - kappa3, rel=1e-9)
    assert cov > kappa3 > 0  # the covariance term is the larger one


def test_fallback_rule():
    kappa, fallback = skew_topup_cumulant(50, 1000, 4e-5, 1.0)
    assert not fallback and kappa > 0
    small = abs(kappa) / SKEW_LIMIT
    assert skew_topup_cumulant(50, 1000, 4e-5, small * 1.01) == (kappa, False)
    assert skew_topup_cumulant(50, 1000, 4e-5, small * 0.99) == (kappa, True)
    assert skew_topup_cumulant(50, 1000, -4e-5, 1.0)[0] == -kappa
    assert skew_topup_cumulant(2, 1000, 4e-5, 1.0) == (0.0, False)


@pytest.mark.parametrize("kappa", [0.3, -0.2, 0.0])
def test_topup_has_the_requested_variance_and_third_cumulant(kappa):
    variance, size = 0.6, 200_000
    rng = np.random.default_rng(7)
    x = np.array([skew_topup(rng, variance, kappa) for _ in range(size)])
    d = x - x.mean()
    m2, m3, m4, m6 = (np.mean(d**k) for k in (2, 3, 4, 6))
    # Standard errors of the sample moments from the sample itself.
    se2 = math.sqrt((m4 - m2 * m2) / size)
    se3 = math.sqrt((m6 - m3 * m3 - 6 * m4 * m2 + 9 * m2**3) / size)
    assert abs(x.mean()) < 5 * math.sqrt(m2 / size)
    assert abs(m2 - variance) < 5 * se2
    assert abs(m3 - kappa) < 5 * se3
    if kappa:
        theta = abs(kappa) / (2 * variance)
        mean, var, skew = stats.gamma(variance / theta**2, scale=theta).stats("mvs")
        assert var == pytest.approx(variance) and skew * var**1.5 == pytest.approx(abs(kappa))


@pytest.mark.parametrize(
    ("delta_star", "variance", "kappa"),
    [(0.3, 0.4, 0.2), (-0.5, 0.6, -0.3), (1.0, 0.5, 0.0), (0.2, 0.1, 0.1), (0.0, 0.95, 0.01)],
)
def test_closed_form_matches_monte_carlo(delta_star, variance, kappa):
    rng = np.random.default_rng(11)
    size = 100_000
    accepted = sum(
        barker_decision(rng, delta_star, variance, CORRECTION, full_data=False, skew=kappa)
        for _ in range(size)
    )
    p = float(acceptance_probability(delta_star, variance, CORRECTION.support,
                                     CORRECTION.weights, 1.0, kappa))
    assert abs(accepted / size - p) < 4.5 * math.sqrt(p * (1 - p) / size)


def test_closed_form_without_topup_is_barker():
    p = acceptance_probability([0.7, -2.0], [1.2, math.inf], CORRECTION.support,
                               CORRECTION.weights, 1.0, 0.3)
    np.testing.assert_allclose(p, 1 / (1 + np.exp(-np.array([0.7, -2.0]))))


def test_rounds_report_the_cumulant():
    values = np.random.default_rng(2).lognormal(size=300) * 1e-4
    args = dict(n_total=10_000, batch_size=100, data_free=0.0, sigma2=1.0, tolerance=-1.0,
                early_decision=-1.0)
    plain = barker_rounds(values, np.empty(300), 0, 0.0, 0.0, 0, **args)
    skewed = barker_rounds(values, np.empty(300), 0, 0.0, 0.0, 0, **args, skew=True)
    assert plain[0] == skewed[0] == DONE
    assert plain[:10] == skewed[:10]  # the same stopping rule
    n = skewed[2]
    assert skewed[10] == pytest.approx(((values[:n] - values[:n].mean()) ** 3).sum(), rel=1e-9)
    assert skewed[11] == skew_topup_cumulant(n, 10_000, skewed[10], 1.0 - skewed[7])[0] > 0
    assert plain[11] == 0.0


def lognormal_population(variance=0.25, batch_size=1000, size=100_000):
    """Lognormal ratios scaled so that Var(Δ*) ≈ ``variance`` at ``batch_size`` rows."""
    x = np.random.default_rng(5).lognormal(0.0, 1.0, size)
    x -= x.mean()
    return x * math.sqrt(variance * batch_size / (size**2 * x.var()))


def smaller_error(corrected, plain, z=4.0):
    """Whether ``corrected`` is below ``plain`` by more than ``z`` standard errors each."""
    return bool(abs(corrected.error[0]) + z * corrected.standard_error[0]
                < abs(plain.error[0]) - z * plain.standard_error[0])


def test_skew_correction_reduces_the_error_on_lognormal_ratios():
    """At b = 1000 and Δ = 0 (where g‴ peaks) the plain test errs by about 1e-3; the
    skew-corrected test by about 2e-4; the same correction with the wrong sign by more
    than the plain test."""
    values = lognormal_population()
    kwargs = dict(batch_size=1000, replications=20_000)

    def measure(**options):
        return barker_acceptance_error(values, [0.0], rng=np.random.default_rng(1), **kwargs,
                                       **options)

    plain = measure()
    corrected = measure(skew_correction=True)
    wrong = measure(skew_correction=True, skew_sign=-1.0)
    assert smaller_error(corrected, plain)
    assert not smaller_error(wrong, plain)
    assert abs(wrong.error[0]) > abs(plain.error[0])


def test_step_records_the_skew_stats():
    y = np.random.default_rng(0).exponential(1.0, size=5000)
    with pm.Model():
        rate = pm.LogNormal("rate", 0.0, 1.0)
        pm.Exponential("y", rate, observed=y)
        step = MinibatchBarker(batch_size=100, temperature=10.0, S=[0.02], tune=False,
                               skew_correction=True)
        idata = pm.sample(draws=200, tune=0, step=step, chains=1, **sample_kwargs())
    stats_ = sample_stats(idata)
    skew = np.asarray(stats_["skew"]).ravel()
    assert step.skew_correction and np.any(skew != 0.0)
    assert np.asarray(stats_["skew_fallback"]).dtype == np.bool_
