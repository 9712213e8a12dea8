r"""A random walk on the orthogonal matrices (the square Stiefel manifold).

For a parameter that is a ``D × D`` orthogonal matrix ``W`` (for example the unmixing
matrix of ICA on whitened data, Korattikara et al. 2014, §5.2 [1]_), flattened row by row
into the step's vector, the proposal is

.. math::

    W' = W \exp(s A), \qquad A = (G - G^\top)/\sqrt{2}, \quad G_{ij} \sim N(0, 1),

with ``s`` the step's ``scale``: ``A`` is a skew-symmetric matrix whose entries above the
diagonal are independent standard normals, and its matrix exponential
(``scipy.linalg.expm``) is a rotation, so ``W'`` is orthogonal and in the same
connected component as ``W`` (``det W' = det W``). The proposal is symmetric with respect
to the Haar (uniform) measure on the orthogonal group: the reverse move needs
``W'ᵀW = exp(s A)ᵀ = exp(−s A)``, and ``−A`` has the law of ``A``. Its log-q ratio is 0,
so a uniform prior on the manifold (``pm.Flat`` on the ``D × D`` entries, started on the
manifold) leaves only the likelihood in the test.

Rounding makes ``W exp(sA)`` drift off the manifold by about 1e-16 per step; the product is
mapped back to the nearest orthogonal matrix, the orthogonal factor of its polar
decomposition (``scipy.linalg.polar``). That map commutes with multiplication by
orthogonal matrices on either side and is the identity on the manifold, so it does not
change the law of the move (it only removes rounding error).

This is not Ouyang's walk, which the paper used (discard a row, perturb another, project
and complete the basis [2]_): both are symmetric random walks on the manifold; this one
moves every row at each step, by an amount set by one scale that the step's tuner adapts.

References
----------
.. [1] Korattikara, A., Chen, Y., Welling, M. (2014). Austerity in MCMC land: cutting the
   Metropolis-Hastings budget. ICML 2014, section 5.2.
.. [2] Ouyang, Z. (2008). Bayesian Additive Regression Kernels. PhD thesis, Duke
   University.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
import scipy.linalg
from numpy.typing import NDArray

from pymc_minibatch_mh.proposals.base import Proposal, ProposalInfo, ProposalState

__all__ = ["StiefelRandomWalk", "skew_normal"]


def skew_normal(rng: np.random.Generator, size: int) -> NDArray[np.float64]:
    """A ``size × size`` skew-symmetric matrix with independent N(0, 1) entries above the diagonal.

    ``A`` and ``−A`` have the same law, which is what makes the walk symmetric.
    """
    g = rng.standard_normal((size, size))
    return (g - g.T) / math.sqrt(2.0)


class StiefelRandomWalk(Proposal):
    """Symmetric random walk ``W' = W expm(scale · A)`` on the ``D × D`` orthogonal matrices.

    Parameters
    ----------
    matrix_size : int
        ``D``: the sampled parameter is a ``D × D`` matrix, flattened row by row (the
        step's vector must have exactly ``D²`` coordinates: give the step only this
        variable, untransformed, e.g. ``pm.Flat("W", shape=(D, D))``). At least 2.
    tolerance : float
        How far from orthogonal the chain's point may be, ``max |WᵀW − I|``, when the
        proposal first sees it (a chain start): a start off the manifold is refused.

    Notes
    -----
    See the module docstring. Every coordinate of ``W`` moves at each step; ``scale`` is
    the standard deviation of the rotation angles' generator and is tuned by the step like
    the random walk's (``scaling=`` sets its start).

    """

    name: ClassVar[str] = "stiefel_random_walk"
    reports_parameters: ClassVar[bool] = False

    def __init__(self, matrix_size: int, tolerance: float = 1e-8) -> None:
        if isinstance(matrix_size, bool) or not isinstance(matrix_size, (int, np.integer)):
            raise TypeError(f"matrix_size must be an integer D ≥ 2, got {matrix_size!r}.")
        if matrix_size < 2:
            raise ValueError(
                f"matrix_size must be at least 2 (the 1 × 1 orthogonal matrices are ±1, a "
                f"random walk cannot move between them), got {matrix_size}."
            )
        if not (tolerance > 0.0 and math.isfinite(tolerance)):
            raise ValueError(f"tolerance must be a positive finite number, got {tolerance!r}.")
        self.matrix_size = int(matrix_size)
        self.tolerance = float(tolerance)

    def _matrix(self, x: NDArray[np.float64]) -> NDArray[np.float64]:
        d = self.matrix_size
        if x.shape != (d * d,):
            raise ValueError(
                f"StiefelRandomWalk(matrix_size={d}) moves a {d}×{d} matrix ({d * d} "
                f"coordinates), but the step samples {x.size} coordinates. Give the step only "
                f"the {d}×{d} matrix variable (e.g. MinibatchBarker([W], proposal=...)), "
                "untransformed (pm.Flat), or set matrix_size to its D."
            )
        return x.reshape(d, d)

    def init(self, x: NDArray[np.float64]) -> ProposalState:
        """The state at ``x``; refuses a point that is not an orthogonal matrix."""
        x = np.asarray(x, dtype=np.float64)
        w = self._matrix(x)
        error = float(np.max(np.abs(w.T @ w - np.eye(self.matrix_size))))
        if not error <= self.tolerance:
            raise ValueError(
                f"StiefelRandomWalk needs a start on the manifold (an orthogonal "
                f"{self.matrix_size}×{self.matrix_size} matrix), but max |WᵀW − I| = "
                f"{error:.3g} at the chain's point (tolerance {self.tolerance:g}). Start the "
                "chain there, e.g. pm.Flat('W', shape=(D, D), initval=np.eye(D)) or "
                "pm.sample(initvals={'W': scipy.stats.ortho_group.rvs(D)})."
            )
        return ProposalState(x)

    def generator(self, rng: np.random.Generator) -> NDArray[np.float64]:
        """The skew-symmetric generator ``A`` of one move (:func:`skew_normal`).

        The log-q ratio 0 holds only while ``A`` and ``−A`` have the same law.
        """
        return skew_normal(rng, self.matrix_size)

    def propose(
        self, rng: np.random.Generator, state: ProposalState, scale: float
    ) -> tuple[ProposalState, ProposalInfo]:
        """``W expm(scale · A)``, mapped to the nearest orthogonal matrix; log-q ratio 0."""
        w = self._matrix(state.x)
        rotation = scipy.linalg.expm(scale * self.generator(rng))
        w_new, _ = scipy.linalg.polar(w @ rotation)
        return ProposalState(w_new.reshape(-1)), ProposalInfo(0.0, scale=scale)
