"""The correction distribution ``C_σ`` of the minibatch Barker test (Seita et al. 2017).

Barker's test accepts iff ``Δ + X_log > 0`` with ``X_log`` standard logistic. The minibatch
test writes ``X_log ≈ X_norm + X_corr`` with ``X_norm ~ N(0, σ²)`` and ``X_corr ~ C_σ``, a
*correction* distribution found numerically: a discrete distribution on points ``y_j`` with
probabilities ``u_j`` such that the CDF of ``X_norm + X_corr``,
``F(x) = Σ_j u_j Φ((x − y_j)/σ)``, is uniformly close to the logistic CDF ``S(x)``. No exact
decomposition exists for ``σ > 0``, so every distribution carries an L∞ error
``sup_x |F(x) − S(x)|``, which is a floor under the error of every minibatch test.

Two solvers are provided:

``"ridge-clip"``
    The paper's procedure (Section 4, Appendix C.1): ridge regression
    ``u = (MᵀM + λI)⁻¹ Mᵀ v`` on a uniform grid, then clipping of the negative weights.
    Table 3 of the paper reports errors of ``1e-3`` to ``1e-5``.
``"lp"`` (the default)
    Minimises the L∞ error directly as a linear program over all probability vectors
    (``u ≥ 0``, ``Σ u = 1``) on a symmetric support grid, with the sup taken over a grid of
    ``x ≥ 0`` (both CDFs are symmetric about 1/2), refined by exchange (the worst points of a
    much finer grid are added as constraints and the LP is solved again). The error of the
    final, normalised distribution is then measured on a fine grid over ``[−40, 40]``.
    At ``σ = 1`` it reaches about ``5e-8`` (the paper's table: ``8.9e-4``).

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
from typing import Any

import numpy as np
import scipy
from scipy.linalg import solve as _dense_solve
from scipy.optimize import linprog
from scipy.special import expit, ndtr

__all__ = [
    "LOGISTIC_SD",
    "CorrectionDistribution",
    "get_correction",
    "ridge_correction",
    "shipped_sigmas",
]

#: Standard deviation of the standard logistic distribution, ``π/√3``; σ must stay below it.
LOGISTIC_SD: float = math.pi / math.sqrt(3.0)

#: Default verification grid: ``[−VERIFY_RANGE, VERIFY_RANGE]`` with spacing ``VERIFY_STEP``.
VERIFY_RANGE: float = 40.0
VERIFY_STEP: float = 0.002

_TABLES_DIR = Path(__file__).resolve().parent / "tables"
_TABLE_PREFIX = "correction_sigma_"
_FORMAT_VERSION = 1
_SHIPPED_MATCH_TOL = 1e-12
# Number of (x, atom) pairs evaluated at once when summing mixtures of normal CDFs.
_CHUNK_ELEMENTS = 1 << 21


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------


def _validate_sigma(sigma: object) -> float:
    """Return ``sigma`` as a float, or raise ``ValueError`` unless ``0 < sigma < π/√3``."""
    try:
        value = math.nan if isinstance(sigma, str | bytes) else float(sigma)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and 0.0 < value < LOGISTIC_SD):
        raise ValueError(
            f"sigma must be a finite number with 0 < sigma < pi/sqrt(3) ≈ {LOGISTIC_SD:.6f} "
            f"(the standard deviation of the standard logistic distribution, which "
            f"X_norm + X_corr must match, so some variance must be left for X_corr); "
            f"got sigma={sigma!r}. Use e.g. sigma=1.0 (the paper's choice): a smaller sigma "
            f"gives a more accurate correction but needs larger minibatches; shipped tables "
            f"exist for sigma in {shipped_sigmas()}."
        )
    return value


def _mixture_sf(
    x: np.ndarray, support: np.ndarray, weights: np.ndarray, sigma: float
) -> np.ndarray:
    """``Σ_j w_j Q((x − y_j)/σ)`` with ``Q = 1 − Φ``, computed without cancellation."""
    x = np.asarray(x, dtype=np.float64)
    flat = x.reshape(-1)
    out = np.empty_like(flat)
    step = max(1, _CHUNK_ELEMENTS // max(1, support.size))
    for start in range(0, flat.size, step):
        xs = flat[start : start + step]
        out[start : start + step] = ndtr((support[None, :] - xs[:, None]) / sigma) @ weights
    return out.reshape(x.shape)


def _mixture_cdf_lower(
    x: np.ndarray, support: np.ndarray, weights: np.ndarray, sigma: float
) -> np.ndarray:
    """``Σ_j w_j Φ((x − y_j)/σ)``, accurate in the lower tail."""
    return _mixture_sf(-np.asarray(x, dtype=np.float64), -support, weights, sigma)


def _signed_error(
    x: np.ndarray, support: np.ndarray, weights: np.ndarray, sigma: float
) -> np.ndarray:
    """``F(x) − S(x)``, through lower tails for ``x < 0`` and upper tails for ``x ≥ 0``."""
    x = np.asarray(x, dtype=np.float64)
    err = np.empty_like(x)
    neg = x < 0
    if np.any(neg):
        err[neg] = _mixture_cdf_lower(x[neg], support, weights, sigma) - expit(x[neg])
    pos = ~neg
    if np.any(pos):
        # F(x) − S(x) = (1 − F̄(x)) − (1 − S̄(x)) = S̄(x) − F̄(x)
        err[pos] = expit(-x[pos]) - _mixture_sf(x[pos], support, weights, sigma)
    return err


def _default_grid() -> np.ndarray:
    n = int(round(2 * VERIFY_RANGE / VERIFY_STEP))
    return np.linspace(-VERIFY_RANGE, VERIFY_RANGE, n + 1)


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


# --------------------------------------------------------------------------------------
# the distribution
# --------------------------------------------------------------------------------------


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
            Points at which to evaluate.

        Returns
        -------
        numpy.ndarray
            ``Σ_j w_j Φ((x − y_j)/σ)``, same shape as ``x`` (upper tail computed as one minus
            the survival function).

        """
        x = np.asarray(x, dtype=np.float64)
        out = np.empty_like(x)
        neg = x < 0
        out[neg] = _mixture_cdf_lower(x[neg], self.support, self.weights, self.sigma)
        out[~neg] = 1.0 - _mixture_sf(x[~neg], self.support, self.weights, self.sigma)
        return out

    def sf(self, x: np.ndarray) -> np.ndarray:
        """Survival function ``P(X_norm + X_corr > x)``, accurate in the upper tail.

        Parameters
        ----------
        x : array_like
            Points at which to evaluate.

        Returns
        -------
        numpy.ndarray
            ``Σ_j w_j Q((x − y_j)/σ)``, same shape as ``x``.

        """
        return _mixture_sf(np.asarray(x, dtype=np.float64), self.support, self.weights, self.sigma)

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
        grid = _default_grid() if x is None else np.asarray(x, dtype=np.float64)
        return float(np.max(np.abs(_signed_error(grid, self.support, self.weights, self.sigma))))

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
            renormalised.
        **options
            For ``"lp"``: ``spacing`` (support grid step; default ``min(0.05, σ/2)``),
            ``support_range`` (atoms in ``[−R, R]``, default 25), ``grid_spacing`` (initial
            constraint step, default ``min(0.05, σ/4)``), ``x_max`` (last constraint point,
            default 30), ``tol`` (HiGHS feasibility tolerances, default 1e-10), ``max_iter``
            (exchange rounds, default 10), ``time_limit`` (seconds per HiGHS call before
            falling back to another variant, default 60). For ``"ridge-clip"``: ``n``,
            ``V``, ``lam`` as in :func:`~pymc_minibatch_mh.core.correction.ridge_correction`.

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
            support, weights, info = _lp_solution(sigma, **options)
        elif method in ("ridge-clip", "ridge"):
            method = "ridge-clip"
            support, weights, info = _ridge_solution(sigma, **options)
        else:
            raise ValueError(f"unknown method {method!r}; use 'lp' (default) or 'ridge-clip'.")
        error = float(np.max(np.abs(_signed_error(_default_grid(), support, weights, sigma))))
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


# --------------------------------------------------------------------------------------
# solvers
# --------------------------------------------------------------------------------------


def _symmetric(half_support: np.ndarray, half_weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mirror atoms ``y ≥ 0`` (``y[0] = 0`` possibly) into an exactly symmetric distribution."""
    if half_support[0] == 0.0:
        support = np.concatenate([-half_support[:0:-1], half_support])
        weights = np.concatenate([half_weights[:0:-1], half_weights])
    else:
        support = np.concatenate([-half_support[::-1], half_support])
        weights = np.concatenate([half_weights[::-1], half_weights])
    return support, weights


def _solve_lp(
    c: np.ndarray,
    a_ub: np.ndarray,
    b_ub: np.ndarray,
    a_eq: np.ndarray,
    tol: float,
    *,
    ipm_first: bool,
    time_limit: float,
) -> tuple[Any, str]:
    """Solve with HiGHS, falling back to other variants if one fails or stalls.

    Dual simplex is fastest when the optimum is well above the solver's tolerance
    (σ ≳ 0.8); when it is not (small σ, where the error is at the 1e-10 floor) the problem is
    highly degenerate and dual simplex can stall, so the interior-point method goes first.
    """
    variants = [("highs-ds", tol, True), ("highs-ipm", tol, True)]
    if ipm_first:
        variants.reverse()
    variants += [("highs-ds", tol, False), ("highs-ds", 10 * tol, True)]
    tried = []
    for method, variant_tol, presolve in variants:
        label = f"{method}, tol={variant_tol:g}, presolve={presolve}"
        res = linprog(
            c,
            A_ub=a_ub,
            b_ub=b_ub,
            A_eq=a_eq,
            b_eq=[1.0],
            bounds=[(0.0, None)] * c.size,
            method=method,
            options={
                "primal_feasibility_tolerance": variant_tol,
                "dual_feasibility_tolerance": variant_tol,
                "presolve": presolve,
                "time_limit": time_limit,
            },
        )
        if res.status == 0 and res.x is not None:
            return res, label
        tried.append(f"{label}: {res.message}")
    return None, "; ".join(tried)


def _lp_solution(
    sigma: float,
    *,
    spacing: float | None = None,
    support_range: float = 25.0,
    grid_spacing: float | None = None,
    x_max: float = 30.0,
    tol: float = 1e-10,
    max_iter: int = 10,
    time_limit: float = 60.0,
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Minimax-CDF-error weights by linear programming with exchange refinement.

    Variables: weights ``w_k ≥ 0`` of the atom pairs ``±y_k`` (``y_k = k h``, ``w_0`` for
    the single atom at 0) and the bound ``t``. Constraints, for ``x`` on a grid of ``(0,
    x_max]``: ``|Σ_k w_k G_k(x) − S̄(x)| ≤ t`` with ``G_k(x) = Q((x − y_k)/σ) + Q((x +
    y_k)/σ)`` (halved for ``k = 0``) and ``S̄(x) = S(−x)``; plus ``w_0 + 2 Σ_{k≥1} w_k = 1``.
    """
    h = min(0.05, sigma / 2.0) if spacing is None else float(spacing)
    dx = min(0.05, sigma / 4.0) if grid_spacing is None else float(grid_spacing)
    if not (h > 0 and dx > 0 and support_range > 0 and x_max > 0 and max_iter >= 1):
        raise ValueError("spacing, grid_spacing, support_range, x_max, max_iter must be > 0.")
    n_half = int(round(support_range / h))
    y = h * np.arange(n_half + 1, dtype=np.float64)
    mult = np.full(y.size, 2.0)
    mult[0] = 1.0
    x = dx * np.arange(1, int(math.floor(x_max / dx)) + 1, dtype=np.float64)
    # fine positive grid for the exchange step (the error is symmetric in x)
    x_fine = np.linspace(0.0, VERIFY_RANGE, int(round(VERIFY_RANGE / VERIFY_STEP)) + 1)

    def columns(pts: np.ndarray) -> np.ndarray:
        g = ndtr((y[None, :] - pts[:, None]) / sigma) + ndtr(-(y[None, :] + pts[:, None]) / sigma)
        g[:, 0] *= 0.5
        return g

    rtol, atol = 1e-3, 5.0 * tol
    history: list[dict[str, Any]] = []
    lp_bound = math.inf
    best: tuple[float, np.ndarray, float] | None = None  # (verified, weights, LP bound)
    converged = False
    for _ in range(max_iter):
        g = columns(x)
        s_bar = expit(-x)
        ones = np.ones((x.size, 1))
        a_ub = np.block([[g, -ones], [-g, -ones]])
        b_ub = np.concatenate([s_bar, -s_bar])
        a_eq = np.concatenate([mult, [0.0]])[None, :]
        c = np.zeros(y.size + 1)
        c[-1] = 1.0
        res, solver = _solve_lp(
            c, a_ub, b_ub, a_eq, tol, ipm_first=sigma < 0.78, time_limit=time_limit
        )
        if res is None:
            raise RuntimeError(
                f"the correction LP failed for sigma={sigma} with every HiGHS variant tried "
                f"({solver}); try other options, e.g. spacing=0.1 or tol=1e-9."
            )
        lp_bound = float(res.x[-1])
        w = np.clip(res.x[:-1], 0.0, None)
        w[w < 1e-16] = 0.0
        w /= math.fsum((w * mult).tolist())
        keep = w > 0
        err = _signed_error(x_fine, *_symmetric(y[keep], w[keep]), sigma)
        abs_err = np.abs(err)
        verified = float(abs_err.max())
        if best is None or verified < best[0]:
            best = (verified, w, lp_bound)
        history.append(
            {"lp_bound": lp_bound, "verified": verified, "n_constraints": x.size, "lp": solver}
        )
        if verified <= max(lp_bound, 0.0) * (1.0 + rtol) + atol:
            converged = True
            break
        inner = abs_err[1:-1]
        peaks = np.flatnonzero(
            (inner >= abs_err[:-2]) & (inner >= abs_err[2:]) & (inner > lp_bound * (1 + rtol))
        )
        new = x_fine[peaks + 1]
        new = new[(new > 0) & (new <= x_max)]
        grown = np.unique(np.concatenate([x, new]))
        if grown.size == x.size:  # nothing left to add: the gap is the LP's own accuracy
            break
        x = grown
    assert best is not None
    verified, w, lp_bound = best
    keep = w > 0
    support, weights = _symmetric(y[keep], w[keep])
    total = math.fsum(weights.tolist())
    weights = weights / total
    info: dict[str, Any] = {
        "solver": "scipy.optimize.linprog (HiGHS)",
        "lp_bound": lp_bound,
        "lp_verified": verified,
        "exchange_converged": converged,
        "exchange_rounds": len(history),
        "history": history,
        "support_spacing": h,
        "support_range": float(support_range),
        "grid_spacing": dx,
        "x_max": float(x_max),
        "tol": tol,
        "n_candidate_atoms": int(2 * y.size - 1),
        "n_constraints": int(x.size),
    }
    return support, weights, info


def _ridge_normal_equations(
    sigma: float, n: int, V: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``MᵀM``, ``Mᵀv``, the generating vector of ``M`` and ``v`` for the paper's grids.

    ``M_ij = f(i − j)`` with ``f(m) = Φ(m V / (n σ))`` is a Toeplitz block, so ``MᵀM`` follows
    from its first row by the recurrence ``A[c+1, d+1] = A[c, d] + a_c a_d − b_c b_d`` (one row
    of ``M`` leaves the window, another enters): ``O(n²)`` work instead of ``O(n³)``.
    """
    h = V / n
    m = np.arange(-3 * n, 3 * n + 1, dtype=np.float64)
    fm = ndtr(m * h / sigma)  # fm[k] = f(k − 3n); column c of M is fm[2n − c : 6n − c + 1]
    v = expit(np.arange(-2 * n, 2 * n + 1, dtype=np.float64) * h)
    size = 2 * n + 1
    first_row = np.correlate(fm, fm[2 * n :], mode="valid")[::-1]
    mtv = np.correlate(fm, v, mode="valid")[::-1]
    a = fm[2 * n - 1 :: -1][: size - 1]  # a_c = fm[2n − 1 − c]
    b = fm[6 * n : 4 * n : -1]  # b_c = fm[6n − c], c = 0 .. 2n − 1
    ata = np.empty((size, size))
    flat = ata.reshape(-1)
    for d in range(size):
        length = size - d
        diag = np.empty(length)
        diag[0] = first_row[d]
        if length > 1:
            inc = a[: length - 1] * a[d : d + length - 1] - b[: length - 1] * b[d : d + length - 1]
            np.cumsum(inc, out=diag[1:])
            diag[1:] += first_row[d]
        flat[d : d + length * (size + 1) : size + 1] = diag  # A[c, c + d]
        flat[d * size : d * size + length * (size + 1) : size + 1] = diag  # A[c + d, c]
    return ata, mtv, fm, v


def ridge_correction(
    sigma: float, *, n: int = 4000, V: float = 20.0, lam: float = 10.0, clip: bool = True
) -> tuple[np.ndarray, np.ndarray, float]:
    """Compute the paper's ridge-regression correction, exactly as published.

    Grids ``Y_j = j V/n`` (``j = −n..n``) and ``X_i = i V/n`` (``i = −2n..2n``),
    ``M_ij = Φ((X_i − Y_j)/σ)``, ``v_i = S(X_i)``; ``u = (MᵀM + λI)⁻¹ Mᵀ v``, then negative
    weights set to 0. The weights are *not* renormalised.

    Parameters
    ----------
    sigma : float
        Standard deviation of ``X_norm``; ``0 < sigma < π/√3``.
    n : int, default 4000
        Half the number of support intervals (the paper's ``N``). Memory is about
        ``8 (2n + 1)²`` bytes (0.5 GB at the default).
    V : float, default 20.0
        Support half-width.
    lam : float, default 10.0
        Ridge penalty ``λ``.
    clip : bool, default True
        Set negative weights to zero (the paper's procedure).

    Returns
    -------
    support : numpy.ndarray
        The ``2n + 1`` points ``Y_j``.
    weights : numpy.ndarray
        ``u`` (clipped if ``clip``), not normalised.
    error : float
        ``‖M u − v‖_∞`` on the paper's ``X`` grid (Table 3's measure).

    References
    ----------
    .. [1] D. Seita, X. Pan, H. Chen, J. Canny. "An Efficient Minibatch Acceptance Test
       for Metropolis-Hastings". UAI 2017, Eq. (15) and Table 3.

    """
    sigma = _validate_sigma(sigma)
    n = int(n)
    if n < 1 or not (V > 0) or not (lam >= 0):
        raise ValueError(f"need n >= 1, V > 0, lam >= 0; got n={n}, V={V}, lam={lam}.")
    ata, mtv, fm, v = _ridge_normal_equations(sigma, n, float(V))
    ata[np.diag_indices_from(ata)] += lam
    u = _dense_solve(ata, mtv, assume_a="pos" if lam > 0 else "sym", overwrite_a=True)
    if clip:
        u = np.clip(u, 0.0, None)
    mu = np.convolve(fm, u)[2 * n : 6 * n + 1]  # (M u)_i
    error = float(np.max(np.abs(mu - v)))
    support = np.arange(-n, n + 1, dtype=np.float64) * (V / n)
    return support, u, error


def _ridge_solution(
    sigma: float, *, n: int = 4000, V: float = 20.0, lam: float = 10.0
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    support, u, paper_error = ridge_correction(sigma, n=n, V=V, lam=lam, clip=True)
    mass = math.fsum(u.tolist())
    keep = u > 0
    weights = u[keep] / mass
    info: dict[str, Any] = {
        "n": int(n),
        "V": float(V),
        "lam": float(lam),
        "paper_error": paper_error,
        "unnormalised_mass": mass,
    }
    return support[keep], weights, info


# --------------------------------------------------------------------------------------
# shipped tables
# --------------------------------------------------------------------------------------


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
