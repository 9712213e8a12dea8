r"""The proposal interface: a kernel ``(rng, state, scale) -> (state′, info)``.

A proposal draws θ′ from ``q(· | θ)`` on the flat, transformed parameter vector and
reports ``log q(θ | θ′) − log q(θ′ | θ)`` (0 for a symmetric proposal), which the step
adds to the data-free part of the log acceptance ratio. The interface follows blackjax's
kernels: what is carried from one call to the next is an explicit, immutable
:class:`ProposalState` (the point and what the proposal computed there: the surrogate's
log density, its whitened gradient, the whitened point), and what is only reported is a
:class:`ProposalInfo`. The step keeps the state of the current point: the proposed state
when the test accepts, the old one otherwise; it builds a fresh one with
:meth:`Proposal.init` whenever the point or the target behind it changed (a chain start, a
re-centring of the control variates, another step of a compound step that changed the
variables the prior reads). Nothing is cached inside a proposal.

What a proposal needs of the step is declared, never probed:

- :attr:`Proposal.uses_scale`: whether the step's
  :class:`~pymc_minibatch_mh.proposals.tuning.ScalingTuner` adapts ``scale`` (and the
  step reports it as the ``scaling`` stat); a proposal that adapts itself (NUTS, the
  surrogate transition) says False and ignores ``scale``;
- :attr:`Proposal.max_scale`: the largest ``scale`` that means something (the tuner stays
  below it; Crank–Nicolson's is 1);
- :attr:`Proposal.surrogate`: the Laplace fit a proposal moves around (None for the random
  walk): tuned chains start from it (:meth:`Proposal.start_point`);
- :attr:`Proposal.transitions_per_draw`: what ``steps_per_draw="auto"`` uses;
- :attr:`Proposal.reports_parameters`: whether the step reports its ρ and step size;
- :meth:`Proposal.start_chain` and :meth:`Proposal.set_tuning`: every proposal's own
  adaptation restarts at each chain start and stops with PyMC's tuning phase (no-ops for
  a proposal that adapts nothing).

A new proposal subclasses :class:`~pymc_minibatch_mh.proposals.base.Proposal` and implements
:meth:`~pymc_minibatch_mh.proposals.base.Proposal.propose`; the
guide's "Proposals" page shows one.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:
    from pymc_minibatch_mh.proposals.surrogate import GaussianSurrogate

__all__ = ["Proposal", "ProposalInfo", "ProposalState", "check_scale"]

_Vec = NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class ProposalState:
    """A point and what a proposal computed there, carried to the next call.

    Attributes
    ----------
    x : ndarray, shape (d,)
        The flat, transformed point.
    log_density : float
        ``log π̃(x)`` of the surrogate posterior, for proposals whose ratio uses it
        (NaN otherwise).
    gradient : ndarray or None
        ``Lᵀ∇log π̃(x)``, the whitened gradient of the surrogate posterior (MALA, HMC).
    whitened : ndarray or None
        ``L⁻¹(x − θ̂)``, the point in the Laplace fit's whitened coordinates
        (Crank–Nicolson).
    carry : object or None
        Anything else a proposal carries to its next call at this point, in its own
        form (the surrogate NUTS's coordinates, density and gradient).

    """

    x: _Vec
    log_density: float = math.nan
    gradient: _Vec | None = None
    whitened: _Vec | None = None
    carry: Any = None


@dataclass(frozen=True, slots=True)
class ProposalInfo:
    """What one proposal reports: its log-q ratio and the parameters it used.

    Attributes
    ----------
    log_q_ratio : float
        ``log q(θ | θ′) − log q(θ′ | θ)`` (for HMC the kinetic-energy difference), in the
        units of the untempered log posterior; ``−inf`` is a sure rejection.
    scale : float
        The ``scale`` the proposal used (after clamping); NaN if it uses none.
    rho : float
        Crank–Nicolson's autoregression coefficient ρ (NaN for the others).
    step_size : float
        The step size of a gradient-based proposal (NaN for the others).

    """

    log_q_ratio: float
    scale: float = math.nan
    rho: float = math.nan
    step_size: float = math.nan


def check_scale(scale: float, what: str) -> float:
    """``scale`` as a float, or a ValueError naming ``what`` if it is not positive and finite."""
    scale = float(scale)
    if not (scale > 0.0 and math.isfinite(scale)):
        raise ValueError(
            f"{what} (the proposal's `scale`) must be a positive finite number, got {scale}."
        )
    return scale


class Proposal(ABC):
    """Base class of the proposals (see the module docstring).

    A subclass sets :attr:`name` and implements :meth:`propose`; it overrides
    :meth:`init` when its ratio needs values at the current point, and
    :meth:`start_chain` / :meth:`set_tuning` when it adapts itself.
    """

    #: The proposal's name; the step's ``proposal`` stat reports its code
    #: (:data:`~pymc_minibatch_mh.proposals.registry.PROPOSAL_CODES`).
    name: ClassVar[str] = "custom"
    #: Whether the step's scale tuner adapts ``scale`` (False: ``scale`` is ignored).
    uses_scale: ClassVar[bool] = True
    #: The largest meaningful ``scale``; the tuner stays at or below it.
    max_scale: ClassVar[float] = math.inf
    #: Whether the step reports the proposal's code, ρ and step size as stats
    #: (``proposal``, ``rho``, ``step_size``; NaN where not the proposal's own).
    reports_parameters: ClassVar[bool] = True
    #: Transitions per draw that ``steps_per_draw="auto"`` gives this proposal.
    transitions_per_draw: ClassVar[int] = 1
    #: The Gaussian (Laplace) fit the proposal moves around, or None.
    surrogate: GaussianSurrogate | None = None
    #: Evaluations of the surrogate posterior π̃ since the proposal was built (density,
    #: gradient or both at one point count once: a leapfrog step is one); a diagnostic:
    #: π̃ reads no rows. Proposals that do not evaluate π̃ leave it at 0.
    density_evaluations: int = 0

    def init(self, x: _Vec) -> ProposalState:
        """The state at ``x`` (a chain start, or after the target changed)."""
        return ProposalState(np.asarray(x, dtype=np.float64))

    @abstractmethod
    def propose(
        self, rng: np.random.Generator, state: ProposalState, scale: float
    ) -> tuple[ProposalState, ProposalInfo]:
        """The proposed state and what the proposal used.

        Parameters
        ----------
        rng : numpy.random.Generator
            The source of the proposal's random draws.
        state : ProposalState
            The current point ``θ = state.x`` (not modified) and what the proposal
            computed there (see :meth:`init`).
        scale : float
            What the step's scale tuner adapts (ignored when :attr:`uses_scale` is
            False); each proposal says what it means.

        Returns
        -------
        state : ProposalState
            The proposal θ′ (its ``x`` a new array) and what the proposal computed there.
        info : ProposalInfo
            The log-q ratio ``log q(θ | θ′) − log q(θ′ | θ)`` and the parameters used.

        """

    def start_chain(self, rng: np.random.Generator) -> None:  # noqa: B027 (optional hook)
        """A new chain: restart the proposal's own adaptation (generators spawned from ``rng``)."""

    def set_tuning(self, tuning: bool) -> None:  # noqa: B027 (optional hook)
        """Whether the proposal's own adaptation runs (PyMC's tuning phase)."""

    def start_point(self, rng: np.random.Generator) -> _Vec | None:
        """Where a tuned chain starts: the Laplace fit's reference θ̂ (None: PyMC's start).

        Tuning draws are discarded, so any start is valid. θ̂ is where the control
        variates' set-up read every row, so the step's start check needs no full pass
        there (``check_start``), and it is near the posterior's bulk (within a posterior sd
        of the mode). Not a draw of the Laplace
        fit: on a hierarchical model that fit is poor, and a draw far from the data's fit
        (where the expansions are poor) can hold the chain, since from there every move
        towards θ̂ lowers the residual and is rejected.
        """
        sur = self.surrogate
        if sur is None:
            return None
        return sur.reference.copy()
