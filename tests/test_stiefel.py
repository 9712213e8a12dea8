"""The random walk on the orthogonal matrices (``StiefelRandomWalk``), and ICA with it.

- The walk stays on the manifold (``max |WᵀW − I| < 1e-10`` after many steps).
- It is symmetric. Its kernel is ``k(W, W') = f(WᵀW')`` (``W' = W R`` with ``R``
  drawn independently of ``W``), so ``k(W, W') = k(W', W)`` for all pairs exactly when
  ``R`` and ``Rᵀ`` have the same law. That is checked by two-sample Kolmogorov–Smirnov
  tests of each off-diagonal entry ``R_ab`` of one set of moves against ``R_ba`` of an
  independent set (Bonferroni over the entries). Two deliberately asymmetric variants
  that still report a log-q ratio of 0 fail it: a drift (a fixed rotation added to the
  generator) and a skewed generator (mean 0, but ``A`` and ``−A`` differ in law).
- On ICA with D = 2 the posterior lives on a circle (``W = rotation(θ)``), so
  ``E[d_A(W, W0) | data]`` is computed exactly by quadrature over θ; short chains of
  MinibatchBarker, AustereMH and ExactMH with the walk agree with it within 4 Monte Carlo
  standard errors (ArviZ's MCSE), and the drifting variant does not.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from pathlib import Path

import numpy as np
import pymc as pm
import pytest
import scipy.linalg
import scipy.stats

from pymc_minibatch_mh import AustereMH, ExactMH, MinibatchBarker
from pymc_minibatch_mh.model.compat import mcse, posterior
from pymc_minibatch_mh.proposals import ProposalState, StiefelRandomWalk
from pymc_minibatch_mh.proposals.stiefel import skew_normal

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _ica():
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    return importlib.import_module("austerity_ica")


class DriftingWalk(StiefelRandomWalk):
    """Broken: a fixed rotation is added to every move (asymmetric, ratio still 0)."""

    drift = 0.5

    def generator(self, rng):
        a = skew_normal(rng, self.matrix_size)
        a[0, 1] += self.drift
        a[1, 0] -= self.drift
        return a


class SkewedWalk(StiefelRandomWalk):
    """Broken: entries above the diagonal are (χ²₁ − 1)/√2: mean 0, variance 1, skewed."""

    def generator(self, rng):
        d = self.matrix_size
        upper = np.triu((rng.standard_normal((d, d)) ** 2 - 1.0) / np.sqrt(2.0), 1)
        return upper - upper.T


def _rotations(proposal, w, n, rng, scale):
    """``WᵀW'`` of ``n`` independent moves from ``w``."""
    state = proposal.init(w.reshape(-1))
    d = w.shape[0]
    return np.array([
        w.T @ proposal.propose(rng, state, scale)[0].x.reshape(d, d) for _ in range(n)
    ])


def _symmetry_p_value(proposal, seed: int, n: int = 6000, scale: float = 0.3) -> float:
    """Bonferroni p-value of "R and Rᵀ have the same law" (see the module docstring)."""
    rng = np.random.default_rng(seed)
    d = proposal.matrix_size
    w = scipy.stats.ortho_group.rvs(d, random_state=rng)
    forward = _rotations(proposal, w, n, rng, scale)
    other = _rotations(proposal, w, n, rng, scale)
    pairs = [(a, b) for a in range(d) for b in range(d) if a != b]
    p = min(scipy.stats.ks_2samp(forward[:, a, b], other[:, b, a]).pvalue for a, b in pairs)
    return min(1.0, p * len(pairs))


# ------------------------------------------------------------------ the proposal alone
def test_stays_on_the_manifold_after_many_steps():
    rng = np.random.default_rng(11)
    d = 4
    proposal = StiefelRandomWalk(d)
    w = scipy.stats.ortho_group.rvs(d, random_state=rng)
    state = proposal.init(w.reshape(-1))
    det = np.linalg.det(w)
    worst = 0.0
    for _ in range(10_000):
        state, info = proposal.propose(rng, state, 0.5)
        m = state.x.reshape(d, d)
        worst = max(worst, float(np.max(np.abs(m.T @ m - np.eye(d)))))
        assert info.log_q_ratio == 0.0 and info.scale == 0.5
    assert worst < 1e-10
    assert np.linalg.det(state.x.reshape(d, d)) == pytest.approx(det)  # same component
    assert not np.allclose(state.x, w.reshape(-1))  # it moved


def test_propose_leaves_the_state_alone():
    rng = np.random.default_rng(1)
    proposal = StiefelRandomWalk(3)
    x = scipy.stats.ortho_group.rvs(3, random_state=rng).reshape(-1)
    state = proposal.init(x.copy())
    new, _ = proposal.propose(rng, state, 0.2)
    assert np.array_equal(state.x, x) and new.x is not state.x


@pytest.mark.parametrize("d", [2, 3])
def test_is_symmetric(d):
    assert _symmetry_p_value(StiefelRandomWalk(d), seed=d) > 1e-3


@pytest.mark.parametrize("broken", [DriftingWalk, SkewedWalk])
def test_symmetry_check_catches_asymmetric_walks(broken):
    assert _symmetry_p_value(broken(3), seed=3) < 1e-6


def test_refuses_bad_input():
    with pytest.raises(ValueError, match="at least 2"):
        StiefelRandomWalk(1)
    with pytest.raises(TypeError, match="integer"):
        StiefelRandomWalk(2.0)
    proposal = StiefelRandomWalk(3)
    with pytest.raises(ValueError, match="samples 4 coordinates"):
        proposal.init(np.zeros(4))
    with pytest.raises(ValueError, match="start on the manifold.*initval"):
        proposal.init(np.zeros(9))
    with pytest.raises(ValueError, match="samples 4 coordinates"):
        proposal.propose(np.random.default_rng(0), ProposalState(np.zeros(4)), 0.1)


def test_a_step_refuses_a_start_off_the_manifold():
    z = np.random.default_rng(0).laplace(size=(200, 2))
    model = _ica().ica_model(z, initval=2.0 * np.eye(2))  # invertible, not orthogonal
    with model, pytest.raises(ValueError, match="start on the manifold"):
        pm.sample(draws=5, tune=0, step=ExactMH(proposal=StiefelRandomWalk(2)), chains=1,
                  cores=1, random_seed=0, progressbar=False, compute_convergence_checks=False)


# ------------------------------------------------------------------ ICA, D = 2
N_ROWS = 2000


def _statistics(ica, w, w0):
    """Test functions invariant under ICA's symmetries (rotations by π/2 in SO(2)).

    The Amari distance to ``W0`` and ``cos 4θ``, ``sin 4θ`` of the rotation angle θ.
    """
    angle = 4.0 * np.arctan2(w[..., 1, 0], w[..., 0, 0])
    return {"amari": ica.amari_distance(w, w0), "cos4": np.cos(angle), "sin4": np.sin(angle)}


@pytest.fixture(scope="module")
def ica2():
    """Whitened mixtures of two Laplace sources, the model and the exact posterior means."""
    ica = _ica()
    rng = np.random.default_rng(7)
    sources = rng.laplace(scale=1 / np.sqrt(2), size=(N_ROWS, 2))
    mixing = np.array([[1.0, 0.6], [0.3, 1.2]])
    x = sources @ mixing.T
    x -= x.mean(axis=0)
    evals, evecs = np.linalg.eigh(np.cov(x, rowvar=False))
    whitening = (evecs / np.sqrt(evals)).T
    z = x @ whitening.T
    w0 = np.linalg.inv(whitening @ mixing)
    start = scipy.linalg.polar(w0)[0]
    if np.linalg.det(start) < 0:
        start = start[::-1]  # a row swap: same likelihood, the rotations' component
    # Quadrature over SO(2): W(θ) = rotation(θ), Haar measure dθ; the likelihood has period
    # π/2 in θ (signed row permutations), so one period holds the whole posterior.
    theta = np.linspace(0.0, np.pi / 2, 2000, endpoint=False)
    c, s = np.cos(theta), np.sin(theta)
    ws = np.stack([np.stack([c, -s], -1), np.stack([s, c], -1)], -2)  # (T, 2, 2)
    loglik = scipy.stats.logistic.logpdf(np.einsum("tjk,nk->tnj", ws, z)).sum(axis=(1, 2))
    weights = np.exp(loglik - loglik.max())
    weights /= weights.sum()
    exact = {k: float(weights @ v) for k, v in _statistics(ica, ws, w0).items()}
    model = ica.ica_model(z, initval=start)
    return {"model": model, "w0": w0, "exact": exact, "ica": ica}


def _chain_errors(ica2, step_class, proposal, seed, draws=2000, **kwargs):
    """Each statistic's |chain mean − exact| / MCSE, and the MCSEs."""
    with ica2["model"], warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the rows-per-step note at K = 1
        step = step_class(proposal=proposal, scaling=0.05, **kwargs)
        idata = pm.sample(draws=draws, tune=300, step=step, chains=1, cores=1,
                          random_seed=seed, progressbar=False,
                          compute_convergence_checks=False)
    w = np.asarray(posterior(idata)["W"])[0]
    z_scores, errors = {}, {}
    for name, values in _statistics(ica2["ica"], w, ica2["w0"]).items():
        errors[name] = mcse(values)
        z_scores[name] = abs(values.mean() - ica2["exact"][name]) / errors[name]
    return z_scores, errors


@pytest.mark.parametrize(
    "step_class, kwargs",
    [(MinibatchBarker, dict(batch_size=100)), (AustereMH, dict(batch_size=100, epsilon=0.01)),
     (ExactMH, {})],
    ids=["barker", "austere", "exact"],
)
def test_ica_chain_matches_quadrature(ica2, step_class, kwargs):
    z_scores, errors = _chain_errors(ica2, step_class, StiefelRandomWalk(2), seed=5, **kwargs)
    assert max(z_scores.values()) < 4.0, (z_scores, ica2["exact"])
    assert errors["amari"] < 0.2 * ica2["exact"]["amari"]  # the check has power
    assert max(errors["cos4"], errors["sin4"]) < 0.05


def test_ica_check_catches_the_drifting_walk(ica2):
    z_scores, _ = _chain_errors(ica2, MinibatchBarker, DriftingWalk(2), seed=5,
                                batch_size=100)
    assert max(z_scores.values()) > 4.0, z_scores
