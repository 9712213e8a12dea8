"""A GLM is a GLM whatever its dispersion's prior or the form it is written in.

A negative binomial's ``alpha`` given a prior of any positive family, or written as
``1/φ``, ``φ**2``, ``a * b`` or ``sqrt(φ)`` of log-transformed scales, enters the
likelihood only through its logarithm (affine in the unconstrained values) and itself
(``exp`` of that): the default step must take the GLM path (the θ-space expansion with
Crank–Nicolson moves) for each, and the posterior must match NUTS. Before the logarithm
of such forms was read, ``1/φ``, ``φ**2`` and ``a * b`` took the hierarchical path.

The path follows from the analysis of the per-row quantities (``select``: an affine
analysis is the θ-space expansion, and Crank–Nicolson follows it, as
``test_proposal_choice.py`` checks), so each form is checked there, without the step's
set-up; one form builds the whole step.
"""

from __future__ import annotations

import warnings

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest

from pymc_minibatch_mh import MinibatchBarker
from pymc_minibatch_mh.estimators import predictor_walk
from pymc_minibatch_mh.estimators.predictor_analysis import PredictorAnalysis, select
from pymc_minibatch_mh.estimators.predictor_taylor import PredictorTaylorEstimator
from pymc_minibatch_mh.model.likelihood import MinibatchLikelihood

N_ROWS = 3000


def _data(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=N_ROWS)
    mu = np.exp(0.5 + 0.3 * x)
    return x, rng.negative_binomial(2.0, 2.0 / (2.0 + mu))


FORMS = {
    "exponential": lambda: pm.Exponential("alpha", 1.0),
    "halfnormal": lambda: pm.HalfNormal("alpha", 5.0),
    "gamma": lambda: pm.Gamma("alpha", 2.0, 1.0),
    "reciprocal": lambda: 1.0 / pm.Exponential("phi", 1.0),
    "square": lambda: pm.HalfNormal("phi", 2.0) ** 2,
    "product": lambda: pm.HalfNormal("a", 2.0) * pm.HalfNormal("b", 2.0),
    "sqrt": lambda: pt.sqrt(pm.Gamma("phi", 2.0, 0.5)),
}


def _model(form: str) -> pm.Model:
    x, y = _data()
    with pm.Model() as model:
        b0 = pm.Normal("b0", 0, 5)
        b1 = pm.Normal("b1", 0, 5)
        alpha = FORMS[form]()
        pm.NegativeBinomial("y", mu=pt.exp(b0 + b1 * x), alpha=alpha, observed=y)
    return model


def _step(model: pm.Model) -> MinibatchBarker:
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return MinibatchBarker()


def _analysis(form: str) -> PredictorAnalysis | None:
    model = _model(form)
    return select(MinibatchLikelihood(model, model.value_vars))[0]


@pytest.mark.parametrize("form", list(FORMS))
def test_the_dispersion_s_form_does_not_change_the_path(form):
    analysis = _analysis(form)
    assert analysis is not None and analysis.is_affine()


def test_the_step_takes_the_glm_path():
    step = _step(_model("square"))
    assert not isinstance(step.control_variate, PredictorTaylorEstimator)
    assert step.proposal.name == "crank_nicolson"


def test_a_walk_that_does_not_read_the_forms_takes_the_other_path(monkeypatch):
    monkeypatch.setattr(predictor_walk, "log_form", lambda var: None)
    monkeypatch.setattr("pymc_minibatch_mh.estimators.predictor.log_form", lambda var: None)
    analysis = _analysis("reciprocal")
    assert analysis is not None and not analysis.is_affine()


def test_the_reciprocal_form_s_posterior_matches_nuts():
    az = pytest.importorskip("arviz")
    model = _model("reciprocal")
    with model:
        idata = pm.sample(step=_step(model), chains=2, cores=1, random_seed=5,
                          progressbar=False)
        ref = pm.sample(chains=2, cores=1, random_seed=6, progressbar=False)
    names = ["b0", "b1", "phi"]
    ours = az.summary(idata, var_names=names, round_to="none")
    nuts = az.summary(ref, var_names=names, round_to="none")
    z = (ours["mean"] - nuts["mean"]) / np.hypot(ours["mcse_mean"], nuts["mcse_mean"])
    # The sd estimate's relative Monte Carlo sd is about 1/√(2 ESS) for each run.
    limit = 4.0 * np.sqrt(1.0 / (2.0 * ours["ess_bulk"]) + 1.0 / (2.0 * nuts["ess_bulk"]))
    assert float(ours["r_hat"].max()) < 1.01
    assert float(z.abs().max()) < 4.0
    assert float(((ours["sd"] / nuts["sd"] - 1.0).abs() / limit).max()) < 1.0
