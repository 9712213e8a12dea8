"""The random walk: zero-mean Gaussian increments, as in ``pm.Metropolis``.

``S`` is a vector of proposal *standard deviations* (one per coordinate of the flattened,
transformed variables) or a covariance matrix, and the proposal is
``x' = x + scale · ξ`` with ``ξ ~ N(0, diag(S²))`` or ``N(0, S)``. It is symmetric: its
log-q ratio is 0.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import scipy.linalg
from numpy.typing import ArrayLike, NDArray

from pymc_minibatch_mh.proposals.base import Proposal, ProposalInfo, ProposalState

__all__ = ["RandomWalkProposal"]


class RandomWalkProposal(Proposal):
    """Zero-mean Gaussian increments with given standard deviations or covariance.

    Parameters
    ----------
    S : array_like or None
        ``None`` (unit standard deviations), a vector of ``dim`` standard deviations, or a
        ``dim × dim`` covariance matrix.
    dim : int
        Dimension of the flattened block of variables.

    """

    name: ClassVar[str] = "random_walk"
    reports_parameters: ClassVar[bool] = False

    def __init__(self, S: ArrayLike | None, dim: int) -> None:
        self.dim = dim
        if S is None:
            S = np.ones(dim)
        S = np.asarray(S, dtype=np.float64)
        if S.ndim == 0:
            S = np.full(dim, float(S))
        if S.ndim == 1:
            if S.shape != (dim,):
                raise ValueError(
                    f"S has {S.shape[0]} standard deviations but the sampled variables have "
                    f"{dim} coordinates (after flattening and transforms)."
                )
            if not (np.all(np.isfinite(S)) and np.all(S > 0)):
                raise ValueError("The proposal standard deviations S must be finite and > 0.")
            self.std: NDArray[np.float64] | None = S
            self.chol: NDArray[np.float64] | None = None
            self._scaled_for = 1.0
            self._scaled_std = S.copy()
        elif S.ndim == 2:
            if S.shape != (dim, dim):
                raise ValueError(f"The proposal covariance S must be {dim}×{dim}, got {S.shape}.")
            try:
                self.chol = scipy.linalg.cholesky(S, lower=True)
            except np.linalg.LinAlgError as err:
                raise ValueError(
                    "The proposal covariance S is not positive definite."
                ) from err
            self.std = None
        else:
            raise ValueError(f"S must be a vector or a matrix, got {S.ndim} dimensions.")

    def propose(
        self, rng: np.random.Generator, state: ProposalState, scale: float
    ) -> tuple[ProposalState, ProposalInfo]:
        """``x + scale · ξ`` (a new array), ``ξ`` one increment; log-q ratio 0.

        With standard deviations, ``scale · S`` is kept between calls with the same
        ``scale``: products of a NumPy array and a Python float cost more than the rest of
        the proposal at these sizes.
        """
        z = rng.standard_normal(self.dim)
        if self.std is not None:
            if scale != self._scaled_for:
                self._scaled_std = self.std * scale
                self._scaled_for = scale
            z *= self._scaled_std
        else:
            z = self.chol @ z  # type: ignore[operator]
            z *= scale
        z += state.x
        return ProposalState(z), ProposalInfo(0.0, scale=scale)
