"""MinibatchGibbs: the flip tests, the stationary law against enumeration, refusals, compounds.

The stationary-law tests run the step alone on a small model with three binary variables
and one categorical variable (24 states) and compare the visited states' frequencies with
the exact (tempered) posterior, enumerated with PyMC's own log-probability functions. The
tolerance is the Monte Carlo error from batch means (the chains are autocorrelated), at a
fixed seed.
"""

from __future__ import annotations

import itertools
import warnings

import cloudpickle
import numpy as np
import pymc as pm
import pytest
from conftest import sample_kwargs
from scipy import special

from pymc_minibatch_mh import MinibatchBarker, MinibatchGibbs
from pymc_minibatch_mh.core.gibbs import gibbs_t_test, logit_threshold, propose_category
from pymc_minibatch_mh.core.source import ArraySource
from pymc_minibatch_mh.errors import ModelNotSupportedError
from pymc_minibatch_mh.model.compat import posterior, sample_stats
from pymc_minibatch_mh.step_methods.minibatch_gibbs import MinibatchGibbsState
from pymc_minibatch_mh.transition.step_base import MinibatchStepBase

FAST = dict(mode="FAST_COMPILE")


# ------------------------------------------------------------------------ core
def test_logit_threshold_and_exact_gibbs_decision():
    """At n = N the t-test accepts with probability g(Δ) (Appendix F, eq. 41)."""
    rng = np.random.default_rng(0)
    values = np.full(50, 0.02)  # Δ = 1 + c
    for c, reps in ((0.0, 4000), (-2.0, 4000)):
        accepted = 0
        for _ in range(reps):
            source = ArraySource(values, rng=rng)
            source.start_step()
            out = gibbs_t_test(rng, source, c, batch_size=50, epsilon=0.05)
            assert out.full_data
            accepted += out.accepted
        p = special.expit(1.0 + c)
        assert abs(accepted / reps - p) < 4 * np.sqrt(p * (1 - p) / reps)
    logit_u, mu0 = logit_threshold(np.random.default_rng(3), 0.5, 4)
    assert np.isfinite(logit_u) and mu0 == pytest.approx((logit_u - 0.5) / 4)


def test_t_test_stops_early_when_the_conditional_is_clear():
    rng = np.random.default_rng(1)
    values = rng.normal(0.01, 0.001, size=100_000)  # Δ ≈ 1000: the flip is certain
    source = ArraySource(values, rng=rng)
    source.start_step()
    out = gibbs_t_test(rng, source, 0.0, batch_size=100, epsilon=0.01)
    assert out.accepted and out.batch_size == 100 and not out.full_data


def test_propose_category_is_uniform_over_the_others():
    rng = np.random.default_rng(2)
    draws = np.array([propose_category(rng, 1, 4) for _ in range(3000)])
    assert 1 not in draws
    counts = np.bincount(draws, minlength=4)[[0, 2, 3]]
    assert np.all(np.abs(counts - 1000) < 4 * np.sqrt(1000 * 2 / 3))
    assert propose_category(rng, 0, 2) == 1 and propose_category(rng, 1, 2) == 0


# --------------------------------------------------------- stationary law
TEMPERATURE = 50.0


def small_model(n=3000, seed=11):
    """Three binary variables and one 3-category variable; posterior spread over 24 states."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3))
    mu_true = 0.3 * x[:, 0] + 0.2 * x[:, 0] * x[:, 1] - 0.15
    y = mu_true + rng.normal(size=n)
    with pm.Model() as model:
        g = pm.Bernoulli("g", p=np.array([0.5, 0.3, 0.6]), shape=3)
        z = pm.Categorical("z", p=np.array([0.2, 0.5, 0.3]))
        offsets = pm.math.constant(np.array([-0.15, 0.0, 0.15]))
        mu = 0.3 * g[0] * x[:, 0] + 0.2 * g[1] * g[2] * x[:, 0] * x[:, 1] + offsets[z]
        pm.Normal("y", mu, 1.0, observed=y)
    return model


def exact_posterior(model, temperature):
    """P(state) by enumeration: prior + likelihood / K, from PyMC's own functions."""
    prior = model.compile_fn(model.logp(vars=model.free_RVs), on_unused_input="ignore")
    lik = model.compile_fn(model.logp(vars=model.observed_RVs), on_unused_input="ignore")
    states = [(a, b, c, k) for a, b, c in itertools.product((0, 1), repeat=3) for k in range(3)]
    logp = np.array([
        prior({"g": np.array(s[:3]), "z": np.array(s[3])})
        + lik({"g": np.array(s[:3]), "z": np.array(s[3])}) / temperature
        for s in states
    ])
    return states, np.exp(logp - special.logsumexp(logp))


def state_frequencies(idata, states, batches=20):
    """Visited-state frequencies and their batch-means standard errors."""
    post = posterior(idata)
    g = np.asarray(post["g"]).reshape(-1, 3)
    z = np.asarray(post["z"]).reshape(-1)
    code = {s: i for i, s in enumerate(states)}
    visits = np.array([code[(*map(int, gi), int(zi))] for gi, zi in zip(g, z, strict=True)])
    onehot = np.eye(len(states))[visits]
    means = onehot.reshape(batches, -1, len(states)).mean(axis=1)
    return onehot.mean(axis=0), means.std(axis=0, ddof=1) / np.sqrt(batches)


@pytest.mark.parametrize(
    ("test", "options"),
    [("barker", dict(batch_size=300)), ("austere", dict(batch_size=300, epsilon=0.01)),
     ("exact", {})],
)
def test_stationary_law_matches_enumeration(test, options):
    model = small_model()
    states, exact = exact_posterior(model, TEMPERATURE)
    with model:
        step = MinibatchGibbs(test=test, temperature=TEMPERATURE, **options)
        idata = pm.sample(draws=4000, tune=200, step=step, chains=1, **sample_kwargs(
            random_seed=5))
    freq, se = state_frequencies(idata, states)
    # Monte Carlo error: batch means, floored by the binomial error of T/10 independent
    # draws (a state never visited has a batch-means error of 0).
    floor = np.sqrt(exact * (1 - exact) / (freq.size and 400))
    z = np.abs(freq - exact) / np.maximum(se, floor)
    assert z.max() < 4.0, (test, np.round(freq, 3), np.round(exact, 3), z.round(1))
    assert 0.5 * np.abs(freq - exact).sum() < 0.06
    rows = np.asarray(sample_stats(idata)["rows_per_update"])
    if test == "exact":
        assert np.all(rows == 3000)
    else:
        assert rows.mean() < 3000  # the minibatch tests decide on part of the data


# ------------------------------------------------------------ stats and API
def test_stats_and_systematic_scan():
    model = small_model(n=500)
    with model:
        step = MinibatchGibbs(batch_size=100, order="systematic", temperature=20.0, **FAST)
        idata = pm.sample(draws=30, tune=0, step=step, chains=1, **sample_kwargs())
    ss = sample_stats(idata)
    assert np.all(np.asarray(ss["updates"]) == 4)
    assert np.all(np.asarray(ss["flips"]) <= 4)
    rows = np.asarray(ss["batch_size"])
    assert np.all(rows >= 4 * 100) and np.all(np.asarray(ss["max_batch_size"]) <= 500)
    np.testing.assert_allclose(np.asarray(ss["rows_per_update"]), rows / 4)
    assert np.all(np.isfinite(np.asarray(ss["epsilon"])))
    assert np.all(np.isnan(np.asarray(ss["p_value"])))
    assert ss["batch_size"].dtype == np.int64 and ss["nonfinite"].dtype == bool
    assert step.sampling_state.temperature == 20.0


def test_pickle_round_trip():
    model = small_model(n=300)
    with model:
        step = MinibatchGibbs(test="austere", batch_size=50, **FAST)
    clone = cloudpickle.loads(cloudpickle.dumps(step))
    clone._start_chain(np.random.default_rng(0))
    new_point, stats = clone.step(model.initial_point())
    assert set(new_point) == set(model.initial_point())
    assert stats[0]["updates"] == 4 and stats[0]["batch_size"] >= 200



# ------------------------------------------------------------ the shared base
def test_on_the_shared_base_stats_state_and_progress_bar():
    """The step's stats are the base's common ones plus its own; PyMC's hooks work."""
    model = spike_and_slab(n=300)
    with model:
        gibbs = MinibatchGibbs([model["gamma"]], batch_size=50, **FAST)
        barker = MinibatchBarker([model["beta"]], batch_size=50, S=np.full(3, 0.05), **FAST)
    assert isinstance(gibbs, MinibatchStepBase)
    assert set(gibbs.stats_dtypes_shapes) == (
        set(MinibatchStepBase.common_stats) | set(MinibatchGibbs.test_stats)
    )
    assert gibbs._state_class is MinibatchGibbsState
    state = vars(gibbs.sampling_state)
    assert {"tune", "temperature"} <= set(state) and not {"tuner", "scaling"} & set(state)
    # PyMC's progress bar asks every step of a compound for its columns and updates.
    columns, initial = pm.CompoundStep([gibbs, barker])._progressbar_config(2)
    assert len(columns) == 3 and set(initial) == {"mean_batch_size", "accept_rate", "scaling"}
    assert gibbs._progressbar_config(2) == ([], {})
    (update,) = gibbs._make_progressbar_update_functions()
    assert update({"flips": 1}) == {"flips": 1}


def nan_model():
    """The likelihood is NaN at g = 0: every update of g = 1 meets a non-finite ratio."""
    with pm.Model() as model:
        g = pm.Bernoulli("g", 0.5)
        pm.Normal("y", pm.math.log(g - 0.5), 1.0, observed=np.zeros(200))
    return model


def test_nonfinite_update_is_rejected_counted_and_warned_once_per_chain():
    with nan_model():
        step = MinibatchGibbs(batch_size=50, **FAST)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            idata = pm.sample(draws=20, tune=0, step=step, chains=2, cores=1,
                              initvals={"g": 1}, **sample_kwargs())
    ss = sample_stats(idata)
    assert np.all(np.asarray(ss["nonfinite"])) and np.all(np.asarray(ss["flips"]) == 0)
    assert np.all(np.asarray(posterior(idata)["g"]) == 1)
    ours = [str(w.message) for w in caught if "NaN or infinite" in str(w.message)]
    assert len(ours) == 2 and all("the update was rejected" in m for m in ours), ours
    assert all(m.startswith("MinibatchGibbs: ") for m in ours)

# ------------------------------------------------------------------ refusals
def test_refuses_continuous_and_unsupported_discrete_variables():
    rng = np.random.default_rng(4)
    with pm.Model():
        mu = pm.Normal("mu")
        k = pm.Poisson("k", 3.0)
        pm.Normal("y", mu + k, 1, observed=rng.normal(size=50))
        with pytest.raises(ModelNotSupportedError, match=r"continuous.*MinibatchBarker"):
            MinibatchGibbs([mu], **FAST)
        with pytest.raises(ModelNotSupportedError, match=r"Bernoulli and pm\.Categorical.*"
                                                          r"pm\.Metropolis"):
            MinibatchGibbs([k], **FAST)
        # The continuous steps still refuse discrete variables, and name MinibatchGibbs.
        with pytest.raises(ModelNotSupportedError, match="discrete.*MinibatchGibbs"):
            MinibatchBarker([mu, k], **FAST)
    with pm.Model():
        pm.Normal("y", pm.Normal("mu"), 1, observed=np.zeros(10))
        with pytest.raises(ModelNotSupportedError, match="no discrete free variables"):
            MinibatchGibbs(**FAST)


@pytest.mark.parametrize("kind", ["mean", "latent", "joint", "potential", "no_observed"])
def test_refuses_likelihoods_that_do_not_split(kind):
    rng = np.random.default_rng(5)
    n = 60
    with pm.Model():
        g = pm.Bernoulli("g", 0.5)
        xd = pm.Data("x", rng.normal(size=n))
        if kind == "mean":
            pm.Normal("y", g * (xd - xd.mean()), 1, observed=rng.normal(size=n))
            match = "cannot be split per observation"
        elif kind == "latent":
            zz = pm.Normal("zz", g, 1, shape=n)
            pm.Normal("y", zz, 1, observed=rng.normal(size=n))
            match = "per-observation latent"
        elif kind == "joint":
            pm.MvNormal("y", g * np.ones(n), np.eye(n), observed=rng.normal(size=n))
            match = "one joint term"
        elif kind == "potential":
            pm.Potential("extra", -0.5 * ((xd - g) ** 2).sum())
            pm.Normal("y", g + xd, 1, observed=rng.normal(size=n))
            match = "Potential 'extra'"
        else:
            pm.Potential("loglik", -0.5 * g)
            match = "no observed variables"
        with pytest.raises(ModelNotSupportedError, match=match):
            MinibatchGibbs([g], batch_size=5, **FAST)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(test="gibbs"), "test must be"),
        (dict(order="forward"), "order must be"),
        (dict(batch_size=0), "batch_size must be at least 1"),
        (dict(batch_size=2.0), "batch_size must be a positive integer"),
        (dict(epsilon=0.0), "epsilon must be in"),
        (dict(sigma=2.0), "sigma must be"),
        (dict(tolerance=1.5), "tolerance must be in"),
        (dict(early_decision=-1.0), "early_decision must be"),
        (dict(temperature=0.0), "temperature must be > 0"),
        (dict(temperature=float("nan")), "temperature must be a positive finite number"),
        (dict(prefetch=0), "prefetch must be a positive integer"),
    ],
)
def test_bad_parameters(kwargs, match):
    with pm.Model():
        g = pm.Bernoulli("g", 0.5)
        pm.Normal("y", g, 1, observed=np.zeros(10))
        with pytest.raises(ValueError, match=match):
            MinibatchGibbs(**kwargs, **FAST)


def test_batch_size_larger_than_n_and_wrong_model():
    with pm.Model() as m1:
        g = pm.Bernoulli("g", 0.5)
        pm.Normal("y", g, 1, observed=np.zeros(10))
        step = MinibatchGibbs(batch_size=20, **FAST)
        with pytest.raises(ValueError, match="larger than the number of observations"):
            pm.sample(draws=2, tune=0, step=step, chains=1, **sample_kwargs())
        other = MinibatchGibbs(batch_size=5, **FAST)
    with pm.Model() as m2:
        g = pm.Bernoulli("g", 0.5)
        pm.Normal("y", g, 1, observed=np.ones(10))
        with pytest.raises(ModelNotSupportedError, match=r"another model.*with model:"):
            other.step(m2.initial_point())
    assert m1 is not m2


# ------------------------------------------------------------------ compounds
def spike_and_slab(n=2000, d=3, seed=6):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    beta = np.array([1.0, 0.0, -0.7])[:d]
    y = (rng.random(n) < special.expit(x @ beta)).astype(int)
    with pm.Model() as model:
        gamma = pm.Bernoulli("gamma", 0.5, shape=d)
        beta_v = pm.Normal("beta", 0.0, 1.0, shape=d)
        pm.Bernoulli("y", logit_p=pm.math.dot(x, gamma * beta_v), observed=y)
    return model


@pytest.mark.parametrize("other", ["nuts", "barker"])
def test_compound_spike_and_slab(other):
    model = spike_and_slab()
    with model:
        gibbs = MinibatchGibbs([model["gamma"]], test="austere", batch_size=200)
        cont = (pm.NUTS([model["beta"]]) if other == "nuts" else
                MinibatchBarker([model["beta"]], batch_size=200, S=np.full(3, 0.02)))
        idata = pm.sample(draws=150, tune=100, step=[gibbs, cont], chains=1,
                          **sample_kwargs(random_seed=3))
    gamma = np.asarray(posterior(idata)["gamma"]).reshape(-1, 3)
    assert set(np.unique(gamma)) <= {0, 1}
    inclusion = gamma[50:].mean(axis=0)
    assert inclusion[0] > 0.9 and inclusion[2] > 0.9  # the two real effects
    ss = sample_stats(idata)
    assert "flips" in ss and "rows_per_update" in ss
    assert np.asarray(ss["rows_per_update"]).mean() < 2000


def test_compound_multiprocess_cores_two():
    model = spike_and_slab(n=500)
    with model:
        gibbs = MinibatchGibbs([model["gamma"]], batch_size=100, **FAST)
        # tune=False: a tuned MinibatchBarker carries its tuning from one sequential chain
        # to the next (cores=1), so only untuned runs are draw-for-draw comparable.
        barker = MinibatchBarker([model["beta"]], batch_size=100, S=np.full(3, 0.05),
                                 tune=False, **FAST)
        kw = sample_kwargs()
        one = pm.sample(draws=20, tune=5, step=[gibbs, barker], chains=2, cores=1, **kw)
        two = pm.sample(draws=20, tune=5, step=[gibbs, barker], chains=2, cores=2,
                        mp_ctx="fork", **kw)
    np.testing.assert_array_equal(np.asarray(posterior(one)["gamma"]),
                                  np.asarray(posterior(two)["gamma"]))
    np.testing.assert_array_equal(np.asarray(sample_stats(one)["flips"]),
                                  np.asarray(sample_stats(two)["flips"]))
