r"""Surrogate NUTS: one iteration of PyMC's NUTS on the data-free surrogate posterior.

The surrogate transition (:mod:`~pymc_minibatch_mh.proposals.transition`) makes
any kernel that is reversible with respect to the surrogate posterior ``π̃`` a proposal
with the exact ratio ``q(θ | θ′)/q(θ′ | θ) = π̃(θ)/π̃(θ′)``. Its fixed HMC trajectories
preconditioned by the Laplace fit fail where the posterior is curved: on a hierarchical
model's ridge in (μ, log τ, z) the right step size and trajectory length change along the
ridge. NUTS chooses the trajectory's length at every iteration, and PyMC's NUTS adapts
its step size and mass matrix while tuning (dense up to :data:`DENSE_MASS_MAX_DIM`
dimensions; above, diagonal in coordinates whitened by the Laplace fit's covariance):
:class:`SurrogateNUTSProposal`
runs one iteration of ``pymc.NUTS`` on a model whose only term is ``log π̃`` (the prior,
with Jacobians, plus the closed-form full-data sum of the control variates' expansions,
as a PyTensor graph). It touches no data: a leapfrog step costs the gradient of the
closed form, O(k²) for k coefficients, against O(N) for NUTS on the model itself.

Correctness: after tuning, NUTS with a fixed step size (randomly jittered, independently
of the state) and mass matrix is reversible with respect to its target, so the log-q ratio
``log π̃(θ) − log π̃(θ′)`` is exact and the minibatch test decides on the residuals alone.
While tuning, the kernel adapts and is not reversible; tuning draws are discarded, as for
every tuned proposal. The inner sampler's randomness comes from a generator spawned from
the chain's generator at the chain start (:meth:`SurrogateNUTSProposal.start_chain`),
which also restarts its adaptation.

Coordinates: when the surrogate posterior carries a
:class:`~pymc_minibatch_mh.proposals.surrogate.Centring` (group effects that the data fix
well, in a model written non-centred), NUTS runs on π̃ in those coordinates, with its
Jacobian, and its end is carried back; the ratio stays ``log π̃(θ) − log π̃(θ′)`` in the
model's coordinates (see ``Centring``). On the zoo's crossed random intercepts
(N = 3·10⁴, d = 222) this, with a diagonal mass matrix, took the chain from R-hat 1.86
to 1.00, but not robustly: the same seed with other floating-point rounding gave R-hat
1.06 (``mu``, whose sum with the large groups' effects is what the data fix; a diagonal
mass matrix does not follow that correlation). Whitened by the Laplace fit (above
:data:`DENSE_MASS_MAX_DIM`), that chain gives R-hat 1.003 and min bulk ESS 1,441, and
1,496 / 1,566 at N = 3·10⁵ / 10⁶ (``benchmarks/zoo_results.md``).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import scipy.linalg
from numpy.typing import NDArray
from pytensor.graph.replace import graph_replace

from pymc_minibatch_mh.model.compat import default_mode, start_inner_chain
from pymc_minibatch_mh.model.graph import clone_replace
from pymc_minibatch_mh.model.internals import (
    adaptation_window,
    build_without_object_mode,
    diag_adapt_potential,
    full_adapt_potential,
    set_adaptation_window,
    set_step_tuning,
)
from pymc_minibatch_mh.proposals.base import Proposal, ProposalInfo, ProposalState
from pymc_minibatch_mh.proposals.surrogate import SurrogatePosterior

__all__ = ["DENSE_MASS_MAX_DIM", "SurrogateNUTSProposal"]

#: Largest dimension with a dense adapted mass matrix. PyMC estimates the dense matrix
#: from the draws of its adaptation windows, the first of 101 draws: with more dimensions
#: than about half of that, the estimate is nearly singular, directions it misses get a
#: tiny mass-matrix variance, so the next windows' draws do not move along them either,
#: and the kernel freezes there (measured on the crossed random intercepts, d = 222:
#: within-chain sds of the slopes 0.002 against 0.014). Above it, NUTS runs in the
#: coordinates whitened by the Laplace fit (ψ = L⁻¹(u − mean), L L' its covariance) with
#: an adapted diagonal mass matrix: the fit's correlations are used without an estimate.
#: On that model's π̃ alone this gave min bulk ESS 1,001 of 2,000 draws in 31 s, against
#: 139 in 70 s with a diagonal mass matrix in the unwhitened coordinates.
DENSE_MASS_MAX_DIM = 50

_Vec = NDArray[np.float64]


class SurrogateNUTSProposal(Proposal):
    """One NUTS iteration on the surrogate posterior ``π̃``; exact log-q ratio.

    Parameters
    ----------
    posterior : SurrogatePosterior
        The surrogate posterior (its PyTensor graph is NUTS's target): NUTS's dense mass
        matrix starts from its Laplace fit's covariance (above :data:`DENSE_MASS_MAX_DIM`
        dimensions, NUTS runs in coordinates whitened by it), and chains start at its
        mean θ̂.
    n_inner : int
        NUTS iterations per proposal (their composition is reversible too).
    target_accept : float
        NUTS's target acceptance (its step-size adaptation), PyMC's default 0.8.
    max_treedepth : int
        NUTS's largest tree depth.

    Notes
    -----
    ``scale`` is not used (``uses_scale`` is False): NUTS adapts its own step size and
    mass matrix while tuning. ``log π̃`` at the current point travels in the state.

    """

    name: ClassVar[str] = "surrogate_nuts"
    uses_scale: ClassVar[bool] = False
    transitions_per_draw: ClassVar[int] = 9

    def __init__(self, posterior: SurrogatePosterior, *, n_inner: int = 1,
                 target_accept: float = 0.8, max_treedepth: int = 10) -> None:
        if int(n_inner) != n_inner or n_inner < 1:
            raise ValueError(f"n_inner must be an integer ≥ 1, got {n_inner}.")
        self.surrogate = surrogate = posterior.laplace
        self.n_inner = int(n_inner)
        self.centring = centring = posterior.centring
        dim = surrogate.dim
        # NUTS runs on π̃ in the posterior's sampling coordinates: the model's own, or
        # with the group effects that the data fix centred (π̃_φ with its Jacobian).
        if centring is None:
            inner, graph = posterior.flat, posterior.graph
            mean, cov = surrogate.theta_hat, surrogate.cov.copy()
        else:
            inner = centring.phi
            graph = centring.log_density_graph(posterior.graph, posterior.flat)
            mean = centring.to_phi(surrogate.theta_hat)
            cov = centring.covariance(surrogate.theta_hat, surrogate.cov)
        # Up to DENSE_MASS_MAX_DIM: a dense mass matrix, adapted while tuning from the
        # Laplace covariance (on a hierarchical ridge it measured 3 × the effective
        # samples of a diagonal one). Above, PyMC's dense estimate freezes (see
        # DENSE_MASS_MAX_DIM), so NUTS runs in whitened coordinates ψ = L⁻¹(u − mean),
        # L L' the Laplace covariance of the sampling coordinates u, with a diagonal mass
        # matrix adapted there: the Laplace fit's correlations need no estimate.
        self._whiten: tuple[_Vec, _Vec] | None = None
        if dim > DENSE_MASS_MAX_DIM:
            self._whiten = (mean, np.linalg.cholesky(cov))
            # L⁻¹ once: a product per transition instead of a triangular solve (about 90
            # µs through SciPy's wrapper at d = 222, a tenth of that as a product).
            self._chol_inv = scipy.linalg.solve_triangular(self._whiten[1], np.eye(dim),
                                                           lower=True)
        with pm.Model(model=None) as self.model:  # a model of its own, never a submodel
            if self._whiten is None:
                x = pm.Flat("x", shape=(dim,), initval=mean)
                pm.Potential("surrogate", clone_replace(graph, {inner: x}))
            else:
                x = pm.Flat("x", shape=(dim,), initval=np.zeros(dim))
                # graph_replace, not clone_replace: the latter would clone x's own node
                # (a second Flat variable, outside the model).
                u = pt.constant(mean) + pt.dot(pt.constant(self._whiten[1]), x)
                pm.Potential("surrogate", graph_replace(graph, {inner: u}, strict=False))
        potential = (full_adapt_potential(dim, mean, cov, 10) if self._whiten is None
                     else diag_adapt_potential(dim, np.zeros(dim), np.ones(dim), 10))
        # PyMC compiles its log density and gradient with its own default mode (the C
        # backend on PyMC 5); the package's mode for per-step functions (Numba unless an op
        # would run in object mode) measured 1.5 × faster per call on the zoo's crossed
        # model, and no slower to build.
        self.nuts, _ = build_without_object_mode(
            lambda mode: pm.NUTS(vars=[x], model=self.model, target_accept=target_accept,
                                 max_treedepth=max_treedepth, potential=potential, mode=mode),
            default_mode())
        self._adaptation_window = adaptation_window(potential)
        self._log_density = posterior.log_density
        set_step_tuning(self.nuts, False)

    def _to_inner(self, x: _Vec) -> _Vec:
        """NUTS's coordinates of a point in the model's: centred, then whitened."""
        u = x if self.centring is None else self.centring.to_phi(x)
        if self._whiten is None:
            return u
        return self._chol_inv @ (u - self._whiten[0])

    def _to_model(self, v: _Vec) -> _Vec:
        """The model's coordinates of a point in NUTS's (:meth:`_to_inner` inverted)."""
        u = v if self._whiten is None else self._whiten[0] + self._whiten[1] @ v
        return u if self.centring is None else self.centring.to_theta(u)

    def log_density(self, x: _Vec) -> float:
        """``log π̃(x)`` up to a constant (in the model's coordinates)."""
        self.density_evaluations += 1
        return float(self._log_density(x))

    def start_chain(self, rng: np.random.Generator) -> None:
        """A new chain: NUTS's adaptation restarts, its draws from a spawned generator."""
        start_inner_chain(self.nuts, rng.spawn(1)[0])
        # PyMC's reset leaves the mass matrix's adaptation window as the last chain
        # doubled it; restored, the chains in one process (cores=1) adapt as in fresh
        # processes (cores>1), so both give the same draws.
        set_adaptation_window(self.nuts.potential, self._adaptation_window)
        self.nuts.reset_tuning()

    def set_tuning(self, tuning: bool) -> None:
        """Whether NUTS adapts its step size and mass matrix."""
        set_step_tuning(self.nuts, tuning)

    @property
    def step_size(self) -> float:
        """NUTS's (adapted) leapfrog step size."""
        return float(self.nuts.step_size)

    def init(self, x: _Vec) -> ProposalState:
        """The state at ``x`` with ``log π̃(x)``."""
        x = np.asarray(x, dtype=np.float64)
        return ProposalState(x, log_density=self.log_density(x))

    def propose(
        self, rng: np.random.Generator, state: ProposalState, scale: float
    ) -> tuple[ProposalState, ProposalInfo]:
        """One NUTS iteration from ``state.x``; its end and ``log π̃(x) − log π̃(x′)``."""
        new = {"x": self._to_inner(state.x)}
        for _ in range(self.n_inner):
            new, stats = self.nuts.step(new)
            # π̃ at the start (its gradient) and at each leapfrog step of the tree.
            self.density_evaluations += 1 + int(stats[0]["tree_size"])
        x_new = self._to_model(np.array(new["x"], dtype=np.float64))
        lp = state.log_density if state.log_density == state.log_density else self.log_density(
            state.x)
        lp_new = self.log_density(x_new)
        return (ProposalState(x_new, log_density=lp_new),
                ProposalInfo(lp - lp_new, step_size=self.step_size))
