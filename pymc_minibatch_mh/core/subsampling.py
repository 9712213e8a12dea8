"""MHSubLhd: adaptive subsampling with a concentration bound (Bardenet, Doucet, Holmes 2014).

Like AustereMH, the test compares the mean ratio ``μ = (1/N) Σ l_i`` with the threshold
``ψ = (log u − c) / N``, but it stops when an empirical Bernstein concentration bound
``c_k`` certifies, with probability at least ``1 − δ`` over the whole sequence of checks,
that ``|l̄ − μ| ≤ c_k``: then ``|l̄ − ψ| > c_k`` means ``l̄`` and ``μ`` are on the same side
of ψ. The minibatch grows geometrically (``n ← ⌈γ n⌉``) and the error budget is split as
``δ_k = δ (p − 1) / (p k^p)`` over the checks (``Σ_k δ_k ≤ δ``). The bound needs the
range ``C_{θ,θ'}`` of the ``l_i`` over the whole data set, in general a full pass.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from pymc_minibatch_mh.core import common
from pymc_minibatch_mh.core.common import TestOutcome
from pymc_minibatch_mh.core.moments import RunningMoments
from pymc_minibatch_mh.core.source import MinibatchSource

__all__ = [
    "MHSubLhdOutcome",
    "bernstein_bound",
    "check_budget",
    "mhsublhd_error_estimate",
    "mhsublhd_test",
]


@dataclass(slots=True)
class MHSubLhdOutcome(TestOutcome):
    """Result of one MHSubLhd test.

    Attributes
    ----------
    psi : float
        The threshold ``ψ = (log u − c) / N`` (``u`` drawn first from the generator).
    mean : float
        The mean ``l̄`` of the ratios used (the exact μ when ``full_data``).
    std : float
        Their standard deviation ``σ̂`` (``ddof = 0``) at the last check.
    bound : float
        The concentration bound ``c_k`` of the last check (0 at full data).
    delta_k : float
        The error budget ``δ_k`` of the last check.
    range_bound : float
        ``C_{θ,θ'}``, the bound on ``max_i l_i − min_i l_i`` used.

    """

    psi: float
    mean: float
    std: float
    bound: float
    delta_k: float
    range_bound: float


def bernstein_bound(
    std: float,
    n: int,
    n_total: int,
    delta_k: float,
    range_bound: float,
    *,
    bernstein_serfling: bool = True,
) -> float:
    """Compute the empirical Bernstein bound ``c_k`` on ``|l̄ − μ|`` after ``n`` of N rows.

    Parameters
    ----------
    std : float
        ``σ̂``, the standard deviation (``ddof = 0``) of the ``n`` ratios drawn.
    n : int
        Rows drawn.
    n_total : int
        Population size N.
    delta_k : float
        Error budget of this check.
    range_bound : float
        ``C_{θ,θ'}`` (the range of the ``l_i``).
    bernstein_serfling : bool, optional
        Multiply the first term by ``√ρ_n``, ``ρ_n = 1 − (n − 1)/N`` (sampling without
        replacement, Bardenet and Maillard 2015).

    Returns
    -------
    float
        ``σ̂ √(ρ · 2 log(3/δ_k) / n) + 6 C log(3/δ_k) / n`` (``ρ = 1`` without the
        Bernstein–Serfling factor).

    References
    ----------
    .. [1] Bardenet, R., Doucet, A., Holmes, C. (2014). Towards scaling up Markov chain
       Monte Carlo: an adaptive subsampling approach. ICML 2014, Algorithm 3.
    .. [2] Bardenet, R., Maillard, O.-A. (2015). Concentration inequalities for sampling
       without replacement. Bernoulli 21(3).

    Examples
    --------
    >>> round(bernstein_bound(1.0, 100, 10**6, 0.01, 0.0, bernstein_serfling=False), 4)
    0.3378

    """
    log_term = math.log(3.0 / delta_k)
    rho = 1.0 - (n - 1) / n_total if bernstein_serfling else 1.0
    return std * math.sqrt(rho * 2.0 * log_term / n) + 6.0 * range_bound * log_term / n


def _check_delta(delta: float, p: float, k: int) -> float:
    """``δ_k = δ (p − 1) / (p k^p)``: the error allowed to the k-th check (Σ_k δ_k = δ)."""
    return delta * (p - 1.0) / (p * k**p)


def _next_rows(n: int, gamma: float, n_total: int) -> int:
    """Rows after the next growth: ``min(N, max(n + 1, ⌈γ n⌉))``."""
    return min(n_total, max(n + 1, math.ceil(gamma * n)))


def mhsublhd_test(
    rng: np.random.Generator,
    source: MinibatchSource,
    data_free: float,
    *,
    batch_size: int,
    delta: float = 0.01,
    gamma: float = 1.5,
    p: float = 2.0,
    range_bound: float | Callable[[], float] | None = None,
    bernstein_serfling: bool = True,
) -> MHSubLhdOutcome:
    """Run one MHSubLhd test (Bardenet et al. 2014, Algorithm 3).

    Parameters
    ----------
    rng, source, data_free
        As for every threshold test (:mod:`~pymc_minibatch_mh.core.common`).
    batch_size : int
        Initial minibatch size b.
    delta : float, optional
        Total error budget δ (probability that the decision differs from the exact one).
    gamma : float, optional
        Geometric growth factor γ > 1.
    p : float, optional
        Exponent p > 1 of the split ``δ_k = δ (p − 1) / (p k^p)``.
    range_bound : float or callable, optional
        ``C_{θ,θ'} ≥ max_i l_i − min_i l_i``: a number, a function returning it (e.g. a
        model-specific bound), or None to compute it exactly with a full pass over the
        data (``source.full_pass()``, counted in ``extra_evaluations``).
    bernstein_serfling : bool, optional
        Use the without-replacement factor ``√ρ_n`` in the bound.

    Returns
    -------
    MHSubLhdOutcome
        The decision, the last check's bound and the rows used.

    Notes
    -----
    ``ψ = (log u − c) / N``. With ``n`` rows drawn at check ``k``, ``l̄`` and ``σ̂`` their
    mean and standard deviation (``ddof = 0``, as in the empirical Bernstein inequality),
    the check stops if ``|l̄ − ψ| > c_k`` (see :func:`bernstein_bound`) or ``n = N``;
    otherwise ``⌈γ n⌉ − n`` new rows are drawn (never past N). It accepts iff ``l̄ > ψ``,
    exactly the MH decision at ``n = N``. A ``−inf`` ratio rejects; NaN or ``+inf``
    rejects and sets ``nonfinite`` (also when met by the full pass for ``C``).

    References
    ----------
    .. [1] Bardenet, R., Doucet, A., Holmes, C. (2014). Towards scaling up Markov chain
       Monte Carlo: an adaptive subsampling approach. ICML 2014.
    .. [2] Seita, D., Pan, X., Chen, H., Canny, J. (2017). An Efficient Minibatch
       Acceptance Test for Metropolis-Hastings. UAI 2017, Section 6 (γ = 1.5, p = 2,
       δ = 0.01, C from a full pass).

    Examples
    --------
    >>> import numpy as np
    >>> from pymc_minibatch_mh.core.source import ArraySource
    >>> rng = np.random.default_rng(0)
    >>> ratios = rng.uniform(size=1000)  # all in [0, 1): the range is at most 1
    >>> source = ArraySource(ratios, rng=rng)
    >>> source.start_step()
    >>> out = mhsublhd_test(rng, source, 0.0, batch_size=100, range_bound=1.0)
    >>> out.extra_evaluations, out.batch_size, out.accepted == (out.mean > out.psi)
    (0, 100, True)

    Without ``range_bound`` the range comes from a full pass over the data, counted in
    ``extra_evaluations``:

    >>> source.start_step()
    >>> mhsublhd_test(rng, source, 0.0, batch_size=100).extra_evaluations
    1000

    """
    batch_size = common.check_batch_size(batch_size)
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    if not gamma > 1.0:
        raise ValueError(f"gamma must exceed 1, got {gamma!r}")
    if not p > 1.0:
        raise ValueError(f"p must exceed 1, got {p!r}")
    n_total = source.n_total
    _, psi = common.log_threshold(rng, data_free, n_total)
    # Statistics of a test that rejects before its bound is computed.
    undecided = {"psi": psi, "std": math.nan, "bound": math.nan, "delta_k": math.nan}

    if not math.isfinite(data_free):
        return common.rejection(
            MHSubLhdOutcome, nonfinite=common.is_fault(data_free), mean=math.nan,
            range_bound=math.nan, **undecided,
        )

    extra = 0
    if range_bound is None:
        everything = np.asarray(source.full_pass(), dtype=np.float64)
        extra = n_total
        with np.errstate(invalid="ignore"):
            c_range = float(everything.max() - everything.min())
        if not math.isfinite(c_range):
            return common.rejection(
                MHSubLhdOutcome, nonfinite=common.has_fault(everything), extra_evaluations=extra,
                mean=math.nan, range_bound=c_range, **undecided,
            )
    else:
        c_range = float(range_bound() if callable(range_bound) else range_bound)
        if not c_range >= 0.0:
            raise ValueError(f"range_bound must be non-negative, got {c_range!r}")

    moments = RunningMoments()
    target = min(batch_size, n_total)
    k = 0
    while True:
        values, chunk_mean, chunk_m2 = source.draw(target - moments.count)
        moments.add(values, chunk_mean, chunk_m2)
        k += 1
        n = moments.count
        mean = moments.mean
        if not math.isfinite(mean) or math.isnan(moments.m2):
            return common.rejection(
                MHSubLhdOutcome, nonfinite=mean != -math.inf, batch_size=n, rounds=k,
                full_data=n >= n_total, extra_evaluations=extra, mean=mean,
                range_bound=c_range, **undecided,
            )
        delta_k = _check_delta(delta, p, k)
        std = math.sqrt(max(moments.m2, 0.0) / n)
        if n >= n_total:
            bound = 0.0
            break
        bound = bernstein_bound(
            std, n, n_total, delta_k, c_range, bernstein_serfling=bernstein_serfling
        )
        if abs(mean - psi) > bound:
            break
        target = _next_rows(n, gamma, n_total)
    return MHSubLhdOutcome(
        accepted=bool(mean > psi),
        batch_size=n,
        rounds=k,
        full_data=n >= n_total,
        nonfinite=False,
        extra_evaluations=extra,
        psi=psi,
        mean=mean,
        std=std,
        bound=bound,
        delta_k=delta_k,
        range_bound=c_range,
    )


def mhsublhd_error_estimate(
    outcome: MHSubLhdOutcome,
    n_total: int,
    *,
    batch_size: int,
    delta: float,
    gamma: float,
    p: float,
) -> float:
    """The step's bound on the probability that its MHSubLhd test erred: its own guarantee.

    The test errs only if, at the check where it stops, ``l̄`` and μ lie on different
    sides of ψ, which needs ``|l̄ − μ| > c_k`` at some check ``k``. The empirical
    Bernstein bound makes each of these events at most ``δ_k`` likely, so the error over
    the whole sequence of checks, every look included, is at most ``Σ_k δ_k`` over the
    checks the schedule can make before it reaches all N rows (fewer than δ; see
    :func:`check_budget`). It is a bound, not an estimate: it holds for every
    ``(θ, θ′, u)`` when ``C_{θ,θ′}`` bounds the range of the ratios (always with the
    default full pass; a user's ``range_bound`` must be a true bound), and it is far
    above the actual error (the Bernstein bound is loose).

    Parameters
    ----------
    outcome : MHSubLhdOutcome
        The test's outcome.
    n_total : int
        Population size N.
    batch_size, delta, gamma, p
        The test's settings (initial b, δ, γ, p).

    Returns
    -------
    float
        0 at full data (the decision is exact), NaN when the test used no rows or a
        non-finite value stopped it, else the bound.

    Examples
    --------
    >>> import numpy as np
    >>> from pymc_minibatch_mh.core.source import ArraySource
    >>> rng = np.random.default_rng(0)
    >>> source = ArraySource(rng.uniform(size=1000), rng=rng)
    >>> source.start_step()
    >>> out = mhsublhd_test(rng, source, 0.0, batch_size=100, range_bound=1.0)
    >>> settings = dict(batch_size=100, delta=0.01, gamma=1.5, p=2.0)
    >>> mhsublhd_error_estimate(out, 1000, **settings) == check_budget(1000, **settings)
    True

    """
    if outcome.full_data:
        return 0.0
    if not outcome.batch_size or not math.isfinite(outcome.bound):
        return math.nan
    return check_budget(n_total, batch_size=batch_size, delta=delta, gamma=gamma, p=p)


@lru_cache(maxsize=64)
def check_budget(n_total: int, *, batch_size: int, delta: float, gamma: float, p: float) -> float:
    """``Σ_k δ_k`` over the checks MHSubLhd can make before it has all N rows.

    Parameters
    ----------
    n_total : int
        Population size N.
    batch_size, delta, gamma, p
        Initial b, total error δ, growth factor γ and exponent p of the split
        ``δ_k = δ (p − 1) / (p k^p)``.

    Returns
    -------
    float
        The sum over the checks ``k`` at ``n_k < N`` along the schedule
        ``n_1 = min(b, N)``, ``n_{k+1} = min(N, max(n_k + 1, ⌈γ n_k⌉))`` (a check at
        ``n = N`` is exact and cannot err); 0 if the first minibatch is all the data.

    Examples
    --------
    >>> round(check_budget(10**6, batch_size=50, delta=0.01, gamma=1.5, p=2.0), 5)
    0.00803

    """
    n = min(batch_size, n_total)
    k = 0
    total = 0.0
    while n < n_total:
        k += 1
        total += _check_delta(delta, p, k)
        n = _next_rows(n, gamma, n_total)
    return total
