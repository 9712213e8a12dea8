"""The minibatch Barker acceptance test (Seita et al. 2017, Algorithm 1).

Barker's acceptance function ``g(s) = 1 / (1 + e^{-s})`` satisfies detailed balance, and
accepting with probability ``g(Δ)`` is the same as accepting iff ``Δ + X_log > 0`` with
``X_log`` standard logistic. Write ``X_log ≈ X_norm + X_corr`` with ``X_norm ~ N(0, σ²)``
and ``X_corr`` drawn from a precomputed correction distribution ``C_σ``. The minibatch
estimate ``Δ* = (N/b) Σ_B l_i + c`` is approximately ``N(Δ, s²)``; once ``s² < σ²``,
``Δ* + X_nc + X_corr`` with ``X_nc ~ N(0, σ² − s²)`` has approximately the law of
``Δ + X_log``, so the test ``Δ* + X_nc + X_corr > 0`` approximates the exact Barker test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from pymc_minibatch_mh.core.moments import RunningMoments, clt_error_bound
from pymc_minibatch_mh.core.source import MinibatchSource

__all__ = ["BarkerOutcome", "CorrectionSampler", "TestOutcome", "barker_probability", "barker_test"]


class CorrectionSampler(Protocol):
    """What the test needs of a correction distribution."""

    sigma: float

    def sample(self, rng: np.random.Generator) -> float:
        """One draw of ``X_corr``."""
        ...


@dataclass(frozen=True, slots=True)
class TestOutcome:
    """Fields every minibatch acceptance test reports.

    Attributes
    ----------
    accepted : bool
        The decision.
    batch_size : int
        Observations the test consumed in this step (0 when the data-free part alone
        decided, e.g. a proposal outside the prior's support).
    rounds : int
        Number of minibatches drawn (1 when the first one sufficed).
    full_data : bool
        Whether every observation was used (the decision is then the exact one).
    nonfinite : bool
        Whether a NaN or +inf log-likelihood ratio was met; the proposal is then rejected.
    extra_evaluations : int
        Observations evaluated outside the test's minibatch (full passes for bounds or
        designs); 0 for the minibatch Barker test.
    """

    __test__ = False  # not a pytest test class

    accepted: bool
    batch_size: int
    rounds: int
    full_data: bool
    nonfinite: bool
    extra_evaluations: int


@dataclass(frozen=True, slots=True)
class BarkerOutcome(TestOutcome):
    """Result of one minibatch Barker test.

    Attributes
    ----------
    delta_star : float
        The estimate Δ* of the log acceptance ratio Δ.
    variance : float
        Its estimated variance s²(Δ*) (0 when all data were used).
    epsilon : float
        Novak's bound on the normal-approximation error of Δ* (standardised; see
        :func:`~pymc_minibatch_mh.core.moments.clt_error_bound`); 0 at full data.
    edgeworth : float
        First-order Edgeworth estimate of the same error (sharper, not a bound).
    early : bool
        Whether the early-decision rule ended the step.
    accept_prob : float
        ``g(Δ*)``, the Barker acceptance probability at the estimate.
    """

    delta_star: float
    variance: float
    epsilon: float
    edgeworth: float
    early: bool
    accept_prob: float


def barker_probability(delta: float) -> float:
    """Barker's acceptance probability ``g(Δ) = 1 / (1 + exp(-Δ))``, overflow-safe.

    Parameters
    ----------
    delta : float
        Log acceptance ratio.

    Returns
    -------
    float
        The probability.

    Examples
    --------
    >>> barker_probability(0.0)
    0.5
    >>> barker_probability(-1000.0)
    0.0
    """
    if delta >= 0:
        return 1.0 / (1.0 + math.exp(-delta))
    e = math.exp(delta)
    return e / (1.0 + e)


def _rejected(nonfinite: bool, delta_star: float, extra: int = 0) -> BarkerOutcome:
    return BarkerOutcome(
        accepted=False,
        batch_size=0,
        rounds=0,
        full_data=False,
        nonfinite=nonfinite,
        extra_evaluations=extra,
        delta_star=delta_star,
        variance=0.0,
        epsilon=0.0,
        edgeworth=0.0,
        early=False,
        accept_prob=0.0,
    )


def barker_test(
    rng: np.random.Generator,
    source: MinibatchSource,
    data_free: float,
    *,
    batch_size: int,
    correction: CorrectionSampler,
    tolerance: float | None = None,
    early_decision: float | None = None,
) -> BarkerOutcome:
    """Run one minibatch Barker test.

    Parameters
    ----------
    rng : numpy.random.Generator
        Source of the test's randomness (``X_nc``, ``X_corr`` or the logistic draw).
    source : MinibatchSource
        Gives the ratios ``l_i`` of new rows (temperature applied), see
        :mod:`pymc_minibatch_mh.core.source`. The caller has opened the step.
    data_free : float
        The data-free part ``c(θ, θ') = log p0(θ') − log p0(θ) + log q(θ|θ') − log q(θ'|θ)``.
    batch_size : int
        Rows added per round (the paper's m); the first minibatch has this size too.
    correction : CorrectionSampler
        The correction distribution ``C_σ``; its ``sigma`` is the σ of the test.
    tolerance : float, optional
        If given, also grow the minibatch while ``epsilon > tolerance``. Note that
        ``epsilon > 6.4/√b`` always, so a tolerance δ needs ``b > (6.4/δ)²`` rows.
    early_decision : float, optional
        If given (the authors' code uses 5), stop growing as soon as
        ``|Δ*| / s ≥ early_decision`` and, if ``s² ≥ σ²`` still, decide with probability
        ``g(Δ*)`` (a logistic draw, ignoring the remaining noise of Δ*). Under the normal
        approximation the decision probability then differs from the exact ``g(Δ)`` by
        about ``E|g(Δ*) − g(Δ)| ≤ s·g'(|Δ*| − s)·√(2/π)`` roughly ``0.5%`` at ``s = σ = 1``
        and threshold 5, and falls fast as s grows (7e-5 at s = 2). Off by default.

    Returns
    -------
    BarkerOutcome
        The decision and the test's statistics.

    Notes
    -----
    The minibatch grows by ``batch_size`` rows while ``s² ≥ σ²`` (and, with a tolerance,
    while ``epsilon > tolerance``), never past N. With ``s² < σ²`` it accepts iff
    ``Δ* + X_nc + X_corr > 0`` with ``X_nc ~ N(0, σ² − s²)``, ``X_corr ~ C_σ``. When every
    row has been used, ``Δ* = Δ`` and it makes the exact Barker decision with a logistic
    draw (no correction table, hence no table error). A ``−inf`` ratio rejects (the
    proposal has zero likelihood); NaN or ``+inf`` rejects and sets ``nonfinite``.

    References
    ----------
    .. [1] Seita, D., Pan, X., Chen, H., Canny, J. (2017). An Efficient Minibatch
       Acceptance Test for Metropolis-Hastings. UAI 2017, Algorithm 1.
    """
    if not math.isfinite(data_free):
        # -inf: the proposal is outside the prior's support; no data are needed.
        return _rejected(nonfinite=not data_free == -math.inf, delta_star=data_free)

    n_total = source.n_total
    sigma2 = correction.sigma * correction.sigma
    moments = RunningMoments()
    rounds = 0
    variance = math.inf
    epsilon = edgeworth = 0.0
    early = False
    while True:
        count = min(batch_size, n_total - moments.count)
        values, mean, m2 = source.draw(count)
        moments.add(values, mean, m2)
        rounds += 1
        delta_star = n_total * moments.mean + data_free
        if not math.isfinite(delta_star) or math.isnan(moments.m2):
            nonfinite = not delta_star == -math.inf
            return BarkerOutcome(
                accepted=False,
                batch_size=moments.count,
                rounds=rounds,
                full_data=moments.count == n_total,
                nonfinite=nonfinite,
                extra_evaluations=0,
                delta_star=delta_star,
                variance=math.nan,
                epsilon=math.nan,
                edgeworth=math.nan,
                early=False,
                accept_prob=0.0,
            )
        if moments.count >= n_total:
            variance = 0.0
            epsilon = edgeworth = 0.0
            break
        variance = n_total * n_total * moments.mean_variance(n_total)
        if variance < sigma2:
            if tolerance is None:
                break
            epsilon, edgeworth = clt_error_bound(moments.values(), moments.mean)
            if epsilon <= tolerance:
                break
        if early_decision is not None and abs(delta_star) >= early_decision * math.sqrt(variance):
            early = True
            break

    full_data = moments.count >= n_total
    if not full_data and tolerance is None:
        epsilon, edgeworth = clt_error_bound(moments.values(), moments.mean)
    if full_data or variance >= sigma2:
        # Exact Barker decision given Δ* (exact when Δ* = Δ, i.e. at full data).
        accepted = delta_star + rng.logistic() > 0.0
    else:
        x_nc = rng.normal(0.0, math.sqrt(sigma2 - variance))
        accepted = delta_star + x_nc + correction.sample(rng) > 0.0
    return BarkerOutcome(
        accepted=bool(accepted),
        batch_size=moments.count,
        rounds=rounds,
        full_data=full_data,
        nonfinite=False,
        extra_evaluations=0,
        delta_star=delta_star,
        variance=variance,
        epsilon=epsilon,
        edgeworth=edgeworth,
        early=early,
        accept_prob=barker_probability(delta_star),
    )
