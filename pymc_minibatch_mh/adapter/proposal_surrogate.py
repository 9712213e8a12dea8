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

which a step adds to the data-free part of Δ. Every proposal here has the interface

- ``propose(rng, x, scale) -> (x_new, log_q_ratio)``,
- ``stats() -> dict[str, float]`` (the tuned parameter in the units users know),
- a class attribute ``name``,

where ``scale`` is a positive float adapted by a tuner during PyMC's tuning phase; each
class says what it means. The log-q ratio is computed from quantities the proposal drew or
evaluated anyway (whitened increments, gradients of a deterministic function that touches
no data), so it is exact, never an estimate, and costs O(d²) per call.

The ratio is in the units of the log posterior (natural log, untempered): a step that
rescales the terms of Δ must treat it like the prior's log ratio, which is also data-free.

Classes
-------
GaussianSurrogate
    Mean, covariance, Cholesky factor and precision, with validation (defined in
    ``pymc_minibatch_mh.adapter.gaussian_surrogate``, re-exported here).
CrankNicolsonProposal
    Preconditioned Crank-Nicolson (autoregressive) moves around θ̂ [1]_; needs no
    gradient.
SurrogateLangevinProposal
    Preconditioned MALA [2]_ with the gradient of a deterministic (data-free) log
    density (defined in ``pymc_minibatch_mh.adapter.proposal_gradient``, re-exported
    here).
SurrogateHMCProposal
    A few leapfrog steps [3]_ with mass matrix Σ⁻¹ on the same gradient (likewise).

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

from pymc_minibatch_mh.adapter.gaussian_surrogate import (
    GaussianSurrogate,
    _check_scale,
    _PointCache,
)
from pymc_minibatch_mh.adapter.proposal_gradient import (
    SurrogateHMCProposal,
    SurrogateLangevinProposal,
)

__all__ = [
    "CrankNicolsonProposal",
    "GaussianSurrogate",
    "SurrogateHMCProposal",
    "SurrogateLangevinProposal",
]


class CrankNicolsonProposal:
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
    draw, and ``z`` is remembered from the previous call when ``x`` is the point this
    proposal last returned or was last given, so a chain step costs one matrix-vector
    product (a triangular solve otherwise).

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

    def __init__(self, surrogate: GaussianSurrogate) -> None:
        if not isinstance(surrogate, GaussianSurrogate):
            raise TypeError(
                f"surrogate must be a GaussianSurrogate, got {type(surrogate).__name__}; "
                "build one with GaussianSurrogate(theta_hat, cov)."
            )
        self.surrogate = surrogate
        self._rho = 0.0
        self._cache = _PointCache()

    def rho(self, scale: float) -> float:
        """The autoregression coefficient ``ρ = √(1 − s²)`` for ``scale`` ``s`` (clamped)."""
        s = min(_check_scale(scale, "scale"), 1.0)
        return math.sqrt(max(0.0, (1.0 - s) * (1.0 + s)))

    def propose(
        self, rng: np.random.Generator, x: NDArray[np.float64], scale: float
    ) -> tuple[NDArray[np.float64], float]:
        """Draw ``θ'`` given ``θ = x``; return ``(θ', log q(θ|θ′) − log q(θ′|θ))``.

        Parameters
        ----------
        rng : numpy.random.Generator
            Source of the innovation ``ξ`` (``d`` standard normals).
        x : ndarray, shape (d,)
            Current point (flattened, transformed); not modified.
        scale : float
            ``√(1 − ρ²)`` in (0, 1]; larger values are clamped to 1.

        Returns
        -------
        x_new : ndarray, shape (d,)
            The proposal (a new array).
        log_q_ratio : float
            ``½‖z′‖² − ½‖z‖²`` (see the class notes).

        """
        s = min(_check_scale(scale, "scale"), 1.0)
        rho = math.sqrt(max(0.0, (1.0 - s) * (1.0 + s)))
        x = np.asarray(x, dtype=np.float64)
        cached = self._cache.get(x)
        z = cached[0] if cached is not None else self.surrogate.whiten(x)
        xi = rng.standard_normal(self.surrogate.dim)
        z_new = rho * z + s * xi
        x_new = self.surrogate.theta_hat + self.surrogate.chol @ z_new
        self._cache.store(x, (z,), x_new, (z_new,))
        self._rho = rho
        return x_new, 0.5 * float(z_new @ z_new - z @ z)

    def stats(self) -> dict[str, float]:
        """``{"rho": ρ}`` of the last proposal (0.0 before the first)."""
        return {"rho": self._rho}

    def clear_cache(self) -> None:
        """Forget the remembered whitened points (call after changing ``surrogate``)."""
        self._cache.clear()
