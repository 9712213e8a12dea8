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
posterior, which holds after L-BFGS-B. The decrement is reported in ``map_decrement``
and
:attr:`~pymc_minibatch_mh.estimators.taylor.TaylorEstimator.map_converged`
(information, not an error).

**Selection** (:func:`~pymc_minibatch_mh.estimators.predictor_analysis.select`, used by
``control_variate="taylor"``): this expansion when the decomposition succeeds for every observed
variable and some coefficient is not affine in θ; the θ-space expansion otherwise. With affine
coefficients (a plain GLM: ``X @ b``) both expansions are the same function (the second derivative
of q in θ is zero), so nothing is gained by switching.

**Rows of small levels, expanded around their level's shift.** The residuals are largest
in the rows of levels whose effects the data barely pin down. The rows of the levels with
the least information form a *set* (:mod:`~pymc_minibatch_mh.estimators.predictor_set`),
each of whose rows is expanded around ``q̂_i`` moved by its own level's shift, with tables
of each level's sums in its shift (:mod:`~pymc_minibatch_mh.estimators.predictor_shift`):
a move of the small levels' effects alone then leaves their rows almost no residual, and
the estimator stays unbiased.

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
import pytensor.gradient
import pytensor.tensor as pt
from numpy.typing import NDArray

from pymc_minibatch_mh.core.control_variate import (
    TaylorReference,
    expansion_difference,
    expansion_gradient,
    second_order,
)
from pymc_minibatch_mh.errors import ControlVariateError
from pymc_minibatch_mh.estimators.differenced import NO_DERIVATIVE
from pymc_minibatch_mh.estimators.expansion import bilinear, inner
from pymc_minibatch_mh.estimators.predictor import (
    DecompositionError,
)
from pymc_minibatch_mh.estimators.predictor_analysis import PredictorAnalysis
from pymc_minibatch_mh.estimators.predictor_passes import (
    PredictorPasses,
    PredictorReference,
    quantity_derivatives,
)
from pymc_minibatch_mh.estimators.predictor_set import ShiftedSet
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
    :meth:`~pymc_minibatch_mh.estimators.taylor.TaylorEstimator.follow_data`, which here
    also selects the set again); see the module docstring for the
    expansion and the rule for the reference point. ``set_rows`` and ``set_positions``
    tell the set's rows (:mod:`~pymc_minibatch_mh.estimators.predictor_set`).

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

    __slots__ = ("_coef_hat", "_coef_gradient", "_coef_hessian", "_shift_proxy_fn",
                 "shifted_set", "_delta_graphs", "_delta_fns")

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
        try:
            return PredictorPasses(self.likelihood, self.step_name, self.analysis)
        except NO_DERIVATIVE as err:
            raise ControlVariateError(
                "The expansion in the per-row quantities needs the log-likelihood's second "
                "derivative in them, which PyTensor cannot build for this model "
                f"({type(err).__name__}: {err}). Use control_variate='taylor_theta': it "
                "computes the curvature from differences of the per-row gradient."
            ) from None

    def _make_sums(self, d: int) -> None:
        """``ĉ`` and the sums ``A``, ``B`` over the rows outside the set (shared variables)."""
        k = self.analysis.n_coef
        self._coef_hat = pytensor.shared(np.zeros(k), name="cv_coef_hat")
        self._coef_gradient = pytensor.shared(np.zeros(k), name="cv_coef_gradient")
        self._coef_hessian = pytensor.shared(np.zeros((k, k)), name="cv_coef_hessian")

    @property
    def set_rows(self) -> int:
        """Rows in the set of the last set-up (0: none)."""
        return self.shifted_set.n_rows

    @property
    def set_positions(self) -> NDArray[np.int64]:
        """The set's rows' positions in the row store."""
        return self.shifted_set.positions

    def proxy_value(self, x: NDArray[np.float64]) -> float:
        """The full-data sum of the proxies at ``x``, less its value at θ̂.

        ``A·d + ½dᵀBd`` over the rows outside the set, plus the set's levels' sums
        ``Σ_g [T_g(x) − L_g(0)]`` (the module docstring).
        """
        coefficients, _ = self.analysis.step_functions()
        c = np.asarray(coefficients(x), dtype=np.float64).reshape(-1)
        hat = self._coef_hat.get_value(borrow=True)
        value = float(expansion_difference(self._coef_gradient.get_value(borrow=True),
                                           self._coef_hessian.get_value(borrow=True),
                                           hat, hat, c))
        if self.set_rows:
            value += float(self._shift_proxy(x)[0])
        return value

    def proxy_graph(self, flat: Any) -> Any:
        """:meth:`proxy_value` as a PyTensor graph of the flat state ``flat`` (shared sums).

        The set's levels' sums are in the graph only when the set has rows, as in
        :meth:`proxy_value` (the set is chosen at each set-up, and the step builds this
        graph again after one). Without rows they are 0, and their gathers were a third
        of the nodes of the surrogate NUTS's density on bambi's ``(prestige|year)`` model.
        """
        c = clone_replace(self.analysis.coef, {self.likelihood.graphs.flat: flat})
        graph = expansion_difference(self._coef_gradient, self._coef_hessian, self._coef_hat,
                                     self._coef_hat, c, dot=pt.dot)
        if self.set_rows:
            graph = graph + self.shifted_set.tables.total(c - self._coef_hat)
        return graph

    def _shift_proxy(self, x: NDArray[np.float64]) -> tuple[Any, Any]:
        """The set's levels' sums at ``x`` and their gradient (compiled once)."""
        if self._shift_proxy_fn is None:
            flat = pt.vector("x", dtype="float64")
            c = clone_replace(self.analysis.coef, {self.likelihood.graphs.flat: flat})
            value = self.shifted_set.tables.total(c - self._coef_hat)
            self._shift_proxy_fn = direct_call(self.likelihood.compile(
                [flat], [value, pytensor.gradient.grad(value, flat)]))
        return self._shift_proxy_fn(x)

    def proxy_gradient(self, x: NDArray[np.float64]) -> NDArray[np.float64]:
        """Gradient of :meth:`proxy_value` at ``x``.

        ``Jᵀ(A + B(c(x) − ĉ))`` over the rows outside the set plus the gradient of the
        levels' sums: with the prior's gradient, the surrogate posterior that MALA and HMC
        follow.
        """
        coefficients, vjp = self.analysis.step_functions()
        c = np.asarray(coefficients(x), dtype=np.float64).reshape(-1)
        hat = self._coef_hat.get_value(borrow=True)
        gradient = np.asarray(vjp(x, expansion_gradient(
            self._coef_gradient.get_value(borrow=True),
            self._coef_hessian.get_value(borrow=True), hat, c)))
        if self.set_rows:
            gradient = gradient + np.asarray(self._shift_proxy(x)[1])
        return gradient

    def centring(self, temperature: float) -> tuple[NDArray[np.int64], Any] | None:
        """The groups whose effects the surrogate's NUTS samples centred, or None.

        A group's own coordinate ``z_j`` (:meth:`PredictorAnalysis.own_coordinates
        <pymc_minibatch_mh.estimators.predictor_analysis.PredictorAnalysis.own_coordinates>`)
        is chosen when the data fix the effect ``c_j`` better than the groups' spread
        does: when the likelihood's curvature along ``c_j`` at θ̂ (at the step's
        temperature), ``h_j = −H_mm / slope²``, exceeds ``1 / s²``, with ``s²`` the mean
        square of the term's effects at θ̂ (an estimate of the groups' variance; the
        scale parameter at θ̂ itself is not one: the joint mode of a non-centred model
        inflates it). Such a group's non-centred coordinates form a narrow ridge in
        ``(scale, z_j)``; a group with few rows stays non-centred (centred, it would make
        a funnel). Returns the flat positions of the chosen coordinates and the graph of
        their coefficients ``c_j`` (of the likelihood's flat state), for
        :class:`~pymc_minibatch_mh.proposals.surrogate.Centring`.
        """
        ref = self.reference
        if ref is None:
            return None
        found = self.analysis.own_coordinates(ref.theta)
        data = -np.diag(ref.hessian) / float(temperature)
        chosen = [(k, m) for k, m, slope, term in found
                  if data[m] / slope**2 * np.mean(ref.coef[term] ** 2) > 1.0]
        if not chosen:
            return None
        coefs, positions = (np.array(v, dtype=np.int64) for v in zip(*chosen, strict=True))
        _log.info("%s: the surrogate's NUTS samples %d group effects centred (the data fix "
                  "them more than the prior)", self.step_name, positions.size)
        # Which coefficients, as a shared variable: PyTensor's Numba cache keys a function
        # by its constants, and the choice depends on the data.
        return positions, self.analysis.coef[pytensor.shared(coefs, name="centred_coefs")]

    def _compile_delta(self, graphs: Any) -> Any:
        an = self.analysis
        g, h, _ = quantity_derivatives(an, self._theta)
        n = an.n_batch
        q = [pt.broadcast_to(pt.as_tensor(an.rows(quant.eta)).astype("float64"), (n,))
             for quant in an.predictors.quantities]
        x_cur, x_prop, inv_t = graphs.x_cur, graphs.x_prop, graphs.inv_temperature
        q_prop = clone_replace(q, {graphs.flat: x_prop})
        q_cur = clone_replace(q, {graphs.flat: x_cur})
        q_hat = clone_replace(q, {graphs.flat: self._theta})
        residuals = _residuals(graphs.ratios, q_prop, q_cur, q_hat, g, h, inv_t)
        c_prop = clone_replace(an.coef, {graphs.flat: x_prop})
        c_cur = clone_replace(an.coef, {graphs.flat: x_cur})
        closed_form = expansion_difference(
            self._coef_gradient, self._coef_hessian, self._coef_hat, c_cur, c_prop, dot=pt.dot
        )
        self._shift_proxy_fn = None
        self.shifted_set = shifted = ShiftedSet(an, self.likelihood, self.step_name)
        variants = {False: (residuals, closed_form)}
        if shifted.slots:
            # The set's levels are chosen at each set-up, after θ̂ (_select_set): each
            # index term's slots (a level's table, or −1) are shared variables.
            variants[True] = shifted.residual_graphs(
                graphs, residuals, closed_form, (q_prop, q_cur, q_hat), h, (c_prop, c_cur),
                self._coef_hat, inv_t)
        self._delta_graphs = (
            [x_cur, x_prop, inv_t, *graphs.data],
            {with_set: [r, graphs.prior_delta + closed * inv_t]
             for with_set, (r, closed) in variants.items()},
        )
        self._delta_fns: dict[bool, Any] = {}
        return _before_set_up

    def _delta_for_set(self) -> Any:
        """The per-step function for the set of the last set-up (compiled on first use).

        With rows in the set, the graph with its residuals and tables; without, the graph
        without them, whose values are the same (the set's terms are 0) at about half the
        cost per call (bambi's ``(prestige|year)`` model: 7 µs against 14 µs for 50 rows,
        160 nodes against 255).
        """
        with_set = bool(self.set_rows)  # a set has rows only where there are slots
        if with_set not in self._delta_fns:
            inputs, outputs = self._delta_graphs
            self._delta_fns[with_set] = direct_call(
                self.likelihood.compile(inputs, outputs[with_set]))
        return self._delta_fns[with_set]

    def _set_up(self) -> None:
        """θ̂ and the full-data sums, then the set on the same data.

        See :meth:`TaylorEstimator._set_up
        <pymc_minibatch_mh.estimators.taylor.TaylorEstimator._set_up>`.
        """
        self.shifted_set.clear()  # the last set-up's set is of the old data
        super()._set_up()
        self._select_set()
        self.fn = self._delta_for_set()

    def _select_set(self) -> None:
        """Choose the set at θ̂ and build its tables.

        See :meth:`ShiftedSet.select
        <pymc_minibatch_mh.estimators.predictor_set.ShiftedSet.select>`.
        """
        self.shifted_set.select(self.reference)
        self._build_tables()

    def _build_tables(self) -> None:
        """The set's tables at the current θ̂, and the sums ``A``, ``B`` of the other rows."""
        a, b = self.shifted_set.build(self.reference, self.passes._chunk_sums)
        self._coef_gradient.set_value(a, borrow=False)
        self._coef_hessian.set_value(b, borrow=False)

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
        self._build_tables()  # the set's q̂_i and tables at the new θ̂, and the other sums


def _residuals(ratios: Any, q_prop: list[Any], q_cur: list[Any], q_hat: list[Any],
               g: list[Any], h: list[tuple[int, int, Any]], inv_t: Any) -> Any:
    """Per-row residuals ``r_i`` of the module docstring.

    ``ratios`` are the tempered ``ℓ_i(θ′) − ℓ_i(θ)``; ``q_*`` the quantities at θ′, θ and
    θ̂; ``g`` and the non-zero ``H_jk`` (``(j, k, H_jk)``, ``j ≤ k``) at θ̂. The expansion
    is :func:`~pymc_minibatch_mh.estimators.expansion.second_order`'s.
    """
    dq = [a - b for a, b in zip(q_prop, q_cur, strict=True)]
    wq = [a + b - 2.0 * c for a, b, c in zip(q_prop, q_cur, q_hat, strict=True)]
    return ratios - second_order(inner(g, dq), bilinear(h, dq, wq)) * inv_t


def _before_set_up(*args: Any) -> Any:
    """The per-step function's place until the first set-up has chosen the set."""
    raise RuntimeError("The estimator's per-step function is chosen by its set-up.")
