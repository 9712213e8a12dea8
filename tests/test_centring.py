"""Centred coordinates for the surrogate's NUTS (``proposals/surrogate.py``, ``Centring``).

Where the data fix a group's effect better than the groups' spread does, surrogate NUTS
samples that effect centred, ``u_j = a(θ) + s(θ) z_j``, and carries its end back to the
model's coordinates. The proposal stays exact in law only if the map is a bijection and
π̃ in the new coordinates carries its log-Jacobian ``−Σ log |s_j|``; the large groups are
centred and the groups of a few rows are not (centred, they would make a funnel).

The statistical check decides on the full data (``batch_size=N``: the exact Barker
test), so the chain's law is the posterior if and only if the proposal's log-q ratio is
exact; it compares with PyMC's NUTS on the model, within 4 combined Monte Carlo standard
errors. The same check with the log-Jacobian dropped from the ratio must fail (slow
suite). Fixed seeds.
"""

from __future__ import annotations

import warnings

import arviz as az
import numpy as np
import pymc as pm
import pytensor
import pytest
from conftest import sample_kwargs
from scipy.special import expit
from test_shifted_set import crossed_model

from pymc_minibatch_mh import MinibatchBarker
from pymc_minibatch_mh.model.compat import posterior
from pymc_minibatch_mh.proposals import nuts as nuts_module
from pymc_minibatch_mh.proposals import surrogate as surrogate_module

Z_MAX = 4.0


@pytest.fixture(scope="module")
def crossed_step():
    model, g2 = crossed_model()
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        step = MinibatchBarker(control_variate="taylor", proposal="surrogate_nuts")
    return step, g2


def test_large_groups_are_centred_and_groups_of_a_few_rows_are_not(crossed_step):
    step, g2 = crossed_step
    centring = step.surrogate_posterior().centring
    entries = {e.name: e for e in step.likelihood.point_map.entries}
    chosen = set(centring.positions.tolist())
    z1, z2 = entries["z1"], entries["z2"]
    rows = np.bincount(g2, minlength=40)
    assert set(range(z1.start, z1.start + 6)) <= chosen  # about 480 rows each
    large = [z2.start + j for j in range(40) if rows[j] >= 100]
    few = [z2.start + j for j in range(40) if rows[j] <= 5]
    assert large and set(large) <= chosen
    assert few and not chosen & set(few)
    assert not chosen & {entries["mu"].start, entries["b"].start}


def test_the_map_is_a_bijection_and_the_density_carries_its_jacobian(crossed_step):
    step, _ = crossed_step
    post = step.surrogate_posterior()
    centring = post.centring
    rng = np.random.default_rng(3)
    x = post.laplace.theta_hat + 0.3 * rng.standard_normal(post.laplace.dim)
    phi = centring.to_phi(x)
    np.testing.assert_allclose(centring.from_phi(phi)[0], x, rtol=0, atol=1e-12)
    assert not np.allclose(phi, x)
    log_density_phi = pytensor.function(
        [centring.phi], centring.log_density_graph(post.graph, post.flat))
    # log |det ∂θ/∂φ| by central differences of the inverse map.
    eps, d = 1e-6, phi.size
    jac = np.empty((d, d))
    for j in range(d):
        e = np.zeros(d)
        e[j] = eps
        jac[:, j] = (centring.from_phi(phi + e)[0] - centring.from_phi(phi - e)[0]) / (2 * eps)
    log_det = np.linalg.slogdet(jac)[1]
    assert abs(log_det) > 1.0  # the check can see a dropped Jacobian
    np.testing.assert_allclose(float(log_density_phi(phi)) - post.log_density(x), log_det,
                               rtol=0, atol=1e-5)
    # The term the surrogate NUTS takes off its own density for the ratio.
    assert centring.from_phi(phi)[1] == pytest.approx(log_det, abs=1e-5)


def test_the_covariance_carried_to_phi_is_the_symbolic_jacobians(crossed_step):
    """``J Σ Jᵀ`` by finite differences against PyTensor's symbolic ``J = ∂φ/∂θ``."""
    step, _ = crossed_step
    post = step.surrogate_posterior()
    centring, laplace = post.centring, post.laplace
    jac = pytensor.function([post.flat], pytensor.gradient.jacobian(
        centring.forward_graph, post.flat, vectorize=True))(laplace.theta_hat)
    expected = jac @ laplace.cov @ jac.T
    got = centring.covariance(laplace.theta_hat, laplace.cov)
    scale = np.sqrt(np.outer(np.diag(expected), np.diag(expected)))
    np.testing.assert_allclose(got / scale, expected / scale, rtol=0, atol=1e-5)


def grouped_model():
    """Two groups of 150 binary rows, non-centred: both groups are centred."""
    rng = np.random.default_rng(11)
    g = np.repeat([0, 1], 150)
    y = (rng.random(g.size) < expit(np.array([-0.6, 0.7])[g])).astype(np.int64)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 1.0)
        sigma = pm.HalfNormal("sigma", 1.0)
        z = pm.Normal("z", 0.0, 1.0, shape=2)
        pm.Bernoulli("y", logit_p=mu + sigma * z[g], observed=y)
    return model, g.size


def test_the_surrogate_density_is_the_same_function_on_other_data():
    """The surrogate NUTS's density holds no value of the data as a constant.

    Its values that depend on the data (the expansion, which effects are centred) are
    shared variables, so the same model on other data has the same compiled function:
    the function cache and Numba's cache find it in another process. Here the data
    centre different groups; a constant in place of a shared variable (the centring's
    positions, as they were) fails this.
    """
    from pymc_minibatch_mh.model.compat import default_mode
    from pymc_minibatch_mh.model.function_cache import graph_key

    keys, chosen = [], []
    for rows in ([150, 150, 3], [3, 150, 150]):  # the large groups are centred
        rng = np.random.default_rng(7)
        g = np.repeat(np.arange(3), rows)
        y = (rng.random(g.size) < expit(np.array([-0.6, 0.7, 0.2])[g])).astype(np.int64)
        with pm.Model() as model:
            mu = pm.Normal("mu", 0.0, 1.0)
            sigma = pm.HalfNormal("sigma", 1.0)
            z = pm.Normal("z", 0.0, 1.0, shape=3)
            pm.Bernoulli("y", logit_p=mu + sigma * z[g], observed=y)
        with model, warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            step = MinibatchBarker(control_variate="taylor", proposal="surrogate_nuts")
        chosen.append(step.surrogate_posterior().centring.positions.tolist())
        density = step.proposal.model
        keys.append(graph_key(density.value_vars, [density.logp()], default_mode()))
    assert chosen[0] != chosen[1]
    assert keys[0] is not None and keys[0] == keys[1]


def _dropped_jacobian(self, phi):
    """The broken variant: the ratio's log-Jacobian left out (NUTS's own density keeps
    it). Since the ratio is NUTS's density less this term, a kernel with another density
    would still be exact; a wrong term here is what makes the ratio wrong."""
    theta, _ = self._from_phi(np.asarray(phi, dtype=np.float64))
    return np.asarray(theta), 0.0


# Full-data chains: a property of the map and its density, not of the PyMC line.
@pytest.mark.newest_line
@pytest.mark.parametrize("how", ["exact", "whitened",
                                 pytest.param("no_jacobian", marks=pytest.mark.slow)])
def test_full_data_chain_with_centred_nuts_targets_the_posterior(how, monkeypatch):
    if how == "whitened":  # and NUTS in the Laplace fit's whitened coordinates
        monkeypatch.setattr(nuts_module, "DENSE_MASS_MAX_DIM", 0)
    if how == "no_jacobian":
        monkeypatch.setattr(surrogate_module.Centring, "from_phi", _dropped_jacobian)
    model, n = grouped_model()
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        step = MinibatchBarker(batch_size=n, control_variate="taylor",
                               proposal="surrogate_nuts", steps_per_draw=1)
        assert step.surrogate_posterior().centring.positions.size == 2
        ours = pm.sample(draws=1500, tune=500, step=step, chains=2, cores=1,
                         **sample_kwargs(random_seed=5))
        ref = pm.sample(draws=1500, tune=500, chains=2, cores=1, target_accept=0.95,
                        **sample_kwargs(random_seed=6))
    z = []
    for name in ("mu", "sigma", "z"):
        a, b = posterior(ours)[name], posterior(ref)[name]
        se = np.hypot(np.asarray(az.mcse(ours, var_names=[name])[name]),
                      np.asarray(az.mcse(ref, var_names=[name])[name]))
        z.append(np.ravel((np.asarray(a.mean(("chain", "draw"))) -
                           np.asarray(b.mean(("chain", "draw")))) / se))
    z = np.concatenate(z)
    if how != "no_jacobian":
        assert np.max(np.abs(z)) <= Z_MAX, z
    else:
        assert np.max(np.abs(z)) > Z_MAX, z
