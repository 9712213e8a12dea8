"""Set-up in about one pass on tall data, and the start check folded into it.

Above 4 × ``SUBSAMPLE_ROWS`` rows θ̂ comes from a subsample's mode by a few gradient
passes and one pass with the Hessian (the sums at θ̂ are the full data's, so the posterior
is unchanged; a step that used the subsample's sums instead is shown to fail the same
check). A tuned chain with control
variates starts at θ̂, where that pass read every row, so its start check makes no pass of
its own; a model that is not finite on the data is still refused, by the set-up, with the
row named. The subsample size is patched so that these run at N = 2·10⁴.
"""

from __future__ import annotations

import logging

import numpy as np
import pymc as pm
import pytest
from conftest import sample_kwargs
from test_control_variates import logistic_data, logistic_model, logistic_quadrature, moments_ok
from test_shifted_set import N as crossed_n
from test_shifted_set import crossed_model

from pymc_minibatch_mh import MinibatchBarker
from pymc_minibatch_mh.errors import ModelNotSupportedError
from pymc_minibatch_mh.estimators import predictor_passes as predictor_passes_module
from pymc_minibatch_mh.estimators import reference as reference_module
from pymc_minibatch_mh.estimators.full_passes import add_chunks
from pymc_minibatch_mh.estimators.predictor_passes import PredictorPasses
from pymc_minibatch_mh.estimators.reference import TaylorPasses
from pymc_minibatch_mh.model.compat import posterior
from pymc_minibatch_mh.model.likelihood import MinibatchLikelihood

N, SUBSAMPLE = 20_000, 1_000


def _subsample(passes, fn, x):
    """The broken variant: the subsample's sums scaled by N/m instead of a full pass."""
    n, m = passes.store.n_rows, reference_module.SUBSAMPLE_ROWS
    rows = passes._subsample_rows()
    passes.evaluations += n
    return tuple(None if v is None else n / m * v for v in add_chunks([fn(x, *rows)]))


def _theta_sums(self, x, hessian):
    return _subsample(self, self.hessian_sums if hessian else self.gradient_sums, x)


def _predictor_sums(self, x):
    return _subsample(self, self._chunk_sums, x)


def _sample(seed):
    x, y = logistic_data(N, seed=11)
    model = logistic_model(x, y)
    with model:
        step = MinibatchBarker(control_variate="taylor")
        idata = pm.sample(draws=1000, tune=500, chains=2, cores=1, step=step,
                          **sample_kwargs(random_seed=seed))
    return x, y, step, np.asarray(posterior(idata)["b"])


def _moments_ok(x, y, step, draws):
    cov = step.control_variate.laplace_covariance()
    mean, sd = logistic_quadrature(x, y, 5.0, step.control_variate.reference.laplace_mean(), cov)
    return [moments_ok(draws[..., j], mean[j], sd[j]) for j in range(2)]


def test_subsample_reference_keeps_the_posterior(monkeypatch):
    monkeypatch.setattr(reference_module, "SUBSAMPLE_ROWS", SUBSAMPLE)
    x, y, step, draws = _sample(seed=3)
    cv = step.control_variate
    # θ̂ within a posterior sd of the mode, one pass with the Hessian.
    assert cv.passes.subsample_reference and cv.map_decrement <= 1.0
    assert cv.passes.hessian_passes == 1
    for ok, info in _moments_ok(x, y, step, draws):
        assert ok, info


def test_subsample_sums_instead_of_the_full_pass_fail(monkeypatch):
    monkeypatch.setattr(reference_module, "SUBSAMPLE_ROWS", SUBSAMPLE)
    monkeypatch.setattr(TaylorPasses, "_full_pass", _theta_sums)
    monkeypatch.setattr(PredictorPasses, "sums", _predictor_sums)
    x, y, step, draws = _sample(seed=3)
    assert step.control_variate.passes.subsample_reference
    assert not all(ok for ok, _ in _moments_ok(x, y, step, draws))


def _record_start_checks(monkeypatch, priors=None):
    calls = []
    check = MinibatchLikelihood.check_point

    def recorded(self, point, rows=True, prior=None):
        calls.append(rows)
        if priors is not None:
            priors.append(prior)
        return check(self, point, rows=rows, prior=prior)

    monkeypatch.setattr(MinibatchLikelihood, "check_point", recorded)
    return calls


@pytest.mark.parametrize("tune", [True, False])
def test_tuned_chains_start_at_the_reference_without_a_pass(monkeypatch, tune):
    x, y = logistic_data(2_000, seed=1)
    with logistic_model(x, y):
        step = MinibatchBarker(control_variate="taylor", tune=tune)
        priors = []
        calls = _record_start_checks(monkeypatch, priors)
        pm.sample(draws=5, tune=5 if tune else 0, chains=2, cores=1, step=step,
                  **sample_kwargs(random_seed=1))
    # With tuning each chain starts at θ̂ (read by the set-up's pass): no pass, and the
    # log prior is the set-up's at θ̂ (the prior's own function is not compiled for the
    # check). Without, at PyMC's start point: one pass each and the prior evaluated.
    assert calls == ([False, False] if tune else [True, True])
    if tune:
        lik = step.likelihood
        # Nor the per-row function: the split is validated in the validation's mode.
        assert "_prior_direct" not in vars(lik) and "_rows_fn" not in vars(lik)
        theta = step.control_variate.initial_reference.theta
        assert priors == pytest.approx([lik.prior(theta)] * 2, rel=1e-12)
    else:
        assert priors == [None, None]


@pytest.mark.parametrize("reference", [None, {"mu": 0.0}])
def test_data_not_finite_is_refused_at_setup_with_the_row(reference):
    counts = np.ones(300, dtype=np.int64)
    counts[7] = -1  # a count the Poisson gives probability 0
    with pm.Model():
        mu = pm.Normal("mu")
        pm.Poisson("y", pm.math.exp(mu), observed=counts)
        with pytest.raises(ModelNotSupportedError, match=r"not finite.*1 of 300.*row 7.*invalid"):
            MinibatchBarker(control_variate="taylor", reference=reference)


def test_without_a_laplace_fit_on_the_subsample_the_search_is_polished(monkeypatch):
    """Where the subsample's Hessian is not negative definite the gradient steps are
    not taken and the trust-region Newton steps run as before."""
    monkeypatch.setattr(reference_module, "SUBSAMPLE_ROWS", SUBSAMPLE)
    monkeypatch.setattr(TaylorPasses, "hessian_on", lambda self, x, rows: np.eye(x.size))
    monkeypatch.setattr(PredictorPasses, "hessian_on", lambda self, x, rows: np.eye(x.size))
    x, y = logistic_data(N, seed=11)
    with logistic_model(x, y):
        step = MinibatchBarker(control_variate="taylor", tune=False)
    cv = step.control_variate
    assert not cv.passes.subsample_reference and cv.map_converged
    assert 2 <= step.setup_passes


def test_a_newton_search_that_stops_short_is_continued_not_restarted(monkeypatch):
    """When the trust-region Newton steps from the subsample's start stop short of the
    tolerance (at N = 10⁶ on crossed random intercepts they ran out of iterations 2.6
    posterior sds from the mode), the full-data L-BFGS-B starts at their last point, not
    at the model's initial point (which cost 863 full passes there)."""
    monkeypatch.setattr(reference_module, "SUBSAMPLE_ROWS", SUBSAMPLE)
    monkeypatch.setattr(TaylorPasses, "hessian_on", lambda self, x, rows: np.eye(x.size))
    monkeypatch.setattr(PredictorPasses, "hessian_on", lambda self, x, rows: np.eye(x.size))
    minimize, calls = reference_module.optimize.minimize, []

    def recorded(fun, x0, *args, method=None, options=None, **kwargs):
        if method == "trust-exact" and "trust-exact" not in [c[0] for c in calls]:
            options = {**options, "maxiter": 1}  # the first Newton steps stop short
        result = minimize(fun, x0, *args, method=method, options=options, **kwargs)
        calls.append((method, np.array(x0), np.array(result.x)))
        return result

    monkeypatch.setattr(reference_module.optimize, "minimize", recorded)
    x, y = logistic_data(N, seed=11)
    with logistic_model(x, y):
        step = MinibatchBarker(control_variate="taylor", tune=False)
    # The subsample's mode (L-BFGS-B), the Newton steps, then the full-data search.
    methods = [method for method, _, _ in calls]
    assert methods[:3] == ["L-BFGS-B", "trust-exact", "L-BFGS-B"]
    np.testing.assert_array_equal(calls[2][1], calls[1][2])
    assert step.control_variate.map_converged


def test_a_point_of_the_search_evaluates_the_prior_once():
    """The prior's value, gradient and Hessian at a point are kept: the reference at a
    point and the search's log posterior there do not evaluate them again."""
    x, y = logistic_data(500, seed=3)
    with logistic_model(x, y):
        step = MinibatchBarker(control_variate="taylor", tune=False)
    passes = step.control_variate.passes
    calls = []
    prior_all = passes._prior_all_fn
    passes._prior_all_fn = lambda *args: calls.append(1) or prior_all(*args)
    point = np.full(passes.dim, 0.3)
    value, g, h = passes.prior(point, hessian=True)
    first = len(calls)
    assert first >= 1
    again = passes.prior(point)
    assert len(calls) == first  # kept
    assert again[0] == value and np.array_equal(again[1], g) and again[2] is None
    again[1][:] = np.nan  # a caller's copy: the kept gradient is not changed
    assert np.array_equal(passes.prior(point, hessian=True)[1], g)
    assert len(calls) == first
    passes.prior(point + 0.1)
    assert len(calls) == first + 1  # another point is evaluated


def _map_search(monkeypatch, max_dim=None, steps=None):
    """The MAP search on crossed non-centred random intercepts (N = 3,000, d = 50)."""
    if max_dim is not None:
        monkeypatch.setattr(predictor_passes_module, "EXPANSION_STEPS_MAX_DIM", max_dim)
    if steps is not None:
        monkeypatch.setattr(predictor_passes_module, "EXPANSION_STEPS", steps)
    model, _ = crossed_model()
    with model:
        step = MinibatchBarker(control_variate="taylor", tune=False)
    cv = step.control_variate
    assert isinstance(cv.passes, PredictorPasses) and cv.map_converged
    return cv


def test_expansion_steps_find_a_hierarchical_mode_in_a_few_passes(monkeypatch):
    """The search maximises the expansion in the coefficients (exact in how θ reaches
    them: the scales times the offsets) at each pass: at most five passes, each with the
    Hessian, and the gradient function never compiled. L-BFGS-B needs many times more
    passes to the same mode (within MAP_TOLERANCE posterior sds)."""
    steps = _map_search(monkeypatch)
    n_passes = steps.map_evaluations / crossed_n
    assert n_passes <= 5 and steps.passes.hessian_passes == n_passes
    assert "value_grad_fn" not in vars(steps.passes)
    lbfgs = _map_search(monkeypatch, max_dim=0)
    assert "value_grad_fn" in vars(lbfgs.passes)
    assert lbfgs.map_evaluations / crossed_n > 3 * n_passes
    sd = np.sqrt(np.diag(np.linalg.inv(lbfgs.reference.precision())))
    np.testing.assert_array_less(np.abs(steps.reference.theta - lbfgs.reference.theta) / sd,
                                 2 * reference_module.MAP_TOLERANCE)


def test_expansion_steps_that_stop_short_are_continued_by_lbfgs(monkeypatch, caplog):
    """Expansion steps that do not reach the tolerance within EXPANSION_STEPS passes hand
    their last point to L-BFGS-B (and the polish), which finds the mode; the log says so."""
    with caplog.at_level(logging.INFO, logger="pymc_minibatch_mh"):
        cv = _map_search(monkeypatch, steps=1)
    assert "value_grad_fn" in vars(cv.passes)
    assert cv.map_decrement <= reference_module.MAP_TOLERANCE
    assert "the expansion steps of the MAP search stopped" in caplog.text
