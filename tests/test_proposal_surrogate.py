"""Surrogate-based proposals: exact log-q ratios, and exact MH chains that recover known targets.

Every statistical check runs a plain Metropolis-Hastings chain (full target, no minibatch)
with fixed seeds and compares its means and variances to exact values with batch-means
Monte Carlo errors (|z| ≤ 4). The same check is shown to *reject* chains whose log-q ratio
is dropped, so it has the power to catch a wrong correction.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import expit, log_expit
from scipy.stats import multivariate_normal

from pymc_minibatch_mh.proposals import (
    CrankNicolsonProposal,
    GaussianSurrogate,
    ProposalState,
    SurrogateHMCProposal,
    SurrogateLangevinProposal,
)
from pymc_minibatch_mh.proposals.crank_nicolson import MIN_RHO

Z_MAX = 4.0
N_BATCHES = 40


# --------------------------------------------------------------------------- helpers


class FixedNormals:
    """A stand-in for a Generator whose ``standard_normal`` returns given vectors."""

    def __init__(self, *vectors):
        self._vectors = [np.asarray(v, dtype=np.float64) for v in vectors]

    def standard_normal(self, size):
        v = self._vectors.pop(0)
        assert v.shape == (size,)
        return v.copy()


def move(proposal, rng, x, scale):
    """One proposal from a fresh state at ``x``: ``(x′, log_q_ratio, info)``."""
    state, info = proposal.propose(rng, proposal.init(np.asarray(x, dtype=np.float64)), scale)
    return state.x, info.log_q_ratio, info


def mh_chain(proposal, log_target, x0, scale, n, seed, q_mode="exact"):
    """Exact MH: accept iff log u < log π(θ') − log π(θ) + log_q_ratio (state carried)."""
    rng = np.random.default_rng(seed)
    state = proposal.init(np.array(x0, dtype=np.float64))
    lp = log_target(state.x)
    out = np.empty((n, state.x.size))
    accepted = 0
    for i in range(n):
        new, info = proposal.propose(rng, state, scale)
        log_q = info.log_q_ratio
        if q_mode == "zero":
            log_q = 0.0
        elif q_mode == "flip":
            log_q = -log_q
        lp_new = log_target(new.x)
        if math.log(rng.random()) < lp_new - lp + log_q:
            state, lp = new, lp_new
            accepted += 1
        out[i] = state.x
    return out, accepted / n


def batch_means_z(samples, target):
    """z-scores of the column means of ``samples`` against ``target`` (batch-means MCSE)."""
    n = samples.shape[0] // N_BATCHES * N_BATCHES
    s = samples[:n]
    batch = s.reshape(N_BATCHES, -1, s.shape[1]).mean(axis=1)
    se = batch.std(axis=0, ddof=1) / math.sqrt(N_BATCHES)
    return (s.mean(axis=0) - target) / se


def moment_z(samples, mean, var):
    """z-scores of the chain's means and of its mean squared deviations from ``mean``."""
    z_mean = batch_means_z(samples, mean)
    z_var = batch_means_z((samples - mean) ** 2, var)
    return np.concatenate([z_mean, z_var])


# --------------------------------------------------------------------------- targets

# (a) A correlated 3-D Gaussian that differs from the surrogate: mean shifted by 0.5
# surrogate sd per coordinate, covariance scaled by 1.3.
SUR_MEAN = np.array([0.5, -1.0, 2.0])
SUR_COV = np.array([[1.0, 0.6, -0.3], [0.6, 2.0, 0.5], [-0.3, 0.5, 0.8]])
GAUSS_MEAN = SUR_MEAN + 0.5 * np.sqrt(np.diag(SUR_COV))
GAUSS_COV = 1.3 * SUR_COV
_GAUSS_PREC = np.linalg.inv(GAUSS_COV)


def gauss_log_target(x):
    r = x - GAUSS_MEAN
    return -0.5 * float(r @ _GAUSS_PREC @ r)


# (b) A small logistic regression (8 rows, 2 coefficients, N(0, 2²) prior): log-concave,
# skewed; its posterior mean is ~0.2 sd away from the mode and its variances are 1.1-1.3
# times the Laplace fit's. Exact moments by quadrature on a fine grid.
_rng_data = np.random.default_rng(7)
LOGIT_X = _rng_data.normal(size=(8, 2)) * np.array([1.0, 2.0])
LOGIT_X[:, 0] += 0.5
LOGIT_Y = (_rng_data.random(8) < expit(LOGIT_X @ np.array([1.0, -0.7]))).astype(float)
PRIOR_SD = 2.0


def logit_log_target(b):
    eta = LOGIT_X @ b
    return float(np.sum(LOGIT_Y * eta + log_expit(-eta)) - 0.5 * (b @ b) / PRIOR_SD**2)


def logit_grad(b):
    return LOGIT_X.T @ (LOGIT_Y - expit(LOGIT_X @ b)) - b / PRIOR_SD**2


def _logit_hessian(b):
    p = expit(LOGIT_X @ b)
    return -(LOGIT_X.T * (p * (1 - p))) @ LOGIT_X - np.eye(2) / PRIOR_SD**2


@pytest.fixture(scope="module")
def logit():
    """Laplace fit and exact posterior mean and variances of target (b)."""
    b = np.zeros(2)
    for _ in range(50):
        b = b - np.linalg.solve(_logit_hessian(b), logit_grad(b))
    cov = np.linalg.inv(-_logit_hessian(b))
    sd = np.sqrt(np.diag(cov))
    g1 = np.linspace(b[0] - 12 * sd[0], b[0] + 12 * sd[0], 801)
    g2 = np.linspace(b[1] - 12 * sd[1], b[1] + 12 * sd[1], 801)
    b1, b2 = np.meshgrid(g1, g2, indexing="ij")
    eta = LOGIT_X[:, 0, None, None] * b1 + LOGIT_X[:, 1, None, None] * b2
    logw = np.sum(LOGIT_Y[:, None, None] * eta + log_expit(-eta), axis=0)
    logw -= 0.5 * (b1**2 + b2**2) / PRIOR_SD**2
    w = np.exp(logw - logw.max())
    w /= w.sum()
    # The grid spans ±12 Laplace sd: the mass on its edges must be negligible.
    assert w[[0, -1], :].sum() + w[:, [0, -1]].sum() < 1e-9
    mean = np.array([(w * b1).sum(), (w * b2).sum()])
    var = np.array([(w * (b1 - mean[0]) ** 2).sum(), (w * (b2 - mean[1]) ** 2).sum()])
    # Non-Gaussian enough that a chain on the surrogate alone would fail the check.
    assert np.all(np.abs(mean - b) > 0.1 * sd) and np.all(var > 1.05 * np.diag(cov))
    return GaussianSurrogate(b, cov), mean, var


def _gauss_surrogate():
    return GaussianSurrogate(SUR_MEAN, SUR_COV)


# --------------------------------------------------------------------------- chains

N_DRAWS = 20_000

# (name, factory(surrogate, grad) -> proposal, scale on (a), scale on (b))
PROPOSALS = [
    ("cn", lambda sur, grad: CrankNicolsonProposal(sur), 0.8, 0.9),
    ("cn_independence", lambda sur, grad: CrankNicolsonProposal(sur), 1.0, 1.0),
    # over-relaxed: ρ = −0.5 (the default min_rho, reached at max_scale)
    ("cn_overrelaxed", lambda sur, grad: CrankNicolsonProposal(sur), 1.2, 1.2),
    ("mala", lambda sur, grad: SurrogateLangevinProposal(grad, sur), 1.0, 1.2),
    ("hmc", lambda sur, grad: SurrogateHMCProposal(grad, sur, n_steps=3), 0.5, 0.6),
]


@pytest.mark.parametrize(
    ("factory", "scale"), [(p[1], p[2]) for p in PROPOSALS], ids=[p[0] for p in PROPOSALS]
)
def test_chain_recovers_shifted_gaussian(factory, scale):
    # Gradient of the *surrogate* (as in the package: Taylor expansion + prior), which is
    # not the target's: the drift is wrong and only the q-ratio keeps the chain exact.
    sur = _gauss_surrogate()
    proposal = factory(sur, sur.grad_log_density)
    samples, acc = mh_chain(proposal, gauss_log_target, SUR_MEAN, scale, N_DRAWS, seed=1)
    assert 0.3 < acc < 0.95
    z = moment_z(samples, GAUSS_MEAN, np.diag(GAUSS_COV))
    assert np.max(np.abs(z)) <= Z_MAX, z


@pytest.mark.parametrize(
    ("factory", "scale"), [(p[1], p[3]) for p in PROPOSALS], ids=[p[0] for p in PROPOSALS]
)
def test_chain_recovers_logistic_posterior(logit, factory, scale):
    # Gradient of the exact target here, so MALA and HMC are checked with a nonlinear drift.
    sur, mean, var = logit
    proposal = factory(sur, logit_grad)
    samples, acc = mh_chain(proposal, logit_log_target, sur.theta_hat, scale, N_DRAWS, seed=2)
    assert 0.3 < acc < 0.99
    z = moment_z(samples, mean, var)
    assert np.max(np.abs(z)) <= Z_MAX, z


@pytest.mark.parametrize("q_mode", ["zero", "flip"])
@pytest.mark.parametrize(
    ("factory", "scale"), [(p[1], p[2]) for p in PROPOSALS], ids=[p[0] for p in PROPOSALS]
)
def test_check_rejects_broken_q_ratio(factory, scale, q_mode):
    # The same chain and check with log_q_ratio dropped (or its sign flipped) must fail,
    # and by a wide margin (measured max |z|: 25-47 dropped, 35-54 flipped), so the
    # check has power.
    sur = _gauss_surrogate()
    proposal = factory(sur, sur.grad_log_density)
    samples, _ = mh_chain(
        proposal, gauss_log_target, SUR_MEAN, scale, N_DRAWS // 4, seed=1, q_mode=q_mode
    )
    z = moment_z(samples, GAUSS_MEAN, np.diag(GAUSS_COV))
    assert np.max(np.abs(z)) > 3 * Z_MAX, z


def test_check_rejects_broken_q_ratio_on_logistic(logit):
    # Also on the non-Gaussian target, with the target's own gradient (measured max |z| 24).
    sur, mean, var = logit
    proposal = SurrogateLangevinProposal(logit_grad, sur)
    samples, _ = mh_chain(
        proposal, logit_log_target, sur.theta_hat, 1.2, N_DRAWS // 4, seed=2, q_mode="zero"
    )
    z = moment_z(samples, mean, var)
    assert np.max(np.abs(z)) > 3 * Z_MAX, z


# --------------------------------------------------------------------------- exact ratios


def _random_spd(rng, d):
    a = rng.normal(size=(d, d))
    return a @ a.T / d + 0.3 * np.eye(d)


def _cn_scale(rho):
    """The scale at which CrankNicolsonProposal moves with ``rho`` (see its notes)."""
    return math.sqrt(1 - rho**2) if rho >= 0 else 2 - math.sqrt(1 - rho**2)


@pytest.mark.parametrize("rho", [-0.9, -0.5, -0.2, 0.0, 0.3, 0.9, 0.999])
def test_cn_log_q_ratio_matches_brute_force(rho):
    rng = np.random.default_rng(11)
    d = 4
    sur = GaussianSurrogate(rng.normal(size=d), _random_spd(rng, d))
    prop = CrankNicolsonProposal(sur, min_rho=min(rho, 0.0))
    scale = _cn_scale(rho)
    assert prop.rho(scale) == pytest.approx(rho, abs=1e-12)
    for _ in range(5):
        x = sur.theta_hat + 2.0 * rng.normal(size=d)
        x_new, log_q, info = move(prop, rng, x, scale)
        s2 = 1.0 - rho**2

        def log_q_dens(to, frm, s2=s2):
            mean = sur.theta_hat + rho * (frm - sur.theta_hat)
            return multivariate_normal(mean, s2 * sur.cov).logpdf(to)

        brute = log_q_dens(x, x_new) - log_q_dens(x_new, x)
        assert log_q == pytest.approx(brute, rel=1e-9, abs=1e-9)
        # ... which is also log N(x; θ̂, Σ) − log N(x'; θ̂, Σ) (reversibility).
        assert log_q == pytest.approx(sur.log_density(x) - sur.log_density(x_new), abs=1e-9)
        assert info.rho == pytest.approx(rho, abs=1e-12)
        assert info.scale == pytest.approx(scale)


def test_cn_rho_falls_with_the_scale_and_stops_at_min_rho():
    sur = _gauss_surrogate()
    prop = CrankNicolsonProposal(sur)
    assert prop.min_rho == MIN_RHO == -0.5
    assert prop.max_scale == pytest.approx(_cn_scale(-0.5))
    scales = np.linspace(0.01, prop.max_scale, 200)
    rhos = np.array([prop.rho(s) for s in scales])
    assert np.all(np.diff(rhos) < 0)  # monotone, hence continuous at s = 1 (ρ = 0)
    assert prop.rho(1.0) == 0.0 and prop.rho(prop.max_scale) == pytest.approx(-0.5)
    # Beyond max_scale: clamped, and the info reports the scale used.
    x = np.array([1.0, 0.0, -1.0])
    x_max, r_max, _ = move(prop, np.random.default_rng(3), x, prop.max_scale)
    x_big, r_big, info = move(prop, np.random.default_rng(3), x, 5.0)
    np.testing.assert_array_equal(x_big, x_max)
    assert r_big == r_max and info.rho == pytest.approx(-0.5)
    assert info.scale == prop.max_scale
    for bad in (-1.0, -1.5, 0.1, math.nan):
        with pytest.raises(ValueError, match="min_rho must be in"):
            CrankNicolsonProposal(sur, min_rho=bad)


def test_cn_scale_one_is_the_independence_sampler():
    sur = _gauss_surrogate()
    prop = CrankNicolsonProposal(sur, min_rho=0.0)
    x = np.array([1.0, 0.0, -1.0])
    x1, r1, _ = move(prop, np.random.default_rng(3), x, 1.0)
    x5, r5, info = move(prop, np.random.default_rng(3), x, 5.0)
    np.testing.assert_array_equal(x1, x5)
    assert r1 == r5
    assert info.rho == 0.0
    assert info.scale == 1.0  # the scale it used: clamped
    assert prop.max_scale == 1.0  # with min_rho = 0 the tuner stays at or below 1
    # Independent of x: the same draw from another start gives the same proposal.
    x2, _, _ = move(CrankNicolsonProposal(sur), np.random.default_rng(3), -x, 1.0)
    np.testing.assert_allclose(x2, x1, atol=1e-12)


def test_cn_overrelaxed_chain_is_antithetic():
    # On its own surrogate every proposal is accepted and the chain is the AR(1) process
    # z' = ρz + √(1 − ρ²)ξ: lag-1 autocorrelation ρ, so means have an effective sample size
    # (1 − ρ)/(1 + ρ) = 3 times the draws, and squares (1 − ρ²)/(1 + ρ²) = 0.6 times.
    sur = _gauss_surrogate()
    prop = CrankNicolsonProposal(sur)
    samples, acc = mh_chain(prop, sur.log_density, SUR_MEAN, prop.max_scale, N_DRAWS, seed=4)
    assert acc == 1.0
    assert np.max(np.abs(moment_z(samples, SUR_MEAN, np.diag(SUR_COV)))) <= Z_MAX
    z = (samples - SUR_MEAN) / np.sqrt(np.diag(SUR_COV))
    lag1 = np.mean(z[1:] * z[:-1], axis=0) / np.mean(z * z, axis=0)
    # sd of a lag-1 autocorrelation estimate of an AR(1): √((1 − ρ²)/n) ≈ 0.006
    np.testing.assert_allclose(lag1, -0.5, atol=4 * math.sqrt(0.75 / N_DRAWS))


class _WrongInnovationCN(CrankNicolsonProposal):
    """Over-relaxed moves whose innovation is not √(1 − ρ²): not reversible w.r.t. N(θ̂, Σ)."""

    def _coefficients(self, scale):  # what propose uses, for a clamped scale
        rho, _ = super()._coefficients(scale)
        return rho, 1.0


def test_check_rejects_cn_with_a_wrong_innovation():
    # The log-q ratio ½‖z′‖² − ½‖z‖² holds only for the innovation √(1 − ρ²). With
    # innovation 1 at ρ = −0.5 the chain on the surrogate's own density (which the
    # antithetic test above passes) accepts every move and settles on N(θ̂, Σ/0.75)
    # (measured max |z| 21.5 against 2.4 for the right innovation).
    sur = _gauss_surrogate()
    prop = _WrongInnovationCN(sur)
    samples, acc = mh_chain(prop, sur.log_density, SUR_MEAN, prop.max_scale, N_DRAWS,
                            seed=4)
    assert acc == 1.0
    z = moment_z(samples, SUR_MEAN, np.diag(SUR_COV))
    assert np.max(np.abs(z)) > 3 * Z_MAX, z


def _nonlinear_grad(x):
    return -x - 0.5 * np.sin(2.0 * x) + 0.2 * np.roll(x, 1) ** 2


@pytest.mark.parametrize("h", [0.05, 0.7, 2.0])
def test_mala_log_q_ratio_matches_brute_force(h):
    rng = np.random.default_rng(12)
    d = 4
    sur = GaussianSurrogate(rng.normal(size=d), _random_spd(rng, d))
    prop = SurrogateLangevinProposal(_nonlinear_grad, sur)

    def log_q_dens(to, frm):
        mean = frm + 0.5 * h**2 * sur.cov @ _nonlinear_grad(frm)
        return multivariate_normal(mean, h**2 * sur.cov).logpdf(to)

    for _ in range(5):
        x = rng.normal(size=d)
        x_new, log_q, info = move(prop, rng, x, h)
        brute = log_q_dens(x, x_new) - log_q_dens(x_new, x)
        assert log_q == pytest.approx(brute, rel=1e-8, abs=1e-8)
        assert info.step_size == h


def test_mala_reverse_move_has_opposite_ratio():
    rng = np.random.default_rng(13)
    d = 3
    sur = GaussianSurrogate(rng.normal(size=d), _random_spd(rng, d))
    h = 0.8
    x = rng.normal(size=d)
    xi = rng.normal(size=d)
    x_new, log_q, _ = move(SurrogateLangevinProposal(_nonlinear_grad, sur), FixedNormals(xi), x, h)
    # The noise that takes x_new back to x.
    back = x - x_new - 0.5 * h**2 * sur.cov @ _nonlinear_grad(x_new)
    xi_back = np.linalg.solve(sur.chol, back) / h
    x_back, log_q_back, _ = move(
        SurrogateLangevinProposal(_nonlinear_grad, sur), FixedNormals(xi_back), x_new, h
    )
    np.testing.assert_allclose(x_back, x, atol=1e-12)
    assert log_q_back == pytest.approx(-log_q, abs=1e-10)


def _explicit_leapfrog(x, p, eps, n_steps, cov, grad):
    """Textbook leapfrog with mass matrix M = cov⁻¹ (velocity M⁻¹p = cov·p)."""
    x, p = x.copy(), p.copy()
    for _ in range(n_steps):
        p = p + 0.5 * eps * grad(x)
        x = x + eps * cov @ p
        p = p + 0.5 * eps * grad(x)
    return x, p


@pytest.mark.parametrize("n_steps", [1, 2, 5])
def test_hmc_matches_explicit_hamiltonian(n_steps):
    rng = np.random.default_rng(14)
    d = 4
    sur = GaussianSurrogate(rng.normal(size=d), _random_spd(rng, d))
    eps = 0.4
    mass = sur.precision
    for _ in range(4):
        x = rng.normal(size=d)
        u = rng.normal(size=d)
        prop = SurrogateHMCProposal(_nonlinear_grad, sur, n_steps=n_steps)
        x_new, log_q, info = move(prop, FixedNormals(u), x, eps)
        # u = Lᵀp with p ~ N(0, M): p = L⁻ᵀu.
        p = np.linalg.solve(sur.chol.T, u)
        x_ref, p_ref = _explicit_leapfrog(x, p, eps, n_steps, sur.cov, _nonlinear_grad)
        np.testing.assert_allclose(x_new, x_ref, rtol=1e-10, atol=1e-10)
        kinetic = multivariate_normal(np.zeros(d), mass)
        # Extended target π(θ)N(p; 0, M): the momentum's share of the MH log ratio is
        # log N(p'; 0, M) − log N(p; 0, M) = K(p) − K(p').
        brute = kinetic.logpdf(p_ref) - kinetic.logpdf(p)
        assert log_q == pytest.approx(brute, rel=1e-8, abs=1e-8)
        # Momentum flip: starting at x_new with −p_ref returns to x with the opposite ratio.
        x_back, log_q_back, _ = move(
            SurrogateHMCProposal(_nonlinear_grad, sur, n_steps),
            FixedNormals(-sur.chol.T @ p_ref), x_new, eps,
        )
        np.testing.assert_allclose(x_back, x, atol=1e-9)
        assert log_q_back == pytest.approx(-log_q, abs=1e-9)
        assert prop.density_evaluations == n_steps + 1
        assert info.step_size == eps


def test_hmc_one_step_is_mala():
    rng = np.random.default_rng(15)
    d = 5
    sur = GaussianSurrogate(rng.normal(size=d), _random_spd(rng, d))
    x = rng.normal(size=d)
    a = move(SurrogateLangevinProposal(_nonlinear_grad, sur), np.random.default_rng(1), x, 0.9)
    b = move(SurrogateHMCProposal(_nonlinear_grad, sur, 1), np.random.default_rng(1), x, 0.9)
    np.testing.assert_allclose(a[0], b[0], rtol=1e-12, atol=1e-12)
    assert a[1] == pytest.approx(b[1], rel=1e-10, abs=1e-12)


# --------------------------------------------------------------------------- state


@pytest.mark.parametrize("kind", ["cn", "mala", "hmc"])
def test_carried_state_gives_the_same_chain_as_fresh_states(kind):
    """What travels in the state (whitened point, whitened gradient) must not change any
    proposal or ratio: a chain that carries it equals one that rebuilds it every call,
    also when the caller mutates the returned array in place (a state's x is its own)."""
    sur = _gauss_surrogate()

    def make():
        if kind == "cn":
            return CrankNicolsonProposal(sur)
        if kind == "mala":
            return SurrogateLangevinProposal(_nonlinear_grad, sur)
        return SurrogateHMCProposal(_nonlinear_grad, sur, 2)

    carried, fresh = make(), make()
    rng_a, rng_b = np.random.default_rng(5), np.random.default_rng(5)
    state = carried.init(SUR_MEAN.copy())
    for i in range(30):
        new, info = carried.propose(rng_a, state, 0.6)
        ref, info_ref = fresh.propose(rng_b, fresh.init(state.x.copy()), 0.6)
        # CN's fresh state whitens by a triangular solve: equal up to rounding.
        np.testing.assert_allclose(new.x, ref.x, rtol=1e-13, atol=1e-13)
        assert info.log_q_ratio == pytest.approx(info_ref.log_q_ratio, rel=1e-12, abs=1e-12)
        if i % 3 == 0:
            state = new  # accept
        elif i % 3 == 1:
            mutated = new.x.copy()
            mutated += 0.25  # another point: the caller builds its state afresh
            state = carried.init(mutated)
    if kind != "cn":
        # n_steps gradients per proposal, plus one per state built (the first and 10).
        assert carried.density_evaluations == 30 * (2 if kind == "hmc" else 1) + 11


def test_proposal_state_is_immutable():
    state = ProposalState(np.zeros(2))
    with pytest.raises(AttributeError):
        state.x = np.ones(2)


def test_non_finite_gradient_means_rejection():
    sur = _gauss_surrogate()

    def grad(x):
        return np.full(3, np.nan) if x[0] > SUR_MEAN[0] + 1.0 else -x

    x = SUR_MEAN + np.array([2.0, 0.0, 0.0])
    for prop in (SurrogateLangevinProposal(grad, sur), SurrogateHMCProposal(grad, sur)):
        x_new, r, _ = move(prop, np.random.default_rng(0), x, 0.5)
        assert r == -math.inf
        np.testing.assert_array_equal(x_new, x)


# --------------------------------------------------------------------------- surrogate


def test_gaussian_surrogate_factors_and_density():
    rng = np.random.default_rng(16)
    d = 4
    mean, cov = rng.normal(size=d), _random_spd(rng, d)
    sur = GaussianSurrogate(mean, cov)
    np.testing.assert_allclose(sur.chol @ sur.chol.T, cov, atol=1e-12)
    assert np.allclose(np.triu(sur.chol, 1), 0.0)
    np.testing.assert_allclose(sur.precision @ cov, np.eye(d), atol=1e-10)
    np.testing.assert_array_equal(sur.precision, sur.precision.T)
    x = rng.normal(size=d)
    ref = multivariate_normal(mean, cov).logpdf(x) + 0.5 * d * math.log(2 * math.pi)
    assert sur.log_density(x) == pytest.approx(ref, rel=1e-12)
    eps = 1e-6
    num = [
        (sur.log_density(x + eps * e) - sur.log_density(x - eps * e)) / (2 * eps) for e in np.eye(d)
    ]
    np.testing.assert_allclose(sur.grad_log_density(x), num, rtol=1e-6, atol=1e-8)
    assert sur.dim == d


@pytest.mark.parametrize(
    ("mean", "cov", "match"),
    [
        (np.zeros(2), np.array([[1.0, 2.0], [2.0, 1.0]]), "not positive definite"),
        (np.zeros(2), np.zeros((2, 2)), "not positive definite"),
        (np.zeros(2), np.eye(3), "must be a 2×2 matrix"),
        (np.zeros(2), np.ones(2), "must be a 2×2 matrix"),
        (np.zeros((2, 1)), np.eye(2), "must be a non-empty vector"),
        (np.zeros(0), np.eye(0), "must be a non-empty vector"),
        (np.array([0.0, np.nan]), np.eye(2), "theta_hat has non-finite"),
        (np.zeros(2), np.array([[1.0, np.inf], [np.inf, 1.0]]), "cov has non-finite"),
        (np.zeros(2), np.array([[1.0, 0.5], [0.4, 1.0]]), "not symmetric"),
    ],
)
def test_gaussian_surrogate_errors(mean, cov, match):
    with pytest.raises(ValueError, match=match):
        GaussianSurrogate(mean, cov)


def test_gaussian_surrogate_is_read_only():
    sur = _gauss_surrogate()
    with pytest.raises(AttributeError):
        sur.theta_hat = np.zeros(3)
    with pytest.raises(ValueError, match="read-only"):
        sur.chol[0, 0] = 2.0


def test_gaussian_surrogate_symmetrises_rounding():
    cov = np.array([[1.0, 0.5], [0.5 + 1e-13, 1.0]])
    sur = GaussianSurrogate(np.zeros(2), cov)
    np.testing.assert_array_equal(sur.cov, sur.cov.T)


@pytest.mark.parametrize("scale", [0.0, -1.0, math.nan, math.inf])
def test_bad_scale_is_refused(scale):
    sur = _gauss_surrogate()
    for prop in (
        CrankNicolsonProposal(sur),
        SurrogateLangevinProposal(sur.grad_log_density, sur),
        SurrogateHMCProposal(sur.grad_log_density, sur),
    ):
        with pytest.raises(ValueError, match="positive finite"):
            move(prop, np.random.default_rng(0), SUR_MEAN, scale)


def test_names_and_constructor_checks():
    sur = _gauss_surrogate()
    assert CrankNicolsonProposal.name == "crank_nicolson"
    assert SurrogateLangevinProposal.name == "surrogate_mala"
    assert SurrogateHMCProposal.name == "surrogate_hmc"
    with pytest.raises(TypeError, match="GaussianSurrogate"):
        CrankNicolsonProposal((SUR_MEAN, SUR_COV))
    with pytest.raises(TypeError, match="callable"):
        SurrogateLangevinProposal(None, sur)
    with pytest.raises(ValueError, match="n_steps"):
        SurrogateHMCProposal(sur.grad_log_density, sur, n_steps=0)
    bad = SurrogateLangevinProposal(lambda x: np.zeros(2), sur)
    with pytest.raises(ValueError, match="expected \\(3,\\)"):
        move(bad, np.random.default_rng(0), SUR_MEAN, 0.5)


def test_the_proposals_package_exports_every_proposal():
    import pymc_minibatch_mh.proposals as proposals
    from pymc_minibatch_mh.proposals.base import Proposal

    for name in proposals.__all__:
        obj = getattr(proposals, name)
        if isinstance(obj, type) and name.endswith("Proposal") and name != "Proposal":
            assert issubclass(obj, Proposal), name
