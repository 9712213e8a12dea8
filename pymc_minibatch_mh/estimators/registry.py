"""Which Δ* estimator a step runs: the ``control_variate=`` setting made into an object.

- ``"auto"`` (``MinibatchBarker``'s default): ``"taylor"`` where control variates apply,
  else the plain ratios with a warning that says why (:func:`make_estimator`);
- ``None``: the plain ratios (:class:`~pymc_minibatch_mh.estimators.ratio.RatioEstimator`);
- ``"taylor"``: second-order Taylor control variates, in the per-row quantities
  (:mod:`~pymc_minibatch_mh.estimators.predictor_taylor`) when they decompose and are not
  affine in θ, else in θ (:mod:`~pymc_minibatch_mh.estimators.taylor`);
- ``"taylor_theta"`` and ``"taylor_predictor"`` force one of the two.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping
from typing import Any

from pymc_minibatch_mh.errors import ControlVariateError, ModelNotSupportedError, StartPointError
from pymc_minibatch_mh.estimators.predictor_analysis import select
from pymc_minibatch_mh.estimators.predictor_taylor import PredictorTaylorEstimator
from pymc_minibatch_mh.estimators.ratio import PrefetchPolicy, RatioEstimator
from pymc_minibatch_mh.estimators.taylor import TaylorEstimator
from pymc_minibatch_mh.model.likelihood import MinibatchLikelihood

__all__ = ["CONTROL_VARIATES", "CONTROL_VARIATE_SETTINGS", "make_estimator"]

#: The control variates a step method accepts (``control_variate=...``): ``"taylor"``
#: chooses between the expansion in the per-row quantities (``"taylor_predictor"``,
#: :mod:`~pymc_minibatch_mh.estimators.predictor_taylor`) and the θ-space expansion
#: (``"taylor_theta"``, :class:`~pymc_minibatch_mh.estimators.taylor.TaylorEstimator`); the other
#: two force one.
CONTROL_VARIATES: tuple[str, ...] = ("taylor", "taylor_theta", "taylor_predictor")

#: Every value ``control_variate=`` accepts besides None: ``"auto"`` and the control variates.
CONTROL_VARIATE_SETTINGS: tuple[str, ...] = ("auto", *CONTROL_VARIATES)


def make_estimator(
    kind: str | None,
    likelihood: MinibatchLikelihood,
    policy: PrefetchPolicy,
    *,
    reference: Mapping[str, Any] | None = None,
    recenter: float | None = None,
    step_name: str = "MinibatchBarker",
    tempered_schedule: bool = False,
    temperature: float = 1.0,
) -> RatioEstimator:
    """Build the Δ* estimator a step method was asked for.

    Parameters
    ----------
    kind : {"auto", "taylor", "taylor_theta", "taylor_predictor", None}
        The ``control_variate`` setting of the step. ``"auto"`` is ``"taylor"`` where
        control variates apply; where they do not (no smooth mode to expand around, other
        step methods' variables in the likelihood, a
        temperature schedule) it is None, with a warning at temperature 1 that says why.
        ``"taylor"`` uses the expansion in
        the per-row quantities when every observed variable's parameters decompose into
        data features times functions of θ and some of those functions are not affine
        in θ (:func:`~pymc_minibatch_mh.estimators.predictor_analysis.select`; with affine
        ones both expansions are the same), the θ-space expansion otherwise; the
        estimator's ``name`` says which (``"taylor_predictor"`` or ``"taylor"``).
    likelihood : MinibatchLikelihood
        The step's compiled likelihood.
    policy : PrefetchPolicy
        The step's prefetch policy.
    reference : dict, optional
        The step's ``reference`` setting (see
        :class:`~pymc_minibatch_mh.estimators.taylor.TaylorEstimator`).
    recenter : float, optional
        The step's ``recenter`` setting (see
        :class:`~pymc_minibatch_mh.estimators.taylor.TaylorEstimator`).
    step_name : str
        Used in error messages.
    tempered_schedule : bool
        Whether the step follows a temperature schedule (``"auto"`` is then None: the
        expansion is made at one temperature).
    temperature : float
        The step's temperature (``"auto"`` warns at 1 when it falls back to None).

    Returns
    -------
    RatioEstimator
        The plain ratios when ``kind`` is None, else
        :class:`~pymc_minibatch_mh.estimators.taylor.TaylorEstimator` (or its subclass
        :class:`~pymc_minibatch_mh.estimators.predictor_taylor.PredictorTaylorEstimator`).

    Raises
    ------
    ValueError
        For an unknown ``kind``, or ``reference``/``recenter`` without a control variate,
        or a step method that does not support control variates.

    """
    if kind == "auto":
        return _auto_estimator(likelihood, policy, reference=reference, recenter=recenter,
                               step_name=step_name,
                               tempered_schedule=tempered_schedule, temperature=temperature)
    if kind is None:
        if reference is not None or recenter is not None:
            raise ValueError(
                "reference= and recenter= are settings of the control variates; they need "
                "control_variate='taylor' (they were given with control_variate=None)."
            )
        return RatioEstimator(likelihood, policy)
    if kind not in CONTROL_VARIATES:
        raise ValueError(
            f"control_variate must be one of {CONTROL_VARIATE_SETTINGS} or None, got {kind!r}."
        )
    analysis, per_row = None, kind == "taylor_predictor"
    if kind == "taylor":
        analysis, reason = select(likelihood)
        per_row = analysis is not None and not analysis.is_affine()
        logging.getLogger("pymc_minibatch_mh").info(
            "%s: control_variate='taylor' uses the %s expansion (%s).", step_name,
            "per-row-quantity" if per_row else "θ-space", reason,
        )
    if per_row:
        return PredictorTaylorEstimator(
            likelihood, policy, analysis=analysis, reference=reference, recenter=recenter,
            step_name=step_name,
        )
    return TaylorEstimator(
        likelihood, policy, reference=reference, recenter=recenter, step_name=step_name,
        analysis=analysis,
    )


def _auto_estimator(
    likelihood: MinibatchLikelihood,
    policy: PrefetchPolicy,
    *,
    reference: Mapping[str, Any] | None,
    recenter: float | None,
    step_name: str,
    tempered_schedule: bool,
    temperature: float,
) -> RatioEstimator:
    """``control_variate="auto"``: Taylor control variates where they apply, else plain ratios.

    They do not apply with a temperature schedule (the expansion is made at one
    temperature), nor where
    building them is refused (:class:`~pymc_minibatch_mh.errors.ControlVariateError`: no
    smooth mode or curvature; :class:`~pymc_minibatch_mh.errors.ModelNotSupportedError`:
    other step methods' variables in the likelihood). In the last case the plain ratios
    run, and at temperature 1 a warning says what was refused and what it costs. A
    non-finite log-probability at the start point
    (:class:`~pymc_minibatch_mh.errors.StartPointError`) is raised as it is: no estimator
    can start there.
    """
    if tempered_schedule:
        return make_estimator(None, likelihood, policy, reference=reference, recenter=recenter,
                              step_name=step_name)
    try:
        return make_estimator("taylor", likelihood, policy, reference=reference,
                              recenter=recenter, step_name=step_name)
    except (ControlVariateError, ModelNotSupportedError) as err:
        # A start point or data fault is the user's to fix whatever the estimator.
        if reference is not None or recenter is not None or isinstance(err, StartPointError):
            raise
        if temperature == 1.0:
            warnings.warn(
                f"{step_name}: control variates do not apply to this model ({err}), so the "
                "acceptance test estimates the whole log-likelihood ratio from minibatches. "
                "At temperature 1 that needs most of the rows at every step unless the "
                "proposal's moves are much smaller than the posterior's spread: check the "
                "'batch_size' sample stat and R-hat, or sample this model with NUTS "
                "(pm.sample() without step=). Pass control_variate=None to choose the plain "
                "test without this warning.",
                UserWarning, stacklevel=4,
            )
        return make_estimator(None, likelihood, policy, step_name=step_name)
