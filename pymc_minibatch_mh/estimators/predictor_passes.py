r"""The full-data passes of the per-row-quantity expansion and its reference point.

:class:`PredictorPasses` computes, in one pass over the row store at θ̂, the sufficient
statistics ``A = Σ_i F_iᵀ g_i`` and ``B = Σ_i F_iᵀ H_i F_i`` of the expansion of
:mod:`~pymc_minibatch_mh.estimators.predictor_taylor` and from them the θ-space gradient
and Hessian by the chain rule; :class:`PredictorReference` holds them.
``quantity_derivatives`` gives the per-row derivatives in the quantities that both
the passes and the estimator's per-step function use.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pytensor.tensor as pt
from numpy.typing import NDArray
from pytensor.gradient import grad
from pytensor.graph.rewriting.utils import rewrite_graph
from scipy import optimize

from pymc_minibatch_mh.core.control_variate import (
    TaylorReference,
    expansion_difference,
    expansion_gradient,
)
from pymc_minibatch_mh.errors import ControlVariateError
from pymc_minibatch_mh.estimators.full_passes import _FULL_PASS_MODE, add_chunks
from pymc_minibatch_mh.estimators.reference import MAP_TOLERANCE, TaylorPasses
from pymc_minibatch_mh.model.compilation import compile_derived
from pymc_minibatch_mh.model.graph import checks_as_ninf, clone_replace
from pymc_minibatch_mh.model.likelihood import MinibatchLikelihood

if TYPE_CHECKING:
    from pymc_minibatch_mh.estimators.predictor_analysis import PredictorAnalysis

__all__ = [
    "EXPANSION_STEPS",
    "EXPANSION_STEPS_MAX_DIM",
    "PredictorChunkSums",
    "PredictorPasses",
    "PredictorReference",
    "quantity_functions",
    "row_features",
]

_log = logging.getLogger("pymc_minibatch_mh")

#: Most passes of the expansion steps that start the MAP search of
#: :class:`PredictorPasses` on data without a subsample (``_first_steps``): each maximises
#: the expansion of the log-likelihood in the coefficients at its point, plus the exact
#: log prior, with no data, and one pass with the Hessian evaluates the point found. If
#: they do not reach :data:`~pymc_minibatch_mh.estimators.reference.MAP_TOLERANCE`, the
#: search goes on with L-BFGS-B from their best point (logged).
EXPANSION_STEPS: int = 12

#: Largest dimension of the sampled variables for the expansion steps: each step
#: maximises its expansion with SciPy's ``trust-exact``, which needs the θ-space Hessian
#: of the expansion (the coefficients' Jacobian and curvature, d Hessian-vector products
#: of the prior) at each of its iterations. Larger models (the zoo's 2,410 schools) start
#: with L-BFGS-B's gradient passes instead.
EXPANSION_STEPS_MAX_DIM: int = 400

#: Damping of the first expansion step after a rejected one (Levenberg–Marquardt: the
#: coefficients' curvature ``B`` is scaled by ``1 + λ`` on its diagonal); ten times more
#: after each further rejection, ten times less after a step whose gain matched the
#: expansion's prediction, and none below a thousandth.
_FIRST_DAMPING = 1.0


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



# ----------------------------------------------------------------------- passes
class PredictorChunkSums:
    """Log-likelihood, ``A`` and ``B`` over one chunk of rows (see :class:`PredictorPasses`).

    A picklable callable (the compiled sums and the terms' layout only): a Dask row store
    sends it to the workers (:meth:`~pymc_minibatch_mh.store.row_store.RowStore.reduce`).

    Parameters
    ----------
    sums_fn : pytensor.compile.function.types.Function
        ``(x, *rows) -> (loglik, g, h, *features)`` per row.
    analysis : PredictorAnalysis
        The expansion (its terms' layout is copied).
    pairs : list of tuple
        The quantity pairs ``(j, j2)`` of the columns of ``h``.

    """

    def __init__(self, sums_fn: Any, analysis: PredictorAnalysis,
                 pairs: list[tuple[int, int]]) -> None:
        self.sums_fn = sums_fn
        self.pairs = pairs
        self.terms = [(t.kind, t.feature is not None) for t in analysis.terms]
        self.sizes = list(analysis.sizes)
        self.owner = list(analysis.term_quantity)
        self.slices = list(analysis.slices)
        self.n_coef = analysis.n_coef

    def __call__(self, x: NDArray[np.float64], *chunk: NDArray[Any]) -> tuple[Any, ...]:
        """``(loglik, A, B)`` of the chunk at ``x``."""
        k, owner, slices = self.n_coef, self.owner, self.slices
        a = np.zeros(k)
        b = np.zeros((k, k))
        loglik, g, h, *features = self.sums_fn(x, *chunk)
        blocks = self._blocks(features, g.shape[0])
        for t, bt in enumerate(blocks):
            a[slices[t]] += self._left(bt, g[:, owner[t]])
        for p, (j, j2) in enumerate(self.pairs):
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
                    b[slices[t], slices[s]] += block
                    if (j, t) != (j2, s):
                        b[slices[s], slices[t]] += block.T
        return float(loglik), a, b

    def _blocks(self, features: list[NDArray[Any]], n: int) -> list[tuple[Any, ...]]:
        """Per term: ``("dense", X (n, K))`` or ``("index", idx, weight or None, G)``."""
        out = []
        pos = 0
        for (kind, has_feature), size in zip(self.terms, self.sizes, strict=True):
            if kind == "index":
                idx = features[pos]
                pos += 1
                weight = None
                if has_feature:
                    weight = features[pos]
                    pos += 1
                idx = np.where(idx < 0, idx + size, idx)
                out.append(("index", idx, weight, size))
            elif not has_feature:
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
            return PredictorChunkSums._gram(bs, bt, h).T
        _, it, wt, gt = bt
        x = bs[1]
        weights = h if wt is None else h * wt
        return np.column_stack(
            [np.bincount(it, weights=weights * x[:, k], minlength=gt) for k in range(x.shape[1])]
        )


class PredictorPasses(TaylorPasses):
    """Full-data passes of the per-row-quantity expansion (and the MAP search).

    :meth:`reference_at` computes ``A``, ``B`` and the log-likelihood in one pass over
    the row store (chunks; O(K²) memory) and the θ-space gradient and Hessian from them
    by the chain rule. The MAP search is that of
    :meth:`~pymc_minibatch_mh.estimators.reference.TaylorPasses.find_map`, whose Newton
    steps therefore cost one pass each; on data without a subsample it starts with
    steps that maximise the expansion in the coefficients (``_first_steps``).
    """

    def __init__(self, likelihood: MinibatchLikelihood, step_name: str,
                 analysis: PredictorAnalysis) -> None:
        self.analysis = analysis
        super().__init__(likelihood, step_name)
        self._compile_sums()

    def _first_steps(self, x0: NDArray[np.float64],
                      evaluate: Any) -> tuple[TaylorReference | None, float]:
        """Expansion steps from ``x0``: the search's start on data without a subsample.

        At a point θₖ, a pass with the Hessian gives the coefficients' ``A`` and ``B``;
        the next point maximises, with no data, the second-order expansion of the
        log-likelihood in the coefficients plus the exact log prior,
        ``A·(c(θ) − c(θₖ)) + ½ (c(θ) − c(θₖ))ᵀ B (c(θ) − c(θₖ)) + log p(θ)``
        (SciPy's ``trust-exact``). The expansion is in the per-row quantities, where the
        likelihood is nearly quadratic; θ reaches them through ``c(θ)``, exactly: a
        hierarchy's scale times its offsets, transforms, a Cholesky factor. So each step
        is a Newton step in the quantities, which converges in a few passes where
        Newton steps in θ crawl along the funnel of a non-centred hierarchy (measured
        on the zoo's hierarchical models at N = 3·10⁴: 4–9 passes, against 27–209 of
        L-BFGS-B). A point whose log posterior gains less than a tenth of the
        expansion's prediction is rejected and the next step damped
        (Levenberg–Marquardt, ``_FIRST_DAMPING``). At most :data:`EXPANSION_STEPS`
        passes, in models of at most :data:`EXPANSION_STEPS_MAX_DIM` dimensions.
        """
        if x0.size > EXPANSION_STEPS_MAX_DIM:
            return None, math.inf
        ref, log_post, _, decrement = evaluate(x0)
        if not math.isfinite(log_post):
            return None, math.inf  # a start outside the support: L-BFGS-B says so
        damping, passes = 0.0, 1
        while ref is not None and decrement > MAP_TOLERANCE and passes < EXPANSION_STEPS:
            x, predicted = self._maximise_expansion(ref, damping)
            if not predicted > 0.0:
                break  # the expansion has no ascent left from here: L-BFGS-B takes over
            trial = evaluate(x)
            passes += 1
            gain = trial[1] - log_post
            if trial[0] is None or not gain >= 0.1 * predicted:
                damping = 10.0 * damping if damping else _FIRST_DAMPING
                continue
            ref, log_post, _, decrement = trial
            if gain >= 0.75 * predicted:
                damping = damping / 10.0 if damping >= 1e-2 else 0.0
        if ref is not None and not decrement <= MAP_TOLERANCE:
            _log.info(
                "%s: the expansion steps of the MAP search stopped %.3g posterior sds from "
                "the mode after %d passes; L-BFGS-B goes on from their last point.",
                self.step_name, decrement, passes,
            )
        return ref, decrement

    def _maximise_expansion(self, ref: PredictorReference,
                            damping: float) -> tuple[NDArray[np.float64], float]:
        """The maximum of the expansion at ``ref`` plus the log prior, and its gain.

        The expansion's ``B`` has its eigenvalues made negative (their absolute values,
        negated: unchanged near the mode, where ``B`` is negative definite) and its
        diagonal scaled by ``1 + damping``. The solver's Hessian keeps the prior's at
        ``ref`` (its gradient is exact, so is the maximum it converges to).
        Returns the point and the expansion's predicted gain of the log posterior over
        ``ref.theta`` (not finite, or not positive, where there is none).
        """
        an = self.analysis
        a, hat = ref.coef_gradient, ref.coef
        # Concave: B with its eigenvalues made negative (a Normal's B in the mean and the
        # log scale is indefinite far from the mode, where the expansion has no maximum),
        # then damped on its diagonal.
        values, vectors = np.linalg.eigh(ref.coef_hessian)
        b = (vectors * -np.abs(values)) @ vectors.T
        b = b + damping * np.diag(np.diag(b))
        cache: dict[bytes, tuple[float, Any, Any]] = {}

        def parts(x: NDArray[np.float64]) -> tuple[float, Any, Any]:
            key = x.tobytes()
            if key not in cache:
                cache.clear()
                c = an.coefficients(x)
                prior, prior_g, _ = self.prior(x)
                slope = expansion_gradient(a, b, hat, c)
                value = float(expansion_difference(a, b, hat, hat, c)) + prior
                cache[key] = (value, an.coefficient_gradient(x, slope) + prior_g, slope)
            return cache[key]

        start = np.asarray(ref.theta, dtype=np.float64)
        best = [math.inf, start]  # the best point evaluated, should the solver fail

        def negated(x: NDArray[np.float64]) -> float:
            value = parts(x)[0]
            value = -value if math.isfinite(value) else math.inf
            if value < best[0]:
                best[:] = [value, x.copy()]
            return value

        prior_h = ref.prior_hessian  # the prior's at ref, kept: d products a call to update

        def hessian(x: NDArray[np.float64]) -> NDArray[np.float64]:
            jac = an.jacobian(x)
            return -(jac.T @ b @ jac + an.curvature(x, parts(x)[2]) + prior_h)

        with np.errstate(all="ignore"):
            try:
                optimize.minimize(negated, start, jac=lambda x: -parts(x)[1], hess=hessian,
                                  method="trust-exact", options={"maxiter": 200, "gtol": 1e-8})
            except (ValueError, np.linalg.LinAlgError):
                pass  # a Hessian not finite at a point: the best point evaluated
        return best[1], -best[0] - ref.log_prior

    def _compile_sums(self) -> None:
        an = self.analysis
        graphs = self.likelihood.graphs
        flat, data = graphs.flat, list(graphs.data)
        features = row_features(an)
        n = an.n_batch

        def derive() -> tuple[list[Any], list[Any], list[tuple[int, int]]]:
            g, h, loglik = quantity_derivatives(an, flat)
            pairs = [(j, j2) for j, j2, _ in h]
            h = [hjl for _, _, hjl in h] or [pt.zeros((n,))]
            outputs = [pt.sum(loglik), pt.stack(g, axis=1), pt.stack(h, axis=1), *features]
            return [flat, *data], outputs, pairs

        # The function is derived from the decomposition's graphs (the per-row
        # likelihood, the coefficients, the quantities and the features): a second
        # process loads it without differentiating again.
        etas = [an.rows(quant.eta) for quant in an.predictors.quantities]
        source = [graphs.row_loglik, an.coef, *etas, *features]
        fn, _, pairs = compile_derived([flat, *data], source, "PredictorPasses._compile_sums",
                                       derive, _FULL_PASS_MODE)
        fn.trust_input = True
        self._chunk_sums = PredictorChunkSums(fn, an, pairs)

    def sums(self, x: NDArray[np.float64]) -> tuple[float, NDArray[np.float64],
                                                    NDArray[np.float64]]:
        """Log-likelihood, ``A`` and ``B`` at ``x``: one counted pass over the rows."""
        parts = self.store.reduce(self._chunk_sums, x)
        self.evaluations += self.store.n_rows
        self.hessian_passes += 1
        return add_chunks(parts)  # type: ignore[return-value]

    def _chain_rule(self, x: NDArray[np.float64], a: NDArray[np.float64],
                    b: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """The θ-space gradient and Hessian from ``A`` and ``B`` at ``x``."""
        an = self.analysis
        jac = an.jacobian(x)
        return jac.T @ a, jac.T @ b @ jac + an.curvature(x, a)

    def hessian_on(self, x: NDArray[np.float64], rows: list[NDArray[Any]]) -> NDArray[np.float64]:
        """The θ-space Hessian of the log-likelihood of ``rows`` at ``x`` (not counted)."""
        _, a, b = self._chunk_sums(x, *rows)
        return self._chain_rule(x, a, b)[1]

    def reference_at(self, x: NDArray[np.float64], what: str) -> PredictorReference:
        """``A``, ``B`` (and the θ-space G, H by the chain rule) at ``x``, checked finite."""
        an = self.analysis
        with np.errstate(all="ignore"):
            loglik, a, b = self.sums(x)
        ok = math.isfinite(loglik) and np.all(np.isfinite(a)) and np.all(np.isfinite(b))
        if ok:
            g, h = self._chain_rule(x, a, b)
            ok = np.all(np.isfinite(g)) and np.all(np.isfinite(h))
        if not ok:
            raise ControlVariateError(
                f"The log-likelihood or its derivatives are not finite at the {what} "
                f"({self.describe(x)}): log-likelihood {loglik}. Give a reference= point "
                "where every observation has positive likelihood, or use "
                "control_variate=None."
            )
        return PredictorReference(
            x.copy(), g, h, self.prior_hessian(x, what), loglik=loglik,
            **self.prior_fields(x), coef=an.coefficients(x),
            coef_gradient=a, coef_hessian=b,
        )


def row_features(an: PredictorAnalysis) -> list[Any]:
    """The terms' per-row features on a row batch, in the layout of :class:`PredictorChunkSums`.

    Per index term its integer column (and its weights, if any); per dense term with a
    feature, the feature (n,) or (n, K).
    """
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
    return features


def quantity_functions(
    an: PredictorAnalysis,
) -> tuple[list[Any], list[Any], list[tuple[int, int, Any]], Any]:
    """Per-row ``g_j``, the non-zero ``H_jk`` and ``ℓ_i`` as graphs of the quantities.

    Returns the quantities' input vectors ``q_j`` and, of them and the row batch, ``g``,
    ``(j, k, H_jk)`` with ``j ≤ k`` and ``ℓ``.
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
    return q, g, pairs, loglik


def quantity_derivatives(
    an: PredictorAnalysis, at: Any
) -> tuple[list[Any], list[tuple[int, int, Any]], Any]:
    """Per-row ``g_j``, the non-zero ``H_jk`` and ``ℓ_i`` at ``q(at)`` on a row batch.

    The second derivatives come as ``(j, k, H_jk)`` with ``j ≤ k``.
    """
    preds = an.predictors
    m = len(preds.quantities)
    q, g, pairs, loglik = quantity_functions(an)
    n = an.n_batch
    q_at = [pt.broadcast_to(pt.as_tensor(an.rows(quant.eta)).astype("float64"), (n,))
            for quant in preds.quantities]
    q_at = clone_replace(q_at, {an.likelihood.graphs.flat: at})
    out = clone_replace([*g, *(h for _, _, h in pairs), loglik],
                        dict(zip(q, q_at, strict=True)))
    h_out = [(j, j2, h) for (j, j2, _), h in zip(pairs, out[m:-1], strict=True)]
    return out[:m], h_out, out[-1]
