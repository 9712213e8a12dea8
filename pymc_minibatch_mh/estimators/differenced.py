r"""The θ-space expansion's curvature from central differences of the gradient.

Where PyTensor cannot differentiate the log-likelihood twice (an op whose gradient has no
gradient, such as ``hyp2f1``'s in pymc-marketing's ParetoNBD),
:class:`~pymc_minibatch_mh.estimators.taylor.TaylorEstimator` takes the curvature of its
expansion from central differences of the gradient along each coordinate at θ̂, with the
steps of :func:`difference_steps`: in the full-data H (:class:`DifferencedPasses`, with
:class:`DifferencedChunkSums`) and in the per-row terms (:class:`DifferencedResiduals`).
Both use the same differences, so the per-row matrices sum to the full-data one and Δ*
stays unbiased.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from numpy.typing import NDArray
from pytensor.gradient import NullTypeGradError
from pytensor.graph.utils import MethodNotDefined

from pymc_minibatch_mh.core.control_variate import second_order
from pymc_minibatch_mh.estimators.full_passes import ChunkSums
from pymc_minibatch_mh.estimators.reference import TaylorPasses

__all__ = [
    "DIFFERENCE_STEP",
    "NO_DERIVATIVE",
    "DifferencedChunkSums",
    "DifferencedPasses",
    "DifferencedResiduals",
    "difference_steps",
    "missing_derivative",
    "numerical_curvature_message",
]

#: Relative step of the central differences that give the per-row curvature where the
#: log-likelihood's second derivative has no symbolic form: ``ε^(1/3)`` of float64, the
#: step that balances the differences' truncation error (``O(h²)``) against rounding
#: (``O(ε/h)``).
DIFFERENCE_STEP: float = float(np.finfo(np.float64).eps ** (1.0 / 3.0))

#: What PyTensor raises when a derivative of an op it needs is not defined.
NO_DERIVATIVE: tuple[type[Exception], ...] = (MethodNotDefined, NullTypeGradError)


def difference_steps(theta: NDArray[np.float64]) -> NDArray[np.float64]:
    """The central differences' step along each coordinate at ``theta``.

    ``DIFFERENCE_STEP · max(1, |θ_j|)``: scaled to each coordinate, never below the
    relative step (the flat space is unconstrained, its coordinates of order one).
    """
    return DIFFERENCE_STEP * np.maximum(1.0, np.abs(np.asarray(theta, dtype=np.float64)))


def missing_derivative(err: Exception) -> str:
    """What PyTensor could not differentiate, from its exception (one of NO_DERIVATIVE)."""
    if isinstance(err, MethodNotDefined) and len(err.args) == 3:
        return f"no gradient of {err.args[-1]}"
    return f"{type(err).__name__}: {err}"


def numerical_curvature_message(step_name: str, reason: str, dim: int) -> str:
    """The warning that a step's control variates use differences for their curvature.

    Parameters
    ----------
    step_name : str
        The step method's name.
    reason : str
        The missing derivative (:func:`missing_derivative`).
    dim : int
        d, the size of the flat state.

    Returns
    -------
    str

    """
    return (
        f"{step_name}: the log-likelihood has no symbolic second derivative in "
        f"PyTensor ({reason}), so the control variates' "
        "curvature is numerical: central differences of the per-row gradient, "
        "with steps ε^(1/3)·max(1, |θ̂_j|) along each coordinate. Δ* stays unbiased "
        "(the full-data sums use the same differences); each step evaluates "
        f"{4 * dim} directional derivatives per row and each pass with the Hessian "
        f"{2 * dim + 1} gradients per row."
    )


class DifferencedChunkSums(ChunkSums):
    r"""A chunk's log-likelihood sum, gradient, and Hessian from differences of the gradient.

    Column ``j`` of the Hessian is ``[G(x + h_j e_j) − G(x − h_j e_j)] / (2 h_j)`` with
    ``h =`` :func:`difference_steps` ``(x)``, then the matrix is symmetrised: ``2d + 1``
    calls of the gradient function per chunk, no second derivative. Summed over the
    chunks it is the sum of the per-row matrices that :class:`DifferencedResiduals`
    builds from the same steps, so the closed form and the residuals use the same
    expansion (Δ* stays unbiased).

    Parameters
    ----------
    value_grad_fn : pytensor.compile.function.types.Function
        ``(x, *rows) -> (sum, gradient)``.
    dim : int
        Size of ``x``.

    """

    def __init__(self, value_grad_fn: Any, dim: int) -> None:
        super().__init__(value_grad_fn, None, dim)

    def __call__(self, x: NDArray[np.float64], *rows: NDArray[Any]) -> tuple[Any, ...]:
        """``(sum, gradient, Hessian)`` of the chunk's log-likelihood at ``x``."""
        fn = self.value_grad_fn
        value, g = fn(x, *rows)
        value, g = float(value), np.array(g, dtype=np.float64)
        steps = difference_steps(x)
        h = np.empty((self.dim, self.dim))
        for j, step in enumerate(steps):  # d coordinates, each a call over all the rows
            e = np.zeros(self.dim)
            e[j] = step
            plus = np.array(fn(x + e, *rows)[1], dtype=np.float64)
            minus = np.array(fn(x - e, *rows)[1], dtype=np.float64)
            h[:, j] = (plus - minus) / (2.0 * step)
        return value, g, 0.5 * (h + h.T)


class DifferencedPasses(TaylorPasses):
    """Full-data passes whose Hessians are central differences of the gradient.

    :class:`~pymc_minibatch_mh.estimators.reference.TaylorPasses` with
    :class:`DifferencedChunkSums`, for a log-likelihood PyTensor can differentiate once
    but not twice. A pass with the Hessian evaluates every row ``2d + 1`` times, all
    counted in ``evaluations``.
    """

    @functools.cached_property
    def hessian_sums(self) -> ChunkSums:
        """The per-chunk sum, gradient and differenced Hessian (first use compiles)."""
        return DifferencedChunkSums(self.value_grad_fn, self.dim)

    def _full_pass(
        self, x: NDArray[np.float64], hessian: bool
    ) -> tuple[float, NDArray[np.float64], NDArray[np.float64] | None]:
        result = super()._full_pass(x, hessian)
        if hessian:
            self.evaluations += 2 * self.dim * self.store.n_rows
        return result


class DifferencedResiduals:
    r"""The per-row function of the θ-space expansion with a differenced curvature.

    ``fn(x_cur, x_prop, inv_temperature, *rows) -> (residuals, data_free)`` as the
    symbolic one of :class:`~pymc_minibatch_mh.estimators.taylor.TaylorEstimator`, with
    the term ``δᵀĤ_i w`` of each row from central differences of its gradient at θ̂:
    ``Ĥ_i`` is the symmetrised matrix whose column ``j`` is
    ``[g_i(θ̂ + h_j e_j) − g_i(θ̂ − h_j e_j)] / (2 h_j)`` (steps from
    :func:`difference_steps`), so ``δᵀĤ_i w = ½ Σ_j (w_j D_j(δ) + δ_j D_j(w))`` with
    ``D_j(a)`` the difference of the directional derivative ``g_iᵀa``. Summed over the
    rows it is the Hessian of :class:`DifferencedChunkSums` (the closed form's), so Δ*
    stays unbiased. One call of the compiled first-order terms, and ``2d`` calls of the
    compiled directional derivatives (both directions at a point), each over all the
    given rows.

    Parameters
    ----------
    first_order : callable
        ``(x_cur, x_prop, inv_temperature, *rows) -> (ratios, g_iᵀδ, data_free)``: the
        tempered ratios, the untempered first-order terms at θ̂, and the data-free part.
    directions : callable
        ``(t, a, b, *rows) -> (g_i(t)ᵀa, g_i(t)ᵀb)``.
    theta, steps : pytensor.compile.sharedvalue.SharedVariable
        θ̂ and the steps at θ̂ (read at each call).

    """

    __slots__ = ("first_order", "directions", "theta", "steps")

    def __init__(self, first_order: Any, directions: Any, theta: Any, steps: Any) -> None:
        self.first_order, self.directions = first_order, directions
        self.theta, self.steps = theta, steps

    def __call__(self, x_cur: NDArray[np.float64], x_prop: NDArray[np.float64],
                 inv_temperature: NDArray[np.float64], *rows: NDArray[Any]) -> tuple[Any, Any]:
        """Residuals and the data-free part of the rows ``rows`` (see the class)."""
        ratios, slope, data_free = self.first_order(x_cur, x_prop, inv_temperature, *rows)
        theta = self.theta.get_value(borrow=True)
        steps = self.steps.get_value(borrow=True)
        delta = x_prop - x_cur
        w = x_prop + x_cur - 2.0 * theta
        curvature = np.zeros(np.shape(ratios))
        for j, step in enumerate(steps):  # the d coordinates, each over all the rows
            shift = np.zeros_like(theta)
            shift[j] = step
            plus = [np.array(a) for a in self.directions(theta + shift, delta, w, *rows)]
            minus = self.directions(theta - shift, delta, w, *rows)
            curvature += (w[j] * (plus[0] - minus[0]) + delta[j] * (plus[1] - minus[1])) / (
                4.0 * step)
        return ratios - second_order(slope, curvature) * inv_temperature, data_free
