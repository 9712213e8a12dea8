"""The proposal= setting: which proposal a step runs, its stats, and that each surrogate
proposal samples the right posterior inside a step (its log-q ratio is in the test)."""

from __future__ import annotations

import math

import numpy as np
import pymc as pm
import pytest
from conftest import sample_kwargs

from pymc_minibatch_mh import AustereMH, MinibatchBarker
from pymc_minibatch_mh.core.penalty import penalty_probability
from pymc_minibatch_mh.model.compat import mcse, posterior, sample_stats
from pymc_minibatch_mh.proposals import (
    CrankNicolsonProposal,
    GaussianSurrogate,
    Proposal,
    ProposalInfo,
    RandomWalkProposal,
    SurrogateHMCProposal,
    SurrogateLangevinProposal,
    SurrogateNUTSProposal,
    SurrogateTransitionProposal,
)
from pymc_minibatch_mh.proposals.registry import LAPLACE_MISMATCH, PROPOSAL_CODES

Y = np.random.default_rng(5).normal(1.3, 2.0, size=4000)


def normal_model():
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 10.0)
        pm.Normal("y", mu, 2.0, observed=Y)
    return model


def exact_posterior():
    precision = 1.0 / 100.0 + Y.size / 4.0
    return (Y.sum() / 4.0) / precision, 1.0 / math.sqrt(precision)


def test_auto_picks_crank_nicolson_with_control_variates_and_random_walk_without():
    model = normal_model()
    with model:
        cv = MinibatchBarker(control_variate="taylor", batch_size=50)
        plain = MinibatchBarker(batch_size=50, control_variate=None)
        laplace_walk = MinibatchBarker(control_variate="taylor", S="laplace", batch_size=50)
    assert isinstance(cv.proposal, CrankNicolsonProposal)
    # Zero-config runs the penalty test with Crank–Nicolson: Barker's target 0.4 scaled by
    # what a perfect proposal gets, h_0.5(0) = 0.80 against 1/2.
    assert cv.acceptance == "penalty" and plain.acceptance == "barker"
    assert cv.tuner.target == pytest.approx(0.4 * penalty_probability(0.0, 0.5) / 0.5)
    assert isinstance(plain.proposal, RandomWalkProposal) and plain.tuner.target == 0.25
    assert isinstance(laplace_walk.proposal, RandomWalkProposal)
    np.testing.assert_allclose(laplace_walk.proposal.chol @ laplace_walk.proposal.chol.T,
                               cv.control_variate.laplace_covariance())


def test_proposal_settings_are_checked():
    model = normal_model()
    with model:
        with pytest.raises(ValueError, match="needs control_variate='taylor'"):
            MinibatchBarker(proposal="mala", control_variate=None)
        with pytest.raises(ValueError, match="one of"):
            MinibatchBarker(proposal="nuts")
        with pytest.raises(ValueError, match="S sets the random walk"):
            MinibatchBarker(proposal="crank_nicolson", control_variate="taylor", S=[0.1])
        with pytest.raises(ValueError, match="propose"):
            MinibatchBarker(proposal=3)


@pytest.mark.parametrize(
    "kind, cls",
    [("crank_nicolson", CrankNicolsonProposal), ("mala", SurrogateLangevinProposal),
     ("hmc", SurrogateHMCProposal), ("surrogate_transition", SurrogateTransitionProposal),
     ("surrogate_nuts", SurrogateNUTSProposal)],
)
def test_surrogate_proposals_sample_the_posterior_and_report_their_parameters(kind, cls):
    """Normal mean: the Taylor expansion and the Laplace fit are exact, so every surrogate
    proposal must give the exact posterior; the stats name the proposal and its tuned
    parameter, and the chain starts from a draw of the fit."""
    model = normal_model()
    with model:
        step = MinibatchBarker(control_variate="taylor", proposal=kind, batch_size=50)
        idata = pm.sample(draws=1500, tune=300, step=step, chains=1,
                          initvals={"mu": np.array(-40.0)}, **sample_kwargs())
    assert isinstance(step.proposal, cls)
    draws = np.asarray(posterior(idata)["mu"]).ravel()
    ss = sample_stats(idata)
    mean, sd = exact_posterior()
    assert abs(draws.mean() - mean) < 4 * mcse(draws), (draws.mean(), mean, mcse(draws))
    assert abs(draws.std() / sd - 1) < 0.12
    code = np.asarray(ss["proposal"]).ravel()
    assert np.all(code == PROPOSAL_CODES[step.proposal.name])
    rho, size = np.asarray(ss["rho"]).ravel(), np.asarray(ss["step_size"]).ravel()
    if kind == "crank_nicolson":
        assert np.all((rho >= step.proposal.min_rho) & (rho < 1)) and np.all(np.isnan(size))
    else:
        assert np.all(size > 0) and np.all(np.isnan(rho))
    # ``scaling`` is the scale the proposal used, reported only where it uses one
    assert ("scaling" in ss) == step.proposal.uses_scale == (kind not in (
        "surrogate_transition", "surrogate_nuts"))
    if kind == "crank_nicolson":
        scaling = np.asarray(ss["scaling"]).ravel()
        assert np.all(scaling <= step.proposal.max_scale)
        np.testing.assert_allclose([step.proposal.rho(s) for s in scaling], rho, atol=1e-12)
    # residuals are 0: one round of 50 rows in each of the draw's transitions
    assert step.steps_per_draw == (4 if kind == "surrogate_nuts" else 3)
    assert np.asarray(ss["batch_size"]).max() == 50 * step.steps_per_draw


class DroppedRatio(Proposal):
    """A surrogate proposal whose log-q ratio is dropped: breaks detailed balance."""

    name = "broken"

    def __init__(self, inner):
        self.inner = inner

    def init(self, x):
        return self.inner.init(x)

    def propose(self, rng, state, scale):
        new, info = self.inner.propose(rng, state, scale)
        return new, ProposalInfo(0.0, info.scale)


@pytest.mark.parametrize("step_class", [MinibatchBarker, AustereMH])
def test_dropping_the_log_q_ratio_is_detected(step_class):
    """The same check fails when the proposal's log-q ratio is left out of the test."""
    model = normal_model()
    with model:
        step = step_class(control_variate="taylor", proposal="crank_nicolson", batch_size=50,
                          tune=False, scaling=1.0)
        # An independence sampler from a wider, shifted copy of the fit: the ratio matters.
        surrogate = step.proposal.surrogate
        wide = GaussianSurrogate(surrogate.theta_hat + 2 * surrogate.chol[0],
                                 4.0 * surrogate.chol @ surrogate.chol.T)
        step.proposal = DroppedRatio(CrankNicolsonProposal(wide))
        idata = pm.sample(draws=2000, tune=0, step=step, chains=1, **sample_kwargs())
    draws = np.asarray(posterior(idata)["mu"]).ravel()
    mean, sd = exact_posterior()
    z = abs(draws.mean() - mean) / mcse(draws)
    assert z > 4 or abs(draws.std() / sd - 1) > 0.12, (z, draws.std() / sd)


def small_hierarchical_model(n=3000, groups=6, seed=4):
    rng = np.random.default_rng(seed)
    g = rng.integers(0, groups, size=n)
    x = rng.normal(size=n)
    a = -0.3 + 0.6 * rng.normal(size=groups)
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-(a[g] + 0.8 * x)))).astype(np.int64)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 2.0)
        tau = pm.HalfNormal("tau", 1.0)
        z = pm.Normal("z", 0.0, 1.0, shape=groups)
        b = pm.Normal("b", 0.0, 2.0)
        pm.Bernoulli("y", logit_p=mu + tau * z[g] + b * x, observed=y)
    return model


def test_auto_runs_nuts_on_the_surrogate_where_the_quantities_are_not_affine():
    """Hierarchical intercepts: "auto" picks surrogate NUTS (a linear model: Crank–Nicolson);
    its chains start at θ̂ and give the same draws with cores=1 and cores=2."""
    with normal_model():
        assert MinibatchBarker(control_variate="taylor").proposal.name == "crank_nicolson"
    model = small_hierarchical_model()
    with model:
        step = MinibatchBarker(control_variate="taylor", batch_size=50)
        assert isinstance(step.proposal, SurrogateNUTSProposal)
        runs = [pm.sample(draws=30, tune=30, step=step, chains=2, cores=cores, mp_ctx="fork",
                          discard_tuned_samples=False, **sample_kwargs(random_seed=3))
                for cores in (1, 2)]
    mu = [np.asarray(posterior(r)["mu"]) for r in runs]
    np.testing.assert_array_equal(mu[0], mu[1])
    assert np.unique(mu[0][0]).size > 5  # it moves
    codes = np.asarray(sample_stats(runs[0])["proposal"])
    assert np.all(codes == PROPOSAL_CODES["surrogate_nuts"])
    with pytest.raises(ValueError, match="n_inner must be an integer"):
        SurrogateNUTSProposal(step.surrogate_posterior(), n_inner=0)


def centred_poisson_model(tau_true, rows_per_group=1000, groups=20, seed=3):
    """Centred group intercepts (affine in θ): a_g ~ N(mu, tau), counts with one slope."""
    rng = np.random.default_rng(seed)
    g = np.repeat(np.arange(groups), rows_per_group)
    x = rng.normal(size=g.size)
    a = 0.5 + tau_true * rng.normal(size=groups)
    y = rng.poisson(np.exp(a[g] + 0.3 * x))
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 2.0)
        tau = pm.HalfNormal("tau", 1.0)
        a_g = pm.Normal("a", mu, tau, shape=groups)
        b = pm.Normal("b", 0.0, 1.0)
        pm.Poisson("y", pm.math.exp(a_g[g] + b * x), observed=y)
    return model


@pytest.mark.parametrize("tau_true, expected", [(0.07, "surrogate_nuts"),
                                                 (1.0, "crank_nicolson")])
def test_auto_runs_nuts_where_the_surrogate_is_far_from_its_laplace_fit(tau_true, expected,
                                                                        caplog):
    """Centred intercepts are affine in θ, but where the groups' spread is uncertain
    against what the data say of each group (0.07 against about 0.025), the prior makes
    the surrogate posterior far from Gaussian, and "auto" runs NUTS on it; where the
    groups are far apart (1.0), Crank–Nicolson moves around the Laplace fit. A linear
    model's surrogate is its Laplace fit."""
    with normal_model():
        step = MinibatchBarker()
        assert step.surrogate_posterior().laplace_mismatch() < 1e-6
    with centred_poisson_model(tau_true), caplog.at_level("INFO", logger="pymc_minibatch_mh"):
        step = MinibatchBarker()
    assert step.control_variate.analysis.is_affine()
    post = step.surrogate_posterior()
    mismatch = post.laplace_mismatch()
    # measured with the per-step function: the ratio of the surrogate's log density
    mode, x = post.laplace.theta_hat, post.laplace.theta_hat + post.laplace.chol[:, 0]
    assert post.log_ratio(mode, x) == pytest.approx(
        post.log_density(x) - post.log_density(mode), abs=1e-8)
    assert step.proposal.name == expected
    assert (mismatch > LAPLACE_MISMATCH) == (expected == "surrogate_nuts")
    told = [r.getMessage() for r in caplog.records if "Laplace fit" in r.getMessage()]
    assert bool(told) == (expected == "surrogate_nuts")
    if told:
        assert f"{mismatch:.2f}" in told[0]
