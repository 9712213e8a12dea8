"""Proposals and the tuning of their scale.

A proposal is an object with ``propose(rng, x, scale) -> (x′, log_q_ratio)`` on the flat,
transformed space, where ``log_q_ratio = log q(x | x′) − log q(x′ | x)`` (0 for a
symmetric proposal) is added to the data-free part of the log acceptance ratio; any
context it needs (a surrogate's gradient, a covariance) is given to it explicitly when it
is built. ``scale`` is the one number the tuner adapts (:class:`ScalingTuner`); what it
means is the proposal's own (for the random walk, a multiplier of the increments).

Conventions follow ``pm.Metropolis``: ``S`` is a vector of proposal *standard deviations*
(one per coordinate of the flattened, transformed variables) or a covariance matrix, and
the proposal is ``x' = x + scaling · ξ`` with ``ξ ~ N(0, diag(S²))`` or ``N(0, S)``. The
proposal is symmetric: its log-q ratio is 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np
import scipy.linalg
from numpy.typing import ArrayLike, NDArray

__all__ = ["Proposal", "RandomWalkProposal", "ScalingTuner"]


class Proposal(Protocol):
    """What a step method needs of a proposal (see the module docstring)."""

    #: The proposal's name; the step's ``proposal`` stat reports its code
    #: (:data:`~pymc_minibatch_mh.adapter.proposal_choice.PROPOSAL_CODES`).
    name: str

    def propose(
        self, rng: np.random.Generator, x: NDArray[np.float64], scale: float
    ) -> tuple[NDArray[np.float64], float]:
        """A proposal ``x′`` (a new array) and ``log q(x | x′) − log q(x′ | x)``."""
        ...


class RandomWalkProposal:
    """Zero-mean Gaussian increments with given standard deviations or covariance.

    Parameters
    ----------
    S : array_like or None
        ``None`` (unit standard deviations), a vector of ``dim`` standard deviations, or a
        ``dim × dim`` covariance matrix.
    dim : int
        Dimension of the flattened block of variables.

    """

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

    name: ClassVar[str] = "random_walk"

    def propose(
        self, rng: np.random.Generator, x: NDArray[np.float64], scaling: float
    ) -> tuple[NDArray[np.float64], float]:
        """A proposal ``x + scaling · ξ`` (a new array), ``ξ`` one increment; log-q ratio 0.

        With standard deviations, ``scaling · S`` is kept between calls with the same
        ``scaling``: products of a NumPy array and a Python float cost more than the
        rest of the proposal at these sizes.
        """
        z = rng.standard_normal(self.dim)
        if self.std is not None:
            if scaling != self._scaled_for:
                self._scaled_std = self.std * scaling
                self._scaled_for = scaling
            z *= self._scaled_std
        else:
            z = self.chol @ z  # type: ignore[operator]
            z *= scaling
        z += x
        return z, 0.0


@dataclass
class ScalingTuner:
    """Stochastic-approximation tuning of the proposal scale during PyMC's tuning phase.

    After each tuning step, ``log(scaling)`` moves by ``(a_t − target) / t^κ`` where
    ``a_t`` is the step's estimated acceptance probability ``g(Δ*)`` (less noisy than the
    0/1 decision) and ``t`` counts tuning steps from ``t0``. The scale therefore grows
    while proposals are accepted more often than ``target`` and shrinks otherwise, with
    steps that shrink over time so that it settles. Tuning stops when PyMC ends the
    tuning phase; draws after it use a fixed proposal, so the chain is a valid
    (approximate) MCMC chain. Larger scales also mean larger minibatches (s² of Δ* grows
    with the squared step), so a lower target gives smaller batches.

    Parameters
    ----------
    initial : float
        Scale at the start of every chain's tuning.
    target : float
        Target acceptance probability. Barker's test accepts less often than Metropolis'
        test for the same proposal (at most 1/2 for tiny steps); for high-dimensional
        random walks its optimal rate is about 0.16 (Agrawal et al., 2023), and about 0.3
        in one or two dimensions.
    t0 : float
        Offset that damps the first updates.
    kappa : float
        Decay exponent of the step sizes, in (0.5, 1].

    """

    initial: float
    target: float = 0.25
    t0: float = 10.0
    kappa: float = 0.6
    log_scaling: float = field(init=False)
    count: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if not (0.0 < self.target < 1.0):
            raise ValueError(f"target_accept must be in (0, 1), got {self.target}.")
        if not (self.initial > 0 and math.isfinite(self.initial)):
            raise ValueError(f"scaling must be a positive finite number, got {self.initial}.")
        self.reset()

    def reset(self) -> None:
        """Return to the initial scale (start of a chain)."""
        self.log_scaling = math.log(self.initial)
        self.count = 0

    @property
    def scaling(self) -> float:
        """Current scale."""
        return math.exp(self.log_scaling)

    #: The tuner's sample stats, declared by the step methods: ``scaling``, the effective
    #: scale of the step's proposal (the tuned scale times a schedule's factor).
    stats_dtypes_shapes: ClassVar[dict[str, tuple[Any, list[int]]]] = {
        "scaling": (np.float64, []),
    }

    def update(self, accept_prob: float) -> float:
        """Record one tuning step and return the new scale."""
        self.count += 1
        gain = (self.count + self.t0) ** -self.kappa
        self.log_scaling += gain * (accept_prob - self.target)
        return self.scaling
