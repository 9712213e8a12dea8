"""Taylor control variates: the proxy, the estimator of Δ, posteriors at temperature 1.

- the per-row expansion and the full-data sums match hand-written derivatives (Poisson
  GLM), and are exact for a Normal likelihood (residuals 0);
- Δ* is unbiased for the exact Δ and its variance estimate is right (a wrong estimator is
  rejected by the same check);
- posteriors at temperature 1 with proposals as wide as the posterior: a Normal and a
  Poisson-Gamma conjugate model (closed forms) and a logistic regression (exact posterior
  moments by quadrature), within a few Monte Carlo standard errors, with a wrong answer
  rejected by the same check;
- AustereMH and MHSubLhd with the residuals; re-centring during tuning; errors.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest
from conftest import sample_kwargs
from scipy.special import expit, gammaln, log_expit

from pymc_minibatch_mh import AustereMH, ExactMH, MHSubLhd, MinibatchBarker
from pymc_minibatch_mh.core.control_variate import (
    TaylorReference,
    expansion_difference,
    expansion_gradient,
    newton_decrement,
)
from pymc_minibatch_mh.errors import ControlVariateError
from pymc_minibatch_mh.errors import ModelNotSupportedError as NotSupported
from pymc_minibatch_mh.estimators import full_passes
from pymc_minibatch_mh.estimators import reference as reference_module
from pymc_minibatch_mh.estimators import taylor as cv_module
from pymc_minibatch_mh.estimators.reference import TaylorPasses
from pymc_minibatch_mh.model.compat import mcse, posterior, sample_stats
from pymc_minibatch_mh.model.likelihood import MinibatchLikelihood


def moments_ok(draws, mean, sd, k=4.0):
    """Sample mean and sd within k Monte Carlo standard errors (ArviZ) of the truth."""
    draws = np.asarray(draws)
    se_mean, se_sd = mcse(draws, "mean"), mcse(draws, "sd")
    ok = abs(draws.mean() - mean) < k * se_mean and abs(draws.std() - sd) < k * se_sd
    return ok, (draws.mean(), mean, se_mean, draws.std(), sd, se_sd)


# ---------------------------------------------------------------------------- core
def test_reference_closed_form_is_exact_for_a_quadratic():
    rng = np.random.default_rng(0)
    d = 4
    a = rng.normal(size=(d, d))
    hessian = -(a @ a.T + d * np.eye(d))
    theta = rng.normal(size=d)
    gradient = rng.normal(size=d)

    def f(x):  # a quadratic with these derivatives at theta
        z = x - theta
        return gradient @ z + 0.5 * z @ hessian @ z

    ref = TaylorReference(theta, gradient, hessian)
    for _ in range(5):
        x, y = rng.normal(size=d), rng.normal(size=d)
        assert ref.proxy_difference(x, y) == pytest.approx(f(y) - f(x), rel=1e-12, abs=1e-12)
    cov = ref.laplace_covariance()
    np.testing.assert_allclose(cov, np.linalg.inv(-hessian), rtol=1e-10)
    np.testing.assert_allclose(ref.laplace_covariance(4.0), 4.0 * cov, rtol=1e-10)
    # Distance: draws of N(theta, cov) are at about 1 per dimension.
    draws = rng.multivariate_normal(theta, cov, size=4000)
    assert np.mean([ref.distance(x) ** 2 for x in draws]) == pytest.approx(1.0, abs=0.05)
    assert newton_decrement([3.0, 4.0], np.eye(2)) == pytest.approx(5.0)
    assert newton_decrement([1.0, 0.0], -np.eye(2)) == math.inf


def test_expansion_formula_as_numpy_and_as_graph():
    """The one formula, computed with NumPy and built as a PyTensor graph, agree."""
    import pytensor

    rng = np.random.default_rng(3)
    d = 3
    a = rng.normal(size=(d, d))
    g, h, c = rng.normal(size=d), a + a.T, rng.normal(size=d)
    x, y = rng.normal(size=d), rng.normal(size=d)
    sym = [pt.vector(n, dtype="float64") for n in ("g", "c", "x", "y")]
    hs = pt.matrix("h", dtype="float64")
    fn = pytensor.function(
        [sym[0], hs, *sym[1:]],
        [expansion_difference(sym[0], hs, *sym[1:], dot=pt.dot),
         expansion_gradient(sym[0], hs, sym[1], sym[3], dot=pt.dot)],
    )
    graph_value, graph_gradient = fn(g, h, c, x, y)
    assert float(graph_value) == pytest.approx(expansion_difference(g, h, c, x, y), rel=1e-12)
    np.testing.assert_allclose(graph_gradient, expansion_gradient(g, h, c, y), rtol=1e-12)
    # The gradient is that of the expansion's value (central differences).
    ref = TaylorReference(c, g, h)
    eps = 1e-6
    numeric = [(ref.proxy_value(y + eps * e) - ref.proxy_value(y - eps * e)) / (2 * eps)
               for e in np.eye(d)]
    np.testing.assert_allclose(ref.proxy_gradient(y), numeric, rtol=1e-6)


def test_reference_rejects_bad_input():
    with pytest.raises(ValueError, match="shape"):
        TaylorReference(np.zeros(2), np.zeros(3), np.zeros((2, 2)))
    with pytest.raises(ValueError, match="non-finite"):
        TaylorReference(np.array([0.0, np.nan]), np.zeros(2), np.zeros((2, 2)))
    with pytest.raises(ValueError, match="not negative definite"):
        TaylorReference(np.zeros(2), np.zeros(2), np.eye(2)).laplace_covariance()


# --------------------------------------------------------------------------- models
def normal_model(x):
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 10.0)
        pm.Normal("x", mu, 2.0, observed=x)
    return model


def poisson_glm(n=3000, seed=0):
    rng = np.random.default_rng(seed)
    x = np.column_stack([np.ones(n), rng.normal(size=n)])
    y = rng.poisson(np.exp(x @ np.array([0.5, 0.3])))
    with pm.Model() as model:
        b = pm.Normal("b", 0.0, 2.0, shape=2)
        pm.Poisson("y", pt.exp(pt.dot(x, b)), observed=y)
    return model, x, y


def logistic_data(n, seed=0):
    rng = np.random.default_rng(seed)
    x = np.column_stack([np.ones(n), rng.normal(size=n)])
    y = (rng.random(n) < expit(x @ np.array([-0.5, 1.0]))).astype(np.int64)
    return x, y


def logistic_model(x, y, prior_sd=5.0):
    with pm.Model() as model:
        b = pm.Normal("b", 0.0, prior_sd, shape=x.shape[1])
        pm.Bernoulli("y", logit_p=pt.dot(x, b), observed=y)
    return model


def logistic_loglik(x, y, b):
    eta = x @ b
    return y * eta + log_expit(-eta)


def laplace_proposal(step):
    cov = step.control_variate.laplace_covariance()
    return cov, 2.38 / math.sqrt(cov.shape[0])


# ---------------------------------------------------------------- proxy and sums
@pytest.fixture(scope="module")
def glm():
    model, x, y = poisson_glm()
    b_hat = np.array([0.45, 0.35])  # a reference that is not the MAP
    with model:
        step = MinibatchBarker(control_variate="taylor", reference={"b": b_hat}, batch_size=50)
    return model, x, y, b_hat, step


def test_poisson_glm_sums_and_residuals_match_the_analytic_expansion(glm):
    model, x, y, b_hat, step = glm
    cv = step.control_variate
    assert cv.setup_evaluations == x.shape[0] and cv.map_evaluations == 0
    rate = np.exp(x @ b_hat)
    g_rows = (y - rate)[:, None] * x  # ∇ℓ_i at θ̂
    np.testing.assert_allclose(cv.reference.gradient, g_rows.sum(0), rtol=1e-9)
    np.testing.assert_allclose(cv.reference.hessian, -(x.T * rate) @ x, rtol=1e-9)
    np.testing.assert_allclose(cv.reference.theta, b_hat)

    def loglik(b):
        eta = x @ b
        return y * eta - np.exp(eta) - gammaln(y + 1)

    rng = np.random.default_rng(1)
    rows = rng.permutation(x.shape[0])[:200].astype(np.int64)
    for temperature in (1.0, 3.0):
        cur = b_hat + rng.normal(size=2) * 0.05
        prop = cur + rng.normal(size=2) * 0.05
        delta, w = prop - cur, prop + cur - 2 * b_hat
        proxy = g_rows @ delta - 0.5 * rate * (x @ delta) * (x @ w)  # g_iᵀδ + ½ δᵀH_i w
        expected = (loglik(prop) - loglik(cur) - proxy) / temperature
        r, data_free = cv.fn(cur, prop, np.array(1 / temperature), *cv.store.rows(rows))
        np.testing.assert_allclose(r, expected[rows], rtol=1e-7, atol=1e-12)
        closed = (g_rows.sum(0) @ delta + 0.5 * delta @ (-(x.T * rate) @ x) @ w) / temperature
        prior_delta = step.likelihood.prior_delta(cur, prop)
        assert float(data_free) == pytest.approx(prior_delta + closed, rel=1e-9)
        # Closed form + all residuals = the exact Δ.
        step._start_chain(np.random.default_rng(0))
        cv.open(cur, prop, np.array(1 / temperature), 0.0, 0)
        full = cv.full_pass()
        exact = (loglik(prop) - loglik(cur)).sum() / temperature + prior_delta
        assert full.sum() + float(data_free) == pytest.approx(exact, rel=1e-9, abs=1e-9)


def test_proxy_graph_value_and_gradient_agree(glm):
    """The estimator's compiled proxy (shared θ̂, G, H) equals its NumPy value."""
    import pytensor

    _, _, _, b_hat, step = glm
    cv = step.control_variate
    flat = pt.vector("flat", dtype="float64")
    fn = pytensor.function([flat], cv.proxy_graph(flat))
    rng = np.random.default_rng(4)
    ref = cv.reference
    for _ in range(3):
        x = b_hat + 0.1 * rng.normal(size=2)
        expected = ref.proxy_difference(b_hat, x)
        assert float(fn(x)) == pytest.approx(expected, rel=1e-10)
        assert cv.proxy_value(x) == pytest.approx(expected, rel=1e-10)
        np.testing.assert_allclose(cv.proxy_gradient(x),
                                   ref.gradient + ref.hessian @ (x - b_hat), rtol=1e-10)


def test_normal_likelihood_residuals_are_zero():
    x = np.random.default_rng(2).normal(1.5, 2.0, size=5000)
    model = normal_model(x)
    with model:  # any reference: the expansion of a Normal log-likelihood in μ is exact
        step = MinibatchBarker(control_variate="taylor", reference={"mu": -3.0}, batch_size=10)
    cv = step.control_variate
    rows = np.arange(0, 5000, 7, dtype=np.int64)
    cur, prop = np.array([1.4]), np.array([1.7])
    ratios = step.likelihood.delta(cur, prop, rows, np.array(1.0))[0]
    r, data_free = cv.fn(cur, prop, np.array(1.0), *cv.store.rows(rows))
    assert np.abs(r).max() < 1e-10 * np.abs(ratios).max()
    exact = (-0.5 * ((x - 1.7) ** 2 - (x - 1.4) ** 2) / 4.0).sum() + step.likelihood.prior_delta(
        cur, prop
    )
    assert float(data_free) == pytest.approx(exact, rel=1e-10)


# ------------------------------------------------------------------- unbiasedness
@pytest.fixture(scope="module")
def logistic():
    x, y = logistic_data(20_000)
    model = logistic_model(x, y)
    with model:
        step = MinibatchBarker(
            control_variate="taylor", batch_size=20, tune=False, S="laplace",
            scaling=2.38 / math.sqrt(2),
        )
    cov, scale = laplace_proposal(step)
    return model, x, y, step, cov, scale


def test_map_is_found_and_counted(logistic):
    model, x, y, step, _, _ = logistic
    cv = step.control_variate
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # PyMC 6: find_MAP's jitter default
        map_point = pm.find_MAP(progressbar=False)
    np.testing.assert_allclose(cv.reference.theta, map_point["b"], atol=1e-4)
    assert cv.map_decrement <= cv_module.MAP_TOLERANCE
    n = x.shape[0]
    assert cv.setup_evaluations == cv.map_evaluations and cv.setup_evaluations % n == 0
    assert cv.setup_evaluations >= 2 * n


@pytest.mark.parametrize("control_variate", ["taylor", "taylor_theta"])
def test_tall_data_reference_in_one_pass_with_the_hessian(monkeypatch, control_variate):
    """Above 4 × SUBSAMPLE_ROWS rows θ̂ comes from the subsample's mode by gradient passes
    (Newton steps with the subsample's Hessian) and one pass with the Hessian: within
    REFERENCE_DECREMENT posterior sds of the MAP, with the Laplace fit the proposals use
    centred within a few thousandths of a posterior sd of it, in fewer passes than the
    full-data search. With REFERENCE_DECREMENT = 0 the Newton steps polish it to the MAP,
    as before."""
    monkeypatch.setattr(reference_module, "SUBSAMPLE_ROWS", 20_000)
    n = 200_000
    x, y = logistic_data(n, seed=3)
    model = logistic_model(x, y)
    with model:
        tall = MinibatchBarker(control_variate=control_variate, tune=False)
        monkeypatch.setattr(reference_module, "REFERENCE_DECREMENT", 0.0)
        polished = MinibatchBarker(control_variate=control_variate, tune=False)
        monkeypatch.setattr(reference_module, "SUBSAMPLE_ROWS", 10**9)  # full-data search
        full = MinibatchBarker(control_variate=control_variate, tune=False)
    a, p, b = tall.control_variate, polished.control_variate, full.control_variate
    assert a.passes.subsample_reference and a.map_decrement <= 1.0
    assert not p.passes.subsample_reference and p.map_converged
    assert b.map_decrement <= cv_module.MAP_TOLERANCE
    sd = np.sqrt(np.diag(b.laplace_covariance()))
    assert np.all(np.abs(a.reference.laplace_mean() - b.reference.theta) / sd < 5e-3)
    assert np.all(np.abs(p.reference.theta - b.reference.theta) / sd < 3e-3)
    assert np.allclose(b.reference.laplace_mean(), b.reference.theta, atol=1e-3 * sd.min())
    # Gradient passes and one with the Hessian, plus the subsample's rows read by L-BFGS-B.
    assert a.setup_evaluations % n != 0 and a.passes.hessian_passes == 1
    assert p.passes.hessian_passes >= 2 and tall.setup_passes < polished.setup_passes
    surrogate = tall.surrogate_posterior().laplace
    np.testing.assert_array_equal(surrogate.reference, a.reference.theta)
    np.testing.assert_allclose(surrogate.theta_hat, a.reference.laplace_mean())
    # The subsample's mode alone is several posterior sds off: the passes matter.
    monkeypatch.setattr(reference_module, "SUBSAMPLE_ROWS", 20_000)
    passes = reference_module.TaylorPasses(tall.likelihood, "test")
    start = passes._subsample_mode(np.zeros(2), passes._subsample_rows())
    assert np.max(np.abs(start - b.reference.theta) / sd) > 0.3


def test_delta_star_is_unbiased_with_the_right_variance(logistic):
    model, x, y, step, cov, scale = logistic
    cv = step.control_variate
    n, b = x.shape[0], 20
    rng = np.random.default_rng(3)
    theta_hat = cv.reference.theta
    cur = rng.multivariate_normal(theta_hat, cov)
    prop = cur + scale * rng.multivariate_normal(np.zeros(2), cov)
    inv_t = np.array(1.0)
    exact = (logistic_loglik(x, y, prop) - logistic_loglik(x, y, cur)).sum()
    exact += step.likelihood.prior_delta(cur, prop)

    est = step.estimator
    step._start_chain(np.random.default_rng(4))
    estimates, variances, wrong = [], [], []
    p = expit(x @ theta_hat)
    delta, w = prop - cur, prop + cur - 2 * theta_hat
    second = -p * (1 - p) * (x @ delta) * (x @ w)  # δᵀH_i w, by hand
    for _ in range(3000):
        data_free = est.open(cur, prop, inv_t, 0.0, b)
        r = est.draw_values(b)
        rows = est.store._sampler.order[:b]
        est.close(1)
        estimates.append(data_free + n * r.mean())
        variances.append(n * n * r.var(ddof=1) / b * (1 - (b - 1) / (n - 1)))
        # A wrong estimator: the residuals keep the second-order term.
        wrong.append(data_free + n * (r + 0.5 * second[rows]).mean())
    estimates = np.array(estimates)
    se = estimates.std(ddof=1) / math.sqrt(estimates.size)
    assert abs(estimates.mean() - exact) < 4 * se, (estimates.mean(), exact, se)
    assert se < 1e-3  # tight enough to see any bias that matters for an MH decision
    # s² estimates the variance of Δ* (within sampling error of 3000 replicates).
    assert np.mean(variances) == pytest.approx(estimates.var(ddof=1), rel=0.15)
    assert np.mean(variances) < 0.01  # far below σ² = 1: one minibatch of 20 rows suffices
    wrong = np.array(wrong)
    se_wrong = wrong.std(ddof=1) / math.sqrt(wrong.size)
    assert abs(wrong.mean() - exact) > 4 * se_wrong


def logistic_quadrature(x, y, prior_sd, center, cov, temperature=1.0, half_width=7.0, k=71):
    """Posterior means and sds of a 2-parameter logistic regression by a grid in z-space."""
    chol = np.linalg.cholesky(cov)
    z = np.linspace(-half_width, half_width, k)
    zz = np.stack(np.meshgrid(z, z, indexing="ij"), -1).reshape(-1, 2)
    grid = center + zz @ chol.T
    logp = np.empty(grid.shape[0])
    for start in range(0, grid.shape[0], 250):
        g = grid[start : start + 250]
        eta = x @ g.T
        loglik = (y[:, None] * eta - np.logaddexp(0, eta)).sum(0)
        logp[start : start + 250] = loglik / temperature - 0.5 * (g**2).sum(1) / prior_sd**2
    weight = np.exp(logp - logp.max())
    weight /= weight.sum()
    mean = weight @ grid
    sd = np.sqrt(weight @ (grid - mean) ** 2)
    return mean, sd


def test_logistic_posterior_at_temperature_one(logistic):
    model, x, y, step, cov, scale = logistic
    with model:
        idata = pm.sample(
            draws=1500, tune=100, step=step, chains=4, cores=1,
            initvals=step.control_variate.reference_point(), **sample_kwargs(random_seed=5),
        )
    draws = np.asarray(posterior(idata)["b"])
    ss = sample_stats(idata)
    assert float(ss["batch_size"].mean()) == 20.0  # never grew: s² < σ² = 1 at once
    assert float(ss["delta_variance"].mean()) < 0.01
    assert not bool(ss["recentered"].any())
    mean, sd = logistic_quadrature(x, y, 5.0, step.control_variate.reference.theta, cov)
    wrong_mean, wrong_sd = logistic_quadrature(
        x, y, 5.0, step.control_variate.reference.theta, 2 * cov, temperature=2.0
    )
    for j in range(2):
        ok, info = moments_ok(draws[..., j], mean[j], sd[j])
        assert ok, (j, info)
        # The same check rejects the posterior at temperature 2.
        assert not moments_ok(draws[..., j], wrong_mean[j], wrong_sd[j])[0]


# ------------------------------------------------------------------ conjugate models
def test_normal_conjugate_posterior_at_temperature_one():
    x = np.random.default_rng(6).normal(1.5, 2.0, size=20_000)
    precision = 1 / 10.0**2 + x.size / 2.0**2
    mean, sd = (x.sum() / 2.0**2) / precision, 1 / math.sqrt(precision)
    with normal_model(x):
        step = MinibatchBarker(
            control_variate="taylor", batch_size=10, S=[sd], scaling=2.38, tune=False
        )
        idata = pm.sample(
            draws=2000, tune=100, step=step, chains=4, cores=1, initvals={"mu": mean},
            **sample_kwargs(random_seed=7),
        )
    draws = np.asarray(posterior(idata)["mu"])
    ok, info = moments_ok(draws, mean, sd)
    assert ok, info
    assert float(sample_stats(idata)["batch_size"].mean()) == 10.0
    assert not moments_ok(draws, mean, 2 * sd)[0]  # the posterior at temperature 4


def test_poisson_gamma_conjugate_posterior_at_temperature_one():
    # λ ~ Gamma(a, b), y_i ~ Poisson(λ): λ | y ~ Gamma(a + Σy, b + N). The step samples
    # log λ, where the expansion is not exact: the residuals are not zero.
    y = np.random.default_rng(8).poisson(3.0, size=20_000)
    a, b = 2.0, 1.0
    shape, rate = a + y.sum(), b + y.size
    mean, sd = shape / rate, math.sqrt(shape) / rate
    with pm.Model():
        lam = pm.Gamma("lam", a, b)
        pm.Poisson("y", lam, observed=y)
        step = MinibatchBarker(
            control_variate="taylor", batch_size=10, S="laplace", scaling=2.38, tune=False
        )
        idata = pm.sample(
            draws=2000, tune=100, step=step, chains=4, cores=1, initvals={"lam": mean},
            **sample_kwargs(random_seed=9),
        )
    draws = np.asarray(posterior(idata)["lam"])
    ok, info = moments_ok(draws, mean, sd)
    assert ok, info
    ss = sample_stats(idata)
    assert float(ss["batch_size"].mean()) == 10.0
    assert 0 < float(ss["delta_variance"].max()) < 1e-3
    assert not moments_ok(draws, mean, math.sqrt(2) * sd)[0]  # temperature 2


# ------------------------------------------------------------- the other tests
def test_austere_and_mhsublhd_use_the_residuals(logistic):
    model, x, y, step, cov, scale = logistic
    n = x.shape[0]
    start = step.control_variate.reference_point()
    kwargs = dict(control_variate="taylor", reference=start, S=cov, scaling=scale, tune=False)
    with model:
        steps = {
            "austere": AustereMH(batch_size=20, **kwargs),
            "mhsublhd": MHSubLhd(batch_size=20, **kwargs),
        }
    for name, s in steps.items():
        s._start_chain(np.random.default_rng(10))
        point = dict(start)
        sizes, accepted = [], []
        for _ in range(30):
            point, stats = s.step(point)
            sizes.append(stats[0]["batch_size"])
            accepted.append(stats[0]["accepted"])
        # The residuals' spread is tiny: the tests decide on their first minibatches. A
        # step whose threshold falls near Δ* can still need more (MHSubLhd over 30 steps,
        # 10 seeds: mean 22–96 rows, largest step 68–1166); without control variates
        # both use 1,700–20,000 rows per step on average, all 20,000 for MHSubLhd.
        assert np.median(sizes) <= 2 * s.batch_size, (name, sizes)
        assert np.mean(sizes) < 0.02 * n, (name, sizes)
        assert 0 < np.mean(accepted) < 1, name
        if name == "mhsublhd":  # its range comes from a full pass of residuals (counted)
            assert stats[0]["extra_evaluations"] == n
        # The full pass is of residuals: they add up with the data-free part to Δ.
        est = s.estimator
        cur = s.likelihood.point_map.to_flat(point)
        prop = cur + 0.01
        data_free = est.open(cur, prop, np.array(0.5), 0.0, 0)
        total = est.full_pass().sum() + data_free
        est.close(1)
        exact = 0.5 * (logistic_loglik(x, y, prop) - logistic_loglik(x, y, cur)).sum()
        assert total == pytest.approx(exact + s.likelihood.prior_delta(cur, prop), rel=1e-8)


def test_recentering_during_tuning_only_and_counted():
    x, y = logistic_data(5000, seed=11)
    model = logistic_model(x, y)
    with model:
        far = {"b": np.array([1.5, -1.0])}  # many posterior sds from the mode
        step = MinibatchBarker(
            control_variate="taylor", reference=far, recenter=3.0, batch_size=20,
            S=[0.03, 0.03], tune=False,
        )
        first_theta = step.control_variate.reference.theta.copy()
        idata = pm.sample(
            draws=100, tune=150, step=step, chains=1, discard_tuned_samples=False,
            initvals={"b": np.array([-0.5, 1.0])}, **sample_kwargs(random_seed=12),
        )
    warm = idata["warmup_sample_stats"]
    warm = warm.to_dataset() if hasattr(warm, "to_dataset") else warm
    ss = sample_stats(idata)
    assert ss["recentered"].dtype == np.bool_
    flags = np.asarray(warm["recentered"])[0]
    assert flags.sum() >= 1 and flags[0]  # the start is far from the given reference
    extra = np.asarray(warm["extra_evaluations"])[0]
    np.testing.assert_array_equal(extra[flags], 5000)
    assert not bool(ss["recentered"].any())  # never after tuning
    assert step.control_variate.recenterings == int(flags.sum())
    # A new chain starts from the reference the step was built with.
    step._start_chain(np.random.default_rng(0))
    np.testing.assert_array_equal(step.control_variate.reference.theta, first_theta)


def test_failed_recentering_warns_once_per_chain_and_is_counted(monkeypatch):
    x = np.random.default_rng(18).normal(size=400)
    with normal_model(x):
        step = MinibatchBarker(control_variate="taylor", reference={"mu": 0.0}, recenter=1.0,
                               batch_size=10)
    cv = step.control_variate
    theta = cv.reference.theta.copy()

    def fail(x, what):
        raise ControlVariateError(f"The log-likelihood is not finite at the {what}.")

    monkeypatch.setattr(cv.passes, "reference_at", fail)
    far = theta + 100.0
    for chain in range(2):
        cv.start_chain(np.random.default_rng(chain), 10)
        with pytest.warns(UserWarning, match="re-centring the control variates failed") as rec:
            assert cv.maybe_recenter(far) == 400
            assert cv.maybe_recenter(far) == 400
        assert len([w for w in rec if "re-centring" in str(w.message)]) == 1, chain
        assert cv.recenter_failures == 2 * (chain + 1)
        np.testing.assert_array_equal(cv.reference.theta, theta)  # the old θ̂ is kept
    assert cv.recenterings == 0
    assert cv.maybe_recenter(theta) == 0  # near θ̂: nothing tried, nothing counted
    assert cv.recenter_failures == 4


def test_non_finite_prior_hessian_warns():
    x = np.random.default_rng(19).normal(size=300)
    with pm.Model():
        mu = pm.Normal("mu", 0.0, 10.0)
        pm.Potential("kink", -pt.abs(mu) ** 1.5)  # not twice differentiable at 0
        pm.Normal("x", mu, 2.0, observed=x)
        with pytest.warns(UserWarning, match=r"Hessian of the log prior is not finite at the "
                          r"reference point \(in the rows of \['mu'\]\).*reference="):
            step = MinibatchBarker(control_variate="taylor", reference={"mu": 0.0})
    np.testing.assert_array_equal(step.control_variate.reference.prior_hessian, [[0.0]])


def test_passes_compile_on_first_use_and_name_a_failed_compile(monkeypatch):
    x = np.random.default_rng(20).normal(size=300)
    model = normal_model(x)
    passes = TaylorPasses(MinibatchLikelihood(model, model.value_vars), "MinibatchBarker")
    compiled = {"value_grad_fn", "hvp_fn", "gradient_sums", "hessian_sums"}
    assert not compiled & set(vars(passes))  # nothing compiled before use
    passes.reference_at(np.array([0.5]), what="reference point")  # a Hessian pass
    assert compiled & set(vars(passes)) == compiled - {"gradient_sums"}

    def broken(*args, **kwargs):
        raise RuntimeError("no backend")

    passes = TaylorPasses(MinibatchLikelihood(model, model.value_vars), "MinibatchBarker")
    monkeypatch.setattr(full_passes, "compile_derived", broken)
    for _ in range(2):  # the same clear error each time, not an AttributeError
        with pytest.raises(ControlVariateError, match=r"function value_grad_fn .*"
                           r"RuntimeError: no backend.*control_variate=None"):
            _ = passes.gradient_sums


def test_compound_step_hyperprior_allowed_and_pickles(logistic):
    x, y = logistic_data(2000, seed=13)
    with pm.Model():
        tau = pm.HalfNormal("tau", 5.0)
        b = pm.Normal("b", 0.0, tau, shape=2)
        pm.Bernoulli("y", logit_p=pt.dot(x, b), observed=y)
        step = MinibatchBarker([b], control_variate="taylor", batch_size=20, S=[0.05, 0.05])
        idata = pm.sample(
            draws=50, tune=50, step=[step, pm.NUTS([tau])], chains=2, cores=2, mp_ctx="fork",
            **sample_kwargs(random_seed=14),
        )
    assert np.asarray(posterior(idata)["b"]).shape == (2, 50, 2)
    assert float(sample_stats(idata)["batch_size"].mean()) < 100


# -------------------------------------------------------------------------- errors
def test_errors_of_the_settings(glm):
    model, x, y, b_hat, _ = glm
    with model:
        with pytest.raises(ValueError, match="control_variate must be one of"):
            MinibatchBarker(control_variate="linear")
        with pytest.raises(ValueError, match="need control_variate='taylor'"):
            MinibatchBarker(control_variate=None, reference={"b": b_hat})
        with pytest.raises(TypeError, match="control_variate"):
            ExactMH(control_variate="taylor")  # not a keyword of the exact step
        with pytest.raises(ValueError, match="recenter must be"):
            MinibatchBarker(control_variate="taylor", reference={"b": b_hat}, recenter=-1)
        with pytest.raises(ControlVariateError, match="no value for"):
            MinibatchBarker(control_variate="taylor", reference={"c": b_hat})
        with pytest.raises(ControlVariateError, match="shape"):
            MinibatchBarker(control_variate="taylor", reference={"b": np.zeros(3)})
        with pytest.raises(ControlVariateError, match="not finite"):
            MinibatchBarker(control_variate="taylor", reference={"b": [0.0, np.inf]})
        with pytest.raises(ValueError, match="S='laplace' .* needs control_variate"):
            MinibatchBarker(S="laplace", control_variate=None)
        with pytest.raises(ControlVariateError, match="point dict"):
            MinibatchBarker(control_variate="taylor", reference=[0.1, 0.2])


def test_error_likelihood_depends_on_variables_of_another_step():
    x = np.random.default_rng(15).normal(size=500)
    with pm.Model():
        mu = pm.Normal("mu", 0, 5)
        sigma = pm.HalfNormal("sigma", 2)
        pm.Normal("x", mu, sigma, observed=x)
        with pytest.raises(NotSupported, match=r"also depends on \['sigma_log__'\]"):
            MinibatchBarker([mu], control_variate="taylor")
        # Sampling both with the step is fine, and the transformed reference is accepted
        # under the variable's own name.
        step = MinibatchBarker(control_variate="taylor", reference={"mu": 0.0, "sigma": 1.0})
    assert step.control_variate.reference.theta == pytest.approx([0.0, 0.0])


def test_error_map_not_converged(monkeypatch):
    x = np.random.default_rng(16).normal(size=300)
    from pymc_minibatch_mh.estimators import reference as reference_module

    monkeypatch.setattr(reference_module, "MAP_TOLERANCE", -1.0)
    with normal_model(x):
        with pytest.raises(ControlVariateError, match="did not converge.*reference="):
            MinibatchBarker(control_variate="taylor")


def test_data_changed_after_build_is_followed():
    """pm.set_data after the build: the next chain start repeats the set-up (here the pass
    at the user's reference: G = Σ(x_i − 0) on the new data); the estimator alone still
    refuses data it was not set up on (tests/test_set_data_setup.py checks the draws)."""
    x = np.random.default_rng(17).normal(size=300)
    with pm.Model() as model:
        xd = pm.Data("xd", x)
        mu = pm.Normal("mu", 0, 5)
        pm.Normal("x", mu, 1.0, observed=xd)
        step = MinibatchBarker(control_variate="taylor", reference={"mu": 0.0})
    step._start_chain(np.random.default_rng(0))  # unchanged data: fine
    cv = step.control_variate
    assert cv.setups == 1
    np.testing.assert_allclose(cv.reference.gradient, [x.sum()], rtol=1e-12)
    with model:
        pm.set_data({"xd": x + 1.0})
    step._start_chain(np.random.default_rng(0))
    assert cv.setups == 2
    np.testing.assert_allclose(cv.reference.gradient, [x.sum() + 300.0], rtol=1e-12)
    np.testing.assert_allclose(cv.reference.theta, [0.0])
    with model:
        pm.set_data({"xd": x[:120] - 1.0})
    step.likelihood.n_rows()  # the store reads the new data; follow_data() not called
    with pytest.raises(ControlVariateError, match="changed since.*follow_data"):
        cv.start_chain(np.random.default_rng(0), 50)


# --------------------------------------------------------------------------- slow
@pytest.mark.slow
@pytest.mark.newest_line
def test_logistic_d5_against_nuts():
    rng = np.random.default_rng(20)
    n, d = 50_000, 5
    x = np.column_stack([np.ones(n), rng.normal(size=(n, d - 1))])
    y = (rng.random(n) < expit(x @ rng.normal(size=d) * 0.5)).astype(np.int64)
    model = logistic_model(x, y)
    with model:
        step = MinibatchBarker(
            control_variate="taylor", batch_size=20, S="laplace", scaling=2.38 / math.sqrt(d),
            tune=False,
        )
        start = step.control_variate.reference_point()
        ours = pm.sample(draws=10_000, tune=500, step=step, chains=4, cores=1, initvals=start,
                         **sample_kwargs(random_seed=21))
        nuts = pm.sample(draws=2000, tune=1000, chains=2, cores=1, initvals=start,
                         **sample_kwargs(random_seed=22))
    a, b = np.asarray(posterior(ours)["b"]), np.asarray(posterior(nuts)["b"])
    for j in range(d):
        se = math.hypot(mcse(a[..., j]), mcse(b[..., j]))
        se_sd = math.hypot(mcse(a[..., j], "sd"), mcse(b[..., j], "sd"))
        assert abs(a[..., j].mean() - b[..., j].mean()) < 4 * se
        assert abs(a[..., j].std() - b[..., j].std()) < 4 * se_sd
    assert float(sample_stats(ours)["batch_size"].mean()) == 20.0


@pytest.mark.slow
@pytest.mark.newest_line
def test_austere_posterior_at_temperature_one(logistic):
    model, x, y, step, cov, scale = logistic
    with model:
        austere = AustereMH(batch_size=20, control_variate="taylor",
                            reference=step.control_variate.reference_point(), S=cov,
                            scaling=scale, tune=False)
        idata = pm.sample(draws=3000, tune=200, step=austere, chains=4, cores=1,
                          initvals=step.control_variate.reference_point(),
                          **sample_kwargs(random_seed=23))
    draws = np.asarray(posterior(idata)["b"])
    mean, sd = logistic_quadrature(x, y, 5.0, step.control_variate.reference.theta, cov)
    for j in range(2):
        ok, info = moments_ok(draws[..., j], mean[j], sd[j])
        assert ok, (j, info)


@pytest.mark.slow
@pytest.mark.newest_line
def test_austere_adaptive_design_with_residuals(logistic):
    model, x, y, step, cov, scale = logistic
    start = step.control_variate.reference_point()
    with model:
        austere = AustereMH(design="adaptive", control_variate="taylor", reference=start,
                            S=cov, scaling=scale, tune=False)
    austere._start_chain(np.random.default_rng(24))
    point, sizes = dict(start), []
    for _ in range(30):
        point, stats = austere.step(point)
        sizes.append(stats[0]["batch_size"])
        assert stats[0]["extra_evaluations"] == x.shape[0]  # the design's full pass
    assert np.mean(sizes) <= 2 * austere.batch_size
