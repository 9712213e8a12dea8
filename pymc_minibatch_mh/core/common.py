"""What the acceptance tests share: outcome fields, the batch-size rule, threshold helpers.

Every test's outcome extends :class:`TestOutcome`, and every ``batch_size`` of the package
is checked by :func:`check_batch_size`. The other helpers serve the threshold-based tests
(exact, AustereMH, MHSubLhd).

The Metropolis–Hastings decision can be written as a comparison of the mean ratio with a
threshold that depends on a uniform draw: accept iff ``μ > (log u − c) / N``, with
``μ = (1/N) Σ l_i`` and ``c`` the data-free part. Every such test draws ``u`` first, with
the same call, so that two tests run from generators in the same state use the same ``u``
(which makes their decisions directly comparable).

The tests are called alike, ``test(rng, source, data_free, *, options)``:

rng : numpy.random.Generator
    The test's generator; ``u`` is drawn from it first (one ``random()`` call, see
    :func:`log_threshold`).
source : MinibatchSource
    Gives the ratios ``l_i`` of new rows (:class:`~pymc_minibatch_mh.core.source.MinibatchSource`);
    the caller has opened the step.
data_free : float
    The data-free part ``c(θ, θ')``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "TestOutcome",
    "check_batch_size",
    "draw_uniform",
    "has_fault",
    "is_fault",
    "log_threshold",
    "rejection",
]

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


OutcomeT = TypeVar("OutcomeT", bound=TestOutcome)


def draw_uniform(rng: np.random.Generator) -> float:
    """One uniform draw on ``(0, 1]`` (so that ``log u`` is finite).

    Parameters
    ----------
    rng : numpy.random.Generator
        The test's generator; exactly one ``random()`` call is made.

    Returns
    -------
    float
        ``1 − rng.random()``, uniform on ``(0, 1]``.

    """
    return 1.0 - float(rng.random())


def log_threshold(
    rng: np.random.Generator, data_free: float, n_total: int
) -> tuple[float, float]:
    """Draw ``u`` and return ``(log u, (log u − c) / N)``.

    The second value is the threshold of the mean ratio: μ0 of Korattikara et al. (2014,
    eq. 2) or ψ of Bardenet et al. (2014). The exact test accepts iff ``μ > μ0``, i.e. iff
    ``log u < Δ = N μ + c``.

    Parameters
    ----------
    rng : numpy.random.Generator
        The test's generator (one draw, see :func:`draw_uniform`).
    data_free : float
        The data-free part ``c(θ, θ')``.
    n_total : int
        Population size N.

    Returns
    -------
    tuple of float
        ``(log_u, threshold)``.

    Examples
    --------
    >>> import numpy as np
    >>> log_u, mu0 = log_threshold(np.random.default_rng(0), 0.5, 10)
    >>> bool(np.isclose(mu0, (log_u - 0.5) / 10))
    True

    """
    log_u = math.log(draw_uniform(rng))
    return log_u, (log_u - data_free) / n_total


def is_fault(value: float) -> bool:
    """Whether a non-finite value is a fault (NaN or +inf) rather than a zero likelihood.

    A ``−inf`` log ratio means the proposal has zero likelihood (or prior): rejecting is the
    exact decision, not an error. NaN or ``+inf`` means the model could not be evaluated;
    the proposal is rejected and the step flags ``nonfinite``.

    Parameters
    ----------
    value : float
        A non-finite value (finite values return False).

    Returns
    -------
    bool
        True for NaN and ``+inf``, False for ``−inf`` and finite values.

    Examples
    --------
    >>> is_fault(float("nan")), is_fault(float("inf")), is_fault(float("-inf"))
    (True, True, False)

    """
    return math.isnan(value) or value == math.inf


def has_fault(values: NDArray[np.float64]) -> bool:
    """Whether an array holds a fault (NaN or ``+inf``), as :func:`is_fault` for one value.

    Parameters
    ----------
    values : numpy.ndarray
        Ratios, e.g. those of a full pass whose mean or spread came out non-finite.

    Returns
    -------
    bool
        True if any value is NaN or ``+inf``; ``−inf`` values alone are no fault.

    Examples
    --------
    >>> import numpy as np
    >>> has_fault(np.array([0.0, -np.inf])), has_fault(np.array([0.0, np.nan]))
    (False, True)

    """
    return bool(np.isnan(values).any() or np.isposinf(values).any())


def check_batch_size(batch_size: Any) -> int:
    """Return ``batch_size`` as an int, or raise ``ValueError`` unless it is a positive integer.

    The one rule for every ``batch_size`` of the package (the core tests, the step
    methods, the SGLD proposal): a Python or NumPy integer of at least 1. A bool, a float
    (even an integral one such as ``2.0``), a string or any other type is refused, so that
    a value computed by mistake (a fraction, a flag) is not silently truncated.

    Parameters
    ----------
    batch_size : int
        Rows per round (or the first minibatch's size).

    Returns
    -------
    int
        The same value as a Python int.

    Raises
    ------
    ValueError
        If ``batch_size`` is not an integer (the message names the type and says to pass
        an int) or is below 1.

    Examples
    --------
    >>> check_batch_size(np.int64(50))
    50
    >>> check_batch_size(2.0)
    Traceback (most recent call last):
    ...
    ValueError: batch_size must be a positive integer, got 2.0 (a float); pass an int such as 100.

    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer):
        raise ValueError(
            f"batch_size must be a positive integer, got {batch_size!r} "
            f"(a {type(batch_size).__name__}); pass an int such as 100."
        )
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
    return int(batch_size)


def rejection(
    outcome: type[OutcomeT],
    *,
    nonfinite: bool,
    batch_size: int = 0,
    rounds: int = 0,
    full_data: bool = False,
    extra_evaluations: int = 0,
    **stats: Any,
) -> OutcomeT:
    """The outcome of a threshold test that rejects because a value is not finite.

    A ``−inf`` data-free part or ratio rejects cleanly (zero prior or likelihood); NaN or
    ``+inf`` also sets ``nonfinite``. Every threshold test (exact, AustereMH, MHSubLhd)
    builds its rejection here, so the shared fields are set in one place.

    Parameters
    ----------
    outcome : type
        The test's outcome class (a :class:`TestOutcome`).
    nonfinite : bool
        Whether the value was a fault (see :func:`is_fault`, :func:`has_fault`).
    batch_size, rounds : int, optional
        Rows the test drew, and its rounds, before it stopped (0 if it drew none).
    full_data : bool, optional
        Whether those rows were all N.
    extra_evaluations : int, optional
        Rows evaluated outside the test's own batch (a full pass).
    **stats
        The outcome class's own fields (statistics the test did not reach are NaN).

    Returns
    -------
    TestOutcome
        An instance of ``outcome`` with ``accepted=False``.

    """
    return outcome(
        accepted=False,
        batch_size=batch_size,
        rounds=rounds,
        full_data=full_data,
        nonfinite=nonfinite,
        extra_evaluations=extra_evaluations,
        **stats,
    )
