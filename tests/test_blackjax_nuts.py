"""proposal="blackjax_nuts": NUTS on the surrogate posterior, compiled with JAX.

Its log-q ratio is checked against the exact posterior in
``test_proposal_reversibility.py`` (a dropped or flipped ratio fails there) and
``cores=1`` = ``cores=2`` in ``test_cores.py``; here: the JAX density is π̃ at any point,
also after the values it reads change (a re-centring, another step of a compound step);
the pickled proposal (PyMC's worker processes) rebuilds its compiled programs and moves as
the original; a process forked after JAX started gets a clear error, not a deadlock; a
missing JAX is a clear error.
"""

from __future__ import annotations

import multiprocessing
import warnings

import cloudpickle
import numpy as np
import pymc as pm
import pytensor
import pytest

pytest.importorskip("blackjax")

import pymc_minibatch_mh.proposals.blackjax_nuts as blackjax_module
from pymc_minibatch_mh import MinibatchBarker
from pymc_minibatch_mh.proposals.blackjax_nuts import BlackjaxNUTSProposal


def grouped_model(n=600, groups=5, seed=3):
    rng = np.random.default_rng(seed)
    g = rng.integers(0, groups, size=n)
    x = rng.normal(size=n)
    y = rng.normal(0.3 + 0.5 * rng.normal(size=groups)[g] + 0.8 * x, 1.0)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 2.0)
        tau = pm.HalfNormal("tau", 1.0)
        z = pm.Normal("z", 0.0, 1.0, shape=groups)
        b = pm.Normal("b", 0.0, 2.0)
        pm.Normal("y", mu + tau * z[g] + b * x, 1.0, observed=y)
    return model


@pytest.fixture(scope="module")
def step():
    with grouped_model(), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return MinibatchBarker(control_variate="taylor", proposal="blackjax_nuts")


def test_the_jax_density_is_the_surrogate_posterior_read_at_call_time(step):
    proposal = step.proposal
    assert proposal.name == "blackjax_nuts"
    post = step.surrogate_posterior()
    compiled = proposal.compiled
    assert compiled.shared  # the control variates' coefficients are arguments
    rng = np.random.default_rng(0)
    theta = post.laplace.theta_hat
    points = [theta + 0.3 * rng.standard_normal(theta.size) for _ in range(4)]
    for x in points:
        np.testing.assert_allclose(float(compiled.log_density(x, *compiled.values())),
                                   post.log_density(x), rtol=1e-10)
    # A changed coefficient (as a re-centring sets them) is read at the next call, as by
    # PyTensor's function of the same graph.
    graph_fn = pytensor.function([post.flat], post.graph)
    position = [v.name for v in compiled.shared].index("cv_coef_hat")
    shared = compiled.shared[position]
    old = shared.get_value()
    try:
        shared.set_value(old + 0.1)
        for x in points:
            np.testing.assert_allclose(
                float(compiled.log_density(x, *compiled.values())), float(graph_fn(x)),
                rtol=1e-10)
        values = list(compiled.values())
        values[position] = old
        assert float(compiled.log_density(points[0], *compiled.values())) != pytest.approx(
            float(compiled.log_density(points[0], *values)), rel=1e-6)
    finally:
        shared.set_value(old)


def test_the_ratio_is_the_surrogate_density_difference(step):
    proposal = step.proposal
    post = step.surrogate_posterior()
    proposal.start_chain(np.random.default_rng(5))
    proposal.density_evaluations = 0
    state = proposal.init(post.laplace.theta_hat)
    # π̃ at θ̂ (the offset), at the adaptation's start and its leapfrog steps (at least one
    # per iteration), and at the initial state: the step counts their rows.
    assert proposal.density_evaluations >= proposal.warmup + 3
    for _ in range(5):
        before = proposal.density_evaluations
        new, info = proposal.propose(np.random.default_rng(0), state, 1.0)
        assert proposal.density_evaluations - before == proposal.n_steps >= 1
        np.testing.assert_allclose(
            info.log_q_ratio, post.log_density(state.x) - post.log_density(new.x),
            rtol=1e-8, atol=1e-8)
        assert info.step_size == proposal.step_size > 0
        state = new
    assert not np.array_equal(state.x, post.laplace.theta_hat)


def test_a_pickled_proposal_rebuilds_its_programs_and_moves_the_same(step):
    proposal = step.proposal
    theta = step.surrogate_posterior().laplace.theta_hat
    proposal.start_chain(np.random.default_rng(9))
    proposal.compiled  # noqa: B018 - built here, dropped by pickling
    copy = cloudpickle.loads(cloudpickle.dumps(proposal))  # as PyMC sends steps
    assert copy._compiled is None
    moves = []
    for p in (proposal, copy):
        state = p.init(theta)
        for _ in range(3):
            state, _ = p.propose(np.random.default_rng(0), state, 1.0)
        moves.append(state.x)
    np.testing.assert_array_equal(moves[0], moves[1])


def test_without_jax_the_error_says_how_to_install_it(step, monkeypatch):
    monkeypatch.setattr(blackjax_module, "jax_available", lambda: False)
    with pytest.raises(ImportError, match=r"pymc-minibatch-mh\[jax\].*surrogate_nuts"):
        BlackjaxNUTSProposal(step.surrogate_posterior())


def test_bad_settings_are_refused(step):
    post = step.surrogate_posterior()
    with pytest.raises(ValueError, match="warmup"):
        BlackjaxNUTSProposal(post, warmup=5)
    with pytest.raises(ValueError, match="target_accept"):
        BlackjaxNUTSProposal(post, target_accept=1.0)
    with pytest.raises(ValueError, match="max_treedepth"):
        BlackjaxNUTSProposal(post, max_treedepth=0)


def _use(proposal, queue):
    try:
        proposal.compiled  # noqa: B018
    except RuntimeError as err:
        queue.put(str(err))
    else:
        queue.put("no error")


def test_a_process_forked_after_jax_started_is_refused_not_deadlocked(step):
    step.proposal.compiled  # noqa: B018 - JAX runs in this process
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_use, args=(step.proposal, queue))
    child.start()
    child.join(timeout=120)
    if child.is_alive():
        child.kill()
        pytest.fail("the forked process hung")
    message = queue.get(timeout=10)
    assert "mp_ctx='spawn'" in message and "cores=1" in message, message
