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

**Reference point.** L-BFGS-B on the full-data log posterior (or a subsample), then
trust-region Newton steps (exact Hessians, one pass each) as for the θ-space expansion;
when the Newton polishing does
not reach :data:`~pymc_minibatch_mh.adapter.reference.MAP_TOLERANCE` (where the log
posterior is not concave in θ, as in the funnel of a hierarchical model, the Newton
decrement is infinite) the last point reached is accepted: any θ̂ gives an unbiased
estimator, and what the residuals need is that every ``q̂_i`` is near the bulk of its
posterior, which holds after L-BFGS-B. The decrement is reported in
``map_decrement`` and :attr:`~PredictorTaylorEstimator.map_converged`
(information, not an error).

**Selection** (:func:`select`, used by ``control_variate="taylor"``): this expansion when
the decomposition succeeds for every observed variable and some coefficient is not
affine in θ; the θ-space expansion otherwise. With affine coefficients (a plain GLM:
``X @ b``) both expansions are the same function (the second derivative of q in θ is
zero), so nothing is gained by switching.

The full-data passes and
:class:`~pymc_minibatch_mh.adapter.predictor_passes.PredictorReference` are in
:mod:`~pymc_minibatch_mh.adapter.predictor_passes`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import pytensor
import pytensor.tensor as pt
from numpy.typing import NDArray
from pytensor.gradient import grad

from pymc_minibatch_mh.adapter.control_variate import TaylorEstimator
from pymc_minibatch_mh.adapter.estimator import PrefetchPolicy
from pymc_minibatch_mh.adapter.graph import clone_replace
from pymc_minibatch_mh.adapter.likelihood import MinibatchLikelihood
from pymc_minibatch_mh.adapter.predictor import (
    MAX_FEATURES,
    DecompositionError,
    Predictors,
    analyse,
    coefficient_vector,
)
from pymc_minibatch_mh.adapter.predictor_passes import (
    PredictorPasses,
    PredictorReference,
    quantity_derivatives,
)
from pymc_minibatch_mh.adapter.pytensor_internals import direct_call
from pymc_minibatch_mh.adapter.reference import ControlVariateError
from pymc_minibatch_mh.core.control_variate import TaylorReference

__all__ = [
    "PredictorAnalysis",
    "PredictorPasses",
    "PredictorReference",
    "PredictorTaylorEstimator",
    "select",
]

_log = logging.getLogger("pymc_minibatch_mh")


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
        ``(analysis, reason)``: the analysis when the per-row quantities decompose,
        else None; ``reason`` says why (for logs and error messages). The expansion in
        the per-row quantities is chosen when the analysis is not affine
        (``analysis.is_affine()``); an affine one is the θ-space expansion, whose
        full-data passes then use the analysis.

    """
    try:
        analysis = PredictorAnalysis(likelihood)
    except DecompositionError as err:
        return None, f"the per-row quantities do not decompose: {err}"
    except Exception as err:  # noqa: BLE001 - an unforeseen graph: the θ-space expansion
        return None, f"the analysis failed ({err.__class__.__name__}: {err})"
    if analysis.is_affine():
        return analysis, ("every coefficient is affine in the parameters, so the expansion in "
                      "the per-row quantities equals the θ-space expansion")
    return analysis, f"per-row quantities: {analysis.name}"


# -------------------------------------------------------------------- estimator
class PredictorTaylorEstimator(TaylorEstimator):
    r"""Δ* from second-order Taylor control variates in the per-row quantities.

    Same interface and settings as
    :class:`~pymc_minibatch_mh.adapter.control_variate.TaylorEstimator` (``reference``,
    ``recenter``, the attribute ``reference``, ``reference_point()``,
    ``laplace_covariance()``, ``setup_evaluations``, ``map_decrement``,
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
    _strict_map: ClassVar[bool] = False  # see the module docstring: the last point is kept

    __slots__ = ("_coef_hat", "_coef_gradient", "_coef_hessian")

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
        super().__init__(likelihood, policy, reference=reference, recenter=recenter,
                         step_name=step_name, analysis=analysis)
        _log.info("%s: control variates in the per-row quantities (%s)", step_name,
                  self.analysis.name)

    def _make_passes(self) -> PredictorPasses:
        """Analyse the likelihood unless given, and build its :class:`PredictorPasses`."""
        if self.analysis is None:
            try:
                self.analysis = PredictorAnalysis(self.likelihood)
            except DecompositionError as err:
                raise ControlVariateError(
                    "control_variate='taylor_predictor' needs every observed variable's "
                    f"parameters to be data features times functions of the parameters: "
                    f"{err} Use control_variate='taylor_theta' (or 'taylor', which chooses)."
                ) from None
        return PredictorPasses(self.likelihood, self.step_name, self.analysis)

    def _make_sums(self, d: int) -> None:
        """``ĉ``, ``A`` and ``B``: the shared variables that ``_compile_delta`` reads."""
        k = self.analysis.n_coef
        self._coef_hat = pytensor.shared(np.zeros(k), name="cv_coef_hat")
        self._coef_gradient = pytensor.shared(np.zeros(k), name="cv_coef_gradient")
        self._coef_hessian = pytensor.shared(np.zeros((k, k)), name="cv_coef_hessian")

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

    def proxy_graph(self, flat: Any) -> Any:
        """:meth:`proxy_value` as a PyTensor graph of the flat state ``flat`` (shared A, B, ĉ)."""
        d = clone_replace(self.analysis.coef, {self.likelihood.graphs.flat: flat}) - self._coef_hat
        return pt.dot(self._coef_gradient, d) + 0.5 * pt.dot(d, pt.dot(self._coef_hessian, d))

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
