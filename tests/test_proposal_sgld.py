"""The SGLD proposal: exact per-minibatch log-q ratios, exact MH chains, uniform rows.

The log-q ratio is compared with the difference of the two Gaussian log densities built
from NumPy gradients on the same rows. Chains start 22 posterior sds from the mode (at
PyMC's start μ = 0); after a burn-in, a full-data MH chain (``ExactMH``) and a minibatch
chain (``AustereMH``) with the proposal must recover a conjugate posterior's mean and
variance within 4 batch-means Monte Carlo errors, and the same check must reject the
chains whose log-q ratio is dropped (plain SGLD moves at a large step, accepted by the
test on the target alone). Fixed seeds.
"""

from __future__ import annotations

import math
import warnings

import cloudpickle
import numpy as np
import pymc as pm
import pytest
from broken_proposals import AlteredRatio
from scipy.special import expit
from scipy.stats import chisquare, norm

from pymc_minibatch_mh import AustereMH, ExactMH, MinibatchBarker
from pymc_minibatch_mh.model.compat import posterior
from pymc_minibatch_mh.proposals.base import ProposalState
from pymc_minibatch_mh.proposals.sgld import StochasticLangevinProposal

Z_MAX = 4.0
N_BATCHES = 40


def _kwargs(**kwargs):
    base = dict(progressbar=False, compute_convergence_checks=False, chains=1, cores=1)
    base.update(kwargs)
    return base


def batch_means_z(samples, target):
    """z-score of the mean of a 1-D chain against ``target`` (batch-means MCSE)."""
    n = samples.shape[0] // N_BATCHES * N_BATCHES
    batch = samples[:n].reshape(N_BATCHES, -1).mean(axis=1)
    se = batch.std(ddof=1) / math.sqrt(N_BATCHES)
    return (samples[:n].mean() - target) / se


def moment_z(samples, mean, var):
    """z-scores of the chain's mean and of its mean squared deviation from ``mean``."""
    return np.array([batch_means_z(samples, mean), batch_means_z((samples - mean) ** 2, var)])


# ---------------------------------------------------------------------------- models

NORMAL_SIGMA = 2.0
PRIOR_SD = 10.0


def normal_mean_model(n=400, seed=0):
    y = np.random.default_rng(seed).normal(1.0, NORMAL_SIGMA, size=n)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, PRIOR_SD)
        pm.Normal("y", mu, NORMAL_SIGMA, observed=y)
    return model, y


def normal_grads(theta, y):
    """(Σ ∇log p(y_i|μ), ∇log ρ(μ)) of the normal-mean model."""
    mu = theta[0]
    return np.array([np.sum(y - mu) / NORMAL_SIGMA**2]), np.array([-mu / PRIOR_SD**2])


def logistic_model(n=300, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 2))
    y = (rng.random(n) < expit(x @ np.array([1.0, -0.5]))).astype("int64")
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 2.0, shape=2)
        pm.Bernoulli("y", logit_p=pm.math.dot(x, beta), observed=y)
    return model, (x, y)


def logistic_grads(theta, data):
    x, y = data
    return x.T @ (y - expit(x @ theta)), -theta / 4.0


def scale_model(n=300, seed=2):
    """Normal with unknown σ ~ HalfNormal(1): the log transform's Jacobian is in ρ."""
    y = np.random.default_rng(seed).normal(0.5, 1.5, size=n)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 5.0)
        pm.HalfNormal("sigma", 1.0)
        pm.Normal("y", mu, model["sigma"], observed=y)
    return model, y


def scale_grads(theta, y):
    mu, s = theta  # s = log σ (flat order: mu, sigma_log__)
    sigma2 = math.exp(2 * s)
    r = y - mu
    g_lik = np.array([np.sum(r) / sigma2, np.sum(r**2) / sigma2 - y.size])
    # log HalfNormal(e^s; 1) + s  →  −e^{2s} + 1
    g_prior = np.array([-mu / 25.0, 1.0 - sigma2])
    return g_lik, g_prior


def _subset(data, rows):
    if isinstance(data, tuple):
        return tuple(d[rows] for d in data)
    return data[rows]


# ------------------------------------------------------------------- (a) log-q ratio


@pytest.mark.parametrize(
    ("make", "grads", "x0", "alpha", "temperature"),
    [
        (normal_mean_model, normal_grads, [0.3], 0.01, 1.0),
        (normal_mean_model, normal_grads, [2.0], 0.05, 3.0),
        (logistic_model, logistic_grads, [0.5, -0.2], 0.02, 1.0),
        (logistic_model, logistic_grads, [0.0, 0.4], 0.05, 2.0),
        (scale_model, scale_grads, [0.2, 0.3], 0.002, 1.0),
    ],
    ids=["normal", "normal-K3", "logistic", "logistic-K2", "normal-scale-jacobian"],
)
def test_log_q_ratio_matches_brute_force(make, grads, x0, alpha, temperature):
    model, data = make()
    with model:
        step = ExactMH(scaling=alpha, tune=False, temperature=temperature)
    batch = 37
    proposal = StochasticLangevinProposal(
        step.likelihood, batch_size=batch, temperature=temperature
    )
    n_total = step.likelihood.store.n_rows
    rng = np.random.default_rng(5)
    x = np.array(x0, dtype=np.float64)
    for _ in range(5):
        x_before = x.copy()
        state = proposal.init(x)
        new_state, info = proposal.propose(rng, state, alpha)
        x_new, log_q = new_state.x, info.log_q_ratio
        np.testing.assert_array_equal(x, x_before)  # not modified
        assert x_new is not state.x and info.scale == info.step_size == alpha
        rows = proposal.last_rows
        assert rows.shape == (batch,) and np.unique(rows).size == batch

        def g(theta, rows=rows):
            g_lik, g_prior = grads(theta, _subset(data, rows))
            return n_total / (batch * temperature) * g_lik + g_prior

        sd = math.sqrt(alpha)
        forward = norm.logpdf(x_new, x + 0.5 * alpha * g(x), sd).sum()
        backward = norm.logpdf(x, x_new + 0.5 * alpha * g(x_new), sd).sum()
        assert log_q == pytest.approx(backward - forward, rel=1e-8, abs=1e-8)
        # The move itself: a Gaussian residual of variance α.
        resid = (x_new - x - 0.5 * alpha * g(x)) / sd
        assert np.all(np.abs(resid) < 6)
        x = x_new
    assert proposal.n_grad_evals == 10


def test_for_step_reads_likelihood_and_temperature():
    model, _ = normal_mean_model()
    with model:
        step = MinibatchBarker(batch_size=20, temperature=4.0, scaling=1e-3, tune=False)
    proposal = StochasticLangevinProposal.for_step(step, batch_size=30)
    assert proposal.likelihood is step.likelihood
    assert proposal.temperature == 4.0 and proposal.batch_size == 30
    assert proposal.name == "sgld"


# --------------------------------------------------------------- (b) MH chains

# Normal mean, N = 2000, σ = 2, prior N(0, 10²): posterior precision P ≈ 500, sd ≈ 0.045,
# mean ≈ 1, so PyMC's start μ = 0 is 22 sds away. α = 0.6/P and minibatches of 500 rows:
# the drift contracts the distance to the mode by 0.7 per step, so BURN_IN draws are
# plenty. Measured over seeds 1-4 (10,000 draws): |z| ≤ 2.4 with the log-q ratio, variance
# z from −22 to −25 without it, so the check has power.
CHAIN_N = 2000
CHAIN_BATCH = 500
CHAIN_ALPHA_TIMES_PREC = 0.6
BURN_IN = 200


def _conjugate(y):
    prec = 1 / PRIOR_SD**2 + y.size / NORMAL_SIGMA**2
    return np.sum(y) / NORMAL_SIGMA**2 / prec, 1 / prec


def _chain(make_step, how, draws, seed):
    """Draws after BURN_IN of a chain from μ = 0 with the SGLD proposal (ratio ``how``)."""
    model, y = normal_mean_model(n=CHAIN_N, seed=3)
    mean, var = _conjugate(y)
    alpha = CHAIN_ALPHA_TIMES_PREC * var
    with model:
        step = make_step(alpha)
        proposal = StochasticLangevinProposal.for_step(step, batch_size=CHAIN_BATCH)
        step.proposal = AlteredRatio(proposal, how)
        idata = pm.sample(draws=BURN_IN + draws, tune=0, step=step, random_seed=seed,
                          **_kwargs())
    samples = np.asarray(posterior(idata)["mu"]).ravel()
    assert abs(samples[0] - mean) > 10 * math.sqrt(var)  # started far from the mode
    samples = samples[BURN_IN:]
    return moment_z(samples, mean, var), samples


def _exact(alpha):
    return ExactMH(scaling=alpha, tune=False)


def _austere(alpha):
    return AustereMH(batch_size=200, epsilon=0.05, scaling=alpha, tune=False)


@pytest.mark.parametrize(
    ("make_step", "draws"),
    [(_exact, 10_000), (_austere, 6_000)],
    ids=["exact-mh", "austere-mh"],
)
@pytest.mark.parametrize("how", ["exact", "dropped"])
def test_chain_with_sgld_proposal_recovers_the_posterior(make_step, draws, how):
    # The same check passes with the log-q ratio and fails without it.
    z, samples = _chain(make_step, how, draws, seed=3)
    if how == "exact":
        assert np.max(np.abs(z)) <= Z_MAX, z
        assert 0.05 < np.mean(np.diff(samples) != 0) < 0.95
    else:
        assert np.max(np.abs(z)) > Z_MAX, z


def test_step_with_the_proposal_pickles():
    # pm.sample with cores > 1 pickles the step (cloudpickle), proposal included.
    model, _ = normal_mean_model()
    with model:
        step = ExactMH(scaling=1e-3, tune=False)
    step.proposal = StochasticLangevinProposal.for_step(step, batch_size=20)
    start = ProposalState(np.array([0.5]))
    step.proposal.propose(np.random.default_rng(0), start, 1e-3)
    clone = cloudpickle.loads(cloudpickle.dumps(step))
    a = step.proposal.propose(np.random.default_rng(1), start, 1e-3)
    b = clone.proposal.propose(np.random.default_rng(1), start, 1e-3)
    assert clone.proposal.likelihood is clone.likelihood
    np.testing.assert_array_equal(a[0].x, b[0].x)
    assert a[1] == b[1]


# ------------------------------------------------------------------- (c) row draws


def test_rows_are_uniform_without_replacement():
    model, _ = normal_mean_model(n=20)
    with model:
        step = ExactMH(tune=False)
    proposal = StochasticLangevinProposal(step.likelihood, batch_size=7)
    rng = np.random.default_rng(3)
    draws = 20_000
    counts = np.zeros(20)
    first = np.zeros(20)
    pairs = np.zeros((20, 20))
    for _ in range(draws):
        rows = proposal.draw_rows(rng)
        assert np.unique(rows).size == 7 and rows.min() >= 0 and rows.max() < 20
        counts[rows] += 1
        first[rows[0]] += 1
        pairs[rows[0], rows[1]] += 1
    # Each row in 7/20 of the batches, each row first in 1/20, ordered pairs uniform.
    assert chisquare(counts).pvalue > 1e-3
    assert chisquare(first).pvalue > 1e-3
    off = pairs[~np.eye(20, dtype=bool)]
    assert chisquare(off).pvalue > 1e-3
    assert np.all(np.diag(pairs) == 0)


def test_rows_follow_new_data_and_refuse_a_too_large_batch():
    with pm.Model() as model:
        data = pm.Data("data", np.zeros(50))
        mu = pm.Normal("mu", 0.0, 1.0)
        pm.Normal("y", mu, 1.0, observed=data, shape=data.shape)
        step = ExactMH(tune=False)
    proposal = StochasticLangevinProposal.for_step(step, batch_size=30)
    rng = np.random.default_rng(0)
    assert proposal.draw_rows(rng).max() < 50
    with model:
        pm.set_data({"data": np.ones(400)})
    step.likelihood.n_rows()  # what a chain start does
    seen = np.concatenate([proposal.draw_rows(rng) for _ in range(200)])
    assert seen.max() >= 50 and seen.max() < 400
    new_state, _ = proposal.propose(rng, proposal.init(np.array([0.0])), 1e-3)
    assert new_state.x[0] > 0  # the gradient uses the new data (all ones) and N = 400
    with model:
        pm.set_data({"data": np.ones(20)})
    step.likelihood.n_rows()
    with pytest.raises(ValueError, match="batch_size=30 of the SGLD proposal"):
        proposal.draw_rows(rng)


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch_size": 0}, "at least 1"),
        ({"batch_size": 2.5}, "positive integer"),
        ({"batch_size": True}, "positive integer"),
        ({"batch_size": 401}, "larger than the number of observations N=400"),
        ({"batch_size": 10, "temperature": 0.0}, "temperature"),
        ({"batch_size": 10, "temperature": math.inf}, "temperature"),
    ],
)
def test_bad_settings_are_refused(kwargs, match):
    model, _ = normal_mean_model()
    with model:
        step = ExactMH(tune=False)
    with pytest.raises(ValueError, match=match):
        StochasticLangevinProposal(step.likelihood, **kwargs)


@pytest.mark.parametrize("scale", [0.0, -1.0, math.nan, math.inf])
def test_bad_step_size_is_refused(scale):
    model, _ = normal_mean_model()
    with model:
        step = ExactMH(tune=False)
    proposal = StochasticLangevinProposal(step.likelihood, batch_size=10)
    with pytest.raises(ValueError, match="step size"):
        proposal.propose(np.random.default_rng(0), proposal.init(np.array([0.0])), scale)


def test_not_a_likelihood_is_refused():
    with pytest.raises(TypeError, match="MinibatchLikelihood"):
        StochasticLangevinProposal(object(), batch_size=3)  # type: ignore[arg-type]


def test_non_finite_gradient_rejects():
    model, _ = scale_model()
    with model:
        step = ExactMH(tune=False)
    proposal = StochasticLangevinProposal.for_step(step, batch_size=10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        # At log σ = −400, σ² underflows to 0: the gradient at θ is not finite.
        x = np.array([0.0, -400.0])
        new_state, info = proposal.propose(np.random.default_rng(1), proposal.init(x), 1.0)
        assert info.log_q_ratio == -math.inf
        assert np.array_equal(new_state.x, x) and new_state.x is not x
        # A finite gradient at θ but a step to log σ ≈ −400: not finite at θ′.
        state = proposal.init(np.array([0.0, -1.0]))
        _, info = proposal.propose(np.random.default_rng(1), state, 1e5)
    assert info.log_q_ratio == -math.inf
