r"""Taylor control variates on a PyMC model: the estimator of Δ* with residuals.

:class:`TaylorControlVariate` replaces the step's per-block function (the source's
``delta_fn``, see :mod:`~pymc_minibatch_mh.adapter.source`) by one with the same
signature, ``(x_cur, x_prop, rows, inv_temperature) -> (r, cumsum(r − r₀),
cumsum((r − r₀)²), data_free)``, whose per-row values are the tempered *residuals*

.. math::

    r_i = \frac1K\Bigl[ℓ_i(θ') − ℓ_i(θ) − g_i^Tδ − ½\,δ^T H_i w\Bigr],
    \qquad δ = θ' − θ,\quad w = θ' + θ − 2θ̂,

and whose data-free part also holds the closed-form full-data sum of the expansions,
``(Gᵀδ + ½ δᵀ H w)/K`` (:class:`~pymc_minibatch_mh.core.control_variate.TaylorReference`).
Every core test then runs unchanged on ``Δ* = closed form + c + (N/b) Σ_B r_i`` and on the
variance of the residuals.

How each part is computed:

- **θ̂**: the mode of the full-data log posterior over the sampled variables (flat,
  transformed space; the other free variables held at the initial point), found with
  SciPy's L-BFGS-B on the compiled full-data log posterior and its gradient, then
  polished by Newton steps until the Newton decrement (the distance to the mode in
  posterior standard deviations) is below ``MAP_TOLERANCE``; or the user's
  ``reference`` point.
- **G and H**: one pass over the data at θ̂ in chunks of rows (gradient and Hessian of
  the chunk's summed log-likelihood, with PyTensor); O(d²) memory, never per row.
- **The per-row terms** ``g_iᵀδ`` and ``δᵀH_i w`` on the minibatch rows: forward-mode
  products at θ̂ (:func:`~pymc_minibatch_mh.adapter.compat.jvp`, twice for the
  second-order term), compiled into the same per-step function as the ratios. Measured
  on a logistic regression (d = 10, N = 10⁶, Numba): 27 µs per call at b = 100
  against 26 µs for the plain ratios, 265 against 211 µs at b = 1000; caching per-row
  gradients would need N·d floats and per-row Hessians N·d² (impossible at N = 10⁶,
  d = 50) for no gain.

The rows evaluated while building the estimator (every pass of the MAP search and the
pass at θ̂) are counted in :attr:`TaylorControlVariate.setup_evaluations`; the estimator
is built once, when the step is built, and shared by all chains, so it appears in no
chain's sample stats. Re-centring (optional, during tuning only, see
:meth:`TaylorControlVariate.maybe_recenter`) makes one more pass, counted in the step's
``extra_evaluations`` stat and flagged in its ``recentered`` stat.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytensor
import pytensor.tensor as pt
from numpy.typing import NDArray
from pytensor.gradient import grad
from pytensor.graph.traversal import graph_inputs
from scipy import optimize

from pymc_minibatch_mh.adapter.compat import direct_call, jvp
from pymc_minibatch_mh.adapter.likelihood import (
    FULL_PASS_CHUNK,
    MinibatchLikelihood,
    ModelNotSupportedError,
    _checks_as_ninf,
    clone_replace,
)
from pymc_minibatch_mh.adapter.proposal import RandomWalkProposal
from pymc_minibatch_mh.core.control_variate import TaylorReference, newton_decrement

__all__ = [
    "CONTROL_VARIATES",
    "MAP_TOLERANCE",
    "ControlVariateError",
    "TaylorControlVariate",
    "laplace_proposal",
    "make_control_variate",
]

#: The control variates a step method accepts (``control_variate=...``).
CONTROL_VARIATES: tuple[str, ...] = ("taylor",)

#: Largest Newton decrement (≈ distance to the mode in posterior standard deviations)
#: accepted for the MAP found by the package.
MAP_TOLERANCE: float = 1e-3

# PyTensor mode of the full-data passes (MAP search and G, H). PyTensor's C backend ran
# them 1–3 × faster than Numba on chunks of 2^18 rows (logistic regression, d = 10).
_FULL_PASS_MODE = "FAST_RUN"


class ControlVariateError(ValueError):
    """The control variates cannot be built; the message says why and what to do."""


def make_control_variate(
    kind: str | None,
    likelihood: MinibatchLikelihood,
    *,
    reference: Mapping[str, Any] | None = None,
    recenter: float | None = None,
    step_name: str = "MinibatchBarker",
    supported: bool = True,
) -> TaylorControlVariate | None:
    """Build the control variate a step method was asked for (or None).

    Parameters
    ----------
    kind : {"taylor", None}
        The ``control_variate`` setting of the step.
    likelihood : MinibatchLikelihood
        The step's compiled likelihood.
    reference : dict, optional
        The step's ``reference`` setting (see :class:`TaylorControlVariate`).
    recenter : float, optional
        The step's ``recenter`` setting (see :class:`TaylorControlVariate`).
    step_name : str
        Used in error messages.
    supported : bool
        False for step methods where control variates do not apply (``ExactMH``).

    Returns
    -------
    TaylorControlVariate or None
        None when ``kind`` is None.

    Raises
    ------
    ValueError
        For an unknown ``kind``, or ``reference``/``recenter`` without a control variate,
        or a step method that does not support control variates.

    """
    if kind is None:
        if reference is not None or recenter is not None:
            raise ValueError(
                "reference= and recenter= are settings of the control variates; they need "
                "control_variate='taylor' (they were given with control_variate=None)."
            )
        return None
    if kind not in CONTROL_VARIATES:
        raise ValueError(
            f"control_variate must be one of {CONTROL_VARIATES} or None, got {kind!r}."
        )
    if not supported:
        raise ValueError(
            f"{step_name} evaluates every row at every step, so control variates cannot "
            "save anything there (Δ is the same, up to rounding). Remove "
            "control_variate=..., or use MinibatchBarker(control_variate='taylor')."
        )
    return TaylorControlVariate(
        likelihood, reference=reference, recenter=recenter, step_name=step_name
    )


def laplace_proposal(
    control_variate: TaylorControlVariate | None, temperature: float = 1.0
) -> RandomWalkProposal:
    """The random-walk proposal with the Laplace covariance at θ̂ (``S="laplace"``).

    Parameters
    ----------
    control_variate : TaylorControlVariate or None
        The step's control variate (None raises).
    temperature : float
        K; the likelihood's curvature is divided by K.

    Returns
    -------
    RandomWalkProposal
        Gaussian increments with covariance ``(−H/K − H_prior)⁻¹`` (before ``scaling``).

    Raises
    ------
    ValueError
        Without control variates, or when the Laplace covariance does not exist.

    """
    if control_variate is None:
        raise ValueError(
            "S='laplace' uses the curvature at the control variates' reference point: it "
            "needs control_variate='taylor'. Give S as standard deviations or a covariance "
            "matrix otherwise."
        )
    cov = control_variate.laplace_covariance(temperature)
    return RandomWalkProposal(cov, cov.shape[0])


class TaylorControlVariate:
    r"""Second-order Taylor control variates for a step's estimate of Δ.

    Parameters
    ----------
    likelihood : MinibatchLikelihood
        The step's compiled likelihood (its graphs are reused).
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

    def __init__(
        self,
        likelihood: MinibatchLikelihood,
        *,
        reference: Mapping[str, Any] | None = None,
        recenter: float | None = None,
        step_name: str = "MinibatchBarker",
    ) -> None:
        self.likelihood = likelihood
        self.step_name = step_name
        if recenter is not None and not (
            isinstance(recenter, int | float) and not isinstance(recenter, bool)
            and math.isfinite(recenter) and recenter > 0
        ):
            raise ValueError(f"recenter must be a positive number or None, got {recenter!r}.")
        self.recenter_threshold = None if recenter is None else float(recenter)
        self._check_other_variables()
        x_ref = None if reference is None else self._reference_flat(reference)
        graphs = likelihood.graphs
        d = likelihood.point_map.size
        self.dim = d
        self._theta = pytensor.shared(np.zeros(d), name="cv_theta_hat")
        self._gradient = pytensor.shared(np.zeros(d), name="cv_gradient")
        self._hessian = pytensor.shared(np.zeros((d, d)), name="cv_hessian")
        self._compile_full_pass(graphs)
        self.delta_fn = self._compile_delta(graphs)

        #: Rows evaluated by full passes since the estimator was built.
        self.evaluations = 0
        #: Re-centrings since the estimator was built, over all chains of this process.
        self.recenterings = 0
        self.map_decrement = math.nan
        if reference is None:
            x0 = likelihood.point_map.to_flat(likelihood.initial_point)
            ref = self._find_map(x0)
        else:
            ref = self._reference_at(x_ref, what="reference point")
        #: Rows evaluated by the MAP search, its last pass being the pass at θ̂ (0 with a
        #: user reference).
        self.map_evaluations = self.evaluations if reference is None else 0
        #: Rows evaluated while building the estimator (MAP search and the pass at θ̂).
        self.setup_evaluations = self.evaluations
        #: The reference built with the step; each chain starts from it.
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
        self._data = [(s, s.get_value(borrow=True)) for s in likelihood._row_data]

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

    def _compile_full_pass(self, graphs: Any) -> None:
        # The Hessians are assembled column by column from Hessian-vector products
        # (reverse over reverse): PyTensor's vectorised jacobian can send the graph
        # rewriter into a loop (seen with a Normal likelihood), its scan version compiles
        # slowly, and d products per chunk cost little next to the rest of the pass.
        flat, rows = graphs.flat, graphs.rows
        v = pt.vector("v", dtype="float64")
        (row_loglik,) = _checks_as_ninf([graphs.row_loglik])
        (prior,) = _checks_as_ninf([graphs.prior])
        total = pt.sum(row_loglik)
        g = grad(total, flat)
        hv = grad(pt.dot(g, v), flat)
        prior_g = grad(prior, flat, disconnected_inputs="ignore")
        prior_hv = grad(pt.dot(prior_g, v), flat, disconnected_inputs="ignore")

        def compile_fn(inputs: list[Any], outputs: Any) -> Any:
            fn = pytensor.function(
                inputs, outputs, mode=_FULL_PASS_MODE, on_unused_input="ignore"
            )
            fn.trust_input = True
            return fn

        self._value_grad_fn = compile_fn([flat, rows], [total, g])
        self._hvp_fn = compile_fn([flat, rows, v], hv)
        # No data in the prior: a quickly compiled function is fast enough.
        self._prior_all_fn = pytensor.function(
            [flat, v], [prior, prior_g, prior_hv], mode="FAST_COMPILE",
            on_unused_input="ignore",
        )

    def _prior_fn(
        self, x: NDArray[np.float64], hessian: bool = False
    ) -> tuple[float, NDArray[np.float64], NDArray[np.float64] | None]:
        """Log prior (with Jacobians and Potentials), its gradient and Hessian at ``x``."""
        eye = np.eye(self.dim)
        value, g, _ = self._prior_all_fn(x, eye[0])
        h = None
        if hessian:
            h = np.column_stack([self._prior_all_fn(x, eye[j])[2] for j in range(self.dim)])
        return float(value), np.asarray(g), h

    def _compile_delta(self, graphs: Any) -> Any:
        """The per-block function with residuals (the source's ``delta_fn`` contract)."""
        # Directional derivatives at a free point t, in free directions u and v; θ̂, δ and
        # w are substituted afterwards (w depends on θ̂, so the derivatives must not see
        # that dependence).
        t = pt.vector("t", dtype="float64")
        u = pt.vector("u", dtype="float64")
        v = pt.vector("v", dtype="float64")
        (row_loglik,) = _checks_as_ninf([graphs.row_loglik])
        at_t = clone_replace(row_loglik, {graphs.flat: t})
        first = jvp(at_t, t, u)  # g_iᵀ u
        second = jvp(jvp(at_t, t, v), t, u)  # uᵀ H_i v
        x_cur, x_prop, inv_t = graphs.x_cur, graphs.x_prop, graphs.inv_temperature
        delta = x_prop - x_cur
        w = x_prop + x_cur - 2.0 * self._theta
        first, second = clone_replace(
            [first, second], {t: self._theta, u: delta, v: w}, rebuild_strict=False
        )
        residuals = graphs.ratios - (first + 0.5 * second) * inv_t
        closed_form = (
            pt.dot(self._gradient, delta) + 0.5 * pt.dot(delta, pt.dot(self._hessian, w))
        ) * inv_t
        # Rows are read where the step's own function reads them (the chain's row order).
        outputs = _checks_as_ninf(
            self.likelihood.on_arranged_rows([residuals, graphs.prior_delta + closed_form])
        )
        fn = pytensor.function(
            [x_cur, x_prop, graphs.rows, inv_t],
            outputs,
            mode=self.likelihood.mode,
            on_unused_input="ignore",
        )
        fn.trust_input = True
        return direct_call(fn)

    # ------------------------------------------------------------- full passes
    def _n_rows(self) -> int:
        return self.likelihood.n_rows_initial

    def _full_pass(
        self, x: NDArray[np.float64], hessian: bool
    ) -> tuple[float, NDArray[np.float64], NDArray[np.float64] | None]:
        """Sum, gradient (and Hessian) of the log-likelihood over all rows, in chunks."""
        n = self._n_rows()
        d = self.dim
        total = 0.0
        g = np.zeros(d)
        h = np.zeros((d, d)) if hessian else None
        eye = np.eye(d)
        for start in range(0, n, FULL_PASS_CHUNK):
            rows = np.arange(start, min(n, start + FULL_PASS_CHUNK), dtype=np.int64)
            value, grad_value = self._value_grad_fn(x, rows)
            total += float(value)
            g += grad_value
            if h is not None:
                for j in range(d):
                    h[:, j] += self._hvp_fn(x, rows, eye[j])
        self.evaluations += n
        return total, g, h

    def _reference_at(self, x: NDArray[np.float64], what: str) -> TaylorReference:
        """G and H at ``x`` (one counted pass), checked finite."""
        loglik, g, h = self._full_pass(x, hessian=True)
        _, _, prior_h = self._prior_fn(x, hessian=True)
        if not (math.isfinite(loglik) and np.all(np.isfinite(g)) and np.all(np.isfinite(h))):
            raise ControlVariateError(
                f"The log-likelihood or its derivatives are not finite at the {what} "
                f"({self._describe(x)}): log-likelihood {loglik}. Give a reference= point "
                "where every observation has positive likelihood, or use "
                "control_variate=None."
            )
        prior_h = prior_h if np.all(np.isfinite(prior_h)) else None
        return TaylorReference(x.copy(), g, h, prior_h, loglik=loglik)

    def full_residuals(
        self,
        x_cur: NDArray[np.float64],
        x_prop: NDArray[np.float64],
        inv_temperature: NDArray[np.float64],
        n_rows: int,
    ) -> NDArray[np.float64]:
        """The tempered residuals of all N rows, in bounded-memory chunks.

        What a test that needs a full pass (AustereMH's adaptive design, MHSubLhd's range
        without a user bound) receives instead of the ratios when control variates are on.
        """
        out = np.empty(n_rows)
        for start in range(0, n_rows, FULL_PASS_CHUNK):
            stop = min(n_rows, start + FULL_PASS_CHUNK)
            rows = np.arange(start, stop, dtype=np.int64)
            out[start:stop] = self.delta_fn(x_cur, x_prop, rows, inv_temperature)[0]
        return out

    # ---------------------------------------------------------------- θ̂
    def _describe(self, x: NDArray[np.float64]) -> str:
        point = self.likelihood.point_map.to_point(x, {})
        return ", ".join(f"{k}={np.round(np.asarray(v), 4).tolist()}" for k, v in point.items())

    def _reference_flat(self, reference: Mapping[str, Any]) -> NDArray[np.float64]:
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
                    except Exception as err:  # noqa: BLE001 - re-raised with advice
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

    def _find_map(self, x0: NDArray[np.float64]) -> TaylorReference:
        """The mode of the full-data log posterior: L-BFGS-B, then Newton steps."""
        def negative_log_posterior(x: NDArray[np.float64]) -> tuple[float, Any]:
            loglik, g, _ = self._full_pass(x, hessian=False)
            prior, prior_g, _ = self._prior_fn(x)
            value = -(loglik + float(prior))
            if not math.isfinite(value):
                return math.inf, np.zeros_like(x)
            return value, -(g + prior_g)

        with np.errstate(all="ignore"):
            result = optimize.minimize(
                negative_log_posterior, x0, jac=True, method="L-BFGS-B",
                options={"maxiter": 1000},
            )
        x = np.asarray(result.x, dtype=np.float64)
        decrement = math.inf
        ref = None
        for _ in range(20):
            try:
                ref = self._reference_at(x, what="point the MAP search reached")
            except ControlVariateError:
                break
            _, prior_g, _ = self._prior_fn(x)
            g_post = ref.gradient + prior_g
            precision = ref.precision()
            decrement = newton_decrement(g_post, precision)
            if decrement <= MAP_TOLERANCE or not math.isfinite(decrement):
                break
            # A Newton step, halved until the log posterior does not decrease.
            step = np.linalg.solve(precision, g_post)
            current = ref.loglik + float(self._prior_fn(x)[0])
            for _ in range(30):
                trial = x + step
                value = -negative_log_posterior(trial)[0]
                if value >= current - 1e-10 * abs(current):
                    break
                step = step / 2.0
            x = trial
        if ref is None or not decrement <= MAP_TOLERANCE:
            raise ControlVariateError(
                "The MAP search for the control variates' reference point did not "
                f"converge (L-BFGS-B: {result.message!s}; Newton decrement "
                f"{decrement:.3g}, the distance to the mode in posterior standard "
                f"deviations, should be below {MAP_TOLERANCE}) at {self._describe(x)}. "
                "Pass reference={...} (e.g. from pm.find_MAP() with more iterations, or "
                "the posterior mean of a short run), or use control_variate=None."
            )
        self.map_decrement = decrement
        return ref

    # ---------------------------------------------------------------- per chain
    def _set_reference(self, ref: TaylorReference) -> None:
        self.reference = ref
        self._theta.set_value(np.array(ref.theta), borrow=False)
        self._gradient.set_value(np.array(ref.gradient), borrow=False)
        self._hessian.set_value(np.array(ref.hessian), borrow=False)

    def attach(self, source: Any) -> None:
        """Make a :class:`~pymc_minibatch_mh.adapter.source.PairSource` use the residuals."""
        source.delta_fn = self.delta_fn
        source.full_pass_fn = self.full_residuals

    def start_chain(self) -> None:
        """Start a chain from the reference built with the step; refuse changed data.

        Raises
        ------
        ControlVariateError
            If the observed data or covariates were replaced (``pm.set_data``) since the
            step was built: G and H belong to the old data.

        """
        for shared, value in self._data:
            now = shared.get_value(borrow=True)
            if now is value:
                continue
            if now.shape != value.shape or not np.array_equal(now, value):
                raise ControlVariateError(
                    f"The data {shared.name!r} changed since this {self.step_name} was "
                    "built (pm.set_data). The control variates' full-data sums belong to "
                    f"the old data: build the {self.step_name} again after changing data."
                )
        if self.reference is not self.initial_reference:
            self._set_reference(self.initial_reference)

    def maybe_recenter(self, x: NDArray[np.float64]) -> int:
        """Re-centre at ``x`` if it is far from θ̂ (call during tuning only).

        Parameters
        ----------
        x : numpy.ndarray
            The chain's current state (flat).

        Returns
        -------
        int
            Rows evaluated (N if it re-centred, else 0).

        Notes
        -----
        Moving θ̂ changes the transition kernel according to the chain's path, which
        breaks detailed balance for the chain as a whole; during tuning that does not
        matter (those draws are discarded and the kernel is fixed from the end of tuning
        on), afterwards it would. The step methods therefore call this during tuning
        only. Each chain starts from the reference built with the step, so results do
        not depend on how chains are distributed over processes.

        """
        threshold = self.recenter_threshold
        if threshold is None:
            return 0
        distance = self.reference.distance(x)
        if not distance > threshold:
            return 0
        try:
            ref = self._reference_at(np.array(x, dtype=np.float64), what="re-centring point")
        except ControlVariateError:
            return self._n_rows()  # evaluated, but not usable: keep the old reference
        self._set_reference(ref)
        self.recenterings += 1
        return self._n_rows()

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

