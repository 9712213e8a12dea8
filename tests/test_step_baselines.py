"""The baselines as PyMC step methods: one interface, one stats schema, known posteriors."""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest
from conftest import sample_kwargs
from test_posterior_recovery import check, run, tempered_posterior

from pymc_minibatch_mh import AustereMH, ExactMH, MHSubLhd, MinibatchBarker
from pymc_minibatch_mh.model.compat import sample_stats
from pymc_minibatch_mh.transition.step import MinibatchStep

STEPS = {
    "barker": (MinibatchBarker, dict(batch_size=50)),
    "austere": (AustereMH, dict(batch_size=50, epsilon=0.05)),
    "austere_c": (AustereMH, dict(design="conservative", error_bound=0.2)),
    "austere_nc": (AustereMH, dict(design="adaptive", error_bound=0.05)),
    "mhsublhd": (MHSubLhd, dict(batch_size=50, delta=0.01)),
    "exact_metropolis": (ExactMH, dict(test="metropolis")),
    "exact_barker": (ExactMH, dict(test="barker")),
}


@pytest.fixture(scope="module")
def data():
    return np.random.default_rng(321).normal(1.5, 2.0, size=5_000)


@pytest.mark.parametrize("name", list(STEPS))
def test_common_stats_schema(name, data):
    cls, kwargs = STEPS[name]
    with pm.Model():
        mu = pm.Normal("mu", 0, 10)
        pm.Normal("x", mu, 2.0, observed=data)
        step = cls(temperature=50.0, S=[0.1], tune=False, **kwargs)
        idata = pm.sample(draws=40, tune=0, step=step, chains=1, **sample_kwargs())
    ss = sample_stats(idata)
    # Stats these settings leave constant are not declared: the audit's (no audit_every),
    # the proposal's (random walk) and MinibatchBarker's skew stats (no skew_correction).
    optional = {"audited", "audit_disagree", "audit_error", "audit_delta", "audit_kappa3",
                "proposal", "rho", "step_size", "skew", "skew_fallback"}
    everything = {**MinibatchStep.common_stats, **cls.test_stats}
    assert set(step.stats_dtypes_shapes) == set(everything) - optional
    for stat, (dtype, _) in everything.items():
        if stat == "tune":
            continue
        if stat in optional:
            assert stat not in ss, stat
            continue
        assert stat in ss, stat
        assert ss[stat].dtype == np.dtype(dtype), (stat, ss[stat].dtype)
    bs = np.asarray(ss["batch_size"])
    extra = np.asarray(ss["extra_evaluations"])
    if name.startswith("exact"):
        assert np.all(bs == data.size) and np.all(np.asarray(ss["full_data"]))
    else:
        assert bs.min() >= 1 and bs.max() <= data.size
    if name in ("austere_nc", "mhsublhd"):
        assert np.all(extra == data.size)  # the full pass for the design / the range bound
    else:
        assert np.all(extra == 0)


def test_mhsublhd_user_range_bound_avoids_full_pass(data):
    calls = []

    def bound(cur, prop):
        calls.append((cur, prop))
        # |l_i| ≤ |Δμ| (|x_i − μ̄| + ...)/σ²/K: a crude but valid bound for this model.
        dmu = abs(float(prop["mu"]) - float(cur["mu"]))
        span = float(np.ptp(data)) + 2 * abs(float(cur["mu"])) + 2 * abs(float(prop["mu"]))
        return 2 * dmu * span / 4.0 / 50.0

    with pm.Model():
        mu = pm.Normal("mu", 0, 10)
        pm.Normal("x", mu, 2.0, observed=data)
        step = MHSubLhd(batch_size=50, temperature=50.0, S=[0.1], tune=False, range_bound=bound)
        idata = pm.sample(draws=30, tune=0, step=step, chains=1, **sample_kwargs())
    ss = sample_stats(idata)
    assert len(calls) >= 30 and np.all(np.asarray(ss["extra_evaluations"]) == 0)


def test_austere_conservative_design_is_chosen_once(data):
    with pm.Model():
        mu = pm.Normal("mu", 0, 10)
        pm.Normal("x", mu, 2.0, observed=data)
        step = AustereMH(design="conservative", error_bound=0.2, temperature=50.0, S=[0.1])
        pm.sample(draws=5, tune=0, step=step, chains=1, **sample_kwargs())
    d = step.chosen_design
    assert d is not None and d.feasible and d.error <= 0.2
    assert (step.batch_size, step.epsilon) == (d.batch_size, d.epsilon)


@pytest.mark.parametrize(
    ("name", "cls", "kwargs"),
    [
        ("austere", AustereMH, dict(batch_size=50, epsilon=0.01)),
        ("mhsublhd", MHSubLhd, dict(batch_size=50, delta=0.01)),
        ("exact_barker", ExactMH, dict(test="barker", batch_size=None)),
        ("exact_metropolis", ExactMH, dict(test="metropolis", batch_size=None)),
    ],
)
def test_posterior_recovery(name, cls, kwargs):
    x = np.random.default_rng(123).normal(1.5, 2.0, size=20_000)
    kwargs = dict(kwargs)
    batch_size = kwargs.pop("batch_size", None)
    draws_mu, ss, (mean, sd) = run(
        x, 200.0, 1.0, draws=1500, batch_size=batch_size, step_class=cls, **kwargs
    )
    ok, info = check(draws_mu, mean, sd)
    assert ok, (name, info)
    wrong_mean, wrong_sd = tempered_posterior(x, 50.0)
    assert not check(draws_mu, wrong_mean, wrong_sd)[0]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(design="other"), r"design must be 'fixed', 'conservative' or 'adaptive', got"),
        (dict(epsilon=0.7), r"epsilon must be in \(0, 0\.5\), got 0\.7"),
        (dict(error_bound=0), r"error_bound must be in \(0, 1\), got 0"),
    ],
)
def test_austere_bad_parameters(kwargs, match, data):
    with pm.Model():
        mu = pm.Normal("mu")
        pm.Normal("x", mu, 1, observed=data)
        with pytest.raises(ValueError, match=match):
            AustereMH(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(delta=0), r"delta must be in \(0, 1\), got 0"),
        (dict(gamma=1.0), r"gamma must be > 1, got 1\.0"),
        (dict(p=1.0), r"p must be > 1, got 1\.0"),
    ],
)
def test_mhsublhd_bad_parameters(kwargs, match, data):
    with pm.Model():
        mu = pm.Normal("mu")
        pm.Normal("x", mu, 1, observed=data)
        with pytest.raises(ValueError, match=match):
            MHSubLhd(**kwargs)


def test_exact_bad_test(data):
    with pm.Model():
        mu = pm.Normal("mu")
        pm.Normal("x", mu, 1, observed=data)
        with pytest.raises(ValueError, match="metropolis"):
            ExactMH(test="other")
