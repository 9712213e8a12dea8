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

**Rows of small levels, summed exactly.** The residuals are third order in the change of
the quantities, so they are largest where a row's quantity moves most between θ and θ′:
in the levels of a grouping factor with few rows, whose effects the data barely pin down
(their posterior is about their prior, τ wide), while a large level's effect moves by
about one over the square root of its size. A few such rows then carry almost all of the
residuals' variance (measured on crossed random intercepts with N = 3·10⁴: the 207 rows
of levels with fewer than 5 rows carried 97 % of it, the rows of levels with fewer than
50 rows all but 0.1 %), and a uniform minibatch rarely sees them. What pins a level's
effect down is its information, not its row count: a level of 74 rows with 4 positive
outcomes of a logistic model has the information of 10 average rows, and its effect
moves as if it had 10 (measured on the model above: left out of the exact set, that
level's mean was off by 16 Monte Carlo standard errors). A level's information is read
from the set-up's ``B`` at θ̂ (its diagonal entry ``−B_kk``, the curvature of the
log-likelihood along the level's coefficient), and counted in *average rows*, the term's
total information over N. The rows of every level with less information than
:data:`EXACT_LEVEL_ROWS` average rows (of any per-row index ``v(θ)[idx]``), least
information first, at most :data:`EXACT_ROWS_MAX_SHARE` of N, form the *exact set* E (a
term without positive total information counts rows instead; the set is chosen at each
set-up, after θ̂): the data-free part adds
their residuals' sum at every step (:attr:`PredictorTaylorEstimator.exact_rows` rows),
and the surrogate posterior contains their log-likelihood, so a proposal on it reads them
at each of its evaluations (a transition of the surrogate NUTS: each leapfrog step; its
start and end were evaluated before); the ``extra_evaluations`` stat counts every such
read. The set's
``q̂_i``, ``g_i``, ``H_i`` and ``ℓ_i(θ̂)`` are evaluated once per set-up and per
re-centring and kept, so such a read evaluates ``q_i`` and ``ℓ_i`` at the new point only
(measured on the zoo's crossed model at N = 3·10⁴: 146 µs per gradient of π̃ against 176
µs when they were evaluated again at every call, 60 µs without the set). The per-row
values are the residuals times ``1[i ∉ E]``, so that the minibatch estimates the sum over
the other rows only. The estimator stays unbiased (a stratified sum), and a full pass
gives the exact Δ. (Measured on the zoo's crossed model at N = 3·10⁴: without the exact
set in the surrogate, the test rejected every NUTS move; with it, about 13 evaluations per
transition read the set's 1,210 rows.)

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
    "EXACT_LEVEL_ROWS",
    "EXACT_ROWS_MAX_SHARE",
    "PredictorPasses",
    "PredictorReference",
    "PredictorTaylorEstimator",
]

_log = logging.getLogger("pymc_minibatch_mh")

#: Levels of a per-row index with less information than this many average rows are summed
#: exactly at every step (see the module docstring).
EXACT_LEVEL_ROWS: int = 50
#: Largest share of N in the exact set (the smallest levels first).
EXACT_ROWS_MAX_SHARE: float = 0.1


# -------------------------------------------------------------------- estimator
class PredictorTaylorEstimator(TaylorEstimator):
    r"""Δ* from second-order Taylor control variates in the per-row quantities.

    Same interface and settings as
    :class:`~pymc_minibatch_mh.estimators.taylor.TaylorEstimator` (``reference``,
    ``recenter``, the attribute ``reference``, ``reference_point()``,
    ``laplace_covariance()``, ``setup_evaluations``, ``map_decrement``,
    :meth:`~pymc_minibatch_mh.estimators.taylor.TaylorEstimator.follow_data`, which here
    also selects the exact set again); see the module docstring for the
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

    __slots__ = ("_coef_hat", "_coef_gradient", "_coef_hessian", "_exact_fn", "exact_rows",
                 "exact_positions", "_exact_graph", "_exact_proxy_fn", "_exact_flags",
                 "_exact_data", "_exact_constants")

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

    def proxy_value(self, x: NDArray[np.float64]) -> float:
        """The full-data sum of the proxies at ``x``, less its value at θ̂: A·d + ½dᵀBd.

        With an exact set, its rows' proxies are their exact log-likelihoods: the sum of
        their residuals from θ̂ to ``x`` is added (so the surrogate posterior is exact
        along the small levels, and a move it makes exactly is tested on the other rows'
        residuals only).
        """
        ref = self.reference
        coefficients, _ = self.analysis.step_functions()
        c = np.asarray(coefficients(x), dtype=np.float64).reshape(-1)
        value = float(expansion_difference(ref.coef_gradient, ref.coef_hessian, ref.coef,
                                           ref.coef, c))
        if self.exact_rows:
            value += float(self._exact_proxy(x)[0])
        return value

    def proxy_graph(self, flat: Any) -> Any:
        """:meth:`proxy_value` as a PyTensor graph of the flat state ``flat`` (shared A, B, ĉ)."""
        c = clone_replace(self.analysis.coef, {self.likelihood.graphs.flat: flat})
        graph = expansion_difference(self._coef_gradient, self._coef_hessian, self._coef_hat,
                                     self._coef_hat, c, dot=pt.dot)
        if self.exact_rows:  # the step builds this graph again after a new set-up
            graph = graph + self._exact_proxy_graph(flat)
        return graph

    def _exact_proxy_graph(self, flat: Any) -> Any:
        """The exact set's residuals summed from θ̂ to ``flat`` (untempered)."""
        return clone_replace(self._exact_graph[1], {self.likelihood.graphs.flat: flat})

    def _exact_proxy(self, x: NDArray[np.float64]) -> tuple[Any, Any]:
        """The exact set's residual sum from θ̂ to ``x`` and its gradient (compiled once)."""
        if self._exact_proxy_fn is None:
            flat = pt.vector("x", dtype="float64")
            value = self._exact_proxy_graph(flat)
            self._exact_proxy_fn = direct_call(self.likelihood.compile(
                [flat], [value, pytensor.gradient.grad(value, flat)]))
        return self._exact_proxy_fn(x)

    def proxy_gradient(self, x: NDArray[np.float64]) -> NDArray[np.float64]:
        """Gradient of the full-data sum of the proxies at ``x``: ``Jᵀ(A + B(c(x) − ĉ))``.

        Exact for the expansion in the per-row quantities (not its Gaussian approximation
        in θ), and for the exact set's log-likelihood: with the prior's gradient, the
        surrogate posterior that MALA and HMC follow.
        """
        ref = self.reference
        coefficients, vjp = self.analysis.step_functions()
        c = np.asarray(coefficients(x), dtype=np.float64).reshape(-1)
        gradient = np.asarray(vjp(x, expansion_gradient(ref.coef_gradient, ref.coef_hessian,
                                                        ref.coef, c)))
        if self.exact_rows:
            gradient = gradient + np.asarray(self._exact_proxy(x)[1])
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
        ) * inv_t
        self._exact_fn = self._exact_graph = self._exact_proxy_fn = None
        self._exact_constants = None
        self.exact_rows, self.exact_positions = 0, np.empty(0, dtype=np.int64)
        self._exact_flags, self._exact_data = [], []
        index_terms = [t for t in an.terms if t.kind == "index"]
        if index_terms:
            # The exact set's flags (one per level of each index term) and rows are shared
            # variables: the set is chosen at each set-up, after θ̂ (_select_exact_set).
            self._exact_flags = [pytensor.shared(np.zeros(0, dtype=bool)) for _ in index_terms]
            self._exact_data = [pytensor.shared(np.asarray(r, dtype=d.dtype)) for d, r in
                                zip(graphs.data, self._rows_at(self.exact_positions),
                                    strict=True)]
            self._exact_graph = self._exact_graphs(graphs, q, q_hat, g, h)
            in_set = None
            for t, flags in zip(index_terms, self._exact_flags, strict=True):
                hit = flags[an.rows(t.index).astype("int64")]
                in_set = hit if in_set is None else pt.or_(in_set, hit)
            residuals = pt.switch(in_set, 0.0, residuals)
        fn = self.likelihood.compile(
            [x_cur, x_prop, inv_t, *graphs.data], [residuals, graphs.prior_delta + closed_form]
        )
        return direct_call(fn)

    def _exact_graphs(self, graphs: Any, q: list[Any], q_hat: list[Any], g: list[Any],
                      h: list[tuple[int, int, Any]]) -> tuple[Any, Any]:
        """The exact set's residual sums: the test's and the surrogate's.

        The test's is of ``x_cur``, ``x_prop`` and ``inv_t``; the surrogate's from θ̂ to
        ``graphs.flat``, untempered.

        Both read the rows' ``q̂_i``, ``g_i``, ``H_i`` and ``ℓ_i(θ̂)`` from shared
        vectors, filled once per set-up and reference (:meth:`_refresh_exact_constants`),
        not evaluated again at every call: the surrogate's evaluates only ``ℓ_i`` and
        ``q_i`` at its point.
        """
        rows = dict(zip(graphs.data, self._exact_data, strict=True))
        m = len(q)
        # q̂, g, the non-zero H and ℓ(θ̂) on the exact rows: their graphs and shared values.
        at_hat = [*q_hat, *g, *(hjl for _, _, hjl in h),
                  clone_replace(graphs.row_loglik, {graphs.flat: self._theta})]
        shared = [pytensor.shared(np.zeros(0), name=f"cv_exact_{k}") for k in range(len(at_hat))]
        self._exact_constants = (clone_replace(at_hat, rows), shared, None)
        q_hat_e, g_e = shared[:m], shared[m:2 * m]
        h_e = [(j, j2, c) for (j, j2, _), c in zip(h, shared[2 * m:-1], strict=True)]
        x_cur, x_prop, inv_t = graphs.x_cur, graphs.x_prop, graphs.inv_temperature
        on_rows = clone_replace([graphs.ratios, *q, graphs.row_loglik], rows)
        ratios_e, q_e, loglik_e = on_rows[0], on_rows[1:m + 1], on_rows[-1]
        test = pt.sum(_residuals(ratios_e, clone_replace(q_e, {graphs.flat: x_prop}),
                                 clone_replace(q_e, {graphs.flat: x_cur}), q_hat_e, g_e, h_e,
                                 inv_t))
        one = pt.constant(1.0, dtype="float64")
        surrogate = pt.sum(_residuals(loglik_e - shared[-1], q_e, q_hat_e, q_hat_e, g_e, h_e,
                                      one))
        return test, surrogate

    def _refresh_exact_constants(self) -> None:
        """Evaluate ``q̂_i``, ``g_i``, ``H_i``, ``ℓ_i(θ̂)`` on the exact set's rows (at θ̂)."""
        if self._exact_constants is None:
            return
        graphs_, shared, fn = self._exact_constants
        if not self.exact_rows:
            values = [np.zeros(0)] * len(shared)
        else:
            if fn is None:
                fn = self.likelihood.compile([], graphs_, mode="FAST_COMPILE")
                self._exact_constants = (graphs_, shared, fn)
            values = fn()
        for var, value in zip(shared, values, strict=True):
            var.set_value(np.broadcast_to(np.asarray(value, dtype=np.float64),
                                          (self.exact_rows,)).copy())

    def _set_up(self) -> None:
        """θ̂ and the full-data sums, then the exact set on the same data.

        See :meth:`TaylorEstimator._set_up
        <pymc_minibatch_mh.estimators.taylor.TaylorEstimator._set_up>`.
        """
        super()._set_up()
        self._select_exact_set()

    def _select_exact_set(self) -> None:
        """Choose the exact set E (see the module docstring) and load its rows.

        Reads the per-row indices once over the row store; each level's information is
        ``−B_kk`` of the set-up's reference. The per-step function and the surrogate read
        E from shared variables, so nothing is compiled again.
        """
        an = self.analysis
        self.exact_rows, self.exact_positions = 0, np.empty(0, dtype=np.int64)
        if not self._exact_flags:
            return
        terms = [(t, sl) for t, sl in zip(an.terms, an.slices, strict=True)
                 if t.kind == "index"]
        graphs = self.likelihood.graphs
        store = self.likelihood.store
        indices = [an.rows(t.index).astype("int64") for t, _ in terms]
        index_fn = pytensor.function(list(graphs.data), indices, mode="FAST_COMPILE",
                                     on_unused_input="ignore")
        chunks = [[np.asarray(i) for i in index_fn(*chunk)] for chunk in store.chunks()]
        columns = [np.concatenate(c) for c in zip(*chunks, strict=True)]
        n = store.n_rows
        counts = [np.bincount(c, minlength=max(int(c.max()) + 1, sl.stop - sl.start))
                  for c, (_, sl) in zip(columns, terms, strict=True)]
        information = -np.diag(self.reference.coef_hessian)
        # Levels by information in average rows, least first, below the threshold.
        levels = sorted(
            (float(weight), k, level)
            for k, ((_, sl), cnt) in enumerate(zip(terms, counts, strict=True))
            for level, (size, weight) in enumerate(zip(cnt, average_rows(information[sl], cnt, n),
                                                       strict=True))
            if size > 0 and weight < EXACT_LEVEL_ROWS)
        # Each level's row positions, from one stable sort per factor (not a pass over the
        # N rows per level: there can be many small levels at large N).
        order = [np.argsort(c, kind="stable") for c in columns]
        starts = [np.concatenate(([0], np.cumsum(cnt))) for cnt in counts]
        small = [np.zeros(c.size, dtype=bool) for c in counts]
        in_set = np.zeros(n, dtype=bool)
        budget, total = int(EXACT_ROWS_MAX_SHARE * n), 0
        for _, k, level in levels:
            rows = order[k][starts[k][level]:starts[k][level + 1]]
            added = int(np.count_nonzero(~in_set[rows]))
            if total + added > budget:
                break
            total += added
            small[k][level] = True
            in_set[rows] = True
        self.exact_positions = np.flatnonzero(in_set)
        self.exact_rows = int(self.exact_positions.size)
        for flags, small_k in zip(self._exact_flags, small, strict=True):
            flags.set_value(small_k)
        for shared, rows in zip(self._exact_data, self._rows_at(self.exact_positions),
                                strict=True):
            shared.set_value(np.asarray(rows, dtype=shared.dtype))
        self._refresh_exact_constants()
        if not self.exact_rows:
            return
        if self._exact_fn is None:
            g = self.likelihood.graphs
            self._exact_fn = direct_call(self.likelihood.compile(
                [g.x_cur, g.x_prop, g.inv_temperature], self._exact_graph[0]))
        _log.info("%s: the %d rows of %d levels with less information than %d average "
                  "rows are summed exactly at every step", self.step_name,
                  self.exact_rows, sum(int(s.sum()) for s in small), EXACT_LEVEL_ROWS)

    def _rows_at(self, positions: NDArray[np.int64]) -> tuple[NDArray[Any], ...]:
        """The rows at ``positions``; for none, a row's arrays cut to length 0.

        Their trailing shapes are the data's, so the exact set's graphs stay well shaped.
        """
        store = self.likelihood.store
        if positions.size:
            return store.rows(positions)
        return tuple(r[:0] for r in store.rows(np.zeros(1, dtype=np.int64)))

    def open(self, x_cur: NDArray[np.float64], x_prop: NDArray[np.float64],
             inv_temperature: NDArray[np.float64], log_q_ratio: float, rows: int) -> float:
        """The ratio estimator's ``open``, with the exact set's residuals in the data-free part.

        See :meth:`~pymc_minibatch_mh.estimators.ratio.RatioEstimator.open`.
        """
        data_free = super().open(x_cur, x_prop, inv_temperature, log_q_ratio, rows)
        if not self.exact_rows:
            return data_free
        return data_free + float(self._exact_fn(x_cur, x_prop, inv_temperature))

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
        self._refresh_exact_constants()  # the exact set's q̂_i, g_i, H_i at the new θ̂


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
