"""Slow: each surrogate proposal, inside MinibatchBarker at temperature 1 with control
variates, gives NUTS's posterior, also where the posterior is far from its Laplace fit
(a small logistic regression; a Poisson regression with few counts per parameter), and
the zero-config setting gives it on a non-centred hierarchical logistic regression."""

from __future__ import annotations

import functools
import math

import numpy as np
import pymc as pm
import pytest
from conftest import sample_kwargs
from scipy.special import expit

from pymc_minibatch_mh import MinibatchBarker
from pymc_minibatch_mh.model.compat import mcse, posterior

pytestmark = [pytest.mark.slow, pytest.mark.newest_line]


def logistic_model(n=400, d=3, seed=30):
    rng = np.random.default_rng(seed)
    x = np.column_stack([np.ones(n), rng.normal(size=(n, d - 1))])
    y = (rng.random(n) < expit(x @ np.array([-1.0, 1.5, -0.5][:d]))).astype(np.int64)
    with pm.Model() as model:
        b = pm.Normal("b", 0.0, 5.0, shape=d)
        pm.Bernoulli("y", logit_p=pm.math.dot(x, b), observed=y)
    return model


def sparse_poisson_model(n=300, seed=31):
    """Counts of about 0.2 per row and 3 coefficients: a skewed posterior."""
    rng = np.random.default_rng(seed)
    x = np.column_stack([np.ones(n), rng.normal(size=n), rng.random(n) < 0.1])
    y = rng.poisson(np.exp(x @ np.array([-1.8, 0.4, 0.8])))
    with pm.Model() as model:
        b = pm.Normal("b", 0.0, 3.0, shape=3)
        pm.Poisson("y", mu=pm.math.exp(pm.math.dot(x, b)), observed=y)
    return model


def compare_with_nuts(model, step, seed):
    with model:
        ours = pm.sample(draws=4000, tune=1000, step=step, chains=2, cores=1,
                         **sample_kwargs(random_seed=seed))
        nuts = pm.sample(draws=2000, tune=1000, chains=2, cores=1,
                         **sample_kwargs(random_seed=seed + 1))
    a, b = np.asarray(posterior(ours)["b"]), np.asarray(posterior(nuts)["b"])
    for j in range(a.shape[-1]):
        se = math.hypot(mcse(a[..., j]), mcse(b[..., j]))
        se_sd = math.hypot(mcse(a[..., j], "sd"), mcse(b[..., j], "sd"))
        assert abs(a[..., j].mean() - b[..., j].mean()) < 4 * se, (j, a[..., j].mean(),
                                                                    b[..., j].mean(), se)
        assert abs(a[..., j].std() - b[..., j].std()) < 4 * se_sd, (j, a[..., j].std(),
                                                                    b[..., j].std(), se_sd)


@pytest.mark.parametrize(
    "proposal",
    [
        pytest.param("crank_nicolson", marks=pytest.mark.xfail(
            strict=False,
            reason="the minibatch test's own error at N = 400, b = 50 with moves of a "
                   "posterior width: over seeds 40-47, b[2]'s mean is off by -0.97 combined "
                   "MCSE on average (rms 1.58, at most 3.3), against -0.32 (rms 0.84) with "
                   "b = 400, the exact Barker test (see the guide's Proposals page); this "
                   "seed passes since 3 transitions per draw",
        )),
        "mala", "hmc", "surrogate_transition", "surrogate_nuts",
    ],
)
def test_surrogate_proposals_match_nuts_on_a_small_logistic_regression(proposal):
    model = logistic_model()
    with model:
        step = MinibatchBarker(control_variate="taylor", proposal=proposal, batch_size=50)
    compare_with_nuts(model, step, seed=40)


def test_zero_config_matches_nuts_on_a_sparse_poisson_regression():
    model = sparse_poisson_model()
    with model:
        step = MinibatchBarker(control_variate="taylor", batch_size=50)
    compare_with_nuts(model, step, seed=50)


def hierarchical_model(n=20_000, groups=16, seed=10):
    """Non-centred intercepts ``mu + tau * z[g]``: a curved posterior at any N."""
    rng = np.random.default_rng(seed)
    g = rng.integers(0, groups, size=n)
    x = rng.normal(size=(n, 2))
    a = -0.5 + 0.7 * rng.normal(size=groups)
    y = (rng.random(n) < expit(a[g] + x @ np.array([0.8, -0.4]))).astype(np.int64)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 2.0)
        tau = pm.HalfNormal("tau", 1.0)
        z = pm.Normal("z", 0.0, 1.0, shape=groups)
        b = pm.Normal("b", 0.0, 2.0, shape=2)
        pm.Bernoulli("y", logit_p=mu + tau * z[g] + pm.math.dot(x, b), observed=y)
    return model


@functools.cache
def hierarchical_reference():
    """PyMC's NUTS on :func:`hierarchical_model` (2 × 2000 draws)."""
    with hierarchical_model():
        return pm.sample(draws=2000, tune=1000, chains=2, cores=1, target_accept=0.9,
                         **sample_kwargs(random_seed=61))


def test_zero_config_matches_nuts_on_a_hierarchical_logistic_regression():
    """"auto" picks NUTS on the surrogate here (the intercepts are not affine in θ).

    Every scalar's mean within 4 combined MCSE of NUTS's and its sd within 4 combined
    MCSE of the sd; R-hat below 1.01. Dropping the proposal's log-q ratio fails it.
    """
    from pymc_minibatch_mh.model.compat import sample_stats

    model = hierarchical_model()
    with model:
        step = MinibatchBarker(control_variate="taylor")
        assert step.proposal.name == "surrogate_nuts"
        ours = pm.sample(draws=3000, tune=1000, step=step, chains=2, cores=1,
                         **sample_kwargs(random_seed=60))
    nuts = hierarchical_reference()
    rows = float(np.asarray(sample_stats(ours)["batch_size"]).mean()) / step.steps_per_draw
    assert rows < 500  # per transition
    import arviz as az

    for name in ("mu", "tau", "z", "b"):
        a = np.asarray(posterior(ours)[name]).reshape(2, 3000, -1)
        b = np.asarray(posterior(nuts)[name]).reshape(2, 2000, -1)
        for j in range(a.shape[-1]):
            assert float(az.rhat(a[..., j])) < 1.01, (name, j, float(az.rhat(a[..., j])))
            se = math.hypot(mcse(a[..., j]), mcse(b[..., j]))
            se_sd = math.hypot(mcse(a[..., j], "sd"), mcse(b[..., j], "sd"))
            assert abs(a[..., j].mean() - b[..., j].mean()) < 4 * se, (
                name, j, a[..., j].mean(), b[..., j].mean(), se)
            assert abs(a[..., j].std() - b[..., j].std()) < 4 * se_sd, (
                name, j, a[..., j].std(), b[..., j].std(), se_sd)
