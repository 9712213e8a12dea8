"""AustereMH: the sequential t-test of Korattikara, Chen and Welling (2014).

The Metropolis–Hastings test accepts iff the mean ratio ``μ = (1/N) Σ l_i`` exceeds
``μ0 = (log u − c) / N``. AustereMH tests ``H0: μ = μ0`` on a growing minibatch drawn
without replacement: with ``l̄`` and ``s_l`` the mean and standard deviation of the ``n``
ratios drawn so far and ``s = s_l / √n · √(1 − (n − 1)/(N − 1))``, it stops as soon as the
p-value of ``t = (l̄ − μ0) / s`` (Student t, ``n − 1`` degrees of freedom) falls below the
per-test threshold ε, and accepts iff ``l̄ > μ0``; otherwise it draws ``m`` more rows.
At ``n = N`` the decision is exact.

This module holds the tests: :func:`austere_test` with a fixed design ``(m, ε)`` and
:func:`austere_nc_test`, AustereMH(nc), which chooses the design per iteration from the
actual standardised mean (a full pass over the data). Their error analysis (the dynamic
program over the Gaussian random walk of the z-statistics) is in
:mod:`~pymc_minibatch_mh.core.austere_error` and
:mod:`~pymc_minibatch_mh.core.austere_step_error`, the choice of designs in
:mod:`~pymc_minibatch_mh.core.austere_design`; their names are re-exported here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import special

from pymc_minibatch_mh.core.austere_design import (
    DEFAULT_BATCH_SIZES,
    DEFAULT_EPSILONS,
    AustereDesign,
    AustereDesignTable,
    adaptive_design,
    conservative_design,
    default_mu_grid,
    design_table,
    worst_case_error,
)
from pymc_minibatch_mh.core.austere_error import (
    SequentialTestProperties,
    batch_schedule,
    check_design,
    sequential_test_error,
)
from pymc_minibatch_mh.core.austere_step_error import averaged_error, averaged_error_bound
from pymc_minibatch_mh.core.common import (
    TestOutcome,
    has_fault,
    is_fault,
    log_threshold,
    rejection,
)
from pymc_minibatch_mh.core.moments import RunningMoments, finite_population_factor
from pymc_minibatch_mh.core.source import MinibatchSource

__all__ = [
    "DEFAULT_BATCH_SIZES",
    "DEFAULT_EPSILONS",
    "AustereDesign",
    "AustereDesignTable",
    "AustereOutcome",
    "SequentialTestProperties",
    "adaptive_design",
    "austere_error_estimate",
    "averaged_error",
    "averaged_error_bound",
    "austere_nc_test",
    "austere_test",
    "batch_schedule",
    "conservative_design",
    "default_mu_grid",
    "design_table",
    "sequential_test_error",
    "standardised_mean",
    "threshold_t_test",
    "worst_case_error",
]


@dataclass(slots=True)
class AustereOutcome(TestOutcome):
    """Result of one AustereMH test.

    Attributes
    ----------
    mu0 : float
        The threshold ``μ0 = (log u − c) / N`` (``u`` drawn first from the generator).
    mean : float
        The mean ``l̄`` of the ratios used (the exact μ when ``full_data``).
    std_error : float
        The estimated standard deviation ``s`` of ``l̄`` (0 at full data).
    t_statistic : float
        ``(l̄ − μ0) / s`` of the last test (``±inf`` at full data or ``s = 0``).
    p_value : float
        Its p-value ``1 − F_{t, n−1}(|t|)`` (0 at full data).
    epsilon : float
        The per-test threshold ε of the design used.
    design_batch_size : int
        The design's minibatch size m (rows added per round).
    mu_std : float
        The standardised mean ``(μ − μ0) √(N − 1) / σ_l`` used to choose the design
        (AustereMH(nc) only; NaN otherwise).
    design_feasible : bool
        Whether the design meets its error bound (always True for a fixed design; False
        when no design of an adaptive grid does, see :meth:`~.AustereDesignTable.choose`).
    design_error : float
        The error ``E(μ_std)`` of the whole sequential test at ``mu_std``, as the design
        table gives it (AustereMH(nc) only; NaN otherwise).

    """

    mu0: float
    mean: float
    std_error: float
    t_statistic: float
    p_value: float
    epsilon: float
    design_batch_size: int
    mu_std: float
    design_feasible: bool
    design_error: float


def _rejected(
    nonfinite: bool,
    mu0: float,
    mean: float,
    epsilon: float,
    design_batch_size: int,
    *,
    mu_std: float = math.nan,
    feasible: bool = True,
    design_error: float = math.nan,
    **counts: int | bool,
) -> AustereOutcome:
    """A rejection before (or instead of) a t-test: see :func:`~.common.rejection`."""
    return rejection(
        AustereOutcome,
        nonfinite=nonfinite,
        mu0=mu0,
        mean=mean,
        std_error=math.nan,
        t_statistic=math.nan,
        p_value=math.nan,
        epsilon=epsilon,
        design_batch_size=design_batch_size,
        mu_std=mu_std,
        design_feasible=feasible,
        design_error=design_error,
        **counts,
    )


def _signed_inf(diff: float) -> float:
    """``±inf`` with the sign of ``diff`` (0 for 0): t of a difference with no spread."""
    return math.copysign(math.inf, diff) if diff != 0.0 else 0.0


def _sequential_t_test(
    source: MinibatchSource,
    mu0: float,
    batch_size: int,
    epsilon: float,
    *,
    extra: int,
    mu_std: float,
    feasible: bool,
    design_error: float = math.nan,
) -> AustereOutcome:
    """Algorithm 1 of Korattikara et al. (2014) once ``u`` (hence μ0) is known."""
    n_total = source.n_total
    moments = RunningMoments()
    rounds = 0
    while True:
        count = min(batch_size, n_total - moments.count)
        values, chunk_mean, chunk_m2 = source.draw(count)
        moments.add(values, chunk_mean, chunk_m2)
        rounds += 1
        n = moments.count
        mean = moments.mean
        full_data = n >= n_total
        if not math.isfinite(mean) or math.isnan(moments.m2):
            # A −inf ratio is a zero likelihood (reject, not a fault); NaN/+inf are faults.
            return _rejected(
                mean != -math.inf, mu0, mean, epsilon, batch_size, mu_std=mu_std,
                feasible=feasible, design_error=design_error, batch_size=n, rounds=rounds,
                full_data=full_data, extra_evaluations=extra,
            )
        diff = mean - mu0
        if full_data:
            # l̄ = μ: the exact decision.
            std_error, t_stat, p_value = 0.0, _signed_inf(diff), 0.0
        elif n < 2:
            continue  # no degrees of freedom yet
        else:
            std_error = math.sqrt(moments.mean_variance(n_total))  # s, see core.moments
            t_stat = diff / std_error if std_error > 0.0 else _signed_inf(diff)
            # p-value 1 − F_{t, n−1}(|t|): scipy.special.stdtr is the Student t CDF that
            # scipy.stats.t uses, without its per-call overhead.
            p_value = float(special.stdtr(n - 1, -abs(t_stat))) if diff != 0.0 else 1.0
            if not p_value < epsilon:
                continue
        return AustereOutcome(
            accepted=bool(diff > 0.0),
            batch_size=n,
            rounds=rounds,
            full_data=full_data,
            nonfinite=False,
            extra_evaluations=extra,
            mu0=mu0,
            mean=mean,
            std_error=std_error,
            t_statistic=t_stat,
            p_value=p_value,
            epsilon=epsilon,
            design_batch_size=batch_size,
            mu_std=mu_std,
            design_feasible=feasible,
            design_error=design_error,
        )


def austere_test(
    rng: np.random.Generator,
    source: MinibatchSource,
    data_free: float,
    *,
    batch_size: int,
    epsilon: float,
) -> AustereOutcome:
    """Run one AustereMH test (Korattikara et al. 2014, Algorithm 1).

    Parameters
    ----------
    rng, source, data_free
        As for every threshold test (:mod:`~pymc_minibatch_mh.core.common`); ``u`` sets
        the threshold ``μ0 = (log u − c) / N``.
    batch_size : int
        Rows per round m (the first minibatch too); the last round may be smaller.
    epsilon : float
        Per-test threshold ε on the p-value (0 never stops early: the exact test).

    Returns
    -------
    AustereOutcome
        The decision and the last test's statistics.

    Notes
    -----
    ``μ0 = (log u − c) / N``. After each round, with ``n`` rows drawn, ``l̄`` their mean,
    ``s_l`` their sample standard deviation (``n − 1`` in the denominator) and
    ``s = s_l / √n · √(1 − (n − 1)/(N − 1))``, the test computes ``t = (l̄ − μ0) / s`` and
    the p-value ``1 − F_{t,n−1}(|t|)``; if it is below ε, it accepts iff ``l̄ > μ0``. At
    ``n = N`` it accepts iff ``μ > μ0``, the exact MH decision for this ``u``. A ``−inf``
    ratio (or data-free part) rejects; NaN or ``+inf`` rejects and sets ``nonfinite``.

    References
    ----------
    .. [1] Korattikara, A., Chen, Y., Welling, M. (2014). Austerity in MCMC Land: Cutting
       the Metropolis-Hastings Budget. ICML 2014, Section 4 and Algorithm 1.

    Examples
    --------
    >>> import numpy as np
    >>> from pymc_minibatch_mh.core.source import ArraySource
    >>> rng = np.random.default_rng(0)
    >>> source = ArraySource(rng.normal(0.01, 1.0, size=1000), rng=rng)
    >>> source.start_step()
    >>> out = austere_test(rng, source, 0.0, batch_size=1000, epsilon=0.05)
    >>> out.full_data, out.accepted == (out.mean > out.mu0)
    (True, True)

    """
    return threshold_t_test(log_threshold, rng, source, data_free, batch_size, epsilon)


def threshold_t_test(threshold: Callable[..., tuple[float, float]], rng: np.random.Generator,
                      source: MinibatchSource, data_free: float, batch_size: int,
                      epsilon: float) -> AustereOutcome:
    """The sequential t-test with ``μ0`` drawn by ``threshold`` (also the Gibbs test's)."""
    batch_size, epsilon = check_design(batch_size, epsilon)
    _, mu0 = threshold(rng, data_free, source.n_total)
    if not math.isfinite(data_free):
        return _rejected(is_fault(data_free), mu0, math.nan, epsilon, batch_size)
    return _sequential_t_test(
        source, mu0, batch_size, epsilon, extra=0, mu_std=math.nan, feasible=True
    )


def austere_error_estimate(outcome: AustereOutcome, n_total: int) -> float:
    """The step's estimate of the probability that its AustereMH test erred.

    Every look of the sequential test is accounted for, through the dynamic program of
    :func:`~pymc_minibatch_mh.core.austere_error.sequential_test_error`:

    - AustereMH(nc) (``mu_std`` known from its full pass): the design's error
      ``E(μ_std)`` at the actual standardised mean (as tabulated for the design choice,
      at the grid value at or below ``|μ_std|``, so never below ``E(μ_std)``): the
      probability of a wrong decision given ``u``, not a bound;
    - a fixed or conservative design (μ unknown): the bound
      :func:`~pymc_minibatch_mh.core.austere_step_error.averaged_error_bound` of the error
      averaged over ``u``, with the population standard deviation σ_l of the ratios
      estimated from the rows used. It needs no estimate of μ: the density of
      ``Δ − log u`` is at most 1 whatever Δ, and the bound takes the worst Δ.

    Both hold under the Gaussian random-walk model of the looks (Korattikara et al.
    2014, appendix A); the bound also takes σ_l as known. They replace the p-value the
    test stopped at, which is a per-look figure: given the minibatch it is the
    probability that μ lies on the other side of ``μ0`` only under a flat prior on μ,
    and it ignores that the test looked at the data several times; the audit measured
    it at about half the rate of wrong decisions.

    Parameters
    ----------
    outcome : AustereOutcome
        The test's outcome.
    n_total : int
        Population size N.

    Returns
    -------
    float
        0 when all N rows were used (the decision is exact), NaN when the test used no
        rows or a non-finite ratio stopped it, else the estimate above.

    Examples
    --------
    >>> import numpy as np
    >>> from pymc_minibatch_mh.core.source import ArraySource
    >>> source = ArraySource(np.linspace(-1.95, 2.05, 2000), rng=np.random.default_rng(0))
    >>> source.start_step()
    >>> out = austere_test(np.random.default_rng(1), source, 0.0, batch_size=50, epsilon=0.05)
    >>> bool(austere_error_estimate(out, 2000) > out.p_value)
    True

    """
    if outcome.full_data:
        return 0.0
    if not outcome.batch_size or not math.isfinite(outcome.std_error):
        return math.nan
    if math.isfinite(outcome.mu_std):
        return outcome.design_error
    n = outcome.batch_size
    # σ̂ (ddof = 1) from s = σ̂/√n · √(1 − (n − 1)/(N − 1)), then scale = N σ̂ / √(N − 1).
    sd = outcome.std_error * math.sqrt(n / finite_population_factor(n, n_total))
    return averaged_error_bound(
        n_total * sd / math.sqrt(n_total - 1), outcome.design_batch_size, outcome.epsilon,
        n_total,
    )


def standardised_mean(mean: float, mu0: float, std: float, n_total: int) -> float:
    """Compute the standardised mean ``μ_std = (μ − μ0) √(N − 1) / σ_l``.

    Parameters
    ----------
    mean : float
        The full-data mean ratio μ.
    mu0 : float
        The threshold μ0.
    std : float
        The population standard deviation σ_l of the ratios (``ddof = 0``).
    n_total : int
        Population size N.

    Returns
    -------
    float
        ``μ_std`` (``±inf`` when ``σ_l = 0`` and ``μ ≠ μ0``, 0 when ``μ = μ0``).

    References
    ----------
    .. [1] Korattikara et al. (2014), appendix A, Proposition 2.

    """
    diff = mean - mu0
    if diff == 0.0:
        return 0.0
    if std <= 0.0:
        return math.copysign(math.inf, diff)
    return diff * math.sqrt(max(n_total - 1, 0)) / std


def austere_nc_test(
    rng: np.random.Generator,
    source: MinibatchSource,
    data_free: float,
    *,
    design_table: AustereDesignTable,
) -> AustereOutcome:
    """Run one AustereMH(nc) test: a counted full pass, a design for ``μ_std``, the test.

    Parameters
    ----------
    rng, source, data_free
        As for :func:`austere_test`; ``source.full_pass()`` also gives all N ratios (for
        μ and σ_l).
    design_table : AustereDesignTable
        The tabulated choice for this N and error bound (see :func:`~.design_table`).

    Returns
    -------
    AustereOutcome
        As :func:`austere_test`, with ``extra_evaluations = N`` (the full pass),
        ``batch_size`` the rows the sequential test itself drew, ``mu_std`` and
        ``design_feasible`` set.

    Notes
    -----
    The full pass gives μ and the population standard deviation σ_l, hence
    ``μ_std = (μ − μ0) √(N − 1) / σ_l``; the sequential test then runs with the design
    :meth:`~.AustereDesignTable.choose` returns, with the same ``u``. Seita et al. (2017)
    did not count the full pass in their data usage; it is reported separately here.
    If the full pass meets a NaN or ``+inf`` ratio the step rejects with ``nonfinite``; a
    ``−inf`` ratio rejects (the exact decision).

    References
    ----------
    .. [1] Seita et al. (2017), Section 6 and Appendix C.2.1.
    .. [2] Korattikara et al. (2014), appendix A.

    """
    n_total = source.n_total
    if design_table.n_total != n_total:
        raise ValueError(
            f"the design table is for N = {design_table.n_total}, the source has N = {n_total}"
        )
    _, mu0 = log_threshold(rng, data_free, n_total)
    if not math.isfinite(data_free):
        first = design_table.choose(0.0)
        return _rejected(is_fault(data_free), mu0, math.nan, first.epsilon, first.batch_size)
    values = np.asarray(source.full_pass(), dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        mean = float(values.mean())
        std = float(values.std())
    if not math.isfinite(mean) or math.isnan(std):
        first = design_table.choose(0.0)
        return _rejected(
            has_fault(values), mu0, mean, first.epsilon, first.batch_size,
            extra_evaluations=n_total,
        )
    mu_std = standardised_mean(mean, mu0, std, n_total)
    design = design_table.choose(mu_std)
    return _sequential_t_test(
        source,
        mu0,
        design.batch_size,
        design.epsilon,
        extra=n_total,
        mu_std=mu_std,
        feasible=design.feasible,
        design_error=design.error,
    )
