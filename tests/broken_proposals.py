"""Deliberately broken proposals, to show that a statistical test can fail.

:class:`AlteredRatio` wraps a proposal and changes the log-q ratio it reports (dropped:
replaced by 0; flipped: sign reversed), leaving its moves, its state and everything it
declares to the step unchanged. ``"exact"`` leaves the ratio alone, so a test can be
parametrized over the correct proposal and its broken variants with one code path.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from pymc_minibatch_mh.proposals.base import Proposal, ProposalInfo, ProposalState

#: How the ratio is altered: exact (unchanged), dropped (0), flipped (−ratio).
ALTERATIONS = ("exact", "dropped", "flipped")


def alter(log_q_ratio: float, how: str) -> float:
    """The log-q ratio as the broken variant ``how`` reports it."""
    if how == "exact":
        return log_q_ratio
    if how == "dropped":
        return 0.0
    if how == "flipped":
        return -log_q_ratio
    raise ValueError(f"how must be one of {ALTERATIONS}, got {how!r}.")


class AlteredRatio(Proposal):
    """``inner`` with its reported log-q ratio altered as ``how`` says (see :func:`alter`)."""

    def __init__(self, inner: Proposal, how: str) -> None:
        alter(0.0, how)  # checks `how`
        self.inner = inner
        self.how = how
        self.name = inner.name
        self.uses_scale = inner.uses_scale
        self.max_scale = inner.max_scale
        self.reports_parameters = inner.reports_parameters
        self.transitions_per_draw = inner.transitions_per_draw
        self.surrogate = inner.surrogate

    def init(self, x: np.ndarray) -> ProposalState:
        return self.inner.init(x)

    def propose(
        self, rng: np.random.Generator, state: ProposalState, scale: float
    ) -> tuple[ProposalState, ProposalInfo]:
        new, info = self.inner.propose(rng, state, scale)
        return new, dataclasses.replace(info, log_q_ratio=alter(info.log_q_ratio, self.how))

    def start_chain(self, rng: np.random.Generator) -> None:
        self.inner.start_chain(rng)

    def set_tuning(self, tuning: bool) -> None:
        self.inner.set_tuning(tuning)

    def start_point(self, rng: np.random.Generator) -> np.ndarray | None:
        return self.inner.start_point(rng)
