r"""The Gaussian surrogate ``N(θ̂, Σ)`` of the posterior, and helpers its proposals share.

The surrogate is the Laplace fit that a step with ``control_variate="taylor"`` already
holds: θ̂ is the reference point of the Taylor expansion and Σ the inverse of the negative
Hessian of the log posterior there. The proposals of
:mod:`pymc_minibatch_mh.adapter.proposal_surrogate` (Crank-Nicolson) and
:mod:`pymc_minibatch_mh.adapter.proposal_gradient` (MALA, HMC) precondition with it; the
two private helpers here (the check of a proposal's ``scale`` and the two-slot cache of
values at the last points a proposal saw) serve all of them.

Classes
-------
GaussianSurrogate
    Mean, covariance, Cholesky factor and precision, with validation.

References
----------
.. [1] Bardenet, R., Doucet, A., Holmes, C. (2017). On Markov chain Monte Carlo methods
   for tall data. JMLR 18(47).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import scipy.linalg
from numpy.typing import ArrayLike, NDArray

__all__ = ["GaussianSurrogate"]

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
