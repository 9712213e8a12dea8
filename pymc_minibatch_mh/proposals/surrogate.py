r"""The Gaussian surrogate ``N(θ̂, Σ)`` of the posterior, and helpers its proposals share.

The surrogate is the Laplace fit that a step with ``control_variate="taylor"`` already
holds: θ̂ is the reference point of the Taylor expansion and Σ the inverse of the negative
Hessian of the log posterior there (a proxy of the posterior for tall data [1]_). The
proposals of
:mod:`pymc_minibatch_mh.proposals.crank_nicolson` (Crank-Nicolson) and
:mod:`pymc_minibatch_mh.proposals.gradient` (MALA, HMC) precondition with it; those that
follow the gradient of the surrogate *posterior* π̃ (the prior times the closed-form sum of
the control variates' expansions; no data) get it as a :class:`SurrogatePosterior`.

Classes
-------
GaussianSurrogate
    Mean, covariance, Cholesky factor and precision, with validation.
SurrogatePosterior
    The data-free surrogate posterior π̃: its log density, gradient and PyTensor graph,
    and its Laplace fit.
Centring
    Coordinates in which chosen group effects are centred, for kernels run on π̃.

References
----------
.. [1] Bardenet, R., Doucet, A., Holmes, C. (2017). On Markov chain Monte Carlo methods
   for tall data. JMLR 18(47).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytensor
import pytensor.tensor as pt
import scipy.linalg
import scipy.stats
from numpy.typing import ArrayLike, NDArray
from scipy.optimize import approx_fprime

from pymc_minibatch_mh.model.compat import default_mode
from pymc_minibatch_mh.model.compilation import compile_function
from pymc_minibatch_mh.model.graph import clone_replace
from pymc_minibatch_mh.model.internals import direct_call

__all__ = [
    "LAPLACE_CHECK_DRAWS",
    "LAPLACE_CHECK_SEED",
    "Centring",
    "GaussianSurrogate",
    "SurrogatePosterior",
]

#: Relative asymmetry of a covariance matrix tolerated (and then symmetrised).
_SYMMETRY_RTOL = 1e-8

#: Draws of the Laplace fit with which :meth:`SurrogatePosterior.laplace_mismatch`
#: measures how close π̃ is to it.
LAPLACE_CHECK_DRAWS: int = 256

#: Their seed: set-up randomness, the same for every chain (the chains' own generators are
#: not touched).
LAPLACE_CHECK_SEED: int = 20170830


@dataclass(eq=False, frozen=True)
class GaussianSurrogate:
    r"""A Gaussian approximation ``N(θ̂, Σ)`` of the posterior, with its factors.

    Parameters
    ----------
    theta_hat : array_like, shape (d,)
        Mean (the mode of the surrogate posterior's quadratic part, see ``reference``).
    cov : array_like, shape (d, d)
        Covariance Σ, symmetric positive definite (usually the inverse of the negative
        Hessian of the log posterior at θ̂). A relative asymmetry up to 1e-8 is rounding
        and is symmetrised away.
    reference : array_like, shape (d,), optional
        The point the fit was computed at: the control variates' θ̂, where the step's
        set-up read every row (a full pass), so that tuned chains start there
        (:meth:`~pymc_minibatch_mh.proposals.base.Proposal.start_point`) without a pass
        of their own. Default: ``theta_hat``. It differs from the mean when θ̂ is not
        the mode (the mean is then one Newton step from it).

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
    reference: NDArray[np.float64] | None = None
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
        reference = (mean.copy() if self.reference is None
                     else np.array(self.reference, dtype=np.float64))
        if reference.shape != (d,) or not np.all(np.isfinite(reference)):
            raise ValueError(
                f"reference must be a finite vector of length {d}, like theta_hat; got "
                f"shape {reference.shape}."
            )
        eye = np.eye(d)
        chol_inv = scipy.linalg.solve_triangular(chol, eye, lower=True, check_finite=False)
        precision = chol_inv.T @ chol_inv
        precision = 0.5 * (precision + precision.T)
        # Frozen, with read-only arrays: the proposals remember whitened points and
        # gradients computed from these factors, which must not change under them.
        for name, value in (
            ("theta_hat", mean),
            ("reference", reference),
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


@dataclass(eq=False, frozen=True)
class SurrogatePosterior:
    r"""The surrogate posterior π̃ of a step with control variates (data-free).

    ``log π̃(θ) = log p0(θ) + proxy(θ) / K``: the prior (with Jacobians and Potentials)
    plus the closed-form full-data sum of the control variates' expansions at the step's
    temperature K. Built once by the step (the one place that joins the control variates,
    the likelihood and the temperature) and handed to the proposals that need it.

    Attributes
    ----------
    laplace : GaussianSurrogate
        The Laplace fit ``N(θ̂, Σ)`` at the step's temperature.
    log_density : callable
        ``x -> log π̃(x)`` (up to a constant).
    gradient : callable
        ``x -> ∇log π̃(x)``.
    flat : TensorVariable
        The flat-state input of ``graph``.
    graph : TensorVariable
        ``log π̃`` as a PyTensor graph of ``flat`` (for NUTS on π̃).
    log_ratio : callable
        ``(x, x′) -> log π̃(x′) − log π̃(x)`` from the control variates' per-step
        function, which every step compiles: :meth:`laplace_mismatch` needs no other
        (``log_density``'s prior part is a function of its own).
    centring : Centring or None
        Coordinates for kernels run on π̃ in which the group effects that the data fix
        are centred (None: the model's own coordinates).

    Notes
    -----
    The prior part reads the current values of variables that other steps of a compound
    step sample: the step gives its proposal a fresh state whenever they change.
    """

    laplace: GaussianSurrogate
    log_density: Callable[[NDArray[np.float64]], float]
    gradient: Callable[[NDArray[np.float64]], NDArray[np.float64]]
    flat: Any
    graph: Any
    log_ratio: Callable[[NDArray[np.float64], NDArray[np.float64]], float]
    centring: Centring | None = None

    def laplace_mismatch(self) -> float:
        r"""How far π̃ is from its Laplace fit: the spread of the log density ratio.

        The spread of ``log π̃(x) − log N(x; θ̂, Σ)`` over :data:`LAPLACE_CHECK_DRAWS` draws
        of ``N(θ̂, Σ)``, as a standard deviation from the interquartile range (SciPy's
        ``iqr(..., scale="normal")``): 0 when π̃ is the Gaussian up to its constant,
        ``inf`` when π̃ is not finite at a draw. Those are the log weights of importance
        sampling π̃ from the fit. The interquartile range, not the standard deviation:
        a few draws far in the tails moved the standard deviation by half from one set of
        draws to the next on the real-data zoo, and the bulk is what Crank–Nicolson moves
        around the fit explore. Where every per-row quantity is affine in θ the
        closed-form sum of the expansions is quadratic, so only a non-Gaussian prior
        spreads it: a group scale that the data leave uncertain, whose effects the prior
        pulls together. The draws come from a generator of fixed seed
        (:data:`LAPLACE_CHECK_SEED`): the same value in every chain and run.
        """
        lap = self.laplace
        z = np.random.default_rng(LAPLACE_CHECK_SEED).standard_normal(
            (LAPLACE_CHECK_DRAWS, lap.dim))
        # Both log densities up to constants, which the spread does not see: log π̃ from
        # θ̂, and the fit's −|z|²/2 of the standard normals the draws were made from.
        with np.errstate(all="ignore"):
            log_ratio = np.array([self.log_ratio(lap.theta_hat, x) for x in
                                  lap.theta_hat + z @ lap.chol.T]) + 0.5 * np.sum(z * z, axis=1)
        if not np.isfinite(log_ratio).all():
            return float("inf")
        return float(scipy.stats.iqr(log_ratio, scale="normal"))


class Centring:
    r"""Coordinates φ = T(θ) in which chosen group effects are centred.

    A model written non-centred, ``c_j = a(θ) + s(θ) z_j`` (``mu + tau * z[group]``), has
    a narrow curved ridge in ``(log τ, z_j)`` wherever the data fix the effect ``c_j``
    far better than the prior does: a large group. NUTS on that ridge needs tiny steps
    and deep trees. In φ the chosen ``z_j`` are replaced by ``u_j = a + s z_j``, the
    effects themselves, which the data make nearly Gaussian, and the rest of θ is kept.

    ``a`` and ``s`` are computed from the coefficient's graph with the chosen coordinates
    set to 0 and to 1, so they depend on the other coordinates only: T is a bijection
    whatever the graph (exactly affine or not) with the inverse
    ``z_j = (u_j − a) / s`` and ``log |det ∂θ/∂φ| = −Σ log |s_j|``. A kernel reversible
    with respect to ``π̃_φ(φ) = π̃(T⁻¹φ) |det ∂θ/∂φ|`` is, carried back by ``T⁻¹``,
    reversible with respect to π̃, so a proposal made that way keeps the exact ratio
    ``log π̃(θ) − log π̃(θ′)`` in the model's coordinates.

    Parameters
    ----------
    flat : TensorVariable
        The flat-state vector that ``coef`` is a graph of.
    positions : array_like of int, shape (R,)
        The flat positions of the chosen coordinates ``z_j``.
    coef : TensorVariable, shape (R,)
        The effects ``c_j`` as a graph of ``flat``, in the order of ``positions``.

    Attributes
    ----------
    phi : TensorVariable
        The input vector (φ) of :meth:`log_density_graph`.
    forward_graph : TensorVariable
        ``T(θ)`` as a graph of ``flat``.
    positions : numpy.ndarray
        As given.

    """

    def __init__(self, flat: Any, positions: ArrayLike, coef: Any) -> None:
        idx = np.asarray(positions, dtype=np.int64)
        if idx.ndim != 1 or idx.size == 0 or np.unique(idx).size != idx.size:
            raise ValueError(f"positions must be distinct flat positions, got {idx}.")
        self.positions = idx
        # The positions as a shared variable, not a constant: PyTensor's Numba cache keys
        # a function by its constants, and which effects are centred depends on the data.
        idx = pytensor.shared(idx, name="centred_positions")
        # a and s of the other coordinates only: the chosen ones replaced by constants.
        other = flat.type("other")
        a = clone_replace(coef, {flat: pt.set_subtensor(other[idx], 0.0)})
        s1 = clone_replace(coef, {flat: pt.set_subtensor(other[idx], 1.0)})
        s = s1 - a
        self.phi = phi = flat.type("phi")
        a_phi, s_phi = clone_replace([a, s], {other: phi})
        self._theta = pt.set_subtensor(phi[idx], (phi[idx] - a_phi) / s_phi)
        self._log_jacobian = -pt.sum(pt.log(pt.abs(s_phi)))
        a_x, s_x = clone_replace([a, s], {other: flat})
        self.forward_graph = forward = pt.set_subtensor(flat[idx], a_x + s_x * flat[idx])
        # T and T⁻¹ run at every transition (a kernel on π̃_φ starts and ends in θ):
        # compiled like the per-step functions. In FAST_COMPILE (PyTensor's Python VM)
        # they took 0.25 ms a call, a fifth of the sampling time on the zoo's crossed
        # model at N = 3·10⁴.
        mode = default_mode()
        self._to_phi, _ = compile_function([flat], forward, mode)
        # Called directly (about 10 µs less a call than PyTensor's wrapper; direct_call).
        self._from_phi = direct_call(
            compile_function([phi], [self._theta, self._log_jacobian], mode)[0])

    def to_phi(self, x: ArrayLike) -> NDArray[np.float64]:
        """``T(θ)``."""
        return np.asarray(self._to_phi(np.asarray(x, dtype=np.float64)), dtype=np.float64)

    def from_phi(self, phi: ArrayLike) -> tuple[NDArray[np.float64], float]:
        """``T⁻¹(φ)`` and ``log |det ∂θ/∂φ|`` there, in one call.

        The second is the term :meth:`log_density_graph` adds.
        """
        # a writable float64 copy: the type the compiled function was called with
        theta, log_jacobian = self._from_phi(np.array(phi, dtype=np.float64))
        return np.asarray(theta, dtype=np.float64), float(log_jacobian)

    def log_density_graph(self, graph: Any, flat: Any) -> Any:
        """``log π̃_φ``: ``graph`` (of ``flat``) at ``T⁻¹(φ)`` plus the log-Jacobian."""
        return clone_replace(graph, {flat: self._theta}) + self._log_jacobian

    def covariance(self, x: ArrayLike, cov: ArrayLike) -> NDArray[np.float64]:
        """``J Σ Jᵀ`` with ``J = ∂φ/∂θ`` at ``x``: a covariance carried to φ.

        ``J`` by forward differences of the compiled map (SciPy's ``approx_fprime``, d + 1
        calls of about 10 µs). The result only sets NUTS's mass matrix or whitening, which
        any positive definite matrix keeps exact. PyTensor's symbolic Jacobian of the map
        took 10 s to rewrite for bambi's ``(prestige|year)`` model (d = 66) with its
        caches warm, and as a Scan 5 s more to compile with them empty.
        """
        jac = np.atleast_2d(approx_fprime(np.asarray(x, dtype=np.float64), self.to_phi))
        out = jac @ np.asarray(cov, dtype=np.float64) @ jac.T
        return 0.5 * (out + out.T)
