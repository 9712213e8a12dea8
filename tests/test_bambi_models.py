"""Group-level models written by bambi: the default step against NUTS.

bambi writes a group effect as ``Deterministic("1|g", offset * sigma)`` indexed by the
group's codes and multiplied by a column of its design matrix (ones for ``(1|g)``), its
common terms as ``dot(X, b)`` of a one-column matrix per covariate, and the linear
predictor as ``Deterministic("mu", ...)``. The step must read this as a hierarchical model
(control variates in the per-row quantities, NUTS on the surrogate), and the posterior must
match NUTS. A recogniser that does not see through ``Deterministic`` must fail these tests.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from pymc_minibatch_mh import MinibatchBarker
from pymc_minibatch_mh.estimators import predictor_walk

bmb = pytest.importorskip("bambi")
pd = pytest.importorskip("pandas")
az = pytest.importorskip("arviz")
pm = pytest.importorskip("pymc")

# Group effects of sd 0.1 against a residual sd of 1 with a few hundred rows per group:
# the joint mode puts the group scale near its boundary, far from the posterior.
N_ROWS, N_GROUPS = 4000, 16


def _data(seed: int = 7) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    g = rng.integers(0, N_GROUPS, N_ROWS)
    x = rng.normal(size=N_ROWS)
    intercepts = rng.normal(0.0, 0.1, N_GROUPS)
    slopes = rng.normal(0.0, 0.25, N_GROUPS)
    y = 1.0 + 0.4 * x + intercepts[g] + slopes[g] * x + rng.normal(0.0, 1.0, N_ROWS)
    return pd.DataFrame({"y": y, "x": x, "g": pd.Categorical(g)})


def _fit(formula: str, **sample: object) -> tuple[object, object]:
    model = bmb.Model(formula, _data())
    model.build()
    with model.backend.model:
        step = MinibatchBarker()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        idata = model.fit(step=step, chains=2, cores=1, random_seed=11, progressbar=False,
                          **sample)
    return idata, [w for w in caught if "does not mix" in str(w.message)]


def _reference(formula: str) -> object:
    model = bmb.Model(formula, _data())
    model.build()
    with model.backend.model:
        return pm.sample(draws=1000, tune=1000, chains=2, cores=1, random_seed=3,
                         progressbar=False)


def _compare(idata: object, ref: object, names: list[str]) -> tuple[float, float, float]:
    """Max |Δmean| and max |Δsd| in combined MCSE (ArviZ's ``mcse_mean``, ``mcse_sd``), R-hat."""
    summary = az.summary(idata, var_names=names, round_to="none")
    reference = az.summary(ref, var_names=names, round_to="none")
    z = (summary["mean"] - reference["mean"]) / np.hypot(summary["mcse_mean"],
                                                          reference["mcse_mean"])
    z_sd = (summary["sd"] - reference["sd"]) / np.hypot(summary["mcse_sd"], reference["mcse_sd"])
    return float(z.abs().max()), float(z_sd.abs().max()), float(summary["r_hat"].max())


FORMULAS = {
    "intercepts": ("y ~ 1 + x + (1|g)", ["Intercept", "x", "sigma", "1|g_sigma", "1|g"]),
    "slopes": ("y ~ 1 + x + (x|g)", ["Intercept", "x", "sigma", "1|g_sigma", "x|g_sigma",
                                     "x|g"]),
}


@pytest.fixture(scope="module")
def references() -> dict[str, object]:
    return {key: _reference(formula) for key, (formula, _) in FORMULAS.items()}


@pytest.mark.parametrize("key", list(FORMULAS))
def test_bambi_group_models_match_nuts(key: str, references: dict[str, object]) -> None:
    formula, names = FORMULAS[key]
    idata, not_mixing = _fit(formula)
    assert not not_mixing, not_mixing[0].message
    z, sd, rhat = _compare(idata, references[key], names)
    assert rhat < 1.01, rhat
    assert z < 4.0, z
    assert sd < 4.0, sd


def test_a_recogniser_blind_to_deterministic_fails(references: dict[str, object],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Without seeing through bambi's Deterministic the step is wrong, or says it mixes badly."""

    def blind(var: object) -> object:
        return var  # keeps ViewOp, SpecifyShape and casts: the walk refuses bambi's mu

    monkeypatch.setattr(predictor_walk, "_strip", blind)
    monkeypatch.setattr(predictor_walk, "ViewOp", type("NotAView", (), {}))
    formula, names = FORMULAS["intercepts"]
    idata, not_mixing = _fit(formula)
    z, sd, rhat = _compare(idata, references["intercepts"], names)
    assert not_mixing or rhat >= 1.01 or z >= 4.0 or sd >= 4.0, (z, sd, rhat)


def _bernoulli_model() -> object:
    rng = np.random.default_rng(3)
    g = rng.integers(0, N_GROUPS, N_ROWS)
    x = rng.normal(size=N_ROWS)
    eta = -0.3 + 0.5 * x + rng.normal(0.0, 0.3, N_GROUPS)[g]
    df = pd.DataFrame({"y": rng.binomial(1, 1.0 / (1.0 + np.exp(-eta))), "x": x,
                       "g": pd.Categorical(g)})
    model = bmb.Model("y ~ x + (1|g)", df, family="bernoulli")
    model.build()
    return model


def test_bambi_s_clamped_logistic_link_is_read_as_hierarchical(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """bambi keeps ``sigmoid(η)`` off 0 and 1 with two switches: the link is still peeled.

    Without it the quantity does not decompose, and ``(1|g)`` took the θ-space expansion
    with Crank–Nicolson moves around the degenerate joint mode (on ``stevedata::TV16``:
    R-hat 2.65 against nutpie's draws).
    """
    from pymc_minibatch_mh.estimators import predictor
    from pymc_minibatch_mh.estimators.predictor_taylor import PredictorTaylorEstimator

    model = _bernoulli_model()
    with model.backend.model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step = MinibatchBarker()
    assert isinstance(step.control_variate, PredictorTaylorEstimator)
    assert step.proposal.name == "surrogate_nuts"
    monkeypatch.setattr(predictor, "_unclamped", lambda var: var)
    with model.backend.model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step = MinibatchBarker()
    assert not isinstance(step.control_variate, PredictorTaylorEstimator)
