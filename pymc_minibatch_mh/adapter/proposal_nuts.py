r"""Surrogate NUTS: one iteration of PyMC's NUTS on the data-free surrogate posterior.

The surrogate transition (:mod:`~pymc_minibatch_mh.adapter.proposal_transition`) makes
any kernel that is reversible with respect to the surrogate posterior ``π̃`` a proposal
with the exact ratio ``q(θ | θ′)/q(θ′ | θ) = π̃(θ)/π̃(θ′)``. Its fixed HMC trajectories
preconditioned by the Laplace fit fail where the posterior is curved: on a hierarchical
model's ridge in (μ, log τ, z) the right step size and trajectory length change along the
ridge. NUTS chooses the trajectory's length at every iteration, and PyMC's NUTS adapts
its step size and a diagonal mass matrix while tuning: :class:`SurrogateNUTSProposal`
runs one iteration of ``pymc.NUTS`` on a model whose only term is ``log π̃`` (the prior,
with Jacobians, plus the closed-form full-data sum of the control variates' expansions,
as a PyTensor graph). It touches no data: a leapfrog step costs the gradient of the
closed form, O(k²) for k coefficients, against O(N) for NUTS on the model itself.

Correctness: after tuning, NUTS with a fixed step size (randomly jittered, independently
of the state) and mass matrix is reversible with respect to its target, so the log-q ratio
``log π̃(θ) − log π̃(θ′)`` is exact and the minibatch test decides on the residuals alone.
While tuning, the kernel adapts and is not reversible; tuning draws are discarded, as for
every tuned proposal. The inner sampler's randomness comes from a generator spawned from
the chain's generator at the chain start (:meth:`SurrogateNUTSProposal.start_chain`).
"""

from __future__ import annotations

import warnings
from typing import Any, ClassVar

import numpy as np
import pymc as pm
from numpy.typing import NDArray

from pymc_minibatch_mh.adapter.compat import start_inner_chain
from pymc_minibatch_mh.adapter.gaussian_surrogate import GaussianSurrogate
from pymc_minibatch_mh.adapter.graph import clone_replace

__all__ = ["SurrogateNUTSProposal"]

_Vec = NDArray[np.float64]


class SurrogateNUTSProposal:
    """One NUTS iteration on the surrogate posterior ``π̃``; exact log-q ratio.

    Parameters
    ----------
    step : MinibatchStep
        A step with control variates (their closed form and θ̂).
    surrogate : GaussianSurrogate, optional
        The Laplace fit (default: the step's): NUTS's dense mass matrix starts from its
        covariance, and chains start at its mean θ̂.
    n_inner : int
        NUTS iterations per proposal (their composition is reversible too).
    target_accept : float
        NUTS's target acceptance (its step-size adaptation), PyMC's default 0.8.
    max_treedepth : int
        NUTS's largest tree depth.

    """

    name: ClassVar[str] = "surrogate_nuts"

    def __init__(self, step: Any, surrogate: GaussianSurrogate | None = None, *,
                 n_inner: int = 1, target_accept: float = 0.8, max_treedepth: int = 10) -> None:
        if int(n_inner) != n_inner or n_inner < 1:
            raise ValueError(f"n_inner must be an integer ≥ 1, got {n_inner}.")
        cv = step.control_variate
        if cv is None:
            raise ValueError("SurrogateNUTSProposal follows the control variates' closed form: "
                             "it needs control_variate='taylor'.")
        if surrogate is None:
            surrogate = GaussianSurrogate(np.asarray(cv.reference.theta, dtype=np.float64),
                                          cv.laplace_covariance(step.temperature))
        self.surrogate = surrogate
        self.n_inner = int(n_inner)
        lik = step.likelihood
        flat = lik.graphs.flat
        log_density = lik.graphs.prior + cv.proxy_graph(flat) * float(step._inv_temperature)
        dim = lik.point_map.size
        with pm.Model(model=None) as self.model:  # a model of its own, never a submodel
            x = pm.Flat("x", shape=(dim,), initval=surrogate.theta_hat)
            pm.Potential("surrogate", clone_replace(log_density, {flat: x}))
        # A dense mass matrix, adapted while tuning from the Laplace covariance: on a
        # hierarchical ridge it measured 3 × the effective samples of a diagonal one.
        with warnings.catch_warnings():  # "an experimental feature": tested here
            warnings.filterwarnings("ignore", "QuadPotentialFullAdapt", UserWarning)
            potential = pm.step_methods.hmc.quadpotential.QuadPotentialFullAdapt(
                dim, surrogate.theta_hat, surrogate.cov.copy(), 10
            )
        self.nuts = pm.NUTS(vars=[x], model=self.model, target_accept=target_accept,
                            max_treedepth=max_treedepth, potential=potential)
        self._adaptation_window = potential.adaptation_window
        self._log_density = self.model.compile_logp()
        #: Whether NUTS adapts (set by the step during its tuning phase).
        self.tuning = False

    def log_density(self, x: _Vec) -> float:
        """``log π̃(x)`` up to a constant."""
        return float(self._log_density({"x": x}))

    def start_point(self) -> _Vec:
        """Where a tuned chain starts: θ̂.

        Not a draw of the Laplace fit: on a hierarchical model that fit is poor, and a
        draw far from the data's fit (where the expansions are poor) can hold the chain,
        since from there every move towards θ̂ lowers the residual and is rejected.
        """
        return self.surrogate.theta_hat.copy()

    def start_chain(self, rng: np.random.Generator) -> None:
        """A new chain: NUTS's adaptation restarts, its draws from a spawned generator."""
        start_inner_chain(self.nuts, rng.spawn(1)[0])
        # PyMC's reset leaves the mass matrix's adaptation window as the last chain
        # doubled it; restored, the chains in one process (cores=1) adapt as in fresh
        # processes (cores>1), so both give the same draws.
        self.nuts.potential.adaptation_window = self._adaptation_window
        self.nuts.reset_tuning()

    @property
    def step_size(self) -> float:
        """NUTS's (adapted) leapfrog step size."""
        return float(self.nuts.step_size)

    def propose(self, rng: np.random.Generator, x: _Vec, scale: float) -> tuple[_Vec, float]:
        """One NUTS iteration from ``x``; its end and ``log π̃(x) − log π̃(x′)``."""
        self.nuts.tune = self.tuning
        new = {"x": np.asarray(x, dtype=np.float64)}
        for _ in range(self.n_inner):
            new, _ = self.nuts.step(new)
        x_new = np.array(new["x"], dtype=np.float64)
        return x_new, self.log_density(x) - self.log_density(x_new)

    def stats(self) -> dict[str, float]:
        """``{"step_size": ε}`` of NUTS."""
        return {"step_size": self.step_size}
