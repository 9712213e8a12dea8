"""A step with control variates follows ``pm.set_data``.

After the data change (``pm.set_data``, or a changed ``data=`` store: .npy, Zarr, Parquet,
Dask), the next chain start repeats the set-up that belongs to the data: the MAP search
(or the pass at the user's reference), the full-data sums at θ̂, the exact set of the
per-row-quantity expansion, the surrogate posterior and the proposal built on them. The
strongest check of the result: with the same seed, the followed step gives the very draws
of a step built afresh on the new data, for shorter and longer data (N smaller and larger
than at build). The set-up is repeated once per change (logged once, counted once in
``setup_passes``), shared by the chains of one ``pm.sample`` and by worker processes
(cores=1 and cores=2 give the same draws), and not repeated while the data stay the same.
"""

from __future__ import annotations

import logging
import os
import pickle
import warnings

import cloudpickle
import numpy as np
import pymc as pm
import pytest
from conftest import sample_kwargs
from scipy.special import expit
from test_out_of_core import D, _rewrite, logistic_data, logistic_model, write_store

from pymc_minibatch_mh import MinibatchBarker
from pymc_minibatch_mh.errors import ControlVariateError
from pymc_minibatch_mh.model.compat import posterior
from pymc_minibatch_mh.proposals.crank_nicolson import CrankNicolsonProposal

N_OLD = 2000
SIZES = {"shorter": 600, "longer": 5000}
REPEATED = "set-up repeated on the new data"


def normal_data(n, seed, mean, sd):
    return np.random.default_rng(seed).normal(mean, sd, size=n)


def normal_model(y):
    with pm.Model() as model:
        yd = pm.Data("y_obs", y)
        mu = pm.Normal("mu", 0.0, 10.0)
        sigma = pm.HalfNormal("sigma", 5.0)
        pm.Normal("y", mu, sigma, observed=yd)
    return model


def draws_of(model, step, *, chains=1, cores=1, draws=150, tune=50, seed=7, **kwargs):
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # few draws: PyMC's small-sample notes
        # The burn-in from PyMC's start point of the random walk reads many rows: not the
        # subject here.
        warnings.filterwarnings("ignore", "MinibatchBarker: the acceptance test read",
                                RuntimeWarning)
        idata = pm.sample(draws=draws, tune=tune, step=step, chains=chains, cores=cores,
                          **sample_kwargs(random_seed=seed), **kwargs)
    return {name: np.asarray(values) for name, values in posterior(idata).items()}


def assert_same_draws(a, b):
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def repeated_lines(caplog):
    return [r for r in caplog.records
            if r.name == "pymc_minibatch_mh" and REPEATED in r.getMessage()]


#: Control-variate settings: the expansion (θ-space or chosen), the proposal built on the
#: set-up (Crank–Nicolson and MALA around the Laplace fit, the random walk with its
#: covariance), a user's reference point (its pass repeated) and re-centring.
SETTINGS = {
    "taylor": dict(control_variate="taylor"),
    # m sized by the error budget: its pilot measured again on the new data.
    "taylor_auto_rows": dict(control_variate="taylor", batch_size="auto"),
    "theta_laplace_walk": dict(control_variate="taylor_theta", proposal="random_walk",
                               S="laplace", scaling=0.8),
    "reference_mala_recenter": dict(control_variate="taylor", proposal="mala",
                                    reference={"mu": 0.5, "sigma": 1.0}, recenter=0.5),
}


@pytest.mark.parametrize("name", SETTINGS)
def test_followed_step_draws_equal_a_fresh_step(name, caplog):
    """Sample; pm.set_data to N = 600, then to N = 5,000 (from 2,000; another mean and sd),
    sampling after each: the draws are those of a step built on the new data, and each
    change repeated the set-up once."""
    old = normal_data(N_OLD, 1, 0.0, 1.0)
    model = normal_model(old)
    settings = {"batch_size": 50, **SETTINGS[name]}
    with model:
        step = MinibatchBarker(**settings)
    passes, pilot_rows = step.setup_passes, getattr(step, "pilot_rows", 0)
    draws_of(model, step, draws=50)  # a run on the old data: its states and caches
    for changes, (size, new_n) in enumerate(SIZES.items(), start=1):
        new = normal_data(new_n, 1 + changes, 1.5, 2.0)
        with model:
            pm.set_data({"y_obs": new})
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="pymc_minibatch_mh"):
            followed = draws_of(model, step)
        fresh_model = normal_model(new)
        with fresh_model:
            fresh = MinibatchBarker(**settings)
        assert_same_draws(followed, draws_of(fresh_model, fresh))
        # The new posterior (mean 1.5), not the old one (mean 0): 18 sd apart at N = 600.
        assert abs(followed["mu"].mean() - new.mean()) < 0.5, size
        assert len(repeated_lines(caplog)) == 1, size
        assert step.control_variate.setups == 1 + changes
        np.testing.assert_array_equal(step.control_variate.reference.theta,
                                      fresh.control_variate.reference.theta)
        passes += fresh.setup_passes
        assert step.setup_passes == pytest.approx(passes)
        if settings["batch_size"] == "auto":  # the pilot measured on the new data
            pilot_rows += fresh.pilot_rows
            assert step.pilot_rows == pilot_rows and fresh.pilot_rows > 0
        assert step._n_rows == new_n == step.likelihood.store.n_rows


@pytest.mark.parametrize("batch_size", [50, "auto"])
def test_set_up_once_per_change_shared_by_chains_and_processes(caplog, batch_size):
    """Two chains, in one process and in two: one repeated set-up, made in this process
    before the workers start; the same draws; nothing repeated while the data stay.
    With ``batch_size="auto"`` the error budget's pilot, measured again on the new data
    (in each worker with cores=2), is deterministic: the draws agree."""
    old, new = normal_data(N_OLD, 3, 0.0, 1.0), normal_data(900, 4, -2.0, 1.5)
    runs = {}
    for cores in (1, 2):
        model = normal_model(old)
        with model:
            step = MinibatchBarker(batch_size=batch_size, control_variate="taylor")
            pm.set_data({"y_obs": new})
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="pymc_minibatch_mh"):
            runs[cores] = draws_of(model, step, chains=2, cores=cores, mp_ctx="fork")
        assert len(repeated_lines(caplog)) == 1, cores
        assert step.control_variate.setups == 2, cores  # made here, not in the workers
        passes = step.setup_passes
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="pymc_minibatch_mh"):
            again = draws_of(model, step, chains=2, cores=cores, mp_ctx="fork")
        assert not repeated_lines(caplog)
        assert step.control_variate.setups == 2 and step.setup_passes == passes
        assert_same_draws(again, runs[cores])
    assert not np.array_equal(runs[1]["mu"][0], runs[1]["mu"][1])  # the chains differ
    assert_same_draws(runs[1], runs[2])


def test_pickling_for_spawned_workers_carries_the_new_set_up():
    """pm.sample pickles the step for "spawn"/"forkserver" workers before anything else:
    the set-up is repeated then, in this process, and the copy has nothing left to do."""
    model = normal_model(normal_data(N_OLD, 5, 0.0, 1.0))
    with model:
        step = MinibatchBarker(batch_size=50, control_variate="taylor")
        pm.set_data({"y_obs": normal_data(800, 6, 1.0, 1.0)})
    copy = pickle.loads(cloudpickle.dumps(step))
    assert step.control_variate.setups == 2
    np.testing.assert_array_equal(copy.control_variate.reference.theta,
                                  step.control_variate.reference.theta)
    copy._start_chain(np.random.default_rng(0))
    assert copy.control_variate.setups == 2 and copy._n_rows == 800


# ------------------------------------------------------- per-row quantities, the set
def grouped_model(n, seed):
    """Random intercepts (as in test_shifted_set.py, one factor) with every per-row array in
    pm.Data; the factor has 10 large levels and 15 small ones (the set's)."""
    rng = np.random.default_rng(seed)
    small = np.repeat(np.arange(10, 25), np.arange(1, 16))
    g = rng.permutation(np.concatenate([rng.integers(10, size=n - small.size), small]))
    x = rng.normal(size=n)
    y = (rng.random(n) < expit(-0.3 + 0.8 * rng.normal(size=25)[g] + 0.5 * x)).astype(np.int64)
    data = {"g": g, "x": x, "y_obs": y}
    with pm.Model() as model:
        gd, xd, yd = pm.Data("g", g), pm.Data("x", x), pm.Data("y_obs", y)
        mu = pm.Normal("mu", 0.0, 2.5)
        s = pm.HalfNormal("s", 1.0)
        z = pm.Normal("z", 0.0, 1.0, shape=25)
        b = pm.Normal("b", 0.0, 1.0)
        pm.Bernoulli("y", logit_p=mu + s * z[gd] + b * xd, observed=yd)
    return model, data


def test_per_row_quantity_expansion_selects_its_set_again():
    """The set's slots and tables are shared variables of the per-step function and of
    the surrogate posterior: on new data (N = 1,000, then 4,500, from 3,000) the set is
    selected again at the new θ̂ and its tables built (MALA follows the surrogate's
    gradient, the tables included); the draws equal a fresh step's."""
    model, _ = grouped_model(3000, 5)
    settings = dict(batch_size=100, control_variate="taylor_predictor", proposal="mala")
    with model:
        step = MinibatchBarker(**settings)
    cv = step.control_variate
    positions = [cv.set_positions.copy()]
    for seed, new_n in ((8, 1000), (9, 4500)):
        fresh_model, data = grouped_model(new_n, seed)
        with model:
            pm.set_data(data)
        followed = draws_of(model, step, draws=40, tune=10)
        with fresh_model:
            fresh = MinibatchBarker(**settings)
        assert_same_draws(followed, draws_of(fresh_model, fresh, draws=40, tune=10))
        np.testing.assert_array_equal(cv.set_positions,
                                      fresh.control_variate.set_positions)
        assert cv.set_rows > 0 and cv.setups == len(positions) + 1
        positions.append(cv.set_positions.copy())
    # 10 % of N at most: the shorter data's set is smaller, the longer one's the same size.
    assert [p.size for p in positions] == [120, 93, 120]
    assert not np.array_equal(positions[0], positions[2])


# --------------------------------------------------------------------- out-of-core
def rewrite_store(kind, arrays, x, y, folder):
    """Change the data of a ``data=`` store of ``kind`` in place, the way a user would."""
    if kind == "npy":
        _rewrite(folder / "X.npy", x)
        _rewrite(folder / "y.npy", y)
    elif kind == "zarr":  # the same zarr arrays, resized and written
        for name, a in (("X", x), ("y", y)):
            arrays[name].resize(a.shape)
            arrays[name][:] = a
    elif kind == "parquet":  # the file written again (newer)
        path = folder / "data.parquet"
        stamp = os.stat(path).st_mtime_ns
        write_store("parquet", x, y, folder)
        os.utime(path, ns=(stamp + 10**9, stamp + 10**9))


OUT_OF_CORE_SIZES = (1200, 4500)  # from 3,000 rows
OUT_OF_CORE_SETTINGS = dict(batch_size=100, control_variate="taylor", S="laplace",
                            scaling=2.38 / np.sqrt(D), proposal="random_walk")
_in_memory_draws: dict[int, dict[str, np.ndarray]] = {}


def fresh_draws(kind, n):
    """Draws of a step built on the new data (N = ``n``): for the .npy, Zarr and Parquet
    stores those of the in-memory store (test_out_of_core.py checks they are the same),
    built once per size; for Dask a step on Dask arrays (its own row stream)."""
    x, y = logistic_data(n=n, seed=n)
    if kind != "dask" and n in _in_memory_draws:
        return _in_memory_draws[n]
    data = write_store("dask", x, y, None) if kind == "dask" else None
    model = logistic_model(x, y) if data is None else logistic_model(x[:50], y[:50])
    with model:
        step = MinibatchBarker(data=data, **OUT_OF_CORE_SETTINGS)
    draws = draws_of(model, step, draws=200, tune=0)
    if kind == "dask":
        step.likelihood.store.close()
    else:
        _in_memory_draws[n] = draws
    return draws


@pytest.mark.parametrize("kind", ["npy", "zarr", "parquet", "dask"])
def test_out_of_core_stores_are_followed(kind, tmp_path):
    """Each store changed to N = 1,200, then to 4,500 rows (from 3,000), the way a user
    changes it: the followed step's draws equal those of a step built on the new data."""
    x, y = logistic_data()
    arrays = write_store(kind, x, y, tmp_path)
    model = logistic_model(x[:50], y[:50])
    with model:
        step = MinibatchBarker(data=arrays, **OUT_OF_CORE_SETTINGS)
    store = step.likelihood.store
    for changes, new_n in enumerate(OUT_OF_CORE_SIZES, start=1):
        x2, y2 = logistic_data(n=new_n, seed=new_n)
        if kind == "dask":
            # A Dask array cannot change: a different one is given (the store notices it
            # by its graph's name, as it would a different array in data=).
            names = {store.data[i][0]: i for i in store.data}
            for name, value in write_store("dask", x2, y2, None).items():
                store.data[names[name]] = (name, value)
        else:
            rewrite_store(kind, arrays, x2, y2, tmp_path)
        followed = draws_of(model, step, draws=200, tune=0)
        assert store.n_rows == new_n == step._n_rows
        assert step.control_variate.setups == 1 + changes
        assert_same_draws(followed, fresh_draws(kind, new_n))
    if kind == "dask":
        store.close()


# ------------------------------------------------------------------------- refusals
def test_a_proposal_object_around_the_old_fit_is_refused():
    """A proposal given as an object holds the old Laplace fit: refused by name, with the
    fix (a callable, which the step calls again)."""
    model = normal_model(normal_data(N_OLD, 10, 0.0, 1.0))
    with model:
        first = MinibatchBarker(batch_size=50, control_variate="taylor")
        laplace = first.surrogate_posterior().laplace
        step = MinibatchBarker(batch_size=50, control_variate="taylor",
                               proposal=CrankNicolsonProposal(laplace))
        by_callable = MinibatchBarker(
            batch_size=50, control_variate="taylor",
            proposal=lambda s: CrankNicolsonProposal(s.surrogate_posterior().laplace))
        pm.set_data({"y_obs": normal_data(700, 11, 2.0, 1.0)})
    with pytest.raises(ValueError, match="object built around the old Laplace fit.*callable"):
        step._start_chain(np.random.default_rng(0))
    old_proposal = by_callable.proposal
    by_callable._start_chain(np.random.default_rng(0))
    assert by_callable.proposal is not old_proposal
    np.testing.assert_array_equal(by_callable.proposal.surrogate.reference,
                                  by_callable.control_variate.reference.theta)


def test_a_failed_set_up_on_the_new_data_is_an_error(monkeypatch):
    """The repeated set-up fails as the build would (here: a MAP search that does not
    converge), with the build's message; the step does not sample the old set-up."""
    from pymc_minibatch_mh.estimators import reference as reference_module

    model = normal_model(normal_data(N_OLD, 12, 0.0, 1.0))
    with model:
        step = MinibatchBarker(batch_size=50, control_variate="taylor")
        pm.set_data({"y_obs": normal_data(700, 13, 2.0, 1.0)})
    monkeypatch.setattr(reference_module, "MAP_TOLERANCE", -1.0)
    with pytest.raises(ControlVariateError, match="did not converge.*reference="):
        step._start_chain(np.random.default_rng(0))
