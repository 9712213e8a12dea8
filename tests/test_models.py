"""Models MinibatchBarker must sample correctly.

For each model the compiled per-observation log-likelihood (``model/``), summed over all
rows, must equal the model's own full-data log-likelihood at several random points (not
only the initial point), its data-free part must equal the model's prior + Jacobian +
Potential difference, and a short ``pm.sample`` must run.
"""

from __future__ import annotations

import functools

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest
from conftest import sample_kwargs

from pymc_minibatch_mh import MinibatchBarker
from pymc_minibatch_mh.model.compat import posterior, sample_stats

N = 240
RTOL = 1e-8


def _as(kind, name, value, **kwargs):
    """``value`` as pm.Data (kind "data") or as the plain NumPy array (kind "numpy")."""
    return pm.Data(name, value, **kwargs) if kind == "data" else value


def _design(rng, n=N, p=3):
    x = rng.normal(size=(n, p))
    x[:, 0] = 1.0
    return x


# ------------------------------------------------------------------- models
def normal_model(kind):
    rng = np.random.default_rng(1)
    x = rng.normal(size=N)
    y = 0.5 + 1.5 * x + rng.normal(0.0, 0.7, size=N)
    with pm.Model() as model:
        xd = _as(kind, "x", x)
        yd = _as(kind, "y_obs", y)
        a = pm.Normal("a", 0, 5)
        b = pm.Normal("b", 0, 5)
        s = pm.HalfNormal("s", 2)
        pm.Normal("y", a + b * xd, s, observed=yd)
    return model


def studentt_model(kind):
    rng = np.random.default_rng(2)
    x = rng.normal(size=N)
    y = -1.0 + 0.3 * x + rng.standard_t(4, size=N)
    with pm.Model() as model:
        xd = _as(kind, "x", x)
        a = pm.Normal("a", 0, 5)
        b = pm.Normal("b", 0, 5)
        s = pm.HalfNormal("s", 2)
        nu = pm.Gamma("nu", 2.0, 0.1)
        # An explicit observed shape (a constant N in the graph) must be sliced too.
        pm.StudentT("y", nu=nu, mu=a + b * xd, sigma=s, observed=y, shape=N)
    return model


def bernoulli_logit_model(kind):
    rng = np.random.default_rng(3)
    x = _design(rng)
    beta = np.array([-0.5, 1.0, -2.0])
    y = rng.binomial(1, 1.0 / (1.0 + np.exp(-x @ beta)))
    with pm.Model() as model:
        xd = _as(kind, "X", x)
        yd = _as(kind, "y_obs", y)
        b = pm.Normal("beta", 0, 2, shape=3)
        pm.Bernoulli("y", logit_p=pt.dot(xd, b), observed=yd)
    return model


def binomial_logit_model(kind):
    rng = np.random.default_rng(4)
    x = _design(rng)
    trials = rng.integers(1, 20, size=N)
    beta = np.array([0.2, -0.7, 0.4])
    y = rng.binomial(trials, 1.0 / (1.0 + np.exp(-x @ beta)))
    with pm.Model() as model:
        xd = _as(kind, "X", x)
        nd = _as(kind, "trials", trials)  # per-row numbers of trials: sliced with the rows
        b = pm.Normal("beta", 0, 2, shape=3)
        pm.Binomial("y", n=nd, p=pm.math.invlogit(pt.dot(xd, b)), observed=y)
    return model


def poisson_model(kind):
    rng = np.random.default_rng(5)
    x = _design(rng)
    y = rng.poisson(np.exp(x @ np.array([1.0, 0.3, -0.2])))
    with pm.Model() as model:
        xd = _as(kind, "X", x)
        yd = _as(kind, "y_obs", y)
        b = pm.Normal("beta", 0, 1, shape=3)
        pm.Poisson("y", mu=pt.exp(pt.dot(xd, b)), observed=yd)
    return model


def negbin_model(kind):
    rng = np.random.default_rng(6)
    x = _design(rng)
    mu = np.exp(x @ np.array([1.5, -0.4, 0.2]))
    y = rng.negative_binomial(3.0, 3.0 / (3.0 + mu))
    with pm.Model() as model:
        xd = _as(kind, "X", x)
        b = pm.Normal("beta", 0, 1, shape=3)
        alpha = pm.Exponential("alpha", 0.5)
        pm.NegativeBinomial("y", mu=pt.exp(pt.dot(xd, b)), alpha=alpha, observed=y)
    return model


def hierarchical_model(kind):
    """Group indices (int) and covariates must be sliced by the same rows."""
    rng = np.random.default_rng(7)
    n_groups = 6
    g = rng.integers(0, n_groups, size=N)
    x = rng.normal(size=N)
    y = rng.normal(size=n_groups)[g] + 0.5 * x + rng.normal(0.0, 0.5, size=N)
    with pm.Model(coords={"group": np.arange(n_groups)}) as model:
        gd = _as(kind, "g", g)
        xd = _as(kind, "x", x)
        mu_a = pm.Normal("mu_a", 0, 2)
        tau = pm.HalfNormal("tau", 1)
        z = pm.Normal("z", 0, 1, dims="group")
        a = pm.Deterministic("a", mu_a + tau * z, dims="group")
        b = pm.Normal("b", 0, 1, dims="group")
        s = pm.HalfNormal("s", 1)
        pm.Normal("y", a[gd] + b[gd] * xd, s, observed=y)
    return model


def multi_observed_model(kind):
    """Three observed variables on one observation dimension, one of shape (N, k)."""
    rng = np.random.default_rng(8)
    x = rng.normal(size=N)
    y1 = 0.3 + x + rng.normal(size=N)
    y2 = rng.normal(size=(N, 3)) + x[:, None]
    y3 = rng.binomial(1, 0.5, size=N)
    with pm.Model(coords={"obs": np.arange(N), "col": ["a", "b", "c"]}) as model:
        xd = _as(kind, "x", x, dims="obs")
        mu = pm.Normal("mu", 0, 2)
        s = pm.HalfNormal("s", 1)
        beta = pm.Normal("beta", 0, 1, dims="col")
        pm.Normal("y1", mu + xd, s, observed=y1, dims="obs")
        pm.Normal("y2", beta + mu * xd[:, None], 1.0, observed=y2, dims=("obs", "col"))
        pm.Bernoulli("y3", logit_p=mu * xd, observed=y3, dims="obs")
    return model


def bounded_model(kind):
    """Uniform, Beta and HalfNormal parameters (transforms, Jacobians), data-free
    Potentials and Deterministics."""
    rng = np.random.default_rng(9)
    x = rng.uniform(size=N)
    y = 0.5 + 0.7 * x + rng.normal(0.0, 0.3, size=N)
    with pm.Model() as model:
        xd = _as(kind, "x", x)
        u = pm.Uniform("u", -2.0, 3.0)
        w = pm.Beta("w", 2.0, 2.0)
        s = pm.HalfNormal("s", 1.0)
        mu = pm.Deterministic("mu", u + w * xd)
        pm.Deterministic("ratio", w / s)
        pm.Potential("pull", -0.5 * (u - w) ** 2)
        pm.Potential("cap", pt.switch(s < 50.0, 0.0, -np.inf))
        pm.Normal("y", mu, s, observed=y)
    return model


def dims_model(kind):
    """Coords and dims on the observation dimension, for data and observed."""
    rng = np.random.default_rng(10)
    x = rng.normal(size=N)
    y = rng.poisson(np.exp(0.5 + 0.2 * x))
    with pm.Model(coords={"obs": np.arange(N)}) as model:
        xd = _as(kind, "x", x, dims="obs")
        yd = _as(kind, "y_obs", y, dims="obs")
        a = pm.Normal("a", 0, 2)
        b = pm.Normal("b", 0, 2)
        rate = pm.Deterministic("rate", pt.exp(a + b * xd), dims="obs")
        pm.Poisson("y", rate, observed=yd, dims="obs")
    return model


MODELS = {
    "normal": normal_model,
    "studentt": studentt_model,
    "bernoulli_logit": bernoulli_logit_model,
    "binomial_logit": binomial_logit_model,
    "poisson": poisson_model,
    "negbin": negbin_model,
    "hierarchical": hierarchical_model,
    "multi_observed": multi_observed_model,
    "bounded": bounded_model,
    "dims": dims_model,
}
#: Data given as pm.Data ("data") or plain NumPy ("numpy"); both for the regressions and
#: the hierarchical model, one of them elsewhere (the suite's runtime is bounded).
KINDS = {
    "normal": ("data",),
    "studentt": ("numpy",),
    "bernoulli_logit": ("data",),
    "binomial_logit": ("numpy",),
    "poisson": ("data", "numpy"),
    "negbin": ("data", "numpy"),
    "hierarchical": ("data", "numpy"),
    "multi_observed": ("data", "numpy"),
    "bounded": ("numpy",),
    "dims": ("data",),
}
CASES = [(name, kind) for name in MODELS for kind in KINDS[name]]


# ------------------------------------------------------------------ helpers
def random_points(model, count=3, seed=0, scale=0.4):
    """Points around the initial point, on the transformed (sampling) space."""
    rng = np.random.default_rng(seed)
    start = model.initial_point()
    points = []
    for _ in range(count):
        point = {}
        for name, value in start.items():
            value = np.asarray(value)
            point[name] = (value + rng.normal(0.0, scale, size=value.shape)).astype(value.dtype)
        points.append(point)
    return points


@functools.cache
def model_functions(model):
    """The model's own log-likelihood (total and per observed variable) and total logp."""
    loglik = model.compile_logp(vars=model.observed_RVs)
    total = model.compile_logp()
    terms = model.compile_fn(model.logp(vars=model.observed_RVs, sum=False), point_fn=True)
    return loglik, total, terms


def per_row(terms, n):
    out = np.zeros(n)
    for t in terms:
        t = np.asarray(t)
        out += t.reshape(n, -1).sum(axis=1) if t.ndim > 1 else t
    return out


def check_loglik(model, step, points):
    lik = step.likelihood
    n = lik.n_rows()
    loglik, _, terms = model_functions(model)
    for point in points:
        lik.set_others(point)
        x = lik.point_map.to_flat(point)
        want = float(loglik(point))
        assert np.isfinite(want)
        rows = lik.full_loglik(x)
        assert rows.shape == (n,)
        assert rows.sum() == pytest.approx(want, rel=RTOL)
        expected_rows = per_row(terms(point), n)
        np.testing.assert_allclose(rows, expected_rows, rtol=RTOL, atol=1e-10)
        # Any subset, in any order, gives the same per-row values.
        subset = np.random.default_rng(1).permutation(n)[: n // 3].astype(np.int64)
        np.testing.assert_allclose(lik.row_loglik(x, subset), expected_rows[subset], rtol=RTOL)


def check_prior_delta(model, step, points):
    lik = step.likelihood
    loglik, total, _ = model_functions(model)

    def data_free(point):
        return float(total(point)) - float(loglik(point))

    for p0, p1 in zip(points, points[1:] + points[:1], strict=True):
        # Variables the step does not sample stay at their values in p0.
        p1 = {**p1, **{name: p0[name] for name in lik.other_shared}}
        lik.set_others(p0)
        x0, x1 = lik.point_map.to_flat(p0), lik.point_map.to_flat(p1)
        want = data_free(p1) - data_free(p0)
        got = lik.prior_delta(x0, x1)
        assert np.isfinite(want)
        assert got == pytest.approx(want, rel=RTOL, abs=1e-9 * (1 + abs(data_free(p0))))


def run_sample(model, step, draws=30, **kwargs):
    with model:
        return pm.sample(draws=draws, tune=0, chains=1, step=step, **sample_kwargs(**kwargs))


def check_sample(idata, step, n):
    ss = sample_stats(idata)
    bs = np.asarray(ss["batch_size"])
    assert bs.shape == (1, 30)
    assert bs.min() >= step.batch_size and bs.max() <= n
    assert not np.asarray(ss["nonfinite"]).any()
    for name, values in posterior(idata).items():
        assert np.all(np.isfinite(np.asarray(values))), name


def make_step(model, **kwargs):
    with model:
        size = sum(np.asarray(v).size for v in model.initial_point().values())
        options = dict(batch_size=20, temperature=10.0, S=np.full(size, 0.05), tune=False)
        options.update(kwargs)
        return MinibatchBarker(**options)


@pytest.fixture(scope="module", params=CASES, ids=[f"{m}-{k}" for m, k in CASES])
def built(request):
    name, kind = request.param
    model = MODELS[name](kind)
    return model, make_step(model)


# -------------------------------------------------------------------- tests
def test_loglik_matches_model(built):
    model, step = built
    check_loglik(model, step, random_points(model, seed=11))


def test_prior_delta_matches_model(built):
    model, step = built
    check_prior_delta(model, step, random_points(model, seed=12))


def test_short_sample_runs(built):
    model, step = built
    check_sample(run_sample(model, step), step, N)


def test_subset_of_vars_with_other_step():
    """Variables not sampled by the step are read from the point (set_others)."""
    model = hierarchical_model("data")
    with model:
        step = MinibatchBarker(
            [model["mu_a"], model["z"], model["b"], model["s"]],
            batch_size=20, temperature=10.0, S=np.full(14, 0.05), tune=False,
        )
    assert set(step.likelihood.other_shared) == {"tau_log__"}
    points = random_points(model, seed=13)
    check_loglik(model, step, points)
    check_prior_delta(model, step, points)
    with model:
        idata = pm.sample(
            draws=30, tune=0, chains=1, step=[step, pm.Metropolis([model["tau"]])],
            **sample_kwargs(),
        )
    assert np.all(np.isfinite(np.asarray(posterior(idata)["tau"])))
    assert np.unique(np.asarray(posterior(idata)["tau"])).size > 1


def test_invalid_parameter_proposal_is_rejected_not_raised():
    """Regression: a proposal with an invalid parameter (sigma < 0 for an unconstrained
    sigma) gave ParameterValueError from the compiled functions; PyMC's own functions give
    -inf, so the proposal must simply be rejected."""
    rng = np.random.default_rng(14)
    with pm.Model() as model:
        s = pm.Normal("s", 1.0, 0.3)  # not constrained to be positive
        pm.Normal("y", 0.0, s, observed=rng.normal(size=N))
        step = MinibatchBarker(batch_size=20, temperature=10.0, S=[3.0], tune=False)
    point = model.initial_point()
    point["s"] = np.array(-0.5)
    x = step.likelihood.point_map.to_flat(point)
    assert float(model.compile_logp(vars=model.observed_RVs)(point)) == -np.inf
    assert np.all(step.likelihood.row_loglik(x, np.arange(5, dtype=np.int64)) == -np.inf)
    idata = run_sample(model, step, draws=30)
    draws = np.asarray(posterior(idata)["s"])
    assert np.all(draws > 0)
    assert not np.asarray(sample_stats(idata)["nonfinite"]).any()


@pytest.mark.parametrize("with_dims", [False, True])
def test_set_data_new_n_between_runs(with_dims):
    """Sample, pm.set_data with a new N, sample again with the same step instance."""
    rng = np.random.default_rng(15)
    n0, n1, n2 = 200, 330, 120
    coords = {"obs": np.arange(n0)} if with_dims else None
    dims = {"dims": "obs"} if with_dims else {}
    with pm.Model(coords=coords) as model:
        xd = pm.Data("x", rng.normal(size=n0), **dims)
        gd = pm.Data("g", rng.integers(0, 3, size=n0), **dims)
        yd = pm.Data("y_obs", rng.normal(size=n0), **dims)
        a = pm.Normal("a", 0, 2, shape=3)
        b = pm.Normal("b", 0, 2)
        s = pm.HalfNormal("s", 1)
        pm.Normal("y", a[gd] + b * xd, s, observed=yd, **dims)
    step = make_step(model)
    points = random_points(model, seed=16)
    idata = run_sample(model, step)
    assert step._n_rows == n0
    check_sample(idata, step, n0)
    for n_new in (n1, n2):
        new = {
            "x": rng.normal(size=n_new),
            "g": rng.integers(0, 3, size=n_new),
            "y_obs": rng.normal(2.0, 1.0, size=n_new),
        }
        with model:
            pm.set_data(new, coords={"obs": np.arange(n_new)} if with_dims else None)
        idata = run_sample(model, step)
        assert step._n_rows == n_new
        check_sample(idata, step, n_new)
        assert int(np.asarray(sample_stats(idata)["batch_size"]).max()) <= n_new
        check_loglik(model, step, points)
