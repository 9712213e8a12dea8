r"""Surrogate-preconditioned proposals driven by a gradient: MALA and a few leapfrog steps.

Both precondition with the Gaussian surrogate ``N(θ̂, Σ)`` (see
:mod:`pymc_minibatch_mh.proposals.surrogate`) and follow the gradient of a
deterministic, data-free log density π̃; both report an exact log-q ratio and have the
interface :class:`~pymc_minibatch_mh.proposals.base.Proposal`. They share one base class
for what is the same in both: the checks of their arguments, the whitened gradient
``Lᵀ∇log π̃`` carried in the state (``ProposalState.gradient``), the count of gradient
calls and the check of ``scale``. :func:`langevin_log_q_ratio` is the one home of the
Langevin ratio (the minibatch-gradient SGLD proposal uses it too).

Classes
-------
SurrogateLangevinProposal
    Preconditioned MALA [1]_ with the gradient of a deterministic (data-free) log density.
SurrogateHMCProposal
    A few leapfrog steps [2]_ with mass matrix Σ⁻¹ on the same gradient.

References
----------
.. [1] Roberts, G. O., Tweedie, R. L. (1996). Exponential convergence of Langevin
   distributions and their discrete approximations. Bernoulli 2(4), 341-363.
.. [2] Neal, R. M. (2011). MCMC using Hamiltonian dynamics. In Handbook of Markov Chain
   Monte Carlo, chapter 5. Chapman & Hall/CRC.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import ClassVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from pymc_minibatch_mh.proposals.base import (
    Proposal,
    ProposalInfo,
    ProposalState,
    check_scale,
)
from pymc_minibatch_mh.proposals.surrogate import GaussianSurrogate

__all__ = ["SurrogateHMCProposal", "SurrogateLangevinProposal", "langevin_log_q_ratio"]

_Vec = NDArray[np.float64]


def langevin_log_q_ratio(xi: _Vec, h: float, g: _Vec, g_new: _Vec) -> float:
    r"""``log q(θ | θ′) − log q(θ′ | θ)`` of a Langevin move ``θ′ = θ + h M((h/2) g + ξ)``.

    With whitened noise ξ and (whitened) gradients ``g`` at θ and ``g′`` at θ′ the
    backward residual is ``−h(ξ + (h/2)(g + g′))``, so the ratio is
    ``½‖ξ‖² − ½‖ξ + (h/2)(g + g′)‖²`` (the normalising constants are equal).
    """
    back = xi + 0.5 * h * (g + g_new)
    return 0.5 * float(xi @ xi - back @ back)


class _WhitenedGradientProposal(Proposal):
    """What MALA and HMC share: ``Lᵀ∇log π̃`` carried in the state, and more.

    ``propose`` checks ``scale``, takes ``Lᵀ∇log π̃(x)`` from the state (or computes it),
    draws ``d`` standard normals and, if that gradient is finite, hands over to ``_move``.
    A subclass sets ``name`` and ``_scale_label`` (what an invalid ``scale`` is called in
    the error message) and implements ``_move``.
    """

    _scale_label: ClassVar[str]
    transitions_per_draw: ClassVar[int] = 3

    def __init__(
        self,
        grad_log_target: Callable[[_Vec], ArrayLike],
        surrogate: GaussianSurrogate,
    ) -> None:
        if not callable(grad_log_target):
            raise TypeError("grad_log_target must be a callable x -> gradient (d,).")
        if not isinstance(surrogate, GaussianSurrogate):
            raise TypeError(
                f"surrogate must be a GaussianSurrogate, got {type(surrogate).__name__}."
            )
        self.grad_log_target = grad_log_target
        self.surrogate = surrogate

    def _whitened_grad(self, x: _Vec) -> _Vec:
        """``Lᵀ ∇log π̃(x)`` (shape (d,)), or NaNs if the gradient is not finite."""
        self.density_evaluations += 1
        g = np.asarray(self.grad_log_target(x), dtype=np.float64)
        if g.shape != (self.surrogate.dim,):
            raise ValueError(
                f"grad_log_target returned shape {g.shape}, expected ({self.surrogate.dim},)."
            )
        return self.surrogate.chol.T @ g

    def init(self, x: _Vec) -> ProposalState:
        """The state at ``x`` with its whitened gradient ``Lᵀ∇log π̃(x)``."""
        x = np.asarray(x, dtype=np.float64)
        return ProposalState(x, gradient=self._whitened_grad(x))

    def propose(
        self, rng: np.random.Generator, state: ProposalState, scale: float
    ) -> tuple[ProposalState, ProposalInfo]:
        """A MALA move or an HMC trajectory from ``θ = state.x``, and its log ratio.

        :meth:`Proposal.propose <pymc_minibatch_mh.proposals.base.Proposal.propose>` with:
        ``d`` standard normals drawn from ``rng`` (the noise ``ξ`` of MALA, the whitened
        momentum ``u`` of HMC); the whitened gradient carried by ``state`` (see
        :meth:`init`) and by the new state (for HMC, at the end of the trajectory);
        ``scale`` the step size, ``h > 0`` for MALA and the leapfrog step size ``ε > 0``
        for HMC; the info's ratio ``log q(θ|θ′) − log q(θ′|θ)`` for MALA and the
        kinetic-energy difference ``½‖u‖² − ½‖u′‖²`` for HMC (see the class notes),
        ``−inf`` if a gradient is not finite (then, if it is the one at ``x``, the
        proposal is a copy of ``x``).
        """
        step = check_scale(scale, self._scale_label)
        x = state.x
        wg = state.gradient if state.gradient is not None else self._whitened_grad(x)
        draw = rng.standard_normal(self.surrogate.dim)
        if not np.all(np.isfinite(wg)):
            return ProposalState(x.copy()), ProposalInfo(-math.inf, step, step_size=step)
        x_new, wg_new, ratio = self._move(x, step, wg, draw)
        return ProposalState(x_new, gradient=wg_new), ProposalInfo(ratio, step, step_size=step)

    def _move(self, x: _Vec, step: float, wg: _Vec, draw: _Vec) -> tuple[_Vec, _Vec, float]:
        """``(θ′, Lᵀ∇log π̃(θ′), ratio)`` from ``x``, ``scale``, ``Lᵀ∇log π̃(x)`` and normals."""
        raise NotImplementedError


class SurrogateLangevinProposal(_WhitenedGradientProposal):
    r"""Preconditioned Metropolis-adjusted Langevin proposal (MALA) with metric Σ.

    .. math::

        θ' = θ + \tfrac{h^2}{2}\, Σ\, ∇\log\tilde π(θ) + h\, L ξ,
        \qquad ξ \sim N(0, I),\quad LL^T = Σ.

    Parameters
    ----------
    grad_log_target : callable
        ``grad_log_target(x) -> ndarray (d,)``, the gradient of a log density π̃ that
        drives the drift. It must be **deterministic** (the same value every time it is
        called at the same point) and must not depend on the minibatch: the log-q ratio
        uses its value at both points and is exact only then. In the package it is the
        Taylor surrogate's gradient ``G + H(θ − θ̂)`` plus the prior's exact gradient.
        π̃ need not be the target; a poor π̃ only lowers the acceptance rate.
    surrogate : GaussianSurrogate
        Supplies the preconditioner Σ and its Cholesky factor ``L``.

    Notes
    -----
    **scale** is the step size ``h`` in units of the surrogate's standard deviations: the
    noise is ``h·Lξ``. As ``d → ∞`` the optimal ``h`` shrinks like ``d^{-1/3}`` with an
    acceptance rate of about 0.574 [2]_; with the gradient of the Gaussian surrogate
    itself the drift is ``−(h²/2)(θ − θ̂)`` and the move is an over-dispersed
    autoregression around θ̂ much like
    :class:`~pymc_minibatch_mh.proposals.crank_nicolson.CrankNicolsonProposal`.

    **log-q ratio.** With ``g = ∇log π̃(θ)``, ``g′ = ∇log π̃(θ′)`` and
    ``q(θ′|θ) = N(θ′; θ + (h²/2)Σg, h²Σ)``, the forward residual is
    ``L⁻¹(θ′ − θ − (h²/2)Σg) = hξ`` and the backward one is
    ``L⁻¹(θ − θ′ − (h²/2)Σg′) = −h(ξ + (h/2)Lᵀ(g + g′))`` (using ``L⁻¹Σ = Lᵀ``), so

    .. math::

        \log\frac{q(θ\mid θ')}{q(θ'\mid θ)}
        = \tfrac12\lVert ξ\rVert^2 − \tfrac12\Bigl\lVert ξ + \tfrac h2 L^T(g + g')\Bigr\rVert^2

    (the normalising constants are equal). It costs one gradient and two matrix-vector
    products per call: the gradient at ``x`` travels in the state, so a chain step
    computes only the one at θ′. If the gradient at ``θ′`` is not finite the reverse move has no
    density and the ratio is ``−inf`` (a sure rejection); if it is not finite at ``θ`` the
    proposal is ``θ`` itself with ratio ``−inf``.

    References
    ----------
    .. [1] Roberts, G. O., Tweedie, R. L. (1996). Exponential convergence of Langevin
       distributions and their discrete approximations. Bernoulli 2(4), 341-363.
    .. [2] Roberts, G. O., Rosenthal, J. S. (1998). Optimal scaling of discrete
       approximations to Langevin diffusions. JRSS B 60(1), 255-268.
    .. [3] Girolami, M., Calderhead, B. (2011). Riemann manifold Langevin and
       Hamiltonian Monte Carlo methods. JRSS B 73(2), 123-214.

    """

    name: ClassVar[str] = "surrogate_mala"
    _scale_label: ClassVar[str] = "The step size h"

    def _move(self, x: _Vec, step: float, wg: _Vec, draw: _Vec) -> tuple[_Vec, _Vec, float]:
        """One Langevin step; ``draw`` is ``ξ``."""
        h, xi = step, draw
        # θ' = θ + h L ((h/2) Lᵀg + ξ): one matrix-vector product.
        x_new = x + h * (self.surrogate.chol @ (0.5 * h * wg + xi))
        wg_new = self._whitened_grad(x_new)
        if not np.all(np.isfinite(wg_new)):
            return x_new, wg_new, -math.inf
        return x_new, wg_new, langevin_log_q_ratio(xi, h, wg, wg_new)


class SurrogateHMCProposal(_WhitenedGradientProposal):
    r"""A few leapfrog steps of Hamiltonian dynamics with mass matrix Σ⁻¹.

    Draws a momentum ``p ~ N(0, Σ⁻¹)``, runs ``n_steps`` leapfrog steps of size ``ε`` on
    the potential ``−log π̃`` and kinetic energy ``K(p) = ½ pᵀΣp``, and proposes the end
    point.

    Parameters
    ----------
    grad_log_target : callable
        ``grad_log_target(x) -> ndarray (d,)``; the same contract as for
        :class:`SurrogateLangevinProposal` (deterministic, data-free).
    surrogate : GaussianSurrogate
        Supplies the mass matrix ``Σ⁻¹`` through ``L`` (``LLᵀ = Σ``).
    n_steps : int
        Number of leapfrog steps (fixed, ≥ 1). ``n_steps = 1`` is exactly
        :class:`SurrogateLangevinProposal` with ``h = ε`` (same proposal, same ratio).

    Notes
    -----
    **scale** is the leapfrog step size ``ε`` in units of the surrogate's standard
    deviations; on a target equal to the surrogate the dynamics rotate each whitened
    coordinate by about ``ε`` radians per step, so ``n_steps·ε ≈ π/2`` gives nearly
    independent proposals.

    **log-q ratio.** Write ``u = Lᵀp ~ N(0, I)``, so ``K = ½‖u‖²``, and a leapfrog step is
    ``u ← u + (ε/2)Lᵀg; θ ← θ + εLu; u ← u + (ε/2)Lᵀg``. The map
    ``(θ, u) → (θ′, −u′)`` is a volume-preserving involution, so Metropolis-Hastings on
    the extended target ``π(θ)N(u; 0, I)`` accepts with ratio
    ``π(θ′)/π(θ) · exp(½‖u‖² − ½‖u′‖²)``; the returned "log-q ratio" is therefore the
    kinetic-energy difference ``½‖u‖² − ½‖u′‖²`` and enters Δ like any other. It is *not*
    a ratio of densities on θ alone (for ``n_steps > 1`` those have no closed form) but
    gives the same, exact, chain on θ [1]_. The potential part of the Hamiltonian is the
    real target's, evaluated by the step as usual; π̃ only steers the trajectory.

    The gradient at the start travels in the state as for MALA, so a proposal costs ``n_steps``
    gradients and ``2·n_steps`` matrix-vector products.
    A non-finite gradient along the trajectory stops it and returns ratio ``−inf``.

    References
    ----------
    .. [1] Neal, R. M. (2011). MCMC using Hamiltonian dynamics. In Handbook of Markov
       Chain Monte Carlo, chapter 5. Chapman & Hall/CRC.
    .. [2] Girolami, M., Calderhead, B. (2011). Riemann manifold Langevin and
       Hamiltonian Monte Carlo methods. JRSS B 73(2), 123-214.

    """

    name: ClassVar[str] = "surrogate_hmc"
    _scale_label: ClassVar[str] = "The leapfrog step size"

    def __init__(
        self,
        grad_log_target: Callable[[_Vec], ArrayLike],
        surrogate: GaussianSurrogate,
        n_steps: int = 3,
    ) -> None:
        super().__init__(grad_log_target, surrogate)
        if int(n_steps) != n_steps or n_steps < 1:
            raise ValueError(f"n_steps must be an integer ≥ 1, got {n_steps}.")
        self.n_steps = int(n_steps)

    def _move(self, x: _Vec, step: float, wg: _Vec, draw: _Vec) -> tuple[_Vec, _Vec, float]:
        """``n_steps`` leapfrog steps; ``draw`` is the whitened momentum ``u``."""
        eps, u0 = step, draw
        chol = self.surrogate.chol
        half = 0.5 * eps
        theta = x.copy()
        u = u0 + half * wg
        for i in range(self.n_steps):
            theta += eps * (chol @ u)
            wg = self._whitened_grad(theta)
            if not np.all(np.isfinite(wg)):
                return theta, wg, -math.inf
            u += (half if i == self.n_steps - 1 else eps) * wg
        return theta, wg, 0.5 * float(u0 @ u0 - u @ u)
