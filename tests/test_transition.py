"""One transition, four parts: proposal, Δ* estimator, row store, acceptance test.

The compiled Barker rounds are the only implementation of the test's stopping rules; these
tests check them against the rules computed by brute force with NumPy, check that the
estimators serve the values of the rows the row store drew, that a proposal's log-q ratio
enters the test (an asymmetric proposal samples the right posterior only with it), and
the cost policies.
"""

from __future__ import annotations

import math

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest
from conftest import nan_model, sample_kwargs
from scipy import stats

from pymc_minibatch_mh import ExactMH, MinibatchBarker
from pymc_minibatch_mh.core.barker import (
    DONE,
    EARLY,
    NEED_MORE,
    STOPPED,
    BarkerTest,
    barker_rounds,
    growth_rows,
)
from pymc_minibatch_mh.core.correction import get_correction
from pymc_minibatch_mh.core.source import ArraySource
from pymc_minibatch_mh.estimators.ratio import PrefetchPolicy
from pymc_minibatch_mh.model.compat import posterior, sample_stats
from pymc_minibatch_mh.model.pointmap import PointMap
from pymc_minibatch_mh.proposals import Proposal, ProposalInfo, ProposalState


def mixture_model(n=30_000, seed=3):
    rng = np.random.default_rng(seed)
    x = np.where(rng.random(n) < 0.5, rng.normal(0.0, 1.4, n), rng.normal(1.0, 1.4, n))
    with pm.Model() as model:
        theta = pm.Normal("theta", 0.0, 2.0, shape=2)
        pm.NormalMixture("x", w=np.array([0.5, 0.5]),
                         mu=pt.stack([theta[0], theta[0] + theta[1]]), sigma=1.4, observed=x)
    return model


@pytest.fixture(scope="module")
def mix_model():
    return mixture_model()


# ------------------------------------------------------------ the stopping rules
def brute_force_barker(values, batch_size, data_free, sigma2, tolerance=None, early=None):
    """The minibatch Barker test's stopping rules, by NumPy on every prefix of rounds."""
    n_total = values.shape[0]
    n = 0
    while True:
        n = min(n_total, n + batch_size)
        used = values[:n]
        delta_star = n_total * used.mean() + data_free
        if n == n_total:
            return n, delta_star, 0.0, False
        variance = n_total**2 / (n_total - 1) * used.var(ddof=1) * (n_total - n) / n
        z = (used - used.mean()) / used.std()
        epsilon = (6.4 * np.mean(np.abs(z) ** 3) + 2 * np.mean(np.abs(z))) / math.sqrt(n)
        if variance < sigma2 and (tolerance is None or epsilon <= tolerance):
            return n, delta_star, variance, False
        if early is not None and abs(delta_star) >= early * math.sqrt(variance):
            return n, delta_star, variance, True


@pytest.mark.parametrize(
    "settings",
    [{}, {"tolerance": 0.6}, {"early": 2.0}, {"scale": 30.0}],
    ids=["default", "tolerance", "early", "full-data"],
)
@pytest.mark.parametrize("seed", range(4))
def test_barker_test_stops_where_the_rules_say(settings, seed):
    """The compiled rounds (over blocks of any size) stop where NumPy's brute force does."""
    rng = np.random.default_rng(seed)
    n_total, m = 3000, 40
    values = rng.standard_t(5, size=n_total) * 1e-2 * settings.get("scale", 1.0)
    values += 3e-3 * (seed - 1.5)
    tolerance, early = settings.get("tolerance"), settings.get("early")
    test = BarkerTest(m, get_correction(1.0), tolerance=tolerance, early_decision=early)
    for prefetch_rows in (0, 70, 400):  # rows the source holds before the test starts
        source = ArraySource(values, rng=np.random.default_rng(seed))
        source.start_step()
        source.buffered = prefetch_rows
        outcome = test(np.random.default_rng(0), source, 0.3)
        # The step's rows in the order drawn, continued by the rows it would draw next.
        rows = source.rows
        used = rows.used_in_step
        order = np.concatenate([rows.order[:used], rows.take(n_total - used)])
        n, delta_star, variance, was_early = brute_force_barker(
            values[order], m, 0.3, 1.0, tolerance, early,
        )
        assert outcome.batch_size == n
        assert outcome.delta_star == pytest.approx(delta_star, rel=1e-9, abs=1e-9)
        assert outcome.variance == pytest.approx(variance, rel=1e-9, abs=1e-12)
        assert outcome.early is was_early
        assert outcome.full_data is (n == n_total)
    if "scale" in settings:
        assert outcome.full_data


def test_kernel_asks_for_more_rows_and_resumes():
    """Running the rounds over two blocks equals running them over one."""
    rng = np.random.default_rng(1)
    values = rng.normal(1e-4, 1.5e-3, size=600)
    args = dict(n_total=10_000, batch_size=40, data_free=0.1, sigma2=1.0, tolerance=-1.0,
                early_decision=-1.0)
    whole = barker_rounds(values, np.empty(600), 0, 0.0, 0.0, 0, **args)
    assert whole[0] == DONE and whole[5] > 2
    buf = np.empty(600)
    first = barker_rounds(values[:70], buf, 0, 0.0, 0.0, 0, **args)
    assert first[0] == NEED_MORE and first[1] == 40  # one round used, 30 rows left over
    _, used, n, mean, m2, rounds, *_ = first
    second = barker_rounds(values[used:], buf, n, mean, m2, rounds, **args)
    assert second[0] == DONE
    assert second[2] == whole[2] and second[5] == whole[5]
    np.testing.assert_allclose(second[6:], whole[6:], rtol=1e-12)
    early = barker_rounds(values + 0.2, np.empty(600), 0, 0.0, 0.0, 0,
                          **{**args, "early_decision": 2.0})
    assert early[0] == EARLY
    bad = values.copy()
    bad[3] = np.nan
    assert barker_rounds(bad, np.empty(600), 0, 0.0, 0.0, 0, **args)[0] == STOPPED


def test_growth_is_sized_from_the_variance():
    """After the first block, the test asks for the rows it is predicted to need."""
    n_total, sigma2 = 1_000_000, 1.0
    # s² = 4σ² at n = 200: about 4 × 200 rows are needed, 15 % more are asked for.
    target = n_total / (1 + sigma2 * (n_total - 200) / (200 * 4.0))
    size = growth_rows(200, 4.0, n_total, 50, sigma2)
    assert size % 50 == 0 and size >= 1.15 * target - 200 > size - 50
    # No usable variance yet: one round. Never past N.
    assert growth_rows(1, math.inf, n_total, 50, sigma2) == 50
    assert growth_rows(200, 1e12, 1000, 50, sigma2) == 800


def test_prefetch_cost_model():
    """Half the steps need 1 round, half 8: one call when r ≤ k, else two with about
    1.15·r rounds in all: k = 1 costs 0.5·150 + 0.5·(200 + 10·50) = 425 rows, the least."""
    policy = PrefetchPolicy("auto", call_cost_rows=100.0)
    policy.reset(batch_size=50)
    policy.counts[1] = policy.counts[8] = 500
    assert policy.best_rounds() == 1
    policy.counts[1], policy.counts[8] = 0, 1000  # all need 8: one call of 8 rounds
    assert policy.best_rounds() == 8
    with pytest.raises(ValueError, match="prefetch"):
        PrefetchPolicy(0)


def test_nonfinite_ratios_reject_and_are_counted():
    """A likelihood that is NaN beyond mu = 0.3: rejected, counted, never accepted."""
    model = nan_model(size=5000)
    with model:
        step = MinibatchBarker(batch_size=50, temperature=50.0, S=[0.3], tune=False)
        with pytest.warns(RuntimeWarning, match="NaN or infinite"):
            idata = pm.sample(draws=200, tune=0, step=step, chains=1,
                              initvals={"mu": np.array(0.0)}, **sample_kwargs())
    ss = sample_stats(idata)
    nonfinite = np.asarray(ss["nonfinite"]).ravel()
    assert nonfinite.sum() > 5
    assert not np.asarray(ss["accepted"]).ravel()[nonfinite].any()
    assert np.all(np.asarray(posterior(idata)["mu"]) <= 0.3)


# --------------------------------------------------------- estimators and rows
def logistic_model(n=4000, seed=5):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 2))
    y = (rng.random(n) < 1 / (1 + np.exp(-(x @ np.array([0.5, -1.0]))))).astype("int64")
    with pm.Model() as model:
        b = pm.Normal("b", 0, 3, shape=2)
        pm.Bernoulli("y", logit_p=pm.math.dot(x, b), observed=y)
    return model


@pytest.mark.parametrize("control_variate", [None, "taylor"])
def test_estimator_serves_the_rows_the_store_drew(control_variate):
    """Values and data-free part of a step are those of the rows drawn, whatever the block
    sizes; the log-q ratio is added to the data-free part."""
    model = logistic_model()
    with model:
        step = MinibatchBarker(batch_size=50, S=[0.05, 0.05], tune=False,
                               control_variate=control_variate)
    step._start_chain(np.random.default_rng(0))
    est = step.estimator
    def per_rows(cur, prop, rows, inv_t):
        return est.fn(cur, prop, inv_t, *est.store.rows(rows))

    cur, prop, inv_t = np.array([0.4, -0.9]), np.array([0.45, -1.0]), np.array(0.5)
    data_free = est.open(cur, prop, inv_t, 0.25, 100)
    assert est.buffered == 100
    got = np.concatenate([est.draw_values(30), est.draw_values(120), est.draw(7)[0]])
    rows = est.store._sampler.order[:157]
    assert len(set(rows.tolist())) == 157
    expected, free = per_rows(cur, prop, rows, inv_t)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-15)
    assert data_free == pytest.approx(float(free) + 0.25, rel=1e-12)
    est.close(3)
    if control_variate:  # the residuals are not the plain ratios
        assert not np.allclose(got, step.likelihood.delta(cur, prop, rows, inv_t)[0])
    # A full pass: every row once, in the data's order.
    full = est.full_pass()
    np.testing.assert_allclose(full, per_rows(cur, prop, np.arange(4000), inv_t)[0],
                               rtol=1e-12, atol=1e-15)


class IndependenceProposal(Proposal):
    """θ′ ~ N(m, s²) whatever θ: correct only with its log-q ratio."""

    name = "independence"

    def __init__(self, mean, sd, with_ratio=True):
        self.mean, self.sd, self.with_ratio = mean, sd, with_ratio

    def propose(self, rng, state, scale):
        x = state.x
        new = self.mean + self.sd * rng.standard_normal(x.shape[0])
        if not self.with_ratio:
            return ProposalState(new), ProposalInfo(0.0)
        logq = stats.norm(self.mean, self.sd).logpdf
        return ProposalState(new), ProposalInfo(float(np.sum(logq(x) - logq(new))))


@pytest.mark.parametrize("step_class", [ExactMH, MinibatchBarker])
@pytest.mark.parametrize("with_ratio", [True, False])
def test_proposal_log_q_ratio_enters_the_test(step_class, with_ratio):
    """Normal mean, known sd: an independence proposal off the posterior samples the
    posterior with its log-q ratio (within 4 MCSE) and is detectably biased without."""
    rng = np.random.default_rng(7)
    y = rng.normal(1.0, 1.0, size=200)
    post_var = 1.0 / (1.0 / 100.0 + y.size)
    post_mean = post_var * y.sum()
    with pm.Model():
        mu = pm.Normal("mu", 0.0, 10.0)
        pm.Normal("y", mu, 1.0, observed=y)
        kwargs = {"batch_size": 200} if step_class is MinibatchBarker else {}
        step = step_class(tune=False, **kwargs)
        step.proposal = IndependenceProposal(post_mean + 0.1, 2.0 * math.sqrt(post_var),
                                             with_ratio)
        idata = pm.sample(draws=4000, tune=0, step=step, chains=1, random_seed=3,
                          **{k: v for k, v in sample_kwargs().items() if k != "random_seed"})
    draws = np.asarray(posterior(idata)["mu"]).ravel()
    from pymc_minibatch_mh.model.compat import mcse

    z = abs(draws.mean() - post_mean) / mcse(draws)
    sd_ratio = draws.std() / math.sqrt(post_var)
    if with_ratio:
        assert z < 4 and abs(sd_ratio - 1) < 0.1, (z, sd_ratio)
    else:
        assert z > 4 or abs(sd_ratio - 1) > 0.1, (z, sd_ratio)


def test_point_map_reads_and_writes_a_float64_vector_without_copies():
    """flat_view returns the point's own array only for one contiguous float64 vector;
    to_point stores the vector itself there; every other case copies, with equal values."""
    vec = PointMap(["a"], {"a": np.zeros(3)})
    value = np.array([1.0, 2.0, 3.0])
    assert vec.flat_view({"a": value}) is value
    new = vec.to_point(value, {"a": np.zeros(3), "b": 1.0})
    assert new["a"] is value and new["b"] == 1.0
    strided = np.arange(6.0)[::2]
    others = [
        (vec, {"a": strided}),  # not contiguous
        (vec, {"a": value.astype(np.float32)}),  # another dtype in the point
        (PointMap(["a"], {"a": np.zeros(())}), {"a": np.array(2.0)}),  # a scalar
        (PointMap(["a"], {"a": np.zeros((2, 2))}), {"a": np.eye(2)}),  # a matrix
        (PointMap(["a"], {"a": np.zeros(2, np.float32)}), {"a": np.ones(2, np.float32)}),
        (PointMap(["a", "b"], {"a": np.zeros(2), "b": 0.0}), {"a": value[:2], "b": 4.0}),
    ]
    for pmap, point in others:
        flat = pmap.flat_view(point)
        assert all(flat is not np.asarray(v) for v in point.values())
        np.testing.assert_array_equal(flat, pmap.to_flat(point))
        assert flat.dtype == np.float64 and flat.shape == (pmap.size,)
    # A float32 variable is rounded back to float32 in the point (a copy, not the vector).
    f32 = PointMap(["a"], {"a": np.zeros(2, np.float32)})
    back = f32.to_point(np.array([0.1, 0.2]), {})
    assert back["a"].dtype == np.float32
