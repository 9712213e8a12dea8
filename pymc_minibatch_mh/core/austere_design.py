"""AustereMH designs: choosing ``(m, ε)`` from a grid with the random-walk model.

The designs compared by Seita et al. (2017) are chosen from a grid of minibatch sizes m
and per-test thresholds ε with the error and data usage that
:func:`~pymc_minibatch_mh.core.austere_error.sequential_test_error` computes.
AustereMH(c) fixes the design with the least data usage whose worst-case error
(``μ_std = 0``, :func:`worst_case_error`) is below a bound (:func:`conservative_design`);
AustereMH(nc) chooses per iteration with the actual ``μ_std``, which needs a full pass
over the data (:func:`adaptive_design`,
:func:`~pymc_minibatch_mh.core.austere.austere_nc_test`). Both read the same tabulated
choice (:func:`design_table`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from pymc_minibatch_mh.core.austere_error import (
    DEFAULT_MAX_CELL,
    DEFAULT_RESOLUTION,
    SequentialTestProperties,
    _pocock_walk,
    batch_schedule,
    check_design,
    sequential_test_error,
    z_bound,
)

__all__ = [
    "DEFAULT_BATCH_SIZES",
    "DEFAULT_EPSILONS",
    "AustereDesign",
    "AustereDesignTable",
    "adaptive_design",
    "conservative_design",
    "default_mu_grid",
    "design_table",
    "worst_case_error",
]

#: Minibatch sizes m of the design grid of Seita et al. (2017, Appendix C.2.1).
DEFAULT_BATCH_SIZES: tuple[int, ...] = (50, 100, 150, 200, 250, 300, 350, 400, 450, 500)
#: Per-test thresholds ε of the same grid.
DEFAULT_EPSILONS: tuple[float, ...] = (0.001, 0.005, 0.01, 0.05, 0.1, 0.2)


def worst_case_error(
    batch_size: int, epsilon: float, n_total: int, **discretisation: float
) -> SequentialTestProperties:
    """Compute the worst case ``μ_std = 0`` of :func:`~.sequential_test_error` (eq. 20).

    The error ``E(μ_std)`` and the data usage are largest as ``μ_std → 0``, where
    ``E_worst = (1 − P(j' = J)) / 2`` does not depend on the unknown μ and σ_l.

    Parameters
    ----------
    batch_size, epsilon, n_total, **discretisation
        The design ``(m, ε)``, N and the keywords ``max_cell`` and ``resolution``, as for
        :func:`~.sequential_test_error`.

    Returns
    -------
    SequentialTestProperties
        With scalar (0-d) arrays.

    References
    ----------
    .. [1] Korattikara et al. (2014), appendix A, eq. 20.

    """
    return sequential_test_error(0.0, batch_size, epsilon, n_total, **discretisation)


@dataclass(frozen=True, slots=True)
class AustereDesign:
    """A sequential test design ``(m, ε)`` and its properties.

    Attributes
    ----------
    batch_size : int
        Rows per round m.
    epsilon : float
        Per-test threshold ε.
    bound : float
        ``G = Φ⁻¹(1 − ε)``.
    n_total : int
        Population size N.
    mu_std : float
        The ``|μ_std|`` the properties refer to: 0 for a conservative design, the grid
        value at or below the actual ``|μ_std|`` for an adaptive one.
    error : float
        The design's error at ``mu_std`` (the worst case for a conservative design).
    expected_rows : float
        Expected rows used at ``mu_std``.
    expected_fraction : float
        ``expected_rows / N``.
    error_bound : float
        The bound the design was chosen for.
    feasible : bool
        Whether ``error ≤ error_bound``.

    """

    batch_size: int
    epsilon: float
    bound: float
    n_total: int
    mu_std: float
    error: float
    expected_rows: float
    expected_fraction: float
    error_bound: float
    feasible: bool


def _grid_key(
    batch_sizes: Sequence[int], epsilons: Sequence[float]
) -> tuple[tuple[int, ...], tuple[float, ...]]:
    sizes = tuple(int(m) for m in batch_sizes)
    eps = tuple(float(e) for e in epsilons)
    if not sizes or not eps:
        raise ValueError("the design grid is empty")
    for m in sizes:
        for e in eps:
            check_design(m, e)
            if e <= 0.0:
                raise ValueError("grid epsilons must be positive")
    return sizes, eps


@lru_cache(maxsize=32)
def _design_grid(
    n_total: int,
    batch_sizes: tuple[int, ...],
    epsilons: tuple[float, ...],
    mu_grid: tuple[float, ...],
    max_cell: float,
    resolution: float,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Errors and expected rows, shape (designs, len(mu_grid)); designs m-major."""
    mu = np.asarray(mu_grid, dtype=np.float64)
    errors = np.empty((len(batch_sizes) * len(epsilons), mu.size))
    rows = np.empty_like(errors)
    d = 0
    for m in batch_sizes:
        n_rows = batch_schedule(m, n_total)
        for eps in epsilons:
            walk = _pocock_walk(
                n_rows,
                n_total,
                z_bound(eps),
                mu,
                max_cell=max_cell,
                resolution=resolution,
                keep_steps=False,
            )
            errors[d] = walk.error(mu)
            rows[d] = walk.rows
            d += 1
    errors.flags.writeable = False
    rows.flags.writeable = False
    return errors, rows


def _choose(
    errors: NDArray[np.float64], rows: NDArray[np.float64], error_bound: float
) -> tuple[NDArray[np.int64], NDArray[np.bool_]]:
    """Choose per column the feasible design with the fewest rows.

    Ties go to the smaller error; where no design is feasible, the smallest error.
    """
    feasible = errors <= error_bound
    any_ok = feasible.any(axis=0)
    cost = np.where(feasible, rows, np.inf)
    # lexicographic (rows, error) among feasible designs
    best = np.lexsort((errors, cost), axis=0)[0]
    fallback = np.argmin(errors, axis=0)
    choice = np.where(any_ok, best, fallback)
    return choice.astype(np.int64), any_ok


def conservative_design(
    n_total: int, error_bound: float, *grid: Any, **options: Any
) -> AustereDesign:
    """Choose the AustereMH(c) design: least data usage with worst-case error ≤ bound.

    Parameters
    ----------
    n_total, error_bound, *grid, **options
        As for :func:`design_table`, with the ``|μ_std|`` grid {0}: ``error_bound`` bounds
        the worst-case error ``E_worst = E(μ_std = 0)``, ``grid`` and ``options`` are the
        design grid ``batch_sizes``, ``epsilons`` (default: m ∈ {50, 100, ..., 500},
        ε ∈ {0.001, 0.005, 0.01, 0.05, 0.1, 0.2}, as Seita et al. 2017) and the
        discretisation ``max_cell``, ``resolution``.

    Returns
    -------
    AustereDesign
        The grid member ``(m, ε)`` with the smallest expected number of rows at
        ``μ_std = 0`` among those with ``E_worst ≤ error_bound`` (ties: the smaller error).

    Raises
    ------
    ValueError
        If no grid member meets the bound (the message gives the smallest worst-case
        error on the grid).

    Notes
    -----
    The worst-case error and data usage (``μ_std = 0``, eq. 20) do not depend on the
    unknown μ and σ_l, so the design is fixed before sampling and no full pass over the
    data is needed (Korattikara et al. 2014, appendix D; Seita et al. 2017, Appendix
    C.2.1). The table over the grid is computed once per ``(N, grid)`` and cached (about
    0.5 s for ``N = 1.3·10⁴``, 2 s for ``N = 10⁵``, 15 s for ``N = 10⁶``).

    References
    ----------
    .. [1] Seita, D., Pan, X., Chen, H., Canny, J. (2017). An Efficient Minibatch
       Acceptance Test for Metropolis-Hastings. UAI 2017, Section 6 and Appendix C.2.1.
    .. [2] Korattikara et al. (2014), appendix D.

    """
    # The table on the grid {0} holds the worst case only.
    table = design_table(n_total, error_bound, *grid, mu_grid=(0.0,), **options)
    design = table.choose(0.0)
    if not design.feasible:
        raise ValueError(
            f"no design on the grid has a worst-case error below {error_bound:g} for "
            f"N = {n_total}; the smallest is {design.error:.4g} "
            f"(m = {design.batch_size}, epsilon = {design.epsilon:g})"
        )
    return design


def default_mu_grid(
    n_total: int, batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES, per_decade: int = 8
) -> NDArray[np.float64]:
    """Return the ``|μ_std|`` grid of :func:`design_table`: 0 and a geometric grid.

    It spans ``0.01 √(m_min / N)`` (where every design still behaves as at
    ``μ_std = 0``) to ``12 √(N / m_min)`` (where the first test decides, correctly, with
    probability ``1 − 1e-20`` or more).

    Parameters
    ----------
    n_total : int
        Population size N.
    batch_sizes : sequence of int, optional
        The candidate m (the smallest sets the range).
    per_decade : int, optional
        Grid points per factor of 10.

    Returns
    -------
    numpy.ndarray
        Increasing, starting at 0.

    """
    m_min = min(int(m) for m in batch_sizes)
    lo = 0.01 * math.sqrt(m_min / n_total)
    hi = 12.0 * math.sqrt(n_total / m_min)
    count = max(2, math.ceil(per_decade * math.log10(hi / lo)) + 1)
    return np.concatenate([[0.0], np.geomspace(lo, hi, count)])


@dataclass(frozen=True, slots=True, eq=False)
class AustereDesignTable:
    """Per-``μ_std`` design choice for AustereMH(nc), tabulated once per ``(N, bound)``.

    Attributes
    ----------
    n_total : int
        Population size N.
    error_bound : float
        Bound on the error ``E(μ_std)`` of the chosen design.
    batch_sizes, epsilons : tuple
        The design grid (designs are ordered m-major: ``d = i_m · len(epsilons) + i_ε``).
    mu_grid : numpy.ndarray
        Increasing grid of ``|μ_std|`` values, starting at 0.
    errors, rows : numpy.ndarray
        ``E_d(μ)`` and expected rows, shape ``(designs, len(mu_grid))``.
    choice : numpy.ndarray
        The design chosen at each grid value.
    feasible : numpy.ndarray
        Whether some design meets the bound at each grid value.

    """

    n_total: int
    error_bound: float
    batch_sizes: tuple[int, ...]
    epsilons: tuple[float, ...]
    mu_grid: NDArray[np.float64]
    errors: NDArray[np.float64]
    rows: NDArray[np.float64]
    choice: NDArray[np.int64]
    feasible: NDArray[np.bool_]

    def choose(self, mu_std: float) -> AustereDesign:
        """Return the design for a standardised mean ``μ_std`` (``O(log grid)``).

        The table is read at the largest grid value not above ``|μ_std|``: since the error
        decreases with ``|μ_std|``, the chosen design's error at the actual ``μ_std`` is
        at most its tabulated error. Where no design meets the bound (``|μ_std|`` near 0
        with a tight bound), the design with the smallest error is returned with
        ``feasible=False``.

        Parameters
        ----------
        mu_std : float
            The standardised mean (NaN is treated as 0, the worst case).

        Returns
        -------
        AustereDesign
            The design and its tabulated properties.

        """
        value = abs(mu_std)
        if math.isnan(value):
            value = 0.0
        column = int(np.searchsorted(self.mu_grid, value, side="right")) - 1
        d = int(self.choice[column])
        epsilon = self.epsilons[d % len(self.epsilons)]
        return AustereDesign(
            batch_size=self.batch_sizes[d // len(self.epsilons)],
            epsilon=epsilon,
            bound=z_bound(epsilon),
            n_total=self.n_total,
            mu_std=float(self.mu_grid[column]),
            error=float(self.errors[d, column]),
            expected_rows=float(self.rows[d, column]),
            expected_fraction=float(self.rows[d, column]) / self.n_total,
            error_bound=float(self.error_bound),
            feasible=bool(self.feasible[column]),
        )


@lru_cache(maxsize=32)
def _cached_table(
    n_total: int,
    error_bound: float,
    sizes: tuple[int, ...],
    eps: tuple[float, ...],
    mu_grid: tuple[float, ...],
    max_cell: float,
    resolution: float,
) -> AustereDesignTable:
    errors, rows = _design_grid(n_total, sizes, eps, mu_grid, max_cell, resolution)
    choice, ok = _choose(errors, rows, error_bound)
    grid = np.asarray(mu_grid)
    grid.flags.writeable = False
    choice.flags.writeable = False
    ok.flags.writeable = False
    return AustereDesignTable(
        n_total=n_total,
        error_bound=error_bound,
        batch_sizes=sizes,
        epsilons=eps,
        mu_grid=grid,
        errors=errors,
        rows=rows,
        choice=choice,
        feasible=ok,
    )


def design_table(
    n_total: int,
    error_bound: float,
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    epsilons: Sequence[float] = DEFAULT_EPSILONS,
    *,
    mu_grid: ArrayLike | None = None,
    max_cell: float = DEFAULT_MAX_CELL,
    resolution: float = DEFAULT_RESOLUTION,
) -> AustereDesignTable:
    """Tabulate the AustereMH(nc) design choice on a ``|μ_std|`` grid (cached).

    Parameters
    ----------
    n_total : int
        Population size N.
    error_bound : float
        Bound on the error ``E(μ_std)`` of the sequential test at the actual ``μ_std``.
    batch_sizes, epsilons : sequence, optional
        The design grid (default: that of Seita et al. 2017).
    mu_grid : array_like, optional
        Increasing ``|μ_std|`` values starting at 0 (default :func:`default_mu_grid`).
    max_cell, resolution : float, optional
        Discretisation of the dynamic program, see :func:`~.sequential_test_error`.

    Returns
    -------
    AustereDesignTable
        The table; :meth:`AustereDesignTable.choose` picks a design in ``O(log grid)``.

    Notes
    -----
    One run of the dynamic program per design gives its error and data usage at every
    grid value at once (change of measure, see :func:`~.sequential_test_error`); the cost is
    ``O(J L σ / h)`` per design with ``J = N/m``. With the default grid of 60 designs it
    takes about 3 s for ``N = 1.3·10⁴``, 15 s for ``N = 10⁵`` and 80 s for ``N = 10⁶``
    (once per process: the table is cached).

    References
    ----------
    .. [1] Seita et al. (2017), Appendix C.2.1 (AustereMH(nc)).
    .. [2] Korattikara et al. (2014), appendix D.

    """
    sizes, eps = _grid_key(batch_sizes, epsilons)
    grid = default_mu_grid(n_total, sizes) if mu_grid is None else np.asarray(mu_grid, float)
    if grid.ndim != 1 or grid.size == 0 or grid[0] != 0.0 or np.any(np.diff(grid) <= 0):
        raise ValueError("mu_grid must be increasing and start at 0")
    return _cached_table(
        int(n_total),
        float(error_bound),
        sizes,
        eps,
        tuple(float(x) for x in grid),
        float(max_cell),
        float(resolution),
    )


def adaptive_design(
    mu_std: float, n_total: int, error_bound: float, *grid: Any, **options: Any
) -> AustereDesign:
    """Choose the AustereMH(nc) design for the actual standardised mean ``μ_std``.

    Parameters
    ----------
    mu_std : float
        The standardised mean ``(μ − μ0) √(N − 1) / σ_l``.
    n_total, error_bound, *grid, **options
        As for :func:`design_table` (``error_bound`` bounds ``E(μ_std)``).

    Returns
    -------
    AustereDesign
        The design with the least expected data usage whose error at ``μ_std`` is below
        the bound (read from the cached :func:`design_table`, conservatively rounded
        down in ``|μ_std|``); if none is, the most accurate design with
        ``feasible=False``.

    """
    return design_table(n_total, error_bound, *grid, **options).choose(mu_std)
