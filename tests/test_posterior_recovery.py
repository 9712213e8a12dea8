"""MinibatchBarker recovers tempered conjugate posteriors known in closed form.

Model: x_i ~ N(μ, σ_x²) with σ_x known, μ ~ N(m0, s0²). With the likelihood raised to
1/K the posterior is normal with precision 1/s0² + N/(K σ_x²). The sampler's mean and sd
must agree with it within a few Monte Carlo standard errors (ArviZ), and the same check
must reject the posterior at the wrong temperature.
"""

from __future__ import annotations

import math

import numpy as np
import pymc as pm
import pytest
from conftest import sample_kwargs

from pymc_minibatch_mh import MinibatchBarker
from pymc_minibatch_mh.model.compat import mcse, posterior, sample_stats

SIGMA_X, M0, S0 = 2.0, 0.0, 10.0


def tempered_posterior(x, temperature):
    precision = 1 / S0**2 + x.size / (temperature * SIGMA_X**2)
    mean = (M0 / S0**2 + x.sum() / (temperature * SIGMA_X**2)) / precision
    return mean, 1 / math.sqrt(precision)


def run(x, temperature, step_sd_ratio, draws, batch_size, seed=1, step_class=None, **kwargs):
    mean, sd = tempered_posterior(x, temperature)
    step_class = step_class or MinibatchBarker
    with pm.Model():
        mu = pm.Normal("mu", M0, S0)
        pm.Normal("x", mu, SIGMA_X, observed=x)
        if batch_size is not None:
            kwargs["batch_size"] = batch_size
        step = step_class(
            temperature=temperature, S=[step_sd_ratio * sd], tune=False, **kwargs
        )
        idata = pm.sample(
            draws=draws, tune=300, step=step, chains=4, cores=1,
            initvals={"mu": mean}, **sample_kwargs(random_seed=seed),
        )
    draws_mu = np.asarray(posterior(idata)["mu"])
    return draws_mu, sample_stats(idata), (mean, sd)


def check(draws_mu, mean, sd, k=4.0):
    se_mean = mcse(draws_mu, "mean")
    se_sd = mcse(draws_mu, "sd")
    got_mean, got_sd = draws_mu.mean(), draws_mu.std()
    ok = abs(got_mean - mean) < k * se_mean and abs(got_sd - sd) < k * se_sd
    return ok, (got_mean, mean, se_mean, got_sd, sd, se_sd)


@pytest.fixture(scope="module")
def data():
    return np.random.default_rng(123).normal(1.5, SIGMA_X, size=20_000)


def test_temperature_one_small_steps(data):
    draws_mu, ss, (mean, sd) = run(data, 1.0, 0.3, draws=3000, batch_size=200)
    ok, info = check(draws_mu, mean, sd)
    assert ok, info
    # At temperature 1 the test needs a sizeable share of the data, but not all of it.
    avg = float(ss["batch_size"].mean())
    assert 200 <= avg < data.size / 2
    # The check can fail: the posterior at temperature 4 is clearly rejected.
    wrong_mean, wrong_sd = tempered_posterior(data, 4.0)
    assert not check(draws_mu, wrong_mean, wrong_sd)[0]


def test_high_temperature(data):
    temperature = 200.0
    draws_mu, ss, (mean, sd) = run(data, temperature, 1.0, draws=2000, batch_size=50)
    ok, info = check(draws_mu, mean, sd)
    assert ok, info
    assert float(ss["batch_size"].mean()) < 200
    # The untempered posterior (sd √200 times smaller) is rejected by the same check.
    wrong_mean, wrong_sd = tempered_posterior(data, 1.0)
    assert not check(draws_mu, wrong_mean, wrong_sd)[0]
