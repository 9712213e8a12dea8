r"""Stochastic-gradient Langevin proposals, corrected by a (minibatch) Metropolis-Hastings test.

Stochastic Gradient Langevin Dynamics (SGLD; Welling and Teh 2011 [1]_) moves with the
gradient of the log posterior estimated on a minibatch and accepts every move; its bias
grows with the step size. Korattikara, Chen and Welling (2014, §5.4 [2]_) treat the SGLD move
as a Metropolis-Hastings *proposal*: given a minibatch :math:`X_n` of ``n`` rows drawn
uniformly without replacement,

.. math::

    q(θ' \mid θ, X_n) = N\Bigl(θ + \tfrac{α}{2}\, ∇_θ\Bigl\{\tfrac{N}{n}
        \sum_{x \in X_n} \frac{\log p(x \mid θ)}{K} + \log ρ(θ)\Bigr\},\; α I\Bigr),

and the proposal kernel is the mixture of these components over minibatches. A mixture
kernel satisfies detailed balance if each of its components does, so the test may use
the log-q ratio of the component of the minibatch actually drawn,
:math:`\log q(θ \mid θ', X_n) − \log q(θ' \mid θ, X_n)`, with the reverse drift computed
at θ′ on the *same* rows. With this ratio any acceptance test of the package (exact or
minibatch) corrects the SGLD bias.

Classes
-------
StochasticLangevinProposal
    The SGLD proposal with its exact per-minibatch log-q ratio.

References
----------
.. [1] Welling, M., Teh, Y. W. (2011). Bayesian learning via stochastic gradient Langevin
   dynamics. ICML 2011.
.. [2] Korattikara, A., Chen, Y., Welling, M. (2014). Austerity in MCMC Land: Cutting the
   Metropolis-Hastings Budget. ICML 2014, Section 5.4, equations (13)-(14).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
import pytensor.tensor as pt
from numpy.typing import NDArray
from pytensor.gradient import grad

from pymc_minibatch_mh.core.rows import PartialShuffleRows
from pymc_minibatch_mh.model.checks import check_batch_size, check_temperature
from pymc_minibatch_mh.model.graph import checks_as_ninf
from pymc_minibatch_mh.model.internals import direct_call
from pymc_minibatch_mh.model.likelihood import MinibatchLikelihood
from pymc_minibatch_mh.proposals.base import Proposal, ProposalInfo, ProposalState, check_scale
from pymc_minibatch_mh.proposals.gradient import langevin_log_q_ratio

__all__ = ["StochasticLangevinProposal"]

_Vec = NDArray[np.float64]


class StochasticLangevinProposal(Proposal):
    r"""SGLD proposal on a fresh minibatch, with the exact log-q ratio of its component.

    Parameters
    ----------
    likelihood : MinibatchLikelihood
        The compiled likelihood of the step (``step.likelihood``): its graphs give the
        gradient, its row store the rows.
    batch_size : int
        Rows ``n`` of the minibatch of each proposal, drawn uniformly without replacement
        (``1 ≤ n ≤ N``; checked against the store's N whenever N changes, e.g. after
        ``pm.set_data`` at a chain start).
    temperature : float
        K > 0: the likelihood's gradient is divided by K (the prior's is not), as in the
        step's target. Use the step's temperature (:meth:`for_step` does).

    Attributes
    ----------
    name : str
        ``"sgld"``.
    n_grad_evals : int
        Minibatch gradients evaluated so far (two per proposal).
    last_rows : numpy.ndarray
        The row indices of the last proposal's minibatch (a copy).

    Notes
    -----
    **scale** is the step size α: the variance of the Gaussian noise (its standard
    deviation is ``√α``) and twice the multiplier of the gradient, as in eq. (13) of [2]_.
    A step passes ``scaling`` (times a temperature schedule's factor), so build the step
    with ``scaling=α`` and ``tune=False`` (the tuner would adapt α towards the step's
    ``target_accept``); ``S`` and the step's random-walk proposal are not used.

    **The move.** With ``g(θ) = (N/n) Σ_{x∈X_n} ∇log p(x|θ)/K + ∇log ρ(θ)`` on the
    proposal's own minibatch ``X_n`` (ρ: the priors with the Jacobians of the transforms
    and the Potentials, on the flat transformed space),

    .. math::

        θ' = θ + \tfrac{α}{2} g(θ) + \sqrt{α}\, ξ, \qquad ξ \sim N(0, I),

    and, with ``g′ = g(θ′)`` on the same rows, the log-q ratio is

    .. math::

        \log\frac{q(θ\mid θ', X_n)}{q(θ'\mid θ, X_n)}
        = \tfrac12\lVert ξ\rVert^2
          - \tfrac12\Bigl\lVert ξ + \tfrac{\sqrt{α}}{2}(g + g')\Bigr\rVert^2 ,

    since the backward residual ``θ − θ′ − (α/2)g′`` equals ``−√α (ξ + (√α/2)(g + g′))``.
    The minibatch is drawn from the chain's generator (the ``rng`` of :meth:`propose`),
    independently of the rows the acceptance test draws; each proposal costs two
    gradients on ``n`` rows, no full pass. If the gradient at θ is not finite the
    proposal is θ itself with ratio ``−inf``; if it is not finite at θ′, the ratio is
    ``−inf`` (a sure rejection).

    Used alone in a loop (every move accepted) this is plain SGLD.

    References
    ----------
    .. [1] Welling, M., Teh, Y. W. (2011). Bayesian learning via stochastic gradient
       Langevin dynamics. ICML 2011.
    .. [2] Korattikara, A., Chen, Y., Welling, M. (2014). Austerity in MCMC Land: Cutting
       the Metropolis-Hastings Budget. ICML 2014, Section 5.4.

    Examples
    --------
    Build a step with ``scaling=α`` and no tuning, then replace its proposal:

    >>> with model:  # doctest: +SKIP
    ...     step = AustereMH(batch_size=500, epsilon=0.1, scaling=5e-6, tune=False)
    ...     step.proposal = StochasticLangevinProposal.for_step(step, batch_size=500)
    ...     idata = pm.sample(step=step, tune=0)

    """

    name: ClassVar[str] = "sgld"

    def __init__(
        self,
        likelihood: MinibatchLikelihood,
        *,
        batch_size: int,
        temperature: float = 1.0,
    ) -> None:
        if not isinstance(likelihood, MinibatchLikelihood):
            raise TypeError(
                "likelihood must be a MinibatchLikelihood (a step's `likelihood`), got "
                f"{type(likelihood).__name__}."
            )
        self.likelihood = likelihood
        self.store = likelihood.store
        self.batch_size = check_batch_size(batch_size)
        self.temperature = check_temperature(temperature)
        self.dim = likelihood.point_map.size
        self._check_rows(self.store.n_rows)
        self._rows: PartialShuffleRows | None = None
        self.n_grad_evals = 0
        self.last_rows: NDArray[np.int64] = np.empty(0, dtype=np.int64)
        self._grad_fn = direct_call(self._compile(likelihood))

    @classmethod
    def for_step(cls, step: Any, *, batch_size: int) -> StochasticLangevinProposal:
        """The proposal for ``step``: its likelihood and its (current) temperature.

        Parameters
        ----------
        step : MinibatchStep
            A step method of the package (its ``likelihood`` and ``temperature`` are read); assign
            the result to ``step.proposal``.
        batch_size : int
            Rows of each proposal's minibatch.

        Returns
        -------
        StochasticLangevinProposal
            With ``temperature=step.temperature`` (a temperature schedule is not followed:
            the proposal keeps the temperature it was built with).

        """
        return cls(step.likelihood, batch_size=batch_size, temperature=step.temperature)

    # ------------------------------------------------------------------ compile
    @staticmethod
    def _compile(likelihood: MinibatchLikelihood) -> Any:
        """``(flat, *rows) -> (∇Σ log p(x|θ), ∇log ρ(θ))`` on a batch, compiled once."""
        g = likelihood.graphs
        (row_loglik,) = checks_as_ninf([g.row_loglik])
        (prior,) = checks_as_ninf([g.prior])
        grad_lik = grad(pt.sum(row_loglik), g.flat, disconnected_inputs="ignore")
        grad_prior = grad(prior, g.flat, disconnected_inputs="ignore")
        return likelihood.compile([g.flat, *g.data], [grad_lik, grad_prior])

    def _check_rows(self, n_rows: int) -> None:
        if self.batch_size > n_rows:
            raise ValueError(
                f"batch_size={self.batch_size} of the SGLD proposal is larger than the number "
                f"of observations N={n_rows}. Use a batch_size between 1 and N."
            )

    # --------------------------------------------------------------- proposal
    def draw_rows(self, rng: np.random.Generator) -> NDArray[np.int64]:
        """``batch_size`` row indices, uniformly without replacement (from ``rng``).

        Reads the store's N now, so data replaced at a chain start are drawn from.
        """
        n_rows = self.store.n_rows
        rows = self._rows
        if rows is None or rows.n_rows != n_rows:
            self._check_rows(n_rows)
            rows = self._rows = PartialShuffleRows(n_rows, rng)
        rows.rng = rng  # the chain's generator (pm.sample gives each chain its own)
        rows.start_step()
        return rows.take(self.batch_size)

    def gradient(self, x: _Vec, rows: NDArray[np.int64]) -> _Vec:
        """``g(x) = (N/n) Σ_rows ∇log p(x_i|θ)/K + ∇log ρ(θ)`` at the flat state ``x``.

        Parameters
        ----------
        x : ndarray, shape (d,)
            Flat, transformed state.
        rows : ndarray of int
            Row indices of the minibatch (``n = len(rows)``).

        Returns
        -------
        ndarray, shape (d,)
            The estimated gradient of the tempered log posterior.

        """
        self.n_grad_evals += 1
        grad_lik, grad_prior = self._grad_fn(x, *self.store.rows(rows))
        weight = self.store.n_rows / (rows.shape[0] * self.temperature)
        return weight * grad_lik + grad_prior

    def propose(
        self, rng: np.random.Generator, state: ProposalState, scale: float
    ) -> tuple[ProposalState, ProposalInfo]:
        """θ′ by one SGLD move from ``θ = state.x``, and the log-q ratio.

        :meth:`Proposal.propose <pymc_minibatch_mh.proposals.base.Proposal.propose>` with:
        the minibatch and the ``d`` standard normals ξ drawn from ``rng``; nothing carried
        by the states (each proposal draws its own minibatch, so no gradient can be
        reused); ``scale`` the step size α > 0 (noise variance); the info's ratio
        ``log q(θ|θ′, X_n) − log q(θ′|θ, X_n)`` for the minibatch drawn, with α.

        Raises
        ------
        ValueError
            If ``scale`` is not a positive finite number, or ``batch_size`` exceeds N.

        """
        alpha = check_scale(scale, "The SGLD step size α")
        x = state.x
        rows = self.draw_rows(rng)
        self.last_rows = rows.copy()
        g = self.gradient(x, rows)
        xi = rng.standard_normal(self.dim)
        if not np.all(np.isfinite(g)):
            return ProposalState(x.copy()), ProposalInfo(-math.inf, alpha, step_size=alpha)
        root = math.sqrt(alpha)
        x_new = x + 0.5 * alpha * g + root * xi
        g_new = self.gradient(x_new, rows)
        if not np.all(np.isfinite(g_new)):
            return ProposalState(x_new), ProposalInfo(-math.inf, alpha, step_size=alpha)
        # In units of √α: θ′ = θ + √α((√α/2) g + ξ), the Langevin move with h = √α.
        ratio = langevin_log_q_ratio(xi, root, g, g_new)
        return ProposalState(x_new), ProposalInfo(ratio, alpha, step_size=alpha)
