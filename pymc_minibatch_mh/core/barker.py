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

from pymc_minibatch_mh.core.moments import clt_error_bound
from pymc_minibatch_mh.core.source import MinibatchSource

__all__ = [
    "BarkerOutcome",
    "CorrectionSampler",
    "TestOutcome",
    "barker_decision",
    "barker_probability",
    "barker_test",
]


class CorrectionSampler(Protocol):
    """What the test needs of a correction distribution."""

    sigma: float

    def sample(self, rng: np.random.Generator) -> float:
        """One draw of ``X_corr``."""
        ...


@dataclass(slots=True)
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


@dataclass(slots=True)
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


def barker_decision(
    rng: np.random.Generator,
    delta_star: float,
    variance: float,
    correction: CorrectionSampler,
    *,
    full_data: bool,
) -> bool:
    """The decision of the minibatch Barker test once the minibatch is fixed.

    Parameters
    ----------
    rng : numpy.random.Generator
        Source of ``X_nc`` and ``X_corr`` (or of the logistic draw).
    delta_star : float
        The estimate Δ*.
    variance : float
        Its variance s².
    correction : CorrectionSampler
        ``C_σ``; its ``sigma`` is σ.
    full_data : bool
        Whether Δ* = Δ (every row was used).

    Returns
    -------
    bool
        ``Δ* + X_nc + X_corr > 0`` when ``s² < σ²``; otherwise (all data used, or an early
        decision) the Barker decision given Δ*, ``Δ* + X_log > 0``.

    """
    sigma2 = correction.sigma * correction.sigma
    if full_data or variance >= sigma2:
        # Exact Barker decision given Δ* (exact when Δ* = Δ, i.e. at full data).
        return bool(delta_star + rng.logistic() > 0.0)
    # sd · N(0, 1): the same value as rng.normal(0, sd), with less call overhead.
    x_nc = math.sqrt(sigma2 - variance) * rng.standard_normal()
    return bool(delta_star + x_nc + correction.sample(rng) > 0.0)


def _joined(chunks: list[np.ndarray]) -> np.ndarray:
    return chunks[0] if len(chunks) == 1 else np.concatenate(chunks)


def rejected_outcome(
    delta_star: float, *, batch_size: int = 0, rounds: int = 0, full_data: bool = False
) -> BarkerOutcome:
    """The outcome of a step stopped by a non-finite Δ* (or data-free part): a rejection.

    ``−inf`` rejects cleanly (zero likelihood or prior); NaN or ``+inf`` also sets
    ``nonfinite``. Before any row was used (``batch_size = 0``) the spread stats are 0;
    after, they are NaN.
    """
    spread = 0.0 if batch_size == 0 else math.nan
    return BarkerOutcome(
        accepted=False,
        batch_size=batch_size,
        rounds=rounds,
        full_data=full_data,
        nonfinite=not delta_star == -math.inf,
        extra_evaluations=0,
        delta_star=delta_star,
        variance=spread,
        epsilon=spread,
        edgeworth=spread,
        early=False,
        accept_prob=0.0,
    )


def decided_outcome(
    rng: np.random.Generator,
    correction: CorrectionSampler,
    *,
    delta_star: float,
    variance: float,
    batch_size: int,
    rounds: int,
    full_data: bool,
    epsilon: float,
    edgeworth: float,
    early: bool,
) -> BarkerOutcome:
    """The outcome of a step whose minibatch is fixed: the decision and the stats.

    The decision is drawn by :func:`barker_decision`.
    """
    return BarkerOutcome(
        accepted=barker_decision(rng, delta_star, variance, correction, full_data=full_data),
        batch_size=batch_size,
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
        ``g(Δ*)`` (a logistic draw that ignores the remaining noise of Δ*). If Δ is
        normal around Δ* with sd s, the acceptance probability of that step is off by
        ``E|g(Δ*) − g(Δ)|``: with threshold 5 this is 7.3e-3 at s = 1, 1.5e-3 at
        s = 1.5, 3.2e-4 at s = 2 and 2.6e-5 at s = 3 (and 4.4e-2 at s = 1 with threshold
        3), far above the correction table's error; hence off by default.

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
        return rejected_outcome(data_free)

    n_total = source.n_total
    sigma2 = correction.sigma * correction.sigma
    # The running moments are kept in locals (the parallel update of RunningMoments,
    # inlined): this loop runs several times per MCMC step.
    chunks: list[np.ndarray] = []
    n = 0
    mean = m2 = 0.0
    fpc_scale = n_total * n_total / (n_total - 1) if n_total > 1 else 0.0
    rounds = 0
    variance = math.inf
    epsilon = edgeworth = 0.0
    early = False
    while True:
        count = min(batch_size, n_total - n)
        values, c_mean, c_m2 = source.draw(count)
        chunks.append(values)
        rounds += 1
        if n == 0:
            n, mean, m2 = count, c_mean, c_m2
        else:
            total = n + count
            diff = c_mean - mean
            mean += diff * count / total
            m2 += c_m2 + diff * diff * n * count / total
            n = total
        delta_star = n_total * mean + data_free
        if not math.isfinite(delta_star) or math.isnan(m2):
            return rejected_outcome(
                delta_star, batch_size=n, rounds=rounds, full_data=n == n_total
            )
        if n >= n_total:
            variance = 0.0
            break
        # s² = N² · var̂ / n · (1 − (n − 1)/(N − 1)) = N²/(N − 1) · var̂ · (N − n)/n
        variance = fpc_scale * (m2 / (n - 1)) * (n_total - n) / n if n > 1 else math.inf
        if variance < sigma2:
            if tolerance is None:
                break
            epsilon, edgeworth = clt_error_bound(_joined(chunks), mean)
            if epsilon <= tolerance:
                break
        if early_decision is not None and abs(delta_star) >= early_decision * math.sqrt(variance):
            early = True
            break

    full_data = n >= n_total
    if full_data:
        epsilon = edgeworth = 0.0
    else:
        # ε of the final minibatch (the loop may have stopped before computing it).
        epsilon, edgeworth = clt_error_bound(_joined(chunks), mean)
    return decided_outcome(
        rng, correction, delta_star=delta_star, variance=variance, batch_size=n,
        rounds=rounds, full_data=full_data, epsilon=epsilon, edgeworth=edgeworth, early=early,
    )
