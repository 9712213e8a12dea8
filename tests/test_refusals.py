"""Models and settings MinibatchBarker must refuse before sampling, with a clear message.

Every message must say what is wrong and what to do; the tests match key words of both.
Cases already in ``test_step_barker.py`` (the basic discrete variable, MvNormal over all
rows, two observed lengths, covariate changed by set_data, Minibatch + total_size, no
observed variable, a likelihood that is -inf at the start, ``x - x.mean()``, the basic bad
parameters, batch size > N) are not repeated; these are the other cases and variants.
Most models are compiled with ``mode="FAST_COMPILE"`` to keep the file fast: the checks do
not depend on the backend.
"""

from __future__ import annotations

import math

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest
from conftest import sample_kwargs

from pymc_minibatch_mh import MinibatchBarker, get_correction
from pymc_minibatch_mh.core.correction import LOGISTIC_SD
from pymc_minibatch_mh.errors import ModelNotSupportedError, StartPointError
from pymc_minibatch_mh.model.compat import posterior, sample_stats

FAST = dict(mode="FAST_COMPILE")
SPLIT = "cannot be split per observation"


def build(**kwargs):
    options = dict(batch_size=5, tune=False, **FAST)
    options.update(kwargs)
    return MinibatchBarker(**options)


def sample(step, **kwargs):
    return pm.sample(draws=5, tune=0, chains=1, step=step, **sample_kwargs(**kwargs))


# ------------------------------------------------------------ discrete variables
def test_discrete_variable_given_explicitly_and_the_advice_works():
    rng = np.random.default_rng(0)
    with pm.Model():
        k = pm.Bernoulli("k", 0.5)
        mu = pm.Normal("mu")
        pm.Normal("y", mu + k, 1, observed=rng.normal(size=50))
        with pytest.raises(ModelNotSupportedError, match=r"discrete.*pm\.Metropolis"):
            build(vars=[mu, k])
        # What the message says to do: the discrete variable to another step method.
        step = build(vars=[mu])
        idata = sample([step, pm.Metropolis([k])])
    assert set(np.unique(np.asarray(posterior(idata)["k"]))) <= {0, 1}


# ----------------------------------------------- likelihoods that do not split
def _whole_data_model(kind, n, coefficient=False):
    rng = np.random.default_rng(1)
    with pm.Model() as model:
        xd = pm.Data("x", rng.normal(size=n))
        mu = pm.Normal("mu")
        b = pm.Normal("b") if coefficient else 1.0
        terms = {
            "mean": xd - xd.mean(),
            "cumsum": pt.cumsum(xd),
            "sort": pt.sort(xd),
            "max": xd / pt.max(pt.abs(xd)),
            "reverse": xd[::-1],
            "standardise": (xd - xd.mean()) / xd.std(),
        }
        pm.Normal("y", mu + b * terms[kind], 1, observed=rng.normal(size=n))
    return model


@pytest.mark.parametrize("kind", ["cumsum", "sort", "max", "reverse", "standardise"])
def test_whole_data_summaries(kind):
    with _whole_data_model(kind, 300):
        with pytest.raises(ModelNotSupportedError, match=f"{SPLIT}.*beforehand"):
            build()


@pytest.mark.parametrize("n", [2, 3, 40])
@pytest.mark.parametrize("kind", ["mean", "cumsum", "max"])
def test_whole_data_summaries_small_n(kind, n):
    """Regression: with N <= 64 the checked subsets were all rows (in order), and with
    N <= 3 a prefix of them, so cumulative sums or summaries went undetected."""
    with _whole_data_model(kind, n):
        with pytest.raises(ModelNotSupportedError, match=SPLIT):
            build(batch_size=1)


@pytest.mark.parametrize("kind", ["mean", "sort", "standardise"])
def test_whole_data_summaries_large_n(kind, monkeypatch):
    """From VALIDATION_C_ROWS rows on, the model's own terms (the split's reference) are
    compiled for C instead of the per-step backend: the check refuses the same models there."""
    import pymc_minibatch_mh.model.likelihood as likelihood

    assert likelihood.validation_mode(likelihood.VALIDATION_C_ROWS) == likelihood.C_MODE
    assert (likelihood.validation_mode(likelihood.VALIDATION_C_ROWS - 1)
            == likelihood.default_mode())
    monkeypatch.setattr(likelihood, "VALIDATION_C_ROWS", 2_000)
    modes = []
    real = likelihood.MinibatchLikelihood.compile

    def compile_(self, inputs, outputs, mode=None):
        modes.append(mode)
        return real(self, inputs, outputs, mode)

    monkeypatch.setattr(likelihood.MinibatchLikelihood, "compile", compile_)
    with _whole_data_model(kind, 3_000, coefficient=kind == "mean"):
        with pytest.raises(ModelNotSupportedError, match=SPLIT):
            build()
    assert likelihood.C_MODE in modes


@pytest.mark.parametrize("kind", ["mean", "cumsum"])
def test_whole_data_summary_hidden_at_start_point(kind):
    """Regression: ``b * (x - x.mean())`` with b = 0 at the start point matched there;
    the split is now also checked at random points around it."""
    with _whole_data_model(kind, 300, coefficient=True):
        with pytest.raises(ModelNotSupportedError, match=SPLIT):
            build()


def test_wide_logistic_regression_is_not_refused():
    """Regression: the split check jittered every coefficient by O(1), so with d = 100
    the checked linear predictors reached |η| ≈ 25-35, where the model's own
    (unstabilised) Bernoulli term loses digits that the split graph keeps, and a plain
    logistic regression was refused as "cannot be split"."""
    rng = np.random.default_rng(7)
    n, d = 3000, 100
    x = rng.normal(size=(n, d))
    y = rng.random(n) < 0.5
    with pm.Model():
        b = pm.Normal("b", 0.0, 5.0, shape=d)
        pm.Bernoulli("y", logit_p=pt.dot(x, b), observed=y)
        step = MinibatchBarker(batch_size=5, tune=False)  # default mode: it rewrites the graph
    assert step.likelihood.n_rows() == n


@pytest.mark.parametrize("n", [3, 200])
def test_per_observation_latent_variable(n):
    with pm.Model():
        mu = pm.Normal("mu")
        z = pm.Normal("z", mu, 1, shape=n)
        pm.Normal("y", z, 1, observed=np.zeros(n))
        with pytest.raises(ModelNotSupportedError, match=f"{SPLIT}.*per-observation latent"):
            build(batch_size=1)


def test_joint_distributions_over_all_rows():
    rng = np.random.default_rng(2)
    with pm.Model():
        mu = pm.Normal("mu")
        pm.GaussianRandomWalk(
            "y", mu=mu, sigma=1.0, init_dist=pm.Normal.dist(), observed=rng.normal(size=50)
        )
        with pytest.raises(ModelNotSupportedError, match=f"one joint term.*{SPLIT}.*NUTS"):
            build()
    with pm.Model():
        mu = pm.Normal("mu")
        yd = pm.Data("y_obs", rng.normal(size=30))
        pm.MvNormal("y", mu * np.ones(30), np.eye(30), observed=yd)
        with pytest.raises(ModelNotSupportedError, match=f"one joint term.*{SPLIT}"):
            build()


def test_observed_is_a_computed_expression():
    with pm.Model():
        yd = pm.Data("y_obs", np.arange(50.0))
        mu = pm.Normal("mu")
        pm.Normal("y", mu, 1, observed=yd - yd.mean())
        with pytest.raises(ModelNotSupportedError, match="computed expression.*beforehand"):
            build()


def test_potential_using_data():
    rng = np.random.default_rng(3)
    with pm.Model():
        xd = pm.Data("x", rng.normal(size=60))
        mu = pm.Normal("mu")
        pm.Potential("extra", -0.5 * pt.sum((xd - mu) ** 2))
        pm.Normal("y", mu + xd, 1, observed=rng.normal(size=60))
        with pytest.raises(ModelNotSupportedError, match=r"Potential 'extra'.*CustomDist"):
            build()


def test_potential_only_likelihood_has_no_observed():
    with pm.Model():
        mu = pm.Normal("mu")
        pm.Potential("loglik", pm.logp(pm.Normal.dist(mu, 1), np.zeros(40)).sum())
        with pytest.raises(ModelNotSupportedError, match=r"no observed variables.*observed="):
            build()


def test_scalar_or_single_row_observed():
    with pm.Model():
        mu = pm.Normal("mu")
        pm.Normal("y", mu, 1, observed=1.5)
        with pytest.raises(ModelNotSupportedError, match="scalar.*leading observation"):
            build()
    with pm.Model():
        mu = pm.Normal("mu")
        pm.Normal("y", mu, 1, observed=np.zeros((1, 20)))
        with pytest.raises(ModelNotSupportedError, match="1 rows.*at least 2"):
            build()


# -------------------------------------------------------- lengths that disagree
def test_covariate_length_differs_at_creation():
    """PyMC accepts the model; evaluating it fails, and the message lists the lengths."""
    with pm.Model():
        xd = pm.Data("x", np.zeros(90))
        mu = pm.Normal("mu")
        pm.Normal("y", mu + xd, 1, observed=np.zeros(100))
        with pytest.raises(ModelNotSupportedError, match="same number of rows"):
            build()


def test_observed_length_changed_by_set_data():
    with pm.Model():
        y1 = pm.Data("y1", np.zeros(100))
        y2 = pm.Data("y2", np.zeros(100))
        mu = pm.Normal("mu")
        pm.Normal("a", mu, 1, observed=y1)
        pm.Normal("b", mu, 1, observed=y2)
        step = build()
        pm.set_data({"y2": np.zeros(80)})
        with pytest.raises(ModelNotSupportedError, match="different numbers of rows.*set_data"):
            sample(step)


def test_numpy_covariate_cannot_follow_set_data():
    """A covariate given as a NumPy array keeps its length when the observed data change."""
    rng = np.random.default_rng(4)
    with pm.Model():
        yd = pm.Data("y_obs", rng.normal(size=100))
        mu = pm.Normal("mu")
        pm.Normal("y", mu + rng.normal(size=100), 1, observed=yd)
        step = build()
        pm.set_data({"y_obs": rng.normal(size=150)})
        with pytest.raises(ModelNotSupportedError, match="different numbers of rows"):
            sample(step)


# ------------------------------------------------ Minibatch, total_size, imputation
@pytest.mark.filterwarnings("ignore:total_size not provided")
def test_minibatch_without_total_size():
    data = np.zeros(200)
    with pm.Model():
        mu = pm.Normal("mu")
        pm.Normal("y", mu, 1, observed=pm.Minibatch(data, batch_size=20))
        with pytest.raises(ModelNotSupportedError, match="Minibatch.*full data"):
            build()


def test_total_size_is_refused():
    with pm.Model():
        mu = pm.Normal("mu")
        pm.Normal("y", mu, 1, observed=np.zeros(200), total_size=2000)
        with pytest.raises(ModelNotSupportedError, match="total_size.*full data"):
            build()


@pytest.mark.filterwarnings("ignore:Data in y contains missing values")
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("only_mu", [False, True])
def test_missing_values_are_imputed_by_pymc(masked, only_mu):
    y = np.zeros(100)
    if masked:
        y = np.ma.masked_array(y, mask=np.arange(100) % 17 == 3)
    else:
        y[[3, 50]] = np.nan
    with pm.Model() as model:
        mu = pm.Normal("mu")
        pm.Normal("y", mu, 1, observed=y)
        with pytest.raises(ModelNotSupportedError, match="missing values.*Drop the rows"):
            build(vars=[mu] if only_mu else None)
    assert any(rv.name.endswith("_unobserved") for rv in model.free_RVs)


def test_nan_data_set_after_creation():
    """pm.Data refuses NaNs at creation, not in pm.set_data: the start check finds them."""
    with pm.Model():
        yd = pm.Data("y_obs", np.zeros(100))
        mu = pm.Normal("mu")
        pm.Normal("y", mu, 1, observed=yd)
        step = build()
        values = np.zeros(100)
        values[7] = np.nan
        pm.set_data({"y_obs": values})
        with pytest.raises(ModelNotSupportedError, match=r"not finite.*row 7.*invalid values"):
            sample(step)


# ------------------------------------------------------------ non-finite starts
def test_likelihood_minus_inf_at_given_initvals():
    with pm.Model():
        mu = pm.Normal("mu")
        pm.Uniform("y", mu - 1, mu + 1, observed=np.linspace(-0.5, 0.5, 100))
        step = build()
        with pytest.raises(ModelNotSupportedError, match=r"not finite at the start.*initvals"):
            sample(step, initvals={"mu": 5.0})


def test_prior_minus_inf_at_given_initvals():
    with pm.Model():
        mu = pm.Normal("mu")
        pm.Potential("positive", pt.switch(mu > 0, 0.0, -np.inf))
        pm.Normal("y", mu, 1, observed=np.ones(100))
        step = build(control_variate=None)
        with pytest.raises(ModelNotSupportedError, match=r"prior log-probability.*-inf.*initvals"):
            sample(step, initvals={"mu": -1.0})


def test_a_set_up_that_cannot_start_says_where_to_give_its_start():
    """The MAP search starts at the model's initial point, before pm.sample's initvals."""
    with pm.Model():
        mu = pm.Normal("mu")
        pm.Potential("positive", pt.switch(mu > 0, 0.0, -np.inf))
        pm.Normal("y", mu, 1, observed=np.ones(100))
        with pytest.raises(StartPointError, match=r"-inf.*before pm.sample's initvals"):
            build()
        step = build(initial_point={"mu": np.array(1.0)})
        assert step.control_variate is not None


def test_initval_outside_support_of_bounded_variable():
    with pm.Model():
        s = pm.HalfNormal("s")
        pm.Normal("y", 0, s, observed=np.ones(100))
        step = build()
        with pytest.raises(ModelNotSupportedError, match=r"non-finite values.*initvals"):
            sample(step, initvals={"s": -1.0})


def test_check_start_is_what_refuses():
    """With check_start=False the same start is not refused (documents the switch)."""
    with pm.Model():
        mu = pm.Normal("mu")
        pm.Uniform("y", mu - 1, mu + 1, observed=np.linspace(-0.5, 0.5, 100))
        step = build(check_start=False)
        with pytest.warns(RuntimeWarning, match="NaN or infinite"):
            sample(step, initvals={"mu": 5.0})


# --------------------------------------------------------- the wrong model
def _simple(y, name="mu"):
    with pm.Model() as model:
        mu = pm.Normal(name)
        pm.Normal("y", mu, 1, observed=y)
    return model


@pytest.mark.parametrize("name", ["mu", "nu"])
def test_step_of_another_model_in_pm_sample(name):
    m1 = _simple(np.zeros(100))
    m2 = _simple(np.full(100, 5.0), name)
    step = build(model=m1)
    with m2:
        # PyMC itself refuses a step whose variables are not the model's.
        with pytest.raises(ValueError, match="another model|not a value variable in the model"):
            sample(step)


@pytest.mark.parametrize("name", ["mu", "nu"])
def test_step_of_another_model_called_directly(name):
    m1 = _simple(np.zeros(100))
    m2 = _simple(np.full(100, 5.0), name)
    step = build(model=m1)
    with m2:
        with pytest.raises(ModelNotSupportedError, match=r"another model.*with model:"):
            step.step(m2.initial_point())


@pytest.mark.parametrize("added", ["observed", "potential"])
def test_model_changed_after_the_step_was_built(added):
    """Regression: an observed variable or Potential added after building the step was
    silently left out of the compiled likelihood."""
    with pm.Model():
        mu = pm.Normal("mu")
        pm.Normal("y", mu, 1, observed=np.zeros(100))
        step = build()
        if added == "observed":
            pm.Normal("y2", mu, 1, observed=np.full(100, 5.0))
        else:
            pm.Potential("pull", -100.0 * (mu - 3.0) ** 2)
        with pytest.raises(ModelNotSupportedError, match="changed after.*build it again"):
            sample(step)


# ------------------------------------------------------------------ parameters
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(batch_size=-3), "batch_size must be at least 1"),
        (dict(batch_size=True), "batch_size must be a positive integer"),
        (dict(batch_size=np.float64(3.0)), "batch_size must be a positive integer"),
        (dict(batch_size="10"), "batch_size must be a positive integer"),
        (dict(sigma=-1.0), "sigma must be"),
        (dict(sigma=LOGISTIC_SD), "sigma must be"),
        (dict(sigma=math.nextafter(LOGISTIC_SD, 10.0)), "sigma must be"),
        (dict(sigma=float("nan")), "sigma must be"),
        (dict(sigma=float("inf")), "sigma must be"),
        (dict(temperature=float("nan")), "temperature must be a positive finite number"),
        (dict(temperature=float("inf")), "temperature must be a positive finite number"),
        (dict(temperature=-float("inf")), "temperature must be a positive finite number"),
        (dict(temperature="1"), "temperature must be a positive finite number"),
        (dict(tolerance=0.0), r"tolerance must be in \(0, 1\)"),
        (dict(tolerance=float("nan")), r"tolerance must be in \(0, 1\)"),
        (dict(early_decision=0.0), "early_decision must be a positive number"),
        (dict(early_decision=float("nan")), "early_decision must be a positive number"),
        (dict(early_decision=float("inf")), "early_decision must be a positive number"),
        (dict(sigma=1.2, correction=get_correction(1.0)), "built for sigma=1.0"),
        (dict(prefetch=0), "prefetch must be a positive integer"),
        (dict(S=[1.0, 2.0]), "S"),
        (dict(S=[0.0]), "S must be finite and > 0"),
        (dict(scaling=0.0), "scaling must be a positive finite number"),
        (dict(target_accept=1.0), r"target_accept must be in \(0, 1\)"),
    ],
)
def test_bad_parameters(kwargs, match):
    with pm.Model():
        mu = pm.Normal("mu")
        pm.Normal("y", mu, 1, observed=np.zeros(10))
        with pytest.raises(ValueError, match=match):
            MinibatchBarker(**kwargs)


def test_temperature_set_after_construction():
    with pm.Model():
        mu = pm.Normal("mu")
        pm.Normal("y", mu, 1, observed=np.zeros(10))
        step = build()
    for bad in (float("nan"), 0.0, -2.0):
        with pytest.raises(ValueError, match="temperature must be"):
            step.temperature = bad
    assert step.temperature == 1.0


def test_batch_size_limits_follow_n():
    """batch_size == N is allowed; a later pm.set_data making N < batch_size is refused."""
    with pm.Model():
        yd = pm.Data("y_obs", np.zeros(40))
        mu = pm.Normal("mu")
        pm.Normal("y", mu, 1, observed=yd)
        step = build(batch_size=40, temperature=100.0, S=[0.01])
        idata = sample(step)
        assert np.all(np.asarray(sample_stats(idata)["batch_size"]) == 40)
        pm.set_data({"y_obs": np.zeros(39)})
        with pytest.raises(ValueError, match="larger than the number of observations.*between 1"):
            sample(step)
