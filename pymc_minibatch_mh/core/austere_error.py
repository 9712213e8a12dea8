"""AustereMH's error analysis: the sequential test as a Gaussian random walk.

Under a Gaussian model of the running means (Korattikara et al. 2014, appendix A) the
z-statistics ``z_j`` of the successive tests of AustereMH (:mod:`~pymc_minibatch_mh.core.austere`)
form a Gaussian random walk that depends only on the standardised mean
``μ_std = (μ − μ0) √(N − 1) / σ_l``, the fractions ``π_j = n_j / N`` of data used and the
bound ``G = Φ⁻¹(1 − ε)``. The error and expected data usage of the whole sequential test
are computed here by a dynamic program over that walk (:func:`sequential_test_error`);
:mod:`~pymc_minibatch_mh.core.austere_design` chooses designs ``(m, ε)`` with it, and
:mod:`~pymc_minibatch_mh.core.austere_step_error` averages its error over the step's ``u``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import special

from pymc_minibatch_mh.core.common import check_batch_size

__all__ = [
    "DEFAULT_MAX_CELL",
    "DEFAULT_RESOLUTION",
    "SequentialTestProperties",
    "batch_schedule",
    "check_design",
    "sequential_test_error",
    "z_bound",
]

#: Default largest cell width of the dynamic program's grid on ``[−G, G]``.
DEFAULT_MAX_CELL: float = 0.01
#: Default number of cells per standard deviation of the narrowest step of the walk.
DEFAULT_RESOLUTION: float = 2.0

# Kernel and band truncation, in standard deviations of one step (mass beyond: < 1e-15).
_TAIL_SDS = 8.0


def check_design(batch_size: int, epsilon: float) -> tuple[int, float]:
    """Validate a design ``(m, ε)`` of the sequential test.

    Parameters
    ----------
    batch_size : int
        Rows per round m (a positive integer).
    epsilon : float
        Per-test threshold ε, in ``[0, 1)`` (0: the test never stops early).

    Returns
    -------
    tuple
        ``(int(batch_size), float(epsilon))``.

    """
    batch_size = check_batch_size(batch_size)
    if not 0.0 <= epsilon < 1.0:
        raise ValueError(f"epsilon must be in [0, 1), got {epsilon!r}")
    return batch_size, float(epsilon)


def z_bound(epsilon: float) -> float:
    """Return the bound ``G = Φ⁻¹(1 − ε)`` on ``|z_j|`` of a per-test threshold ε.

    The test with threshold ε on the p-value stops once ``|z_j| > G``.

    Parameters
    ----------
    epsilon : float
        Per-test threshold ε.

    Returns
    -------
    float
        ``G``.

    Examples
    --------
    >>> round(z_bound(0.05), 4)
    1.6449

    """
    return float(special.ndtri(1.0 - epsilon))


def batch_schedule(batch_size: int, n_total: int) -> NDArray[np.int64]:
    """Rows used after each test of a sequential test growing by ``batch_size``.

    Parameters
    ----------
    batch_size : int
        Rows per round m.
    n_total : int
        Population size N.

    Returns
    -------
    numpy.ndarray
        ``n_j = min(j m, N)`` for ``j = 1 .. J``, ``J = ⌈N / m⌉``.

    Examples
    --------
    >>> batch_schedule(40, 100).tolist()
    [40, 80, 100]

    """
    batch_size = check_batch_size(batch_size)
    if n_total < 1:
        raise ValueError(f"n_total must be a positive integer, got {n_total!r}")
    n_tests = -(-int(n_total) // batch_size)
    return np.minimum(np.arange(1, n_tests + 1, dtype=np.int64) * batch_size, n_total)


@dataclass(frozen=True, slots=True)
class _Walk:
    lower: NDArray[np.float64]  # (M,) P(stop with z < −G before the last test)
    upper: NDArray[np.float64]  # (M,) P(stop with z > G before the last test)
    last: NDArray[np.float64]  # (M,) P(reach the last test, n = N)
    rows: NDArray[np.float64]  # (M,) expected rows used
    tests: NDArray[np.float64]  # (M,) expected number of tests
    steps: NDArray[np.float64] | None  # (M, J) P(stop at test j), if asked
    bins: int

    def error(self, mu_std: NDArray[np.float64]) -> NDArray[np.float64]:
        """``E(μ_std)``, eq. 18; at ``μ_std = 0`` the limit ``(1 − P(j' = J)) / 2``, eq. 20."""
        return np.where(mu_std == 0.0, 0.5 * (self.lower + self.upper), self.lower)


def _pocock_walk(
    n_rows: NDArray[np.int64],
    n_total: int,
    bound: float,
    mu_std: NDArray[np.float64],
    *,
    max_cell: float,
    resolution: float,
    keep_steps: bool,
) -> _Walk:
    """Run the dynamic program over the Gaussian random walk of the z-statistics.

    ``mu_std`` must be non-negative and increasing. See :func:`sequential_test_error`.
    """
    if np.any(mu_std < 0.0) or np.any(np.diff(mu_std) < 0.0):
        raise ValueError("mu_std must be non-negative and increasing")
    if not (resolution >= 1.0 and max_cell > 0.0):
        raise ValueError("resolution must be at least 1 and max_cell positive")
    n_tests = int(n_rows.size)
    n_mu = int(mu_std.size)
    if n_tests == 1:
        full = np.ones(n_mu)
        steps = np.ones((n_mu, 1)) if keep_steps else None
        return _Walk(np.zeros(n_mu), np.zeros(n_mu), full, n_total * full, full, steps, 0)

    pis = n_rows[:-1] / n_total
    s = pis / (1.0 - pis)  # time of the Brownian motion X = z √s, tests 1 .. J−1
    ratio = s[:-1] / s[1:]
    contraction = np.sqrt(ratio)  # b_j, tests 2 .. J−1
    step_sd = np.sqrt(1.0 - ratio)  # σ_{z,j}
    narrowest = float(step_sd.min()) if step_sd.size else 1.0
    cell = min(max_cell, narrowest / resolution)
    n_bins = max(16, math.ceil(2.0 * bound / cell))
    cell = 2.0 * bound / n_bins
    index = np.arange(n_bins)
    centres = -bound + (index + 0.5) * cell
    offset = index + 0.5 - 0.5 * n_bins  # position of each cell from the centre, in cells
    distance = np.abs(offset)
    above = (offset > 0.0).astype(np.float64)
    below = (offset < 0.0).astype(np.float64)
    # Sheppard's correction: rounding to cell centres adds variance cell²/12 per step.
    kernel_sd = np.sqrt(step_sd**2 - cell * cell / 12.0)
    widths = np.minimum(n_bins, np.ceil(_TAIL_SDS * kernel_sd / cell).astype(np.int64) + 1)
    n_zero = int(np.count_nonzero(mu_std == 0.0))
    mu_t = mu_std[n_zero:]
    root_s = np.sqrt(s)
    # P(stop at test j) below −G and above G, tests 1 .. J−1 (rows: tests).
    stop_lo = np.zeros((n_tests - 1, n_mu))
    stop_up = np.zeros((n_tests - 1, n_mu))

    # Test 1: z_1 ~ N(μ_std √s_1, 1), exactly.
    mass = np.diff(special.ndtr(-bound + np.arange(n_bins + 1) * cell))
    stop_lo[0] = special.ndtr(-bound - mu_std * root_s[0])
    stop_up[0] = special.ndtr(-bound + mu_std * root_s[0])

    with np.errstate(divide="ignore", under="ignore"):
        for j in range(1, n_tests - 1):
            b = float(contraction[j - 1])
            # 1. The deterministic part z → b z: each cell's mass is split linearly between
            #    the two cells nearest to its image (this keeps mass and mean).
            if (1.0 - b) * 0.5 * n_bins <= 1.0:
                # every image within one cell of its cell, towards the centre
                moved = mass * ((1.0 - b) * distance)
                mass = mass - moved
                mass[:-1] += (moved * above)[1:]
                mass[1:] += (moved * below)[:-1]
            else:
                image = 0.5 * n_bins * (1.0 - b) + b * (index + 0.5) - 0.5
                left = np.floor(image).astype(np.int64)
                frac = image - left
                right = np.minimum(left + 1, n_bins - 1)
                mass = np.bincount(left, mass * (1.0 - frac), minlength=n_bins) + np.bincount(
                    right, mass * frac, minlength=n_bins
                )
            # 2. The Gaussian step, integrated over the cells; the mass leaving [−G, G] is
            #    the Gaussian tail of each cell's mass (exact for the discretised walk).
            sd = float(kernel_sd[j - 1])
            width = int(widths[j - 1])
            cdf = special.ndtr((np.arange(-width, width + 2) - 0.5) * (cell / sd))
            kernel = cdf[1:] - cdf[:-1]  # steps of −width .. width cells
            band = min(n_bins, width + 1)
            tails = 1.0 - cdf[width + 1 : width + 1 + band]  # P(step > (d + ½) cell)
            stop_lo[j, :n_zero] = mass[:band] @ tails
            stop_up[j, :n_zero] = mass[n_bins - band :] @ tails[::-1]
            # Drifts whose walk has left [−G, G] for good (P(|z_{j−1}| ≤ G) ≤ Φ(−8)) add
            # nothing more; μ_std is increasing, so the active ones are a prefix.
            active = (
                int(np.searchsorted(mu_t, (bound + _TAIL_SDS) / root_s[j - 1], "right"))
                if mu_t.size
                else 0
            )
            if active:
                # Change of measure: the walk with drift μ_std has density
                # exp(α z_j − α²/2), α = μ_std √s_j, relative to the walk with μ_std = 0;
                # integrate it against each cell's Gaussian step beyond ±G.
                alpha = mu_t[:active] * root_s[j]
                var = sd * sd
                keep = 1.0 - var
                log_mass = np.log(mass)
                # Below −G, terms are ≤ exp(α z − α² (1 − σ²)/2) with z ≤ the band's top:
                # drifts beyond the root of that exponent = −40 add < 1e-17.
                top = float(centres[band - 1])
                cap = (top + math.sqrt(top * top + 80.0 * keep)) / keep
                n_lo = int(np.searchsorted(alpha, cap, "right"))
                wide = min(n_bins, band + math.ceil(float(alpha[-1]) * var / cell))
                sides = (
                    (centres[:band], log_mass[:band], -1.0, n_lo, stop_lo),
                    (centres[n_bins - wide :], log_mass[n_bins - wide :], 1.0, active, stop_up),
                )
                # exp(log m + α z − α²(1 − σ²)/2) ≤ exp(G² / (2(1 − σ²))): safe unless the
                # step is almost the whole walk (then work in logs).
                safe = bound * bound < 1000.0 * keep
                for z, log_m, sign, count, out in sides:
                    if not count:
                        continue
                    a = alpha[:count, None]
                    expo = log_m + a * z - (0.5 * keep) * a * a
                    arg = (sign * (z + a * var) - bound) / sd
                    if safe:
                        terms = np.exp(expo) * special.ndtr(arg)
                    else:
                        terms = np.exp(expo + special.log_ndtr(arg))
                    out[j, n_zero : n_zero + count] = terms.sum(axis=1)
            mass = np.convolve(mass, kernel)[width : width + n_bins]

    lower = stop_lo.sum(axis=0)
    upper = stop_up.sum(axis=0)
    stops = stop_lo + stop_up
    last = np.clip(1.0 - lower - upper, 0.0, 1.0)
    rows = n_rows[:-1] @ stops + n_total * last
    tests = np.arange(1, n_tests) @ stops + n_tests * last
    steps = np.concatenate([stops.T, last[:, None]], axis=1) if keep_steps else None
    return _Walk(lower, upper, last, rows, tests, steps, n_bins)


@dataclass(frozen=True, slots=True)
class SequentialTestProperties:
    """Error and data usage of a sequential test under the Gaussian random-walk model.

    Array attributes have the shape of the ``mu_std`` given (``stop_probability`` one
    more axis, the test index).

    Attributes
    ----------
    mu_std : numpy.ndarray
        The standardised means ``μ_std`` evaluated.
    batch_size : int
        Rows per round m.
    epsilon : float
        Per-test threshold ε.
    n_total : int
        Population size N.
    bound : float
        ``G = Φ⁻¹(1 − ε)``, the bound on ``|z_j|``.
    max_tests : int
        ``J = ⌈N / m⌉``; the J-th test uses all data and is exact.
    error : numpy.ndarray
        ``E(μ_std)``: probability of the wrong decision (eq. 18): deciding ``μ < μ0`` when
        ``μ_std > 0``, ``μ ≥ μ0`` when ``μ_std < 0``; at ``μ_std = 0`` the limit
        ``(1 − P(j' = J)) / 2`` of eq. 20 (the worst case).
    expected_fraction : numpy.ndarray
        ``π̄``, the expected fraction of the data used (eq. 19).
    expected_rows : numpy.ndarray
        ``N π̄``, the expected number of rows used.
    expected_tests : numpy.ndarray
        The expected number of tests ``E[j']``.
    full_data_probability : numpy.ndarray
        ``P(j' = J)``, the probability of using all the data.
    stop_probability : numpy.ndarray
        ``P(j' = j)`` for ``j = 1 .. J`` (last axis).
    bins : int
        Number of grid cells on ``[−G, G]`` used by the dynamic program.

    """

    mu_std: NDArray[np.float64]
    batch_size: int
    epsilon: float
    n_total: int
    bound: float
    max_tests: int
    error: NDArray[np.float64]
    expected_fraction: NDArray[np.float64]
    expected_rows: NDArray[np.float64]
    expected_tests: NDArray[np.float64]
    full_data_probability: NDArray[np.float64]
    stop_probability: NDArray[np.float64] = field(repr=False)
    bins: int


def sequential_test_error(
    mu_std: ArrayLike, batch_size: int, epsilon: float, n_total: int, *,
    max_cell: float = DEFAULT_MAX_CELL, resolution: float = DEFAULT_RESOLUTION,
) -> SequentialTestProperties:
    """Error and expected data usage of the sequential test, by dynamic programming.

    Parameters
    ----------
    mu_std : float or array_like
        Standardised mean(s) ``μ_std = (μ − μ0) √(N − 1) / σ_l``.
    batch_size : int
        Rows per round m.
    epsilon : float
        Per-test threshold ε (in ``(0, 1)``).
    n_total : int
        Population size N.
    max_cell : float, optional
        Largest cell width of the grid on ``[−G, G]``.
    resolution : float, optional
        Cells per standard deviation of the narrowest step of the walk (at least 1).

    Returns
    -------
    SequentialTestProperties
        Error, expected data usage and the distribution of the stopping test.

    Notes
    -----
    **Model** (Korattikara et al. 2014, appendix A, eqs. 9–11). With ``π_j = n_j / N``,
    the z-statistics follow ``z_j | z_{j−1} ~ N(a_j μ_std + b_j z_{j−1}, σ_j²)`` with
    ``b_j = √(π_{j−1}(1 − π_j) / (π_j(1 − π_{j−1})))``, ``σ_j² = 1 − b_j²`` and
    ``a_j = (π_j − π_{j−1}) / ((1 − π_{j−1}) √(π_j(1 − π_j)))``. Equivalently, with
    ``s_j = π_j / (1 − π_j)``, ``X_j = √s_j z_j`` is a Gaussian random walk with
    independent increments ``N(μ_std Δs_j, Δs_j)``. The test stops at the first ``j``
    with ``|z_j| > G``; the J-th test (``π_J = 1``) is exact. The error is eq. 18 and the
    expected fraction of data eq. 19.

    **Discretisation.** The walk is run once with ``μ_std = 0``: the sub-density of
    ``z_j`` on "not stopped yet" is kept as masses on ``L`` equal cells tiling
    ``[−G, G]``, ``L = ⌈2G / h⌉`` with ``h ≤ max_cell`` and ``h ≤ min_j σ_j / resolution``
    (the narrowest step, about ``2 √(m/N)``, must span a few cells; the appendix's program
    uses a fixed number of values and an ``O(L²)`` step). Each step moves every cell's
    mass to ``b_j z`` (split linearly between the two nearest cells, which keeps mass and
    mean) and convolves with the Gaussian of the step integrated over the cells, its
    variance reduced by Sheppard's ``h²/12`` which the rounding to cell centres adds
    back; the mass leaving ``[−G, G]`` is the Gaussian tail of each cell's mass. Kernels
    are truncated at 8 standard deviations, so one step costs ``O(L σ_j / h)``. Results
    for ``μ_std ≠ 0`` come from the same run by the change of measure of the Gaussian
    walk (its density relative to ``μ_std = 0`` is ``exp(μ_std X_j − μ_std² s_j / 2)``):
    the probability of stopping below ``−G`` at test ``j`` is
    ``Σ_k w_k ∫_{−∞}^{−G} φ_σ(z − z_k) e^{α z − α²/2} dz`` with ``α = μ_std √s_j``, a
    Gaussian integral in closed form. The error is symmetric, ``E(−μ_std) = E(μ_std)``,
    and decreases with ``|μ_std|``.

    **Accuracy.** The scheme is second order in ``h``: with the defaults, errors and data
    usage are within about 0.1% (relative) of the converged values, and within Monte
    Carlo error (4·10⁵ paths) of a direct simulation of eqs. 9–11; the worst-case values
    for ``N = 13000`` agree with those of the authors' program to 0.3% (errors) and
    0.05% (expected number of tests). The stop probabilities of the change of measure
    sum to 1 only up to the same discretisation error (``P(j' = J)`` is clipped at 0).

    References
    ----------
    .. [1] Korattikara, A., Chen, Y., Welling, M. (2014). Austerity in MCMC Land: Cutting
       the Metropolis-Hastings Budget. ICML 2014, appendix A (eqs. 9–20, Figure 10).
    .. [2] Armitage, P., McPherson, C. K., Rowe, B. C. (1969). Repeated significance tests
       on accumulating data. JRSS A 132(2).

    Examples
    --------
    >>> props = sequential_test_error([0.0, 5.0], batch_size=500, epsilon=0.05, n_total=5000)
    >>> props.max_tests, bool(props.error[0] > props.error[1])
    (10, True)
    >>> bool(abs(props.error[0] - (1 - props.full_data_probability[0]) / 2) < 1e-12)
    True

    """
    check_design(batch_size, epsilon)
    if not 0.0 < epsilon:
        raise ValueError("epsilon must be positive for the random-walk model")
    mu = np.asarray(mu_std, dtype=np.float64)
    if np.isnan(mu).any():
        raise ValueError("mu_std must not be NaN")
    shape = mu.shape
    flat = np.abs(mu.ravel())
    order = np.argsort(flat)
    bound = z_bound(epsilon)
    n_rows = batch_schedule(batch_size, n_total)
    sorted_mu = flat[order]
    finite = np.isfinite(sorted_mu)  # a prefix: inf sorts last
    n_finite = int(finite.sum())
    walk = _pocock_walk(n_rows, int(n_total), bound, sorted_mu[:n_finite],
                        max_cell=max_cell, resolution=resolution, keep_steps=True)
    assert walk.steps is not None
    n_tests = n_rows.size
    # |μ_std| = inf: the first test decides, correctly.
    n_inf = flat.size - n_finite
    error = np.concatenate([walk.error(sorted_mu[:n_finite]), np.zeros(n_inf)])
    rows = np.concatenate([walk.rows, np.full(n_inf, float(n_rows[0]))])
    tests = np.concatenate([walk.tests, np.ones(n_inf)])
    last = np.concatenate([walk.last, np.full(n_inf, 1.0 if n_tests == 1 else 0.0)])
    first = np.zeros((n_inf, n_tests))
    first[:, 0] = 1.0
    steps = np.concatenate([walk.steps, first])
    inverse = np.empty_like(order)
    inverse[order] = np.arange(order.size)

    def back(values: NDArray[np.float64]) -> NDArray[np.float64]:
        return values[inverse].reshape(shape)

    return SequentialTestProperties(
        mu_std=mu,
        batch_size=int(batch_size),
        epsilon=float(epsilon),
        n_total=int(n_total),
        bound=bound,
        max_tests=int(n_tests),
        error=back(error),
        expected_fraction=back(rows / n_total),
        expected_rows=back(rows),
        expected_tests=back(tests),
        full_data_probability=back(last),
        stop_probability=steps[inverse].reshape(shape + (n_tests,)),
        bins=walk.bins,
    )
