"""The row store owns the data: ``pm.set_data`` reaches every step method at every size.

The bug this guards against: with observed data above 1 GiB, a step built before
``pm.set_data`` sampled the posterior of the *old* data (shorter new data) or crashed
(longer new data), because the per-step function read its own copy of the build-time
arrays. Now the data exist only in the model, the row store reads them at every chain
start, and the compiled functions take the rows as inputs: there is no size threshold and
no copy. These tests change the data to shorter and longer arrays and check the posterior
follows them (the slow variant with a real array above 1 GiB).
"""

from __future__ import annotations

import math

import numpy as np
import pymc as pm
import pytest
from conftest import sample_kwargs

from pymc_minibatch_mh import AustereMH, ExactMH, MHSubLhd, MinibatchBarker
from pymc_minibatch_mh.errors import ModelNotSupportedError
from pymc_minibatch_mh.model.compat import mcse, posterior, sample_stats
from pymc_minibatch_mh.store.row_store import FULL_PASS_CHUNK, RowStore, pass_rows


def normal_mean_model(y):
    with pm.Model() as model:
        yd = pm.Data("y_obs", y)
        mu = pm.Normal("mu", 0.0, 10.0)
        pm.Normal("y", mu, 1.0, observed=yd)
    return model


def posterior_of_mu(y, temperature):
    """Exact posterior mean and sd of μ for data y at temperature K."""
    precision = 1.0 / 100.0 + y.size / temperature
    return (y.sum() / temperature) / precision, 1.0 / math.sqrt(precision)


def sample_mu(model, step, draws=1500, tune=500, seed=4):
    with model:
        idata = pm.sample(draws=draws, tune=tune, step=step, chains=1,
                          **sample_kwargs(random_seed=seed))
    return np.asarray(posterior(idata)["mu"]).ravel(), sample_stats(idata)


@pytest.mark.parametrize(
    "step_class", [MinibatchBarker, AustereMH, MHSubLhd, ExactMH],
    ids=["barker", "austere", "mhsublhd", "exact"],
)
@pytest.mark.parametrize("new_n", [600, 9000], ids=["shorter", "longer"])
def test_set_data_after_building_the_step_is_sampled(step_class, new_n):
    """Build on data with mean 0, set data with mean 3: the chain samples the new posterior."""
    rng = np.random.default_rng(1)
    old = rng.normal(0.0, 1.0, size=3000)
    new = rng.normal(3.0, 1.0, size=new_n)
    model = normal_mean_model(old)
    temperature = new_n / 50.0  # the posterior of 50 effective rows: sd about 0.14
    kwargs = {} if step_class is ExactMH else {"batch_size": 100}
    with model:
        step = step_class(temperature=temperature, S=[0.1], **kwargs)
        pm.set_data({"y_obs": new})
    draws, ss = sample_mu(model, step)
    mean, sd = posterior_of_mu(new, temperature)
    assert step._n_rows == new_n
    assert int(np.asarray(ss["batch_size"]).max()) <= new_n
    # Within 5 MCSE plus the approximate tests' own error (well below 0.2 sd here); the
    # old data's posterior (mean 0) is more than 20 sd away.
    assert abs(draws.mean() - mean) < 5 * mcse(draws) + 0.2 * sd, (draws.mean(), mean)


def test_store_reads_the_data_at_every_chain_start_and_checks_lengths():
    rng = np.random.default_rng(2)
    with pm.Model() as model:
        xd = pm.Data("x", rng.normal(size=500))
        yd = pm.Data("y_obs", rng.normal(size=500))
        b = pm.Normal("b")
        pm.Normal("y", b * xd, 1.0, observed=yd)
        step = MinibatchBarker(batch_size=50, temperature=10.0, S=[0.1])
    store = step.likelihood.store
    assert isinstance(store, RowStore) and store.n_rows == 500
    for n in (50, 200, 2 * FULL_PASS_CHUNK + 7):  # every size, chunked passes included
        x, y = rng.normal(size=n), rng.normal(size=n)
        with model:
            pm.set_data({"x": x, "y_obs": y})
        step._start_chain(np.random.default_rng(0))
        assert store.n_rows == n
        point = {"b": np.array(0.7)}
        expected = model.compile_logp(vars=model.observed_RVs)(point)
        got = step.likelihood.full_loglik(np.array([0.7])).sum()
        assert got == pytest.approx(expected, rel=1e-10)
        chunks = list(store.chunks())
        assert sum(c[0].shape[0] for c in chunks) == n
        assert all(c[0].base is not None or c[0] is store.arrays[0] for c in chunks)
    with model:
        pm.set_data({"x": rng.normal(size=40)})  # y_obs keeps 2·2^18 + 7 rows
    with pytest.raises(ModelNotSupportedError, match="different numbers of rows"):
        step._start_chain(np.random.default_rng(0))


def test_pass_rows_keep_a_call_near_two_mebibytes_of_float64():
    assert pass_rows([np.empty((7, 100), np.float32), np.empty(7, np.int64)]) == 2048
    assert pass_rows([np.empty(7)]) == FULL_PASS_CHUNK  # narrow rows: the read block
    assert pass_rows([np.empty((7, 10**5), np.float32)]) == 1024  # wide rows: the floor


def test_full_pass_of_wide_rows_in_calls_of_pass_rows():
    """A pass over wide float32 rows: calls of 1,024 rows, the last one shorter, every row
    once and in order, views of the model's arrays; the sum is the model's own."""
    rng = np.random.default_rng(5)
    n, d = 3 * 1024 + 5, 300
    x = rng.normal(size=(n, d)).astype(np.float32)
    y = rng.integers(0, 2, size=n)
    with pm.Model() as model:
        b = pm.Normal("b", 0.0, 1.0, shape=d)
        pm.Bernoulli("y", logit_p=pm.math.dot(x, b) / 30.0, observed=y)
        step = MinibatchBarker(batch_size=50)
    store = step.likelihood.store
    (i,) = [k for k, a in enumerate(store.arrays) if a.dtype == np.float32]
    chunks = list(store.chunks())
    assert [c[i].shape[0] for c in chunks] == [1024, 1024, 1024, 5]
    assert all(np.shares_memory(c[i], x) for c in chunks)
    np.testing.assert_array_equal(np.concatenate([c[i] for c in chunks]), x)
    point = {"b": np.linspace(-1.0, 1.0, d)}
    expected = model.compile_logp(vars=model.observed_RVs)(point)
    got = step.likelihood.full_loglik(point["b"]).sum()
    assert got == pytest.approx(expected, rel=1e-12)


@pytest.mark.slow
@pytest.mark.newest_line
@pytest.mark.parametrize("new_n", [1_000_000, 160_000_000], ids=["shorter", "longer"])
def test_set_data_above_one_gibibyte(new_n):
    """The reported case: observed data of 1.1 GiB, then pm.set_data with new data."""
    n_old = 150_000_000  # 1.2 GB of float64
    old = np.zeros(n_old)
    model = normal_mean_model(old)
    with model:
        step = MinibatchBarker(batch_size=500, temperature=new_n / 100.0, S=[0.1],
                               check_start=False, control_variate=None)
    del old
    new = np.random.default_rng(3).normal(3.0, 1.0, size=new_n)
    with model:
        pm.set_data({"y_obs": new})
    draws, _ = sample_mu(model, step, draws=600, tune=300)
    mean, sd = posterior_of_mu(new, new_n / 100.0)
    assert step._n_rows == new_n
    assert abs(draws.mean() - mean) < 5 * mcse(draws) + 0.2 * sd, (draws.mean(), mean)
