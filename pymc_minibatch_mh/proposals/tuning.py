"""The adaptation of a proposal's scale, outside the proposals (as PyMC's ``step_sizes``).

:func:`robbins_monro` is the one stochastic-approximation rule of the package: the step's
:class:`ScalingTuner` adapts a proposal's ``scale`` with it, and the surrogate transition
(:mod:`~pymc_minibatch_mh.proposals.surrogate_transition`) its inner step size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

__all__ = ["ScalingTuner", "robbins_monro"]


def robbins_monro(
    log_value: float, count: int, observed: float, target: float, *, t0: float = 10.0,
    kappa: float = 0.6,
) -> float:
    """One Robbins–Monro update: ``log_value + (observed − target) / (count + t0)^κ``.

    ``count`` is the number of updates so far including this one (≥ 1); the gain
    decays like ``count^{−κ}`` with κ in (0.5, 1], so the value settles.
    """
    return log_value + (observed - target) * (count + t0) ** -kappa


@dataclass
class ScalingTuner:
    """Stochastic-approximation tuning of the proposal scale during PyMC's tuning phase.

    After each tuning step, ``log(scaling)`` moves by ``(a_t − target) / (t + t0)^κ``
    (:func:`robbins_monro`) where ``a_t`` is the step's estimated acceptance probability
    ``g(Δ*)`` (less noisy than the 0/1 decision) and ``t`` counts tuning steps. The scale
    therefore grows while proposals are accepted more often than ``target`` and shrinks
    otherwise, with steps that shrink over time so that it settles, and never exceeds
    ``maximum`` (the proposal's :attr:`~pymc_minibatch_mh.proposals.base.Proposal.max_scale`:
    Crank–Nicolson's, where ρ reaches its ``min_rho``; :meth:`set_maximum` when that
    changes). Tuning stops when PyMC ends the tuning
    phase; draws after it use a fixed proposal, so the chain is a valid (approximate) MCMC
    chain. Larger scales also mean larger minibatches (s² of Δ* grows with the squared
    step), so a lower target gives smaller batches.

    Parameters
    ----------
    initial : float
        Scale at the start of every chain's tuning (clamped to ``maximum``).
    target : float
        Target acceptance probability. Barker's test accepts less often than Metropolis'
        test for the same proposal (at most 1/2 for tiny steps); for high-dimensional
        random walks its optimal rate is about 0.16 (Agrawal et al., 2023), and about 0.3
        in one or two dimensions.
    t0 : float
        Offset that damps the first updates.
    kappa : float
        Decay exponent of the step sizes, in (0.5, 1].
    maximum : float
        The largest scale (default: none).

    """

    initial: float
    target: float = 0.25
    t0: float = 10.0
    kappa: float = 0.6
    maximum: float = math.inf
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
        self.log_scaling = min(math.log(self.initial), math.log(self.maximum))
        self.count = 0

    @property
    def scaling(self) -> float:
        """Current scale."""
        return math.exp(self.log_scaling)

    #: The tuner's sample stats, declared by the step methods whose proposal uses a scale:
    #: ``scaling``, the scale the proposal used (the tuned scale times a schedule's factor,
    #: clamped by the proposal).
    stats_dtypes_shapes: ClassVar[dict[str, tuple[Any, list[int]]]] = {
        "scaling": (np.float64, []),
    }

    def set_maximum(self, maximum: float) -> None:
        """A new largest scale (the proposal's changed); the current scale is clamped to it."""
        self.maximum = maximum
        self.log_scaling = min(self.log_scaling, math.log(maximum))

    def update(self, accept_prob: float) -> float:
        """Record one tuning step and return the new scale."""
        self.count += 1
        self.log_scaling = min(
            robbins_monro(self.log_scaling, self.count, accept_prob, self.target, t0=self.t0,
                          kappa=self.kappa),
            math.log(self.maximum),
        )
        return self.scaling
