r"""Rows of few-row levels expanded around their level's own shift (tables in the shift).

The per-row-quantity expansion of :mod:`~pymc_minibatch_mh.estimators.predictor_taylor`
expands each row around ``q̂_i = q_i(θ̂)``. A level of a grouping factor that the data
barely pin down moves its effect ``c_g`` by about its prior's spread between θ and θ′, so
its rows' residuals are large and a uniform minibatch rarely sees them. Such a row is
expanded instead around ``q̂_i`` moved by its level's shift ``u = c_g(θ) − ĉ_g``, along the
quantity ``j`` that the level's term feeds, times the row's weight ``f_i`` in that term:

.. math::

    a_i(θ) = ℓ_i(q̃_i) + g_i(q̃_i)^T δ_i + ½ δ_i^T Ĥ_i δ_i,\qquad
    q̃_i = q̂_i + f_i u\, e_j,\quad δ_i = q_i(θ) − q̃_i,

with ``Ĥ_i`` the row's second derivatives at ``q̂_i`` (what changes fast with the shift is
``ℓ_i`` and ``g_i``; the other coefficients move little, so ``δ_i`` is small and its
second-order term may keep θ̂'s curvature). The full-data sum of these proxies must be
known without reading the rows, so ``ℓ_i`` and ``g_i`` at ``q̃_i`` are taken on a uniform
grid of shifts ``u_k = (k − k_0) h`` (``u = 0`` a node) and interpolated in ``u`` by
Catmull–Rom splines (cubic, continuous first derivative, exact for quadratics): with the
weights ``w_m(u)`` of the four nodes around ``u``, row ``i``'s proxy is
``Σ_m w_m [ℓ_i + g_iᵀδ_i]`` at node ``m`` plus ``½ δ_iᵀĤ_iδ_i``. Because ``δ_i = F_i Δ̃``
(``Δ̃`` the change of the coefficients ``c(θ) − ĉ`` less each set level's ``ū`` on its own
entry), the sum over the set's rows is

.. math::

    Σ_g \big[L_g(ū_g) + A_g(ū_g)^T Δ̃\big] + ½ Δ̃^T B̂ Δ̃

with each level's tables ``L_g = Σ ℓ_i`` and ``A_g = Σ F_iᵀ g_i`` at the nodes (on the
coefficients the level's rows touch), interpolated with the same weights, and the set's
``B̂ = Σ F_iᵀ Ĥ_i F_i``: the per-row proxies sum to the tables' value exactly, so the
estimator stays unbiased whatever the grid (the grid only decides how small the
residuals are). Outside the grid ``ū`` is the nearest end of it, and the rest of the
shift is expanded to second order like the other coefficients. A level whose grid leaves
the quantity's support (a probability ``a[g]`` moved below 0) gets non-finite entries;
the estimator halves its spacing until they are finite.

:class:`ShiftTables` holds the tables (shared variables) and builds both graphs: the sum
:meth:`~ShiftTables.total` and the interpolation of one row (:meth:`~ShiftTables.locate`,
:func:`catmull_rom`); :func:`level_tables` computes them. Which rows are expanded so, and
the graph of their residuals: :class:`~pymc_minibatch_mh.estimators.predictor_set.ShiftedSet`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytensor
import pytensor.tensor as pt
from numpy.typing import NDArray

from pymc_minibatch_mh.core.control_variate import second_order

__all__ = [
    "NODES",
    "SHIFT_SPREADS",
    "ShiftTables",
    "catmull_rom",
    "grid_spacing",
    "level_tables",
]

#: Nodes of each level's grid of shifts (the shift 0 is node ``NODES // 2``).
NODES: int = 48
#: The grid reaches this many of the level's spreads either side of ``ĉ_g`` (the
#: spread: the root of the term's mean square effect at θ̂ plus the Laplace variance of
#: ``c_g``).
SHIFT_SPREADS: float = 6.0
_CENTRE: int = NODES // 2


def catmull_rom(t: Any) -> list[Any]:
    """The Catmull–Rom weights of nodes ``k − 1 … k + 2`` at ``u = u_k + t h`` (0 ≤ t ≤ 1).

    The one home of the interpolation: the tables' sums and each row's proxy use these
    weights (NumPy arrays or PyTensor variables alike).
    """
    t2 = t * t
    t3 = t2 * t
    return [0.5 * (-t3 + 2.0 * t2 - t), 0.5 * (3.0 * t3 - 5.0 * t2 + 2.0),
            0.5 * (-3.0 * t3 + 4.0 * t2 + t), 0.5 * (t3 - t2)]


class ShiftTables:
    """The levels' tables in their shift (shared variables) and the graphs that read them.

    Parameters
    ----------
    n_coef : int
        K, the number of coefficients.

    """

    def __init__(self, n_coef: int) -> None:
        self.n_coef = int(n_coef)
        #: The levels' own coefficients (P,), their spacing h (P,) and the coefficients
        #: each level's rows touch (P, S), the own one first; padded with K (a zero).
        self.own = pytensor.shared(np.zeros(0, dtype=np.int64), name="shift_own")
        self.spacing = pytensor.shared(np.ones(0), name="shift_spacing")
        self.support = pytensor.shared(np.zeros((0, 1), dtype=np.int64), name="shift_support")
        self.loglik = pytensor.shared(np.zeros((0, NODES)), name="shift_L")
        self.gradient = pytensor.shared(np.zeros((0, NODES, 1)), name="shift_A")
        #: The set's ``B̂``, sparse (it couples each level with the coefficients its rows
        #: touch only): rows, columns and values of its non-zero entries.
        self.hessian_rows = pytensor.shared(np.zeros(0, dtype=np.int64), name="shift_B_rows")
        self.hessian_cols = pytensor.shared(np.zeros(0, dtype=np.int64), name="shift_B_cols")
        self.hessian = pytensor.shared(np.zeros(0), name="shift_B")

    def set(self, own: NDArray[np.int64], spacing: NDArray[np.float64],
            support: NDArray[np.int64], loglik: NDArray[np.float64],
            gradient: NDArray[np.float64], hessian: NDArray[np.float64]) -> None:
        """Load new tables (see :func:`level_tables`) and the set's ``B̂`` (K, K)."""
        rows, cols = np.nonzero(hessian)
        for var, value in ((self.own, own), (self.spacing, spacing), (self.support, support),
                           (self.loglik, loglik), (self.gradient, gradient),
                           (self.hessian_rows, rows), (self.hessian_cols, cols),
                           (self.hessian, hessian[rows, cols])):
            var.set_value(np.ascontiguousarray(value, dtype=var.dtype))

    def clear(self) -> None:
        """No level has tables."""
        self.set(np.zeros(0, dtype=np.int64), np.ones(0), np.zeros((0, 1), dtype=np.int64),
                 np.zeros((0, NODES)), np.zeros((0, NODES, 1)),
                 np.zeros((self.n_coef, self.n_coef)))

    @staticmethod
    def locate(u: Any, h: Any) -> tuple[Any, list[Any], Any]:
        """The first of the four nodes, their weights and the shift kept in the grid, ``ū``.

        ``u`` and ``h`` are PyTensor variables of one shape (a shift and its level's
        spacing per entry).
        """
        lowest, highest = 1 - _CENTRE, NODES - 2 - _CENTRE  # nodes 1 and NODES − 2
        kept = pt.clip(u, lowest * h, highest * h)
        position = kept / h + _CENTRE
        node = pt.clip(pt.floor(position), 1, NODES - 3)
        return node.astype("int64") - 1, catmull_rom(position - node), kept

    def total(self, dc: Any) -> Any:
        """The set's proxies summed, less their value at θ̂ (see the module docstring).

        ``dc`` is the graph of ``c(θ) − ĉ`` (K,).
        """
        u = dc[self.own]
        first, weights, kept = self.locate(u, self.spacing)
        # Gathers from flattened tables (one index per entry: fast compiled).
        count, width = self.support.shape[0], self.support.shape[1]
        nodes = ((pt.arange(count) * NODES + first)[:, None] + pt.arange(4)[None, :]).flatten()
        w = pt.stack(weights, axis=1)  # (P, 4)
        rest = pt.set_subtensor(dc[self.own], u - kept)  # Δ̃
        padded = pt.concatenate([rest, pt.zeros((1,), dtype=dc.dtype)])
        change = padded[self.support.flatten()].reshape((count, width))
        ll = pt.sum(self.loglik.flatten()[nodes].reshape((count, 4)) * w, axis=1)
        a = self.gradient.reshape((count * NODES, width))[nodes].reshape((count, 4, width))
        a = pt.sum(a * w[:, :, None], axis=1)
        return second_order(
            pt.sum(a * change),
            pt.sum(self.hessian * rest[self.hessian_rows] * rest[self.hessian_cols]),
            value=pt.sum(ll - self.loglik[:, _CENTRE]))

    @staticmethod
    def node_shift(node: Any, spacing: Any) -> Any:
        """The shift of grid node ``node`` (0 … NODES − 1) at ``spacing`` (arrays or graphs)."""
        return (node - _CENTRE) * spacing

    @classmethod
    def node_shifts(cls, spacing: NDArray[np.float64]) -> NDArray[np.float64]:
        """The grid's shifts, (P, NODES)."""
        return cls.node_shift(np.arange(NODES)[None, :], spacing[:, None])


def grid_spacing(spread: NDArray[np.float64]) -> NDArray[np.float64]:
    """The spacing of grids that reach :data:`SHIFT_SPREADS` times ``spread`` either side."""
    return SHIFT_SPREADS * np.asarray(spread, dtype=np.float64) / (_CENTRE - 1)


def level_tables(
    rows: Sequence[NDArray[np.int64]], own: NDArray[np.int64],
    design: Callable[[NDArray[np.int64]], NDArray[np.float64]],
    at_nodes: Callable[[int], tuple[NDArray[np.float64], NDArray[np.float64]]],
    n_coef: int,
) -> tuple[NDArray[np.int64], NDArray[np.float64], NDArray[np.float64]]:
    """The levels' supports and tables ``L`` and ``A`` at the grid's nodes.

    Parameters
    ----------
    rows : sequence of numpy.ndarray
        Per level, the positions of its rows among the set's rows.
    own : numpy.ndarray
        Per level, its own coefficient.
    design : callable
        ``design(positions) -> F`` of shape ``(n, Q, K)``: the rows' features.
    at_nodes : callable
        ``at_nodes(k) -> (ℓ, g)`` on all the set's rows, each expanded around its
        level's node ``k``: ``ℓ`` (n,) and ``g`` (n, Q).
    n_coef : int
        K.

    Returns
    -------
    tuple of numpy.ndarray
        ``support`` (P, S; padded with K), ``L`` (P, NODES) and ``A`` (P, NODES, S).

    """
    evaluated = [at_nodes(k) for k in range(NODES)]
    loglik = np.stack([ll for ll, _ in evaluated])  # (NODES, n)
    gradient = np.stack([g for _, g in evaluated])  # (NODES, n, Q)
    supports, designs = [], []
    for level, positions in enumerate(rows):
        f = design(positions)
        touched = np.flatnonzero(np.any(f != 0.0, axis=(0, 1)))
        supports.append(np.concatenate([[own[level]], touched[touched != own[level]]]))
        designs.append(f[:, :, supports[-1]])
    width = max([s.size for s in supports], default=1)
    support = np.full((len(rows), width), n_coef, dtype=np.int64)
    table_l = np.zeros((len(rows), NODES))
    table_a = np.zeros((len(rows), NODES, width))
    for level, (positions, f) in enumerate(zip(rows, designs, strict=True)):
        s = f.shape[2]
        support[level, :s] = supports[level]
        table_l[level] = loglik[:, positions].sum(axis=1)
        table_a[level, :, :s] = np.einsum("knj,njs->ks", gradient[:, positions], f)
    return support, table_l, table_a
