r"""The second-order Taylor form of the control variates, evaluated in one place.

Every expansion the estimators evaluate, per row or summed over rows, in θ or in the
per-row quantities, is

.. math::

    v + g^T a + ½\, a^T H b

with ``a`` the change the expansion is taken in and ``b = a`` (an expansion at a point) or
``b = a + 2(x − x̂)`` (the difference of an expansion between two points, see
:func:`~pymc_minibatch_mh.core.control_variate.expansion_difference`).
:func:`~pymc_minibatch_mh.core.control_variate.second_order` joins its three terms (the
core holds it, so that the closed-form sums of the core and the per-row expansions of the
estimators use the one function); the callers give ``gᵀa`` and ``aᵀHb`` as they compute
them:

- the θ-space residuals (:class:`~pymc_minibatch_mh.estimators.taylor.TaylorEstimator`):
  forward-mode products of the per-row log-likelihood, or central differences of its
  gradient (:class:`~pymc_minibatch_mh.estimators.differenced.DifferencedResiduals`);
- the residuals in the per-row quantities
  (:class:`~pymc_minibatch_mh.estimators.predictor_taylor.PredictorTaylorEstimator`):
  :func:`inner` and :func:`bilinear` over the quantities, with ``H`` given by its non-zero
  entries;
- the rows expanded around their level's shift and the sums of their tables
  (:mod:`~pymc_minibatch_mh.estimators.predictor_shift`).

The functions are plain arithmetic on their arguments: NumPy arrays and PyTensor
variables alike (the compiled per-step functions are built from the same expression).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["bilinear", "inner"]


def inner(gradient: Sequence[Any], a: Sequence[Any]) -> Any:
    """``gᵀa = Σ_j g_j a_j``, with ``g_j`` and ``a_j`` per row for each quantity ``j``.

    Arrays or tensors alike; 0.0 for no quantities. Also the interpolation of values at
    nodes with their weights (``g`` the weights).
    """
    total: Any = 0.0
    for g_j, a_j in zip(gradient, a, strict=True):
        total = total + g_j * a_j
    return total


def bilinear(hessian: Sequence[tuple[int, int, Any]], a: Sequence[Any],
             b: Sequence[Any]) -> Any:
    """``aᵀHb = Σ_jk H_jk a_j b_k`` of a symmetric ``H`` given by its non-zero entries.

    Parameters
    ----------
    hessian : sequence of (int, int, array_like or tensor)
        ``(j, k, H_jk)`` with ``j ≤ k``: the entries on and above the diagonal (the one
        below is the same).
    a, b : sequence of array_like or tensor
        ``a_j`` and ``b_j`` for each quantity ``j``.

    Returns
    -------
    array_like or tensor
        Per row (0.0 for no entries).

    """
    total: Any = 0.0
    for j, k, h_jk in hessian:
        if j == k:
            total = total + h_jk * a[j] * b[j]
        else:  # H_jk = H_kj: both off-diagonal terms
            total = total + h_jk * (a[j] * b[k] + a[k] * b[j])
    return total
