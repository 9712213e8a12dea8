"""Control variates on a log-likelihood PyTensor can differentiate once but not twice.

- the differenced curvature (central differences of the per-row gradient) agrees with the
  symbolic one on a negative-binomial regression, where both exist, to a tolerance
  derived from the difference step, in the full-data Hessian and in every row's residual;
  Δ* (closed form plus all residuals) stays the exact Δ;
- a likelihood written with ``pt.hyp2f1`` (whose gradient has no gradient) builds with a
  visible warning, its residuals match a hand-written expansion, and (slow) its posterior
  matches the exact conjugate one.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest
from conftest import sample_kwargs
from pytensor.graph.utils import MethodNotDefined

from pymc_minibatch_mh import MinibatchBarker
from pymc_minibatch_mh.estimators import taylor as cv_module
from pymc_minibatch_mh.estimators.differenced import DIFFERENCE_STEP, DifferencedPasses
from pymc_minibatch_mh.model.compat import mcse, posterior

EPS = float(np.finfo(np.float64).eps)
#: Relative error of a central difference of the gradient with step h: truncation
#: (h²) and rounding (ε/h), with a margin of 100 for the scale of the third derivatives
#: and of the summed gradients.
DIFFERENCE_RTOL = 100.0 * (DIFFERENCE_STEP**2 + EPS / DIFFERENCE_STEP)


def negative_binomial_glm(n=2000, seed=3):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    mu = np.exp(0.4 + 0.5 * x)
    y = rng.negative_binomial(2.0, 2.0 / (2.0 + mu))
    with pm.Model() as model:
        b = pm.Normal("b", 0.0, 2.0, shape=2)
        alpha = pm.Exponential("alpha", 1.0)
        pm.NegativeBinomial("y", mu=pt.exp(b[0] + b[1] * x), alpha=alpha, observed=y)
    return model


def without_second_derivative(monkeypatch):
    """Make the estimator's second symbolic derivative fail as ``hyp2f1``'s does."""
    made = []

    def jvp(f, wrt, tangent):
        if any(f is g for g in made):
            raise MethodNotDefined("grad", type(None), "SecondDerivativeForTest")
        out = real_jvp(f, wrt, tangent)
        made.append(out)
        return out

    real_jvp = cv_module.jvp
    monkeypatch.setattr(cv_module, "jvp", jvp)
    # A cached symbolic function would not be derived again (and so would not fail).
    monkeypatch.setenv("PYMC_MINIBATCH_MH_FUNCTION_CACHE", "0")


def test_differenced_curvature_matches_the_symbolic_one(monkeypatch):
    model = negative_binomial_glm()
    reference = {"b": np.array([0.35, 0.55]), "alpha": 1.7}  # not the MAP
    with model:
        symbolic = MinibatchBarker(control_variate="taylor_theta", reference=reference)
    without_second_derivative(monkeypatch)
    with model, pytest.warns(UserWarning, match="SecondDerivativeForTest.*curvature is numerical"):
        numerical = MinibatchBarker(control_variate="taylor_theta", reference=reference)
    cv_sym, cv_num = symbolic.control_variate, numerical.control_variate
    assert cv_sym.numerical_curvature is None
    assert "SecondDerivativeForTest" in cv_num.numerical_curvature
    assert isinstance(cv_num.passes, DifferencedPasses)
    d = cv_num.dim
    # One pass with the differenced Hessian evaluates every row 2d + 1 times.
    assert cv_num.setup_evaluations == (2 * d + 1) * cv_num.store.n_rows
    h_sym, h_num = cv_sym.reference.hessian, cv_num.reference.hessian
    np.testing.assert_allclose(cv_num.reference.gradient, cv_sym.reference.gradient,
                               rtol=1e-12)
    np.testing.assert_allclose(h_num, h_num.T, rtol=0, atol=0)
    np.testing.assert_allclose(h_num, h_sym, rtol=DIFFERENCE_RTOL,
                               atol=DIFFERENCE_RTOL * np.abs(h_sym).max())
    # Per row: the residuals of both estimators agree to the same tolerance, relative to
    # the curvature term of each row.
    rng = np.random.default_rng(5)
    rows = np.sort(rng.permutation(cv_num.store.n_rows)[:300]).astype(np.int64)
    theta = cv_num.reference.theta
    for temperature in (1.0, 4.0):
        cur = theta + 0.05 * rng.normal(size=d)
        prop = cur + 0.05 * rng.normal(size=d)
        inv_t = np.array(1.0 / temperature)
        r_sym, free_sym = cv_sym.fn(cur, prop, inv_t, *cv_sym.store.rows(rows))
        r_num, free_num = cv_num.fn(cur, prop, inv_t, *cv_num.store.rows(rows))
        r_sym, r_num = np.array(r_sym), np.array(r_num)
        ratios = np.asarray(symbolic.likelihood.delta(cur, prop, rows, inv_t)[0])
        np.testing.assert_allclose(r_num, r_sym, rtol=0,
                                   atol=DIFFERENCE_RTOL * np.abs(ratios).max())
        assert float(free_num) == pytest.approx(float(free_sym), rel=DIFFERENCE_RTOL)
        # A differenced curvature that is wrong (here: no curvature term) is told apart.
        assert np.abs(r_sym - ratios).max() > 1e3 * DIFFERENCE_RTOL * np.abs(ratios).max()
        # Closed form plus all residuals is the exact Δ: the sums use the same differences.
        numerical._start_chain(np.random.default_rng(0))
        cv_num.open(cur, prop, inv_t, 0.0, 0)
        full = cv_num.full_pass()
        exact = (float(np.sum(numerical.likelihood.delta(
            cur, prop, np.arange(cv_num.store.n_rows, dtype=np.int64), inv_t)[0]))
            + numerical.likelihood.prior_delta(cur, prop))
        assert full.sum() + float(free_num) == pytest.approx(exact, rel=1e-9, abs=1e-9)


def hyp2f1_exponential(n=2000, seed=11, rate=3.0):
    """Exponential data whose log-likelihood is written with ``hyp2f1``.

    ``hyp2f1(λ, 1, 1, z) = (1 − z)^(−λ)``, so with ``z = 1 − exp(−y)`` the log-likelihood
    ``log λ − log hyp2f1(λ, 1, 1, z)`` is ``log λ − λ y``; with a Gamma(a, b) prior the
    posterior of λ is Gamma(a + n, b + Σy).
    """
    y = np.random.default_rng(seed).exponential(1.0 / rate, size=n)

    def logp(value, lam):
        z = 1.0 - pt.exp(-value)
        return pt.log(lam) - pt.log(pt.hyp2f1(lam, 1.0, 1.0, z))

    with pm.Model() as model:
        lam = pm.Gamma("lam", 2.0, 1.0)
        pm.CustomDist("y", lam, logp=logp, observed=y)
    return model, y


def test_hyp2f1_likelihood_builds_with_a_differenced_curvature():
    model, y = hyp2f1_exponential()
    with model, pytest.warns(UserWarning, match="no symbolic second derivative.*Grad2F1"):
        step = MinibatchBarker(control_variate="taylor")
    cv = step.control_variate
    assert "Grad2F1" in cv.numerical_curvature
    theta = float(cv.reference.theta[0])  # log λ̂
    # ℓ_i(θ) = θ − e^θ y_i: the expansion at θ̂ by hand.
    assert cv.reference.hessian[0, 0] == pytest.approx(-np.exp(theta) * y.sum(),
                                                       rel=DIFFERENCE_RTOL)
    rows = np.arange(0, y.size, 3, dtype=np.int64)
    cur, prop = np.array([theta - 0.03]), np.array([theta + 0.02])
    delta, w = prop - cur, prop + cur - 2 * theta
    yr = y[rows]

    def loglik(t):
        return t - np.exp(t) * yr

    proxy = (1 - np.exp(theta) * yr) * delta[0] - 0.5 * np.exp(theta) * yr * delta[0] * w[0]
    expected = loglik(prop[0]) - loglik(cur[0]) - proxy
    r, _ = cv.fn(cur, prop, np.array(1.0), *cv.store.rows(rows))
    scale = np.abs(loglik(prop[0]) - loglik(cur[0])).max()
    # The hyp2f1 gradient is a series summed to its own tolerance: a looser bound.
    np.testing.assert_allclose(np.asarray(r), expected, rtol=0, atol=1e-6 * scale)


@pytest.mark.slow
@pytest.mark.newest_line
def test_hyp2f1_likelihood_samples_the_exact_posterior():
    model, y = hyp2f1_exponential()
    with model, pytest.warns(UserWarning, match="curvature is numerical"):
        step = MinibatchBarker(control_variate="taylor")
        idata = pm.sample(step=step, draws=2000, tune=1000, chains=2, cores=1,
                          **sample_kwargs(random_seed=7))
    draws = np.asarray(posterior(idata)["lam"]).reshape(-1)
    shape, rate = 2.0 + y.size, 1.0 + y.sum()
    mean, sd = shape / rate, np.sqrt(shape) / rate
    se_mean, se_sd = mcse(draws, "mean"), mcse(draws, "sd")
    assert abs(draws.mean() - mean) < 4 * se_mean
    assert abs(draws.std() - sd) < 4 * se_sd
    # A posterior one sd off fails the same check.
    assert abs(draws.mean() - (mean + sd)) > 4 * se_mean
