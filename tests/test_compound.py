"""A compound step where another step moves the variables that the prior reads.

``beta ~ Normal(0, sigma)`` is sampled by ``MinibatchBarker(vars=[beta],
control_variate="taylor", proposal="mala")`` and ``sigma`` by ``pm.Metropolis``. MALA's
ratio uses the gradient of the surrogate posterior (prior included) carried in the
proposal's state; after Metropolis moved sigma that state must be rebuilt. A spy on
``propose`` compares the state's gradient with a fresh ``proposal.init`` at every
transition; the same spy catches a step that keeps the state across draws (a subclass
that restores it, the broken variant). The posterior of (beta, sigma) is checked against
quadrature on a grid with batch-means Monte Carlo errors. Fixed seeds.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pymc as pm
import pytest
from scipy import stats

from pymc_minibatch_mh import MinibatchBarker
from pymc_minibatch_mh.model.compat import posterior

Y = np.random.default_rng(0).normal(0.4, 1.0, size=20)
Z_MAX = 4.0
N_BATCHES = 30


class _StaleState(MinibatchBarker):
    """Broken: keeps the proposal's state from one draw to the next (no rebuild)."""

    def step(self, point):
        self._saved_state, self._first = self._proposal_state, True
        return super().step(point)

    def _transition(self, point):
        if self._first and self._saved_state is not None:
            self._proposal_state = self._saved_state
        self._first = False
        return super()._transition(point)


def exact_means():
    """Posterior means of beta and sigma, by quadrature over sigma.

    Given sigma, ``ȳ ~ N(0, sigma² + 1/n)`` and ``E[beta | sigma, y] = ȳ sigma²/(sigma² + 1/n)``.
    """
    sigma = np.linspace(1e-6, 6.0, 200_001)
    n, ybar = Y.size, float(Y.mean())
    total = sigma**2 + 1.0 / n
    w = stats.halfnorm.pdf(sigma) * stats.norm.pdf(ybar, 0.0, np.sqrt(total))
    w /= w.sum()
    return float(w @ (ybar * sigma**2 / total)), float(w @ sigma)


def batch_means_z(samples, target):
    n = samples.size // N_BATCHES * N_BATCHES
    batch = samples[:n].reshape(N_BATCHES, -1).mean(axis=1)
    return (samples[:n].mean() - target) / (batch.std(ddof=1) / math.sqrt(N_BATCHES))


def _run(step_class, draws):
    checks = []
    with pm.Model(), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        sigma = pm.HalfNormal("sigma", 1.0)
        beta = pm.Normal("beta", 0.0, sigma)
        pm.Normal("y", beta, 1.0, observed=Y)
        step = step_class(vars=[beta], batch_size=Y.size, control_variate="taylor",
                          proposal="mala", steps_per_draw=1)
        assert step.likelihood.other_shared  # the prior reads sigma, another step's
        proposal = step.proposal
        propose = proposal.propose

        def spy(rng, state, scale):
            fresh = proposal.init(state.x.copy())
            checks.append(np.max(np.abs(state.gradient - fresh.gradient)))
            return propose(rng, state, scale)

        proposal.propose = spy
        idata = pm.sample(draws=draws, tune=200, step=[step, pm.Metropolis([sigma])],
                          chains=1, cores=1, random_seed=1, progressbar=False,
                          compute_convergence_checks=False)
    return np.array(checks), posterior(idata)


def test_mala_state_follows_the_other_step_and_the_posterior_is_right():
    checks, post = _run(MinibatchBarker, draws=1500)
    assert checks.size == 1700 and np.max(checks) <= 1e-10
    beta_mean, sigma_mean = exact_means()
    z = [batch_means_z(np.asarray(post["beta"]).ravel(), beta_mean),
         batch_means_z(np.asarray(post["sigma"]).ravel(), sigma_mean)]
    assert np.max(np.abs(z)) <= Z_MAX, z


def test_the_spy_catches_a_state_kept_across_draws():
    checks, _ = _run(_StaleState, draws=100)
    assert np.max(checks) > 1e-3  # the gradient at the old sigma


@pytest.mark.parametrize("cls", [MinibatchBarker])
def test_random_walk_state_is_the_current_point(cls):
    # Without control variates: the random walk's state is always the current point.
    xs = []
    with pm.Model(), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        sigma = pm.HalfNormal("sigma", 1.0)
        beta = pm.Normal("beta", 0.0, sigma)
        pm.Normal("y", beta, 1.0, observed=Y)
        step = cls(vars=[beta], batch_size=Y.size, proposal="random_walk", S=[0.3])
        propose = step.proposal.propose

        def spy(rng, state, scale):
            xs.append(float(state.x[0]))
            return propose(rng, state, scale)

        step.proposal.propose = spy
        idata = pm.sample(draws=50, tune=0, step=[step, pm.Metropolis([sigma])], chains=1,
                          cores=1, random_seed=2, progressbar=False,
                          compute_convergence_checks=False)
    draws = np.asarray(posterior(idata)["beta"]).ravel()
    # The state at each transition is the previous draw's beta.
    np.testing.assert_array_equal(np.array(xs[1:]), draws[:-1])
