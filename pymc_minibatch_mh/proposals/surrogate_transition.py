r"""Surrogate transitions: a short MCMC run on the data-free surrogate posterior as proposal.

With control variates, a step holds a *surrogate posterior* ``π̃`` that touches no data:
the prior times the closed-form full-data sum of the expansions. Any Markov kernel ``K̃``
that is reversible with respect to ``π̃`` is a proposal whose density ratio is known
exactly without being computable on its own [1]_ [2]_:

.. math::

    \frac{q(θ \mid θ')}{q(θ' \mid θ)} = \frac{\tilde π(θ)}{\tilde π(θ')} .

So the step's log acceptance ratio becomes
``log π(θ′) − log π(θ) + log π̃(θ) − log π̃(θ′)``: the closed form cancels, and the test
only has to decide on the sum of the *residuals*, which the control variates make small.
:class:`SurrogateTransitionProposal` runs ``n_inner`` iterations of Hamiltonian Monte
Carlo on ``π̃`` (each a few leapfrog steps preconditioned by the Laplace fit, accepted by
an exact Metropolis test on ``π̃``), so one step of the chain can cross the whole
posterior, also where it is curved (a hierarchical model's ridge), at no data cost.

References
----------
.. [1] Liu, J. S. (2001). Monte Carlo Strategies in Scientific Computing, §9.4.3
   (the surrogate transition method). Springer.
.. [2] Christen, J. A., Fox, C. (2005). Markov chain Monte Carlo using an approximation.
   Journal of Computational and Graphical Statistics 14(4), 795-810.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from pymc_minibatch_mh.core.exact import exact_accept_probability
from pymc_minibatch_mh.proposals.base import Proposal, ProposalInfo, ProposalState
from pymc_minibatch_mh.proposals.gradient import SurrogateHMCProposal
from pymc_minibatch_mh.proposals.surrogate import SurrogatePosterior
from pymc_minibatch_mh.proposals.tuning import robbins_monro

__all__ = ["SurrogateTransitionProposal"]

_Vec = NDArray[np.float64]


class SurrogateTransitionProposal(Proposal):
    """``n_inner`` HMC iterations on the surrogate posterior ``π̃``; exact log-q ratio.

    Parameters
    ----------
    posterior : SurrogatePosterior
        The surrogate posterior π̃ (deterministic, data-free): its log density and
        gradient; its Laplace fit's Cholesky factor preconditions the leapfrog steps.
    n_inner : int
        HMC iterations per proposal.
    n_leapfrog : int
        Leapfrog steps per HMC iteration.
    target : float
        Acceptance rate of the inner Metropolis tests that the step size is tuned to.

    Notes
    -----
    **scale** is not used (``uses_scale`` is False): the inner step size is adapted by the
    proposal itself while the step tunes (:meth:`set_tuning`; a Robbins–Monro update of
    ``log ε`` towards ``target`` after each inner test,
    :func:`~pymc_minibatch_mh.proposals.tuning.robbins_monro`), restarts at each chain start
    (:meth:`start_chain`) and is fixed afterwards, so the proposal is a fixed
    ``π̃``-reversible kernel whenever draws are kept. The inner tests use their own uniform
    draws from the chain's generator. ``log π̃`` at the current point travels in the
    state.
    """

    name: ClassVar[str] = "surrogate_transition"
    uses_scale: ClassVar[bool] = False
    transitions_per_draw: ClassVar[int] = 3
    #: The inner step size every chain starts from.
    initial_step_size: ClassVar[float] = 0.5

    def __init__(
        self,
        posterior: SurrogatePosterior,
        *,
        n_inner: int = 4,
        n_leapfrog: int = 4,
        target: float = 0.8,
    ) -> None:
        if int(n_inner) != n_inner or n_inner < 1:
            raise ValueError(f"n_inner must be an integer ≥ 1, got {n_inner}.")
        if not 0.0 < target < 1.0:
            raise ValueError(f"target must be in (0, 1), got {target}.")
        self.log_density = posterior.log_density
        self.surrogate = posterior.laplace
        self.inner = SurrogateHMCProposal(posterior.gradient, posterior.laplace,
                                          n_steps=n_leapfrog)
        self.n_inner = int(n_inner)
        self.target = float(target)
        self._tuning = False
        self.start_chain(None)

    @property
    def step_size(self) -> float:
        """The inner leapfrog step size ε (in units of the surrogate's sds)."""
        return math.exp(self.log_step)

    def start_chain(self, rng: np.random.Generator | None) -> None:
        """A new chain: the inner step size restarts from :attr:`initial_step_size`."""
        self.log_step = math.log(self.initial_step_size)
        self._count = 0

    def set_tuning(self, tuning: bool) -> None:
        """Whether the inner step size adapts."""
        self._tuning = bool(tuning)

    def init(self, x: _Vec) -> ProposalState:
        """The state at ``x`` with ``log π̃(x)``."""
        x = np.asarray(x, dtype=np.float64)
        return ProposalState(x, log_density=float(self.log_density(x)))

    def propose(
        self, rng: np.random.Generator, state: ProposalState, scale: float
    ) -> tuple[ProposalState, ProposalInfo]:
        """Run the inner chain from ``state.x``; its end and ``log π̃(x) − log π̃(x′)``."""
        start = lp = state.log_density
        if math.isnan(start):
            start = lp = float(self.log_density(state.x))
        step = self.step_size
        if not math.isfinite(start):
            return ProposalState(state.x.copy()), ProposalInfo(-math.inf, step_size=step)
        inner = self.inner.init(state.x)
        for _ in range(self.n_inner):
            new, info = self.inner.propose(rng, inner, self.step_size)
            lp_new = float(self.log_density(new.x))
            log_a = lp_new - lp + info.log_q_ratio
            prob = exact_accept_probability(log_a, "metropolis")  # 0 when not finite
            if self._tuning:
                self._count += 1
                self.log_step = robbins_monro(self.log_step, self._count, prob, self.target)
            if rng.random() < prob:
                inner, lp = new, lp_new
        x_new = inner.x if inner.x is not state.x else state.x.copy()
        return ProposalState(x_new, log_density=lp), ProposalInfo(start - lp, step_size=step)
