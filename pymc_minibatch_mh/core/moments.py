"""Running moments of the per-observation log-likelihood ratios of a growing minibatch.

All minibatch tests keep the same summary of the l_i seen so far in a step: their count,
mean and sum of squared deviations (merged chunk by chunk with the parallel formula of
Chan, Golub and LeVeque, which stays accurate when the mean is large compared with the
spread), and the values themselves for tests that need higher moments.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray
from scipy.stats import norm

__all__ = [
    "EDGEWORTH_SUP",
    "RunningMoments",
    "chunk_moments",
    "clt_error_bound",
    "finite_population_factor",
]

#: ``sup_x |(2x² + 1) φ(x)|``, attained at ``x² = 3/2``; used by the Edgeworth estimate.
EDGEWORTH_SUP: float = float(4.0 * norm.pdf(math.sqrt(1.5)))


def chunk_moments(values: NDArray[np.float64]) -> tuple[float, float]:
    """Mean and sum of squared deviations of one chunk of values.

    Parameters
    ----------
    values : numpy.ndarray
        One-dimensional float array.

    Returns
    -------
    tuple of float
        ``(mean, m2)`` with ``m2 = sum((values - mean) ** 2)``.

    """
    with np.errstate(invalid="ignore", over="ignore"):
        mean = float(values.mean())
        dev = values - mean
        return mean, float(np.add.reduce(dev * dev))


def finite_population_factor(n: int, n_total: int) -> float:
    """The factor ``1 - (n - 1) / (N - 1)`` for sampling without replacement.

    It multiplies the variance of a mean of ``n`` rows drawn without replacement from
    ``N``; it is 1 for ``n = 1`` and 0 for ``n = N``.

    Parameters
    ----------
    n : int
        Rows drawn.
    n_total : int
        Population size N.

    Returns
    -------
    float
        The factor (0 when ``N = 1``).

    """
    if n_total <= 1:
        return 0.0
    return 1.0 - (n - 1) / (n_total - 1)


class RunningMoments:
    """Count, mean and sum of squared deviations of the values seen in one step.

    Examples
    --------
    >>> import numpy as np
    >>> m = RunningMoments()
    >>> for chunk in (np.array([1.0, 2.0]), np.array([3.0, 4.0, 5.0])):
    ...     m.add(chunk, *chunk_moments(chunk))
    >>> m.count, m.mean, m.sample_variance()
    (5, 3.0, 2.5)

    """

    __slots__ = ("count", "mean", "m2", "chunks")

    def __init__(self) -> None:
        self.count = 0
        self.mean = 0.0
        self.m2 = 0.0
        self.chunks: list[NDArray[np.float64]] = []

    def add(self, values: NDArray[np.float64], mean: float, m2: float) -> None:
        """Merge one chunk, given its values, mean and sum of squared deviations."""
        k = values.shape[0]
        self.chunks.append(values)
        if self.count == 0:
            self.count, self.mean, self.m2 = k, mean, m2
            return
        total = self.count + k
        diff = mean - self.mean
        self.mean += diff * k / total
        self.m2 += m2 + diff * diff * self.count * k / total
        self.count = total

    def sample_variance(self) -> float:
        """Unbiased sample variance (``inf`` with fewer than two values)."""
        if self.count < 2:
            return math.inf
        return self.m2 / (self.count - 1)

    def mean_variance(self, n_total: int) -> float:
        """Estimated variance of the mean, with the finite-population factor."""
        if self.count >= n_total:
            return 0.0
        return self.sample_variance() / self.count * finite_population_factor(self.count, n_total)

    def values(self) -> NDArray[np.float64]:
        """All values seen, in the order they were drawn."""
        if len(self.chunks) == 1:
            return self.chunks[0]
        return np.concatenate(self.chunks)


def clt_error_bound(values: NDArray[np.float64], mean: float | None = None) -> tuple[float, float]:
    """Normal-approximation error of a minibatch mean: Novak's bound and an Edgeworth estimate.

    The values are standardised with their own mean and (population) standard deviation,
    ``z_i = (l_i - mean) / sd``, because the bound of Seita et al. (2017, Lemma 3,
    Corollary 1) is stated for unit-variance variables. Then

    - ``epsilon = (6.4 · mean|z|³ + 2 · mean|z|) / √b``, a rigorous but loose bound on
      ``sup_y |P(Δ* < y) − Φ((y − Δ)/s)|`` (it is never below ``6.4 / √b``);
    - ``edgeworth = |mean z³| · sup_x |(2x² + 1) φ(x)| / (6 √b)``, the size of the first
      Edgeworth correction term, a sharper estimate of the actual error (Seita et al.
      2017, Appendix A.5).

    Parameters
    ----------
    values : numpy.ndarray
        The b values of the minibatch.
    mean : float, optional
        Their mean, if already known.

    Returns
    -------
    tuple of float
        ``(epsilon, edgeworth)``; both 0 when the values have no spread (the estimate is
        then exact) or fewer than two values are given.

    References
    ----------
    .. [1] Seita, D., Pan, X., Chen, H., Canny, J. (2017). An Efficient Minibatch
       Acceptance Test for Metropolis-Hastings. UAI 2017.
    .. [2] Novak, S. Y. (2005). On self-normalized sums and Student's statistic.
       Theory of Probability & Its Applications 49(2).

    """
    b = values.shape[0]
    if b < 2:
        return 0.0, 0.0
    if mean is None:
        mean = float(np.add.reduce(values)) / b
    # Few, fused NumPy calls: this runs on every step.
    z = values - mean
    z2 = z * z
    var = float(np.add.reduce(z2)) / b
    if not var > 0.0 or not math.isfinite(var):
        return 0.0, 0.0
    abs_z = np.abs(z)
    sd = math.sqrt(var)
    m1 = float(np.add.reduce(abs_z)) / (b * sd)
    # Elementwise products and adds, not ``@``: a BLAS dot product on a vector this small
    # can be 100× slower when multi-threaded OpenBLAS competes for busy cores.
    m3 = float(np.add.reduce(abs_z * z2)) / (b * var * sd)
    skew = float(np.add.reduce(z * z2)) / (b * var * sd)
    root_b = math.sqrt(b)
    epsilon = (6.4 * m3 + 2.0 * m1) / root_b
    edgeworth = abs(skew) * EDGEWORTH_SUP / (6.0 * root_b)
    return epsilon, edgeworth
