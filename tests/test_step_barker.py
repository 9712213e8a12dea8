"""PyMC integration tests of MinibatchBarker: stats, chains, processes, compound steps, errors."""

from __future__ import annotations

import math
import pickle

import cloudpickle
import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest
from conftest import sample_kwargs

from pymc_minibatch_mh import MinibatchBarker
from pymc_minibatch_mh.errors import ModelNotSupportedError
from pymc_minibatch_mh.model.compat import mcse, posterior, sample_stats

EXPECTED_STATS = {
    "accepted": np.float64,
    "accept": np.float64,
    "batch_size": np.int64,
    "epsilon": np.float64,
    "edgeworth": np.float64,
    "delta_star": np.float64,
    "delta_variance": np.float64,
    "growth_rounds": np.int64,
    "full_data": np.bool_,
    "early_decision": np.bool_,
    "nonfinite": np.bool_,
    "extra_evaluations": np.int64,
    "scaling": np.float64,
    "temperature": np.float64,
    # "tune" is declared too (same dtype as NUTS) but PyMC drops it from sample_stats.
}


def regression_model(n=2000, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    y = 1.0 + 2.0 * x + rng.normal(size=n)
    with pm.Model() as model:
        xd = pm.Data("x", x)
        a = pm.Normal("a", 0, 5)
        b = pm.Normal("b", 0, 5)
        s = pm.HalfNormal("s", 2)
        pm.Normal("y", a + b * xd, s, observed=y)
    return model


@pytest.fixture(scope="module")
def reg_model():
    return regression_model()


@pytest.fixture(scope="module")
def reg_step(reg_model):
    with reg_model:
        return MinibatchBarker(batch_size=50, temperature=20.0, S=[0.02, 0.02, 0.02], tune=False)


def draws_of(idata):
    post = posterior(idata)
    return {k: np.asarray(v) for k, v in post.items()}


def test_stats_names_dtypes_and_values(reg_model, reg_step):
    with reg_model:
        idata = pm.sample(draws=200, tune=50, step=reg_step, chains=2, cores=1, **sample_kwargs())
    ss = sample_stats(idata)
    for name, dtype in EXPECTED_STATS.items():
        assert name in ss, name
        assert ss[name].dtype == dtype, (name, ss[name].dtype)
        assert ss[name].shape == (2, 200)
    # Stats the settings would leave constant are not recorded (each costs time per draw):
    # the audit's (no audit_every), the proposal's (random walk), the skew test's.
    for name in ("audited", "audit_error", "proposal", "rho", "step_size", "skew",
                 "skew_fallback"):
        assert name not in ss, name
    bs = np.asarray(ss["batch_size"])
    assert bs.min() >= 50 and bs.max() <= 2000
    assert np.all(bs % 50 == 0)
    assert np.all(np.asarray(ss["growth_rounds"]) == bs // 50)
    assert np.all(np.asarray(ss["delta_variance"])[~np.asarray(ss["full_data"])] < 1.0)
    assert np.all(np.asarray(ss["extra_evaluations"]) == 0)
    assert np.all(np.asarray(ss["temperature"]) == 20.0)
    assert set(np.unique(ss["accepted"])) <= {0.0, 1.0}
    assert 0.05 < float(ss["accepted"].mean()) < 0.95
    assert np.all(np.asarray(ss["epsilon"]) > 0)


def test_same_seed_same_draws_and_instance_reuse(reg_model, reg_step):
    with reg_model:
        a = pm.sample(draws=100, tune=20, step=reg_step, chains=2, cores=1, **sample_kwargs())
        b = pm.sample(draws=100, tune=20, step=reg_step, chains=2, cores=1, **sample_kwargs())
        c = pm.sample(
            draws=100, tune=20, step=reg_step, chains=2, cores=1, **sample_kwargs(random_seed=2)
        )
    for k, v in draws_of(a).items():
        np.testing.assert_array_equal(v, draws_of(b)[k])
        assert not np.array_equal(v, draws_of(c)[k])
    # Chains differ from each other (state is not shared between chains).
    assert not np.array_equal(draws_of(a)["a"][0], draws_of(a)["a"][1])
    np.testing.assert_array_equal(sample_stats(a)["batch_size"], sample_stats(b)["batch_size"])


@pytest.mark.parametrize("mp_ctx", ["fork", "spawn"])
def test_cores_one_equals_cores_two(reg_model, reg_step, mp_ctx):
    with reg_model:
        one = pm.sample(draws=100, tune=20, step=reg_step, chains=2, cores=1, **sample_kwargs())
        two = pm.sample(
            draws=100, tune=20, step=reg_step, chains=2, cores=2, mp_ctx=mp_ctx, **sample_kwargs()
        )
    for k, v in draws_of(one).items():
        np.testing.assert_array_equal(v, draws_of(two)[k])
    np.testing.assert_array_equal(sample_stats(one)["batch_size"], sample_stats(two)["batch_size"])


def test_tuning_changes_scaling_then_freezes(reg_model):
    with reg_model:
        step = MinibatchBarker(batch_size=50, temperature=20.0, S=[0.02] * 3, scaling=0.01)
        idata = pm.sample(
            draws=100, tune=300, step=step, chains=1, discard_tuned_samples=False, **sample_kwargs()
        )
    ss = sample_stats(idata)
    wu = idata["warmup_sample_stats"] if "warmup_sample_stats" in idata else None
    assert wu is not None
    post_scaling = np.asarray(ss["scaling"])[0]
    assert np.all(post_scaling == post_scaling[0])
    assert post_scaling[0] > 0.05  # grew from 0.01 towards the target acceptance


def test_pickle_round_trip(reg_step):
    # PyMC models (and so every PyMC step method, pm.Metropolis included) pickle with
    # cloudpickle, which is what pm.sample uses to send steps to worker processes.
    clone = pickle.loads(cloudpickle.dumps(reg_step))
    assert clone.batch_size == reg_step.batch_size
    assert clone.correction.error == reg_step.correction.error
    point = reg_step.model.initial_point()
    clone._start_chain(np.random.default_rng(0))
    new_point, stats = clone.step(point)
    assert set(new_point) == set(point)
    assert stats[0]["batch_size"] >= 50


def test_compound_with_nuts_and_metropolis():
    model = regression_model(n=1000, seed=3)
    with model:
        step = MinibatchBarker([model["a"], model["b"]], batch_size=50, temperature=10.0,
                               S=[0.03, 0.03], tune=False)
        idata = pm.sample(draws=100, tune=50, step=[step], chains=1, **sample_kwargs())
        ss = sample_stats(idata)
        assert "batch_size" in ss and "diverging" in ss
        step2 = MinibatchBarker([model["a"], model["b"]], batch_size=50, temperature=10.0,
                                S=[0.03, 0.03], tune=False)
        idata2 = pm.sample(
            draws=100, tune=50, step=[step2, pm.Metropolis([model["s"]])], chains=1,
            **sample_kwargs()
        )
    ss2 = sample_stats(idata2)
    assert "batch_size" in ss2 and "scaling" in ss2 and "accepted" in ss2
    assert np.all(np.isfinite(draws_of(idata2)["s"]))


# ------------------------------------------------------------------ errors
def test_error_discrete_variable():
    with pm.Model():
        k = pm.Poisson("k", 3)
        mu = pm.Normal("mu")
        pm.Normal("y", mu + k, 1, observed=np.zeros(10))
        with pytest.raises(ModelNotSupportedError, match="discrete"):
            MinibatchBarker()


def test_error_joint_likelihood():
    with pm.Model():
        mu = pm.Normal("mu")
        pm.MvNormal("y", mu * np.ones(5), np.eye(5), observed=np.zeros(5))
        with pytest.raises(ModelNotSupportedError, match="cannot be split per observation"):
            MinibatchBarker()


def test_error_lengths_disagree():
    with pm.Model():
        mu = pm.Normal("mu")
        pm.Normal("y1", mu, 1, observed=np.zeros(10))
        pm.Normal("y2", mu, 1, observed=np.zeros(12))
        with pytest.raises(ModelNotSupportedError, match="different numbers of rows"):
            MinibatchBarker()


def test_error_covariate_length_changed_by_set_data():
    model = regression_model(n=100)
    with model:
        step = MinibatchBarker(batch_size=10, tune=False)
        pm.set_data({"x": np.zeros(90)})
        with pytest.raises(ModelNotSupportedError, match="different numbers of rows"):
            pm.sample(draws=10, tune=0, step=step, chains=1, **sample_kwargs())


def test_error_minibatch_and_total_size():
    data = np.zeros(100)
    with pm.Model():
        mu = pm.Normal("mu")
        mb = pm.Minibatch(data, batch_size=10)
        pm.Normal("y", mu, 1, observed=mb, total_size=100)
        with pytest.raises(ModelNotSupportedError, match="Minibatch or total_size"):
            MinibatchBarker()
    with pm.Model():
        mu = pm.Normal("mu")
        pm.Normal("y", mu, 1, observed=data, total_size=1000)
        with pytest.raises(ModelNotSupportedError, match="Minibatch or total_size"):
            MinibatchBarker()


def test_error_no_observed():
    with pm.Model():
        pm.Normal("mu")
        with pytest.raises(ModelNotSupportedError, match="no observed variables"):
            MinibatchBarker()


def test_error_nonfinite_start():
    with pm.Model():
        mu = pm.Normal("mu")
        s = pm.HalfNormal("s")
        pm.Uniform("y", mu - s, mu + s, observed=np.linspace(-3, 3, 100))
        step = MinibatchBarker(control_variate=None, batch_size=10, tune=False)
        with pytest.raises(ModelNotSupportedError, match="not finite at the start point"):
            pm.sample(draws=10, tune=0, step=step, chains=1, **sample_kwargs())
        with pytest.raises(ModelNotSupportedError, match="not finite at the start point"):
            MinibatchBarker(batch_size=10, tune=False)  # the set-up's MAP search starts there


def test_error_not_split_by_rows():
    rng = np.random.default_rng(0)
    x = rng.normal(size=200)
    with pm.Model():
        xd = pm.Data("x", x)
        mu = pm.Normal("mu")
        pm.Normal("y", mu + (xd - xd.mean()), 1, observed=np.zeros(200))
        with pytest.raises(ModelNotSupportedError, match="cannot be split per observation"):
            MinibatchBarker()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(batch_size=0), "batch_size"),
        (dict(batch_size=2.5), "batch_size"),
        (dict(sigma=0.0), "sigma"),
        (dict(sigma=2.0), "sigma"),
        (dict(temperature=0.0), "temperature"),
        (dict(temperature=-1.0), "temperature"),
        (dict(tolerance=1.5), "tolerance"),
        (dict(acceptance="metropolis"), "acceptance must be"),
        (dict(acceptance="penalty", sigma=-1.0), "sigma must be a positive"),
        (dict(acceptance="penalty", skew_correction=True), "skew_correction"),
    ],
)
def test_error_bad_parameters(kwargs, match):
    with pm.Model():
        mu = pm.Normal("mu")
        pm.Normal("y", mu, 1, observed=np.zeros(10))
        with pytest.raises(ValueError, match=match):
            MinibatchBarker(**kwargs)


def test_error_batch_larger_than_data():
    with pm.Model():
        mu = pm.Normal("mu")
        pm.Normal("y", mu, 1, observed=np.zeros(10))
        step = MinibatchBarker(batch_size=20)
        with pytest.raises(ValueError, match="larger than the number of observations"):
            pm.sample(draws=10, tune=0, step=step, chains=1, **sample_kwargs())


# --------------------------------------------------------- model structure
def test_mixture_multicolumn_and_dims():
    rng = np.random.default_rng(5)
    n = 500
    with pm.Model(coords={"obs": np.arange(n), "col": [0, 1]}):
        th = pm.Normal("theta", 0, 3, shape=2)
        pm.NormalMixture(
            "x", w=[0.5, 0.5], mu=pt.stack([th[0], th[0] + th[1]]), sigma=1.0,
            observed=rng.normal(size=n), dims="obs",
        )
        pm.Normal("z", th[0], 1, observed=rng.normal(size=(n, 2)), dims=("obs", "col"))
        step = MinibatchBarker(batch_size=25, temperature=50.0, S=[0.05, 0.05], tune=False)
        idata = pm.sample(draws=50, tune=0, step=step, chains=1, **sample_kwargs())
    assert sample_stats(idata)["batch_size"].min() >= 25


def test_set_data_new_length_is_used():
    """Data replaced with pm.set_data (new N) is used by the next run, no stale function."""
    with pm.Model() as m2:
        xd = pm.Data("x", np.zeros(300))
        yd = pm.Data("y_obs", np.zeros(300))
        a = pm.Normal("a")
        pm.Normal("y", a + xd, 1, observed=yd)
        step = MinibatchBarker(batch_size=100, temperature=5.0, S=[0.01], tune=False)
        pm.set_data({"x": np.zeros(1000), "y_obs": np.ones(1000)})
        idata = pm.sample(draws=50, tune=0, step=step, chains=1, **sample_kwargs())
    assert step._n_rows == 1000
    assert sample_stats(idata)["batch_size"].max() <= 1000
    # The compiled function sees the new data: its row sum is the model's log-likelihood.
    point = {"a": np.array(0.3)}
    expected = m2.compile_logp(vars=m2.observed_RVs)(point)
    got = step.likelihood.full_loglik(step.likelihood.point_map.to_flat(point)).sum()
    assert got == pytest.approx(expected, rel=1e-10)


def test_prefetch_changes_cost_not_the_law(reg_model):
    """Rows evaluated ahead of need take no part in the decision, but they are drawn from
    the chain's generator: another prefetch setting draws other random rows. The law is
    the same (batch sizes and acceptance agree within Monte Carlo error), and one setting
    with one seed gives identical draws."""
    results = []
    for prefetch in (1, 4, "auto", 4):
        with reg_model:
            step = MinibatchBarker(batch_size=20, temperature=5.0, S=[0.02] * 3, tune=False,
                                   prefetch=prefetch)
            idata = pm.sample(draws=600, tune=0, step=step, chains=1, **sample_kwargs())
        results.append((draws_of(idata), sample_stats(idata)))
    assert float(results[0][1]["growth_rounds"].mean()) > 1.5  # growth actually happens
    for k, v in results[3][0].items():
        np.testing.assert_array_equal(v, results[1][0][k])
    sizes = [np.asarray(ss["batch_size"], dtype=float).ravel() for _, ss in results[:3]]
    accepted = [np.asarray(ss["accepted"], dtype=float).ravel() for _, ss in results[:3]]
    for a, b in ((0, 1), (0, 2)):
        for x, y in ((sizes[a], sizes[b]), (accepted[a], accepted[b])):
            z = abs(x.mean() - y.mean()) / math.hypot(mcse(x), mcse(y))
            assert z < 4, (a, b, x.mean(), y.mean(), z)


def test_progress_stats_are_running_means(reg_model, reg_step):
    with reg_model:
        idata = pm.sample(draws=150, tune=0, step=reg_step, chains=2, **sample_kwargs())
    ss = sample_stats(idata)
    bs = np.asarray(ss["batch_size"], dtype=float)
    running = np.cumsum(bs, axis=1) / np.arange(1, bs.shape[1] + 1)
    np.testing.assert_allclose(np.asarray(ss["mean_batch_size"]), running)
    acc = np.cumsum(np.asarray(ss["accepted"]), axis=1) / np.arange(1, bs.shape[1] + 1)
    np.testing.assert_allclose(np.asarray(ss["accept_rate"]), acc)
    # PyMC calls the hooks on the step: the third column is what its proposal tuned
    columns, stats = reg_step._progressbar_config(2)
    (update,) = reg_step._make_progressbar_update_functions()
    shown = update({k: np.asarray(ss[k])[0, -1] for k in ss})
    assert set(stats) <= set(shown) and len(columns) == 3


def test_error_step_from_another_model(reg_step):
    other = regression_model(n=500, seed=9)  # same variable names, other data
    with other:
        # PyMC refuses the foreign value variables itself, before sampling.
        with pytest.raises(ValueError, match="not a value variable in the model"):
            pm.sample(draws=10, tune=0, step=reg_step, chains=1, **sample_kwargs())
        # Used directly, the step refuses a point from another model's context.
        clone = pickle.loads(cloudpickle.dumps(reg_step))
        clone._start_chain(np.random.default_rng(0))
        with pytest.raises(ModelNotSupportedError, match="built for another model"):
            clone.step(other.initial_point())
    clone._start_chain(np.random.default_rng(0))
    with pytest.raises(ModelNotSupportedError, match="missing or have other shapes"):
        clone.step({"a": np.zeros(3), "b": 0.0, "s_log__": 0.0})


def test_temperature_schedule(reg_model):
    from pymc_minibatch_mh import TemperatureSchedule

    schedule = TemperatureSchedule([(0, 100.0), (30, 2.0, 0.1)])
    with reg_model:
        step = MinibatchBarker(batch_size=50, temperature=schedule, S=[0.02] * 3, tune=False)
        idata = pm.sample(draws=40, tune=10, step=step, chains=2, discard_tuned_samples=False,
                          **sample_kwargs())
    temps = np.concatenate(
        [np.asarray(idata["warmup_sample_stats"]["temperature"]),
         np.asarray(sample_stats(idata)["temperature"])], axis=1)
    scal = np.concatenate(
        [np.asarray(idata["warmup_sample_stats"]["scaling"]),
         np.asarray(sample_stats(idata)["scaling"])], axis=1)
    assert np.all(temps[:, :30] == 100.0) and np.all(temps[:, 30:] == 2.0)
    np.testing.assert_allclose(scal[:, 30:], 0.1 * scal[:, :30].mean())
    with pytest.raises(ValueError, match="start at iteration 0"):
        TemperatureSchedule([(5, 1.0)])
    with pytest.raises(ValueError, match="positive"):
        TemperatureSchedule([(0, -1.0)])
