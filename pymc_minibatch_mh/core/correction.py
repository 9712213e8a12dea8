"""The correction distribution ``C_σ`` of the minibatch Barker test (Seita et al. 2017).

Barker's test accepts iff ``Δ + X_log > 0`` with ``X_log`` standard logistic. The minibatch
test writes ``X_log ≈ X_norm + X_corr`` with ``X_norm ~ N(0, σ²)`` and ``X_corr ~ C_σ``, a
*correction* distribution found numerically: a discrete distribution on points ``y_j`` with
probabilities ``u_j`` such that the CDF of ``X_norm + X_corr``,
``F(x) = Σ_j u_j Φ((x − y_j)/σ)``, is uniformly close to the logistic CDF ``S(x)``. No exact
decomposition exists for ``σ > 0``, so every distribution carries an L∞ error
``sup_x |F(x) − S(x)|``, which is a floor under the error of every minibatch test.

This module holds the distribution (:class:`CorrectionDistribution`: sampling, CDFs, its
measured error, saving and loading) and the shipped tables. The solvers that find the
weights, the linear program (``"lp"``, the default; about ``5e-8`` at ``σ = 1``) and the
paper's ridge regression (``"ridge-clip"``; ``8.9e-4`` in the paper's table), are in
:mod:`~pymc_minibatch_mh.core.correction_solvers`; :func:`~.ridge_correction` and
:data:`~.LOGISTIC_SD` are re-exported here.

``get_correction`` returns the distribution used by the samplers: a table shipped in
``pymc_minibatch_mh/core/tables/`` when one exists for this σ, else an LP solution built on
the fly and cached in memory.
"""

from __future__ import annotations

import functools
import io
import json
import math
import zipfile
from bisect import bisect_right
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import scipy

from pymc_minibatch_mh.core.correction_solvers import (
    LOGISTIC_SD,
    VERIFY_RANGE,
    VERIFY_STEP,
    lp_solution,
    mixture_cdf,
    mixture_sf,
    ridge_correction,
    ridge_solution,
    signed_error,
    validate_sigma,
    verify_grid,
)

__all__ = [
    "LOGISTIC_SD",
    "CorrectionDistribution",
    "get_correction",
    "ridge_correction",
    "shipped_sigmas",
]

_TABLES_DIR = Path(__file__).resolve().parent / "tables"
_TABLE_PREFIX = "correction_sigma_"
_FORMAT_VERSION = 1
_SHIPPED_MATCH_TOL = 1e-12


class CorrectionSampler(Protocol):
    """What the test needs of a correction distribution.

    Attributes
    ----------
    sigma : float
        σ of the normal part ``X_norm`` (the test's σ).
    error : float
        The L∞ distance between the CDF of ``X_norm + X_corr`` and the logistic CDF (0
        only for an exact correction); the test adds it to its error estimate.

    """

    sigma: float
    error: float

    def sample(self, rng: np.random.Generator) -> float:
        """One draw of ``X_corr``."""
        ...


def _validate_sigma(sigma: object) -> float:
    """Return ``sigma`` as a float, or raise ``ValueError`` naming the shipped tables."""
    return validate_sigma(sigma, shipped_sigmas)


def _write_npz(path: str | PathLike[str], arrays: dict[str, np.ndarray]) -> None:
    """Write an ``.npz`` archive byte-for-byte reproducibly (fixed zip timestamps)."""
    with zipfile.ZipFile(path, mode="w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, array in arrays.items():
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, np.asarray(array), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, buffer.getvalue())


@dataclass(frozen=True, eq=False)
class CorrectionDistribution:
    """A discrete correction distribution ``C_σ`` with its measured error.

    ``X_norm + X_corr`` with ``X_norm ~ N(0, σ²)`` and ``X_corr`` drawn from this
    distribution approximates the standard logistic law; ``error`` is the L∞ distance
    between the two CDFs. Instances are immutable (the arrays are read-only).

    Attributes
    ----------
    sigma : float
        Standard deviation of the normal part ``X_norm``.
    support : numpy.ndarray
        Increasing float64 atoms ``y_j`` of ``X_corr``.
    weights : numpy.ndarray
        Float64 probabilities of the atoms, non-negative, summing to 1.
    error : float
        ``sup_x |P(X_norm + X_corr ≤ x) − S(x)|`` of this distribution, measured on the
        default fine grid (``[−40, 40]``, spacing 0.002); see :meth:`cdf_error`.
    method : str
        How the weights were found: ``"lp"`` or ``"ridge-clip"``.
    info : dict
        Provenance (solver settings, LP bound, library versions, ...).

    """

    sigma: float
    support: np.ndarray
    weights: np.ndarray
    error: float
    method: str
    info: dict[str, Any] = field(default_factory=dict)
    _cum: np.ndarray = field(init=False, repr=False, compare=False)
    _cum_list: list[float] = field(init=False, repr=False, compare=False)
    _support_list: list[float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        sigma = _validate_sigma(self.sigma)
        support = np.array(self.support, dtype=np.float64, copy=True).reshape(-1)
        weights = np.array(self.weights, dtype=np.float64, copy=True).reshape(-1)
        if support.shape != weights.shape or support.size == 0:
            raise ValueError(
                f"support and weights must be non-empty 1-D arrays of equal length; got "
                f"{support.shape} and {weights.shape}."
            )
        if not (np.all(np.isfinite(support)) and np.all(np.diff(support) > 0)):
            raise ValueError("support must be finite and strictly increasing.")
        if not (np.all(np.isfinite(weights)) and np.all(weights >= 0)):
            raise ValueError("weights must be finite and non-negative.")
        total = math.fsum(weights.tolist())
        if abs(total - 1.0) > 1e-9:
            raise ValueError(f"weights must sum to 1; they sum to {total!r}. Normalise them.")
        support.flags.writeable = False
        weights.flags.writeable = False
        cum = np.cumsum(weights)
        cum[-1] = 1.0  # rng.random() < 1, so the last atom is always reachable, never passed
        cum.flags.writeable = False
        object.__setattr__(self, "sigma", sigma)
        object.__setattr__(self, "support", support)
        object.__setattr__(self, "weights", weights)
        object.__setattr__(self, "error", float(self.error))
        object.__setattr__(self, "method", str(self.method))
        object.__setattr__(self, "info", dict(self.info))
        object.__setattr__(self, "_cum", cum)
        object.__setattr__(self, "_cum_list", cum.tolist())
        object.__setattr__(self, "_support_list", support.tolist())

    def __repr__(self) -> str:
        return (
            f"CorrectionDistribution(sigma={self.sigma!r}, method={self.method!r}, "
            f"atoms={self.support.size}, error={self.error:.3g})"
        )

    # -- sampling ---------------------------------------------------------------------

    def sample(self, rng: np.random.Generator) -> float:
        """Draw one value of ``X_corr``.

        Consumes exactly one ``rng.random()``; inverse-CDF lookup by bisection.

        Parameters
        ----------
        rng : numpy.random.Generator
            Source of randomness.

        Returns
        -------
        float
            One draw of ``X_corr``.

        """
        return self._support_list[bisect_right(self._cum_list, rng.random())]

    def sample_many(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """Draw ``size`` independent values of ``X_corr``.

        Consumes ``rng.random(size)``; with NumPy's generators this gives the same values as
        ``size`` successive calls of :meth:`sample`.

        Parameters
        ----------
        rng : numpy.random.Generator
            Source of randomness.
        size : int
            Number of draws.

        Returns
        -------
        numpy.ndarray
            Float64 array of shape ``(size,)``.

        """
        u = rng.random(size)
        return self.support[np.searchsorted(self._cum, u, side="right")]

    # -- distribution functions ---------------------------------------------------------

    def cdf(self, x: np.ndarray) -> np.ndarray:
        """CDF of ``X_norm + X_corr``.

        Parameters
        ----------
        x : array_like
            Points at which to evaluate ``F``.

        Returns
        -------
        numpy.ndarray
            ``F(x) = Σ_j w_j Φ((x − y_j)/σ)``, same shape as ``x`` (for ``x ≥ 0`` one minus
            :meth:`sf`, see :func:`~.mixture_cdf`).

        """
        return mixture_cdf(x, self.support, self.weights, self.sigma)

    def sf(self, x: np.ndarray) -> np.ndarray:
        """Survival function ``P(X_norm + X_corr > x)``, accurate in the upper tail.

        Parameters
        ----------
        x : array_like
            Points at which to evaluate ``1 − F``, without the cancellation of
            ``1 − cdf(x)`` for large ``x``.

        Returns
        -------
        numpy.ndarray
            ``Σ_j w_j Q((x − y_j)/σ)`` with ``Q = 1 − Φ``, same shape as ``x``.

        """
        return mixture_sf(x, self.support, self.weights, self.sigma)

    def cdf_error(self, x: np.ndarray | None = None) -> float:
        """L∞ distance between the CDF of ``X_norm + X_corr`` and the logistic CDF.

        Lower tails are compared for ``x < 0`` and upper tails (survival functions) for
        ``x ≥ 0``, so there is no cancellation in either tail.

        Parameters
        ----------
        x : array_like, optional
            Evaluation points. Default: ``[−40, 40]`` with spacing 0.002 (both tails are
            below ``5e-18`` beyond it).

        Returns
        -------
        float
            ``max_x |F(x) − S(x)|`` over the points.

        """
        grid = verify_grid() if x is None else np.asarray(x, dtype=np.float64)
        return float(np.max(np.abs(signed_error(grid, self.support, self.weights, self.sigma))))

    # -- construction and persistence -----------------------------------------------------

    @classmethod
    def build(cls, sigma: float, *, method: str = "lp", **options: Any) -> CorrectionDistribution:
        """Compute a correction distribution.

        Parameters
        ----------
        sigma : float
            Standard deviation of ``X_norm``; ``0 < sigma < π/√3``.
        method : {"lp", "ridge-clip"}
            ``"lp"`` minimises the L∞ error directly (see the module docstring);
            ``"ridge-clip"`` (alias ``"ridge"``) is the paper's ridge-then-clip procedure,
            renormalised (see :mod:`~pymc_minibatch_mh.core.correction_solvers`).
        **options
            For ``"lp"``: ``spacing`` (support grid step; default ``min(0.05, σ/2)``),
            ``support_range`` (atoms in ``[−R, R]``, default 25), ``grid_spacing`` (initial
            constraint step, default ``min(0.05, σ/4)``), ``x_max`` (last constraint point,
            default 30), ``tol`` (HiGHS feasibility tolerances, default 1e-10), ``max_iter``
            (exchange rounds, default 10), ``time_limit`` (seconds per HiGHS call before
            falling back to another variant, default 60). For ``"ridge-clip"``: ``n``,
            ``V``, ``lam`` as in :func:`~.ridge_correction`.

        Returns
        -------
        CorrectionDistribution
            With weights exactly normalised and ``error`` measured on the default grid.

        Raises
        ------
        ValueError
            If ``sigma`` is out of range or ``method`` is unknown.

        References
        ----------
        .. [1] D. Seita, X. Pan, H. Chen, J. Canny. "An Efficient Minibatch Acceptance Test
           for Metropolis-Hastings". UAI 2017, Section 4 and Appendix C.1.

        """
        sigma = _validate_sigma(sigma)
        if method == "lp":
            support, weights, info = lp_solution(sigma, **options)
        elif method in ("ridge-clip", "ridge"):
            method = "ridge-clip"
            support, weights, info = ridge_solution(sigma, **options)
        else:
            raise ValueError(f"unknown method {method!r}; use 'lp' (default) or 'ridge-clip'.")
        error = float(np.max(np.abs(signed_error(verify_grid(), support, weights, sigma))))
        info["verify_grid"] = f"[-{VERIFY_RANGE:g}, {VERIFY_RANGE:g}] step {VERIFY_STEP:g}"
        info["n_atoms"] = int(support.size)
        info["variance"] = float(weights @ support**2)
        info["target_variance"] = LOGISTIC_SD**2 - sigma**2
        info["numpy_version"] = np.__version__
        info["scipy_version"] = scipy.__version__
        return cls(
            sigma=sigma, support=support, weights=weights, error=error, method=method, info=info
        )

    def save(self, path: str | PathLike[str]) -> None:
        """Save to an ``.npz`` file (no pickles; byte-for-byte reproducible).

        Parameters
        ----------
        path : str or os.PathLike
            Destination file; written as given (no suffix is appended).

        """
        _write_npz(
            path,
            {
                "format_version": np.array(_FORMAT_VERSION),
                "sigma": np.array(self.sigma),
                "support": self.support,
                "weights": self.weights,
                "error": np.array(self.error),
                "method": np.array(self.method),
                "info": np.array(json.dumps(self.info, sort_keys=True)),
            },
        )

    @classmethod
    def load(cls, path: str | PathLike[str]) -> CorrectionDistribution:
        """Load a distribution written by :meth:`save`.

        Parameters
        ----------
        path : str or os.PathLike
            An ``.npz`` file.

        Returns
        -------
        CorrectionDistribution
            The stored distribution, exactly as saved.

        """
        with np.load(path, allow_pickle=False) as data:
            version = int(data["format_version"])
            if version != _FORMAT_VERSION:
                raise ValueError(f"{path}: unsupported correction table format {version}.")
            return cls(
                sigma=float(data["sigma"]),
                support=np.array(data["support"], dtype=np.float64),
                weights=np.array(data["weights"], dtype=np.float64),
                error=float(data["error"]),
                method=str(data["method"]),
                info=json.loads(str(data["info"])),
            )


def table_path(sigma: float, directory: str | PathLike[str] | None = None) -> Path:
    """File name of the shipped table for ``sigma``.

    Parameters
    ----------
    sigma : float
        The σ of the table.
    directory : str or os.PathLike, optional
        Table directory; default the package's ``core/tables``.

    Returns
    -------
    pathlib.Path
        ``<directory>/correction_sigma_<σ with 4 decimals>.npz``.

    """
    base = _TABLES_DIR if directory is None else Path(directory)
    return base / f"{_TABLE_PREFIX}{sigma:.4f}.npz"


@functools.lru_cache(maxsize=1)
def _table_index() -> dict[float, Path]:
    index: dict[float, Path] = {}
    if _TABLES_DIR.is_dir():
        for path in sorted(_TABLES_DIR.glob(f"{_TABLE_PREFIX}*.npz")):
            with np.load(path, allow_pickle=False) as data:
                index[float(data["sigma"])] = path
    return index


def shipped_sigmas() -> tuple[float, ...]:
    """Return the σ values for which a precomputed table ships with the package.

    Returns
    -------
    tuple of float
        Increasing.

    """
    return tuple(sorted(_table_index()))


@functools.lru_cache(maxsize=32)
def _cached_correction(sigma: float) -> CorrectionDistribution:
    path = _table_index().get(sigma)
    if path is not None:
        return CorrectionDistribution.load(path)
    return CorrectionDistribution.build(sigma, method="lp")


def get_correction(sigma: float = 1.0) -> CorrectionDistribution:
    """Return the correction distribution used by the samplers.

    Parameters
    ----------
    sigma : float, default 1.0
        Standard deviation of ``X_norm``; ``0 < sigma < π/√3 ≈ 1.8138``.

    Returns
    -------
    CorrectionDistribution
        The shipped table for this σ (matched to 1e-12) if there is one, else the LP
        solution built on the fly (about a second) and cached in memory.

    Raises
    ------
    ValueError
        If ``sigma`` is not a finite number in ``(0, π/√3)``.

    References
    ----------
    .. [1] D. Seita, X. Pan, H. Chen, J. Canny. "An Efficient Minibatch Acceptance Test
       for Metropolis-Hastings". UAI 2017, Section 4.

    """
    value = _validate_sigma(sigma)
    for shipped in _table_index():
        if abs(shipped - value) <= _SHIPPED_MATCH_TOL:
            value = shipped  # one cache entry per shipped table
            break
    return _cached_correction(value)
