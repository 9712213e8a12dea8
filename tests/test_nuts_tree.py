"""The surrogate NUTS's compiled tree is PyMC's NUTS tree, and the proposal falls back visibly.

- ``nuts_tree.CompiledTree`` against PyMC's own ``NUTS._hamiltonian_step`` from the same
  start, momentum, step size and generator state, trajectory by trajectory, on a
  non-Gaussian target with a dense and a diagonal mass matrix: the same proposal (to
  rounding), depth, leaf count, acceptance statistic, divergences and generator state
  after. Step sizes from small (deep trees, the largest depth reached) to large
  (divergences) cover every branch of the tree.
- the dense potential's faster momentum draw gives PyMC's momenta;
- a surrogate NUTS whose density is not a Numba function (the C backend) warns and builds
  its trajectories with PyMC's tree; the proposal pickles and its copy continues the chain.
"""

from __future__ import annotations

import copy
import pickle
import warnings

import cloudpickle
import numpy as np
import pymc as pm
import pytest
from pymc.blocking import DictToArrayBijection, RaveledVars
from pymc.step_methods.hmc.nuts import NUTS
from pymc.step_methods.hmc.quadpotential import QuadPotentialFull

from pymc_minibatch_mh import MinibatchBarker
from pymc_minibatch_mh.model.compat import start_inner_chain
from pymc_minibatch_mh.model.internals import (
    diag_adapt_potential,
    fast_momentum,
    full_adapt_potential,
    nuts_mass,
    nuts_tree_settings,
)
from pymc_minibatch_mh.proposals import nuts as nuts_module
from pymc_minibatch_mh.proposals.nuts_tree import CompiledTree

D = 5


def _nuts(dense: bool, max_treedepth: int = 6):
    """PyMC's NUTS (Numba density) on a heavy-tailed, non-Gaussian 5-d target, and the
    density it evaluates (:func:`density_function`)."""
    rng = np.random.default_rng(0)
    a = rng.normal(size=(D, D))
    cov = a @ a.T / D + 0.1 * np.eye(D)
    with pm.Model() as model:
        x = pm.Flat("x", shape=D)
        pm.Potential("target", pm.logp(pm.StudentT.dist(nu=4.0), x).sum()
                     - 0.05 * (x ** 4).sum() + 0.3 * x[0] * x[1])
        potential = (full_adapt_potential(D, np.zeros(D), cov, 10) if dense
                     else diag_adapt_potential(D, np.zeros(D), np.diag(cov).copy(), 10))
        step = pm.NUTS(vars=[x], potential=potential, mode="NUMBA",
                       max_treedepth=max_treedepth)
    start_inner_chain(step, np.random.default_rng(5))
    return step, nuts_module.density_function(model)


@pytest.mark.parametrize("dense", [True, False])
def test_compiled_tree_is_pymcs_tree(dense):
    step, density = _nuts(dense, max_treedepth=5)
    density(np.full(D, 0.3))  # compiled for float64 points, as the proposal's start does
    info = DictToArrayBijection.map({"x": np.zeros(D)}).point_map_info
    q = RaveledVars(np.full(D, 0.3), info)
    tree = None
    seen = {"diverging": 0, "reached": 0, "depths": set()}
    for it in range(240):
        p0 = step.potential.random()
        start = step.integrator.compute_state(q, p0)
        step_size = (0.02, 0.4, 0.9, 2.5)[it % 4]  # deep trees … divergences
        rng_pymc, rng_tree = copy.deepcopy(step.rng), copy.deepcopy(step.rng)
        step.rng = rng_pymc
        step.tune = False
        ref = NUTS._hamiltonian_step(step, start, p0, step_size)
        cells = density.shared_values()
        if tree is None:
            tree = CompiledTree(density.jit, cells, rng_tree)
        mass, is_dense = nuts_mass(step.potential)
        max_depth, e_max, _ = nuts_tree_settings(step)
        (q_new, grad, logp, energy, index, depth, size, log_accept_sum, _, diverging, _,
         reached) = tree(cells, rng_tree, start.q.data, start.p, start.v, start.q_grad,
                         float(start.model_logp), float(start.energy), step_size, mass,
                         is_dense, max_depth, e_max, False)
        np.testing.assert_allclose(q_new, ref.end.q.data, rtol=0, atol=1e-9)
        np.testing.assert_allclose(grad, ref.end.q_grad, rtol=0, atol=1e-9)
        assert logp == pytest.approx(float(ref.end.logp), abs=1e-9)
        assert energy == pytest.approx(float(ref.end.energy), abs=1e-9)
        assert index == ref.end.index_in_trajectory
        assert (depth, size) == (ref.stats["depth"], ref.stats["tree_size"])
        assert np.exp(log_accept_sum) / size == pytest.approx(ref.accept_stat, abs=1e-12)
        assert diverging == bool(ref.divergence_info)
        assert reached == ref.stats["reached_max_treedepth"]
        # the same random numbers, in the same order
        assert rng_tree.bit_generator.state == rng_pymc.bit_generator.state
        seen["diverging"] += diverging
        seen["reached"] += reached
        seen["depths"].add(depth)
        q = ref.end.q
    # every branch ran: divergences, the largest depth, shallow and deep trees
    assert seen["diverging"] > 10 and seen["reached"] > 5
    assert {1, 2, 3, 4, 5} <= seen["depths"]


def test_fast_momentum_draws_pymcs_momenta():
    step, _ = _nuts(dense=True)
    potential = step.potential
    assert isinstance(potential, QuadPotentialFull)
    reference = copy.deepcopy(potential)
    fast_momentum(potential)
    assert type(potential.random).__name__ == "_TriangularMomentum"
    for _ in range(20):
        np.testing.assert_allclose(potential.random(), reference.random(), rtol=1e-12,
                                   atol=1e-12)
    # a diagonal potential is left as it is
    diag = _nuts(dense=False)[0].potential
    fast_momentum(diag)
    assert type(diag.random).__name__ == "method"
    # the dense one still pickles (a spawned process of pm.sample gets a copy)
    copied = pickle.loads(pickle.dumps(potential))
    np.testing.assert_allclose(copied.random(), potential.random(), atol=1e-12)


def _poisson_model():
    with pm.Model() as model:
        theta = pm.Normal("theta", 0.0, 2.0, shape=2)
        pm.Poisson("y", pm.math.exp(theta[0] + theta[1] * np.linspace(-1, 1, 40)),
                   observed=np.arange(40) % 3)
    return model


def test_surrogate_nuts_uses_the_compiled_tree_and_pickles():
    with _poisson_model():
        step = MinibatchBarker(control_variate="taylor", proposal="surrogate_nuts")
    proposal = step.proposal
    assert proposal.compiled_tree
    # a subclass of PyMC's NUTS overrides the trajectory; the instance's methods are PyMC's
    assert isinstance(proposal.nuts, NUTS) and "_hamiltonian_step" not in vars(proposal.nuts)
    proposal.start_chain(np.random.default_rng(3))
    state = proposal.init(proposal.surrogate.theta_hat + 0.1)
    copied = cloudpickle.loads(cloudpickle.dumps(proposal))  # as pm.sample's processes
    assert copied.compiled_tree
    for prop in (proposal, copied):
        prop.set_tuning(False)
    rng_a, rng_b = np.random.default_rng(4), np.random.default_rng(4)
    for _ in range(5):
        new_a, info_a = proposal.propose(rng_a, state, 1.0)
        new_b, info_b = copied.propose(rng_b, state, 1.0)
        np.testing.assert_allclose(new_a.x, new_b.x, atol=1e-12)
        assert info_a.log_q_ratio == pytest.approx(info_b.log_q_ratio, abs=1e-10)
        # the ratio is log π̃(θ) − log π̃(θ′), evaluated here independently
        surrogate = step.surrogate_posterior()
        assert info_a.log_q_ratio == pytest.approx(
            surrogate.log_density(state.x) - surrogate.log_density(new_a.x), abs=1e-8)
        state = new_a


def test_pymcs_nuts_compiles_no_density_of_its_own(monkeypatch):
    """The surrogate's NUTS is given π̃'s compiled density: building it compiles no
    ``logp_dlogp_function`` of PyMC (a second compilation of the same graph), and the
    proposal's chain moves."""
    model = _poisson_model()

    def refused(self, *args, **kwargs):
        raise AssertionError("PyMC compiled a density for the surrogate's NUTS")

    monkeypatch.setattr(pm.Model, "logp_dlogp_function", refused)
    with model:
        step = MinibatchBarker(control_variate="taylor", proposal="surrogate_nuts")
    proposal = step.proposal
    proposal.start_chain(np.random.default_rng(3))
    state = proposal.init(proposal.surrogate.theta_hat)
    moved = [proposal.propose(np.random.default_rng(k), state, 1.0)[0].x for k in range(3)]
    assert not np.allclose(moved[0], state.x)


def test_surrogate_nuts_without_a_numba_density_warns_and_uses_pymcs_tree(monkeypatch):
    # a density that is not a Numba function (as when π̃ had to be compiled for C)
    compiled = nuts_module.density_function

    def python_density(model):
        density = compiled(model)
        return lambda q: density(q)  # not a DirectCall: no compiled tree can call it

    monkeypatch.setattr(nuts_module, "density_function", python_density)
    model = _poisson_model()
    with model, pytest.warns(UserWarning, match="PyMC's tree in Python"):
        step = MinibatchBarker(control_variate="taylor", proposal="surrogate_nuts")
    assert not step.proposal.compiled_tree
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        idata = pm.sample(draws=30, tune=30, step=step, chains=1, random_seed=1,
                          progressbar=False, compute_convergence_checks=False)
    assert np.isfinite(np.asarray(idata.posterior["theta"])).all()


def test_a_divergence_after_tuning_ends_at_the_start_and_is_counted():
    # After tuning the proposal runs NUTS's iteration itself: a diverging trajectory
    # proposes its start (ratio 0), and NUTS counts the divergence as PyMC's astep does.
    with _poisson_model():
        step = MinibatchBarker(control_variate="taylor", proposal="surrogate_nuts")
    proposal = step.proposal
    proposal.start_chain(np.random.default_rng(3))
    proposal.set_tuning(False)
    proposal.nuts._step_rand = lambda step_size, rng: 1e3  # every trajectory diverges
    state = proposal.init(proposal.surrogate.theta_hat)
    new, info = proposal.propose(np.random.default_rng(4), state, 1.0)
    np.testing.assert_array_equal(new.x, state.x)  # the start is NUTS's proposal
    assert info.log_q_ratio == pytest.approx(0.0, abs=1e-12)
    assert proposal.nuts.divergences == 1


@pytest.mark.parametrize("dense", [True, False])
def test_tuned_iterations_without_pymcs_step_are_its_chain(monkeypatch, dense):
    # After tuning the proposal runs NUTS's iteration itself (momentum, start energy,
    # averaged step size, the compiled tree) instead of PyMC's astep: the same chain, bit
    # for bit, from the same generators; with a dense mass matrix and with the diagonal
    # one in whitened coordinates (above DENSE_MASS_MAX_DIM dimensions).
    if not dense:
        monkeypatch.setattr(nuts_module, "DENSE_MASS_MAX_DIM", 1)
    with _poisson_model():
        step = MinibatchBarker(control_variate="taylor", proposal="surrogate_nuts")
    fast = step.proposal
    assert fast.compiled_tree and (fast._whiten is None) == dense
    pymc_path = cloudpickle.loads(cloudpickle.dumps(fast))
    pymc_path.compiled_tree = False  # propose goes through PyMC's astep (tree compiled)
    states = []
    for prop in (fast, pymc_path):
        prop.start_chain(np.random.default_rng(3))
        state = prop.init(prop.surrogate.theta_hat + 0.1)
        rng = np.random.default_rng(4)
        for _ in range(60):  # tuning: the step size and mass matrix adapt
            state, _ = prop.propose(rng, state, 1.0)
        prop.set_tuning(False)
        chain = []
        for _ in range(40):
            state, info = prop.propose(rng, state, 1.0)
            chain.append((state.x.copy(), info.log_q_ratio, info.step_size))
        states.append(chain)
    assert fast.density_evaluations == pymc_path.density_evaluations
    moved = 0
    for (x_a, ratio_a, step_a), (x_b, ratio_b, step_b) in zip(*states, strict=True):
        np.testing.assert_array_equal(x_a, x_b)
        assert ratio_a == ratio_b and step_a == step_b
        moved += ratio_a != 0.0
    assert moved > 30
    assert (fast.nuts.rng.bit_generator.state == pymc_path.nuts.rng.bit_generator.state)
    assert fast.nuts.iter_count == pymc_path.nuts.iter_count
