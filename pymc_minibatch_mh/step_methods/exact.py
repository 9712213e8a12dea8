"""``ExactMH``: full-data Metropolis or Barker tests, the reference for the minibatch tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from pymc_minibatch_mh.core.exact import ExactOutcome, exact_test
from pymc_minibatch_mh.estimators.ratio import RatioEstimator
from pymc_minibatch_mh.transition.step import MinibatchStep

__all__ = ["ExactMH"]


class ExactMH(MinibatchStep):
    r"""Random-walk Metropolis-Hastings with an exact test on all N observations.

    The same proposal, temperature, tuning and stats as the minibatch step methods, so
    that a comparison is like with like; every step evaluates all N rows
    (``batch_size = N``).

    Parameters
    ----------
    vars : list of Variable, optional
        Continuous variables to sample as one block (default: all free variables).
    test : {"metropolis", "barker"}, default "metropolis"
        Metropolis' acceptance ``min(1, e^Δ)`` or Barker's ``1/(1 + e^{−Δ})`` (the test
        that :class:`~pymc_minibatch_mh.MinibatchBarker` approximates).
    **kwargs
        ``temperature``, ``S``, ``scaling``, ``tune``, ``target_accept``, ``model``, ``rng``,
        ``initial_point``, ``mode``, ``check_start``: as for every step method
        (:class:`~pymc_minibatch_mh.transition.step.MinibatchStep`).

    Notes
    -----
    Test-specific sample stats: ``delta`` (Δ) and ``log_u`` (the log uniform of the
    Metropolis test; NaN for Barker's). ``accept`` is the exact acceptance probability.
    """

    name = "exact_mh"
    supports_control_variate = False
    uses_minibatches = False
    test_stats = {"delta": (np.float64, []), "log_u": (np.float64, [])}

    def __init__(
        self,
        vars: Sequence[Any] | None = None,
        *,
        test: Literal["metropolis", "barker"] = "metropolis",
        **kwargs: Any,
    ) -> None:
        if test not in ("metropolis", "barker"):
            raise ValueError(f"test must be 'metropolis' or 'barker', got {test!r}.")
        self.test = test
        super().__init__(vars, **kwargs)

    def _decide(self, estimator: RatioEstimator, data_free: float) -> ExactOutcome:
        return exact_test(self.rng, estimator, data_free, test=self.test)

    def _error_estimate(self, outcome: ExactOutcome) -> float:
        return 0.0  # the exact test

    def _test_stat_values(self, outcome: ExactOutcome) -> dict[str, Any]:
        return {"delta": outcome.delta, "log_u": outcome.log_u}
