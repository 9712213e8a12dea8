r"""The exact audit of a minibatch step: the same proposal decided on the full data.

With ``audit_every=k`` every k-th step of a chain (tuning included) also makes one pass
over all N rows for the proposal it has just decided, computes the full-data
``Δ = c + Σ_i l_i`` and the exact decision, coupled to the minibatch decision, and
records:

``audited``
    whether this step was audited;
``audit_disagree``
    whether the exact decision differs from the minibatch one under the coupling below;
``audit_error``
    the signed error of the acceptance probability given what the minibatch test drew:
    ``P(accept | minibatch) − P_exact(accept)``. Over audited steps its mean is an
    unbiased estimate of the test's bias ``P_mb(accept) − P_exact(accept)`` averaged over
    the chain's proposals;
``audit_delta``
    the full-data Δ;
``audit_kappa3``
    (minibatch Barker test only) the third cumulant of Δ* for this proposal at the
    step's batch size, from the full data
    (:func:`~pymc_minibatch_mh.core.acceptance_error.population_third_cumulant`): the
    size and the sign of the skewness that the error estimate had to guess from the
    minibatch. The bias of the test is first-order in it.

The audit's pass is added to the step's ``extra_evaluations`` stat (N rows).

**The couplings.** AustereMH and MHSubLhd draw ``u`` and accept iff the mean ratio exceeds
``(log u − c)/N``; the exact Metropolis decision with the *same* ``u`` is ``log u < Δ``.
The audit reads the threshold from the test's outcome and draws nothing: the coupling is
exact, ``audit_error`` is ``1[mb accepts] − 1[exact accepts]`` and ``audit_disagree``
is the test's decision error (the quantity their error bounds δ and ε are about).

The minibatch Barker test accepts iff ``Δ* + V > 0``, ``V = X_nc + X_corr`` (or a
logistic draw at full data); the exact Barker test iff ``Δ + X_log > 0``. The coupling is
the common uniform through the inverse CDFs: ``U = H(V)`` (``H`` the CDF of ``V`` given
``s²``) and ``X_log = S⁻¹(U)``. Given the minibatch, the test accepts iff
``U > 1 − p`` with ``p = P(accept | Δ*, s²)``
(:func:`~pymc_minibatch_mh.core.acceptance_error.barker_accept_probability`) and the
exact test iff ``U > 1 − g(Δ)``. The audit realises this coupling without reading ``V``:
it draws ``U`` given the decision, uniform on ``(1 − p, 1]`` after an acceptance and on
``[0, 1 − p)`` after a rejection — the same joint law of the two decisions — from its
own generator (spawned from the chain's, so an audited chain makes the same draws as
an unaudited one). Then ``P(disagree | minibatch) = |p − g(Δ)| = |audit_error|``: the
disagreement rate estimates ``E|p − g(Δ)|``, which is dominated by the minibatch noise of
Δ* (that noise is part of the test, not an error) and only bounds the bias from above.
The bias itself is estimated by the mean of ``audit_error``.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from pymc_minibatch_mh.core.acceptance_error import (
    barker_accept_probability,
    population_third_cumulant,
)
from pymc_minibatch_mh.core.austere import AustereOutcome
from pymc_minibatch_mh.core.barker import BarkerOutcome, TestOutcome
from pymc_minibatch_mh.core.exact import (
    exact_accept_probability,
    full_data_delta,
    metropolis_accepts,
)
from pymc_minibatch_mh.core.penalty import PenaltyCorrection
from pymc_minibatch_mh.core.subsampling import MHSubLhdOutcome

__all__ = ["AUDIT_STATS", "Audit", "check_audit_every"]

#: The stats of the audit and of the per-step error estimate (every minibatch step).
AUDIT_STATS: dict[str, tuple[Any, list[int]]] = {
    "error_estimate": (np.float64, []),
    "audited": (bool, []),
    "audit_disagree": (bool, []),
    "audit_error": (np.float64, []),
    "audit_delta": (np.float64, []),
    "audit_kappa3": (np.float64, []),
}


def check_audit_every(audit_every: Any) -> int | None:
    """Validate ``audit_every``: None (off) or a positive integer.

    Parameters
    ----------
    audit_every : int or None
        The setting.

    Returns
    -------
    int or None
        The setting as an int.

    Raises
    ------
    ValueError
        For a value that is not None or a positive integer.

    """
    if audit_every is None:
        return None
    if isinstance(audit_every, bool) or not isinstance(audit_every, int | np.integer):
        raise ValueError(f"audit_every must be a positive integer or None, got {audit_every!r}.")
    if audit_every < 1:
        raise ValueError(f"audit_every must be at least 1, got {audit_every}.")
    return int(audit_every)


class Audit:
    """Runs the audit every ``every`` steps of a chain (see the module docstring).

    Parameters
    ----------
    every : int or None
        Audit every ``every``-th step; None: never (the step then declares no audit stats).

    """

    #: Stats of a step that was not audited.
    NOT_AUDITED: ClassVar[dict[str, Any]] = {
        "audited": False, "audit_disagree": False, "audit_error": math.nan,
        "audit_delta": math.nan, "audit_kappa3": math.nan,
    }

    #: Stats of a step whose step method has no audit (they are not declared).
    OFF: ClassVar[dict[str, Any]] = {}

    def __init__(self, every: int | None) -> None:
        self.every = every
        self.rng: np.random.Generator | None = None
        self._countdown = every or 0
        #: Rows the last audit evaluated (0 when the step was not audited).
        self.rows = 0

    def start_chain(self, rng: np.random.Generator) -> None:
        """Start a chain: the audit's own generator, spawned from (not drawn from) ``rng``."""
        self._countdown = self.every or 0
        if self.every is None:
            return
        try:
            self.rng = rng.spawn(1)[0]
        except (AttributeError, TypeError):  # a bit generator without a seed sequence
            self.rng = np.random.Generator(rng.bit_generator.jumped())

    def __call__(
        self, estimator: Any, data_free: float, outcome: TestOutcome, correction: Any = None
    ) -> dict[str, Any]:
        """The audit stats of one step (auditing it if it is due).

        Parameters
        ----------
        estimator : RatioEstimator
            The step's estimator, still open for the step (its ``full_pass`` is used).
        data_free : float
            The step's data-free part ``c``.
        outcome : TestOutcome
            The minibatch test's outcome.
        correction : CorrectionDistribution, optional
            The minibatch Barker test's ``C_σ``.

        Returns
        -------
        dict
            The audit stats (:data:`AUDIT_STATS` but ``error_estimate``).

        """
        self.rows = 0
        if self.every is None:
            return self.OFF
        self._countdown -= 1
        if self._countdown > 0:
            return self.NOT_AUDITED
        self._countdown = self.every
        values = estimator.full_pass()
        self.rows = values.shape[0]
        delta = full_data_delta(values, data_free)
        if isinstance(outcome, BarkerOutcome):
            return self._barker(values, delta, outcome, correction)
        threshold = outcome.mu0 if isinstance(outcome, AustereOutcome) else None
        if isinstance(outcome, MHSubLhdOutcome):
            threshold = outcome.psi
        if threshold is None:
            raise TypeError(f"The audit does not know the outcome {type(outcome).__name__}.")
        # The exact rule the test applies at n = N: accept iff the mean ratio exceeds it.
        mean = float(np.mean(values)) if math.isfinite(delta) else math.nan
        exact = metropolis_accepts(delta, mean, threshold)
        return {
            "audited": True, "audit_disagree": exact != outcome.accepted,
            "audit_error": float(outcome.accepted) - float(exact), "audit_delta": delta,
            "audit_kappa3": math.nan,
        }

    def _barker(
        self, values: np.ndarray, delta: float, outcome: BarkerOutcome, correction: Any
    ) -> dict[str, Any]:
        used_logistic = outcome.full_data or outcome.early
        p_mb = barker_accept_probability(
            outcome.delta_star, outcome.variance, correction, exact=used_logistic,
            skew=outcome.skew,
        )
        p_exact = (correction.probability(delta) if isinstance(correction, PenaltyCorrection)
                   and math.isfinite(delta) else exact_accept_probability(delta, "barker"))
        v = float(self.rng.random())  # type: ignore[union-attr]
        u = (1.0 - p_mb) + p_mb * v if outcome.accepted else (1.0 - p_mb) * v
        kappa3 = 0.0
        if not outcome.full_data and math.isfinite(delta):
            kappa3 = population_third_cumulant(values, outcome.batch_size)
        return {
            "audited": True, "audit_disagree": (u > 1.0 - p_exact) != outcome.accepted,
            "audit_error": p_mb - p_exact, "audit_delta": delta, "audit_kappa3": kappa3,
        }
