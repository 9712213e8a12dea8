r"""The penalty test: a Metropolis-type acceptance function for the minibatch test.

Barker's test accepts at most half of even a perfect proposal (``g(0) = 1/2``). The
minibatch construction of Seita et al. [2]_ works for any acceptance function of the form
``P(Δ + X > 0)`` whose noise ``X`` contains a normal part: the minibatch supplies part of
that normal noise and the test adds the rest. Metropolis' ``min(1, e^Δ)`` is
``P(Δ + E > 0)`` with ``E = −log U`` standard exponential, which has no normal part; the
*penalty* acceptance function of Ceperley and Dewing [1]_ has one:

.. math::

    h_σ(Δ) = E\bigl[\min(1, e^{Δ + σZ − σ^2/2})\bigr]
           = Φ\Bigl(\frac{Δ − σ^2/2}{σ}\Bigr) + e^{Δ}\,Φ\Bigl(\frac{−Δ − σ^2/2}{σ}\Bigr),

the Metropolis test of a log ratio observed with ``N(0, σ²)`` noise, penalised by
``σ²/2``. It satisfies detailed balance, ``h_σ(Δ) = e^Δ h_σ(−Δ)``, and accepts a perfect
proposal with probability ``h_σ(0) = 2Φ(−σ/2)``: 0.62 at σ = 1, 0.80 at σ = 0.5 (Barker:
0.5). As a noise, ``X = X_norm + E − σ²/2`` with ``X_norm ~ N(0, σ²)``: the minibatch test
is Barker's with the correction ``X_corr = E − σ²/2``, drawn exactly (no table, no table
error) (:class:`PenaltyCorrection`).

The price is smoothness: ``h_σ`` is the Metropolis kink smoothed by a normal of sd σ, and
the first Edgeworth term of the minibatch test's error is ``κ₃ h_σ'''(Δ)/6`` with
``max|h_σ'''| = 0.22`` at σ = 1 (Barker: 1/8), growing as σ falls. The error estimate and
the error budget use :func:`penalty_derivative` where Barker's test uses ``g``'s
derivatives (:func:`~pymc_minibatch_mh.core.acceptance_error.acceptance_derivative`).

References
----------
.. [1] Ceperley, D. M., Dewing, M. (1999). The penalty method for random walks with
   uncertain energies. The Journal of Chemical Physics 110(20), 9812-9820.
.. [2] Seita, D., Pan, X., Chen, H., Canny, J. (2017). An Efficient Minibatch Acceptance
   Test for Metropolis-Hastings. UAI 2017.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numba
import numpy as np

__all__ = [
    "BARKER",
    "DEFAULT_PENALTY_SIGMA",
    "PENALTY",
    "PenaltyCorrection",
    "acceptance_kind",
    "penalty_derivative",
    "penalty_given_minibatch",
    "penalty_probability",
]


#: The acceptance function of a test, as the compiled error estimate takes it: Barker's
#: ``g`` (a correction table, or none) ...
BARKER = 0
#: ... or the penalty function ``h_σ`` (:class:`PenaltyCorrection`).
PENALTY = 1
#: σ of the penalty test unless given: it accepts a perfect proposal with probability
#: ``h_σ(0) = 0.80``; measured against 0.35, 0.75 and 1 in
#: ``benchmarks/bench_past_ceiling.py`` (ESS per transition 0.50-0.55 on the logistic grid).
DEFAULT_PENALTY_SIGMA: float = 0.5


@numba.njit(cache=True)
def _phi(x: float) -> float:
    return math.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


@numba.njit(cache=True)
def _cdf(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


@numba.njit(cache=True)
def penalty_given_minibatch(delta_star: float, topup_variance: float, sigma: float) -> float:
    """The penalty test's acceptance probability given its minibatch.

    ``E[min(1, exp(Δ* + v Z − σ²/2))]`` with ``v² = topup_variance`` (``σ² − s²``; ``σ²``
    at full data).

    Parameters
    ----------
    delta_star : float
        Δ* (Δ at full data).
    topup_variance : float
        The variance ``v²`` of the normal noise the test adds.
    sigma : float
        σ of the test (its penalty is ``σ²/2``).

    Returns
    -------
    float
        ``Φ(a/v) + e^{a + v²/2} Φ(−(a + v²)/v)`` with ``a = Δ* − σ²/2`` (``min(1, e^a)`` at
        ``v = 0``); 0 for a non-finite Δ* other than ``+inf``.

    Examples
    --------
    >>> round(penalty_given_minibatch(0.0, 1.0, 1.0), 4)  # h_1(0) = 2Φ(−1/2)
    0.6171

    """
    if math.isnan(delta_star) or delta_star == -math.inf:
        return 0.0
    if delta_star == math.inf:
        return 1.0
    a = delta_star - 0.5 * sigma * sigma
    if topup_variance <= 0.0:
        return 1.0 if a >= 0.0 else math.exp(a)
    v = math.sqrt(topup_variance)
    # e^{a + v²/2} Φ(−(a + v²)/v): its log, so that a large a cannot overflow.
    tail = _cdf(-(a + topup_variance) / v)
    below = math.exp(a + 0.5 * topup_variance + math.log(tail)) if tail > 0.0 else 0.0
    return min(1.0, _cdf(a / v) + below)


@numba.njit(cache=True)
def penalty_probability(delta: float, sigma: float) -> float:
    """``h_σ(Δ)``, the penalty acceptance function (the exact test's acceptance probability).

    Examples
    --------
    >>> d = 0.7
    >>> abs(penalty_probability(d, 1.0) - math.exp(d) * penalty_probability(-d, 1.0)) < 1e-12
    True

    """
    return penalty_given_minibatch(delta, sigma * sigma, sigma)


@numba.njit(cache=True)
def penalty_derivative(delta: float, sigma: float, order: int) -> float:
    """The ``order``-th derivative of ``h_σ`` (order 1, 2 or 3), in closed form.

    With ``w = (Δ − σ²/2)/σ``: ``h' = e^Δ Φ(−(Δ + σ²/2)/σ)``, ``h'' = h' − φ(w)/σ`` and
    ``h''' = h'' + w φ(w)/σ²``.

    Examples
    --------
    >>> round(penalty_derivative(0.0, 1.0, 1), 4), round(penalty_derivative(0.0, 1.0, 3), 4)
    (0.3085, -0.2196)

    """
    c = 0.5 * sigma * sigma
    w = (delta - c) / sigma
    tail = _cdf(-(delta + c) / sigma)
    first = math.exp(delta + math.log(tail)) if tail > 0.0 else 0.0
    if order == 1:
        return first
    second = first - _phi(w) / sigma
    if order == 2:
        return second
    if order == 3:
        return second + w * _phi(w) / (sigma * sigma)
    raise ValueError("order must be 1, 2 or 3")


@dataclass(frozen=True)
class PenaltyCorrection:
    """The penalty test's correction ``X_corr = E − σ²/2`` (``E`` standard exponential).

    It implements :class:`~pymc_minibatch_mh.core.correction.CorrectionSampler` (exactly:
    ``error`` is 0), so that :class:`~pymc_minibatch_mh.core.barker.BarkerTest` runs the
    penalty test with its own stopping rules: grow until ``s² < σ²``, add
    ``X_nc ~ N(0, σ² − s²)``, accept iff ``Δ* + X_nc + X_corr > 0``, i.e.
    ``log U < Δ* + X_nc − σ²/2``.

    Parameters
    ----------
    sigma : float
        σ: the normal part of the test's noise (the minibatch may supply up to σ²).
    """

    sigma: float
    #: The L∞ error of the correction: 0, it is drawn exactly.
    error: float = 0.0

    def sample(self, rng: np.random.Generator) -> float:
        """One draw of ``X_corr = E − σ²/2``."""
        return float(rng.standard_exponential()) - 0.5 * self.sigma * self.sigma

    def probability(self, delta: float) -> float:
        """``h_σ(Δ)`` (:func:`penalty_probability`)."""
        return float(penalty_probability(delta, self.sigma))

    def exact_accepts(self, rng: np.random.Generator, delta: float) -> bool:
        """The decision given Δ (all rows used): ``Δ + σZ + X_corr > 0``, probability ``h_σ(Δ)``."""
        return bool(delta + self.sigma * rng.standard_normal() + self.sample(rng) > 0.0)

    def accept_probability(self, delta_star: float, variance: float, *, exact: bool) -> float:
        """The acceptance probability given the minibatch (:func:`penalty_given_minibatch`)."""
        topup = self.sigma * self.sigma if exact else max(self.sigma**2 - variance, 0.0)
        return float(penalty_given_minibatch(delta_star, topup, self.sigma))


def acceptance_kind(correction: object) -> int:
    """:data:`PENALTY` for a :class:`PenaltyCorrection`, else :data:`BARKER`."""
    return PENALTY if isinstance(correction, PenaltyCorrection) else BARKER
