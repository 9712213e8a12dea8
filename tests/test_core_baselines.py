"""Tests of the baseline acceptance tests in the core: exact, AustereMH, MHSubLhd.

Statistical tests compare rates of decisions that differ from the exact decision *for the
same u* (the tests draw u first, with the same call) with the error each test states:
the dynamic program's E(μ_std) for AustereMH, δ for MHSubLhd. Their tolerances are
binomial (4 standard errors) plus, for the dynamic program, its discretisation error.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
from scipy import special, stats

from pymc_minibatch_mh.core.austere import (
    DEFAULT_BATCH_SIZES,
    DEFAULT_EPSILONS,
    AustereOutcome,
    adaptive_design,
    austere_nc_test,
    austere_test,
    batch_schedule,
    conservative_design,
    design_table,
    sequential_test_error,
    standardised_mean,
    worst_case_error,
)
from pymc_minibatch_mh.core.common import draw_uniform, is_fault, log_threshold
from pymc_minibatch_mh.core.exact import exact_test
from pymc_minibatch_mh.core.rows import PartialShuffleRows
from pymc_minibatch_mh.core.source import ArraySource
from pymc_minibatch_mh.core.subsampling import bernstein_bound, mhsublhd_test


# ------------------------------------------------------------------------- helpers
class RecordingSource(ArraySource):
    """An ArraySource that records the rows of every draw and every full pass.

    With ``fresh=True`` every step gets a new uniformly random row order, so the rows of a
    step are a uniform sample without replacement *independent of earlier steps*. The
    statistical tests need this: with one order per pass, a step that starts where the
    previous one stopped, when the previous test's stopping depended on its rows and used
    a large part of N, gets the rows left in the pass, which are biased (e.g. AustereMH
    with N = 2000, m = 50, ε = 0.01, μ_std = 0.5 repeated on one population: error 0.066
    instead of the 0.041 predicted and observed with fresh orders).
    """

    def __init__(self, values, rng, fresh=False):
        super().__init__(values, rng=rng)
        self.fresh = fresh
        self._rng = rng
        self.steps: list[list[np.ndarray]] = []

    def start_step(self):
        if self.fresh:
            self.rows = PartialShuffleRows(self.n_total, self._rng)
        super().start_step()
        self.steps.append([])

    def draw(self, count):
        if count < 1:
            raise AssertionError(f"empty draw of {count} rows")
        used = sum(r.size for r in self.steps[-1])
        if used + count > self.n_total:
            raise AssertionError(f"draw past N: {used} + {count} > {self.n_total}")
        rows = self.rows.take(count).copy()
        self.steps[-1].append(rows)
        self.rows_drawn += count
        chunk = self.values[rows]
        with np.errstate(invalid="ignore"):
            mean = float(chunk.mean())
            dev = chunk - mean
            return chunk, mean, float(dev @ dev)

    def step_rows(self, i=-1):
        return np.concatenate(self.steps[i]) if self.steps[i] else np.empty(0, np.int64)


def same_u(rng, n_total, data_free=0.0):
    """log u and μ0 that a test run with ``rng`` will draw (from a copy of it)."""
    return log_threshold(copy.deepcopy(rng), data_free, n_total)


def data_free_for(rng, n_total, mu0):
    """The data-free part c for which a test run with ``rng`` gets threshold ``mu0``."""
    log_u, _ = same_u(rng, n_total)
    return log_u - n_total * mu0


def mismatch_rate(test, values, mu_std, trials, seed, **kwargs):
    """Run ``test`` ``trials`` times with μ_std fixed; rate of non-exact decisions, rows."""
    n = values.size
    mu, sd = values.mean(), values.std()
    mu0 = mu - mu_std * sd / math.sqrt(n - 1)
    rng = np.random.default_rng(seed)
    source = RecordingSource(values, np.random.default_rng(seed + 1), fresh=True)
    wrong = 0
    rows = np.empty(trials)
    for t in range(trials):
        c = data_free_for(rng, n, mu0)
        source.start_step()
        out = test(rng, source, c, **kwargs)
        threshold = out.mu0 if isinstance(out, AustereOutcome) else out.psi
        assert threshold == pytest.approx(mu0, rel=1e-9, abs=1e-15)
        exact = bool(mu > threshold)
        if out.full_data:
            assert out.accepted == exact
        wrong += out.accepted != exact
        rows[t] = out.batch_size
    return wrong / trials, rows


def simulate_walk(mu_std, batch_size, epsilon, n_total, paths, rng):
    """Direct simulation of eqs. 9–11: z_j = a_j μ_std + b_j z_{j−1} + σ_j ε_j."""
    n_rows = batch_schedule(batch_size, n_total)
    pis = n_rows / n_total
    bound = stats.norm.isf(epsilon)
    z = np.zeros(paths)
    alive = np.ones(paths, dtype=bool)
    lower = upper = 0
    used = np.full(paths, float(n_total))
    pi_prev = 0.0
    for j in range(n_rows.size - 1):
        pi = pis[j]
        a = (pi - pi_prev) / (1 - pi_prev) / math.sqrt(pi * (1 - pi))
        b = math.sqrt(pi_prev / pi * (1 - pi) / (1 - pi_prev))
        sd = math.sqrt((pi - pi_prev) / (pi * (1 - pi_prev)))
        z = a * mu_std + b * z + sd * rng.standard_normal(paths)
        lo = alive & (z < -bound)
        up = alive & (z > bound)
        lower += int(lo.sum())
        upper += int(up.sum())
        used[lo | up] = n_rows[j]
        alive &= ~(lo | up)
        pi_prev = pi
    if mu_std > 0:
        error = lower / paths
    elif mu_std < 0:
        error = upper / paths
    else:
        error = 0.5 * (lower + upper) / paths
    return error, used


def gaussian_values(n, seed):
    return np.random.default_rng(seed).normal(0.003, 0.01, size=n)


# ------------------------------------------------------------------ common helpers
def test_common_helpers():
    a, b = np.random.default_rng(3), np.random.default_rng(3)
    u = draw_uniform(a)
    assert 0.0 < u <= 1.0
    log_u, mu0 = log_threshold(b, 0.7, 20)
    assert log_u == pytest.approx(math.log(u)) and mu0 == pytest.approx((log_u - 0.7) / 20)
    assert is_fault(math.nan) and is_fault(math.inf) and not is_fault(-math.inf)
    assert not is_fault(1.0)


# ------------------------------------------------------------------------- exactness
@pytest.mark.parametrize("test", ["metropolis", "barker"])
def test_exact_test_is_the_exact_rule(test):
    n = 50
    accepted = []
    for seed in range(60):
        values = np.random.default_rng(seed).normal(0.0, 0.05, size=n)
        c = -0.3
        rng = np.random.default_rng(1000 + seed)
        probe = copy.deepcopy(rng)
        source = RecordingSource(values, np.random.default_rng(seed))
        source.start_step()
        out = exact_test(rng, source, c, test=test)
        delta = values.sum() + c
        if test == "metropolis":
            log_u = math.log(draw_uniform(probe))
            expected = log_u < delta
            assert out.log_u == log_u
            assert out.accept_prob == pytest.approx(min(1.0, math.exp(delta)))
        else:
            expected = delta + probe.logistic() > 0
            assert out.accept_prob == pytest.approx(special.expit(delta))
        assert out.accepted == expected
        assert out.delta == pytest.approx(delta)
        assert (out.batch_size, out.rounds, out.full_data, out.extra_evaluations) == (n, 1, True, 0)
        assert sorted(source.step_rows().tolist()) == list(range(n))
        accepted.append(out.accepted)
    assert 5 < sum(accepted) < 55  # both decisions occur


def exact_cases(n=300, cases=80, seed=0):
    """Populations and data-free parts whose exact decisions vary with u."""
    rng = np.random.default_rng(seed)
    for i in range(cases):
        values = rng.normal(rng.normal(0.0, 2e-3), 0.05, size=n)
        yield i, values, float(rng.normal(-0.5, 0.5))


@pytest.mark.parametrize(
    "name, run",
    [
        ("austere m=N", lambda r, s, c: austere_test(r, s, c, batch_size=s.n_total, epsilon=0.1)),
        ("austere m>N", lambda r, s, c: austere_test(r, s, c, batch_size=10**6, epsilon=0.1)),
        ("austere eps=0", lambda r, s, c: austere_test(r, s, c, batch_size=37, epsilon=0.0)),
        ("mhsublhd b=N", lambda r, s, c: mhsublhd_test(r, s, c, batch_size=s.n_total)),
        ("mhsublhd reaches N", lambda r, s, c: mhsublhd_test(r, s, c, batch_size=20)),
        ("exact", lambda r, s, c: exact_test(r, s, c)),
    ],
)
def test_full_data_gives_the_exact_decision_for_the_same_u(name, run):
    decisions = []
    for i, values, c in exact_cases():
        rng = np.random.default_rng(500 + i)
        log_u, mu0 = same_u(rng, values.size, c)
        source = RecordingSource(values, np.random.default_rng(i))
        source.start_step()
        out = run(rng, source, c)
        assert out.full_data and out.batch_size == values.size
        # the exact rule, computed directly: accept iff log u < Σ l_i + c
        assert out.accepted == (log_u < values.sum() + c), (name, i)
        assert out.accepted == (values.mean() > mu0)
        decisions.append(out.accepted)
        # and the same decision as the exact test run from the same generator state
        twin = RecordingSource(values, np.random.default_rng(i))
        twin.start_step()
        assert exact_test(np.random.default_rng(500 + i), twin, c).accepted == out.accepted
    assert 10 < sum(decisions) < 70


def test_austere_statistics_by_hand():
    values = gaussian_values(4000, 11)
    rng = np.random.default_rng(12)
    source = RecordingSource(values, np.random.default_rng(13))
    source.start_step()
    c = data_free_for(rng, values.size, values.mean() - 2e-4)
    out = austere_test(rng, source, c, batch_size=100, epsilon=0.05)
    used = values[source.step_rows()]
    n = used.size
    assert n == out.batch_size == 100 * out.rounds and not out.full_data
    s = used.std(ddof=1) / math.sqrt(n) * math.sqrt(1 - (n - 1) / (values.size - 1))
    t = (used.mean() - out.mu0) / s
    assert out.mean == pytest.approx(used.mean(), rel=1e-12)
    assert out.std_error == pytest.approx(s, rel=1e-9)
    assert out.t_statistic == pytest.approx(t, rel=1e-9)
    assert out.p_value == pytest.approx(stats.t.sf(abs(t), n - 1), rel=1e-9)
    assert out.p_value < 0.05 and out.accepted == (used.mean() > out.mu0)
    assert out.epsilon == 0.05 and out.design_batch_size == 100
    assert math.isnan(out.mu_std) and out.design_feasible and out.extra_evaluations == 0
    if out.rounds > 1:  # the previous round did not stop
        prev = used[: n - 100]
        s_prev = prev.std(ddof=1) / math.sqrt(n - 100) * math.sqrt(
            1 - (n - 101) / (values.size - 1)
        )
        assert stats.t.sf(abs(prev.mean() - out.mu0) / s_prev, n - 101) >= 0.05


# ------------------------------------------------------------------ rows and growth
def test_rows_grow_as_specified_and_never_repeat():
    n = 1037
    values = gaussian_values(n, 21)
    for fresh in (False, True):
        source = RecordingSource(values, np.random.default_rng(22), fresh=fresh)
        rng = np.random.default_rng(23)
        table = design_table(n, 0.2, batch_sizes=(50, 100), epsilons=(0.05, 0.2))
        gamma = 1.5
        for step in range(300):
            kind = step % 4
            c = data_free_for(rng, n, values.mean() + rng.normal(0, 1e-3))
            source.start_step()
            full_before = source.full_passes
            if kind == 0:
                out = austere_test(rng, source, c, batch_size=100, epsilon=0.05)
                m = 100
            elif kind == 1:
                out = austere_nc_test(rng, source, c, design_table=table)
                m = out.design_batch_size
            elif kind == 2:
                out = mhsublhd_test(rng, source, c, batch_size=30, gamma=gamma, delta=0.2)
            else:
                out = exact_test(rng, source, c)
            rows = source.step_rows()
            assert rows.size == out.batch_size <= n
            assert np.unique(rows).size == rows.size, "a row was read twice in one step"
            sizes = [r.size for r in source.steps[-1]]
            assert len(sizes) == out.rounds
            if kind in (0, 1):
                assert all(k == m for k in sizes[:-1])
                assert sizes[-1] == min(m, n - sum(sizes[:-1]))
            elif kind == 2:
                cum = np.cumsum(sizes)
                assert cum[0] == 30
                for a, b in zip(cum[:-1], cum[1:], strict=True):
                    assert b == min(n, math.ceil(gamma * a))
            # full passes are counted, and only where the test needs one
            passes = source.full_passes - full_before
            assert passes == (1 if kind in (1, 2) else 0)
            assert out.extra_evaluations == passes * n


def test_same_seed_same_outcome():
    values = gaussian_values(3000, 31)
    table = design_table(3000, 0.1, batch_sizes=(50, 200), epsilons=(0.01, 0.1))

    def run():
        rng = np.random.default_rng(32)
        source = ArraySource(values, rng=np.random.default_rng(33))
        outs = []
        for _ in range(40):
            c = float(rng.normal(-3.0, 3.0))
            for test in (
                lambda c=c: austere_test(rng, source, c, batch_size=50, epsilon=0.05),
                lambda c=c: austere_nc_test(rng, source, c, design_table=table),
                lambda c=c: mhsublhd_test(rng, source, c, batch_size=50),
                lambda c=c: exact_test(rng, source, c, test="barker"),
            ):
                source.start_step()
                outs.append(repr(test()))
        return outs

    first, second = run(), run()
    assert first == second
    assert len(set(first)) > 100


# ------------------------------------------------------------- non-finite values
@pytest.mark.parametrize("bad, fault", [(math.nan, True), (math.inf, True), (-math.inf, False)])
def test_nonfinite_ratios_reject(bad, fault):
    n = 400
    values = gaussian_values(n, 41)
    values[np.random.default_rng(42).integers(n)] = bad
    table = design_table(n, 0.2, batch_sizes=(50,), epsilons=(0.1,))
    runs = {
        "austere": lambda r, s: austere_test(r, s, 5.0, batch_size=n, epsilon=0.05),
        "nc": lambda r, s: austere_nc_test(r, s, 5.0, design_table=table),
        "mhsublhd": lambda r, s: mhsublhd_test(r, s, 5.0, batch_size=n),
        "mhsublhd C given": lambda r, s: mhsublhd_test(r, s, 5.0, batch_size=n, range_bound=1.0),
        "exact": lambda r, s: exact_test(r, s, 5.0),
        "exact barker": lambda r, s: exact_test(r, s, 5.0, test="barker"),
    }
    for name, run in runs.items():
        source = RecordingSource(values, np.random.default_rng(43))
        source.start_step()
        out = run(np.random.default_rng(44), source)
        assert not out.accepted, name
        assert out.nonfinite == fault, name
        assert out.batch_size <= n and out.extra_evaluations in (0, n)


@pytest.mark.parametrize("c, fault", [(math.nan, True), (math.inf, True), (-math.inf, False)])
def test_nonfinite_data_free_rejects_without_data(c, fault):
    values = gaussian_values(100, 45)
    table = design_table(100, 0.2, batch_sizes=(50,), epsilons=(0.1,))
    for run in (
        lambda r, s: austere_test(r, s, c, batch_size=10, epsilon=0.05),
        lambda r, s: austere_nc_test(r, s, c, design_table=table),
        lambda r, s: mhsublhd_test(r, s, c, batch_size=10),
        lambda r, s: exact_test(r, s, c),
    ):
        source = RecordingSource(values, np.random.default_rng(46))
        source.start_step()
        out = run(np.random.default_rng(47), source)
        assert not out.accepted and out.nonfinite == fault
        assert out.batch_size == 0 and source.rows_drawn == 0 and source.full_passes == 0


# ------------------------------------------------------------------------ MHSubLhd
def test_bernstein_bound_formula():
    std, n, big_n, dk, c_range = 0.7, 120, 1000, 0.004, 2.5
    log_term = math.log(3 / dk)
    plain = std * math.sqrt(2 * log_term / n) + 6 * c_range * log_term / n
    assert bernstein_bound(std, n, big_n, dk, c_range, bernstein_serfling=False) == pytest.approx(
        plain
    )
    rho = 1 - (n - 1) / big_n
    serfling = std * math.sqrt(rho * 2 * log_term / n) + 6 * c_range * log_term / n
    assert bernstein_bound(std, n, big_n, dk, c_range) == pytest.approx(serfling)


def test_mhsublhd_statistics_and_range_bound():
    values = gaussian_values(5000, 51)
    c_true = values.max() - values.min()
    for range_bound, extra in ((None, 5000), (2 * c_true, 0), (lambda: 3 * c_true, 0)):
        rng = np.random.default_rng(52)
        c = data_free_for(rng, values.size, values.mean() - 5e-3)
        source = RecordingSource(values, np.random.default_rng(53))
        source.start_step()
        out = mhsublhd_test(rng, source, c, batch_size=40, delta=0.05, range_bound=range_bound)
        assert out.extra_evaluations == extra and source.full_passes == (1 if extra else 0)
        expected_c = c_true if range_bound is None else (
            range_bound() if callable(range_bound) else range_bound
        )
        assert out.range_bound == pytest.approx(expected_c)
        used = values[source.step_rows()]
        k = out.rounds
        delta_k = 0.05 * (2 - 1) / (2 * k**2)
        assert out.delta_k == pytest.approx(delta_k)
        assert out.std == pytest.approx(used.std(), rel=1e-9)
        if not out.full_data:
            bound = bernstein_bound(used.std(), used.size, 5000, delta_k, expected_c)
            assert out.bound == pytest.approx(bound, rel=1e-9)
            assert abs(used.mean() - out.psi) > out.bound
        assert out.accepted == (used.mean() > out.psi)
    with pytest.raises(ValueError):
        mhsublhd_test(rng, source, 0.0, batch_size=10, gamma=1.0)
    with pytest.raises(ValueError):
        mhsublhd_test(rng, source, 0.0, batch_size=10, range_bound=-1.0)


@pytest.mark.parametrize("kind", ["gaussian", "lognormal", "two-point"])
def test_mhsublhd_error_below_delta(kind):
    n, delta, trials = 5000, 0.1, 500
    rng = np.random.default_rng(61)
    values = {
        "gaussian": rng.normal(size=n),
        "lognormal": rng.lognormal(0.0, 1.0, size=n),
        "two-point": np.where(rng.random(n) < 0.5, -1.0, 1.0),
    }[kind] * 0.01
    # the binomial 99.9% quantile at rate δ
    limit = stats.binom.ppf(0.999, trials, delta) / trials
    usage = []
    for i, mu_std in enumerate((0.5, 5.0, 100.0, -100.0)):
        rate, rows = mismatch_rate(mhsublhd_test, values, mu_std, trials, 70 + i,
                                   batch_size=50, delta=delta)
        assert rate <= limit, (kind, mu_std, rate)
        usage.append(rows.mean())
    assert usage[2] < 0.8 * n  # far from the threshold it does stop early


# ------------------------------------------------------------ the dynamic program
@pytest.mark.parametrize(
    "n_total, m, eps",
    [(5000, 100, 0.05), (2000, 50, 0.01), (1000, 300, 0.2), (40000, 400, 0.01)],
)
def test_dynamic_program_matches_simulation(n_total, m, eps):
    """Figure 10 of the appendix: error and data usage vs μ_std, DP against simulation."""
    mus = np.array([0.0, 0.7, 2.5, 6.0, -2.5])
    props = sequential_test_error(mus, m, eps, n_total)
    rng = np.random.default_rng(80)
    paths = 40_000 if n_total > 10_000 else 100_000
    for k, mu in enumerate(mus):
        error, used = simulate_walk(mu, m, eps, n_total, paths, rng)
        e = props.error[k]
        tol = 4 * math.sqrt(max(e * (1 - e), 1e-6) / paths) + 2e-3 * e
        assert abs(error - e) < tol, (mu, error, e)
        frac = used.mean() / n_total
        tol = 4 * used.std() / n_total / math.sqrt(paths) + 2e-3 * frac
        assert abs(frac - props.expected_fraction[k]) < tol, (mu, frac, props.expected_fraction[k])
    # eq. 20 and the symmetry of the error
    assert props.error[0] == pytest.approx((1 - props.full_data_probability[0]) / 2, abs=1e-12)
    assert props.error[2] == pytest.approx(props.error[4], rel=1e-12)
    assert np.all(np.diff(props.error[:4]) < 0)  # decreasing in |μ_std|
    np.testing.assert_allclose(props.stop_probability.sum(axis=-1), 1.0, atol=2e-3)


def test_dynamic_program_discretisation_converges():
    mus = [0.0, 1.0, 4.0]
    coarse = sequential_test_error(mus, 50, 0.01, 5000, max_cell=0.02)
    fine = sequential_test_error(mus, 50, 0.01, 5000, max_cell=0.005)
    default = sequential_test_error(mus, 50, 0.01, 5000)
    assert fine.bins > default.bins > coarse.bins
    np.testing.assert_allclose(default.error, fine.error, rtol=2e-3)
    np.testing.assert_allclose(default.expected_fraction, fine.expected_fraction, rtol=2e-3)
    # second order: the default cell (0.01) is about 4x closer than 0.02
    err_coarse = np.abs(coarse.expected_fraction - fine.expected_fraction)
    err_default = np.abs(default.expected_fraction - fine.expected_fraction)
    assert np.all(err_default < 0.5 * err_coarse + 1e-9)


def test_dynamic_program_edge_cases():
    one = sequential_test_error([0.0, 3.0], 500, 0.05, 400)  # m ≥ N: one exact test
    assert one.max_tests == 1
    np.testing.assert_array_equal(one.error, 0.0)
    np.testing.assert_array_equal(one.expected_rows, 400.0)
    inf = sequential_test_error([np.inf, -np.inf], 100, 0.05, 1000)
    np.testing.assert_array_equal(inf.error, 0.0)
    np.testing.assert_array_equal(inf.expected_rows, 100.0)
    worst = worst_case_error(100, 0.05, 5000)
    assert worst.error.shape == () and 0.0 < float(worst.error) < 0.5
    with pytest.raises(ValueError):
        sequential_test_error(np.nan, 100, 0.05, 1000)
    assert batch_schedule(40, 100).tolist() == [40, 80, 100]


def test_dynamic_program_matches_the_authors_table():
    """E_worst and E[j'] for N = 13000, tabulated with the authors' program (Korattikara
    et al.'s code, as used by Seita et al. 2017; DanielTakeshi/New_MH_Test, MATLAB_files):
    rows ε = 0.01, 0.05; columns m = 50, 250, 500."""
    authors_error = {0.01: (0.18735, 0.12337, 0.094580), 0.05: (0.43297, 0.35615, 0.30469)}
    authors_tests = {0.01: (203.06, 44.736, 23.260), 0.05: (94.586, 27.534, 16.045)}
    for eps, errors in authors_error.items():
        for m, e, j in zip((50, 250, 500), errors, authors_tests[eps], strict=True):
            props = worst_case_error(m, eps, 13000)
            assert float(props.error) == pytest.approx(e, rel=5e-3)
            assert float(props.expected_tests) == pytest.approx(j, rel=2e-3)


# ------------------------------------------------------------ AustereMH statistics
@pytest.mark.parametrize(
    "n, m, eps, mu_std",
    [(2000, 50, 0.01, 0.5), (2000, 50, 0.01, -2.0), (5000, 100, 0.05, 0.5), (5000, 250, 0.05, 4.0)],
)
def test_austere_error_matches_dynamic_program_gaussian(n, m, eps, mu_std):
    trials = 2500
    values = gaussian_values(n, 90)
    rate, rows = mismatch_rate(austere_test, values, mu_std, trials, 91, batch_size=m,
                               epsilon=eps)
    props = sequential_test_error(mu_std, m, eps, n)
    e = float(props.error)
    assert abs(rate - e) < 4 * math.sqrt(e * (1 - e) / trials) + 2e-3, (rate, e)
    frac = float(props.expected_fraction)
    assert abs(rows.mean() / n - frac) < 4 * rows.std() / n / math.sqrt(trials) + 5e-3


def test_austere_skewed_population_errors_cancel_over_signs():
    """Right-skewed l_i (exponential): the t statistic is skewed, so the error exceeds the
    dynamic program's on one side and falls short on the other; their average, which is
    what the acceptance probability integrates over u, stays within the prediction."""
    n, m, eps, mu = 5000, 250, 0.05, 1.0
    trials = 2500
    values = np.random.default_rng(92).exponential(0.01, size=n)
    plus, _ = mismatch_rate(austere_test, values, mu, trials, 93, batch_size=m, epsilon=eps)
    minus, _ = mismatch_rate(austere_test, values, -mu, trials, 94, batch_size=m, epsilon=eps)
    e = float(sequential_test_error(mu, m, eps, n).error)
    se = math.sqrt(e * (1 - e) / trials)
    assert abs(0.5 * (plus + minus) - e) < 4 * se / math.sqrt(2) + 2e-3
    assert plus > e > minus  # the skew shifts the error towards μ_std > 0


def test_austere_heavy_skew_exceeds_the_prediction():
    """The limit of the CLT model (documented, not a bug): lognormal l_i and m = 50 give an
    error several times the dynamic program's."""
    n, m, eps, mu = 2000, 50, 0.01, 2.0
    trials = 1500
    values = np.random.default_rng(95).lognormal(0.0, 1.0, size=n) * 0.01
    rate, _ = mismatch_rate(austere_test, values, mu, trials, 96, batch_size=m, epsilon=eps)
    e = float(sequential_test_error(mu, m, eps, n).error)
    assert rate > 2.5 * e + 4 * math.sqrt(e / trials)


# ----------------------------------------------------------------------- designs
def test_conservative_design_is_the_optimal_feasible_grid_member():
    n, bound = 13000, 0.1
    design = conservative_design(n, bound)
    table = {
        (m, e): worst_case_error(m, e, n) for m in DEFAULT_BATCH_SIZES for e in DEFAULT_EPSILONS
    }
    assert (design.batch_size, design.epsilon) in table
    props = table[design.batch_size, design.epsilon]
    assert design.error == pytest.approx(float(props.error)) and design.error <= bound
    assert design.expected_rows == pytest.approx(float(props.expected_rows))
    feasible = [float(p.expected_rows) for p in table.values() if float(p.error) <= bound]
    assert design.expected_rows == pytest.approx(min(feasible))
    assert design.feasible and design.mu_std == 0.0
    # Seita et al. (2017), Table 5, MNIST-13k: bound 0.1 gave m = 450, ε = 0.01.
    assert (design.batch_size, design.epsilon) == (450, 0.01)


def test_conservative_design_reproduces_seita_mnist_100k():
    # Seita et al. (2017), Table 5, MNIST-100k: bound 0.2 gave m = 300, ε = 0.01.
    design = conservative_design(100_000, 0.2)
    assert (design.batch_size, design.epsilon) == (300, 0.01)


def test_conservative_design_without_feasible_member_raises():
    with pytest.raises(ValueError, match="no design on the grid"):
        conservative_design(13000, 0.005)
    small = conservative_design(13000, 0.02, batch_sizes=(50, 500), epsilons=(0.001,))
    assert (small.batch_size, small.epsilon) == (500, 0.001)


def test_adaptive_design_table():
    n, bound = 3000, 0.02
    sizes, eps = (50, 150, 300), (0.005, 0.05, 0.2)
    table = design_table(n, bound, sizes, eps)
    assert design_table(n, bound, sizes, eps) is table  # cached
    rng = np.random.default_rng(100)
    mus = np.concatenate([[0.0, 1e-3, 300.0], rng.lognormal(0.5, 1.5, size=20)])
    designs = [table.choose(mu) for mu in mus]
    grid_mus = np.array([d.mu_std for d in designs])
    # every design of the grid, at the actual μ_std and at the grid value read
    props = {
        (m, e): sequential_test_error(np.concatenate([mus, grid_mus]), m, e, n)
        for m in sizes
        for e in eps
    }
    k = mus.size
    for i, (mu, design) in enumerate(zip(mus, designs, strict=True)):
        assert table.choose(-mu) == design
        assert design.mu_std <= abs(mu)
        mine = props[design.batch_size, design.epsilon]
        assert design.error == pytest.approx(mine.error[k + i], rel=1e-9, abs=1e-15)
        assert design.expected_rows == pytest.approx(mine.expected_rows[k + i], rel=1e-9)
        # the error at the actual μ_std is at most the tabulated one
        assert mine.error[i] <= design.error + 1e-12
        errors = np.array([p.error[k + i] for p in props.values()])
        rows = np.array([p.expected_rows[k + i] for p in props.values()])
        if design.feasible:
            assert design.error <= bound
            # the cheapest of the feasible designs at the grid value
            assert design.expected_rows == pytest.approx(rows[errors <= bound].min(), rel=1e-9)
        else:
            assert not np.any(errors <= bound)
            assert design.error == pytest.approx(errors.min())
    # E_worst ≥ 0.03 for every design at N = 3000: the most accurate one, flagged
    worst = table.choose(0.0)
    assert not worst.feasible and (worst.batch_size, worst.epsilon) == (300, 0.005)
    assert table.feasible[-1] and not table.feasible[0]
    assert table.choose(1e9).expected_rows == pytest.approx(50.0)
    assert adaptive_design(7.0, n, bound, sizes, eps) == table.choose(7.0)


def test_austere_nc_test_counts_the_full_pass_and_respects_the_bound():
    n, bound, trials = 2000, 0.05, 600
    table = design_table(n, bound, batch_sizes=(50, 100, 200), epsilons=(0.01, 0.05, 0.2))
    values = gaussian_values(n, 110)
    mu, sd = values.mean(), values.std()
    rng = np.random.default_rng(111)
    source = RecordingSource(values, np.random.default_rng(112), fresh=True)
    wrong = 0
    sizes = set()
    for _ in range(trials):
        # thresholds spread over a few standard errors of the mean around μ
        c = data_free_for(rng, n, mu + rng.normal(0.0, 3.0) * sd / math.sqrt(n))
        passes = source.full_passes
        source.start_step()
        out = austere_nc_test(rng, source, c, design_table=table)
        assert source.full_passes == passes + 1 and out.extra_evaluations == n
        assert out.batch_size == source.step_rows().size
        assert out.mu_std == pytest.approx(standardised_mean(mu, out.mu0, sd, n), rel=1e-9)
        design = table.choose(out.mu_std)
        assert (out.design_batch_size, out.epsilon) == (design.batch_size, design.epsilon)
        assert out.design_feasible == design.feasible
        wrong += out.accepted != (mu > out.mu0)
        sizes.add(out.design_batch_size)
    assert len(sizes) > 1
    assert wrong / trials <= stats.binom.ppf(0.999, trials, bound) / trials
    with pytest.raises(ValueError, match="design table is for N"):
        austere_nc_test(rng, RecordingSource(values[:100], rng), 0.0, design_table=table)


def test_standardised_mean():
    assert standardised_mean(1.0, 0.5, 2.0, 101) == pytest.approx(0.5 * 10 / 2)
    assert standardised_mean(1.0, 1.0, 0.0, 101) == 0.0
    assert standardised_mean(0.0, 1.0, 0.0, 101) == -math.inf
