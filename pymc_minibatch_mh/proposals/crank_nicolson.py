r"""Proposals that use a Gaussian surrogate of the posterior (the Laplace fit).

With ``control_variate="taylor"`` a step already holds a Gaussian approximation
``N(θ̂, Σ)`` of the posterior on the flattened, transformed parameter vector: θ̂ is the
reference point of the Taylor expansion and Σ the inverse of the negative Hessian of the
log posterior there (see Bardenet et al. [4]_ on such approximations for tall data). The
proposals of this module use it to propose moves that fit the posterior's scale and
correlations, and report the exact log ratio of proposal densities
that the Metropolis-Hastings test needs,

.. math::

    \log\frac{q(θ \mid θ')}{q(θ' \mid θ)},

which a step adds to the data-free part of Δ. Every proposal here implements
:class:`~pymc_minibatch_mh.proposals.base.Proposal`, where ``scale`` is a positive float adapted by a tuner during PyMC's tuning phase; each
class says what it means. The log-q ratio is computed from quantities the proposal drew or
evaluated anyway (whitened increments, gradients of a deterministic function that touches
no data), so it is exact, never an estimate, and costs O(d²) per call.

The ratio is in the units of the log posterior (natural log, untempered): a step that
rescales the terms of Δ must treat it like the prior's log ratio, which is also data-free.

Classes
-------
CrankNicolsonProposal
    Preconditioned Crank-Nicolson (autoregressive) moves around θ̂ [1]_; needs no
    gradient. (MALA [2]_ and a few leapfrog steps [3]_ on the surrogate posterior's
    gradient are in :mod:`pymc_minibatch_mh.proposals.gradient`.)

References
----------
.. [1] Cotter, S. L., Roberts, G. O., Stuart, A. M., White, D. (2013). MCMC methods for
   functions: modifying old algorithms to make them faster. Statistical Science 28(3),
   424-446.
.. [2] Roberts, G. O., Tweedie, R. L. (1996). Exponential convergence of Langevin
   distributions and their discrete approximations. Bernoulli 2(4), 341-363.
.. [3] Neal, R. M. (2011). MCMC using Hamiltonian dynamics. In Handbook of Markov Chain
   Monte Carlo, chapter 5. Chapman & Hall/CRC.
.. [4] Bardenet, R., Doucet, A., Holmes, C. (2017). On Markov chain Monte Carlo methods
   for tall data. JMLR 18(47).
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from pymc_minibatch_mh.proposals.base import (
    Proposal,
    ProposalInfo,
    ProposalState,
    check_scale,
)
from pymc_minibatch_mh.proposals.surrogate import GaussianSurrogate

__all__ = ["CrankNicolsonProposal"]


class CrankNicolsonProposal(Proposal):
    r"""Preconditioned Crank-Nicolson moves around the surrogate's mean.

    .. math::

        θ' = θ̂ + ρ\,(θ − θ̂) + \sqrt{1 − ρ^2}\; L ξ, \qquad ξ \sim N(0, I),\quad LL^T = Σ.

    Parameters
    ----------
    surrogate : GaussianSurrogate
        The Gaussian approximation ``N(θ̂, Σ)``.

    Notes
    -----
    **scale** is ``s = √(1 − ρ²)``, the standard deviation of the innovation in units of
    the surrogate's: ``s → 0`` is a small random walk in the Laplace metric (a step of
    ``s·Lξ`` plus a pull of ``(1 − ρ) ≈ s²/2`` towards θ̂), ``s = 1`` (ρ = 0) is the
    independence sampler with proposal ``N(θ̂, Σ)``. A ``scale`` of 1 or more is clamped
    to 1; a tuner that keeps growing it means the independence sampler is accepted more
    often than its target rate.

    **log-q ratio.** In whitened coordinates ``z = L⁻¹(θ − θ̂)`` the move is the AR(1)
    step ``z' = ρz + sξ``, so with ``s² = 1 − ρ²``

    .. math::

        \log\frac{q(θ\mid θ')}{q(θ'\mid θ)}
        = -\frac{\lVert z − ρz'\rVert^2 − \lVert z' − ρz\rVert^2}{2s^2}
        = -\frac{(1−ρ^2)(\lVert z\rVert^2 − \lVert z'\rVert^2)}{2(1 − ρ^2)}
        = \tfrac12\lVert z'\rVert^2 − \tfrac12\lVert z\rVert^2,

    which is ``log N(θ; θ̂, Σ) − log N(θ'; θ̂, Σ)`` (the kernel is reversible with respect
    to the surrogate; the Jacobians of the linear map cancel). ``z'`` is built from the
    draw, and ``z`` travels in the state (``ProposalState.whitened``), so a chain
    step costs one matrix-vector product (a triangular solve when a state is built).

    The acceptance ratio ``π(θ')/π(θ) · q(θ|θ')/q(θ'|θ)`` is then
    ``(π/N)(θ') / (π/N)(θ)``: the closer the posterior is to the surrogate, the higher the
    acceptance at every ρ.

    References
    ----------
    .. [1] Cotter, S. L., Roberts, G. O., Stuart, A. M., White, D. (2013). MCMC methods
       for functions: modifying old algorithms to make them faster. Statistical Science
       28(3), 424-446.
    .. [2] Neal, R. M. (1999). Regression and classification using Gaussian process
       priors. Bayesian Statistics 6, 475-501.

    """

    name: ClassVar[str] = "crank_nicolson"
    max_scale: ClassVar[float] = 1.0
    transitions_per_draw: ClassVar[int] = 3

    def __init__(self, surrogate: GaussianSurrogate) -> None:
        if not isinstance(surrogate, GaussianSurrogate):
            raise TypeError(
                f"surrogate must be a GaussianSurrogate, got {type(surrogate).__name__}; "
                "build one with GaussianSurrogate(theta_hat, cov)."
            )
        self.surrogate = surrogate

    def rho(self, scale: float) -> float:
        """The autoregression coefficient ``ρ = √(1 − s²)`` for ``scale`` ``s`` (clamped)."""
        s = min(check_scale(scale, "scale"), 1.0)
        return math.sqrt(max(0.0, (1.0 - s) * (1.0 + s)))

    def init(self, x: NDArray[np.float64]) -> ProposalState:
        """The state at ``x`` with its whitened coordinates ``z = L⁻¹(x − θ̂)``."""
        x = np.asarray(x, dtype=np.float64)
        return ProposalState(x, whitened=self.surrogate.whiten(x))

    def propose(
        self, rng: np.random.Generator, state: ProposalState, scale: float
    ) -> tuple[ProposalState, ProposalInfo]:
        """Draw ``θ'`` given ``θ = state.x``; return its state and the log-q ratio.

        Parameters
        ----------
        rng : numpy.random.Generator
            Source of the innovation ``ξ`` (``d`` standard normals).
        state : ProposalState
            The current point and its whitened coordinates (see :meth:`init`).
        scale : float
            ``√(1 − ρ²)`` in (0, 1]; larger values are clamped to 1.

        Returns
        -------
        state : ProposalState
            The proposal θ′ (a new array) and its whitened coordinates.
        info : ProposalInfo
            The log-q ratio ``½‖z′‖² − ½‖z‖²`` (see the class notes), the scale used and ρ.

        """
        s = min(check_scale(scale, "scale"), 1.0)
        rho = math.sqrt(max(0.0, (1.0 - s) * (1.0 + s)))
        z = state.whitened
        if z is None:
            z = self.surrogate.whiten(state.x)
        xi = rng.standard_normal(self.surrogate.dim)
        z_new = rho * z + s * xi
        x_new = self.surrogate.theta_hat + self.surrogate.chol @ z_new
        ratio = 0.5 * float(z_new @ z_new - z @ z)
        return ProposalState(x_new, whitened=z_new), ProposalInfo(ratio, scale=s, rho=rho)
