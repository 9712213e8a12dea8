"""Solvers for the correction distribution ``C_σ`` and the mixture CDF they fit.

The correction distribution (:mod:`~pymc_minibatch_mh.core.correction`) is a discrete
distribution on points ``y_j`` with probabilities ``u_j`` such that the CDF of
``X_norm + X_corr``, ``F(x) = Σ_j u_j Φ((x − y_j)/σ)``, is uniformly close to the logistic
CDF ``S(x)``. Two solvers find the ``u_j``:

``"ridge-clip"`` (:func:`ridge_correction`, :func:`ridge_solution`)
    The paper's procedure (Section 4, Appendix C.1): ridge regression
    ``u = (MᵀM + λI)⁻¹ Mᵀ v`` on a uniform grid, then clipping of the negative weights.
    Table 3 of the paper reports errors of ``1e-3`` to ``1e-5``.
``"lp"`` (:func:`lp_solution`, the default)
    Minimises the L∞ error directly as a linear program over all probability vectors
    (``u ≥ 0``, ``Σ u = 1``) on a symmetric support grid, with the sup taken over a grid of
    ``x ≥ 0`` (both CDFs are symmetric about 1/2), refined by exchange (the worst points of a
    much finer grid are added as constraints and the LP is solved again). The error of the
    final, normalised distribution is then measured on a fine grid over ``[−40, 40]``.
    At ``σ = 1`` it reaches about ``5e-8`` (the paper's table: ``8.9e-4``).

The mixture's tails (:func:`mixture_cdf`, :func:`mixture_sf`) and its signed error
against the logistic CDF (:func:`signed_error`) are computed here once, without
cancellation in either tail, for the solvers and for the distribution class.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
from scipy.linalg import solve as _dense_solve
from scipy.optimize import linprog
from scipy.special import ndtr

from pymc_minibatch_mh.core.logistic import barker_probabilities

__all__ = [
    "LOGISTIC_SD",
    "VERIFY_RANGE",
    "VERIFY_STEP",
    "lp_solution",
    "mixture_cdf",
    "mixture_sf",
    "ridge_correction",
    "ridge_solution",
    "signed_error",
    "validate_sigma",
    "verify_grid",
]

#: Standard deviation of the standard logistic distribution, ``π/√3``; σ must stay below it.
LOGISTIC_SD: float = math.pi / math.sqrt(3.0)

#: Default verification grid: ``[−VERIFY_RANGE, VERIFY_RANGE]`` with spacing ``VERIFY_STEP``.
VERIFY_RANGE: float = 40.0
#: Spacing of the default verification grid.
VERIFY_STEP: float = 0.002

# Number of (x, atom) pairs evaluated at once when summing mixtures of normal CDFs.
_CHUNK_ELEMENTS = 1 << 21


def validate_sigma(
    sigma: object, shipped: Callable[[], Sequence[float]] | None = None
) -> float:
    """Return ``sigma`` as a float, or raise ``ValueError`` unless ``0 < sigma < π/√3``.

    Parameters
    ----------
    sigma : object
        The σ asked for.
    shipped : callable, optional
        Returns the σ of the shipped tables, named in the error message (called only on
        an error).

    Returns
    -------
    float
        ``sigma``.

    """
    try:
        value = math.nan if isinstance(sigma, str | bytes) else float(sigma)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and 0.0 < value < LOGISTIC_SD):
        tables = f"; shipped tables exist for sigma in {tuple(shipped())}" if shipped else ""
        raise ValueError(
            f"sigma must be a finite number with 0 < sigma < pi/sqrt(3) ≈ {LOGISTIC_SD:.6f} "
            f"(the standard deviation of the standard logistic distribution, which "
            f"X_norm + X_corr must match, so some variance must be left for X_corr); "
            f"got sigma={sigma!r}. Use e.g. sigma=1.0 (the paper's choice): a smaller sigma "
            f"gives a more accurate correction but needs larger minibatches{tables}."
        )
    return value


def mixture_sf(
    x: np.ndarray, support: np.ndarray, weights: np.ndarray, sigma: float
) -> np.ndarray:
    """Upper tail ``Σ_j w_j Q((x − y_j)/σ)`` of the mixture, ``Q = 1 − Φ``.

    Parameters
    ----------
    x : array_like
        Points.
    support, weights : numpy.ndarray
        Atoms ``y_j`` and their weights ``w_j``.
    sigma : float
        Standard deviation of the normal part.

    Returns
    -------
    numpy.ndarray
        The survival function at ``x``, same shape, without cancellation.

    """
    x = np.asarray(x, dtype=np.float64)
    flat = x.reshape(-1)
    out = np.empty_like(flat)
    step = max(1, _CHUNK_ELEMENTS // max(1, support.size))
    for start in range(0, flat.size, step):
        xs = flat[start : start + step]
        out[start : start + step] = ndtr((support[None, :] - xs[:, None]) / sigma) @ weights
    return out.reshape(x.shape)


def _minus_reference(
    x: np.ndarray,
    support: np.ndarray,
    weights: np.ndarray,
    sigma: float,
    lower_ref: Callable[[np.ndarray], np.ndarray],
    upper_ref: Callable[[np.ndarray], np.ndarray],
) -> np.ndarray:
    """``F(x) − R(x)`` for a reference CDF R given by its lower and upper tails.

    Each side is computed from the tails, where they are small: ``F(x) − R(x)`` for
    ``x < 0`` and ``(1 − R(x)) − (1 − F(x))`` for ``x ≥ 0``, so neither tail cancels.
    """
    x = np.asarray(x, dtype=np.float64)
    neg = x < 0
    out = np.empty_like(x)
    # F(x) = Σ_j w_j Φ((x − y_j)/σ) = Σ_j w_j Q((−x − (−y_j))/σ)
    out[neg] = mixture_sf(-x[neg], -support, weights, sigma) - lower_ref(x[neg])
    out[~neg] = upper_ref(x[~neg]) - mixture_sf(x[~neg], support, weights, sigma)
    return out


def mixture_cdf(
    x: np.ndarray,
    support: np.ndarray,
    weights: np.ndarray,
    sigma: float,
    *,
    reference: Literal["zero", "logistic"] = "zero",
) -> np.ndarray:
    """CDF ``F(x) = Σ_j w_j Φ((x − y_j)/σ)`` of the mixture, or its error ``F(x) − S(x)``.

    Parameters
    ----------
    x, support, weights, sigma
        As for :func:`mixture_sf`.
    reference : {"zero", "logistic"}, optional
        The CDF ``R`` subtracted: ``"zero"`` (``R = 0``) gives ``F`` itself,
        ``"logistic"`` the signed error against the logistic CDF ``S``.

    Returns
    -------
    numpy.ndarray
        ``F(x) − R(x)`` at ``x``, same shape, through the lower tails for ``x < 0`` and
        the upper tails (one minus :func:`mixture_sf`) for ``x ≥ 0``.

    """
    return _minus_reference(x, support, weights, sigma, *_REFERENCE_TAILS[reference])


def signed_error(
    x: np.ndarray, support: np.ndarray, weights: np.ndarray, sigma: float
) -> np.ndarray:
    """``F(x) − S(x)``: :func:`mixture_cdf` with ``reference="logistic"``."""
    return mixture_cdf(x, support, weights, sigma, reference="logistic")


def _logistic_sf(x: np.ndarray) -> np.ndarray:
    """``1 − S(x) = S(−x)``."""
    return barker_probabilities(-x)


# Lower and upper tails of the reference CDFs R of :func:`mixture_cdf`: the "CDF" 0 (lower
# tail 0, upper tail 1) leaves F itself.
_REFERENCE_TAILS: dict[str, tuple[Callable[[np.ndarray], np.ndarray], ...]] = {
    "zero": (np.zeros_like, np.ones_like),
    "logistic": (barker_probabilities, _logistic_sf),
}


def verify_grid() -> np.ndarray:
    """Return the default verification grid, ``[−40, 40]`` with spacing 0.002.

    Returns
    -------
    numpy.ndarray
        The grid (both tails of every shipped distribution are below ``5e-18`` beyond).

    """
    n = int(round(2 * VERIFY_RANGE / VERIFY_STEP))
    return np.linspace(-VERIFY_RANGE, VERIFY_RANGE, n + 1)


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


def lp_solution(
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

    Returns ``(support, weights, info)``: a symmetric distribution normalised to 1 and the
    provenance record (LP bound, verified error, exchange history, settings).

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
        s_bar = barker_probabilities(-x)
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
        err = signed_error(x_fine, *_symmetric(y[keep], w[keep]), sigma)
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
    v = barker_probabilities(np.arange(-2 * n, 2 * n + 1, dtype=np.float64) * h)
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
    sigma = validate_sigma(sigma)
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


def ridge_solution(
    sigma: float, *, n: int = 4000, V: float = 20.0, lam: float = 10.0
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """The paper's ridge-then-clip weights (:func:`ridge_correction`), renormalised.

    Returns the atoms with positive weight, their weights divided by the clipped mass, and
    the provenance record (the paper's own error measure among it).
    """
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

