"""Surrogate transitions and surrogate NUTS are exact proposals when π̃ ≠ π.

A Poisson model with a log link, N = 4 counts (0, 0, 0, 1) and θ ~ N(0, 2²) has a
skewed posterior π (mean −1.41, sd 0.87), computed by quadrature on a grid; the Taylor
surrogate π̃ (quadratic in θ per row) has mean −1.14 and sd 0.81, which the same check
rejects (|z| 5.5-8 expected at 4000 draws). ``MinibatchBarker`` with ``batch_size=N``
decides on the full data (the exact Barker test), so the chain's stationary law is π
exactly if and only if the proposal's log-q ratio ``log π̃(θ) − log π̃(θ′)`` is right.
The same check is run on the correct proposal and on two broken variants of it (ratio
dropped: the chain then samples ∝ π·π̃; sign flipped: ∝ π·π̃²), which it must reject.
Fixed seeds.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pymc as pm
import pytest
from broken_proposals import AlteredRatio
from scipy import stats

from pymc_minibatch_mh import MinibatchBarker
from pymc_minibatch_mh.model.compat import default_mode, posterior
from pymc_minibatch_mh.model.compilation import uses_numba
from pymc_minibatch_mh.model.internals import DirectCall
from pymc_minibatch_mh.proposals import nuts as nuts_module

Y = np.array([0, 0, 0, 1])
PRIOR_SD = 2.0
Z_MAX = 4.0
N_BATCHES = 40
#: Draws of the correct chain (its check against π̃ needs them) and of a broken one.
DRAWS = {"exact": 4000, "dropped": 2000, "flipped": 2000}
GRID = np.linspace(-10.0, 4.0, 20_001)


def _moments(log_density):
    w = np.exp(log_density - log_density.max())
    w /= w.sum()
    mean = float(w @ GRID)
    return mean, float(w @ (GRID - mean) ** 2)


def exact_moments():
    """Mean and variance of π by quadrature on GRID."""
    lp = stats.norm.logpdf(GRID, 0.0, PRIOR_SD)
    lp += stats.poisson.logpmf(Y[:, None], np.exp(GRID)).sum(axis=0)
    return _moments(lp)


def batch_means_z(samples, target):
    n = samples.size // N_BATCHES * N_BATCHES
    batch = samples[:n].reshape(N_BATCHES, -1).mean(axis=1)
    return (samples[:n].mean() - target) / (batch.std(ddof=1) / math.sqrt(N_BATCHES))


def moment_z(samples, mean, var):
    return np.array([batch_means_z(samples, mean), batch_means_z((samples - mean) ** 2, var)])


def poisson_model():
    with pm.Model() as model:
        theta = pm.Normal("theta", 0.0, PRIOR_SD)
        pm.Poisson("y", pm.math.exp(theta), observed=Y)
    return model


# The broken variants show that the check has power; they run with the slow suite (CI runs
# both), the correct ratio in the default one.
@pytest.mark.parametrize(
    "how", ["exact", pytest.param("dropped", marks=[pytest.mark.slow, pytest.mark.newest_line]),
            pytest.param("flipped", marks=[pytest.mark.slow, pytest.mark.newest_line])],
)
@pytest.mark.parametrize("proposal", ["surrogate_transition", "surrogate_nuts",
                                      "surrogate_nuts_whitened"])
def test_full_data_chain_targets_pi_not_the_surrogate(proposal, how, monkeypatch):
    if proposal == "surrogate_nuts_whitened":  # NUTS in the Laplace fit's whitened coordinates
        monkeypatch.setattr(nuts_module, "DENSE_MASS_MAX_DIM", 0)
        proposal = "surrogate_nuts"
    mean, var = exact_moments()
    with poisson_model(), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        step = MinibatchBarker(batch_size=Y.size, control_variate="taylor",
                               proposal=proposal, steps_per_draw=1)
        surrogate = step.surrogate_posterior()
        step.proposal = AlteredRatio(step.proposal, how)
        idata = pm.sample(draws=DRAWS[how], tune=300, step=step, chains=1, cores=1,
                          random_seed=1, progressbar=False, compute_convergence_checks=False)
    samples = np.asarray(posterior(idata)["theta"]).ravel()
    z = moment_z(samples, mean, var)
    if how == "exact":
        assert np.max(np.abs(z)) <= Z_MAX, z
        # π̃ differs visibly from π: the same check rejects the surrogate's moments.
        lp_tilde = np.array([surrogate.log_density(np.array([g])) for g in GRID[::10]])
        w = np.exp(lp_tilde - lp_tilde.max())
        mean_tilde = float(w @ GRID[::10] / w.sum())
        var_tilde = float(w @ (GRID[::10] - mean_tilde) ** 2 / w.sum())
        assert mean_tilde - mean > 0.25 * math.sqrt(var)
        assert np.max(np.abs(moment_z(samples, mean_tilde, var_tilde))) > Z_MAX
    else:
        assert np.max(np.abs(z)) > Z_MAX, z


def test_surrogate_nuts_compiles_on_the_per_step_functions_backend():
    """PyMC would compile π̃'s density and gradient with its own default (the C backend on
    PyMC 5); the surrogate's NUTS is given π̃'s density compiled in the package's mode for
    per-step functions (Numba: a function called directly), through the proposal's
    evaluation of it."""
    with poisson_model():
        step = MinibatchBarker(batch_size=Y.size, control_variate="taylor",
                               proposal="surrogate_nuts")
    proposal = step.proposal
    assert proposal.nuts._logp_dlogp_func._pytensor_function == proposal._logp_dlogp
    assert proposal._evaluate is proposal._density
    assert isinstance(proposal._density, DirectCall) and uses_numba(default_mode())
