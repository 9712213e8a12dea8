"""Which Δ* estimator a step runs: the ``control_variate=`` setting made into an object.

- ``None``: the plain ratios (:class:`~pymc_minibatch_mh.estimators.ratio.RatioEstimator`);
- ``"taylor"``: second-order Taylor control variates, in the per-row quantities
  (:mod:`~pymc_minibatch_mh.estimators.predictor_taylor`) when they decompose and are not
  affine in θ, else in θ (:mod:`~pymc_minibatch_mh.estimators.taylor`);
- ``"taylor_theta"`` and ``"taylor_predictor"`` force one of the two.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from pymc_minibatch_mh.estimators.predictor_analysis import select
from pymc_minibatch_mh.estimators.predictor_taylor import PredictorTaylorEstimator
from pymc_minibatch_mh.estimators.ratio import PrefetchPolicy, RatioEstimator
from pymc_minibatch_mh.estimators.taylor import TaylorEstimator
from pymc_minibatch_mh.model.likelihood import MinibatchLikelihood

__all__ = ["CONTROL_VARIATES", "make_estimator"]

#: The control variates a step method accepts (``control_variate=...``): ``"taylor"``
#: chooses between the expansion in the per-row quantities (``"taylor_predictor"``,
#: :mod:`~pymc_minibatch_mh.estimators.predictor_taylor`) and the θ-space expansion
#: (``"taylor_theta"``, :class:`~pymc_minibatch_mh.estimators.taylor.TaylorEstimator`); the other
#: two force one.
CONTROL_VARIATES: tuple[str, ...] = ("taylor", "taylor_theta", "taylor_predictor")


def make_estimator(
    kind: str | None,
    likelihood: MinibatchLikelihood,
    policy: PrefetchPolicy,
    *,
    reference: Mapping[str, Any] | None = None,
    recenter: float | None = None,
    step_name: str = "MinibatchBarker",
    supported: bool = True,
) -> RatioEstimator:
    """Build the Δ* estimator a step method was asked for.

    Parameters
    ----------
    kind : {"taylor", "taylor_theta", "taylor_predictor", None}
        The ``control_variate`` setting of the step. ``"taylor"`` uses the expansion in
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
    supported : bool
        False for step methods where control variates do not apply (``ExactMH``).

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
    if kind is None:
        if reference is not None or recenter is not None:
            raise ValueError(
                "reference= and recenter= are settings of the control variates; they need "
                "control_variate='taylor' (they were given with control_variate=None)."
            )
        return RatioEstimator(likelihood, policy)
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
