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
:class:`~pymc_minibatch_mh.proposals.base.Proposal`, where ``scale`` is a positive float
adapted by a tuner during PyMC's tuning phase; each class says what it means. The log-q
ratio is computed from quantities the proposal drew or evaluated anyway (whitened
increments, gradients of a deterministic function that touches no data), so it is exact,
never an estimate, and costs O(d²) per call.

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

__all__ = ["MIN_RHO", "CrankNicolsonProposal"]

#: The default most negative autoregression coefficient of
#: :class:`CrankNicolsonProposal` (its over-relaxed moves; see the class notes).
MIN_RHO: float = -0.5


def _complement(x: float) -> float:
    """``√(1 − x²)``, as ``√((1 − x)(1 + x))`` (accurate near ±1)."""
    return math.sqrt(max(0.0, (1.0 - x) * (1.0 + x)))


class CrankNicolsonProposal(Proposal):
    r"""Preconditioned Crank-Nicolson moves around the surrogate's mean.

    .. math::

        θ' = θ̂ + ρ\,(θ − θ̂) + \sqrt{1 − ρ^2}\; L ξ, \qquad ξ \sim N(0, I),\quad LL^T = Σ.

    Parameters
    ----------
    surrogate : GaussianSurrogate
        The Gaussian approximation ``N(θ̂, Σ)``.
    min_rho : float, optional
        The most negative ρ the tuner may reach, in (−1, 0] (default :data:`MIN_RHO`).

    Notes
    -----
    **scale** indexes how far a move goes. For ``s ≤ 1`` it is ``s = √(1 − ρ²)``, the
    standard deviation of the innovation in units of the surrogate's: ``s → 0`` is a small
    random walk in the Laplace metric (a step of ``s·Lξ`` plus a pull of
    ``(1 − ρ) ≈ s²/2`` towards θ̂), ``s = 1`` (ρ = 0) is the independence sampler with
    proposal ``N(θ̂, Σ)``. Above 1 the move is *over-relaxed* (Neal [3]_): the innovation's
    standard deviation is ``2 − s`` and ``ρ = −√(1 − (2 − s)²) < 0``, so the proposal lands
    on the far side of θ̂ from θ. ρ falls continuously from 1 to ``min_rho`` as ``s`` grows
    from 0 to :attr:`max_scale`, and the mean squared whitened move, ``2 − 2ρ`` per
    coordinate, grows with it. The tuner grows ``s`` while proposals are accepted more
    often than its target, so a good fit ends at ``min_rho``.

    **Why ρ < 0.** Where the posterior is close to the fit, the chain is close to the AR(1)
    process ``z_{t+1} = ρ z_t + √(1 − ρ²) ξ``, whose effective sample size per draw is
    ``(1 − ρ)/(1 + ρ)`` for a linear function of θ (3 at ρ = −0.5: antithetic draws, as
    NUTS's on near-Gaussian posteriors) and ``(1 − ρ²)/(1 + ρ²)`` for a square (0.6 at
    ρ = −0.5, against 1 at ρ = 0): means and quantiles gain, variances lose a little.
    ``min_rho=0`` keeps the independence sampler as the largest move.

    **log-q ratio.** In whitened coordinates ``z = L⁻¹(θ − θ̂)`` the move is the AR(1)
    step ``z' = ρz + uξ`` with innovation ``u = √(1 − ρ²)``, for ρ of either sign, so

    .. math::

        \log\frac{q(θ\mid θ')}{q(θ'\mid θ)}
        = -\frac{\lVert z − ρz'\rVert^2 − \lVert z' − ρz\rVert^2}{2u^2}
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
    .. [3] Neal, R. M. (1998). Suppressing random walks in Markov chain Monte Carlo using
       ordered overrelaxation. In Learning in Graphical Models, 205-228. Kluwer.

    """

    name: ClassVar[str] = "crank_nicolson"
    transitions_per_draw: ClassVar[int] = 3

    def __init__(self, surrogate: GaussianSurrogate, min_rho: float | None = None) -> None:
        if not isinstance(surrogate, GaussianSurrogate):
            raise TypeError(
                f"surrogate must be a GaussianSurrogate, got {type(surrogate).__name__}; "
                "build one with GaussianSurrogate(theta_hat, cov)."
            )
        self.surrogate = surrogate
        self.min_rho = MIN_RHO if min_rho is None else min_rho

    @property
    def min_rho(self) -> float:
        """The most negative ρ, in (−1, 0]; setting it moves :attr:`max_scale`."""
        return self._min_rho

    @min_rho.setter
    def min_rho(self, value: float) -> None:
        value = float(value)
        if not -1.0 < value <= 0.0:
            raise ValueError(
                f"min_rho must be in (-1, 0], got {value}: 0 keeps the independence sampler "
                "as the largest move; -1 would reflect through the mean without noise."
            )
        self._min_rho = value
        self._max_scale = 2.0 - _complement(value)

    @property
    def max_scale(self) -> float:  # type: ignore[override]  # a ClassVar in the base
        """The scale at which ρ reaches :attr:`min_rho` (1 with ``min_rho=0``)."""
        return self._max_scale

    def _clamp(self, scale: float) -> float:
        """``scale`` checked and clamped to :attr:`max_scale`: the scale a move uses."""
        return min(check_scale(scale, "scale"), self._max_scale)

    def coefficients(self, scale: float) -> tuple[float, float]:
        """``(ρ, √(1 − ρ²))`` for ``scale`` (clamped to :attr:`max_scale`); see the notes."""
        return self._coefficients(self._clamp(scale))

    def _coefficients(self, s: float) -> tuple[float, float]:
        """:meth:`coefficients` of a scale already clamped."""
        if s >= self._max_scale:  # min_rho exactly, not through 2 − s's rounding
            return self._min_rho, _complement(self._min_rho)
        innovation = s if s <= 1.0 else 2.0 - s
        rho = _complement(innovation)
        return (rho if s <= 1.0 else -rho), innovation

    def rho(self, scale: float) -> float:
        """The autoregression coefficient ρ for ``scale`` (clamped); see the notes."""
        return self.coefficients(scale)[0]

    def init(self, x: NDArray[np.float64]) -> ProposalState:
        """The state at ``x`` with its whitened coordinates ``z = L⁻¹(x − θ̂)``."""
        x = np.asarray(x, dtype=np.float64)
        return ProposalState(x, whitened=self.surrogate.whiten(x))

    def propose(
        self, rng: np.random.Generator, state: ProposalState, scale: float
    ) -> tuple[ProposalState, ProposalInfo]:
        """``z′ = ρz + √(1 − ρ²)ξ`` in the whitened coordinates ``z = L⁻¹(θ − θ̂)``.

        :meth:`Proposal.propose <pymc_minibatch_mh.proposals.base.Proposal.propose>` with:
        ``ξ`` the ``d`` standard normals drawn from ``rng``; ``z`` carried by ``state``
        (see :meth:`init`) and ``z′`` by the new state; ``scale`` positive, ``√(1 − ρ²)``
        up to 1 and an over-relaxed move above (see the class notes), clamped to
        :attr:`max_scale`; the info's log-q ratio ``½‖z′‖² − ½‖z‖²`` (see the class
        notes), with the scale used and ρ.
        """
        scale = self._clamp(scale)
        rho, innovation = self._coefficients(scale)
        z = state.whitened
        if z is None:
            z = self.surrogate.whiten(state.x)
        xi = rng.standard_normal(self.surrogate.dim)
        z_new = rho * z + innovation * xi
        x_new = self.surrogate.theta_hat + self.surrogate.chol @ z_new
        ratio = 0.5 * float(z_new @ z_new - z @ z)
        return ProposalState(x_new, whitened=z_new), ProposalInfo(ratio, scale=scale, rho=rho)
