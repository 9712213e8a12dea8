"""The reference point of the Taylor control variates: the MAP search.

:class:`TaylorPasses` finds θ̂ as the mode of the full-data log posterior over the
sampled variables (flat, transformed space; the other free variables held at the initial
point), on the full-data passes of
:class:`~pymc_minibatch_mh.estimators.full_passes.FullDataPasses` (the log-likelihood's
sum, gradient G and Hessian H over all rows, in bounded-memory chunks). On tall data θ̂
comes from a subsample's mode by gradient passes and one pass with the Hessian, within a
posterior sd of the mode (the sums are exact, θ̂ need not be the mode:
:meth:`TaylorPasses.find_map`); otherwise SciPy's L-BFGS-B on the compiled full-data log
posterior and its gradient, then trust-region Newton steps (SciPy's ``trust-exact``, one
pass each) until the Newton decrement (the distance to the mode in posterior standard
deviations) is below :data:`MAP_TOLERANCE`. Every row evaluated is counted in
:attr:`~pymc_minibatch_mh.estimators.full_passes.FullDataPasses.evaluations`. The
estimator that uses θ̂, G and H is :mod:`~pymc_minibatch_mh.estimators.taylor`.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
import scipy.linalg
from numpy.typing import NDArray
from scipy import optimize

from pymc_minibatch_mh.core.control_variate import TaylorReference, newton_decrement
from pymc_minibatch_mh.errors import ControlVariateError
from pymc_minibatch_mh.estimators.full_passes import FullDataPasses
from pymc_minibatch_mh.model.likelihood import MinibatchLikelihood
from pymc_minibatch_mh.progress import note

__all__ = ["GRADIENT_STEPS", "MAP_TOLERANCE", "REFERENCE_DECREMENT", "SUBSAMPLE_ROWS",
           "TaylorPasses"]

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


class TaylorPasses(FullDataPasses):
    """The MAP search of the Taylor control variates, on their full-data passes.

    :class:`~pymc_minibatch_mh.estimators.full_passes.FullDataPasses` (the passes, the
    log prior and the reference at a point; built from the same arguments) with
    :meth:`find_map`, the search for θ̂.
    """

    def __init__(self, likelihood: MinibatchLikelihood, step_name: str) -> None:
        super().__init__(likelihood, step_name)
        #: Newton decrement at the MAP found by :meth:`find_map` (NaN before).
        self.map_decrement = math.nan
        #: Whether :meth:`find_map` reached :data:`MAP_TOLERANCE` (False before).
        self.map_converged = False
        #: Whether :meth:`find_map` found θ̂ from a subsample's mode without the Newton
        #: polish (gradient passes and one pass with the Hessian).
        self.subsample_reference = False

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
        With fewer rows, a subclass's first steps from ``x0`` (``_first_steps``; none
        here) come first, and L-BFGS-B starts from their last point if they do not reach
        the tolerance.

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
        else:
            ref, decrement = self._first_steps(x0, evaluate)
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

    def _first_steps(self, x0: NDArray[np.float64],
                     evaluate: Any) -> tuple[TaylorReference | None, float]:
        """Steps from ``x0`` before L-BFGS-B, on data without a subsample (a hook).

        None here: the search starts with L-BFGS-B's gradient passes.
        :class:`~pymc_minibatch_mh.estimators.predictor_passes.PredictorPasses` takes
        steps that maximise the expansion in the per-row quantities. Returns the
        reference at the last point reached (None: none) and its Newton decrement.
        """
        return None, math.inf

    def _newton(self, x: NDArray[np.float64],
                evaluate: Any) -> tuple[TaylorReference | None, float]:
        """Trust-region Newton steps from ``x`` until the decrement is below the tolerance.

        SciPy's ``trust-exact`` with the exact Hessian of the log posterior; every point
        it tries costs one pass (``evaluate``, from ``_evaluator``), and it stops, through its
        callback, as soon as the Newton decrement at an accepted point is below
        :data:`MAP_TOLERANCE`. The trust region makes the steps safe where the Hessian is
        not negative definite or the posterior is a curved ridge (a non-centred
        hierarchical model at N = 10⁶, where plain Newton steps stopped at an indefinite
        Hessian). At most 50 iterations. Returns the reference at the last accepted
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
                callback=callback, options={"maxiter": 50, "gtol": 0.0},
            )
        ref, _, _, decrement = evaluate(result.x)  # the last accepted point (cached)
        return ref, decrement
