"""AustereMH's error of one Metropolis–Hastings step, averaged over ``u``.

The step draws ``u ~ U(0, 1)`` and runs the sequential test on ``μ0 = (log u − c) / N``;
averaging the error ``E(μ_std)`` of the whole sequential test
(:func:`~pymc_minibatch_mh.core.austere_error.sequential_test_error`) over ``u`` gives the
probability that the step's decision is wrong given the full-data ratio Δ
(:func:`averaged_error`; Korattikara et al. 2014, appendix B), and its supremum over Δ a
bound that needs only the spread of the ratios (:func:`averaged_error_bound`), which
:func:`~pymc_minibatch_mh.core.austere.austere_error_estimate` reports per step.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numpy.typing import ArrayLike, NDArray

from pymc_minibatch_mh.core.austere_error import check_design, sequential_test_error

__all__ = ["averaged_error", "averaged_error_bound"]

#: ``|μ_std| √s_1`` (the drift at the first test) up to which the error curve is tabulated;
#: beyond it the first test decides, correctly, with probability ``1 − 1e-30`` or more.
_CURVE_DRIFT = 12.0
#: Range of ``scale · √((N − m)/m)`` (about ``s(Δ*)`` at the first test) of the bound table.
_SCALE_RANGE = (1e-3, 1e5)


def _root_first_time(batch_size: int, n_total: int) -> float:
    """``√s_1 = √(π_1 / (1 − π_1))``: ``μ_std √s_1`` is the walk's drift at the first test."""
    return math.sqrt(min(batch_size, n_total - 1) / max(n_total - batch_size, 1))


@lru_cache(maxsize=16)
def _error_curve(
    batch_size: int, epsilon: float, n_total: int
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """``E(t)`` on a grid of ``t = μ_std`` covering both signs (symmetric), cached."""
    root_s1 = _root_first_time(batch_size, n_total)
    half = np.concatenate([[0.0], np.geomspace(1e-3, _CURVE_DRIFT, 300)]) / root_s1
    error = sequential_test_error(half, batch_size, epsilon, n_total).error
    grid = np.concatenate([-half[:0:-1], half])
    curve = np.concatenate([error[:0:-1], error])
    grid.flags.writeable = False
    curve.flags.writeable = False
    return grid, curve


def _averaged_on_grid(
    scale: NDArray[np.float64], grid: NDArray[np.float64], curve: NDArray[np.float64]
) -> NDArray[np.float64]:
    """``F(t0) = λ ∫_{t0}^∞ e^{−λ(t − t0)} E(t) dt`` at every grid point, for each ``λ``.

    ``E`` is taken piecewise linear between grid points (0 beyond the grid's right end);
    shape ``(len(scale), len(grid))``. The backward recursion over the cells is exact for
    the piecewise-linear curve.
    """
    lam = np.asarray(scale, dtype=np.float64)[:, None]
    widths = np.diff(grid)
    x = lam * widths  # (L, cells)
    decay = np.exp(-x)
    first = -np.expm1(-x)  # λ ∫_0^h e^{−λy} dy
    # λ ∫_0^h e^{−λy} y/h dy = (1 − e^{−x}(1 + x)) / x; a series where x is tiny.
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = np.where(x > 1e-4, (first - x * decay) / x, x / 2.0 - x * x / 3.0)
    cells = curve[:-1] * first + (curve[1:] - curve[:-1]) * slope
    out = np.empty((lam.shape[0], grid.size))
    out[:, -1] = 0.0
    for i in range(grid.size - 2, -1, -1):
        out[:, i] = decay[:, i] * out[:, i + 1] + cells[:, i]
    return out


def averaged_error(
    delta: ArrayLike, scale: float, batch_size: int, epsilon: float, n_total: int
) -> NDArray[np.float64]:
    """Probability that the step's decision is wrong, averaged over ``u``, given Δ.

    Parameters
    ----------
    delta : float or array_like
        The full-data log acceptance ratio(s) Δ of the proposal.
    scale : float
        ``N σ_l / √(N − 1)``, with σ_l the population standard deviation of the ratios
        ``l_i`` (so that ``μ_std = (Δ − log u) / scale``).
    batch_size, epsilon, n_total
        The design ``(m, ε)`` and N.

    Returns
    -------
    numpy.ndarray
        ``P(wrong | Δ) = ∫_0^1 E(μ_std(u)) du`` in the shape of ``delta``.

    Notes
    -----
    The step draws ``u ~ U(0, 1)`` and tests ``μ > μ0``; ``μ − μ0 = (Δ − log u)/N``, so
    ``D = Δ − log u = Δ + Exp(1)`` and ``μ_std = D / scale``. Averaging the error
    ``E(μ_std)`` of the sequential test
    (:func:`~pymc_minibatch_mh.core.austere_error.sequential_test_error`, every look
    included) over u gives ``∫_Δ^∞ e^{−(d − Δ)} E(d / scale) dd`` (Korattikara et al.
    2014, appendix B, who use the same average with signs for the error of the
    acceptance probability). ``E`` is tabulated once per design (cached; about 1–3 s) and
    integrated exactly as a piecewise-linear curve.

    Examples
    --------
    >>> averaged_error([-3.0, 0.0, 3.0], 0.5, 50, 0.05, 2000).round(3).tolist()
    [0.028, 0.105, 0.003]

    """
    batch_size, epsilon = check_design(batch_size, epsilon)
    if not (math.isfinite(scale) and scale > 0.0):
        raise ValueError(f"scale must be positive and finite, got {scale!r}")
    grid, curve = _error_curve(batch_size, epsilon, int(n_total))
    values = _averaged_on_grid(np.array([scale]), grid, curve)[0]
    t0 = np.asarray(delta, dtype=np.float64) / scale
    # Left of the grid E is flat at ~0 and the average decays: F(t0) = e^{−λ(t_1 − t0)} F(t_1).
    left = values[0] * np.exp(-scale * np.maximum(grid[0] - t0, 0.0))
    return np.where(t0 < grid[0], left, np.interp(t0, grid, values, right=0.0))


@lru_cache(maxsize=16)
def _bound_table(
    batch_size: int, epsilon: float, n_total: int
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """``log`` scales and ``sup_Δ P(wrong | Δ)`` on them, cached per design and N."""
    grid, curve = _error_curve(batch_size, epsilon, n_total)
    unit = _root_first_time(batch_size, n_total)
    scales = np.geomspace(*_SCALE_RANGE, 161) * unit
    sup = _averaged_on_grid(scales, grid, curve).max(axis=1)
    # The supremum grows with the scale, to E(0); keep it monotone against rounding.
    sup = np.minimum(np.maximum.accumulate(sup), curve[grid.size // 2])
    log_scales = np.log(scales)
    log_scales.flags.writeable = False
    sup.flags.writeable = False
    return log_scales, sup


def averaged_error_bound(scale: float, batch_size: int, epsilon: float, n_total: int) -> float:
    """``sup_Δ P(wrong | Δ)``: a bound on the step's error that needs only σ_l.

    Parameters
    ----------
    scale : float
        ``N σ_l / √(N − 1)`` (see :func:`averaged_error`); 0 gives 0.
    batch_size, epsilon, n_total
        The design ``(m, ε)`` and N.

    Returns
    -------
    float
        The largest :func:`averaged_error` over all Δ: the probability of a wrong decision
        of the whole sequential test, averaged over ``u``, for the worst proposal with
        this spread of ratios. It grows with ``scale`` from 0 (about
        ``scale ∫ E(μ) dμ`` for small scales) to the worst case ``E(0)`` of eq. 20.

    Notes
    -----
    The density of ``D = Δ − log u`` is ``e^{−(d − Δ)}`` for ``d > Δ``, at most 1
    whatever Δ; the error ``E(D / scale)`` is largest near ``D = 0``. The bound takes the
    Δ that puts the most of that density where the error is (Δ slightly below 0). It is
    computed once per design on a grid of scales (cached) and interpolated in
    ``log scale``.

    Examples
    --------
    >>> small, large = (averaged_error_bound(s, 50, 0.05, 2000) for s in (0.01, 1e4))
    >>> worst = float(sequential_test_error(0.0, 50, 0.05, 2000).error)
    >>> bool(small < 0.01), round(large, 3), round(worst, 3)
    (True, 0.338, 0.338)

    """
    if not scale > 0.0:
        if math.isnan(scale) or scale < 0.0:
            raise ValueError(f"scale must be non-negative, got {scale!r}")
        return 0.0
    log_scales, sup = _bound_table(*check_design(batch_size, epsilon), int(n_total))
    x = math.log(scale)
    if x < log_scales[0]:  # linear in the scale near 0
        return float(sup[0] * math.exp(x - log_scales[0]))
    return float(np.interp(x, log_scales, sup))
