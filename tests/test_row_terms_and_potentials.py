"""Terms whose length is the number of rows, and Potentials that use the data.

Potentials are evaluated whole at every step: every refusal of one that uses the data must
name it, say what it uses and what to do.

A categorical softmax written the ordinary way concatenates a baseline column
``pt.zeros((X.shape[0], 1))`` to the linear predictor. PyMC's log-probability graph folds
``X.shape[0]`` of a NumPy ``X`` into the constant N, so the column must be allocated with
the batch's length when the graph is rewritten to a subset of rows; the model must then
give the draws of the same model written with ``pt.zeros_like(lin[:, :1])``.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest
from conftest import sample_kwargs

from pymc_minibatch_mh import MinibatchBarker
from pymc_minibatch_mh.errors import ModelNotSupportedError
from pymc_minibatch_mh.model.compat import posterior

N_ROWS, N_FEATURES, N_CLASSES = 1_000, 2, 3


def _categorical(baseline: str, data: str = "numpy") -> pm.Model:
    """A 3-class softmax regression whose first class's predictor is a column of zeros."""
    rng = np.random.default_rng(28)
    x_value = rng.normal(size=(N_ROWS, N_FEATURES))
    w_true = np.array([[1.0, -0.5], [0.5, 1.0]])
    eta = np.concatenate([np.zeros((N_ROWS, 1)), x_value @ w_true], axis=1)
    prob = np.exp(eta - eta.max(axis=1, keepdims=True))
    prob /= prob.sum(axis=1, keepdims=True)
    y_value = (rng.random(N_ROWS)[:, None] > prob.cumsum(axis=1)).sum(axis=1)
    with pm.Model() as model:
        x = pt.as_tensor(pm.Data("X", x_value) if data == "pm.Data" else x_value)
        w = pm.Normal("w", 0, 2, shape=(N_FEATURES, N_CLASSES - 1))
        lin = x @ w
        column = {
            "zeros_like": lambda: pt.zeros_like(lin[:, :1]),
            "zeros_shape0": lambda: pt.zeros((x.shape[0], 1)),
            "ones_shape0": lambda: pt.ones(x.shape[0])[:, None] - 1.0,
            "zeros_literal": lambda: pt.zeros((N_ROWS, 1)),
        }[baseline]()
        eta = pt.concatenate([column, lin], axis=1)
        pm.Categorical("y", p=pm.math.softmax(eta, axis=1), observed=y_value)
    return model


STEPS = {
    "taylor": dict(control_variate="taylor"),  # the zero-config step of the issue
    "plain": dict(batch_size=100, scaling=0.1, temperature=20.0, tune=False),
}


def _draws(model: pm.Model, step_kind: str) -> np.ndarray:
    with model:
        step = MinibatchBarker(**STEPS[step_kind], mode="FAST_COMPILE")
        idata = pm.sample(draws=100, tune=100, chains=1, step=step,
                          **sample_kwargs(random_seed=7))
    return np.asarray(posterior(idata)["w"])


@pytest.fixture(scope="module")
def reference_draws():
    cache: dict[str, np.ndarray] = {}

    def draws(step_kind: str) -> np.ndarray:
        if step_kind not in cache:
            cache[step_kind] = _draws(_categorical("zeros_like"), step_kind)
        return cache[step_kind]

    return draws


@pytest.mark.parametrize(
    ("baseline", "data", "step_kind"),
    [("zeros_shape0", "numpy", "taylor"), ("ones_shape0", "numpy", "plain"),
     ("zeros_literal", "pm.Data", "plain")],
)
def test_row_count_column_gives_the_zeros_like_draws(reference_draws, baseline, data,
                                                     step_kind):
    reference = reference_draws(step_kind)
    draws = _draws(_categorical(baseline, data), step_kind)
    assert np.unique(reference[0, :, 0]).size > 10  # the chain moved
    np.testing.assert_array_equal(draws, reference)


# ------------------------------------------------------ Potentials that use the data
N_POT = 60


def _potential_model(kind: str) -> pm.Model:
    rng = np.random.default_rng(3)
    x_value, z_value, y_value = rng.normal(size=(3, N_POT))
    with pm.Model() as model:
        xd = pm.Data("x", x_value)
        mu = pm.Normal("mu")
        if kind == "likelihood_as_potential":
            yd = pm.Data("y_obs", y_value)
            pm.Potential("loglik", pm.logp(pm.Normal.dist(mu + xd, 1), yd).sum())
            return model
        y = pm.Normal("y", mu + (xd if kind != "observed_variable" else 0.0), 1,
                      observed=y_value)
        if kind == "covariate_only":
            zd = pm.Data("z", z_value)
            pm.Potential("extra", -0.5 * pt.sum((zd - mu) ** 2))
        elif kind == "numpy_copy_of_data":
            pm.Potential("extra", -0.5 * pt.sum((y_value - mu) ** 2))
        elif kind == "observed_variable":
            pm.Potential("extra", -0.5 * pt.sum((y - mu) ** 2))
        elif kind == "summed_per_row":
            pm.Potential("extra", pt.sum(-0.5 * (xd - mu) ** 2))
        elif kind == "through_deterministic":
            d = pm.Deterministic("d", xd * mu)
            pm.Potential("extra", -0.5 * pt.sum(d**2))
        elif kind == "short_array":  # not data of N rows: a prior term, accepted
            pm.Potential("extra", -0.5 * pt.sum((z_value[:5] - mu) ** 2))
    return model


@pytest.mark.parametrize(
    ("kind", "match"),
    [
        ("covariate_only", r"Potential 'extra' uses an array of N = 60 rows.*'z'"),
        ("numpy_copy_of_data", r"Potential 'extra' uses an array of N = 60 rows.*NumPy array"),
        ("observed_variable", r"Potential 'extra' uses the observed variable \['y'\]"),
        ("summed_per_row", r"Potential 'extra' uses the observed data or covariates \('x'\)"),
        ("through_deterministic", r"Potential 'extra' uses the observed data.*\('x'\)"),
        ("likelihood_as_potential", r"no observed variables.*Potential 'loglik'"),
    ],
)
def test_potential_using_the_data_is_refused_by_name(kind, match):
    with _potential_model(kind):
        with pytest.raises(ModelNotSupportedError, match=match) as refusal:
            MinibatchBarker(batch_size=5, mode="FAST_COMPILE")
    assert "CustomDist" in str(refusal.value) and "observed=" in str(refusal.value)


def test_potential_without_data_of_n_rows_is_accepted():
    with _potential_model("short_array"):
        MinibatchBarker(batch_size=5, mode="FAST_COMPILE")
