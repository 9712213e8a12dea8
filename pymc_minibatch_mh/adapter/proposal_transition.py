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
from collections.abc import Callable
from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from pymc_minibatch_mh.adapter.gaussian_surrogate import GaussianSurrogate
from pymc_minibatch_mh.adapter.proposal_gradient import SurrogateHMCProposal

__all__ = ["SurrogateTransitionProposal"]

_Vec = NDArray[np.float64]


class SurrogateTransitionProposal:
    """``n_inner`` HMC iterations on the surrogate posterior ``π̃``; exact log-q ratio.

    Parameters
    ----------
    log_density : callable
        ``log π̃(x)`` up to a constant (deterministic, data-free).
    grad_log_density : callable
        Its gradient.
    surrogate : GaussianSurrogate
        The Laplace fit; its Cholesky factor preconditions the leapfrog steps.
    n_inner : int
        HMC iterations per proposal.
    n_leapfrog : int
        Leapfrog steps per HMC iteration.
    target : float
        Acceptance rate of the inner Metropolis tests that the step size is tuned to.

    Notes
    -----
    **scale** is ignored: the inner step size is adapted by the proposal itself while the
    step tunes (``tuning`` is set by the step; a Robbins–Monro update of ``log ε`` towards
    ``target`` after each inner test) and fixed afterwards, so the proposal is a fixed
    ``π̃``-reversible kernel whenever draws are kept. The inner tests use their own uniform
    draws from the chain's generator.
    """

    name: ClassVar[str] = "surrogate_transition"

    def __init__(
        self,
        log_density: Callable[[_Vec], float],
        grad_log_density: Callable[[_Vec], _Vec],
        surrogate: GaussianSurrogate,
        *,
        n_inner: int = 4,
        n_leapfrog: int = 4,
        target: float = 0.8,
    ) -> None:
        if int(n_inner) != n_inner or n_inner < 1:
            raise ValueError(f"n_inner must be an integer ≥ 1, got {n_inner}.")
        if not 0.0 < target < 1.0:
            raise ValueError(f"target must be in (0, 1), got {target}.")
        self.log_density = log_density
        self.inner = SurrogateHMCProposal(grad_log_density, surrogate, n_steps=n_leapfrog)
        self.surrogate = surrogate
        self.n_inner = int(n_inner)
        self.target = float(target)
        #: Whether the inner step size adapts (set by the step during its tuning phase).
        self.tuning = False
        self.log_step = math.log(0.5)
        self._count = 0
        self._accepted = 0.0

    @property
    def step_size(self) -> float:
        """The inner leapfrog step size ε (in units of the surrogate's sds)."""
        return math.exp(self.log_step)

    def propose(
        self, rng: np.random.Generator, x: _Vec, scale: float
    ) -> tuple[_Vec, float]:
        """Run the inner chain from ``x``; return its end and ``log π̃(x) − log π̃(x′)``."""
        current = np.asarray(x, dtype=np.float64)
        start = lp = float(self.log_density(current))
        if not math.isfinite(start):
            return current.copy(), -math.inf
        accepted = 0.0
        for _ in range(self.n_inner):
            new, ratio = self.inner.propose(rng, current, self.step_size)
            lp_new = float(self.log_density(new))
            log_a = lp_new - lp + ratio
            prob = math.exp(min(0.0, log_a)) if math.isfinite(log_a) else 0.0
            accepted += prob
            if self.tuning:
                self._count += 1
                self.log_step += (prob - self.target) / (self._count + 10.0) ** 0.6
            if rng.random() < prob:
                current, lp = new, lp_new
        self._accepted = accepted / self.n_inner
        if current is x:
            current = current.copy()
        return current, start - lp

    def stats(self) -> dict[str, float]:
        """``{"step_size": ε}`` of the inner leapfrog steps."""
        return {"step_size": self.step_size}

    def clear_cache(self) -> None:
        """Forget remembered gradients (the surrogate moved)."""
        self.inner.clear_cache()

