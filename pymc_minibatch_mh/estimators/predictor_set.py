r"""The set E of the per-row-quantity expansion: rows of levels with little information.

The residuals of :class:`~pymc_minibatch_mh.estimators.predictor_taylor.PredictorTaylorEstimator`
are third order in the change of the quantities, so they are largest where a row's
quantity moves most between θ and θ′: in the levels of a grouping factor with few rows,
whose effects the data barely pin down (their posterior is about their prior, τ wide),
while a large level's effect moves by about one over the square root of its size. A few
such rows then carry almost all of the residuals' variance (measured on crossed random
intercepts with N = 3·10⁴: the 207 rows of levels with fewer than 5 rows carried 97 % of
it, the rows of levels with fewer than 50 rows all but 0.1 %), and a uniform minibatch
rarely sees them.

What pins a level's effect down is its information, not its row count: a level of 74 rows
with 4 positive outcomes of a logistic model has the information of 10 average rows, and
its effect moves as if it had 10. A level's information is read from the set-up's ``B`` at
θ̂ (its diagonal entry ``−B_kk``, the curvature of the log-likelihood along the level's
coefficient), and counted in *average rows*, the term's total information over N
(:func:`average_rows`). The rows of every level with less information than
:data:`SHIFTED_LEVEL_ROWS` average rows (of any per-row index ``v(θ)[idx]``), least
information first, at most :data:`SHIFTED_ROWS_MAX_SHARE` of N, form the *set* E (a term
without positive total information counts rows instead; the set is chosen at each set-up,
after θ̂; a level with a row in small levels of two index terms, such as a level's
intercept and its slope, stays out: that row moves by two shifts and a table follows
one). Each of its rows is
expanded around ``q̂_i`` moved by its own level's shift
``c_g(θ) − ĉ_g`` instead of around ``q̂_i``
(:mod:`~pymc_minibatch_mh.estimators.predictor_shift`: tables of each level's sums in
its shift, interpolated the same way for the sums and for each row, so that the
estimator stays unbiased): a move of the small levels' effects alone then leaves their
rows almost no residual. The data-free part and the surrogate posterior contain the
tables' sums instead of the expansion around θ̂ for these rows, so neither reads a row:
every row's residual is left to the minibatch. (Summing the set's rows exactly at every
step instead, with their log-likelihood in the surrogate posterior, a transition on the
zoo's crossed model at N = 3·10⁴ read the set's 1,210 rows about 13 times, 15,000–18,000
rows; with the tables it reads about 140, at the same time per transition.)

:class:`ShiftedSet` chooses the set, builds its tables and the graphs of its rows'
residuals.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytensor
import pytensor.tensor as pt
from numpy.typing import NDArray

from pymc_minibatch_mh.core.control_variate import TaylorReference, second_order
from pymc_minibatch_mh.errors import ControlVariateError
from pymc_minibatch_mh.estimators.expansion import bilinear, inner
from pymc_minibatch_mh.estimators.predictor_analysis import PredictorAnalysis
from pymc_minibatch_mh.estimators.predictor_passes import quantity_functions, row_features
from pymc_minibatch_mh.estimators.predictor_shift import ShiftTables, grid_spacing, level_tables
from pymc_minibatch_mh.model.graph import clone_replace
from pymc_minibatch_mh.model.likelihood import MinibatchLikelihood

__all__ = ["SHIFTED_LEVEL_ROWS", "SHIFTED_ROWS_MAX_SHARE", "ShiftedSet", "average_rows"]

_log = logging.getLogger("pymc_minibatch_mh")

#: The rows of levels of a per-row index with less information than this many average rows
#: are expanded around their level's shift (see the module docstring).
SHIFTED_LEVEL_ROWS: int = 50
#: Largest share of N in the set (the least informed levels first).
SHIFTED_ROWS_MAX_SHARE: float = 0.1
#: A level's grid is halved at most this many times to keep it inside the quantity's
#: support (see :meth:`ShiftedSet.build`).
_MAX_NARROWINGS: int = 30


class ShiftedSet:
    """The set E of an expansion in the per-row quantities (see the module docstring).

    Its levels' tables and each index term's slots are shared variables, so the per-step
    function and the surrogate posterior, compiled once, read the set of each set-up.

    Parameters
    ----------
    analysis : PredictorAnalysis
        The decomposition of the per-row quantities.
    likelihood : MinibatchLikelihood
        The step's compiled likelihood (its row store and graphs).
    step_name : str
        Used in messages.

    """

    def __init__(self, analysis: PredictorAnalysis, likelihood: MinibatchLikelihood,
                 step_name: str) -> None:
        self.analysis, self.likelihood, self.step_name = analysis, likelihood, step_name
        #: The levels' tables (:class:`~pymc_minibatch_mh.estimators.predictor_shift.ShiftTables`).
        self.tables = ShiftTables(analysis.n_coef)
        #: The analysis' index terms, and for each a shared variable: each level's table
        #: (−1: none).
        self.index_terms = [k for k, t in enumerate(analysis.terms) if t.kind == "index"]
        self.slots = [pytensor.shared(np.zeros(0, dtype=np.int64), name=f"shift_slots_{k}")
                      for k in self.index_terms]
        self._functions: tuple[Any, Any] | None = None
        self.clear()

    def clear(self) -> None:
        """No rows in the set (its tables are those of the last :meth:`build`)."""
        #: Rows in the set, and their positions in the row store.
        self.n_rows = 0
        self.positions = np.empty(0, dtype=np.int64)
        #: The set's levels as (term, level) of the analysis' terms; each row's level
        #: (its table) among them; the rows' arrays.
        self.levels: list[tuple[int, int]] = []
        self.row_slot = np.empty(0, dtype=np.int64)
        self.data: tuple[NDArray[Any], ...] = ()

    # ------------------------------------------------------------------ graphs
    def residual_graphs(self, graphs: Any, residuals: Any, closed_form: Any,
                        q: tuple[list[Any], list[Any], list[Any]],
                        h: list[tuple[int, int, Any]], c: tuple[Any, Any], coef_hat: Any,
                        inv_t: Any) -> tuple[Any, Any]:
        """The per-step graphs with the set's rows expanded around their level's shift.

        Parameters
        ----------
        graphs : LikelihoodGraphs
            The likelihood's graphs.
        residuals, closed_form : tensor
            The residuals of every row expanded around θ̂, and the untempered closed form
            of the rows outside the set.
        q : tuple of list of tensor
            The quantities at θ′, θ and θ̂.
        h : list of (int, int, tensor)
            The non-zero ``H_jk`` at θ̂ (``j ≤ k``).
        c : tuple of tensor
            The coefficients at θ′ and θ.
        coef_hat : tensor
            ``ĉ``.
        inv_t : tensor
            ``1/K``.

        Returns
        -------
        tuple of tensor
            The residuals and the closed form with the set's tables.

        """
        tables = self.tables
        c_prop, c_cur = c
        closed_form = closed_form + (tables.total(c_prop - coef_hat)
                                     - tables.total(c_cur - coef_hat))
        slot, weight = self._row_slots()
        rows = pt.nonzero(slot >= 0)[0]
        q_prop, q_cur, q_hat = ([v[rows] for v in side] for side in q)
        shifted = self._shifted_residuals(
            graphs, rows, slot[rows], [w[rows] for w in weight], q_prop, q_cur, q_hat,
            [(j, j2, v[rows]) for j, j2, v in h], c_prop, c_cur, coef_hat)
        residuals = pt.set_subtensor(residuals[rows], graphs.ratios[rows] - shifted * inv_t)
        return residuals, closed_form

    def _row_slots(self) -> tuple[Any, list[Any]]:
        """Each row's level table (−1: none) and its weight along each quantity.

        A row in the levels of several index terms in the set belongs to the first
        term's; its shift moves the quantity that term feeds by the term's feature times
        the level's shift (the weight; 0 along the other quantities).
        """
        an = self.analysis
        n = an.n_batch
        slot = None
        owner = None
        for k, slots in zip(self.index_terms, self.slots, strict=True):
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
            for k in self.index_terms:
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
                           h_hat: list[tuple[int, int, Any]], c_prop: Any, c_cur: Any,
                           coef_hat: Any) -> Any:
        """``a_i(θ′) − a_i(θ)`` of the set's rows ``rows``, untempered.

        See :mod:`~pymc_minibatch_mh.estimators.predictor_shift`; ``h_hat`` are the rows'
        ``Ĥ_i`` at θ̂.
        """
        an, tables = self.analysis, self.tables
        qs, g, _, loglik = quantity_functions(an)
        spacing = tables.spacing[slot]
        own = tables.own[slot]
        points, deltas, weights = [], [], []
        for q_at, c_at in ((q_cur, c_cur), (q_prop, c_prop)):
            u = (c_at - coef_hat)[own]
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
            nodes = [4 * side + m for m in range(4)]
            # ℓ_i and g_i interpolated at the row's shifted point q̃_i.
            value = inner(w, [ll[m] for m in nodes])
            slope = inner([inner(w, [gj[m] for m in nodes]) for gj in gs], delta)
            proxies.append(second_order(slope, bilinear(h_hat, delta, delta), value=value))
        return proxies[1] - proxies[0]

    # ------------------------------------------------------------------ set-up
    def select(self, reference: TaylorReference) -> None:
        """Choose the set's rows at ``reference`` and load them (see the module docstring).

        Reads the per-row indices once over the row store; each level's information is
        ``−B_kk`` of the reference. Sets each index term's slots; :meth:`build` makes the
        tables. Logs the set's size.
        """
        an = self.analysis
        self.clear()
        if not self.slots:
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
        information = -np.diag(reference.coef_hessian)
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
        # A row in small levels of two index terms (a level's intercept and its slope,
        # crossed factors that are both small there) would move by two shifts, and a
        # table follows one: its levels stay out, expanded around θ̂. Whole levels, since
        # the per-step function finds a row's table by its level (_row_slots).
        two_shifts = _in_small_levels(levels, columns, n) > 1
        kept_out = np.zeros(n, dtype=bool)
        in_set = np.zeros(n, dtype=bool)
        budget, total = int(SHIFTED_ROWS_MAX_SHARE * n), 0
        for _, i, level in levels:
            rows = order[i][starts[i][level]:starts[i][level + 1]]
            if two_shifts[rows].any():
                kept_out[rows] = True
                continue
            added = int(np.count_nonzero(~in_set[rows]))
            if total + added > budget:
                break
            total += added
            small[i][level] = True
            in_set[rows] = True
        self.positions = np.flatnonzero(in_set)
        self.n_rows = int(self.positions.size)
        # A row belongs to the level of the first index term whose level is in the set
        # (the rule of _row_slots); each such level has a table, the others none.
        owner = np.full(self.n_rows, -1, dtype=np.int64)
        level_of = np.zeros(self.n_rows, dtype=np.int64)
        for i, (small_i, column) in enumerate(zip(small, columns, strict=True)):
            level = column[self.positions]
            take = (owner < 0) & small_i[level]
            owner[take], level_of[take] = i, level[take]
        pairs = sorted({(int(i), int(lv)) for i, lv in zip(owner, level_of, strict=True)})
        slot_of = {pair: p for p, pair in enumerate(pairs)}
        for i, shared in enumerate(self.slots):
            slots = np.full(terms[i][2].stop - terms[i][2].start, -1, dtype=np.int64)
            for (owner_i, level), p in slot_of.items():
                if owner_i == i:
                    slots[level] = p
            shared.set_value(slots)
        self.levels = [(terms[i][0], level) for i, level in pairs]
        self.row_slot = np.array([slot_of[(int(i), int(lv))] for i, lv in
                                  zip(owner, level_of, strict=True)], dtype=np.int64)
        self.data = self._rows_at(self.positions)
        if self.n_rows:
            _log.info("%s: the %d rows of %d levels with less information than %d average "
                      "rows are expanded around their level's shift", self.step_name,
                      self.n_rows, len(pairs), SHIFTED_LEVEL_ROWS)
        if kept_out.any():
            _log.info("%s: %d rows of levels with rows in small levels of two index terms "
                      "stay expanded around the reference point (a level's table follows "
                      "one shift)", self.step_name, int(np.count_nonzero(kept_out)))

    def build(self, reference: TaylorReference,
              chunk_sums: Any) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Load the set's tables at ``reference``; return the sums ``A``, ``B`` of the others.

        Called at each set-up and reference (a re-centring moves θ̂, so ``q̂_i`` and every
        table with it). ``chunk_sums`` is the passes'
        :class:`~pymc_minibatch_mh.estimators.predictor_passes.PredictorChunkSums`.

        Raises
        ------
        ControlVariateError
            If a level's log-likelihood is not finite near its effect however narrow its
            grid.

        """
        a, b = np.array(reference.coef_gradient), np.array(reference.coef_hessian)
        if not self.n_rows:
            self.tables.clear()
            return a, b
        an = self.analysis
        fns = self.functions()
        rows = self.data
        _, a_set, b_set = chunk_sums(reference.theta, *rows)
        at_hat, features = fns[0](reference.theta, *rows)
        q_hat = [np.asarray(v, dtype=np.float64) for v in at_hat]
        blocks = chunk_sums._blocks([np.asarray(f) for f in features], self.n_rows)
        k_coef, quantities = an.n_coef, len(q_hat)
        slot = self.row_slot
        p = len(self.levels)
        own = np.array([an.slices[i].start + level for i, level in self.levels],
                       dtype=np.int64)
        # Each row's weight along each quantity: its own term's feature.
        weight = np.zeros((self.n_rows, quantities))
        for p_, (i, _) in enumerate(self.levels):
            mine = slot == p_
            block = blocks[i]
            weight[mine, an.term_quantity[i]] = 1.0 if block[2] is None else block[2][mine]
        spacing = self.spacing(own, reference)
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
        self.tables.set(own, spacing, support, table_l, table_a, b_set)
        return a - a_set, b - b_set

    def spacing(self, own: NDArray[np.int64], reference: TaylorReference) -> NDArray[np.float64]:
        """Each level's grid spacing (:func:`~.predictor_shift.grid_spacing` of its spread).

        The spread: the root of the level's term's mean square effect at θ̂ (the groups'
        spread, as :meth:`PredictorTaylorEstimator.centring
        <pymc_minibatch_mh.estimators.predictor_taylor.PredictorTaylorEstimator.centring>`
        estimates it) plus the Laplace variance of ``c_g``.
        """
        ref, an = reference, self.analysis
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

    def functions(self) -> tuple[Any, Any]:
        """Compiled once: ``q̂`` and the features of rows, and ``ℓ`` and ``g`` of ``q``."""
        if self._functions is None:
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

            self._functions = (first, evaluate)
        return self._functions

    def _rows_at(self, positions: NDArray[np.int64]) -> tuple[NDArray[Any], ...]:
        """The rows at ``positions``; for none, a row's arrays cut to length 0."""
        store = self.likelihood.store
        if positions.size:
            return store.rows(positions)
        return tuple(r[:0] for r in store.rows(np.zeros(1, dtype=np.int64)))


def _in_small_levels(levels: list[tuple[float, int, int]], columns: list[NDArray[np.int64]],
                     n: int) -> NDArray[np.int64]:
    """Each row's number of index terms whose level for the row is among ``levels``."""
    count = np.zeros(n, dtype=np.int64)
    for i, column in enumerate(columns):
        chosen = np.array([level for _, term, level in levels if term == i], dtype=np.int64)
        count += np.isin(column, chosen)
    return count


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
