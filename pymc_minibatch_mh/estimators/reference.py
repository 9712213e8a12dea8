"""The reference point of the Taylor control variates: MAP search and full-data passes.

:class:`TaylorPasses` computes, over all rows of the row store in bounded-memory chunks,
the log-likelihood's sum, gradient G and Hessian H at a point (Hessian-vector products,
one per coordinate), and finds θ̂ as the mode of the full-data log posterior over the
sampled variables (flat, transformed space; the other free variables held at the initial
point). On tall data θ̂ comes from a subsample's mode by gradient passes and one pass
with the Hessian, within a posterior sd of the mode (the sums are exact, θ̂ need not be
the mode: :meth:`TaylorPasses.find_map`); otherwise SciPy's L-BFGS-B on the compiled
full-data log posterior and its gradient, then trust-region Newton steps (SciPy's
``trust-exact``, one pass each) until the Newton decrement (the distance to the mode in
posterior standard deviations) is below :data:`MAP_TOLERANCE`. Every row evaluated is
counted in :attr:`TaylorPasses.evaluations`. The estimator that uses θ̂, G and H is
:mod:`~pymc_minibatch_mh.estimators.taylor`.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytensor.tensor as pt
import scipy.linalg
from numpy.typing import NDArray
from pytensor.gradient import grad
from scipy import optimize

from pymc_minibatch_mh.core.control_variate import TaylorReference, newton_decrement
from pymc_minibatch_mh.errors import ControlVariateError
from pymc_minibatch_mh.model.graph import BatchedProducts, checks_as_ninf
from pymc_minibatch_mh.model.internals import compile_derived
from pymc_minibatch_mh.model.likelihood import MinibatchLikelihood
from pymc_minibatch_mh.progress import note

__all__ = ["GRADIENT_STEPS", "MAP_TOLERANCE", "NEWTON_FIRST_STEPS", "REFERENCE_DECREMENT",
           "SUBSAMPLE_ROWS", "ChunkSums", "TaylorPasses", "add_chunks"]

#: Largest Newton decrement (≈ distance to the mode in posterior standard deviations)
#: accepted for the MAP found by the package.
MAP_TOLERANCE: float = 1e-3

#: Rows of the subsample whose mode starts the search for θ̂ on data with more than four
#: times as many rows (:meth:`TaylorPasses.find_map`).
SUBSAMPLE_ROWS: int = 50_000

#: Largest Newton decrement (≈ distance to the mode in posterior sds, over all
#: dimensions) of a θ̂ found from a subsample's mode without the Newton polish
#: (:meth:`TaylorPasses.find_map`).
REFERENCE_DECREMENT: float = 1.0

#: Most gradient passes that bring a subsample's mode near the data's
#: (the gradient steps of :meth:`TaylorPasses.find_map`).
GRADIENT_STEPS: int = 6

#: Most trust-region Newton steps of a search that starts with them at the initial point
#: (passes whose Hessian is cheap, :meth:`TaylorPasses.newton_first`); the search goes on
#: with L-BFGS-B from their last point if they do not reach :data:`MAP_TOLERANCE`.
NEWTON_FIRST_STEPS: int = 10

# PyTensor mode of the full-data passes (MAP search and G, H): PyTensor's default,
# "FAST_RUN", which is the C virtual machine on PyTensor 2 (1–3 × faster than Numba there
# on chunks of 2^18 rows, logistic regression, d = 10) and Numba on PyTensor 3. Compiled
# through compile_function, so an op without a Numba implementation goes to C there.
_FULL_PASS_MODE = "FAST_RUN"


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


class TaylorPasses:
    """Full-data passes and the MAP search of the Taylor control variates.

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
        #: Newton decrement at the MAP found by :meth:`find_map` (NaN before).
        self.map_decrement = math.nan
        #: Whether :meth:`find_map` reached :data:`MAP_TOLERANCE` (False before).
        self.map_converged = False
        #: Whether :meth:`find_map` found θ̂ from a subsample's mode without the Newton
        #: polish (gradient passes and one pass with the Hessian).
        self.subsample_reference = False
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

    def find_map(self, x0: NDArray[np.float64], strict: bool = True) -> TaylorReference:
        """θ̂ of the control variates: near the mode in a few passes on tall data.

        With more than ``4 ·`` :data:`SUBSAMPLE_ROWS` rows: L-BFGS-B on an evenly spaced
        subsample of :data:`SUBSAMPLE_ROWS` rows (its log-likelihood scaled by ``N/m``;
        no full pass) gives a start about ``√(N/m)`` posterior sds from the mode per
        dimension; Newton steps with the subsample's Hessian and the full data's
        gradient (``_gradient_steps``: gradient passes, much cheaper than passes
        with the Hessian) bring it within about one posterior sd, and **one pass with the
        Hessian** there gives the exact sums. That point is θ̂ when its Newton decrement
        is at most :data:`REFERENCE_DECREMENT`: the control variates are unbiased at any
        point and the residuals barely grow within a posterior sd of the mode, and the
        proposals' Laplace fit is centred one Newton step from it
        (:meth:`~pymc_minibatch_mh.core.control_variate.TaylorReference.laplace_mean`).
        Otherwise (no Laplace fit on the subsample, gradient steps that do not contract,
        or a larger decrement), trust-region Newton steps (``_newton``: one pass with
        the Hessian per point tried) polish the point to :data:`MAP_TOLERANCE`, and if
        they do not reach it (or with fewer rows) the search is L-BFGS-B on the full data
        (one gradient pass per evaluation) from their last point (from ``x0`` with fewer
        rows), then the Newton steps. (Measured on crossed random intercepts at N = 10⁶:
        the Newton steps stopped 2.6 posterior sds from the mode after 50 passes; L-BFGS-B
        from ``x0`` then took 941 passes, from their last point 3, and 22 more Newton
        steps reached the tolerance: the step was built in 48 s instead of 122 s.)
        With fewer rows, where :meth:`newton_first` says so (passes whose Hessian is
        cheap), at most :data:`NEWTON_FIRST_STEPS` Newton steps from ``x0`` come first,
        and L-BFGS-B starts from their last point if they do not reach the tolerance.

        With ``strict=False`` a search that does not reach :data:`MAP_TOLERANCE` (Newton
        polishing fails, e.g. where the log posterior is not concave) returns the
        reference at the last point reached instead of raising, provided the
        log-likelihood and its derivatives are finite there. :attr:`map_decrement` says
        how far θ̂ is from the mode; :attr:`map_converged` whether it is the mode (to
        the tolerance) and :attr:`subsample_reference` whether θ̂ came from the
        subsample's path without the Newton polish.
        """
        ref, decrement, message = None, math.inf, "not run (subsample start)"
        self.subsample_reference = False
        evaluate = self._evaluator()
        rows = self._subsample_rows()
        start = None if rows is None else self._subsample_mode(x0, rows)
        if start is not None:
            near = self._gradient_steps(start, rows)
            if near is not None:
                start = near
                ref, _, _, decrement = evaluate(near)
                if ref is not None and decrement <= REFERENCE_DECREMENT:
                    self.map_converged = decrement <= MAP_TOLERANCE
                    self.map_decrement = decrement
                    self.subsample_reference = True
                    return ref
            ref, decrement = self._newton(start, evaluate)
        elif self.newton_first():
            ref, decrement = self._newton(x0, evaluate, steps=NEWTON_FIRST_STEPS)
        if not decrement <= MAP_TOLERANCE:
            # From the best point so far: the Newton steps' last point, if they had one.
            x_start = x0 if ref is None else np.asarray(ref.theta, dtype=np.float64)
            with np.errstate(all="ignore"):
                result = optimize.minimize(
                    self._negative_log_posterior, x_start, jac=True, method="L-BFGS-B",
                    options={"maxiter": 1000},
                )
            message = str(result.message)
            ref, decrement = self._newton(np.asarray(result.x, dtype=np.float64), evaluate)
        self.map_converged = ref is not None and decrement <= MAP_TOLERANCE
        self.map_decrement = decrement
        if ref is not None and (self.map_converged or not strict):
            return ref
        raise ControlVariateError(
            "The MAP search for the control variates' reference point did not "
            f"converge (L-BFGS-B: {message}; Newton decrement {decrement:.3g}, the "
            "distance to the mode in posterior standard deviations, should be below "
            f"{MAP_TOLERANCE}). Pass reference={{...}} (e.g. from pm.find_MAP() with more "
            "iterations, or the posterior mean of a short run), or use control_variate=None."
        )

    def hessian_on(self, x: NDArray[np.float64], rows: list[NDArray[Any]]) -> NDArray[np.float64]:
        """The Hessian of the log-likelihood of ``rows`` at ``x`` (not counted)."""
        return self.hessian_sums(x, *rows)[2]

    def _gradient_steps(self, x: NDArray[np.float64],
                        rows: list[NDArray[Any]]) -> NDArray[np.float64] | None:
        """From a subsample's mode to within about a posterior sd of the data's mode.

        Newton steps ``x ← x + P⁻¹ g(x)`` with the full data's gradient of the log
        posterior ``g`` (one gradient pass each) and a fixed precision ``P``: the
        subsample's, scaled by ``N/m`` (plus the prior's), whose relative error of a few
        per cent makes each step shrink the decrement ``√(gᵀP⁻¹g)`` about tenfold or
        more. Once the decrement is at most :data:`REFERENCE_DECREMENT`, or the next one
        predicted from the last contraction will be, it takes that step and stops
        (without the pass that would confirm it: the pass with the Hessian at θ̂
        measures it).
        None when ``P`` is not positive definite (a curved posterior), or a step does
        not halve the decrement, or after :data:`GRADIENT_STEPS` passes.
        """
        n, m = self.store.n_rows, SUBSAMPLE_ROWS
        with np.errstate(all="ignore"):
            h = n / m * self.hessian_on(x, rows)
            prior_h = self.prior(x, hessian=True)[2]
            try:
                factor = scipy.linalg.cho_factor(-(h + prior_h))
            except (np.linalg.LinAlgError, ValueError):
                return None
        previous = math.inf
        for _ in range(GRADIENT_STEPS):
            loglik, g, _ = self._full_pass(x, hessian=False)
            g_post = g + self.prior(x)[1]
            with np.errstate(all="ignore"):
                step = scipy.linalg.cho_solve(factor, g_post)
            decrement = math.sqrt(max(float(g_post @ step), 0.0))
            if not (math.isfinite(loglik) and math.isfinite(decrement)):
                return None
            predicted = decrement * decrement / previous if math.isfinite(previous) else math.inf
            if min(decrement, predicted) <= REFERENCE_DECREMENT:
                return x + step  # a last step: from within a sd it contracts further
            if decrement > previous / 2:
                return None
            x = x + step
            previous = decrement
        return None

    def _negative_log_posterior(self, x: NDArray[np.float64]) -> tuple[float, Any]:
        """Minus the full-data log posterior and its gradient (one gradient pass)."""
        loglik, g, _ = self._full_pass(x, hessian=False)
        return self._negated_posterior(x, loglik, g)

    def _negated_posterior(self, x: NDArray[np.float64], loglik: float, g: Any,
                           scale: float = 1.0) -> tuple[float, Any]:
        """``−(scale · loglik + prior)`` and its gradient at ``x`` (L-BFGS-B's objective).

        ``+inf`` (and a zero gradient) where it is not finite.
        """
        prior, prior_g, _ = self.prior(x)
        value = -(scale * float(loglik) + float(prior))
        if not math.isfinite(value):
            return math.inf, np.zeros_like(x)
        return value, -(scale * g + prior_g)

    def _subsample_rows(self) -> list[NDArray[Any]] | None:
        """:data:`SUBSAMPLE_ROWS` evenly spaced rows, or None with at most ``4 m`` rows.

        Read once; the rows evaluated on them are counted in :attr:`evaluations`.
        """
        n, m = self.store.n_rows, SUBSAMPLE_ROWS
        if n <= 4 * m:
            return None
        return self.store.rows(np.linspace(0, n - 1, m).round().astype(np.int64))

    def _subsample_mode(self, x0: NDArray[np.float64],
                        rows: list[NDArray[Any]]) -> NDArray[np.float64] | None:
        """L-BFGS-B's mode with ``N/m ·`` the log-likelihood of the ``m`` subsample rows."""
        n, m = self.store.n_rows, SUBSAMPLE_ROWS
        scale = n / m

        def objective(x: NDArray[np.float64]) -> tuple[float, Any]:
            return self._negated_posterior(x, *self.value_grad_fn(x, *rows), scale=scale)

        note(f"MAP search on a subsample of {m:,} of {n:,} rows")
        with np.errstate(all="ignore"):
            result = optimize.minimize(objective, x0, jac=True, method="L-BFGS-B",
                                       options={"maxiter": 1000})
        self.evaluations += m * result.nfev
        x = np.asarray(result.x, dtype=np.float64)
        return x if np.all(np.isfinite(x)) else None

    def _evaluator(self) -> Any:
        """A cache of the passes of one search: ``x -> (ref, log post, gradient, decrement)``.

        One pass per point (:meth:`reference_at`: value, G and H together); it keeps the
        accepted point and the last trial, so the pass where the gradient steps ended is
        not repeated by the Newton steps that start there.
        """
        @functools.lru_cache(maxsize=2)
        def at(key: bytes) -> tuple[TaylorReference | None, float, Any, float]:
            x = np.frombuffer(key, dtype=np.float64).copy()
            try:
                ref = self.reference_at(x, what="point the MAP search reached")
            except ControlVariateError:
                return None, -math.inf, None, math.inf
            prior, prior_g, _ = self.prior(x)
            g_post = ref.gradient + prior_g
            return (ref, ref.loglik + float(prior), g_post,
                    newton_decrement(g_post, ref.precision()))

        def evaluate(x: Any) -> tuple[TaylorReference | None, float, Any, float]:
            return at(np.asarray(x, dtype=np.float64).tobytes())

        return evaluate

    def newton_first(self) -> bool:
        """Whether a search without a subsample starts with Newton steps.

        No here: it starts with L-BFGS-B's gradient passes.
        :class:`~pymc_minibatch_mh.estimators.predictor_passes.PredictorPasses` says yes
        where its passes with the Hessian are cheap.
        """
        return False

    def _newton(self, x: NDArray[np.float64], evaluate: Any,
                steps: int = 50) -> tuple[TaylorReference | None, float]:
        """Trust-region Newton steps from ``x`` until the decrement is below the tolerance.

        SciPy's ``trust-exact`` with the exact Hessian of the log posterior; every point
        it tries costs one pass (``evaluate``, from ``_evaluator``), and it stops, through its
        callback, as soon as the Newton decrement at an accepted point is below
        :data:`MAP_TOLERANCE`. The trust region makes the steps safe where the Hessian is
        not negative definite or the posterior is a curved ridge (a non-centred
        hierarchical model at N = 10⁶, where plain Newton steps stopped at an indefinite
        Hessian). At most ``steps`` iterations. Returns the reference at the last accepted
        point (None if even ``x`` failed) and its decrement (inf where the Hessian is not
        negative definite).
        """
        def callback(intermediate_result: optimize.OptimizeResult) -> None:
            if evaluate(intermediate_result.x)[3] <= MAP_TOLERANCE:
                raise StopIteration

        ref, _, _, decrement = evaluate(x)
        if ref is None or decrement <= MAP_TOLERANCE:
            return ref, decrement
        with np.errstate(all="ignore"):
            result = optimize.minimize(
                lambda x: -evaluate(x)[1], x, jac=lambda x: -evaluate(x)[2],
                hess=lambda x: evaluate(x)[0].precision(), method="trust-exact",
                callback=callback, options={"maxiter": steps, "gtol": 0.0},
            )
        ref, _, _, decrement = evaluate(result.x)  # the last accepted point (cached)
        return ref, decrement
