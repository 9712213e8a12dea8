r"""Taylor control variates in each row's per-row quantities (the "linear predictor").

The θ-space expansion of :mod:`~pymc_minibatch_mh.estimators.taylor` is poor when
the rows see θ through a function that is far from linear over the posterior, as in a
hierarchical model with non-centred group effects (``mu + exp(log_tau) * z[group]``),
although each row's linear predictor is concentrated. :class:`PredictorTaylorEstimator`
expands each row's log-likelihood to second order in its per-row quantities ``q_i``
instead (:mod:`~pymc_minibatch_mh.estimators.predictor` finds them and writes
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
not reach :data:`~pymc_minibatch_mh.estimators.reference.MAP_TOLERANCE` (where the log
posterior is not concave in θ, as in the funnel of a hierarchical model, the Newton
decrement is infinite) the last point reached is accepted: any θ̂ gives an unbiased
estimator, and what the residuals need is that every ``q̂_i`` is near the bulk of its
posterior, which holds after L-BFGS-B. The decrement is reported in
``map_decrement`` and :attr:`~PredictorTaylorEstimator.map_converged`
(information, not an error).

**Selection** (:func:`~pymc_minibatch_mh.estimators.predictor_analysis.select`, used by ``control_variate="taylor"``): this expansion when
the decomposition succeeds for every observed variable and some coefficient is not
affine in θ; the θ-space expansion otherwise. With affine coefficients (a plain GLM:
``X @ b``) both expansions are the same function (the second derivative of q in θ is
zero), so nothing is gained by switching.

The full-data passes and
:class:`~pymc_minibatch_mh.estimators.predictor_passes.PredictorReference` are in
:mod:`~pymc_minibatch_mh.estimators.predictor_passes`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import pytensor
import pytensor.tensor as pt
from numpy.typing import NDArray

from pymc_minibatch_mh.core.control_variate import (
    TaylorReference,
    expansion_difference,
    expansion_gradient,
)
from pymc_minibatch_mh.errors import ControlVariateError
from pymc_minibatch_mh.estimators.predictor import (
    DecompositionError,
)
from pymc_minibatch_mh.estimators.predictor_analysis import PredictorAnalysis
from pymc_minibatch_mh.estimators.predictor_passes import (
    PredictorPasses,
    PredictorReference,
    quantity_derivatives,
)
from pymc_minibatch_mh.estimators.ratio import PrefetchPolicy
from pymc_minibatch_mh.estimators.taylor import TaylorEstimator
from pymc_minibatch_mh.model.graph import clone_replace
from pymc_minibatch_mh.model.internals import direct_call
from pymc_minibatch_mh.model.likelihood import MinibatchLikelihood

__all__ = [
    "PredictorPasses",
    "PredictorReference",
    "PredictorTaylorEstimator",
]

_log = logging.getLogger("pymc_minibatch_mh")


# -------------------------------------------------------------------- estimator
class PredictorTaylorEstimator(TaylorEstimator):
    r"""Δ* from second-order Taylor control variates in the per-row quantities.

    Same interface and settings as
    :class:`~pymc_minibatch_mh.estimators.taylor.TaylorEstimator` (``reference``,
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
        As for :class:`~pymc_minibatch_mh.estimators.taylor.TaylorEstimator`.

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
        c = np.asarray(coefficients(x), dtype=np.float64).reshape(-1)
        return float(expansion_difference(ref.coef_gradient, ref.coef_hessian, ref.coef,
                                          ref.coef, c))

    def proxy_graph(self, flat: Any) -> Any:
        """:meth:`proxy_value` as a PyTensor graph of the flat state ``flat`` (shared A, B, ĉ)."""
        c = clone_replace(self.analysis.coef, {self.likelihood.graphs.flat: flat})
        return expansion_difference(self._coef_gradient, self._coef_hessian, self._coef_hat,
                                    self._coef_hat, c, dot=pt.dot)

    def proxy_gradient(self, x: NDArray[np.float64]) -> NDArray[np.float64]:
        """Gradient of the full-data sum of the expansions at ``x``: ``Jᵀ(A + B(c(x) − ĉ))``.

        Exact for the expansion in the per-row quantities (not its Gaussian approximation
        in θ): with the prior's gradient, the surrogate posterior that MALA and HMC follow.
        """
        ref = self.reference
        coefficients, vjp = self.analysis.step_functions()
        c = np.asarray(coefficients(x), dtype=np.float64).reshape(-1)
        return np.asarray(vjp(x, expansion_gradient(ref.coef_gradient, ref.coef_hessian,
                                                    ref.coef, c)))

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
        closed_form = expansion_difference(
            self._coef_gradient, self._coef_hessian, self._coef_hat, c_cur, c_prop, dot=pt.dot
        ) * inv_t
        fn = self.likelihood.compile(
            [x_cur, x_prop, inv_t, *graphs.data], [residuals, graphs.prior_delta + closed_form]
        )
        return direct_call(fn)

    def _set_reference(self, ref: TaylorReference) -> None:
        if not isinstance(ref, PredictorReference):
            raise TypeError(
                f"{self.step_name}: the per-row-quantity control variates need a "
                f"PredictorReference (with the sums A and B of the quantities), got a "
                f"{type(ref).__name__}. Build it with PredictorPasses.reference_at or "
                "find_map, not with TaylorPasses."
            )
        self.reference = ref
        self._theta.set_value(np.array(ref.theta), borrow=False)
        self._coef_hat.set_value(np.array(ref.coef), borrow=False)
        self._coef_gradient.set_value(np.array(ref.coef_gradient), borrow=False)
        self._coef_hessian.set_value(np.array(ref.coef_hessian), borrow=False)
