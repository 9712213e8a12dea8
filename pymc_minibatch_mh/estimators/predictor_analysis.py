"""Which per-row quantities a likelihood has: the decomposition behind the estimators.

:class:`PredictorAnalysis` holds the decomposition of each row's log-likelihood into
per-row quantities ``q_i(θ) = F_i c(θ) + o_i`` (found by
:mod:`~pymc_minibatch_mh.estimators.predictor`) with the compiled θ-only functions of the
coefficients ``c(θ)``; :func:`select` decides which Taylor expansion
``control_variate="taylor"`` uses.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import numpy as np
import pytensor.tensor as pt
from numpy.typing import NDArray
from pytensor.gradient import grad

from pymc_minibatch_mh.estimators.predictor import (
    MAX_FEATURES,
    DecompositionError,
    Predictors,
    analyse,
    coefficient_vector,
)
from pymc_minibatch_mh.model.compilation import compile_function
from pymc_minibatch_mh.model.graph import BatchedProducts
from pymc_minibatch_mh.model.internals import direct_call
from pymc_minibatch_mh.model.likelihood import MinibatchLikelihood

__all__ = ["PredictorAnalysis", "select"]

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
        self._parts_fn = compile_function([flat], parts, fast)[0]
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
        self._coef_fn = compile_function([flat], coef, fast)[0]
        self._vjp_fn = compile_function([flat, u], vjp, fast)[0]
        self._hvp_fn = compile_function([flat, u, v], hvp, fast)[0]
        self._products = ([flat], vjp, u), ([flat, u], hvp, v)
        self._jacobian_rows = BatchedProducts(self._jacobian_graph,
                                              "coefficients' Jacobian rows", self._vjp_fn)
        self._curvature_rows = BatchedProducts(self._curvature_graph,
                                               "coefficients' curvature columns", self._hvp_fn)
        self._graphs = (flat, u, coef, vjp)  # compiled for speed on first per-step use
        self._step_fns: Any = None
        self.x0 = x0

    def _jacobian_graph(self) -> tuple[list[Any], Any, Any]:
        return self._products[0]

    def _curvature_graph(self) -> tuple[list[Any], Any, Any]:
        return self._products[1]

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
        return self._jacobian_rows(x, np.eye(self.n_coef)).reshape(self.n_coef, x.size)

    def coefficient_gradient(self, x: NDArray[np.float64],
                             u: NDArray[np.float64]) -> NDArray[np.float64]:
        """``(∂c/∂θ)ᵀ u`` at ``x``: the θ-gradient of ``u·c(θ)`` (one product; no data)."""
        return np.asarray(self._vjp_fn(x, u), dtype=np.float64)

    def own_coordinates(self, x: NDArray[np.float64]) -> list[tuple[int, int, float, slice]]:
        """Each group's own coordinate: ``(k, m, slope, term)`` per group effect.

        ``k`` is a coefficient of a per-row-index term (one group's effect, as
        ``mu + tau * z[group]``), ``m`` the one coordinate of the flat state that moves
        ``c_k`` and no other coefficient of that term (``z[j]``), ``slope`` is
        ``∂c_k/∂θ_m`` and ``term`` the term's slice of the coefficients, all read from the
        Jacobian at ``x`` (no data). Coordinates claimed by two coefficients are left out.
        """
        jac = self.jacobian(x)
        moves = jac != 0.0
        found: list[tuple[int, int, float, slice]] = []
        for term, sl in zip(self.terms, self.slices, strict=True):
            block = moves[sl]
            if term.kind != "index" or block.shape[0] < 2:
                continue
            own = block & (block.sum(axis=0) == 1)  # columns that move one coefficient
            for r, row in enumerate(own):
                cols = np.flatnonzero(row)
                if cols.size == 1:
                    k, m = sl.start + r, int(cols[0])
                    found.append((k, m, float(jac[k, m]), sl))
        claimed = np.bincount([f[1] for f in found], minlength=x.size)
        return [f for f in found if claimed[f[1]] == 1]

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
        return self._curvature_rows(x, a, np.eye(x.size)).T

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

    Warns
    -----
    UserWarning
        If the analysis fails with anything but a
        :class:`~pymc_minibatch_mh.estimators.predictor_walk.DecompositionError` (the expected
        refusal, which is only logged): the θ-space expansion is used then, and the
        warning names the exception.

    """
    try:
        analysis = PredictorAnalysis(likelihood)
    except DecompositionError as err:
        return None, f"the per-row quantities do not decompose: {err}"
    except Exception as err:  # noqa: BLE001 - an unforeseen graph: warned, θ-space expansion
        reason = f"the analysis failed ({err.__class__.__name__}: {err})"
        warnings.warn(
            f"control_variate='taylor': the analysis of the per-row quantities failed "
            f"unexpectedly ({err.__class__.__name__}: {err}), so the θ-space expansion is "
            "used. It is correct, but may need larger minibatches on models whose rows see "
            "the parameters through a non-linear function (hierarchical models). Pass "
            "control_variate='taylor_theta' to choose it without this warning, and please "
            "report the model.",
            UserWarning, stacklevel=2,
        )
        return None, reason
    if analysis.is_affine():
        return analysis, ("every coefficient is affine in the parameters, so the expansion in "
                      "the per-row quantities equals the θ-space expansion")
    return analysis, f"per-row quantities: {analysis.name}"
