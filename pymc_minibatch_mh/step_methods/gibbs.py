r"""``MinibatchGibbs``: Gibbs updates of Bernoulli and Categorical variables with minibatch tests.

Korattikara, Chen and Welling (2014, Appendix F) speed up Gibbs sampling of discrete
variables whose conditional is a product of many terms with the same sequential test as
AustereMH; the minibatch Barker test of Seita et al. (2017) applies as well, because a
Gibbs update of a binary variable *is* a Barker flip (see :mod:`pymc_minibatch_mh.core.gibbs`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

import numpy as np
from pymc.model import modelcontext
from pymc.step_methods.compound import BlockedStep, Competence, StepMethodState
from pymc.step_methods.state import dataclass_state
from pymc.util import get_random_generator, get_value_vars_from_user_vars
from pymc.vartypes import discrete_types

from pymc_minibatch_mh.core.barker import BarkerTest, TestOutcome
from pymc_minibatch_mh.core.buffered import BufferedGenerator
from pymc_minibatch_mh.core.correction import CorrectionDistribution
from pymc_minibatch_mh.core.exact import exact_test
from pymc_minibatch_mh.core.gibbs import gibbs_t_test, propose_category
from pymc_minibatch_mh.errors import ModelNotSupportedError
from pymc_minibatch_mh.estimators.ratio import PrefetchPolicy, RatioEstimator
from pymc_minibatch_mh.model.checks import check_batch_size, check_same_model
from pymc_minibatch_mh.model.compat import ChainSetupMixin, call_cost_rows
from pymc_minibatch_mh.model.discrete import category_counts
from pymc_minibatch_mh.model.likelihood import MinibatchLikelihood
from pymc_minibatch_mh.step_methods.barker import (
    MinibatchBarker,
    barker_correction,
    check_barker_settings,
)
from pymc_minibatch_mh.transition.step import MinibatchStep

__all__ = ["MinibatchGibbs", "MinibatchGibbsState"]


@dataclass_state
class MinibatchGibbsState(StepMethodState):
    """Resumable state: the generator (in the base class), tuning flag and temperature."""

    tune: bool
    temperature: float


class _FullPass:
    """The estimator's full pass as a source of N rows (for the exact update)."""

    __slots__ = ("estimator", "n_total")

    def __init__(self, estimator: RatioEstimator) -> None:
        self.estimator = estimator
        self.n_total = estimator.n_total

    def draw(self, count: int) -> tuple[np.ndarray, float, float]:
        return self.estimator.full_pass(), math.nan, math.nan


class MinibatchGibbs(ChainSetupMixin, BlockedStep):
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
    model, rng, initial_point, mode, check_start, prefetch, data, shuffled_copy
        As for every step method of the package
        (:class:`~pymc_minibatch_mh.transition.step.MinibatchStep`); ``data=`` reads per-row
        data larger than memory (the guide's "Data bigger than memory" page).

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
    default_blocked = True
    _state_class = MinibatchGibbsState
    stats_dtypes_shapes: ClassVar[dict[str, tuple[Any, list[int]]]] = {
        "updates": (np.int64, []),
        "flips": (np.int64, []),
        "flip_rate": (np.float64, []),
        "batch_size": MinibatchStep.common_stats["batch_size"],
        "rows_per_update": (np.float64, []),
        "max_batch_size": (np.int64, []),
        "full_data_updates": (np.int64, []),
        # The rest as for the continuous steps (those of the Barker test; p_value as in
        # MinibatchAustere).
        **{name: MinibatchStep.common_stats[name] for name in ("growth_rounds", "accept")},
        **{name: MinibatchBarker.test_stats[name] for name in ("epsilon", "edgeworth")},
        "p_value": (np.float64, []),
        **{name: MinibatchStep.common_stats[name] for name in (
            "nonfinite", "extra_evaluations", "temperature", "tune", "mean_batch_size"
        )},
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
        mode: Any = None,
        check_start: bool = True,
        prefetch: int | str = "auto",
        blocked: bool = True,
        data: Mapping[str, Any] | None = None,
        shuffled_copy: bool = False,
    ) -> None:
        model = modelcontext(model)
        self._validate(test, batch_size, epsilon, sigma, tolerance, early_decision, order)
        if vars is None:
            vars = [v for v in model.value_vars if v.dtype in discrete_types]
            if not vars:
                raise ModelNotSupportedError(
                    "The model has no discrete free variables for MinibatchGibbs to update. "
                    "Use MinibatchBarker (or NUTS) for continuous variables."
                )
        value_vars = get_value_vars_from_user_vars(vars, model)
        point = dict(initial_point) if initial_point is not None else model.initial_point()
        step_name = type(self).__name__
        #: K of every coordinate of the flat vector.
        self.categories = category_counts(model, value_vars, point, step_name)
        self.likelihood = MinibatchLikelihood(
            model, value_vars, initial_point=point, mode=mode, step_name=step_name,
            allow_discrete=True, data=data, shuffled_copy=shuffled_copy,
        )
        self.vars = self.likelihood.value_vars
        self.model = model
        self.test = test
        self.batch_size = int(batch_size)
        self.epsilon = float(epsilon)
        self.order = order
        self.temperature = temperature
        self.tune = True
        self.check_start = bool(check_start)
        self.rng = get_random_generator(rng)
        self.policy = PrefetchPolicy(prefetch, call_cost_rows(self.likelihood.mode))
        self.estimator = RatioEstimator(self.likelihood, self.policy)
        self.correction = barker_correction(sigma, correction)
        self.sigma = float(sigma)
        self.tolerance = tolerance
        self.early_decision = early_decision
        self._barker = BarkerTest(
            self.batch_size, self.correction, tolerance=tolerance, early_decision=early_decision
        )
        self._started = False
        self._chain_started = False
        self._n_rows = self.likelihood.n_rows_initial

    @staticmethod
    def _validate(
        test: Any, batch_size: Any, epsilon: Any, sigma: Any, tolerance: Any,
        early_decision: Any, order: Any,
    ) -> None:
        if test not in ("barker", "austere", "exact"):
            raise ValueError(f"test must be 'barker', 'austere' or 'exact', got {test!r}.")
        if order not in ("random", "systematic"):
            raise ValueError(f"order must be 'random' or 'systematic', got {order!r}.")
        check_batch_size(batch_size)
        if not (isinstance(epsilon, int | float) and 0.0 < epsilon < 0.5):
            raise ValueError(f"epsilon must be in (0, 0.5), got {epsilon!r}.")
        check_barker_settings(sigma, tolerance, early_decision)

    temperature = MinibatchStep.temperature  # K, validated; sets 1/K for the steps

    # ------------------------------------------------------------- chain hooks
    def _start_chain(self, rng: Any) -> None:
        self.rng = rng = BufferedGenerator(rng)
        self._n_rows = self.likelihood.n_rows()  # the data as they are now (pm.set_data)
        if self.test != "exact" and self.batch_size > self._n_rows:
            raise ValueError(
                f"batch_size={self.batch_size} is larger than the number of observations "
                f"N={self._n_rows}. Use a batch_size between 1 and N."
            )
        self.estimator.start_chain(rng, self.batch_size)
        self._started = True
        self._chain_started = False
        self._warned_nonfinite = False
        self._chain_steps = 0
        self._chain_rows = 0

    def reset_tuning(self) -> None:
        """Nothing to tune; the ``tune`` stat marks PyMC's tuning phase again."""
        self.tune = True

    def stop_tuning(self) -> None:
        """End of PyMC's tuning phase (nothing is tuned; recorded in the ``tune`` stat)."""
        self.tune = False

    def _begin_chain(self, point: Mapping[str, Any]) -> None:
        if not self._started:
            self._start_chain(self.rng)  # used outside pm.sample
        check_same_model(self, point)
        if self.check_start:
            self.likelihood.check_point(point)
        self._chain_started = True

    # -------------------------------------------------------------------- update
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
        rows = self.policy.rows if self.test != "exact" else 0
        data_free = estimator.open(x, x_prop, self._inv_temperature, 0.0, rows)
        if self.test == "barker":
            outcome: Any = self._barker(self.rng, estimator, data_free)
        elif self.test == "austere":
            outcome = gibbs_t_test(
                self.rng, estimator, data_free, batch_size=self.batch_size,
                epsilon=self.epsilon,
            )
        else:
            outcome = exact_test(self.rng, _FullPass(estimator), data_free, test="barker")
        estimator.close(outcome.rounds)
        return (x_prop if outcome.accepted else x), outcome

    def _scan(self) -> np.ndarray:
        d = self.categories.shape[0]
        return self.rng.permutation(d) if self.order == "random" else np.arange(d)

    def step(self, point: Mapping[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """One sweep: every coordinate updated once, each with its own minibatch test."""
        if not self._chain_started:
            self._begin_chain(point)
        lik = self.likelihood
        if lik.other_shared:
            lik.set_others(point)
        x = lik.point_map.to_flat(point)
        flips = rows = max_rows = full = rounds = 0
        accept = eps = edge = 0.0
        p_max = -math.inf
        nonfinite = False
        order = self._scan()
        for index in order:
            x_new, out = self.update(x, int(index))
            if x_new is not x:
                flips += 1
                x = x_new
            rows += out.batch_size
            max_rows = max(max_rows, out.batch_size)
            full += out.full_data
            rounds += out.rounds
            nonfinite |= out.nonfinite
            prob = getattr(out, "accept_prob", None)
            accept += (1.0 if out.accepted else 0.0) if prob is None else prob
            if self.test == "barker":
                eps += out.epsilon
                edge += out.edgeworth
            elif self.test == "austere":
                p_max = max(p_max, out.p_value)
        if nonfinite and not self._warned_nonfinite:
            self._warned_nonfinite = True
            warnings.warn(
                f"{type(self).__name__}: a NaN or infinite log-likelihood ratio was met in a "
                "minibatch; the update was rejected. Steps with this fault are counted in "
                "the 'nonfinite' sample stat (this warning is shown once per chain).",
                RuntimeWarning, stacklevel=2,
            )
        updates = len(order)
        self._chain_steps += 1
        self._chain_rows += rows
        per = max(updates, 1)
        stats = {
            "updates": updates,
            "flips": flips,
            "flip_rate": flips / per,
            "batch_size": rows,
            "rows_per_update": rows / per,
            "max_batch_size": max_rows,
            "full_data_updates": full,
            "growth_rounds": rounds,
            "accept": accept / per,
            "epsilon": eps / per if self.test == "barker" else math.nan,
            "edgeworth": edge / per if self.test == "barker" else math.nan,
            "p_value": p_max if self.test == "austere" else math.nan,
            "nonfinite": nonfinite,
            "extra_evaluations": 0,
            "temperature": self._temperature,
            "tune": self.tune,
            "mean_batch_size": self._chain_rows / self._chain_steps,
        }
        return lik.point_map.to_point(x, point), [stats]

    @staticmethod
    def competence(var: Any, has_grad: bool) -> Competence:
        """Never chosen automatically: a minibatch test is an explicit choice."""
        if var.dtype in discrete_types:
            return Competence.COMPATIBLE
        return Competence.INCOMPATIBLE
