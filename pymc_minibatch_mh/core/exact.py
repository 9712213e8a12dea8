"""The exact full-data acceptance tests (Metropolis–Hastings and Barker), as a baseline.

One pass over all N rows gives ``Δ = Σ_i l_i + c``. The Metropolis–Hastings test accepts
iff ``log u < Δ`` (probability ``min(1, e^Δ)``); Barker's test iff ``Δ + X_log > 0`` with
``X_log`` standard logistic (probability ``1 / (1 + e^{−Δ})``). The rows are drawn through
``source.draw(N)``, so they count as the test's own batch (``batch_size = N``), not as
extra evaluations.

The full-data rules live here once: :func:`full_data_delta` (Δ),
:func:`metropolis_accepts` (the exact Metropolis decision for a drawn ``u``) and
:func:`exact_accept_probability` (``min(1, e^Δ)`` or Barker's ``g(Δ)``); the exact test
and the audit of the minibatch steps both call them. Barker's ``g`` and his exact decision
given Δ are those of :mod:`~pymc_minibatch_mh.core.logistic`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from pymc_minibatch_mh.core.common import TestOutcome, is_fault, log_threshold, rejection
from pymc_minibatch_mh.core.logistic import barker_accepts, barker_probability
from pymc_minibatch_mh.core.source import MinibatchSource

__all__ = [
    "ExactOutcome",
    "exact_accept_probability",
    "exact_test",
    "full_data_delta",
    "metropolis_accepts",
]


@dataclass(slots=True)
class ExactOutcome(TestOutcome):
    """Result of one exact test.

    Attributes
    ----------
    delta : float
        The full-data log acceptance ratio ``Δ = Σ_i l_i + c``.
    accept_prob : float
        ``min(1, e^Δ)`` (Metropolis) or ``1 / (1 + e^{−Δ})`` (Barker).
    log_u : float
        ``log u`` of the Metropolis test (NaN for Barker's).
    test : str
        ``"metropolis"`` or ``"barker"``.

    """

    delta: float
    accept_prob: float
    log_u: float
    test: str


def full_data_delta(values: NDArray[np.float64], data_free: float) -> float:
    """The full-data log acceptance ratio ``Δ = c + Σ_i l_i``.

    Parameters
    ----------
    values : numpy.ndarray
        All N ratios ``l_i``.
    data_free : float
        The data-free part ``c(θ, θ')``.

    Returns
    -------
    float
        Δ; ``c`` itself when it is not finite (the data cannot change the decision).

    Examples
    --------
    >>> full_data_delta(np.array([0.5, -0.25]), 1.0)
    1.25

    """
    if not math.isfinite(data_free):
        return float(data_free)
    with np.errstate(invalid="ignore", over="ignore"):
        return float(np.sum(values)) + data_free


def metropolis_accepts(delta: float, mean: float, threshold: float) -> bool:
    """The exact Metropolis–Hastings decision for a drawn ``u``.

    Accept iff ``μ > μ0 = (log u − c)/N`` (that is, iff ``log u < Δ``): the rule, with the
    same ``u``, that AustereMH and MHSubLhd approximate and apply at ``n = N``.

    Parameters
    ----------
    delta : float
        The full-data Δ (:func:`full_data_delta`).
    mean : float
        The full-data mean ratio μ.
    threshold : float
        ``μ0 = (log u − c)/N`` (:func:`~pymc_minibatch_mh.core.common.log_threshold`).

    Returns
    -------
    bool
        The decision; False when Δ is not finite (a ``−inf`` rejects exactly, NaN or
        ``+inf`` is a fault and rejects).

    Examples
    --------
    >>> metropolis_accepts(0.5, 0.05, 0.01), metropolis_accepts(math.nan, 0.05, 0.01)
    (True, False)

    """
    return math.isfinite(delta) and bool(mean > threshold)


def exact_accept_probability(
    delta: float, test: Literal["metropolis", "barker"] = "barker"
) -> float:
    """The exact test's acceptance probability given the full-data Δ.

    Parameters
    ----------
    delta : float
        The full-data Δ.
    test : {"metropolis", "barker"}, optional
        The acceptance rule.

    Returns
    -------
    float
        ``min(1, e^Δ)`` (Metropolis) or ``g(Δ) = 1/(1 + e^{−Δ})`` (Barker,
        :func:`~pymc_minibatch_mh.core.logistic.barker_probability`); 0 when Δ is not
        finite (such steps reject).

    Examples
    --------
    >>> exact_accept_probability(0.0), exact_accept_probability(1.0, "metropolis")
    (0.5, 1.0)

    """
    if not math.isfinite(delta):
        return 0.0
    if test == "metropolis":
        return 1.0 if delta >= 0.0 else math.exp(delta)
    return barker_probability(delta)


def exact_test(
    rng: np.random.Generator,
    source: MinibatchSource,
    data_free: float,
    *,
    test: Literal["metropolis", "barker"] = "metropolis",
) -> ExactOutcome:
    """Run the exact full-data test with one pass over the data.

    Parameters
    ----------
    rng : numpy.random.Generator
        Source of ``u`` (Metropolis: one ``random()`` draw, made first, the same call as
        the minibatch tests make) or of the logistic draw (Barker).
    source : MinibatchSource
        The step's source; ``draw(N)`` gives all the ratios.
    data_free : float
        The data-free part ``c(θ, θ')``.
    test : {"metropolis", "barker"}, optional
        The acceptance rule.

    Returns
    -------
    ExactOutcome
        The decision, Δ and the acceptance probability.

    Notes
    -----
    Metropolis: accept iff ``log u < Δ``, i.e. iff ``μ > μ0 = (log u − c) / N``, the same
    rule, with the same ``u``, that AustereMH and MHSubLhd approximate
    (:func:`metropolis_accepts`). A ``−inf`` Δ (or data-free part) rejects; NaN or
    ``+inf`` rejects and sets ``nonfinite``.

    References
    ----------
    .. [1] Metropolis, N. et al. (1953); Hastings, W. K. (1970).
    .. [2] Barker, A. A. (1965). Monte Carlo calculations of the radial distribution
       functions for a proton-electron plasma. Australian Journal of Physics 18.

    Examples
    --------
    >>> import numpy as np
    >>> from pymc_minibatch_mh.core.source import ArraySource
    >>> rng = np.random.default_rng(0)
    >>> source = ArraySource(np.full(10, 0.1), rng=rng)
    >>> source.start_step()
    >>> out = exact_test(rng, source, -1.0)
    >>> round(out.delta, 12), out.accepted, out.batch_size
    (0.0, True, 10)

    """
    if test not in ("metropolis", "barker"):
        raise ValueError(f"test must be 'metropolis' or 'barker', got {test!r}")
    n_total = source.n_total
    log_u = mu0 = math.nan
    if test == "metropolis":
        log_u, mu0 = log_threshold(rng, data_free, n_total)

    if not math.isfinite(data_free):
        return rejection(
            ExactOutcome, nonfinite=is_fault(data_free), delta=data_free, accept_prob=0.0,
            log_u=log_u, test=test,
        )
    values, mean, _ = source.draw(n_total)
    delta = full_data_delta(values, data_free)
    if not math.isfinite(delta):
        return rejection(
            ExactOutcome, nonfinite=is_fault(delta), batch_size=n_total, rounds=1,
            full_data=True, delta=delta, accept_prob=0.0, log_u=log_u, test=test,
        )
    if test == "metropolis":
        accepted = metropolis_accepts(delta, mean, mu0)
    else:
        accepted = barker_accepts(rng, delta)
    accept_prob = exact_accept_probability(delta, test)
    return ExactOutcome(
        accepted=bool(accepted),
        batch_size=n_total,
        rounds=1,
        full_data=True,
        nonfinite=False,
        extra_evaluations=0,
        delta=delta,
        accept_prob=accept_prob,
        log_u=log_u,
        test=test,
    )
