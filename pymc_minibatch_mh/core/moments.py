"""Running moments of the per-observation log-likelihood ratios of a growing minibatch.

All minibatch tests keep the same summary of the l_i seen so far in a step: their count,
mean and sum of squared deviations (merged chunk by chunk with the parallel formula of
Chan, Golub and LeVeque, which stays accurate when the mean is large compared with the
spread), and the values themselves for tests that need higher moments.

:func:`chunk_moments`, :func:`merge_moments` and :func:`clt_error_bound` are compiled with
Numba (``nogil``, cached on disk): they are the one implementation, called from Python by
the reference tests and from compiled code by the fast path of the adapter. So are the
finite-population factor and the variances built on it (:func:`finite_population_factor`,
:func:`mean_variance`, :func:`delta_star_variance`), the one home of
``s² = N² · var̂(l_B) / b · (1 − (b − 1)/(N − 1))``.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numpy.typing import NDArray
from scipy.stats import norm

__all__ = [
    "EDGEWORTH_SUP",
    "RunningMoments",
    "chunk_moments",
    "clt_error_bound",
    "excess_kurtosis",
    "delta_star_variance",
    "finite_population_factor",
    "mean_variance",
    "merge_moments",
    "merge_third_moment",
    "population_variance",
    "rows_for_variance",
    "skew_from_edgeworth",
    "third_moment_sum",
]

#: ``sup_x |(2x² + 1) φ(x)|``, attained at ``x² = 3/2``; used by the Edgeworth estimate.
EDGEWORTH_SUP: float = float(4.0 * norm.pdf(math.sqrt(1.5)))


@numba.njit(cache=True, nogil=True)
def chunk_moments(values: NDArray[np.float64]) -> tuple[float, float]:
    """Mean and sum of squared deviations of one chunk of values (compiled).

    Two passes: the mean is the plain sum divided by the count, then the squared
    deviations from it are summed.

    Parameters
    ----------
    values : numpy.ndarray
        One-dimensional float64 array.

    Returns
    -------
    tuple of float
        ``(mean, m2)`` with ``m2 = sum((values - mean) ** 2)``; ``(nan, 0.0)`` for an
        empty array.

    Examples
    --------
    >>> import numpy as np
    >>> chunk_moments(np.array([1.0, 2.0, 6.0]))
    (3.0, 14.0)

    """
    count = values.shape[0]
    if count == 0:
        return math.nan, 0.0
    total = 0.0
    for i in range(count):
        total += values[i]
    mean = total / count
    m2 = 0.0
    for i in range(count):
        d = values[i] - mean
        m2 += d * d
    return mean, m2


@numba.njit(cache=True, nogil=True)
def merge_moments(
    n: int, mean: float, m2: float, count: int, c_mean: float, c_m2: float
) -> tuple[int, float, float]:
    """Merge the moments of a chunk into running moments (compiled).

    The parallel formula of Chan, Golub and LeVeque: with ``n`` values of mean ``mean``
    and ``count`` new ones of mean ``c_mean``, ``diff = c_mean − mean``, the merged mean is
    ``mean + diff · count / (n + count)`` and the merged sum of squared deviations
    ``m2 + c_m2 + diff² · n · count / (n + count)``.

    Parameters
    ----------
    n, mean, m2 : int, float, float
        Count, mean and sum of squared deviations of the values so far (``n = 0``: none).
    count, c_mean, c_m2 : int, float, float
        The same for the new chunk (see :func:`chunk_moments`).

    Returns
    -------
    tuple
        ``(n, mean, m2)`` of all the values; the chunk's own moments when ``n = 0``.

    References
    ----------
    .. [1] Chan, T. F., Golub, G. H., LeVeque, R. J. (1979). Updating formulae and a
       pairwise algorithm for computing sample variances. Technical report STAN-CS-79-773,
       Stanford University.

    Examples
    --------
    >>> merge_moments(2, 1.5, 0.5, 3, 4.0, 2.0)
    (5, 3.0, 10.0)

    """
    if n == 0:
        return count, c_mean, c_m2
    total = n + count
    diff = c_mean - mean
    return total, mean + diff * count / total, m2 + (c_m2 + diff * diff * n * count / total)


@numba.njit(cache=True, nogil=True)
def third_moment_sum(values: NDArray[np.float64], mean: float) -> float:
    """Sum of cubed deviations ``Σ (v_i − mean)³`` of one chunk (compiled).

    Parameters
    ----------
    values : numpy.ndarray
        One-dimensional float64 array.
    mean : float
        Their mean (as :func:`chunk_moments` gives it).

    Returns
    -------
    float
        The sum (0.0 for an empty array).

    Examples
    --------
    >>> import numpy as np
    >>> third_moment_sum(np.array([1.0, 2.0, 6.0]), 3.0)
    18.0

    """
    m3 = 0.0
    for i in range(values.shape[0]):
        d = values[i] - mean
        m3 += d * d * d
    return m3


@numba.njit(cache=True, nogil=True)
def merge_third_moment(
    n: int, mean: float, m2: float, m3: float, count: int, c_mean: float, c_m2: float,
    c_m3: float,
) -> float:
    """Sum of cubed deviations of the union of two sets of values (compiled).

    The companion of :func:`merge_moments` for the third moment (Pébay 2008, eq. 2.1):
    with ``diff = c_mean − mean`` and ``t = n + count``,
    ``m3 + c_m3 + diff³ · n · count · (n − count) / t² + 3 · diff · (n · c_m2 − count · m2) / t``.

    Parameters
    ----------
    n, mean, m2, m3 : int, float, float, float
        Count, mean, sums of squared and of cubed deviations of the values so far.
    count, c_mean, c_m2, c_m3 : int, float, float, float
        The same for the new chunk.

    Returns
    -------
    float
        The sum of cubed deviations of all the values from their mean (``c_m3`` when
        ``n = 0``).

    References
    ----------
    .. [1] Pébay, P. (2008). Formulas for robust, one-pass parallel computation of
       covariances and arbitrary-order statistical moments. Sandia Report SAND2008-6212.

    Examples
    --------
    >>> merge_third_moment(2, 1.5, 0.5, 0.0, 1, 6.0, 0.0, 0.0)
    18.0

    """
    if n == 0:
        return c_m3
    total = n + count
    diff = c_mean - mean
    return (
        m3 + c_m3 + diff * diff * diff * n * count * (n - count) / (total * total)
        + 3.0 * diff * (n * c_m2 - count * m2) / total
    )


@numba.njit(cache=True, nogil=True)
def finite_population_factor(n: int, n_total: int) -> float:
    """The factor ``1 − (n − 1)/(N − 1)`` for sampling without replacement (compiled).

    It multiplies the variance of a mean of ``n`` rows drawn without replacement from
    ``N``; it is 1 for ``n = 1`` and 0 for ``n = N``. The one implementation of this
    factor: :func:`mean_variance` and :func:`delta_star_variance` (the tests' ``s²``),
    AustereMH's standard error and the error estimates of
    :mod:`~pymc_minibatch_mh.core.acceptance_error` all use it.

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

    Examples
    --------
    >>> finite_population_factor(1, 10), finite_population_factor(10, 10)
    (1.0, 0.0)

    """
    if n_total <= 1:
        return 0.0
    return 1.0 - (n - 1) / (n_total - 1)


@numba.njit(cache=True, nogil=True)
def mean_variance(m2: float, n: int, n_total: int) -> float:
    """Estimated variance of the mean of ``n`` of ``N`` rows drawn without replacement.

    ``var̂ / n · (1 − (n − 1)/(N − 1))`` with ``var̂ = m2 / (n − 1)`` the sample variance
    (compiled; see :func:`finite_population_factor`).

    Parameters
    ----------
    m2 : float
        Sum of squared deviations of the ``n`` values from their mean.
    n, n_total : int
        Rows drawn, and the population size N.

    Returns
    -------
    float
        The variance: 0 when ``n ≥ N`` (the mean is exact), ``inf`` with fewer than two
        rows (no spread estimate).

    Examples
    --------
    >>> mean_variance(4.0, 2, 3)
    1.0

    """
    if n >= n_total:
        return 0.0
    if n < 2:
        return math.inf
    return m2 / (n - 1) / n * finite_population_factor(n, n_total)


@numba.njit(cache=True, nogil=True)
def delta_star_variance(m2: float, n: int, n_total: int) -> float:
    """The estimated variance ``s²`` of ``Δ* = N · l̄ + c`` (compiled).

    ``s² = N² · var̂(l_B) / n · (1 − (n − 1)/(N − 1))``: :func:`mean_variance` times
    ``N²``. It is 0 at ``n = N``, where every test reduces to the exact one.

    Parameters
    ----------
    m2 : float
        Sum of squared deviations of the ``n`` ratios of the minibatch.
    n : int
        Minibatch size b.
    n_total : int
        Population size N.

    Returns
    -------
    float
        ``s²`` (0 at full data, ``inf`` with fewer than two rows).

    Examples
    --------
    >>> delta_star_variance(4.0, 2, 3)
    9.0

    """
    big_n = float(n_total)
    return big_n * big_n * mean_variance(m2, n, n_total)


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
        self.chunks.append(values)
        self.count, self.mean, self.m2 = merge_moments(
            self.count, self.mean, self.m2, values.shape[0], mean, m2
        )

    def sample_variance(self) -> float:
        """Unbiased sample variance (``inf`` with fewer than two values)."""
        if self.count < 2:
            return math.inf
        return self.m2 / (self.count - 1)

    def mean_variance(self, n_total: int) -> float:
        """Estimated variance of the mean, with the finite-population factor.

        See :func:`~pymc_minibatch_mh.core.moments.mean_variance`.
        """
        return mean_variance(self.m2, self.count, n_total)

    def values(self) -> NDArray[np.float64]:
        """All values seen, in the order they were drawn."""
        if len(self.chunks) == 1:
            return self.chunks[0]
        return np.concatenate(self.chunks)


@numba.njit(cache=True, nogil=True)
def excess_kurtosis(values: NDArray[np.float64], mean: float) -> float:
    """Plug-in excess kurtosis ``m₄/m₂² − 3`` of the values about ``mean`` (compiled).

    Parameters
    ----------
    values : numpy.ndarray
        The values (float64).
    mean : float
        Their mean (as the running moments give it).

    Returns
    -------
    float
        The excess kurtosis (0 for a normal population; about 6 for exponential values);
        0 for fewer than two values or no spread.

    Examples
    --------
    >>> import numpy as np
    >>> round(excess_kurtosis(np.array([0.0, 1.0, 0.0, 1.0]), 0.5), 6)
    -2.0

    """
    n = values.shape[0]
    if n < 2:
        return 0.0
    m2 = m4 = 0.0
    for i in range(n):
        d2 = (values[i] - mean) ** 2
        m2 += d2
        m4 += d2 * d2
    if m2 <= 0.0:
        return 0.0
    return n * m4 / (m2 * m2) - 3.0


@numba.njit(cache=True, nogil=True)
def clt_error_bound(values: NDArray[np.float64], mean: float) -> tuple[float, float]:
    """Normal-approximation error of a minibatch mean: plug-in estimate of Novak's bound.

    The values are standardised with the given mean and their own (population) standard
    deviation, ``z_i = (l_i − mean) / sd``, because the bound of Seita et al. (2017,
    Lemma 3, Corollary 1) is stated for unit-variance variables. Then

    - ``epsilon = (6.4 · mean|z|³ + 2 · mean|z|) / √b`` is Novak's bound on
      ``sup_y |P(Δ* < y) − Φ((y − Δ)/s)|`` with the minibatch's own moments plugged in
      for the population's: an *estimate* of the bound, not a bound itself. It is never
      below ``6.4 / √b``, and a value above 1 says nothing as a probability error: the
      normal approximation is not trustworthy at that batch size by this measure;
    - ``edgeworth = |mean z³| · sup_x |(2x² + 1) φ(x)| / (6 √b)``, the size of the first
      Edgeworth correction term, a sharper estimate of the actual error (Seita et al.
      2017, Appendix A.5).

    Compiled with Numba; two passes over the values.

    Parameters
    ----------
    values : numpy.ndarray
        The b values of the minibatch (float64).
    mean : float
        Their mean (as the running moments give it).

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

    Examples
    --------
    >>> import numpy as np
    >>> epsilon, edgeworth = clt_error_bound(np.array([-1.0, 1.0, -1.0, 1.0]), 0.0)
    >>> round(epsilon, 12), edgeworth
    (4.2, 0.0)

    """
    b = values.shape[0]
    if b < 2:
        return 0.0, 0.0
    s2 = 0.0
    for i in range(b):
        z = values[i] - mean
        s2 += z * z
    var = s2 / b
    if not (var > 0.0 and math.isfinite(var)):
        return 0.0, 0.0
    sd = math.sqrt(var)
    s1 = 0.0
    s3 = 0.0
    s3_abs = 0.0
    for i in range(b):
        z = values[i] - mean
        az = abs(z)
        s1 += az
        s3 += z * z * z
        s3_abs += az * z * z
    m1 = s1 / (b * sd)
    m3 = s3_abs / (b * var * sd)
    skew = s3 / (b * var * sd)
    root_b = math.sqrt(b)
    return (6.4 * m3 + 2.0 * m1) / root_b, abs(skew) * EDGEWORTH_SUP / (6.0 * root_b)


@numba.njit(cache=True)
def skew_from_edgeworth(edgeworth: float, n: int) -> float:
    """The skewness ``|γ̂|`` of ``n`` values from their Edgeworth stat (compiled).

    The inverse of the second value of :func:`clt_error_bound`,
    ``|γ̂| · EDGEWORTH_SUP / (6 √n)``.

    Examples
    --------
    >>> values = np.array([0.0, 0.0, 0.0, 1.0])
    >>> _, edgeworth = clt_error_bound(values, values.mean())
    >>> round(skew_from_edgeworth(edgeworth, 4), 6)
    1.154701

    """
    return edgeworth * 6.0 * math.sqrt(n) / EDGEWORTH_SUP


@numba.njit(cache=True)
def population_variance(variance: float, n: int, n_total: int) -> float:
    """The sample variance ``var̂`` of the values behind ``s² = variance`` (compiled).

    The inverse of :func:`delta_star_variance` in its ``var̂ = m2/(n − 1)``:
    ``s² n / (N² (1 − (n − 1)/(N − 1)))``, for ``2 ≤ n < N``.

    Examples
    --------
    >>> population_variance(delta_star_variance(4.0, 2, 5), 2, 5)
    4.0

    """
    return variance * n / (float(n_total) * n_total * finite_population_factor(n, n_total))


@numba.njit(cache=True)
def rows_for_variance(n: int, variance: float, n_total: int, target: float) -> float:
    """The rows at which ``s²`` falls to ``target``, predicted from ``s² = variance`` at ``n``.

    ``s²`` at ``n'`` rows is about ``s²(n) · [(N − n')/n'] / [(N − n)/n]`` (the same spread
    of the values), which equals ``target`` at ``n' = N / (1 + target (N − n) / (n s²(n)))``
    (compiled; for ``0 < variance < inf``). The growth rule of the Barker test
    (:func:`~pymc_minibatch_mh.core.barker.growth_rows`) and the error budget's
    prediction (:func:`~pymc_minibatch_mh.core.batch_budget.predicted_error`) use it.

    Examples
    --------
    >>> rows_for_variance(10, 4.0, 1000, 1.0)  # doctest: +ELLIPSIS
    38.8...

    """
    return n_total / (1.0 + target * (n_total - n) / (n * variance))
