r"""``MinibatchGibbs``: Gibbs updates of Bernoulli and Categorical variables with minibatch tests.

Korattikara, Chen and Welling (2014, Appendix F) speed up Gibbs sampling of discrete
variables whose conditional is a product of many terms with the same sequential test as
AustereMH; the minibatch Barker test of Seita et al. (2017) applies as well, because a
Gibbs update of a binary variable *is* a Barker flip (see :mod:`pymc_minibatch_mh.core.gibbs`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from operator import itemgetter
from typing import Any, ClassVar, Literal

import numpy as np
from pymc.util import get_value_vars_from_user_vars
from pymc.vartypes import discrete_types

from pymc_minibatch_mh.core.barker import BarkerTest, TestOutcome
from pymc_minibatch_mh.core.correction import CorrectionDistribution
from pymc_minibatch_mh.core.exact import exact_test
from pymc_minibatch_mh.core.gibbs import gibbs_t_test, propose_category
from pymc_minibatch_mh.errors import ModelNotSupportedError
from pymc_minibatch_mh.estimators.ratio import RatioEstimator
from pymc_minibatch_mh.model.discrete import category_counts
from pymc_minibatch_mh.step_methods.barker_checks import barker_correction, check_barker_settings
from pymc_minibatch_mh.step_methods.minibatch_barker import MinibatchBarker
from pymc_minibatch_mh.transition.inner_steps import merge_stats
from pymc_minibatch_mh.transition.settings import StepSettings, document_parameters
from pymc_minibatch_mh.transition.step_base import MinibatchStepBase, MinibatchStepBaseState

__all__ = ["MinibatchGibbs", "MinibatchGibbsState"]

#: Resumable state: the generator, tuning flag and temperature (the base's).
MinibatchGibbsState = MinibatchStepBaseState


class _FullPass:
    """The estimator's full pass as a source of N rows (for the exact update)."""

    __slots__ = ("estimator", "n_total")

    def __init__(self, estimator: RatioEstimator) -> None:
        self.estimator = estimator
        self.n_total = estimator.n_total

    def draw(self, count: int) -> tuple[np.ndarray, float, float]:
        return self.estimator.full_pass(), math.nan, math.nan


@document_parameters
class MinibatchGibbs(MinibatchStepBase):
    r"""Gibbs sampling of Bernoulli and Categorical variables with a minibatch test per update.

    Each step updates every coordinate of the block once, in a random (default) or
    systematic order. An update proposes another value of the coordinate (the flip of a
    binary variable; a uniformly random other category of a categorical one), estimates the
    log-odds ``Δ = c + Σ_i l_i`` of the move from a minibatch of the per-observation
    log-likelihood ratios (the prior difference ``c`` is computed exactly), and decides with
    a minibatch test whose exact version accepts with Barker's probability ``g(Δ)``. For a
    binary variable that is the Gibbs conditional of the other value, so the step is an
    approximate Gibbs sampler; for ``K > 2`` categories it is a Barker (Metropolis-type)
    update with a symmetric proposal (one category change per update).

    Parameters
    ----------
    vars : list of Variable, optional
        Bernoulli and Categorical variables to update (default: every discrete free
        variable of the model).
    test : {"barker", "austere", "exact"}, default "barker"
        ``"barker"``: the minibatch Barker test with its correction
        (:class:`~pymc_minibatch_mh.core.barker.BarkerTest`); ``"austere"``: the sequential
        t-test with the Gibbs threshold ``(logit u − c)/N`` of the Austerity paper's
        Appendix F (:func:`~pymc_minibatch_mh.core.gibbs.gibbs_t_test`); ``"exact"``: the
        full-data update (every row at every update; the reference).
    batch_size : int, default 100
        Rows per round m (the Austerity paper's MRF uses 500).
    epsilon : float, default 0.01
        ``test="austere"``: threshold ε on each round's p-value.
    sigma, tolerance, early_decision, correction
        ``test="barker"``: as for :class:`~pymc_minibatch_mh.MinibatchBarker`.
    order : {"random", "systematic"}, default "random"
        Scan order of the coordinates within a step.
    temperature : float, default 1.0
        K > 0: the likelihood is raised to 1/K (the prior is not).
    {shared_parameters}

    Notes
    -----
    PyMC records stats per step, and a step makes one test per coordinate, so the stats
    aggregate the step's updates: ``updates`` (tests made), ``flips`` (updates that changed
    the value), ``flip_rate``, ``batch_size`` (rows used by all the step's tests, summed),
    ``rows_per_update`` (its mean per update), ``max_batch_size`` (the largest update),
    ``full_data_updates`` (updates that used all N rows), ``growth_rounds`` (summed),
    ``accept`` (mean over updates of ``g(Δ*)``; the 0/1 decision for the t-test),
    ``epsilon`` and ``edgeworth`` (Barker: means over the updates of the estimated
    normal-approximation error, as for MinibatchBarker; NaN otherwise), ``p_value``
    (t-test: the largest final p-value; NaN otherwise), ``nonfinite`` (an update met a
    NaN or +inf ratio and was rejected), ``extra_evaluations`` (0), ``temperature``,
    ``tune`` and the chain's running ``mean_batch_size`` (rows per step).

    The Barker test needs ``s² < σ²``, i.e. ``N² var(l)/b < σ²`` roughly: it saves data
    when the flip changes each row's likelihood little (many rows, small effects). The
    t-test stops as soon as the sign of ``Δ − logit u`` is clear, which also saves data
    when the conditional is close to 0 or 1.

    References
    ----------
    .. [1] Korattikara, A., Chen, Y., Welling, M. (2014). Austerity in MCMC Land: Cutting
       the Metropolis-Hastings Budget. ICML 2014, Appendix F.
    .. [2] Seita, D., Pan, X., Chen, H., Canny, J. (2017). An Efficient Minibatch
       Acceptance Test for Metropolis-Hastings. UAI 2017.

    Examples
    --------
    >>> import numpy as np, pymc as pm
    >>> from pymc_minibatch_mh import MinibatchGibbs
    >>> y = np.random.default_rng(0).normal(0.3, 1.0, size=5_000)
    >>> with pm.Model():
    ...     z = pm.Bernoulli("z", 0.5)
    ...     _ = pm.Normal("y", 0.3 * z, 1, observed=y)
    ...     step = MinibatchGibbs([z], batch_size=200)
    ...     idata = pm.sample(draws=50, tune=0, step=step, chains=1, progressbar=False,
    ...                       random_seed=1, compute_convergence_checks=False)
    >>> float(idata.posterior["z"].mean()) > 0.9
    True

    """

    name = "minibatch_gibbs"
    samples_discrete = True
    move_name = "update"
    test_stats: ClassVar[dict[str, tuple[Any, list[int]]]] = {
        "updates": (np.int64, []),
        "flips": (np.int64, []),
        "flip_rate": (np.float64, []),
        "rows_per_update": (np.float64, []),
        "max_batch_size": (np.int64, []),
        "full_data_updates": (np.int64, []),
        # Those of the Barker test; p_value as in AustereMH.
        **{name: MinibatchBarker.test_stats[name] for name in ("epsilon", "edgeworth")},
        "p_value": (np.float64, []),
    }

    def __init__(
        self,
        vars: Sequence[Any] | None = None,
        *,
        test: Literal["barker", "austere", "exact"] = "barker",
        batch_size: int = 100,
        epsilon: float = 0.01,
        sigma: float = 1.0,
        tolerance: float | None = None,
        early_decision: float | None = None,
        correction: CorrectionDistribution | None = None,
        order: Literal["random", "systematic"] = "random",
        temperature: float = 1.0,
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
        self._validate(test, epsilon, sigma, tolerance, early_decision, order)
        self.test = test
        self.uses_minibatches = test != "exact"
        self.epsilon = float(epsilon)
        self.order = order
        self.correction = barker_correction(sigma, correction)
        self.sigma = float(sigma)
        self.tolerance = tolerance
        self.early_decision = early_decision
        super().__init__(vars, settings=StepSettings.take(locals()))
        self._barker = BarkerTest(
            self.batch_size, self.correction, tolerance=tolerance, early_decision=early_decision
        )

    @staticmethod
    def _validate(
        test: Any, epsilon: Any, sigma: Any, tolerance: Any, early_decision: Any, order: Any,
    ) -> None:
        if test not in ("barker", "austere", "exact"):
            raise ValueError(f"test must be 'barker', 'austere' or 'exact', got {test!r}.")
        if order not in ("random", "systematic"):
            raise ValueError(f"order must be 'random' or 'systematic', got {order!r}.")
        if not (isinstance(epsilon, int | float) and 0.0 < epsilon < 0.5):
            raise ValueError(f"epsilon must be in (0, 0.5), got {epsilon!r}.")
        check_barker_settings(sigma, tolerance, early_decision)

    def _sampled_vars(
        self, model: Any, vars: Sequence[Any] | None, point: Mapping[str, Any]
    ) -> list[Any]:
        """The discrete variables to update (default: all), with K of each coordinate."""
        if vars is None:
            vars = [v for v in model.value_vars if v.dtype in discrete_types]
            if not vars:
                raise ModelNotSupportedError(
                    "The model has no discrete free variables for MinibatchGibbs to update. "
                    "Use MinibatchBarker (or NUTS) for continuous variables."
                )
        value_vars = get_value_vars_from_user_vars(vars, model)
        #: K of every coordinate of the flat vector.
        self.categories = category_counts(model, value_vars, point, type(self).__name__)
        return value_vars

    def reset_tuning(self) -> None:
        """Nothing to tune; the ``tune`` stat marks PyMC's tuning phase again."""
        self.tune = True

    # -------------------------------------------------------------------- update
    def _decide(self, estimator: RatioEstimator, data_free: float) -> TestOutcome:
        if self.test == "barker":
            return self._barker(self.rng, estimator, data_free)
        if self.test == "austere":
            return gibbs_t_test(
                self.rng, estimator, data_free, batch_size=self.batch_size,
                epsilon=self.epsilon,
            )
        return exact_test(self.rng, _FullPass(estimator), data_free, test="barker")

    def _test_stat_values(self, outcome: Any) -> dict[str, Any]:
        if self.test == "barker":
            return {"epsilon": outcome.epsilon, "edgeworth": outcome.edgeworth}
        if self.test == "austere":
            return {"p_value": outcome.p_value}
        return {}

    def update(self, x: np.ndarray, index: int) -> tuple[np.ndarray, TestOutcome]:
        """One update of coordinate ``index`` of the flat state ``x`` (not modified).

        The other variables of the model must have been set (``likelihood.set_others``).

        Parameters
        ----------
        x : numpy.ndarray
            The flat float64 state of the step's variables.
        index : int
            The coordinate to update.

        Returns
        -------
        tuple
            ``(new_x, outcome)``: ``new_x`` is ``x`` itself when the move was rejected, a
            new array otherwise; ``outcome`` is the test's record.

        """
        current = int(x[index])
        x_prop = x.copy()
        x_prop[index] = propose_category(self.rng, current, int(self.categories[index]))
        estimator = self.estimator
        rows = self.policy.rows if self.uses_minibatches else 0
        data_free = estimator.open(x, x_prop, self._inv_temperature, 0.0, rows)
        outcome = self._decide(estimator, data_free)
        estimator.close(outcome.rounds)
        return (x_prop if outcome.accepted else x), outcome

    def _scan(self) -> np.ndarray:
        d = self.categories.shape[0]
        return self.rng.permutation(d) if self.order == "random" else np.arange(d)

    def _transitions(
        self, point: Mapping[str, Any]
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """One sweep: every coordinate updated once, each with its own minibatch test."""
        lik = self.likelihood
        if lik.other_shared:
            lik.set_others(point)
        x = lik.point_map.to_flat(point)
        transitions = []
        for index in self._scan():
            x, outcome = self.update(x, int(index))
            transitions.append(self._outcome_stats(outcome))
        return lik.point_map.to_point(x, point), transitions

    def _draw_stats(self, transitions: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """The sweep's stats: the merged updates' (:func:`merge_stats`) and the sweep's own."""
        merged = merge_stats(transitions)  # rows and rounds summed, accept averaged, ...
        updates = len(transitions)
        rows = merged["batch_size"]
        stats = {
            "updates": updates,
            "flips": int(sum(map(_ACCEPTED, transitions))),
            "flip_rate": merged["accepted"],
            "batch_size": rows,
            "rows_per_update": rows / updates,
            "max_batch_size": max(map(_BATCH_SIZE, transitions)),
            "full_data_updates": sum(map(_FULL_DATA, transitions)),
            "growth_rounds": merged["growth_rounds"],
            "accept": merged["accept"],
            "epsilon": math.nan,
            "edgeworth": math.nan,
            "p_value": math.nan,
            "nonfinite": merged["nonfinite"],
            "extra_evaluations": merged["extra_evaluations"],
        }
        if self.test == "barker":
            stats["epsilon"] = sum(map(_EPSILON, transitions)) / updates
            stats["edgeworth"] = sum(map(_EDGEWORTH, transitions)) / updates
        elif self.test == "austere":
            stats["p_value"] = max(map(_P_VALUE, transitions))
        return self._add_chain_stats(stats)


# The per-update stats the sweep's own stats reduce (C-level getters: a sweep's hot path).
_ACCEPTED, _BATCH_SIZE, _FULL_DATA, _EPSILON, _EDGEWORTH, _P_VALUE = map(
    itemgetter, ("accepted", "batch_size", "full_data", "epsilon", "edgeworth", "p_value")
)
