"""The fast path of MinibatchBarker gives the same draws and stats as the NumPy reference.

The step runs its growth loop in a compiled kernel (``adapter/kernel.py``), calls the
jitted likelihood directly (``compat.direct_call``) and reads rows stored in the chain's
random order (``MinibatchLikelihood.arrange_rows``). Each of these changes only the cost:
these tests compare every draw and stat with the reference path
(``core.barker.barker_test`` drawing row by row from data in their own order).
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
import pytest
from conftest import nan_model, sample_kwargs
from scipy import stats

from pymc_minibatch_mh import MinibatchBarker
from pymc_minibatch_mh.adapter.compat import direct_call, posterior, sample_stats
from pymc_minibatch_mh.adapter.kernel import (
    DONE,
    EARLY,
    NEED_MORE,
    STOPPED,
    barker_rounds,
    chunk_moments_fast,
    clt_error_bound_fast,
    shuffle_fast,
)
from pymc_minibatch_mh.adapter.likelihood import FULL_PASS_CHUNK, PointMap
from pymc_minibatch_mh.adapter.source import PrefetchPolicy
from pymc_minibatch_mh.core.moments import chunk_moments, clt_error_bound
from pymc_minibatch_mh.core.rows import ShuffledRows

# Stats computed by different arithmetic on the two paths (the rest must be equal).
FLOAT_STATS = ("delta_star", "delta_variance", "accept", "epsilon", "edgeworth")


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


def run(model, *, use_kernel, arrange, draws=400, tune=0, **kwargs):
    settings = dict(batch_size=50, temperature=60.0, S=[0.05, 0.05], tune=tune > 0)
    settings.update(kwargs)
    with model:
        step = MinibatchBarker(**settings)
        step.use_kernel = use_kernel
        step._source.arrange = arrange
        idata = pm.sample(draws=draws, tune=tune, step=step, chains=1,
                          initvals={"theta": np.array([0.0, 1.0])}, **sample_kwargs())
    return {k: np.asarray(v) for k, v in posterior(idata).items()}, sample_stats(idata)


def assert_same(a, b):
    """Same draws; same stats, all of them (floats up to rounding, the rest exactly)."""
    draws_a, ss_a = a
    draws_b, ss_b = b
    for name, values in draws_a.items():
        np.testing.assert_array_equal(values, draws_b[name])
    # PyMC keeps "tune" to itself (it splits off the warm-up draws); every other stat is here.
    names = set(MinibatchBarker.stats_dtypes_shapes) - {"tune"}
    assert names <= set(ss_a) and set(ss_a) == set(ss_b)
    for name in names:
        x, y = np.asarray(ss_a[name]), np.asarray(ss_b[name])
        if name in FLOAT_STATS:
            np.testing.assert_allclose(x, y, rtol=1e-9, atol=1e-12, err_msg=name)
        else:
            np.testing.assert_array_equal(x, y, name)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"tolerance": 0.6},
        {"early_decision": 3.0},
        {"temperature": 3.0, "batch_size": 2000},  # reaches all N rows on some steps
        {"tune": 200},  # the proposal scale is tuned, then fixed
    ],
    ids=["default", "tolerance", "early", "full-data", "tuning"],
)
def test_fast_path_equals_reference(mix_model, kwargs):
    reference = run(mix_model, use_kernel=False, arrange=False, **kwargs)
    fast = run(mix_model, use_kernel=True, arrange=True, **kwargs)
    ss = reference[1]
    # The settings exercise what they are meant to: growth, and their own stopping rule.
    assert float(np.asarray(ss["growth_rounds"]).mean()) > 1.2
    if "early_decision" in kwargs:
        assert np.asarray(ss["early_decision"]).any()
    if kwargs.get("temperature") == 3.0:
        assert np.asarray(ss["full_data"]).any()
    if "tune" in kwargs:  # the draws and stats after tuning depend on every tuning step
        assert abs(float(np.asarray(ss["scaling"]).ravel()[0]) - 1.0) > 0.05
    assert_same(reference, fast)
    if not kwargs:  # each change on its own, once
        assert_same(reference, run(mix_model, use_kernel=True, arrange=False))
        assert_same(reference, run(mix_model, use_kernel=False, arrange=True))


def test_fast_path_equals_reference_with_nonfinite_ratios():
    """A likelihood that is NaN beyond mu = 0.3: same rejections, same counts."""
    model = nan_model(size=5000)
    results = []
    for use_kernel, arrange in ((False, False), (True, True)):
        with model:
            step = MinibatchBarker(batch_size=50, temperature=50.0, S=[0.3], tune=False)
            step.use_kernel = use_kernel
            step._source.arrange = arrange
            with pytest.warns(RuntimeWarning, match="NaN or infinite"):
                idata = pm.sample(draws=200, tune=0, step=step, chains=1,
                                  initvals={"mu": np.array(0.0)}, **sample_kwargs())
        results.append((np.asarray(posterior(idata)["mu"]), sample_stats(idata)))
    assert np.asarray(results[0][1]["nonfinite"]).sum() > 5
    np.testing.assert_array_equal(results[0][0], results[1][0])
    for name in ("nonfinite", "accepted", "batch_size"):
        np.testing.assert_array_equal(np.asarray(results[0][1][name]),
                                      np.asarray(results[1][1][name]))


@pytest.mark.parametrize("seed", range(5))
def test_compiled_moments_equal_core(seed):
    rng = np.random.default_rng(seed)
    values = rng.standard_t(3, size=int(rng.integers(2, 500))) * 10.0 ** rng.integers(-6, 3)
    np.testing.assert_allclose(chunk_moments_fast(values), chunk_moments(values), rtol=1e-10)
    mean = float(values.mean())
    np.testing.assert_allclose(clt_error_bound_fast(values, mean),
                               clt_error_bound(values, mean), rtol=1e-10)
    assert clt_error_bound_fast(np.full(5, 2.0), 2.0) == (0.0, 0.0)


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


def test_direct_call_matches_function_and_sees_set_value():
    data = pytensor.shared(np.arange(6.0), name="data")
    x = pt.vector("x")
    rows = pt.vector("rows", dtype="int64")
    for mode in ("NUMBA", "FAST_RUN"):
        multi = pytensor.function([x, rows], [data[rows] * x.sum(), x * 2], mode=mode)
        single = pytensor.function([x, rows], data[rows] + x[0], mode=mode)
        for fn in (multi, single):
            fn.trust_input = True
            fast = direct_call(fn)
            args = (np.array([1.0, 2.0]), np.array([1, 4], dtype=np.int64))
            data.set_value(np.arange(6.0))
            expected = fn(*args)
            got = fast(*args)
            if isinstance(expected, list):
                assert len(got) == len(expected)
                for e, g in zip(expected, got, strict=True):
                    np.testing.assert_array_equal(e, g)
            else:
                np.testing.assert_array_equal(expected, got)
            data.set_value(np.arange(6.0) * 10.0, borrow=True)
            np.testing.assert_array_equal(np.asarray(fn(*args)[0] if isinstance(
                expected, list) else fn(*args)), np.asarray(
                fast(*args)[0] if isinstance(expected, list) else fast(*args)))


def test_arranged_rows_give_the_same_ratios(mix_model):
    with mix_model:
        step = MinibatchBarker(batch_size=50, temperature=10.0, S=[0.05, 0.05], tune=False)
    lik = step.likelihood
    n = lik.n_rows()
    order = np.random.default_rng(2).permutation(n).astype(np.int64)
    x0, x1, inv_t = np.array([0.1, 0.9]), np.array([0.2, 0.7]), np.array(0.1)
    plain = lik.delta(x0, x1, order[100:400], inv_t)
    lik.arrange_rows(order)
    arranged = lik.delta(x0, x1, np.arange(100, 400, dtype=np.int64), inv_t)
    np.testing.assert_allclose(arranged[0], plain[0], rtol=1e-13)
    assert float(arranged[1]) == float(plain[1])
    lik.arrange_rows(None)
    np.testing.assert_allclose(lik.delta(x0, x1, order[100:400], inv_t)[0], plain[0],
                               rtol=1e-13)
    assert lik.row_bytes == n * 8


def test_take_positions_selects_the_rows_of_take():
    n = 101
    a = ShuffledRows(n, np.random.default_rng(4))
    b = ShuffledRows(n, np.random.default_rng(4))
    for step in range(40):
        a.start_step()
        b.start_step()
        for count in (7, 30, 13):
            if a.used_in_step + count > n:
                break
            rows = a.take(count)
            positions = b.take_positions(count)
            np.testing.assert_array_equal(b.order[positions], rows)
        if step % 3 == 0:
            a.give_back(5)
            b.give_back(5)
    assert a.shuffles == b.shuffles > 0


def test_control_variate_residuals_read_the_arranged_rows():
    """With control variates, the residual function reads the rows the step's order says."""
    rng = np.random.default_rng(5)
    n = 4000
    x = rng.normal(size=(n, 2))
    y = (rng.random(n) < 1 / (1 + np.exp(-(x @ np.array([0.5, -1.0]))))).astype("int64")
    with pm.Model():
        b = pm.Normal("b", 0, 3, shape=2)
        pm.Bernoulli("y", logit_p=pm.math.dot(x, b), observed=y)
        step = MinibatchBarker(batch_size=50, S=[0.05, 0.05], tune=False,
                               control_variate="taylor")
    lik = step.likelihood
    fn = step._source.delta_fn
    order = rng.permutation(n).astype(np.int64)
    cur, prop, inv_t = np.array([0.4, -0.9]), np.array([0.45, -1.0]), np.array(1.0)
    plain = fn(cur, prop, order[:300], inv_t)
    lik.arrange_rows(order)
    arranged = fn(cur, prop, np.arange(300, dtype=np.int64), inv_t)
    np.testing.assert_allclose(arranged[0], plain[0], rtol=1e-12, atol=1e-15)
    assert float(arranged[-1]) == pytest.approx(float(plain[-1]), rel=1e-12)
    # And the residuals are not the plain ratios (the estimator is on).
    assert not np.allclose(plain[0], lik.delta(cur, prop, np.arange(300), inv_t)[0])


def test_compiled_shuffle_is_a_uniform_permutation():
    rng = np.random.default_rng(11)
    order = np.arange(100_000, dtype=np.int64)
    shuffle_fast(order, rng)
    assert np.array_equal(np.sort(order), np.arange(100_000))
    # All 24 orders of 4 rows are equally likely: chi-square test over 48,000 shuffles
    # (a shuffle that favoured or missed some orders fails it).
    counts = {}
    for _ in range(48_000):
        small = np.arange(4, dtype=np.int64)
        shuffle_fast(small, rng)
        key = tuple(small.tolist())
        counts[key] = counts.get(key, 0) + 1
    assert len(counts) == 24
    assert stats.chisquare(list(counts.values())).pvalue > 1e-3
    # Each row's position is uniform: row 0 of 100 ends at each position equally often.
    ends = np.empty(20_000, dtype=np.int64)
    for k in range(ends.size):
        small = np.arange(100, dtype=np.int64)
        shuffle_fast(small, rng)
        ends[k] = int(np.flatnonzero(small == 0)[0])
    assert stats.chisquare(np.bincount(ends, minlength=100)).pvalue > 1e-3


def test_step_rows_use_the_compiled_shuffle(mix_model):
    with mix_model:
        step = MinibatchBarker(batch_size=50, temperature=60.0, tune=False)
    rows = step.likelihood.make_rows(1000, np.random.default_rng(0))
    assert rows._shuffle is shuffle_fast
    first = rows.order.copy()
    rows.used = 1000  # as after steps that used N rows: the next step reshuffles
    rows.start_step()
    assert rows.shuffles == 1
    assert not np.array_equal(first, rows.order)
    assert np.array_equal(np.sort(rows.order), np.arange(1000))


def test_growth_calls_are_sized_from_the_variance(mix_model):
    """After the first block, one call evaluates the rows the test is predicted to need."""
    with mix_model:
        step = MinibatchBarker(batch_size=50, temperature=60.0, tune=False)
    source = step._source
    n_total, sigma2 = 1_000_000, 1.0
    # s² = 4σ² at n = 200: about 4 × 200 rows are needed, 15 % more are asked for.
    result = (0, 200, 200, 0.0, 0.0, 4, 0.0, 4.0, 0.0, 0.0)
    target = n_total / (1 + sigma2 * (n_total - 200) / (200 * 4.0))
    size = source._growth_rows(result, n_total, 50, sigma2)
    assert size % 50 == 0 and size >= 1.15 * target - 200 > size - 50
    # No usable variance yet (n = 1): a block of the policy's rounds.
    inf_result = (0, 1, 1, 0.0, 0.0, 1, 0.0, np.inf, 0.0, 0.0)
    assert source._growth_rows(inf_result, n_total, 50, sigma2) == 50 * source.policy.rounds
    # A hopeless variance asks for the rest of the data, in bounded chunks.
    big = (0, 200, 200, 0.0, 0.0, 4, 0.0, 1e12, 0.0, 0.0)
    assert source._growth_rows(big, n_total, 50, sigma2) == FULL_PASS_CHUNK // 50 * 50


def test_prefetch_cost_model_knows_how_growth_calls_are_sized(mix_model):
    """Half the steps need 1 round, half 8: blocks of 4 rounds when each growth call adds a
    block, but single rounds when one growth call sized from the variance does the rest."""
    policy = PrefetchPolicy("auto", call_cost_rows=100.0)
    policy.reset(batch_size=50)
    policy.counts[1] = policy.counts[8] = 500
    # ⌈r/k⌉ calls of k rounds: k = 4 costs 0.5·300 + 0.5·2·300 = 450 rows, the least.
    assert policy.best_rounds() == 4
    # One call when r ≤ k, else two with about 1.15·r rounds in all: k = 1 costs
    # 0.5·150 + 0.5·(200 + 10·50) = 425 rows, the least.
    policy.sized_growth = True
    assert policy.best_rounds() == 1
    # The minibatch Barker step's compiled path tells its policy; the reference does not.
    for use_kernel in (True, False):
        with mix_model:
            step = MinibatchBarker(batch_size=50, temperature=60.0, tune=False)
        step.use_kernel = use_kernel
        step._start_chain(np.random.default_rng(0))
        assert step._source.policy.sized_growth is use_kernel


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
