r"""Taylor control variates on a PyMC model: the estimator of Δ* with residuals.

:class:`TaylorEstimator` is a Δ* estimator (:mod:`~pymc_minibatch_mh.estimators.ratio`)
whose per-row function, ``(x_cur, x_prop, inv_temperature, *rows) -> (r, data_free)``,
gives the tempered *residuals*

.. math::

    r_i = \frac1K\Bigl[ℓ_i(θ') − ℓ_i(θ) − g_i^Tδ − ½\,δ^T H_i w\Bigr],
    \qquad δ = θ' − θ,\quad w = θ' + θ − 2θ̂,

and whose data-free part also holds the closed-form full-data sum of the expansions,
``(Gᵀδ + ½ δᵀ H w)/K`` (:class:`~pymc_minibatch_mh.core.control_variate.TaylorReference`).
Every core test then runs unchanged on ``Δ* = closed form + c + (N/b) Σ_B r_i`` and on the
variance of the residuals.

How each part is computed:

- **θ̂, G and H**: the MAP (or the user's ``reference`` point) and one pass over the
  data at θ̂ (:class:`~pymc_minibatch_mh.estimators.reference.TaylorPasses`); O(d²) memory,
  never per row.
- **The per-row terms** ``g_iᵀδ`` and ``δᵀH_i w`` on the minibatch rows: forward-mode
  products at θ̂ (:func:`~pymc_minibatch_mh.model.compat.jvp`, twice for the
  second-order term), compiled into the same per-step function as the ratios. Measured
  on a logistic regression (d = 10, N = 10⁶, Numba): 27 µs per call at b = 100
  against 26 µs for the plain ratios, 265 against 211 µs at b = 1000; caching per-row
  gradients would need N·d floats and per-row Hessians N·d² (impossible at N = 10⁶,
  d = 50) for no gain.
- **Where PyTensor cannot differentiate twice** (an op whose gradient has no gradient,
  such as ``hyp2f1``'s in pymc-marketing's ParetoNBD): the curvature is central
  differences of the gradient along each coordinate at θ̂, the same in the full-data H
  and in the per-row terms (``2d`` calls of a compiled directional derivative per block
  of rows; :mod:`~pymc_minibatch_mh.estimators.differenced`), so Δ* stays unbiased; a
  ``UserWarning`` says so when the step is built
  (:attr:`TaylorEstimator.numerical_curvature`).

The rows evaluated while building the estimator (every pass of the MAP search and the
pass at θ̂) are counted in ``setup_evaluations``; the estimator
is built once, when the step is built, and shared by all chains, so it appears in no
chain's sample stats. When the data change (``pm.set_data``, or a changed ``data=``
store), :meth:`TaylorEstimator.follow_data` repeats that set-up on the new data (the step
calls it at the next chain start; see
:meth:`~pymc_minibatch_mh.transition.step_base.MinibatchStepBase.follow_data`).
Re-centring (optional, during tuning only, see :meth:`TaylorEstimator.maybe_recenter`)
makes one more pass, counted in the step's ``extra_evaluations`` stat and flagged in its
``recentered`` stat; a re-centring whose
pass fails (non-finite derivatives at the state) keeps θ̂, is counted in
:attr:`TaylorEstimator.recenter_failures` and warned about once per chain.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import pytensor
import pytensor.tensor as pt
from numpy.typing import NDArray
from pytensor.graph.traversal import graph_inputs

from pymc_minibatch_mh.core.control_variate import (
    TaylorReference,
    expansion_difference,
    second_order,
)
from pymc_minibatch_mh.errors import ControlVariateError, ModelNotSupportedError
from pymc_minibatch_mh.estimators.differenced import (
    NO_DERIVATIVE,
    DifferencedPasses,
    DifferencedResiduals,
    difference_steps,
    missing_derivative,
    numerical_curvature_message,
)
from pymc_minibatch_mh.estimators.ratio import PrefetchPolicy, RatioEstimator
from pymc_minibatch_mh.estimators.reference import MAP_TOLERANCE, TaylorPasses
from pymc_minibatch_mh.model.compat import jvp
from pymc_minibatch_mh.model.graph import checks_as_ninf, clone_replace
from pymc_minibatch_mh.model.internals import direct_call
from pymc_minibatch_mh.model.likelihood import MinibatchLikelihood

__all__ = ["MAP_TOLERANCE", "SETUP_START_FIX", "TaylorEstimator"]

#: Where a user gives the start of the set-up's MAP search, said when it is not finite
#: there: ``pm.sample``'s ``initvals=`` reach the chains only, after the set-up.
SETUP_START_FIX = (
    "the control variates' MAP search starts at the model's initial point, before "
    "pm.sample's initvals= apply: give initval= to the model's variables, or "
    "initial_point={...} or reference={...} to the step"
)


class _NoSecondDerivative(Exception):
    """PyTensor cannot build the second derivative (wraps its exception)."""


class TaylorEstimator(RatioEstimator):
    r"""Δ* from second-order Taylor control variates: closed form plus residuals.

    Parameters
    ----------
    likelihood : MinibatchLikelihood
        The step's compiled likelihood (its graphs and row store are reused).
    policy : PrefetchPolicy
        Size of the first block of a step (see
        :class:`~pymc_minibatch_mh.estimators.ratio.RatioEstimator`).
    reference : dict, optional
        The reference point θ̂ as a point dict: a value for every sampled variable, by
        value-variable name (transformed, e.g. ``sigma_log__``) or by variable name (then
        transformed here), such as what ``pm.find_MAP()`` returns. Default: the MAP of
        the full-data posterior, found here.
    recenter : float, optional
        During tuning, move θ̂ to the current state when that state is farther than this
        from θ̂ in the Laplace metric, per dimension
        (:meth:`~pymc_minibatch_mh.core.control_variate.TaylorReference.distance`: about 1
        for a posterior draw), with one pass over the data. Never after tuning. Default:
        never.
    step_name : str
        Used in error messages.
    analysis : PredictorAnalysis, optional
        An affine decomposition of the per-row quantities
        (:func:`~pymc_minibatch_mh.estimators.predictor_analysis.select`). The expansion is
        then the same, but G and H are computed from the per-row derivatives in the
        quantities (:class:`~pymc_minibatch_mh.estimators.predictor_passes.PredictorPasses`:
        one Gram product per chunk) instead of d Hessian-vector products per chunk.
        Measured on a logistic regression with N = 10⁶, d = 100 (float32 design): 126 s
        per Hessian pass with the products.

    Raises
    ------
    ModelNotSupportedError
        If the likelihood depends on free variables the step does not sample (their
        changes would make G and H stale).
    ControlVariateError
        If the reference point is invalid (missing variables, wrong shapes, non-finite
        values, non-finite log-likelihood or derivatives there), or the MAP search did
        not converge.

    Notes
    -----
    The expansion is of the untempered log-likelihood; the temperature multiplies the
    residuals and the closed form alike, so the estimator works at every K (and under a
    :class:`~pymc_minibatch_mh.TemperatureSchedule`). Any θ̂ gives an unbiased estimator;
    a θ̂ near the posterior's bulk makes the residuals, hence the minibatches, small.

    References
    ----------
    .. [1] Bardenet, R., Doucet, A., Holmes, C. (2017). On Markov chain Monte Carlo
       methods for tall data. JMLR 18(47).
    .. [2] Cornish, R. et al. (2019). Scalable Metropolis-Hastings for exact Bayesian
       inference with large datasets. ICML 2019.

    """

    name: ClassVar[str] = "taylor"
    #: Whether a MAP search that misses :data:`MAP_TOLERANCE` is an error (see
    #: :meth:`~pymc_minibatch_mh.estimators.reference.TaylorPasses.find_map`).
    _strict_map: ClassVar[bool] = True

    __slots__ = ("analysis", "passes", "step_name", "recenter_threshold", "dim", "_theta",
                 "_gradient",
                 "_hessian", "recenterings", "recenter_failures", "_recenter_warned",
                 "map_evaluations", "setup_evaluations", "initial_reference", "reference",
                 "_data", "_reference_flat", "setups", "_steps", "numerical_curvature")

    def __init__(
        self,
        likelihood: MinibatchLikelihood,
        policy: PrefetchPolicy,
        *,
        reference: Mapping[str, Any] | None = None,
        recenter: float | None = None,
        step_name: str = "MinibatchBarker",
        analysis: Any = None,
    ) -> None:
        self.analysis = analysis
        if recenter is not None and not (
            isinstance(recenter, int | float) and not isinstance(recenter, bool)
            and math.isfinite(recenter) and recenter > 0
        ):
            raise ValueError(f"recenter must be a positive number or None, got {recenter!r}.")
        self.likelihood = likelihood
        self.step_name = step_name
        self.recenter_threshold = None if recenter is None else float(recenter)
        self._check_other_variables()
        self.passes = passes = self._make_passes()
        # The user's θ̂ (flat), or None: the MAP, searched at every set-up.
        self._reference_flat = None if reference is None else passes.reference_flat(reference)
        d = likelihood.point_map.size
        self.dim = d
        self._theta = pytensor.shared(np.zeros(d), name="cv_theta_hat")
        self._steps = pytensor.shared(np.ones(d), name="cv_difference_steps")
        #: Why the per-row curvature is computed by central differences of the per-row
        #: gradient (the missing derivative PyTensor reported), or None: symbolic.
        self.numerical_curvature: str | None = None
        self._make_sums(d)
        super().__init__(likelihood, policy, self._compile_delta(likelihood.graphs))
        if self.numerical_curvature is not None:
            self.passes = DifferencedPasses(likelihood, step_name)
            warnings.warn(numerical_curvature_message(step_name, self.numerical_curvature, d),
                          UserWarning, stacklevel=4)
        #: Re-centrings since the estimator was built, over all chains of this process.
        self.recenterings = 0
        #: Re-centrings whose pass failed (θ̂ kept), over all chains of this process.
        self.recenter_failures = 0
        self._recenter_warned = False
        #: Set-ups made on the data as they were (1: the one at build; one more per change
        #: of the data followed, see :meth:`follow_data`).
        self.setups = 0
        self._set_up()

    def _set_up(self) -> None:
        """θ̂ and the full-data sums at θ̂ on the current data, and the data's snapshot.

        θ̂ is the MAP (searched from the initial point) or the user's reference.
        """
        passes, likelihood = self.passes, self.likelihood
        before = passes.evaluations
        x0 = likelihood.point_map.to_flat(likelihood.initial_point)
        try:
            if self._reference_flat is None:
                ref = passes.find_map(x0, strict=self._strict_map)
            else:
                ref = passes.reference_at(self._reference_flat, what="reference point")
        except ControlVariateError:
            # The set-up's passes replace the chains' start checks (a tuned chain starts at
            # θ̂): a failed set-up names the non-finite rows, if any, at the point it
            # started from (one pass, made only on failure).
            start = x0 if self._reference_flat is None else self._reference_flat
            likelihood.check_point(
                likelihood.point_map.to_point(start, likelihood.initial_point),
                fix=SETUP_START_FIX if self._reference_flat is None else "reference={...}")
            raise
        #: Rows evaluated by the MAP search of the last set-up, its last pass being the pass
        #: at θ̂ (0 with a user reference).
        self.map_evaluations = passes.evaluations - before if self._reference_flat is None else 0
        #: Rows evaluated by the last set-up (MAP search and the pass at θ̂), on its data.
        self.setup_evaluations = passes.evaluations - before
        #: The reference of the last set-up; each chain starts from it.
        self.initial_reference: TaylorReference = ref
        self.reference: TaylorReference = ref
        if self.recenter_threshold is not None:
            try:
                ref.laplace_covariance()
            except ValueError as err:
                raise ControlVariateError(
                    f"recenter= needs the Laplace metric at the reference point: {err}"
                ) from None
        self._set_reference(ref)
        self._data = self.store.snapshot()
        self.setups += 1

    def follow_data(self) -> bool:
        """Repeat the set-up if the data changed since the last one (call at a chain start).

        The row store must have read the current data (``likelihood.n_rows()``) before. The
        MAP search (or the pass at the user's reference), G and H are computed again on the
        new data, and whatever else of the estimator depends on the data (``_rebuild``);
        re-centrings of earlier chains are forgotten. Unchanged data: nothing is done.

        Returns
        -------
        bool
            Whether the set-up was repeated.

        Raises
        ------
        ControlVariateError
            As when the step is built: a MAP search that does not converge on the new data,
            or non-finite derivatives at the reference point.

        """
        if not self.store.changed_since(self._data):
            return False
        self._rebuild()
        self._set_up()
        return True

    def _rebuild(self) -> None:
        """Rebuild what depends on the data besides θ̂, G and H (a hook; here: nothing).

        The per-step function reads θ̂, G and H from shared variables and the rows as
        inputs, so it holds nothing of the old data.
        """

    def _make_passes(self) -> TaylorPasses:
        """The full-data passes (MAP search, sums at θ̂) of this expansion.

        With an affine decomposition, the passes in the per-row quantities; where their
        second derivative has no symbolic form, the θ-space passes (the per-step function
        then finds the same missing derivative and switches both to differences).
        """
        if self.analysis is not None:
            from pymc_minibatch_mh.estimators.predictor_passes import PredictorPasses

            try:
                return PredictorPasses(self.likelihood, self.step_name, self.analysis)
            except NO_DERIVATIVE:
                pass
        return TaylorPasses(self.likelihood, self.step_name)

    def _make_sums(self, d: int) -> None:
        """The shared variables of the full-data sums at θ̂ that ``_compile_delta`` reads."""
        self._gradient = pytensor.shared(np.zeros(d), name="cv_gradient")
        self._hessian = pytensor.shared(np.zeros((d, d)), name="cv_hessian")

    @property
    def map_decrement(self) -> float:
        """Newton decrement at θ̂ the step found: its distance to the mode in posterior sds.

        NaN with a user reference; up to
        :data:`~pymc_minibatch_mh.estimators.reference.REFERENCE_DECREMENT` when θ̂ was
        found from a subsample's mode.
        """
        return self.passes.map_decrement

    @property
    def map_converged(self) -> bool:
        """Whether θ̂ is the mode to the tolerance (False with a user reference)."""
        return bool(self.passes.map_converged)

    # ------------------------------------------------------------------ graphs
    def _check_other_variables(self) -> None:
        lik = self.likelihood
        inputs = set(graph_inputs([lik.graphs.row_loglik]))
        used = sorted(name for name, shared in lik.other_shared.items() if shared in inputs)
        if used:
            sampled = [e.name for e in lik.point_map.entries]
            raise ModelNotSupportedError(
                f"control_variate='taylor' expands the likelihood in the variables this "
                f"{self.step_name} samples ({sampled}), but the likelihood also depends on "
                f"{used}, which other step methods change: the full-data sums of the "
                "expansion would go stale at each of their moves and Δ* would be biased. "
                f"Sample those variables with this {self.step_name} too (vars=None or "
                "include them), or use control_variate=None for this step."
            )

    def _compile_delta(self, graphs: Any) -> Any:
        """The per-row function with residuals (the estimator's ``fn`` contract).

        Derived from the per-row likelihood and the data-free part (``compile``'s
        ``derive``): a second process loads it without differentiating again. The per-row
        curvature is the symbolic second derivative; where PyTensor has none (an op whose
        gradient has no gradient, such as ``hyp2f1``'s), central differences of the
        per-row gradient
        (:class:`~pymc_minibatch_mh.estimators.differenced.DifferencedResiduals`), and
        :attr:`numerical_curvature` says why.
        """
        x_cur, x_prop, inv_t = graphs.x_cur, graphs.x_prop, graphs.inv_temperature
        t = pt.vector("t", dtype="float64")
        u = pt.vector("u", dtype="float64")
        v = pt.vector("v", dtype="float64")

        def at_free_point() -> Any:
            """The per-row log-likelihood at the free point ``t``."""
            (row_loglik,) = checks_as_ninf([graphs.row_loglik])
            return clone_replace(row_loglik, {graphs.flat: t})

        def directional() -> Any:
            """``g_iᵀu`` at the free point ``t``: a graph of ``t`` and ``u``."""
            return jvp(at_free_point(), t, u)

        def derive(numerical: bool) -> tuple[list[Any], list[Any]]:
            # Directional derivatives at the free point t, in free directions u and v; θ̂,
            # δ and w are substituted afterwards (w depends on θ̂, so the derivatives must
            # not see that dependence).
            at_t = at_free_point()
            first = jvp(at_t, t, u)  # g_iᵀ u
            delta = x_prop - x_cur
            w = x_prop + x_cur - 2.0 * self._theta
            slope = clone_replace(first, {t: self._theta, u: delta})
            data_free = graphs.prior_delta + expansion_difference(
                self._gradient, self._hessian, self._theta, x_cur, x_prop, dot=pt.dot
            ) * inv_t
            if numerical:  # the curvature term is added by DifferencedResiduals
                return inputs, [graphs.ratios, slope, data_free]
            try:
                second = jvp(jvp(at_t, t, v), t, u)  # uᵀ H_i v
            except NO_DERIVATIVE as err:
                raise _NoSecondDerivative(err) from err
            curvature = clone_replace(second, {t: self._theta, u: delta, v: w})
            return inputs, [graphs.ratios - second_order(slope, curvature) * inv_t, data_free]

        inputs = [x_cur, x_prop, inv_t, *graphs.data]
        source = [graphs.row_loglik, graphs.ratios, graphs.prior_delta,
                  self._theta, self._gradient, self._hessian]
        compile_ = self.likelihood.compile
        try:
            fn = compile_([graphs.flat, *inputs], source, recipe="TaylorEstimator._compile_delta",
                          derive=functools.partial(derive, False))
        except _NoSecondDerivative as missing:
            self.numerical_curvature = missing_derivative(missing.args[0])
        else:
            return direct_call(fn)
        # The ratios and first-order terms, and the directional derivatives in two
        # directions at a point, each compiled once (small graphs: compiled fast, and in
        # Numba where the model's ops allow).
        first_order = compile_([graphs.flat, *inputs], source,
                               recipe="TaylorEstimator._compile_delta.first_order",
                               derive=functools.partial(derive, True))

        def derive_directions() -> tuple[list[Any], list[Any]]:
            first = directional()
            return [t, u, v, *graphs.data], [first, clone_replace(first, {u: v})]

        directions = compile_([graphs.flat, *graphs.data], [graphs.row_loglik],
                              recipe="TaylorEstimator._compile_delta.directions",
                              derive=derive_directions)
        return DifferencedResiduals(direct_call(first_order), direct_call(directions),
                                    self._theta, self._steps)

    # ---------------------------------------------------------------- per chain
    def _set_reference(self, ref: TaylorReference) -> None:
        self.reference = ref
        self._theta.set_value(np.array(ref.theta), borrow=False)
        self._steps.set_value(difference_steps(ref.theta), borrow=False)
        self._gradient.set_value(np.array(ref.gradient), borrow=False)
        self._hessian.set_value(np.array(ref.hessian), borrow=False)

    def start_chain(self, rng: np.random.Generator, batch_size: int) -> None:
        """Start a chain from the reference of the last set-up; refuse data it does not fit.

        Raises
        ------
        ControlVariateError
            If the observed data or covariates changed since the last set-up and
            :meth:`follow_data` was not called (a step calls it at each chain start).

        """
        super().start_chain(rng, batch_size)
        changed = self.store.changed_since(self._data)
        if changed:
            raise ControlVariateError(
                f"The data {changed[0]!r} changed since the control variates' set-up "
                "(pm.set_data, or the array given with data=): their full-data sums belong "
                "to the old data. Call follow_data() before start_chain() (a step does it at "
                "every chain start)."
            )
        if self.reference is not self.initial_reference:
            self._set_reference(self.initial_reference)
        self._recenter_warned = False

    def maybe_recenter(self, x: NDArray[np.float64]) -> int:
        """Re-centre at ``x`` if it is far from θ̂ (call during tuning only).

        Parameters
        ----------
        x : numpy.ndarray
            The chain's current state (flat).

        Returns
        -------
        int
            Rows evaluated (N if it tried to re-centre, else 0).

        Notes
        -----
        Moving θ̂ changes the transition kernel according to the chain's path, which
        breaks detailed balance for the chain as a whole; during tuning that does not
        matter (those draws are discarded and the kernel is fixed from the end of tuning
        on), afterwards it would. The step methods therefore call this during tuning
        only. Each chain starts from the reference of the last set-up, so results do
        not depend on how chains are distributed over processes.

        A re-centring whose pass fails (the log-likelihood or its derivatives are not
        finite at ``x``) keeps θ̂: Δ* stays unbiased, only the minibatches may stay
        larger. It is counted in :attr:`recenter_failures` and warned about (a
        ``UserWarning``) once per chain.

        """
        threshold = self.recenter_threshold
        if threshold is None:
            return 0
        distance = self.reference.distance(x)
        if not distance > threshold:
            return 0
        try:
            ref = self.passes.reference_at(np.array(x, dtype=np.float64), what="re-centring point")
        except ControlVariateError as err:
            # Evaluated, but not usable: keep the old reference, and say so.
            self.recenter_failures += 1
            if not self._recenter_warned:
                self._recenter_warned = True
                warnings.warn(
                    f"{self.step_name}: re-centring the control variates failed, so the "
                    f"reference point was kept (Δ* stays unbiased; minibatches may stay "
                    f"larger): {err} Further failures in this chain are counted in the "
                    "estimator's recenter_failures, not warned about. If this repeats, give "
                    "a larger recenter= or a reference= nearer the posterior's bulk.",
                    UserWarning, stacklevel=2,
                )
            return self.store.n_rows
        self._set_reference(ref)
        self.recenterings += 1
        return self.store.n_rows

    def proxy_value(self, x: NDArray[np.float64]) -> float:
        """The full-data sum of the expansions at ``x``, less its value at θ̂ (untempered)."""
        return self.reference.proxy_value(x)

    def proxy_graph(self, flat: Any) -> Any:
        """:meth:`proxy_value` as a PyTensor graph of the flat state ``flat`` (shared θ̂)."""
        return expansion_difference(
            self._gradient, self._hessian, self._theta, self._theta, flat, dot=pt.dot
        )

    def proxy_gradient(self, x: NDArray[np.float64]) -> NDArray[np.float64]:
        """Gradient of the full-data sum of the expansions at ``x``: ``G + H(x − θ̂)``.

        Untempered and data-free (O(d²)): with the prior's exact gradient it is the
        gradient of the surrogate posterior that surrogate-guided proposals follow.
        """
        return self.reference.proxy_gradient(x)

    def centring(self, temperature: float) -> tuple[NDArray[np.int64], Any] | None:
        """Group effects to sample centred on the surrogate: none in θ space.

        The expansion in the per-row quantities, which knows the groups, overrides it
        (:meth:`PredictorTaylorEstimator.centring
        <pymc_minibatch_mh.estimators.predictor_taylor.PredictorTaylorEstimator.centring>`).
        """
        return None

    # ---------------------------------------------------------------- reporting
    def reference_point(self) -> dict[str, NDArray[np.float64]]:
        """θ̂ as a point dict of the sampled (value) variables."""
        return self.likelihood.point_map.to_point(np.array(self.reference.theta), {})

    def laplace_covariance(self, temperature: float = 1.0) -> NDArray[np.float64]:
        """Covariance of the Laplace approximation at θ̂ on the flat space (see ``S=``).

        Parameters
        ----------
        temperature : float
            K; the likelihood's Hessian is divided by K.

        Returns
        -------
        numpy.ndarray
            Shape ``(d, d)``: a good proposal covariance, times ``2.38²/d``.

        """
        return self.reference.laplace_covariance(temperature)
