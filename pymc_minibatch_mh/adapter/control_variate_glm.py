r"""Taylor control variates in each row's per-row quantities (the "linear predictor").

The θ-space expansion of :mod:`~pymc_minibatch_mh.adapter.control_variate` is poor when
the rows see θ through a function that is far from linear over the posterior, as in a
hierarchical model with non-centred group effects (``mu + exp(log_tau) * z[group]``),
although each row's linear predictor is concentrated. :class:`PredictorTaylorEstimator`
expands each row's log-likelihood to second order in its per-row quantities ``q_i``
instead (:mod:`~pymc_minibatch_mh.adapter.predictor` finds them and writes
``q_i(θ) = F_i c(θ) + o_i``, data features times coefficients of θ alone):

.. math::

    ℓ_i(q) ≈ ℓ_i(q̂_i) + g_i^T (q − q̂_i) + ½ (q − q̂_i)^T H_i (q − q̂_i),
    \qquad q̂_i = q_i(θ̂).

With ``d = c(θ′) − c(θ)`` and ``w = c(θ′) + c(θ) − 2c(θ̂)`` the full-data sum of the
differences of the proxies is ``A·d + ½ dᵀ B w`` with the sufficient statistics
``A = Σ_i F_iᵀ g_i`` and ``B = Σ_i F_iᵀ H_i F_i`` (K and K × K, K the number of
coefficients), computed in one pass over the row store at θ̂. The per-row function gives
the residuals ``r_i = [ℓ_i(θ′) − ℓ_i(θ) − g_iᵀδq_i − ½ δq_iᵀ H_i w q_i] / K_temp`` with
``δq_i = q_i(θ′) − q_i(θ)`` and ``wq_i = q_i(θ′) + q_i(θ) − 2q̂_i`` (``g_i``, ``H_i``
recomputed at ``q̂_i`` for the rows drawn), and its data-free part adds the closed form
``(A·d + ½ dᵀ B w) / K_temp`` to the prior difference: Δ* is unbiased for any θ̂.

The same pass gives the θ-space sums by the chain rule, at no extra data cost:
``G = Jᵀ A`` and ``H = Jᵀ B J + Σ_k A_k ∇²c_k`` (J the Jacobian of c at θ̂), hence the
Laplace covariance at θ̂ (``S="laplace"``) and the Newton steps of the MAP search.

**Reference point.** L-BFGS-B on the full-data log posterior, then Newton steps (exact
Hessians, one pass each) as for the θ-space expansion; when the Newton polishing does
not reach :data:`~pymc_minibatch_mh.adapter.reference.MAP_TOLERANCE` (where the log
posterior is not concave in θ, as in the funnel of a hierarchical model, the Newton
decrement is infinite) the last point reached is accepted: any θ̂ gives an unbiased
estimator, and what the residuals need is that every ``q̂_i`` is near the bulk of its
posterior, which holds after L-BFGS-B. The decrement is reported in
:attr:`PredictorTaylorEstimator.map_decrement` and :attr:`~PredictorTaylorEstimator.map_converged`
(information, not an error).

**Selection** (:func:`select`, used by ``control_variate="taylor"``): this expansion when
the decomposition succeeds for every observed variable and some coefficient is not
affine in θ; the θ-space expansion otherwise. With affine coefficients (a plain GLM:
``X @ b``) both expansions are the same function (the second derivative of q in θ is
zero), so nothing is gained by switching.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pytensor
import pytensor.tensor as pt
from numpy.typing import NDArray
from pytensor.gradient import grad
from pytensor.graph.rewriting.utils import rewrite_graph

from pymc_minibatch_mh.adapter.control_variate import TaylorEstimator
from pymc_minibatch_mh.adapter.estimator import PrefetchPolicy, RatioEstimator
from pymc_minibatch_mh.adapter.graph import checks_as_ninf, clone_replace
from pymc_minibatch_mh.adapter.likelihood import MinibatchLikelihood
from pymc_minibatch_mh.adapter.predictor import (
    MAX_FEATURES,
    DecompositionError,
    Predictors,
    analyse,
    coefficient_vector,
)
from pymc_minibatch_mh.adapter.pytensor_internals import direct_call
from pymc_minibatch_mh.adapter.reference import (
    _FULL_PASS_MODE,
    ControlVariateError,
    TaylorPasses,
)
from pymc_minibatch_mh.core.control_variate import TaylorReference

__all__ = [
    "PredictorAnalysis",
    "PredictorPasses",
    "PredictorReference",
    "PredictorTaylorEstimator",
    "select",
]

_log = logging.getLogger("pymc_minibatch_mh")


@dataclass(frozen=True)
class PredictorReference(TaylorReference):
    """A θ-space Taylor reference with the sums of the per-row-quantity expansion.

    The :class:`~pymc_minibatch_mh.core.control_variate.TaylorReference` fields hold the
    θ-space G and H (by the chain rule); the extra fields, the sufficient statistics.

    Parameters
    ----------
    coef : numpy.ndarray
        ``c(θ̂)``, shape ``(K,)``.
    coef_gradient : numpy.ndarray
        ``A = Σ_i F_iᵀ g_i``, shape ``(K,)``.
    coef_hessian : numpy.ndarray
        ``B = Σ_i F_iᵀ H_i F_i``, shape ``(K, K)``.

    """

    coef: NDArray[np.float64] | None = None
    coef_gradient: NDArray[np.float64] | None = None
    coef_hessian: NDArray[np.float64] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("coef", "coef_gradient", "coef_hessian"):
            value = np.array(getattr(self, name), dtype=np.float64)
            if name == "coef_hessian":
                value = 0.5 * (value + value.T)
            value.setflags(write=False)
            object.__setattr__(self, name, value)

    def coef_difference(self, c_cur: NDArray[np.float64], c_prop: NDArray[np.float64]) -> float:
        """``A·d + ½ dᵀ B w``: the full-data sum of the proxies' differences."""
        d = c_prop - c_cur
        w = c_prop + c_cur - 2.0 * self.coef
        return float(self.coef_gradient @ d + 0.5 * d @ (self.coef_hessian @ w))


# --------------------------------------------------------------------- analysis
class PredictorAnalysis:
    """The decomposition of a likelihood, with its batch graphs and θ-only functions.

    Parameters
    ----------
    likelihood : MinibatchLikelihood
        The step's compiled likelihood.

    Raises
    ------
    DecompositionError
        If some observed variable's quantities do not decompose.

    """

    def __init__(self, likelihood: MinibatchLikelihood) -> None:
        self.likelihood = likelihood
        graphs = likelihood.graphs
        row_vars = likelihood.store.row_vars
        self.predictors: Predictors = analyse(likelihood.model, likelihood.value_vars, row_vars)
        # The value variables as slices of the flat state (as split_model does).
        flat = graphs.flat
        self.value_repl = {
            var: flat[e.start : e.start + e.size].reshape(e.shape).astype(var.dtype)
            for var, e in zip(likelihood.value_vars, likelihood.point_map.entries, strict=True)
        }
        preds = self.predictors
        self.n_batch = graphs.data[0].shape[0]

        # θ-only coefficients: c(flat), and per term.
        coef = self.rows(coefficient_vector(preds))
        self.coef = coef
        terms = [t for q in preds.quantities for t in q.terms]
        self.term_quantity = [j for j, q in enumerate(preds.quantities) for _ in q.terms]
        self.terms = terms
        parts = self.rows([pt.as_tensor(t.coef).astype("float64").flatten() for t in terms])
        fast = "FAST_COMPILE"
        self._parts_fn = pytensor.function([flat], parts, mode=fast, on_unused_input="ignore")
        x0 = likelihood.point_map.to_flat(likelihood.initial_point)
        self.sizes = [int(np.size(p)) for p in self._parts_fn(x0)]
        self.n_coef = int(sum(self.sizes))
        if self.n_coef > MAX_FEATURES:
            raise DecompositionError(
                f"The decomposition has {self.n_coef} coefficients; the closed form needs a "
                f"matrix of that size squared (at most {MAX_FEATURES} are accepted)."
            )
        starts = np.concatenate([[0], np.cumsum(self.sizes)]).astype(int)
        self.slices = [slice(int(a), int(b)) for a, b in zip(starts[:-1], starts[1:],
                                                              strict=True)]
        u = pt.vector("u", dtype="float64")
        v = pt.vector("v", dtype="float64")
        vjp = grad(pt.dot(u, coef), flat, disconnected_inputs="ignore")
        hvp = grad(pt.dot(vjp, v), flat, disconnected_inputs="ignore")
        self._coef_fn = pytensor.function([flat], coef, mode=fast, on_unused_input="ignore")
        self._vjp_fn = pytensor.function([flat, u], vjp, mode=fast, on_unused_input="ignore")
        self._hvp_fn = pytensor.function([flat, u, v], hvp, mode=fast,
                                         on_unused_input="ignore")
        self._graphs = (flat, u, coef, vjp)  # compiled for speed on first per-step use
        self._step_fns: Any = None
        self.x0 = x0

    def rows(self, outputs: Any) -> Any:
        """Model graphs rebuilt on the row batches and the flat state."""
        lik = self.likelihood
        return self.predictors.to_rows(lik.graphs, lik.store.row_vars, self.value_repl,
                                       outputs)

    # ------------------------------------------------------------ θ-only parts
    def coefficients(self, x: NDArray[np.float64]) -> NDArray[np.float64]:
        """``c(θ)`` (all coefficients, flat)."""
        return np.asarray(self._coef_fn(x), dtype=np.float64)

    def jacobian(self, x: NDArray[np.float64]) -> NDArray[np.float64]:
        """``∂c/∂θ`` at ``x``, shape ``(K, d)`` (K vector-Jacobian products; no data)."""
        eye = np.eye(self.n_coef)
        return np.array([self._vjp_fn(x, eye[k]) for k in range(self.n_coef)]).reshape(
            self.n_coef, x.size
        )

    def step_functions(self) -> tuple[Any, Any]:
        """``(c(x), (∂c/∂θ)ᵀ v)`` compiled with the step's backend (first use compiles).

        For what runs at every step (the surrogate gradient of MALA and HMC); the other
        functions of this class run at set-up only and are compiled quickly instead.
        """
        if self._step_fns is None:
            flat, u, coef, vjp = self._graphs
            lik = self.likelihood
            self._step_fns = (
                direct_call(lik.compile([flat], coef)),
                direct_call(lik.compile([flat, u], vjp)),
            )
        return self._step_fns

    def curvature(self, x: NDArray[np.float64], a: NDArray[np.float64]) -> NDArray[np.float64]:
        """``Σ_k a_k ∇²c_k(x)``, shape ``(d, d)`` (d Hessian-vector products; no data)."""
        eye = np.eye(x.size)
        return np.column_stack([self._hvp_fn(x, a, eye[j]) for j in range(x.size)])

    def is_affine(self) -> bool:
        """Whether every coefficient is affine in θ (checked at two points, fixed seed)."""
        rng = np.random.default_rng(20240611)
        for scale in (0.0, 0.7):
            x = self.x0 + scale * rng.standard_normal(self.x0.size)
            a = rng.standard_normal(self.n_coef)
            with np.errstate(all="ignore"):
                h = self.curvature(x, a)
            if not np.all(h == 0.0):
                return False
        return True

    @property
    def name(self) -> str:
        """A short description of the quantities (for logs)."""
        out = []
        for q in self.predictors.quantities:
            link = f"{q.link.lower()}⁻¹ of " if q.link else ""
            out.append(f"{q.observed}[param {q.position}] = {link}{len(q.terms)} term(s)")
        return "; ".join(out)


def select(likelihood: MinibatchLikelihood) -> tuple[PredictorAnalysis | None, str]:
    """Which expansion ``control_variate="taylor"`` uses, and why.

    Returns
    -------
    tuple
        ``(analysis, reason)``: the analysis when the per-row-quantity expansion is
        chosen, else None; ``reason`` says why (for logs and error messages).

    """
    try:
        analysis = PredictorAnalysis(likelihood)
    except DecompositionError as err:
        return None, f"the per-row quantities do not decompose: {err}"
    except Exception as err:  # noqa: BLE001 - an unforeseen graph: the θ-space expansion
        return None, f"the analysis failed ({err.__class__.__name__}: {err})"
    if analysis.is_affine():
        return None, ("every coefficient is affine in the parameters, so the expansion in "
                      "the per-row quantities equals the θ-space expansion")
    return analysis, f"per-row quantities: {analysis.name}"


# ----------------------------------------------------------------------- passes
class PredictorPasses(TaylorPasses):
    """Full-data passes of the per-row-quantity expansion (and the MAP search).

    :meth:`reference_at` computes ``A``, ``B`` and the log-likelihood in one pass over
    the row store (chunks; O(K²) memory) and the θ-space gradient and Hessian from them
    by the chain rule. The MAP search is :meth:`TaylorPasses.find_map`'s, whose Newton
    steps therefore cost one pass each.
    """

    def __init__(self, likelihood: MinibatchLikelihood, step_name: str,
                 analysis: PredictorAnalysis) -> None:
        self.analysis = analysis
        super().__init__(likelihood, step_name)
        self._compile_sums()

    def _compile_sums(self) -> None:
        an = self.analysis
        graphs = self.likelihood.graphs
        flat, data = graphs.flat, list(graphs.data)
        g, h, loglik = quantity_derivatives(an, flat)
        features = []
        n = an.n_batch
        for t in an.terms:
            if t.kind == "index":
                features.append(pt.as_tensor(an.rows(t.index)).astype("int64"))
                if t.feature is not None:
                    features.append(pt.broadcast_to(an.rows(t.feature).astype("float64"), (n,)))
            elif t.feature is not None:
                f = an.rows(t.feature).astype("float64")
                shape = (n,) if f.ndim <= 1 else (n, f.shape[-1])
                features.append(pt.broadcast_to(f, shape))
        self._pairs = [(j, j2) for j, j2, _ in h]
        h = [hjl for _, _, hjl in h] or [pt.zeros((n,))]
        outputs = [pt.sum(loglik), pt.stack(g, axis=1), pt.stack(h, axis=1), *features]
        fn = pytensor.function([flat, *data], outputs, mode=_FULL_PASS_MODE,
                               on_unused_input="ignore")
        fn.trust_input = True
        self._sums_fn = fn

    def _blocks(self, features: list[NDArray[Any]], n: int) -> list[tuple[Any, ...]]:
        """Per term: ``("dense", X (n, K))`` or ``("index", idx, weight or None, G)``."""
        an = self.analysis
        out = []
        pos = 0
        for t, size in zip(an.terms, an.sizes, strict=True):
            if t.kind == "index":
                idx = features[pos]
                pos += 1
                weight = None
                if t.feature is not None:
                    weight = features[pos]
                    pos += 1
                idx = np.where(idx < 0, idx + size, idx)
                out.append(("index", idx, weight, size))
            elif t.feature is None:
                out.append(("dense", np.ones((n, 1))))
            else:
                f = features[pos]
                pos += 1
                out.append(("dense", f.reshape(n, -1)))
        return out

    @staticmethod
    def _left(block: tuple[Any, ...], v: NDArray[np.float64]) -> NDArray[np.float64]:
        """``F_tᵀ v``."""
        if block[0] == "dense":
            return block[1].T @ v
        _, idx, weight, size = block
        return np.bincount(idx, weights=v if weight is None else weight * v, minlength=size)

    @staticmethod
    def _gram(bt: tuple[Any, ...], bs: tuple[Any, ...], h: NDArray[np.float64]) -> Any:
        """``F_tᵀ diag(h) F_s``."""
        if bt[0] == "dense" and bs[0] == "dense":
            return (bt[1] * h[:, None]).T @ bs[1]
        if bt[0] == "index" and bs[0] == "index":
            _, it, wt, gt = bt
            _, is_, ws, gs = bs
            weights = h if wt is None else h * wt
            weights = weights if ws is None else weights * ws
            return np.bincount(it * gs + is_, weights=weights, minlength=gt * gs).reshape(
                gt, gs
            )
        if bt[0] == "dense":
            return PredictorPasses._gram(bs, bt, h).T
        _, it, wt, gt = bt
        x = bs[1]
        weights = h if wt is None else h * wt
        return np.column_stack(
            [np.bincount(it, weights=weights * x[:, k], minlength=gt) for k in range(x.shape[1])]
        )

    def sums(self, x: NDArray[np.float64]) -> tuple[float, NDArray[np.float64],
                                                    NDArray[np.float64]]:
        """Log-likelihood, ``A`` and ``B`` at ``x``: one counted pass over the rows."""
        an = self.analysis
        k = an.n_coef
        total = 0.0
        a = np.zeros(k)
        b = np.zeros((k, k))
        owner = an.term_quantity
        for chunk in self.store.chunks():
            loglik, g, h, *features = self._sums_fn(x, *chunk)
            n = g.shape[0]
            total += float(loglik)
            blocks = self._blocks(features, n)
            for t, bt in enumerate(blocks):
                a[an.slices[t]] += self._left(bt, g[:, owner[t]])
            for p, (j, j2) in enumerate(self._pairs):
                hjl = h[:, p]
                if not np.any(hjl):
                    continue
                for t, bt in enumerate(blocks):
                    if owner[t] != j:
                        continue
                    for s, bs in enumerate(blocks):
                        if owner[s] != j2 or (j == j2 and s < t):
                            continue
                        block = np.asarray(self._gram(bt, bs, hjl))
                        b[an.slices[t], an.slices[s]] += block
                        if (j, t) != (j2, s):
                            b[an.slices[s], an.slices[t]] += block.T
        self.evaluations += self.store.n_rows
        return total, a, b

    def reference_at(self, x: NDArray[np.float64], what: str) -> PredictorReference:
        """``A``, ``B`` (and the θ-space G, H by the chain rule) at ``x``, checked finite."""
        an = self.analysis
        with np.errstate(all="ignore"):
            loglik, a, b = self.sums(x)
        ok = math.isfinite(loglik) and np.all(np.isfinite(a)) and np.all(np.isfinite(b))
        if ok:
            jac = an.jacobian(x)
            g = jac.T @ a
            h = jac.T @ b @ jac + an.curvature(x, a)
            ok = np.all(np.isfinite(g)) and np.all(np.isfinite(h))
        if not ok:
            raise ControlVariateError(
                f"The log-likelihood or its derivatives are not finite at the {what} "
                f"({self.describe(x)}): log-likelihood {loglik}. Give a reference= point "
                "where every observation has positive likelihood, or use "
                "control_variate=None."
            )
        _, _, prior_h = self.prior(x, hessian=True)
        prior_h = prior_h if np.all(np.isfinite(prior_h)) else None
        return PredictorReference(
            x.copy(), g, h, prior_h, loglik=loglik, coef=an.coefficients(x),
            coef_gradient=a, coef_hessian=b,
        )


def quantity_derivatives(
    an: PredictorAnalysis, at: Any
) -> tuple[list[Any], list[tuple[int, int, Any]], Any]:
    """Per-row ``g_j``, the non-zero ``H_jk`` and ``ℓ_i`` at ``q(at)`` on a row batch.

    The second derivatives come as ``(j, k, H_jk)`` with ``j ≤ k``.
    """
    preds = an.predictors
    m = len(preds.quantities)
    q = [pt.vector(f"q{j}", dtype="float64") for j in range(m)]
    (loglik,) = checks_as_ninf([an.rows(preds.loglik(q))])
    # Stabilise (log(sigmoid(η)) -> -softplus(-η), ...) before differentiating.
    loglik = rewrite_graph(loglik, include=("canonicalize", "stabilize"))
    total = pt.sum(loglik)
    g = [grad(total, q[j], disconnected_inputs="ignore") for j in range(m)]
    pairs = []
    for j in range(m):
        for j2 in range(j, m):
            # None where ℓ_i does not depend on both (two observed variables).
            hjl = grad(pt.sum(g[j]), q[j2], disconnected_inputs="ignore",
                       return_disconnected="none")
            if hjl is not None:
                pairs.append((j, j2, hjl))
    n = an.n_batch
    q_at = [pt.broadcast_to(pt.as_tensor(an.rows(quant.eta)).astype("float64"), (n,))
            for quant in preds.quantities]
    q_at = clone_replace(q_at, {an.likelihood.graphs.flat: at})
    out = clone_replace([*g, *(h for _, _, h in pairs), loglik],
                        dict(zip(q, q_at, strict=True)))
    h_out = [(j, j2, h) for (j, j2, _), h in zip(pairs, out[m:-1], strict=True)]
    return out[:m], h_out, out[-1]


# -------------------------------------------------------------------- estimator
class PredictorTaylorEstimator(TaylorEstimator):
    r"""Δ* from second-order Taylor control variates in the per-row quantities.

    Same interface and settings as
    :class:`~pymc_minibatch_mh.adapter.control_variate.TaylorEstimator` (``reference``,
    ``recenter``, :attr:`reference`, :meth:`reference_point`,
    :meth:`laplace_covariance`, :attr:`setup_evaluations`, :attr:`map_decrement`,
    refusal of changed data at chain start); see the module docstring for the
    expansion and the rule for the reference point.

    Parameters
    ----------
    likelihood : MinibatchLikelihood
        The step's compiled likelihood.
    policy : PrefetchPolicy
        Size of the first block of a step.
    analysis : PredictorAnalysis, optional
        The decomposition (default: analysed here; raises ControlVariateError with the
        reason when it fails).
    reference, recenter, step_name
        As for :class:`~pymc_minibatch_mh.adapter.control_variate.TaylorEstimator`.

    """

    name: ClassVar[str] = "taylor_predictor"

    __slots__ = ("analysis", "_coef_hat", "_coef_gradient", "_coef_hessian")

    def __init__(
        self,
        likelihood: MinibatchLikelihood,
        policy: PrefetchPolicy,
        *,
        analysis: PredictorAnalysis | None = None,
        reference: Mapping[str, Any] | None = None,
        recenter: float | None = None,
        step_name: str = "MinibatchBarker",
    ) -> None:
        if recenter is not None and not (
            isinstance(recenter, int | float) and not isinstance(recenter, bool)
            and math.isfinite(recenter) and recenter > 0
        ):
            raise ValueError(f"recenter must be a positive number or None, got {recenter!r}.")
        self.likelihood = likelihood
        self.step_name = step_name
        self.recenter_threshold = None if recenter is None else float(recenter)
        self._check_other_variables()
        if analysis is None:
            try:
                analysis = PredictorAnalysis(likelihood)
            except DecompositionError as err:
                raise ControlVariateError(
                    "control_variate='taylor_predictor' needs every observed variable's "
                    f"parameters to be data features times functions of the parameters: "
                    f"{err} Use control_variate='taylor_theta' (or 'taylor', which chooses)."
                ) from None
        self.analysis = analysis
        self.passes = passes = PredictorPasses(likelihood, step_name, analysis)
        x_ref = None if reference is None else passes.reference_flat(reference)
        d = likelihood.point_map.size
        k = analysis.n_coef
        self.dim = d
        self._theta = pytensor.shared(np.zeros(d), name="cv_theta_hat")
        self._coef_hat = pytensor.shared(np.zeros(k), name="cv_coef_hat")
        self._coef_gradient = pytensor.shared(np.zeros(k), name="cv_coef_gradient")
        self._coef_hessian = pytensor.shared(np.zeros((k, k)), name="cv_coef_hessian")
        RatioEstimator.__init__(self, likelihood, policy, self._compile_delta(likelihood.graphs))
        self.recenterings = 0
        if reference is None:
            x0 = likelihood.point_map.to_flat(likelihood.initial_point)
            ref = passes.find_map(x0, strict=False)
        else:
            ref = passes.reference_at(x_ref, what="reference point")
        self.map_evaluations = passes.evaluations if reference is None else 0
        self.setup_evaluations = passes.evaluations
        self.initial_reference = ref
        self.reference = ref
        if self.recenter_threshold is not None:
            try:
                ref.laplace_covariance()
            except ValueError as err:
                raise ControlVariateError(
                    f"recenter= needs the Laplace metric at the reference point: {err}"
                ) from None
        self._set_reference(ref)
        self._data = self.store.arrays
        _log.info("%s: control variates in the per-row quantities (%s)", step_name,
                  analysis.name)

    @property
    def map_converged(self) -> bool:
        """Whether the MAP search reached the tolerance (False with a user reference)."""
        return bool(self.passes.map_converged)

    def proxy_value(self, x: NDArray[np.float64]) -> float:
        """The full-data sum of the expansions at ``x``, less its value at θ̂: A·d + ½dᵀBd."""
        ref = self.reference
        coefficients, _ = self.analysis.step_functions()
        d = np.asarray(coefficients(x)).reshape(-1) - ref.coef
        return float(ref.coef_gradient @ d + 0.5 * d @ (ref.coef_hessian @ d))

    def proxy_gradient(self, x: NDArray[np.float64]) -> NDArray[np.float64]:
        """Gradient of the full-data sum of the expansions at ``x``: ``Jᵀ(A + B(c(x) − ĉ))``.

        Exact for the expansion in the per-row quantities (not its Gaussian approximation
        in θ): with the prior's gradient, the surrogate posterior that MALA and HMC follow.
        """
        ref = self.reference
        coefficients, vjp = self.analysis.step_functions()
        c = np.asarray(coefficients(x)).reshape(-1)
        return np.asarray(vjp(x, ref.coef_gradient + ref.coef_hessian @ (c - ref.coef)))

    def _compile_delta(self, graphs: Any) -> Any:
        an = self.analysis
        m = len(an.predictors.quantities)
        g, h, _ = quantity_derivatives(an, self._theta)
        n = an.n_batch
        q = [pt.broadcast_to(pt.as_tensor(an.rows(quant.eta)).astype("float64"), (n,))
             for quant in an.predictors.quantities]
        x_cur, x_prop, inv_t = graphs.x_cur, graphs.x_prop, graphs.inv_temperature
        q_prop = clone_replace(q, {graphs.flat: x_prop})
        q_cur = clone_replace(q, {graphs.flat: x_cur})
        q_hat = clone_replace(q, {graphs.flat: self._theta})
        dq = [a - b for a, b in zip(q_prop, q_cur, strict=True)]
        wq = [a + b - 2.0 * c for a, b, c in zip(q_prop, q_cur, q_hat, strict=True)]
        proxy = 0.0
        for j in range(m):
            proxy = proxy + g[j] * dq[j]
        for j, j2, hjl in h:
            if j == j2:
                proxy = proxy + 0.5 * hjl * dq[j] * wq[j]
            else:  # H_jl = H_lj: both cross terms
                proxy = proxy + 0.5 * hjl * (dq[j] * wq[j2] + dq[j2] * wq[j])
        residuals = graphs.ratios - proxy * inv_t
        c_prop = clone_replace(an.coef, {graphs.flat: x_prop})
        c_cur = clone_replace(an.coef, {graphs.flat: x_cur})
        d = c_prop - c_cur
        w = c_prop + c_cur - 2.0 * self._coef_hat
        closed_form = (
            pt.dot(self._coef_gradient, d) + 0.5 * pt.dot(d, pt.dot(self._coef_hessian, w))
        ) * inv_t
        fn = self.likelihood.compile(
            [x_cur, x_prop, inv_t, *graphs.data], [residuals, graphs.prior_delta + closed_form]
        )
        return direct_call(fn)

    def _set_reference(self, ref: TaylorReference) -> None:
        assert isinstance(ref, PredictorReference)
        self.reference = ref
        self._theta.set_value(np.array(ref.theta), borrow=False)
        self._coef_hat.set_value(np.array(ref.coef), borrow=False)
        self._coef_gradient.set_value(np.array(ref.coef_gradient), borrow=False)
        self._coef_hessian.set_value(np.array(ref.coef_hessian), borrow=False)
