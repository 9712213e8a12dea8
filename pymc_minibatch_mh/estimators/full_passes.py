"""The full-data passes of the Taylor control variates: the sums, G and H over all rows.

:class:`FullDataPasses` computes, over all rows of the row store in bounded-memory chunks
(:class:`ChunkSums` per chunk, added up by :func:`add_chunks`), the log-likelihood's sum,
gradient G and Hessian H at a point (Hessian-vector products, one per coordinate), and the
log prior's value, gradient and Hessian; it builds the
:class:`~pymc_minibatch_mh.core.control_variate.TaylorReference` at a point and checks a
user's reference point. Every row evaluated is counted in
:attr:`FullDataPasses.evaluations`. The MAP search on these passes is
:class:`~pymc_minibatch_mh.estimators.reference.TaylorPasses`.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytensor.tensor as pt
from numpy.typing import NDArray
from pytensor.gradient import grad

from pymc_minibatch_mh.core.control_variate import TaylorReference
from pymc_minibatch_mh.errors import ControlVariateError
from pymc_minibatch_mh.model.compat import default_mode
from pymc_minibatch_mh.model.compilation import compile_derived
from pymc_minibatch_mh.model.graph import BatchedProducts, checks_as_ninf
from pymc_minibatch_mh.model.likelihood import MinibatchLikelihood
from pymc_minibatch_mh.progress import note

__all__ = ["ChunkSums", "FullDataPasses", "add_chunks"]

# PyTensor mode of the full-data passes (MAP search and G, H): the per-step functions'
# backend (default_mode: Numba), compiled through compile_function, so an op without a
# Numba implementation goes to C. With PyTensor's caches empty, C compiled the passes of a
# Student-t regression in 24 s (35 modules, one compiler run each) against 2 s for Numba;
# per pass at 10^6 rows Numba ran as fast as C on logistic and Student-t regressions and
# 1.3 × slower on a negative binomial one (PyTensor 2.38).
_FULL_PASS_MODE = default_mode()


def add_chunks(parts: list[tuple[Any, ...]]) -> tuple[Any, ...]:
    """The per-chunk results ``(sum, *arrays)`` of a full pass, added up.

    The sums are added with ``math.fsum``, the arrays element-wise; an array that is None
    in the chunks stays None.
    """
    total = math.fsum(p[0] for p in parts)
    return total, *[None if column[0] is None else np.sum(column, axis=0)
                    for column in list(zip(*parts, strict=True))[1:]]


class ChunkSums:
    """The log-likelihood's sum, gradient and Hessian over one chunk of rows.

    A picklable callable of compiled PyTensor functions: a Dask row store sends it to
    the workers (:meth:`~pymc_minibatch_mh.store.row_store.RowStore.reduce`).

    Parameters
    ----------
    value_grad_fn, hvp_fn : pytensor.compile.function.types.Function
        ``(x, *rows) -> (sum, gradient)`` and ``(x, v, *rows) -> H v``; ``hvp_fn=None``:
        no Hessian.
    dim : int
        Size of ``x``.

    """

    def __init__(self, value_grad_fn: Any, hvp_fn: Any, dim: int) -> None:
        self.value_grad_fn, self.hvp_fn, self.dim = value_grad_fn, hvp_fn, dim

    def __call__(self, x: NDArray[np.float64], *rows: NDArray[Any]) -> tuple[Any, ...]:
        """``(sum, gradient, Hessian or None)`` of the chunk's log-likelihood at ``x``."""
        value, g = self.value_grad_fn(x, *rows)
        h = None
        if self.hvp_fn is not None:
            eye = np.eye(self.dim)
            h = np.column_stack([self.hvp_fn(x, eye[j], *rows) for j in range(self.dim)])
        return float(value), np.asarray(g), h


class FullDataPasses:
    """Full-data passes of the Taylor control variates, and the reference at a point.

    The graphs are built here; the per-chunk functions of the passes are compiled on
    first use (:attr:`value_grad_fn`, :attr:`hvp_fn` and the :class:`ChunkSums` built on
    them), so a path that does not use one never compiles it (the per-row-quantity
    expansion with a given reference needs neither). A failed compilation raises a
    :class:`~pymc_minibatch_mh.errors.ControlVariateError` that names the function.

    Parameters
    ----------
    likelihood : MinibatchLikelihood
        The step's compiled likelihood (its graphs and row store are used).
    step_name : str
        Used in error messages.

    """

    def __init__(self, likelihood: MinibatchLikelihood, step_name: str) -> None:
        self.likelihood = likelihood
        self.store = likelihood.store
        self.step_name = step_name
        self.dim = likelihood.point_map.size
        #: Rows evaluated by full passes since the passes were built.
        self.evaluations = 0
        #: Full passes with the Hessian (the costly kind) since the passes were built.
        self.hessian_passes = 0
        self._prior_memo: tuple[bytes, float, Any, Any] | None = None
        self._build_graphs(likelihood.graphs)

    def _build_graphs(self, graphs: Any) -> None:
        # The Hessians are assembled column by column from Hessian-vector products
        # (reverse over reverse): PyTensor's vectorised jacobian can send the graph
        # rewriter into a loop (seen with a Normal likelihood), its scan version compiles
        # slowly, and d products per chunk cost little next to the rest of the pass.
        # Each function is derived from the model's graphs when it is compiled (not in a
        # process that finds it in the cache: see compile_derived).
        self._graphs = graphs
        # No data in the prior: a quickly compiled function is fast enough.
        self._prior_all_fn = self._compile_fn(
            "prior_all_fn", [graphs.flat], [graphs.prior], mode="FAST_COMPILE",
            what="the log prior, its gradient and a Hessian-vector product",
            derive=self._prior_derivatives, trust_input=False,
        )
        self._prior_hessian_rows = BatchedProducts(
            self._prior_hessian_graph, "log prior's Hessian columns", self._prior_hessian_column
        )

    def _prior_derivatives(self) -> tuple[list[Any], list[Any]]:
        """``(x, v) -> (log prior, its gradient, its Hessian times v)``."""
        flat = self._graphs.flat
        v = pt.vector("v", dtype="float64")
        (prior,) = checks_as_ninf([self._graphs.prior])
        prior_g = grad(prior, flat, disconnected_inputs="ignore")
        hv = grad(pt.dot(prior_g, v), flat, disconnected_inputs="ignore")
        return [flat, v], [prior, prior_g, hv]

    def _prior_hessian_graph(self) -> tuple[list[Any], Any, Any]:
        """The prior's Hessian-vector product: inputs ``[x]``, output, and ``v``."""
        (flat, v), outputs = self._prior_derivatives()
        return [flat], outputs[2], v

    def _data_graphs(self, hessian: bool) -> tuple[list[Any], Any]:
        """A chunk's ``(x, *rows) -> (Σ ℓ_i, its gradient)``.

        With ``hessian``: ``(x, v, *rows) -> H v``.
        """
        g = self._graphs
        (row_loglik,) = checks_as_ninf([g.row_loglik])
        total = pt.sum(row_loglik)
        gradient = grad(total, g.flat)
        if not hessian:
            return [g.flat, *g.data], [total, gradient]
        v = pt.vector("v", dtype="float64")
        return [g.flat, v, *g.data], grad(pt.dot(gradient, v), g.flat)

    def _compile_fn(self, name: str, inputs: list[Any], outputs: Any, mode: str,
                    what: str, derive: Any, trust_input: bool = True) -> Any:
        """Compile one function of the passes; a failure names it.

        It is derived by ``derive()`` from the graph of ``inputs`` and ``outputs``.
        """
        try:
            fn, _, _ = compile_derived(inputs, outputs, f"TaylorPasses.{name}", derive, mode)
        except Exception as err:
            raise ControlVariateError(
                f"{self.step_name}: compiling the control variates' function {name} ({what}) "
                f"failed ({err.__class__.__name__}: {err}). The model's log-likelihood or "
                "prior has an operation PyTensor cannot differentiate or compile here; use "
                "control_variate=None for this step (and report the model if it should "
                "work)."
            ) from err
        fn.trust_input = trust_input
        return fn

    @functools.cached_property
    def value_grad_fn(self) -> Any:
        """``(x, *rows) -> (Σ ℓ_i, its gradient)`` over a chunk (compiled on first use)."""
        g = self._graphs
        return self._compile_fn("value_grad_fn", [g.flat, *g.data], [g.row_loglik],
                                _FULL_PASS_MODE, "the chunk's log-likelihood and its gradient",
                                functools.partial(self._data_graphs, False))

    @functools.cached_property
    def hvp_fn(self) -> Any:
        """``(x, v, *rows) -> H v`` over a chunk (compiled on first use)."""
        g = self._graphs
        return self._compile_fn("hvp_fn", [g.flat, *g.data], [g.row_loglik], _FULL_PASS_MODE,
                                "Hessian-vector products of the chunk's log-likelihood",
                                functools.partial(self._data_graphs, True))

    @functools.cached_property
    def gradient_sums(self) -> ChunkSums:
        """The per-chunk sum and gradient of a gradient pass (first use compiles)."""
        return ChunkSums(self.value_grad_fn, None, self.dim)

    @functools.cached_property
    def hessian_sums(self) -> ChunkSums:
        """The per-chunk sum, gradient and Hessian of a full pass (first use compiles)."""
        return ChunkSums(self.value_grad_fn, self.hvp_fn, self.dim)

    def _prior_hessian_column(self, x: NDArray[np.float64],
                              v: NDArray[np.float64]) -> NDArray[np.float64]:
        return self._prior_all_fn(x, v)[2]

    def prior(
        self, x: NDArray[np.float64], hessian: bool = False
    ) -> tuple[float, NDArray[np.float64], NDArray[np.float64] | None]:
        """Log prior (with Jacobians and Potentials), its gradient and Hessian at ``x``.

        The last point's are kept: a point of the MAP search asks for them up to three
        times (its reference's prior Hessian and gradient, and the search's log
        posterior), each a call of a function that runs in Python. Not kept where the
        prior reads variables of other steps (they may change between two calls).
        """
        key = np.asarray(x, dtype=np.float64).tobytes()
        memo = self._prior_memo
        if memo is not None and memo[0] == key and (memo[3] is not None or not hessian):
            value, g, h = memo[1:]
        else:
            eye = np.eye(self.dim)
            value, g, _ = self._prior_all_fn(x, eye[0])
            value, g = float(value), np.asarray(g)
            h = self._prior_hessian_rows(x, eye).T if hessian else None
            if not self.likelihood.other_shared:
                self._prior_memo = (key, value, g, h)
        return value, g.copy(), (h.copy() if hessian else None)

    def _full_pass(
        self, x: NDArray[np.float64], hessian: bool
    ) -> tuple[float, NDArray[np.float64], NDArray[np.float64] | None]:
        """Sum, gradient (and Hessian) of the log-likelihood over all rows, in chunks."""
        note(f"full pass {self.evaluations // self.store.n_rows + 1} over "
             f"{self.store.n_rows:,} rows ({'gradient and Hessian' if hessian else 'gradient'})")
        parts = self.store.reduce(self.hessian_sums if hessian else self.gradient_sums, x)
        self.evaluations += self.store.n_rows
        self.hessian_passes += hessian
        return add_chunks(parts)

    def reference_at(self, x: NDArray[np.float64], what: str) -> TaylorReference:
        """G and H at ``x`` (one counted pass), checked finite."""
        loglik, g, h = self._full_pass(x, hessian=True)
        if not (math.isfinite(loglik) and np.all(np.isfinite(g)) and np.all(np.isfinite(h))):
            raise ControlVariateError(
                f"The log-likelihood or its derivatives are not finite at the {what} "
                f"({self.describe(x)}): log-likelihood {loglik}. Give a reference= point "
                "where every observation has positive likelihood, or use "
                "control_variate=None."
            )
        return TaylorReference(x.copy(), g, h, self.prior_hessian(x, what), loglik=loglik,
                               **self.prior_fields(x))

    def prior_fields(self, x: NDArray[np.float64]) -> dict[str, Any]:
        """The reference's fields of the log prior at ``x``.

        Its value (``log_prior``) and its gradient (``prior_gradient``; None where it is not
        finite, a boundary). A gradient of None makes the Laplace fit's mean θ̂ itself
        (:meth:`~pymc_minibatch_mh.core.control_variate.TaylorReference.laplace_mean`).
        """
        value, g, _ = self.prior(x)
        return {"log_prior": value, "prior_gradient": g if np.all(np.isfinite(g)) else None}

    def prior_hessian(self, x: NDArray[np.float64], what: str) -> NDArray[np.float64] | None:
        """The log prior's Hessian at ``x``, or None (with a warning) where it is not finite.

        None makes the reference's prior Hessian zero: Δ* is unaffected (it uses the
        prior's exact difference), but the Laplace approximation at the reference (its
        precision, ``S="laplace"``, the ``recenter=`` distance, the MAP search's Newton
        decrement) then uses the likelihood's Hessian alone, which the warning says.
        """
        _, _, h = self.prior(x, hessian=True)
        finite = np.isfinite(h)
        if np.all(finite):
            return h
        bad = ~np.all(finite, axis=1)
        names = [e.name for e in self.likelihood.point_map.entries
                 if np.any(bad[e.start:e.start + e.size])]
        warnings.warn(
            f"{self.step_name}: the Hessian of the log prior is not finite at the {what} "
            f"(in the rows of {names}); the control variates use a zero prior Hessian "
            "there. Δ* is unaffected, but the Laplace approximation at that point "
            "(S='laplace', recenter=, the MAP search's convergence check) then ignores "
            "the prior's curvature. The prior is probably not twice differentiable there "
            "(a kink or a boundary): give a reference= point away from it, or set S= "
            "yourself.",
            UserWarning, stacklevel=2,
        )
        return None

    def describe(self, x: NDArray[np.float64]) -> str:
        """``x`` as ``name=value`` pairs of the sampled variables, for error messages."""
        point = self.likelihood.point_map.to_point(x, {})
        return ", ".join(f"{k}={np.round(np.asarray(v), 4).tolist()}" for k, v in point.items())

    def reference_flat(self, reference: Mapping[str, Any]) -> NDArray[np.float64]:
        """A user's reference point (value or variable names) as a flat vector, checked."""
        if not isinstance(reference, Mapping):
            raise ControlVariateError(
                "reference must be a point dict (variable name -> value), such as what "
                f"pm.find_MAP() returns; got {type(reference).__name__}."
            )
        model = self.likelihood.model
        values: dict[str, Any] = {}
        missing = []
        for var, e in zip(self.likelihood.value_vars, self.likelihood.point_map.entries,
                          strict=True):
            if e.name in reference:
                values[e.name] = reference[e.name]
                continue
            rv = model.values_to_rvs[var]
            if rv.name in reference:
                transform = model.rvs_to_transforms.get(rv)
                value = np.asarray(reference[rv.name], dtype=np.float64)
                if transform is not None:
                    try:
                        value = np.asarray(
                            transform.forward(pt.as_tensor(value), *rv.owner.inputs).eval()
                        )
                    except Exception as err:
                        raise ControlVariateError(
                            f"Could not transform the reference value of {rv.name!r} to "
                            f"the sampled space ({err.__class__.__name__}: {err}). Give "
                            f"the transformed value under the name {e.name!r} instead."
                        ) from err
                values[e.name] = value
                continue
            missing.append(e.name if e.name == rv.name else f"{rv.name} (or {e.name})")
        if missing:
            raise ControlVariateError(
                f"The reference point has no value for {missing}. Give a value for every "
                f"variable this {self.step_name} samples (or leave reference=None to let "
                "the step find the MAP)."
            )
        for e in self.likelihood.point_map.entries:
            value = np.asarray(values[e.name], dtype=np.float64)
            if value.size != e.size:
                raise ControlVariateError(
                    f"The reference value of {e.name!r} has shape {value.shape}, but the "
                    f"variable has shape {e.shape}."
                )
            if not np.all(np.isfinite(value)):
                raise ControlVariateError(
                    f"The reference value of {e.name!r} is not finite: {value.tolist()}."
                )
            values[e.name] = value.reshape(e.shape)
        return self.likelihood.point_map.to_flat(values)

    def hessian_on(self, x: NDArray[np.float64], rows: list[NDArray[Any]]) -> NDArray[np.float64]:
        """The Hessian of the log-likelihood of ``rows`` at ``x`` (not counted)."""
        return self.hessian_sums(x, *rows)[2]
