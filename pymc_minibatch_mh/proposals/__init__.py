"""Proposals: kernels ``(rng, state, scale) -> (state′, info)`` on the flat parameter vector.

:class:`~pymc_minibatch_mh.proposals.base.Proposal` is the interface
(:mod:`~pymc_minibatch_mh.proposals.base`); one module per family;
:func:`~pymc_minibatch_mh.proposals.registry.make_proposal` is what
``proposal=`` (and ``"auto"``) builds; :class:`~pymc_minibatch_mh.proposals.tuning.ScalingTuner`
adapts a proposal's scale from outside.
"""

from pymc_minibatch_mh.proposals.base import Proposal, ProposalInfo, ProposalState
from pymc_minibatch_mh.proposals.crank_nicolson import CrankNicolsonProposal
from pymc_minibatch_mh.proposals.gradient import SurrogateHMCProposal, SurrogateLangevinProposal
from pymc_minibatch_mh.proposals.nuts import SurrogateNUTSProposal
from pymc_minibatch_mh.proposals.random_walk import RandomWalkProposal
from pymc_minibatch_mh.proposals.sgld import StochasticLangevinProposal
from pymc_minibatch_mh.proposals.stiefel import StiefelRandomWalk
from pymc_minibatch_mh.proposals.surrogate import (
    Centring,
    GaussianSurrogate,
    SurrogatePosterior,
)
from pymc_minibatch_mh.proposals.surrogate_transition import SurrogateTransitionProposal

__all__ = [
    "Centring",
    "CrankNicolsonProposal",
    "GaussianSurrogate",
    "Proposal",
    "ProposalInfo",
    "ProposalState",
    "RandomWalkProposal",
    "StiefelRandomWalk",
    "StochasticLangevinProposal",
    "SurrogateHMCProposal",
    "SurrogateLangevinProposal",
    "SurrogateNUTSProposal",
    "SurrogatePosterior",
    "SurrogateTransitionProposal",
]
