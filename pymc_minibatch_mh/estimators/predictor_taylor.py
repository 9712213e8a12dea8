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

**Rows of small levels, expanded around their level's shift.** The residuals are third
order in the change of the quantities, so they are largest where a row's quantity moves
most between θ and θ′: in the levels of a grouping factor with few rows, whose effects the
data barely pin down (their posterior is about their prior, τ wide), while a large level's
effect moves by about one over the square root of its size. A few such rows then carry
almost all of the residuals' variance (measured on crossed random intercepts with
N = 3·10⁴: the 207 rows of levels with fewer than 5 rows carried 97 % of it, the rows of
levels with fewer than 50 rows all but 0.1 %), and a uniform minibatch rarely sees them.
What pins a level's effect down is its information, not its row count: a level of 74 rows
with 4 positive outcomes of a logistic model has the information of 10 average rows, and
its effect moves as if it had 10. A level's information is read from the set-up's ``B`` at
θ̂ (its diagonal entry ``−B_kk``, the curvature of the log-likelihood along the level's
coefficient), and counted in *average rows*, the term's total information over N. The rows
of every level with less information than :data:`SHIFTED_LEVEL_ROWS` average rows (of any
per-row index ``v(θ)[idx]``), least information first, at most
:data:`SHIFTED_ROWS_MAX_SHARE` of N, form the *set* E (a term without positive total
information counts rows instead; the set is chosen at each set-up, after θ̂). Each of
its rows is expanded around ``q̂_i`` moved by its own level's shift ``c_g(θ) − ĉ_g``
instead of around ``q̂_i``
(:mod:`~pymc_minibatch_mh.estimators.predictor_shift`: tables of each level's sums in
its shift, interpolated the same way for the sums and for each row, so that the
estimator stays unbiased): a move of the small levels' effects alone then leaves their
rows almost no residual. The data-free part and the surrogate posterior contain the
tables' sums instead of the expansion around θ̂ for these rows, so neither reads a row:
every row's residual is left to the minibatch. (Before, the set's rows were summed
exactly at every step, and the surrogate posterior contained their log-likelihood: on
the zoo's crossed model at N = 3·10⁴ a transition read the set's 1,210 rows about 13
times, 15,000–18,000 rows; with the tables it reads about 140, at the same time per
transition.)

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
from pytensor.gradient import NullTypeGradError
from pytensor.graph.utils import MethodNotDefined

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
    quantity_functions,
    row_features,
)
from pymc_minibatch_mh.estimators.predictor_shift import ShiftTables, grid_spacing, level_tables
from pymc_minibatch_mh.estimators.ratio import PrefetchPolicy
from pymc_minibatch_mh.estimators.taylor import TaylorEstimator
from pymc_minibatch_mh.model.graph import clone_replace
from pymc_minibatch_mh.model.internals import direct_call
from pymc_minibatch_mh.model.likelihood import MinibatchLikelihood

__all__ = [
    "SHIFTED_LEVEL_ROWS",
    "SHIFTED_ROWS_MAX_SHARE",
    "PredictorPasses",
    "PredictorReference",
    "PredictorTaylorEstimator",
]

_log = logging.getLogger("pymc_minibatch_mh")

#: The rows of levels of a per-row index with less information than this many average rows
#: are expanded around their level's shift (see the module docstring).
SHIFTED_LEVEL_ROWS: int = 50
#: Largest share of N in the set (the least informed levels first).
SHIFTED_ROWS_MAX_SHARE: float = 0.1
#: A level's grid is halved at most this many times to keep it inside the quantity's
#: support (see ``_build_tables``).
_MAX_NARROWINGS: int = 30


# -------------------------------------------------------------------- estimator
class PredictorTaylorEstimator(TaylorEstimator):
    r"""Δ* from second-order Taylor control variates in the per-row quantities.

    Same interface and settings as
    :class:`~pymc_minibatch_mh.estimators.taylor.TaylorEstimator` (``reference``,
    ``recenter``, the attribute ``reference``, ``reference_point()``,
    ``laplace_covariance()``, ``setup_evaluations``, ``map_decrement``,
    :meth:`~pymc_minibatch_mh.estimators.taylor.TaylorEstimator.follow_data`, which here
    also selects the set again); see the module docstring for the
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

    __slots__ = ("_coef_hat", "_coef_gradient", "_coef_hessian", "_shift_proxy_fn",
                 "set_rows", "set_positions", "_slots", "_tables", "_set_data",
                 "_set_levels", "_set_fns", "_set_slot")

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
        except (MethodNotDefined, NullTypeGradError) as err:
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
        """:meth:`proxy_value` as a PyTensor graph of the flat state ``flat`` (shared sums)."""
        c = clone_replace(self.analysis.coef, {self.likelihood.graphs.flat: flat})
        graph = expansion_difference(self._coef_gradient, self._coef_hessian, self._coef_hat,
                                     self._coef_hat, c, dot=pt.dot)
        if self._slots:
            graph = graph + self._tables.total(c - self._coef_hat)
        return graph

    def _shift_proxy(self, x: NDArray[np.float64]) -> tuple[Any, Any]:
        """The set's levels' sums at ``x`` and their gradient (compiled once)."""
        if self._shift_proxy_fn is None:
            flat = pt.vector("x", dtype="float64")
            c = clone_replace(self.analysis.coef, {self.likelihood.graphs.flat: flat})
            value = self._tables.total(c - self._coef_hat)
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
        return positions, self.analysis.coef[coefs]

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
        self._shift_proxy_fn = self._set_fns = None
        self._tables = ShiftTables(an.n_coef)
        self.set_rows, self.set_positions = 0, np.empty(0, dtype=np.int64)
        self._set_levels: list[tuple[int, int]] = []
        self._set_data: tuple[NDArray[Any], ...] = ()
        index_terms = [k for k, t in enumerate(an.terms) if t.kind == "index"]
        self._slots = [pytensor.shared(np.zeros(0, dtype=np.int64), name=f"shift_slots_{k}")
                       for k in index_terms]
        if index_terms:
            # The set's levels are chosen at each set-up, after θ̂ (_select_set): each
            # index term's slots (a level's table, or −1) are shared variables.
            tables = self._tables
            closed_form = closed_form + (tables.total(c_prop - self._coef_hat)
                                         - tables.total(c_cur - self._coef_hat))
            slot, weight = self._row_slots(index_terms)
            rows = pt.nonzero(slot >= 0)[0]
            shifted = self._shifted_residuals(
                graphs, rows, slot[rows], [w[rows] for w in weight],
                [v[rows] for v in q_prop], [v[rows] for v in q_cur], [v[rows] for v in q_hat],
                [(j, j2, v[rows]) for j, j2, v in h], c_prop, c_cur)
            residuals = pt.set_subtensor(residuals[rows], graphs.ratios[rows] - shifted * inv_t)
        fn = self.likelihood.compile(
            [x_cur, x_prop, inv_t, *graphs.data],
            [residuals, graphs.prior_delta + closed_form * inv_t],
        )
        return direct_call(fn)

    def _row_slots(self, index_terms: list[int]) -> tuple[Any, list[Any]]:
        """Each row's level table (−1: none) and its weight along each quantity.

        A row in the levels of several index terms in the set belongs to the first
        term's; its shift moves the quantity that term feeds by the term's feature times
        the level's shift (the weight; 0 along the other quantities).
        """
        an = self.analysis
        n = an.n_batch
        slot = None
        owner = None
        for k, slots in zip(index_terms, self._slots, strict=True):
            size = an.sizes[k]
            index = pt.as_tensor(an.rows(an.terms[k].index)).astype("int64")
            index = pt.switch(index < 0, index + size, index)
            mine = slots[index]
            if slot is None:
                slot, owner = mine, pt.switch(mine >= 0, k, -1)
            else:
                take = pt.and_(slot < 0, mine >= 0)
                slot, owner = pt.switch(take, mine, slot), pt.switch(take, k, owner)
        weight = []
        for j in range(len(an.predictors.quantities)):
            w = pt.zeros((n,), dtype="float64")
            for k in index_terms:
                if an.term_quantity[k] != j:
                    continue
                t = an.terms[k]
                f = (pt.ones((n,), dtype="float64") if t.feature is None else
                     pt.broadcast_to(an.rows(t.feature).astype("float64"), (n,)))
                w = w + pt.switch(pt.eq(owner, k), f, 0.0)
            weight.append(w)
        return slot, weight

    def _shifted_residuals(self, graphs: Any, rows: Any, slot: Any, weight: list[Any],
                           q_prop: list[Any], q_cur: list[Any], q_hat: list[Any],
                           h_hat: list[tuple[int, int, Any]], c_prop: Any, c_cur: Any) -> Any:
        """``a_i(θ′) − a_i(θ)`` of the set's rows ``rows``, untempered.

        See :mod:`~pymc_minibatch_mh.estimators.predictor_shift`; ``h_hat`` are the rows'
        ``Ĥ_i`` at θ̂.
        """
        an, tables = self.analysis, self._tables
        qs, g, _, loglik = quantity_functions(an)
        spacing = tables.spacing[slot]
        own = tables.own[slot]
        points, deltas, weights = [], [], []
        for q_at, c_at in ((q_cur, c_cur), (q_prop, c_prop)):
            u = (c_at - self._coef_hat)[own]
            first, w, kept = ShiftTables.locate(u, spacing)
            weights.append(w)
            deltas.append([qa - qh - f * kept for qa, qh, f in zip(q_at, q_hat, weight,
                                                                     strict=True)])
            for m in range(4):
                node = ShiftTables.node_shift(first + m, spacing)
                points.append([qh + f * node for qh, f in zip(q_hat, weight, strict=True)])
        # One evaluation of ℓ and g at the 8 expansion points of every row.
        stacked = [pt.concatenate([p[j] for p in points]) for j in range(len(qs))]
        data = {d: pt.concatenate([d[rows]] * len(points)) for d in graphs.data}
        out = clone_replace([loglik, *g], {**dict(zip(qs, stacked, strict=True)), **data})
        blocks = [v.reshape((len(points), rows.shape[0])) for v in out]
        ll, gs = blocks[0], blocks[1:]
        proxies = []
        for side in range(2):
            delta, w = deltas[side], weights[side]
            total = 0.0
            for j, j2, hjl in h_hat:
                factor = 0.5 if j == j2 else 1.0
                total = total + factor * hjl * delta[j] * delta[j2]
            for m in range(4):
                at = 4 * side + m
                value = ll[at]
                for j, gj in enumerate(gs):
                    value = value + gj[at] * delta[j]
                total = total + w[m] * value
            proxies.append(total)
        return proxies[1] - proxies[0]

    def _set_up(self) -> None:
        """θ̂ and the full-data sums, then the set on the same data.

        See :meth:`TaylorEstimator._set_up
        <pymc_minibatch_mh.estimators.taylor.TaylorEstimator._set_up>`.
        """
        self.set_rows = 0  # the last set-up's set is of the old data
        super()._set_up()
        self._select_set()

    def _select_set(self) -> None:
        """Choose the set E (see the module docstring), load its rows and build its tables.

        Reads the per-row indices once over the row store; each level's information is
        ``−B_kk`` of the set-up's reference. The per-step function and the surrogate read
        the set's slots and tables from shared variables, so nothing is compiled again.
        """
        an = self.analysis
        self.set_rows, self.set_positions = 0, np.empty(0, dtype=np.int64)
        self._set_levels, self._set_data = [], ()
        if not self._slots:
            return
        terms = [(k, t, sl) for k, (t, sl) in enumerate(zip(an.terms, an.slices, strict=True))
                 if t.kind == "index"]
        graphs = self.likelihood.graphs
        store = self.likelihood.store
        indices = [an.rows(t.index).astype("int64") for _, t, _ in terms]
        index_fn = pytensor.function(list(graphs.data), indices, mode="FAST_COMPILE",
                                     on_unused_input="ignore")
        chunks = [[np.asarray(i) for i in index_fn(*chunk)] for chunk in store.chunks()]
        columns = [np.concatenate(c) for c in zip(*chunks, strict=True)]
        columns = [np.where(c < 0, c + (sl.stop - sl.start), c)
                   for c, (_, _, sl) in zip(columns, terms, strict=True)]
        n = store.n_rows
        counts = [np.bincount(c, minlength=max(int(c.max()) + 1, sl.stop - sl.start))
                  for c, (_, _, sl) in zip(columns, terms, strict=True)]
        information = -np.diag(self.reference.coef_hessian)
        # Levels by information in average rows, least first, below the threshold.
        levels = sorted(
            (float(weight), i, level)
            for i, ((_, _, sl), cnt) in enumerate(zip(terms, counts, strict=True))
            for level, (size, weight) in enumerate(zip(cnt, average_rows(information[sl], cnt, n),
                                                       strict=True))
            if size > 0 and weight < SHIFTED_LEVEL_ROWS)
        # Each level's row positions, from one stable sort per factor (not a pass over the
        # N rows per level: there can be many small levels at large N).
        order = [np.argsort(c, kind="stable") for c in columns]
        starts = [np.concatenate(([0], np.cumsum(cnt))) for cnt in counts]
        small = [np.zeros(c.size, dtype=bool) for c in counts]
        in_set = np.zeros(n, dtype=bool)
        budget, total = int(SHIFTED_ROWS_MAX_SHARE * n), 0
        for _, i, level in levels:
            rows = order[i][starts[i][level]:starts[i][level + 1]]
            added = int(np.count_nonzero(~in_set[rows]))
            if total + added > budget:
                break
            total += added
            small[i][level] = True
            in_set[rows] = True
        self.set_positions = np.flatnonzero(in_set)
        self.set_rows = int(self.set_positions.size)
        # A row belongs to the level of the first index term whose level is in the set
        # (the rule of _row_slots); each such level has a table, the others none.
        owner = np.full(self.set_rows, -1, dtype=np.int64)
        level_of = np.zeros(self.set_rows, dtype=np.int64)
        for i, (small_i, column) in enumerate(zip(small, columns, strict=True)):
            level = column[self.set_positions]
            take = (owner < 0) & small_i[level]
            owner[take], level_of[take] = i, level[take]
        pairs = sorted({(int(i), int(lv)) for i, lv in zip(owner, level_of, strict=True)})
        slot_of = {pair: p for p, pair in enumerate(pairs)}
        for i, shared in enumerate(self._slots):
            slots = np.full(terms[i][2].stop - terms[i][2].start, -1, dtype=np.int64)
            for (owner_i, level), p in slot_of.items():
                if owner_i == i:
                    slots[level] = p
            shared.set_value(slots)
        # The levels as (term, level) of the analysis' terms.
        self._set_levels = [(terms[i][0], level) for i, level in pairs]
        self._set_slot = np.array([slot_of[(int(i), int(lv))] for i, lv in
                                   zip(owner, level_of, strict=True)], dtype=np.int64)
        self._set_data = self._rows_at(self.set_positions)
        self._build_tables()
        if self.set_rows:
            _log.info("%s: the %d rows of %d levels with less information than %d average "
                      "rows are expanded around their level's shift", self.step_name,
                      self.set_rows, len(pairs), SHIFTED_LEVEL_ROWS)

    def _build_tables(self) -> None:
        """The set's tables at the current θ̂, and the sums ``A``, ``B`` of the other rows.

        Called at each set-up and reference (a re-centring moves θ̂, so ``q̂_i`` and every
        table with it).
        """
        ref = self.reference
        a, b = np.array(ref.coef_gradient), np.array(ref.coef_hessian)
        if not self.set_rows:
            self._tables.clear()
            self._coef_gradient.set_value(a, borrow=False)
            self._coef_hessian.set_value(b, borrow=False)
            return
        an = self.analysis
        fns = self._set_functions()
        rows = self._set_data
        _, a_set, b_set = self.passes._chunk_sums(ref.theta, *rows)
        self._coef_gradient.set_value(a - a_set, borrow=False)
        self._coef_hessian.set_value(b - b_set, borrow=False)
        at_hat, features = fns[0](ref.theta, *rows)
        q_hat = [np.asarray(v, dtype=np.float64) for v in at_hat]
        blocks = self.passes._chunk_sums._blocks([np.asarray(f) for f in features],
                                                 self.set_rows)
        k_coef, quantities = an.n_coef, len(q_hat)
        slot = self._set_slot
        p = len(self._set_levels)
        own = np.array([an.slices[i].start + level for i, level in self._set_levels],
                       dtype=np.int64)
        # Each row's weight along each quantity: its own term's feature.
        weight = np.zeros((self.set_rows, quantities))
        for p_, (i, _) in enumerate(self._set_levels):
            mine = slot == p_
            block = blocks[i]
            weight[mine, an.term_quantity[i]] = 1.0 if block[2] is None else block[2][mine]
        spacing = self._spacing(own)
        shifts = ShiftTables.node_shifts(spacing)  # (P, NODES)

        def at_nodes(k: int) -> tuple[Any, Any]:
            node = shifts[slot, k]
            q = [q_hat[j] + weight[:, j] * node for j in range(quantities)]
            ll, g = fns[1](*q, *rows)
            return (np.asarray(ll, dtype=np.float64),
                    np.column_stack([np.asarray(v, dtype=np.float64) for v in g]))

        def design(positions: NDArray[np.int64]) -> NDArray[np.float64]:
            f = np.zeros((positions.size, quantities, k_coef))
            for i, block in enumerate(blocks):
                j, sl = an.term_quantity[i], an.slices[i]
                if block[0] == "dense":
                    f[:, j, sl] = block[1][positions]
                else:
                    _, idx, w, _ = block
                    f[np.arange(positions.size), j, sl.start + idx[positions]] = (
                        1.0 if w is None else w[positions])
            return f

        members = [np.flatnonzero(slot == p_) for p_ in range(p)]
        # A level whose grid leaves the quantity's support (a probability moved below 0)
        # has non-finite entries: its grid is narrowed until every entry is finite (the
        # chain's effects stay inside the support too).
        for _ in range(_MAX_NARROWINGS):
            support, table_l, table_a = level_tables(members, own, design, at_nodes, k_coef)
            bad = ~(np.all(np.isfinite(table_l), axis=1)
                    & np.all(np.isfinite(table_a), axis=(1, 2)))
            if not bad.any():
                break
            spacing = np.where(bad, 0.5 * spacing, spacing)
            shifts = ShiftTables.node_shifts(spacing)
        else:
            raise ControlVariateError(
                f"{self.step_name}: the log-likelihood of the rows of {int(bad.sum())} levels "
                "with little information is not finite near their effects at the reference "
                "point, so the control variates cannot tabulate it. Use "
                "control_variate='taylor_theta'.")
        self._tables.set(own, spacing, support, table_l, table_a, b_set)

    def _spacing(self, own: NDArray[np.int64]) -> NDArray[np.float64]:
        """Each level's grid spacing (:func:`~.predictor_shift.grid_spacing` of its spread).

        The spread: the root of the level's term's mean square effect at θ̂ (the groups'
        spread, as :meth:`centring` estimates it) plus the Laplace variance of ``c_g``.
        """
        ref, an = self.reference, self.analysis
        term_of = np.zeros(an.n_coef, dtype=np.int64)
        for i, sl in enumerate(an.slices):
            term_of[sl] = i
        square = np.array([np.mean(ref.coef[an.slices[term_of[c]]] ** 2) for c in own])
        try:
            jac = an.jacobian(ref.theta)[own]
            variance = np.einsum("ij,jk,ik->i", jac, ref.laplace_covariance(), jac)
        except ValueError:  # no Laplace fit at θ̂: the groups' spread alone
            variance = np.zeros(own.size)
        spread = np.sqrt(square + np.maximum(variance, 0.0))
        spread = np.where(np.isfinite(spread) & (spread > 0.0), spread, 1.0)
        return grid_spacing(spread)

    def _set_functions(self) -> tuple[Any, Any]:
        """Compiled once: ``q̂`` and the features of rows, and ``ℓ`` and ``g`` of ``q``."""
        if self._set_fns is None:
            an = self.analysis
            graphs = self.likelihood.graphs
            n = an.n_batch
            q = [pt.broadcast_to(pt.as_tensor(an.rows(quant.eta)).astype("float64"), (n,))
                 for quant in an.predictors.quantities]
            at_hat = self.likelihood.compile([graphs.flat, *graphs.data],
                                             [pt.stack(q), *row_features(an)],
                                             mode="FAST_COMPILE")
            qs, g, _, loglik = quantity_functions(an)
            evaluate = self.likelihood.compile([*qs, *graphs.data], [loglik, pt.stack(g)],
                                               mode="FAST_COMPILE")

            def first(x: Any, *rows: Any) -> tuple[Any, Any]:
                out = at_hat(x, *rows)
                return list(out[0]), out[1:]

            self._set_fns = (first, evaluate)
        return self._set_fns

    def _rows_at(self, positions: NDArray[np.int64]) -> tuple[NDArray[Any], ...]:
        """The rows at ``positions``; for none, a row's arrays cut to length 0."""
        store = self.likelihood.store
        if positions.size:
            return store.rows(positions)
        return tuple(r[:0] for r in store.rows(np.zeros(1, dtype=np.int64)))

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
    """Per-row residuals ``r_i`` of the module docstring (the one home of the formula).

    ``ratios`` are the tempered ``ℓ_i(θ′) − ℓ_i(θ)``; ``q_*`` the quantities at θ′, θ and
    θ̂; ``g`` and the non-zero ``H_jk`` (``(j, k, H_jk)``, ``j ≤ k``) at θ̂.
    """
    dq = [a - b for a, b in zip(q_prop, q_cur, strict=True)]
    wq = [a + b - 2.0 * c for a, b, c in zip(q_prop, q_cur, q_hat, strict=True)]
    proxy = 0.0
    for gj, dqj in zip(g, dq, strict=True):
        proxy = proxy + gj * dqj
    for j, j2, hjl in h:
        if j == j2:
            proxy = proxy + 0.5 * hjl * dq[j] * wq[j]
        else:  # H_jl = H_lj: both cross terms
            proxy = proxy + 0.5 * hjl * (dq[j] * wq[j2] + dq[j2] * wq[j])
    return ratios - proxy * inv_t


def average_rows(information: NDArray[np.float64], counts: NDArray[np.int64],
                 n_total: int) -> NDArray[np.float64]:
    """Each level's information in average rows: ``I_k N / Σ I`` (see the module docstring).

    Parameters
    ----------
    information : numpy.ndarray
        ``−B_kk`` of the term's coefficients.
    counts : numpy.ndarray
        Rows per level.
    n_total : int
        N.

    Returns
    -------
    numpy.ndarray
        One value per level; the row counts themselves where the information does not
        have one entry per level or its total is not positive and finite.

    """
    total = float(np.sum(information))
    if information.size != counts.size or not (0.0 < total < np.inf):
        return counts.astype(np.float64)
    return information * (n_total / total)
