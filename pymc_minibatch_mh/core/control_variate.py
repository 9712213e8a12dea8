r"""Taylor control variates for the log acceptance ratio: the NumPy side.

With a reference point θ̂ and the second-order Taylor expansion of each row's
log-likelihood around it,

.. math::

    q_i(θ) = ℓ_i(θ̂) + g_i^T (θ − θ̂) + ½ (θ − θ̂)^T H_i (θ − θ̂),

the difference of the expansions between θ and θ' is, with ``δ = θ' − θ`` and
``w = θ' + θ − 2θ̂``,

.. math::

    q_i(θ') − q_i(θ) = g_i^T δ + ½ δ^T H_i w,

so its sum over all N rows needs only ``G = Σ g_i`` and ``H = Σ H_i`` (one pass over the
data at θ̂): :func:`expansion_difference`, the one home of this formula (NumPy here; the
estimators build their PyTensor graphs by calling it with ``dot=pytensor.tensor.dot``).
The log acceptance ratio is then ``Δ = [Σ_i (q_i(θ') − q_i(θ)) + Σ_i r_i] / K + c`` with
the residuals ``r_i = ℓ_i(θ') − ℓ_i(θ) − (q_i(θ') − q_i(θ))``, and only the residuals are
estimated from a minibatch: ``Δ* = (closed form)/K + c + (N/b) Σ_{i∈B} r_i / K``, unbiased
for Δ under sampling without replacement, with a variance that is that of the residuals. Near θ̂ the
residuals are third-order small (``O(‖δ‖ ‖θ − θ̂‖²)`` per row), which is why a minibatch
of a few rows suffices at temperature 1 with proposals as wide as the posterior
(Bardenet, Doucet and Holmes 2017, section 7 [1]_; Cornish et al. 2019 [2]_).

This module holds the reference (θ̂, G, H) and what can be computed from it without the
model: the closed-form sum and its gradient, the Laplace precision and covariance, the
distance of a state from θ̂ in that metric, and the Newton decrement used to check that a
MAP search converged. The per-row residuals need the model; they are compiled in
:mod:`pymc_minibatch_mh.estimators.taylor`.

References
----------
.. [1] Bardenet, R., Doucet, A., Holmes, C. (2017). On Markov chain Monte Carlo methods
   for tall data. JMLR 18(47), section 7 (control variates from Taylor expansions).
.. [2] Cornish, R., Vanetti, P., Bouchard-Côté, A., Deligiannidis, G., Doucet, A.
   (2019). Scalable Metropolis-Hastings for exact Bayesian inference with large
   datasets. ICML 2019.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "TaylorReference",
    "expansion_difference",
    "expansion_gradient",
    "newton_decrement",
    "second_order",
]


def second_order(slope: Any, curvature: Any, value: Any = None) -> Any:
    """``value + slope + ½ curvature``: a second-order expansion from its terms.

    Parameters
    ----------
    slope : array_like or tensor
        The first-order term ``gᵀa`` (per row, or summed).
    curvature : array_like or tensor
        The second-order term ``aᵀHb`` without its factor ½.
    value : array_like or tensor, optional
        The expansion's value at its centre; default: none (the expansion's change).

    Returns
    -------
    array_like or tensor
        ``slope + ½ curvature``, plus ``value`` when given.

    Examples
    --------
    >>> second_order(1.0, -2.0), second_order(1.0, -2.0, value=3.0)
    (0.0, 3.0)

    """
    change = slope + 0.5 * curvature
    return change if value is None else value + change



def expansion_difference(
    gradient: Any, hessian: Any, centre: Any, x_cur: Any, x_prop: Any,
    dot: Callable[[Any, Any], Any] = np.dot,
) -> Any:
    r"""The difference of a second-order expansion between two points: ``Gᵀδ + ½ δᵀ H w``.

    With the expansion ``q(x) = q(c) + Gᵀ(x − c) + ½ (x − c)ᵀ H (x − c)`` around the
    centre ``c``, ``q(x') − q(x) = Gᵀδ + ½ δᵀ H w`` with ``δ = x' − x`` and
    ``w = x' + x − 2c`` (H symmetric). ``x = c`` gives ``q(x') − q(c)``.

    The one implementation of this formula: with NumPy arrays and the default ``dot`` it
    computes the value; with PyTensor variables and ``dot=pytensor.tensor.dot`` it builds
    the graph of the same expression (the estimators' compiled closed form).

    Parameters
    ----------
    gradient, hessian : array_like or tensor
        G, shape ``(k,)``, and the symmetric H, shape ``(k, k)``.
    centre, x_cur, x_prop : array_like or tensor
        c, x and x', shape ``(k,)``.
    dot : callable
        The inner/matrix-vector product (``numpy.dot`` or ``pytensor.tensor.dot``).

    Returns
    -------
    scalar or tensor
        ``Gᵀδ + ½ δᵀ H w``.

    Examples
    --------
    >>> float(expansion_difference(np.array([1.0]), np.array([[-2.0]]), np.array([0.0]),
    ...                            np.array([0.0]), np.array([1.0])))
    0.0

    """
    delta = x_prop - x_cur
    w = x_prop + x_cur - 2.0 * centre
    return second_order(dot(gradient, delta), dot(delta, dot(hessian, w)))


def expansion_gradient(
    gradient: Any, hessian: Any, centre: Any, x: Any,
    dot: Callable[[Any, Any], Any] = np.dot,
) -> Any:
    """Gradient of the second-order expansion of :func:`expansion_difference`: ``G + H(x − c)``.

    Parameters
    ----------
    gradient, hessian, centre, x : array_like or tensor
        G ``(k,)``, the symmetric H ``(k, k)``, the centre c and the point x ``(k,)``.
    dot : callable
        The matrix-vector product (``numpy.dot`` or ``pytensor.tensor.dot``).

    Returns
    -------
    array or tensor
        Shape ``(k,)``.

    """
    return gradient + dot(hessian, x - centre)


@dataclass(frozen=True)
class TaylorReference:
    """A reference point of the Taylor control variates and the full-data sums there.

    Parameters
    ----------
    theta : numpy.ndarray
        θ̂, shape ``(d,)`` (the flat, transformed space the step samples).
    gradient : numpy.ndarray
        ``G = Σ_i ∇ℓ_i(θ̂)``, shape ``(d,)`` (untempered log-likelihood).
    hessian : numpy.ndarray
        ``H = Σ_i ∇²ℓ_i(θ̂)``, shape ``(d, d)``, symmetric.
    prior_hessian : numpy.ndarray, optional
        Hessian of the log prior (with Jacobians) at θ̂, for the Laplace precision.
        Default: zeros.
    loglik : float
        ``Σ_i ℓ_i(θ̂)`` (reported; not needed by the estimator).
    prior_gradient : numpy.ndarray, optional
        Gradient of the log prior (with Jacobians) at θ̂, for :meth:`laplace_mean`.
        Default: None, which takes θ̂ for the mode there.
    log_prior : float
        The log prior (with Jacobians and Potentials) at θ̂: the start check of a chain
        that starts at θ̂ reads it instead of evaluating the prior again. Default: NaN
        (not known).

    Examples
    --------
    A Normal likelihood with known variance is quadratic, so the expansion is exact:

    >>> import numpy as np
    >>> x = np.array([0.5, 1.0, 2.5])
    >>> ref = TaylorReference(np.array([1.0]), np.array([np.sum(x - 1.0)]),
    ...                       np.array([[-3.0]]))
    >>> loglik = lambda m: -0.5 * np.sum((x - m) ** 2)
    >>> bool(np.isclose(ref.proxy_difference(np.array([0.2]), np.array([1.7])),
    ...                 loglik(1.7) - loglik(0.2)))
    True

    """

    theta: NDArray[np.float64]
    gradient: NDArray[np.float64]
    hessian: NDArray[np.float64]
    prior_hessian: NDArray[np.float64] | None = None
    loglik: float = math.nan
    prior_gradient: NDArray[np.float64] | None = None
    log_prior: float = math.nan

    def __post_init__(self) -> None:
        theta = np.array(self.theta, dtype=np.float64).reshape(-1)
        d = theta.size
        gradient = np.array(self.gradient, dtype=np.float64).reshape(-1)
        hessian = np.array(self.hessian, dtype=np.float64)
        prior = (
            np.zeros((d, d))
            if self.prior_hessian is None
            else np.array(self.prior_hessian, dtype=np.float64)
        )
        if gradient.shape != (d,) or hessian.shape != (d, d) or prior.shape != (d, d):
            raise ValueError(
                f"A reference of dimension {d} needs a gradient of shape ({d},) and Hessians "
                f"of shape ({d}, {d}); got {gradient.shape}, {hessian.shape}, {prior.shape}."
            )
        for name, value in (("theta", theta), ("gradient", gradient), ("hessian", hessian)):
            if not np.all(np.isfinite(value)):
                raise ValueError(f"The reference's {name} has non-finite entries: {value}.")
        hessian = 0.5 * (hessian + hessian.T)
        if self.prior_gradient is not None:
            prior_g = np.array(self.prior_gradient, dtype=np.float64).reshape(-1)
            if prior_g.shape != (d,) or not np.all(np.isfinite(prior_g)):
                raise ValueError(
                    f"The reference's prior gradient must be finite with shape ({d},); got "
                    f"{prior_g}."
                )
            prior_g.setflags(write=False)
            object.__setattr__(self, "prior_gradient", prior_g)
        for name, value in (("theta", theta), ("gradient", gradient), ("hessian", hessian),
                            ("prior_hessian", 0.5 * (prior + prior.T))):
            value.setflags(write=False)
            object.__setattr__(self, name, value)

    @property
    def dim(self) -> int:
        """Dimension d of the sampled (flat) space."""
        return int(self.theta.size)

    def proxy_difference(self, x_cur: ArrayLike, x_prop: ArrayLike) -> float:
        """``Σ_i [q_i(θ') − q_i(θ)] = Gᵀδ + ½ δᵀ H w`` (untempered).

        Parameters
        ----------
        x_cur, x_prop : array_like
            θ and θ', shape ``(d,)``.

        Returns
        -------
        float
            The full-data sum of the differences of the expansions.

        """
        return float(expansion_difference(
            self.gradient, self.hessian, self.theta,
            np.asarray(x_cur, dtype=np.float64), np.asarray(x_prop, dtype=np.float64),
        ))

    def proxy_value(self, x: ArrayLike) -> float:
        """``Σ_i [q_i(x) − q_i(θ̂)]``: the full-data sum of the expansions at ``x`` (untempered)."""
        return self.proxy_difference(self.theta, x)

    def proxy_gradient(self, x: ArrayLike) -> NDArray[np.float64]:
        """Gradient of :meth:`proxy_value` at ``x``: ``G + H(x − θ̂)``."""
        return np.asarray(expansion_gradient(self.gradient, self.hessian, self.theta,
                                             np.asarray(x, dtype=np.float64)))

    def precision(self) -> NDArray[np.float64]:
        """The Laplace precision ``−(H + H_prior)`` at θ̂ (temperature 1)."""
        return -(self.hessian + self.prior_hessian)

    def laplace_covariance(self, temperature: float = 1.0) -> NDArray[np.float64]:
        """Covariance of the Laplace approximation of the (tempered) posterior at θ̂.

        Parameters
        ----------
        temperature : float
            K: the likelihood's Hessian is divided by K.

        Returns
        -------
        numpy.ndarray
            ``(−H/K − H_prior)⁻¹``, shape ``(d, d)``.

        Raises
        ------
        ValueError
            If that matrix is not positive definite (θ̂ is not near a mode).

        """
        precision = -(self.hessian / float(temperature) + self.prior_hessian)
        try:
            chol = np.linalg.cholesky(precision)
        except np.linalg.LinAlgError:
            raise ValueError(
                "The Hessian of the log posterior at the reference point is not negative "
                "definite, so there is no Laplace approximation there: the reference is not "
                "near a mode. Give a reference near the posterior mode."
            ) from None
        inv = np.linalg.inv(chol)
        return inv.T @ inv

    def laplace_mean(self, temperature: float = 1.0) -> NDArray[np.float64]:
        """Mean of the Laplace approximation (see :meth:`laplace_fit`)."""
        return self.laplace_fit(temperature)[0]

    def laplace_fit(
        self, temperature: float = 1.0
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Mean and covariance of the Laplace approximation of the (tempered) posterior.

        The covariance is :meth:`laplace_covariance`, ``Σ_K``; the mean is one Newton step
        from θ̂, ``θ̂ + Σ_K (G/K + ∇log p0(θ̂))``: the mode of the surrogate's quadratic
        part, which is θ̂ itself when θ̂ is the mode and, from a θ̂ within about a
        posterior sd of it (found from a subsample on tall data), lands within a small
        fraction of a posterior sd of it. The mean is θ̂ when ``prior_gradient`` is None.

        Raises
        ------
        ValueError
            As :meth:`laplace_covariance`.

        """
        cov = self.laplace_covariance(temperature)
        if self.prior_gradient is None:
            return np.array(self.theta), cov
        mean = self.theta + cov @ (self.gradient / float(temperature) + self.prior_gradient)
        return mean, cov

    def distance(self, x: ArrayLike) -> float:
        """Distance of a state from θ̂ in the Laplace metric, per dimension.

        ``√((x − θ̂)ᵀ P (x − θ̂) / d)`` with P the :meth:`precision`; about 1 for a draw of
        the posterior when the Laplace approximation is good (the squared Mahalanobis
        distance of such a draw is about d). NaN if P is not positive semi-definite along
        ``x − θ̂``.

        Parameters
        ----------
        x : array_like
            A state, shape ``(d,)``.

        Returns
        -------
        float
            The distance.

        """
        z = np.asarray(x, dtype=np.float64) - self.theta
        quad = float(z @ self.precision() @ z)
        return math.sqrt(quad / self.dim) if quad >= 0.0 else math.nan


def newton_decrement(gradient: ArrayLike, precision: ArrayLike) -> float:
    """The Newton decrement ``√(gᵀ P⁻¹ g)`` of the log posterior.

    With ``g`` the gradient of the log posterior and ``P`` minus its Hessian, this is the
    length of the Newton step in the metric of the Laplace approximation: about the
    distance to the mode in posterior standard deviations. Scale-free, hence a
    convergence criterion that does not depend on N.

    Parameters
    ----------
    gradient : array_like
        Gradient of the log posterior, shape ``(d,)``.
    precision : array_like
        Minus its Hessian, shape ``(d, d)``.

    Returns
    -------
    float
        The decrement; ``inf`` if ``precision`` is not positive definite.

    Examples
    --------
    >>> newton_decrement([2.0, 0.0], [[4.0, 0.0], [0.0, 1.0]])
    1.0

    """
    g = np.asarray(gradient, dtype=np.float64)
    p = np.asarray(precision, dtype=np.float64)
    try:
        chol = np.linalg.cholesky(0.5 * (p + p.T))
    except np.linalg.LinAlgError:
        return math.inf
    z = np.linalg.solve(chol, g)
    return float(math.sqrt(z @ z))
