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
    Mean, covariance, Cholesky factor and precision, with validation.
CrankNicolsonProposal
    Preconditioned Crank-Nicolson (autoregressive) moves around θ̂ [1]_; needs no
    gradient.
SurrogateLangevinProposal
    Preconditioned MALA [2]_ with the gradient of a deterministic (data-free) log
    density.
SurrogateHMCProposal
    A few leapfrog steps [3]_ with mass matrix Σ⁻¹ on the same gradient.

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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import scipy.linalg
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "CrankNicolsonProposal",
    "GaussianSurrogate",
    "SurrogateHMCProposal",
    "SurrogateLangevinProposal",
]

#: Relative asymmetry of a covariance matrix tolerated (and then symmetrised).
_SYMMETRY_RTOL = 1e-8


def _check_scale(scale: float, what: str) -> float:
    scale = float(scale)
    if not (scale > 0.0 and math.isfinite(scale)):
        raise ValueError(
            f"{what} (the proposal's `scale`) must be a positive finite number, got {scale}."
        )
    return scale


@dataclass(eq=False, frozen=True)
class GaussianSurrogate:
    r"""A Gaussian approximation ``N(θ̂, Σ)`` of the posterior, with its factors.

    Parameters
    ----------
    theta_hat : array_like, shape (d,)
        Mean (the reference point θ̂ of the Taylor expansion, usually the mode).
    cov : array_like, shape (d, d)
        Covariance Σ, symmetric positive definite (usually the inverse of the negative
        Hessian of the log posterior at θ̂). A relative asymmetry up to 1e-8 is rounding
        and is symmetrised away.

    Attributes
    ----------
    chol : ndarray, shape (d, d)
        Lower Cholesky factor ``L`` with ``L Lᵀ = Σ``.
    precision : ndarray, shape (d, d)
        ``Σ⁻¹``, computed from ``L`` and exactly symmetric.
    dim : int
        ``d``.

    Raises
    ------
    ValueError
        If the shapes do not match, a value is not finite, or Σ is not symmetric positive
        definite; the message says what to do.

    Notes
    -----
    The instance is frozen and its arrays are read-only: build a new one (and new
    proposals) after re-centring.

    ``log_density`` includes ``−log det L`` but not ``−(d/2) log 2π``, so differences of
    it between two points are exact log ratios of the Gaussian densities.

    References
    ----------
    .. [1] Bardenet, R., Doucet, A., Holmes, C. (2017). On Markov chain Monte Carlo
       methods for tall data. JMLR 18(47). (The Laplace fit as a proxy of the posterior.)

    """

    theta_hat: NDArray[np.float64]
    cov: NDArray[np.float64]
    chol: NDArray[np.float64] = field(init=False, repr=False)
    precision: NDArray[np.float64] = field(init=False, repr=False)
    dim: int = field(init=False)
    _half_logdet: float = field(init=False, repr=False)

    def __post_init__(self) -> None:
        mean = np.array(self.theta_hat, dtype=np.float64)
        cov = np.array(self.cov, dtype=np.float64)
        if mean.ndim != 1 or mean.size == 0:
            raise ValueError(
                f"theta_hat must be a non-empty vector (the flattened, transformed "
                f"parameters), got shape {mean.shape}; flatten it first."
            )
        d = mean.shape[0]
        if cov.shape != (d, d):
            raise ValueError(
                f"cov must be a {d}×{d} matrix to match theta_hat of length {d}, got shape "
                f"{cov.shape}; pass a full covariance (np.diag(variances) for a diagonal one)."
            )
        if not np.all(np.isfinite(mean)):
            raise ValueError(
                "theta_hat has non-finite values; the Laplace fit failed (check the model's "
                "log density at the starting point, or pass a reference point)."
            )
        if not np.all(np.isfinite(cov)):
            raise ValueError(
                "cov has non-finite values; the Hessian at theta_hat is probably singular "
                "(an unidentified parameter or a flat direction): add an informative prior "
                "or pass a covariance."
            )
        asym = np.max(np.abs(cov - cov.T))
        if asym > _SYMMETRY_RTOL * max(np.max(np.abs(cov)), np.finfo(float).tiny):
            raise ValueError(
                f"cov is not symmetric (max |cov − covᵀ| = {asym:.3g}); pass a symmetric "
                "matrix, e.g. (cov + cov.T) / 2 if the asymmetry is rounding."
            )
        cov = 0.5 * (cov + cov.T)
        try:
            chol = scipy.linalg.cholesky(cov, lower=True, check_finite=False)
        except np.linalg.LinAlgError as err:
            eig_min = float(np.linalg.eigvalsh(cov)[0])
            raise ValueError(
                f"cov is not positive definite (smallest eigenvalue {eig_min:.3g}); the "
                "Laplace fit is not at a mode or the posterior is flat in some direction. "
                "Check the reference point, add an informative prior, or add a small "
                "multiple of the identity (jitter) to cov."
            ) from err
        if not np.all(np.diag(chol) > 0):
            raise ValueError(
                "cov is numerically singular (a zero pivot in its Cholesky factor); add a "
                "small multiple of the identity (jitter) to cov."
            )
        eye = np.eye(d)
        chol_inv = scipy.linalg.solve_triangular(chol, eye, lower=True, check_finite=False)
        precision = chol_inv.T @ chol_inv
        precision = 0.5 * (precision + precision.T)
        # Frozen, with read-only arrays: the proposals remember whitened points and
        # gradients computed from these factors, which must not change under them.
        for name, value in (
            ("theta_hat", mean),
            ("cov", cov),
            ("chol", chol),
            ("precision", precision),
        ):
            value.flags.writeable = False
            object.__setattr__(self, name, value)
        object.__setattr__(self, "dim", d)
        object.__setattr__(self, "_half_logdet", float(np.sum(np.log(np.diag(chol)))))

    def whiten(self, x: ArrayLike) -> NDArray[np.float64]:
        """``L⁻¹(x − θ̂)`` (a triangular solve, O(d²)); standard normal under the surrogate."""
        return scipy.linalg.solve_triangular(
            self.chol,
            np.asarray(x, dtype=np.float64) - self.theta_hat,
            lower=True,
            check_finite=False,
        )

    def log_density(self, x: ArrayLike) -> float:
        """``log N(x; θ̂, Σ)`` up to the constant ``−(d/2) log 2π``."""
        z = self.whiten(x)
        return -0.5 * float(z @ z) - self._half_logdet

    def grad_log_density(self, x: ArrayLike) -> NDArray[np.float64]:
        """``−Σ⁻¹(x − θ̂)``, the gradient of :meth:`log_density`."""
        return -(self.precision @ (np.asarray(x, dtype=np.float64) - self.theta_hat))


class _PointCache:
    """Values attached to the last two points a proposal saw (input and output).

    A chain calls ``propose`` next on the point it returned (accepted) or on the point it
    was called with (rejected), so two slots catch every step. Keys are copies compared
    with exact equality, so a caller that mutates arrays in place cannot get stale values.
    """

    def __init__(self) -> None:
        self._keys: list[NDArray[np.float64]] = []
        self._values: list[tuple[NDArray[np.float64], ...]] = []

    def get(self, x: NDArray[np.float64]) -> tuple[NDArray[np.float64], ...] | None:
        for key, value in zip(self._keys, self._values, strict=True):
            if key.shape == x.shape and np.array_equal(key, x):
                return value
        return None

    def store(
        self,
        x: NDArray[np.float64],
        x_value: tuple[NDArray[np.float64], ...],
        x_new: NDArray[np.float64],
        new_value: tuple[NDArray[np.float64], ...],
    ) -> None:
        self._keys = [x.copy(), x_new.copy()]
        self._values = [x_value, new_value]

    def clear(self) -> None:
        self._keys = []
        self._values = []


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


class SurrogateLangevinProposal:
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
    autoregression around θ̂ much like :class:`CrankNicolsonProposal`.

    **log-q ratio.** With ``g = ∇log π̃(θ)``, ``g′ = ∇log π̃(θ′)`` and
    ``q(θ′|θ) = N(θ′; θ + (h²/2)Σg, h²Σ)``, the forward residual is
    ``L⁻¹(θ′ − θ − (h²/2)Σg) = hξ`` and the backward one is
    ``L⁻¹(θ − θ′ − (h²/2)Σg′) = −h(ξ + (h/2)Lᵀ(g + g′))`` (using ``L⁻¹Σ = Lᵀ``), so

    .. math::

        \log\frac{q(θ\mid θ')}{q(θ'\mid θ)}
        = \tfrac12\lVert ξ\rVert^2 − \tfrac12\Bigl\lVert ξ + \tfrac h2 L^T(g + g')\Bigr\rVert^2

    (the normalising constants are equal). It costs one gradient and two matrix-vector
    products per call: the gradient at ``x`` is remembered from the previous call when
    ``x`` is the point this proposal last returned or was last given, i.e. on every step
    of a chain. If the gradient at ``θ′`` is not finite the reverse move has no density
    and the ratio is ``−inf`` (a sure rejection); if it is not finite at ``θ`` the
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

    def __init__(
        self,
        grad_log_target: Callable[[NDArray[np.float64]], ArrayLike],
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
        self._step_size = 0.0
        self._cache = _PointCache()
        #: Number of calls of ``grad_log_target`` so far.
        self.n_grad_evals = 0

    def _whitened_grad(self, x: NDArray[np.float64]) -> NDArray[np.float64]:
        """``Lᵀ ∇log π̃(x)`` (shape (d,)), or NaNs if the gradient is not finite."""
        self.n_grad_evals += 1
        g = np.asarray(self.grad_log_target(x), dtype=np.float64)
        if g.shape != (self.surrogate.dim,):
            raise ValueError(
                f"grad_log_target returned shape {g.shape}, expected ({self.surrogate.dim},)."
            )
        return self.surrogate.chol.T @ g

    def propose(
        self, rng: np.random.Generator, x: NDArray[np.float64], scale: float
    ) -> tuple[NDArray[np.float64], float]:
        """Draw ``θ'`` given ``θ = x``; return ``(θ', log q(θ|θ′) − log q(θ′|θ))``.

        Parameters
        ----------
        rng : numpy.random.Generator
            Source of ``ξ`` (``d`` standard normals).
        x : ndarray, shape (d,)
            Current point (flattened, transformed); not modified.
        scale : float
            Step size ``h > 0``.

        Returns
        -------
        x_new : ndarray, shape (d,)
            The proposal (a new array).
        log_q_ratio : float
            See the class notes; ``−inf`` if a gradient is not finite.

        """
        h = _check_scale(scale, "The step size h")
        self._step_size = h
        x = np.asarray(x, dtype=np.float64)
        cached = self._cache.get(x)
        wg = cached[0] if cached is not None else self._whitened_grad(x)
        xi = rng.standard_normal(self.surrogate.dim)
        if not np.all(np.isfinite(wg)):
            self._cache.clear()
            return x.copy(), -math.inf
        # θ' = θ + h L ((h/2) Lᵀg + ξ): one matrix-vector product.
        x_new = x + h * (self.surrogate.chol @ (0.5 * h * wg + xi))
        wg_new = self._whitened_grad(x_new)
        self._cache.store(x, (wg,), x_new, (wg_new,))
        if not np.all(np.isfinite(wg_new)):
            return x_new, -math.inf
        back = xi + 0.5 * h * (wg + wg_new)
        return x_new, 0.5 * float(xi @ xi - back @ back)

    def stats(self) -> dict[str, float]:
        """``{"step_size": h}`` of the last proposal (0.0 before the first)."""
        return {"step_size": self._step_size}

    def clear_cache(self) -> None:
        """Forget remembered gradients (call if ``grad_log_target`` changes)."""
        self._cache.clear()


class SurrogateHMCProposal:
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

    The gradient at the start is remembered from the previous call as for MALA, so a
    proposal costs ``n_steps`` gradients and ``2·n_steps`` matrix-vector products.
    A non-finite gradient along the trajectory stops it and returns ratio ``−inf``.

    References
    ----------
    .. [1] Neal, R. M. (2011). MCMC using Hamiltonian dynamics. In Handbook of Markov
       Chain Monte Carlo, chapter 5. Chapman & Hall/CRC.
    .. [2] Girolami, M., Calderhead, B. (2011). Riemann manifold Langevin and
       Hamiltonian Monte Carlo methods. JRSS B 73(2), 123-214.

    """

    name: ClassVar[str] = "surrogate_hmc"

    def __init__(
        self,
        grad_log_target: Callable[[NDArray[np.float64]], ArrayLike],
        surrogate: GaussianSurrogate,
        n_steps: int = 3,
    ) -> None:
        if not callable(grad_log_target):
            raise TypeError("grad_log_target must be a callable x -> gradient (d,).")
        if not isinstance(surrogate, GaussianSurrogate):
            raise TypeError(
                f"surrogate must be a GaussianSurrogate, got {type(surrogate).__name__}."
            )
        if int(n_steps) != n_steps or n_steps < 1:
            raise ValueError(f"n_steps must be an integer ≥ 1, got {n_steps}.")
        self.grad_log_target = grad_log_target
        self.surrogate = surrogate
        self.n_steps = int(n_steps)
        self._step_size = 0.0
        self._cache = _PointCache()
        #: Number of calls of ``grad_log_target`` so far.
        self.n_grad_evals = 0

    def _whitened_grad(self, x: NDArray[np.float64]) -> NDArray[np.float64]:
        self.n_grad_evals += 1
        g = np.asarray(self.grad_log_target(x), dtype=np.float64)
        if g.shape != (self.surrogate.dim,):
            raise ValueError(
                f"grad_log_target returned shape {g.shape}, expected ({self.surrogate.dim},)."
            )
        return self.surrogate.chol.T @ g

    def propose(
        self, rng: np.random.Generator, x: NDArray[np.float64], scale: float
    ) -> tuple[NDArray[np.float64], float]:
        """Draw ``θ'`` given ``θ = x``; return ``(θ', ½‖u‖² − ½‖u′‖²)``.

        Parameters
        ----------
        rng : numpy.random.Generator
            Source of the whitened momentum ``u`` (``d`` standard normals).
        x : ndarray, shape (d,)
            Current point (flattened, transformed); not modified.
        scale : float
            Leapfrog step size ``ε > 0``.

        Returns
        -------
        x_new : ndarray, shape (d,)
            End of the trajectory (a new array).
        log_q_ratio : float
            Kinetic-energy difference; ``−inf`` if a gradient is not finite.

        """
        eps = _check_scale(scale, "The leapfrog step size")
        self._step_size = eps
        x = np.asarray(x, dtype=np.float64)
        cached = self._cache.get(x)
        wg0 = cached[0] if cached is not None else self._whitened_grad(x)
        u0 = rng.standard_normal(self.surrogate.dim)
        if not np.all(np.isfinite(wg0)):
            self._cache.clear()
            return x.copy(), -math.inf
        chol = self.surrogate.chol
        half = 0.5 * eps
        theta = x.copy()
        wg = wg0
        u = u0 + half * wg
        for i in range(self.n_steps):
            theta += eps * (chol @ u)
            wg = self._whitened_grad(theta)
            if not np.all(np.isfinite(wg)):
                self._cache.clear()
                return theta, -math.inf
            u += (half if i == self.n_steps - 1 else eps) * wg
        self._cache.store(x, (wg0,), theta, (wg,))
        return theta, 0.5 * float(u0 @ u0 - u @ u)

    def stats(self) -> dict[str, float]:
        """``{"step_size": ε}`` of the last proposal (0.0 before the first)."""
        return {"step_size": self._step_size}

    def clear_cache(self) -> None:
        """Forget remembered gradients (call if ``grad_log_target`` changes)."""
        self._cache.clear()
