"""``ExactMH``: full-data Metropolis or Barker tests, the reference for the minibatch tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike

from pymc_minibatch_mh.core.exact import ExactOutcome, exact_test
from pymc_minibatch_mh.estimators.ratio import RatioEstimator
from pymc_minibatch_mh.transition.schedule import TemperatureSchedule
from pymc_minibatch_mh.transition.settings import MoveSettings, StepSettings, document_parameters
from pymc_minibatch_mh.transition.step import MinibatchStep

__all__ = ["ExactMH"]


@document_parameters
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
    {shared_parameters}

    Notes
    -----
    Test-specific sample stats: ``delta`` (Δ) and ``log_u`` (the log uniform of the
    Metropolis test; NaN for Barker's). ``accept`` is the exact acceptance probability.
    """

    name = "exact_mh"
    uses_minibatches = False
    test_stats = {"delta": (np.float64, []), "log_u": (np.float64, [])}

    def __init__(
        self,
        vars: Sequence[Any] | None = None,
        *,
        test: Literal["metropolis", "barker"] = "metropolis",
        temperature: float | TemperatureSchedule = 1.0,
        S: ArrayLike | str | None = None,
        scaling: float = 1.0,
        tune: bool = True,
        target_accept: float | None = None,
        proposal: Any = None,
        steps_per_draw: int | str = "auto",
        model: Any = None,
        rng: Any = None,
        initial_point: Mapping[str, Any] | None = None,
        mode: str | None = None,
        check_start: bool = True,
        prefetch: int | str = "auto",
        blocked: bool = True,
        data: Mapping[str, Any] | None = None,
        shuffled_copy: bool = False,
    ) -> None:
        if test not in ("metropolis", "barker"):
            raise ValueError(f"test must be 'metropolis' or 'barker', got {test!r}.")
        self.test = test
        super().__init__(vars, settings=StepSettings.take(locals()),
                         move_settings=MoveSettings.take(locals()))

    def _decide(self, estimator: RatioEstimator, data_free: float) -> ExactOutcome:
        return exact_test(self.rng, estimator, data_free, test=self.test)

    def _error_estimate(self, outcome: ExactOutcome) -> float:
        return 0.0  # the exact test

    def _test_stat_values(self, outcome: ExactOutcome) -> dict[str, Any]:
        return {"delta": outcome.delta, "log_u": outcome.log_u}
