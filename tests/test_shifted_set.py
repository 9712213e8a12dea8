"""The set of the per-row-quantity control variates: rows of the levels with little
information, expanded around their level's own shift (``estimators/predictor_set.py``,
``estimators/predictor_shift.py``).

On crossed random intercepts whose second factor has levels down to one row, the
estimator must stay exact in law: its data-free part (which holds the levels' tables)
plus the sum of all N per-row values is the exact log acceptance ratio at every pair
(θ, θ′), at any temperature and after a re-centring; the set's residuals are far smaller
than those of the expansion around θ̂ (what the tables are for); the surrogate posterior's
difference is the data-free part, with the gradient of its value; and no row is read
besides the test's.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest
from pytensor.graph.traversal import graph_inputs
from scipy.special import expit

from pymc_minibatch_mh import MinibatchBarker
from pymc_minibatch_mh.estimators import predictor_set
from pymc_minibatch_mh.estimators.predictor_set import SHIFTED_LEVEL_ROWS, SHIFTED_ROWS_MAX_SHARE
from pymc_minibatch_mh.model.compat import group

N = 3000


def crossed_model(n=N, seed=5):
    rng = np.random.default_rng(seed)
    # Factor 2: a few large levels and a tail of levels with 1-30 rows.
    small = np.repeat(np.arange(10, 40), np.arange(1, 31))
    g2 = rng.permutation(np.concatenate([rng.integers(10, size=n - small.size), small]))
    g1 = rng.integers(6, size=n)
    x = rng.normal(size=n)
    eta = -0.3 + 0.5 * rng.normal(size=6)[g1] + 0.8 * rng.normal(size=40)[g2] + 0.5 * x
    y = (rng.random(n) < expit(eta)).astype(np.int64)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 2.5)
        s1 = pm.HalfNormal("s1", 1.0)
        s2 = pm.HalfNormal("s2", 1.0)
        z1 = pm.Normal("z1", 0.0, 1.0, shape=6)
        z2 = pm.Normal("z2", 0.0, 1.0, shape=40)
        b = pm.Normal("b", 0.0, 1.0)
        pm.Bernoulli("y", logit_p=mu + s1 * z1[g1] + s2 * z2[g2] + b * x, observed=y)
    return model, g2


@pytest.fixture(scope="module")
def crossed():
    model, g2 = crossed_model()
    with model:
        step = MinibatchBarker(control_variate="taylor")
    return model, g2, step


def _pair(step, seed):
    cv = step.control_variate
    rng = np.random.default_rng(seed)
    theta = cv.reference.theta
    sd = np.sqrt(np.diag(cv.laplace_covariance()))
    return theta + sd * rng.normal(size=theta.size), theta + sd * rng.normal(size=theta.size)


def _exact_delta(step, x, x_prop):
    lik = step.likelihood
    return (lik.full_loglik(x_prop).sum() - lik.full_loglik(x).sum()
            + lik.prior(x_prop) - lik.prior(x))


def test_the_small_levels_form_the_set(crossed):
    _, g2, step = crossed
    cv = step.control_variate
    assert cv.name == "taylor_predictor"
    sizes = np.bincount(g2)
    # Levels of fewer than SHIFTED_LEVEL_ROWS rows, smallest first, within the budget of
    # SHIFTED_ROWS_MAX_SHARE · N = 300 rows: the levels of 1 to 24 rows (300 rows).
    assert SHIFTED_LEVEL_ROWS > 30 and SHIFTED_ROWS_MAX_SHARE * N == 300
    expected = np.flatnonzero(sizes[g2] <= 24)
    np.testing.assert_array_equal(cv.set_positions, expected)
    assert cv.set_rows == expected.size == sum(range(1, 25))


def test_a_level_is_chosen_by_its_information_not_its_rows():
    """Two levels of 80 rows, above SHIFTED_LEVEL_ROWS: the one with 2 positive outcomes has
    the information of about 10 average rows and is in the set; the one with balanced
    outcomes is not. A rule by row counts leaves both out."""
    rng = np.random.default_rng(11)
    n = 3000
    tail = np.repeat(np.arange(12, 22), np.arange(1, 11))  # levels of 1-10 rows
    sparse, balanced = np.full(80, 10), np.full(80, 11)
    g = rng.permutation(np.concatenate(
        [rng.integers(10, size=n - tail.size - 160), sparse, balanced, tail]))
    x = rng.normal(size=n)
    y = (rng.random(n) < expit(-0.3 + 0.5 * x)).astype(np.int64)
    y[g == 10] = 0
    y[np.flatnonzero(g == 10)[:2]] = 1
    y[g == 11] = np.arange(80) % 2
    with pm.Model():
        mu = pm.Normal("mu", 0.0, 2.5)
        s = pm.HalfNormal("s", 1.0)
        z = pm.Normal("z", 0.0, 1.0, shape=22)
        b = pm.Normal("b", 0.0, 1.0)
        pm.Bernoulli("y", logit_p=mu + s * z[g] + b * x, observed=y)
        cv = MinibatchBarker(control_variate="taylor").control_variate
    chosen = np.zeros(n, dtype=bool)
    chosen[cv.set_positions] = True
    assert chosen[g == 10].all() and not chosen[g == 11].any()
    assert chosen[g >= 12].all() and not chosen[g < 10].any()
    # The sparse level's information, in average rows, is below the threshold.
    slices = [sl for t, sl in zip(cv.analysis.terms, cv.analysis.slices, strict=True)
              if t.kind == "index"]
    weights = predictor_set.average_rows(-np.diag(cv.reference.coef_hessian)[slices[0]],
                                         np.bincount(g), n)
    assert weights[10] < 0.5 * SHIFTED_LEVEL_ROWS < SHIFTED_LEVEL_ROWS < weights[11]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_data_free_part_plus_all_values_is_the_exact_ratio(crossed, seed):
    _, g2, step = crossed
    cv = step.control_variate
    cv.start_chain(np.random.default_rng(seed), 50)
    x, x_prop = _pair(step, seed)
    for inv_t in (1.0, 0.25):
        data_free = cv.open(x, x_prop, np.array(inv_t), 0.0, 50)
        values = cv.full_pass()
        cv.close(1)
        exact = _exact_delta(step, x, x_prop)
        # Tempering applies to the likelihood only.
        prior = step.likelihood.prior(x_prop) - step.likelihood.prior(x)
        assert data_free + values.sum() == pytest.approx(prior + inv_t * (exact - prior),
                                                         abs=1e-8)
        # Every row is left to the minibatch.
        assert np.count_nonzero(values) > N - 10


@pytest.fixture(scope="module")
def around_hat():
    """The same model's expansion with every row expanded around θ̂ (no set)."""
    model, _ = crossed_model()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(predictor_set, "SHIFTED_LEVEL_ROWS", 0)
        with model:
            step = MinibatchBarker(control_variate="taylor")
    assert step.control_variate.set_rows == 0
    return step


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_move_of_the_small_levels_leaves_their_rows_no_residual(crossed, around_hat, seed):
    """The point of the tables: when only the set's levels move (two Laplace sds, as a
    few-row level's effect does), each row's expansion follows its level's shift and its
    residual is the interpolation's error alone; around θ̂ the same rows carry residuals
    of order 1. A grid that does not follow the shift fails this."""
    _, _, step = crossed
    cv, cv0 = step.control_variate, around_hat.control_variate
    np.testing.assert_allclose(cv0.reference.theta, cv.reference.theta)
    theta = cv.reference.theta
    sd = np.sqrt(np.diag(cv.laplace_covariance()))
    z2 = next(e for e in step.likelihood.point_map.entries if e.name == "z2")
    small = slice(z2.start + 10, z2.start + 34)  # the levels of 1-24 rows
    rng = np.random.default_rng(seed)
    x, x_prop = theta.copy(), theta.copy()
    x[small] += 2.0 * sd[small] * rng.normal(size=24)
    x_prop[small] += 2.0 * sd[small] * rng.normal(size=24)
    squares = []
    for estimator in (cv, cv0):
        estimator.start_chain(np.random.default_rng(seed), 50)
        data_free = estimator.open(x, x_prop, np.array(1.0), 0.0, 50)
        values = estimator.full_pass()
        estimator.close(1)
        assert data_free + values.sum() == pytest.approx(_exact_delta(step, x, x_prop),
                                                         abs=1e-8)
        squares.append(np.sum(values ** 2))
    assert squares[0] < 1e-4 < 1.0 < squares[1], squares


def test_the_surrogate_includes_the_set(crossed):
    _, _, step = crossed
    cv = step.control_variate
    cv.start_chain(np.random.default_rng(3), 50)
    x, x_prop = _pair(step, 3)
    lik = step.likelihood
    data_free = cv.open(x, x_prop, np.array(1.0), 0.0, 50)
    cv.close(1)
    prior = lik.prior(x_prop) - lik.prior(x)
    # The data-free part is the surrogate's difference: a move the surrogate makes
    # exactly is tested on the residuals alone.
    post = step.surrogate_posterior()
    assert data_free == pytest.approx(post.log_density(x_prop) - post.log_density(x),
                                      abs=1e-8)
    assert data_free - prior == pytest.approx(cv.proxy_value(x_prop) - cv.proxy_value(x),
                                              abs=1e-8)
    # Its gradient is the gradient of its value.
    h = 1e-6
    e = np.eye(x.size)
    numeric = np.array([(cv.proxy_value(x + h * e[j]) - cv.proxy_value(x - h * e[j])) / (2 * h)
                        for j in range(x.size)])
    np.testing.assert_allclose(cv.proxy_gradient(x), numeric, rtol=1e-5, atol=1e-5)


def test_the_set_follows_a_new_reference_point(crossed):
    """Re-centring moves θ̂: the set's tables (built from q̂_i) and the sums of the other
    rows must move with it (stale ones break both identities)."""
    _, _, step = crossed
    cv = step.control_variate
    cv.start_chain(np.random.default_rng(4), 50)
    x, x_prop = _pair(step, 4)
    lik = step.likelihood
    # What a re-centring does (TaylorEstimator.maybe_recenter).
    cv._set_reference(cv.passes.reference_at(x, what="re-centring point"))
    try:
        data_free = cv.open(x, x_prop, np.array(1.0), 0.0, 50)
        values = cv.full_pass()
        cv.close(1)
        assert data_free + values.sum() == pytest.approx(_exact_delta(step, x, x_prop),
                                                         abs=1e-8)
        prior = lik.prior(x_prop) - lik.prior(x)
        assert data_free - prior == pytest.approx(cv.proxy_value(x_prop) - cv.proxy_value(x),
                                                  abs=1e-8)
    finally:
        cv.start_chain(np.random.default_rng(0), 50)  # back to the set-up's θ̂
        assert cv.reference is cv.initial_reference


def test_without_small_levels_there_is_no_set(monkeypatch):
    # A level has some information (the logistic log-likelihood is strictly concave), so
    # none has less than 0 average rows.
    monkeypatch.setattr(predictor_set, "SHIFTED_LEVEL_ROWS", 0)
    model, _ = crossed_model()
    with model:
        step = MinibatchBarker(control_variate="taylor")
    assert step.control_variate.set_rows == 0
    x, x_prop = _pair(step, 4)
    cv = step.control_variate
    cv.start_chain(np.random.default_rng(4), 50)
    data_free = cv.open(x, x_prop, np.array(1.0), 0.0, 50)
    assert data_free + cv.full_pass().sum() == pytest.approx(_exact_delta(step, x, x_prop),
                                                             abs=1e-8)


def _set_variables(step):
    """Names of the set's shared variables read by the per-step function and by π̃."""
    def names(variables):
        return {v.name for v in variables if (v.name or "").startswith("shift_")}
    fn = step.control_variate.fn.fn
    return (names(fn.maker.fgraph.inputs),
            names(graph_inputs([step.surrogate_posterior().graph])))


def test_without_rows_in_the_set_its_terms_are_left_out(crossed, monkeypatch):
    """The set's terms are 0 without rows: the per-step function and the surrogate
    posterior are built without them (on bambi's ``(prestige|year)`` model they were a
    third of the per-step function's nodes and half its cost); with rows, both read the
    tables."""
    per_step, surrogate = _set_variables(crossed[2])
    assert "shift_L" in per_step and "shift_L" in surrogate
    monkeypatch.setattr(predictor_set, "SHIFTED_LEVEL_ROWS", 0)
    model, _ = crossed_model()
    with model:
        step = MinibatchBarker(control_variate="taylor")
    assert step.control_variate.set_rows == 0
    assert _set_variables(step) == (set(), set())


def test_the_surrogate_reads_no_rows(crossed):
    """The surrogate's levels come from tables: its NUTS reads no row, so a chain reads
    only the test's minibatches (extra_evaluations 0, without re-centring or audit)."""
    model, _, step = crossed
    assert step.proposal.name == "surrogate_nuts" and step.control_variate.set_rows > 0
    with model:
        idata = pm.sample(step=step, tune=3, draws=3, chains=1, cores=1, random_seed=2,
                          progressbar=False, compute_convergence_checks=False,
                          discard_tuned_samples=False)
    for name in ("warmup_sample_stats", "sample_stats"):
        assert int(group(idata, name)["extra_evaluations"].sum()) == 0


def test_the_surrogate_nuts_ratio_is_the_surrogates_difference(crossed):
    """log q(θ | θ′) − log q(θ′ | θ) = log π̃(θ) − log π̃(θ′), with π̃ from the step's
    surrogate posterior (not NUTS's density, which carries the centring's Jacobian)."""
    model, _, step = crossed
    proposal, post = step.proposal, step.surrogate_posterior()
    assert proposal.centring is not None
    rng = np.random.default_rng(7)
    proposal.start_chain(rng)
    state = proposal.init(post.laplace.theta_hat)
    assert state.log_density == pytest.approx(post.log_density(state.x), abs=1e-8)
    moved = 0
    for _ in range(10):
        new, info = proposal.propose(rng, state, 1.0)
        moved += not np.array_equal(new.x, state.x)
        assert info.log_q_ratio == pytest.approx(
            post.log_density(state.x) - post.log_density(new.x), abs=1e-8)
        state = new
    assert moved >= 3


def test_random_slopes_of_small_levels_stay_exact():
    """A level's term may scale its rows by a feature (``z[g] * x``, a random slope): the
    shift then moves each row by its own feature times the level's shift. With random
    intercepts and slopes of the same factor, a small level's rows would move by two
    shifts: they stay expanded around θ̂. The identity holds either way."""
    rng = np.random.default_rng(3)
    n = 2000
    small = np.repeat(np.arange(8, 20), np.arange(1, 13))
    g = rng.permutation(np.concatenate([rng.integers(8, size=n - small.size), small]))
    x = rng.normal(size=n)
    eta = -0.2 + 0.6 * rng.normal(size=20)[g] + (0.5 + 0.4 * rng.normal(size=20)[g]) * x
    y = (rng.random(n) < expit(eta)).astype(np.int64)
    for slopes_only in (False, True):
        with pm.Model():
            mu = pm.Normal("mu", 0.0, 2.5)
            b = pm.Normal("b", 0.0, 1.0)
            s_b = pm.HalfNormal("s_b", 1.0)
            z_b = pm.Normal("z_b", 0.0, 1.0, shape=20)
            eta = mu + (b + s_b * z_b[g]) * x
            if not slopes_only:
                s_a = pm.HalfNormal("s_a", 1.0)
                z_a = pm.Normal("z_a", 0.0, 1.0, shape=20)
                eta = eta + s_a * z_a[g]
            pm.Bernoulli("y", logit_p=eta, observed=y)
            step = MinibatchBarker(control_variate="taylor", proposal="mala")
        cv = step.control_variate
        assert cv.name == "taylor_predictor"
        assert cv.set_rows > 0 if slopes_only else cv.set_rows == 0
        _assert_exact_at_two_pairs(step)


def test_a_level_s_grid_stays_inside_the_quantity_s_support():
    """``Bernoulli(p=a[g])``: the quantity is a probability, and a grid of the level's
    spread either side of ``â_g`` leaves (0, 1), where ℓ is not finite. The grid is narrowed
    until its tables are finite, and the estimator stays exact."""
    rng = np.random.default_rng(0)
    n = 2000
    small = np.repeat(np.arange(8, 20), np.arange(1, 13))
    g = rng.permutation(np.concatenate([rng.integers(8, size=n - small.size), small]))
    y = (rng.random(n) < rng.beta(2.0, 2.0, size=20)[g]).astype(np.int64)
    with pm.Model():
        a = pm.Beta("a", 2.0, 2.0, shape=20)
        pm.Bernoulli("y", p=a[g], observed=y)
        step = MinibatchBarker(control_variate="taylor", proposal="mala")
    cv = step.control_variate
    assert cv.name == "taylor_predictor" and cv.set_rows > 0
    own = cv.shifted_set.tables.own.get_value()
    spacing = cv.shifted_set.tables.spacing.get_value()
    assert np.any(spacing < cv.shifted_set.spacing(own, cv.reference))  # narrowed
    tables = (cv.shifted_set.tables.loglik.get_value(), cv.shifted_set.tables.gradient.get_value())
    assert all(np.all(np.isfinite(t)) for t in tables)
    _assert_exact_at_two_pairs(step)


def _assert_exact_at_two_pairs(step):
    """The data-free part plus all N values is the exact Δ at two pairs (θ, θ′)."""
    cv = step.control_variate
    for seed in (0, 1):
        cv.start_chain(np.random.default_rng(seed), 50)
        x_cur, x_prop = _pair(step, seed)
        data_free = cv.open(x_cur, x_prop, np.array(1.0), 0.0, 50)
        values = cv.full_pass()
        cv.close(1)
        assert data_free + values.sum() == pytest.approx(_exact_delta(step, x_cur, x_prop),
                                                         abs=1e-8)


def test_rows_in_small_levels_of_two_terms_stay_expanded_around_the_reference():
    """Group intercepts and slopes ``a[g] + b[g] * x``, and crossed intercepts ``c[h]``.

    A row of a small level of ``g`` moves by two shifts (its intercept's and its
    slope's) and a table follows one: it stays outside the set, expanded around θ̂. (In
    the set, owned by its intercept's table, the 23 rows of an airline with an almost
    constant hour made one of two chains of the zoo's LKJ model settle at a slope sd of
    3.5 against 0.17: R-hat 1.83.) Its ``h`` level stays out with it: the per-step
    function finds a row's table by its level, and a level in the set with such a row
    would leave the estimator inexact. A row in a small level of ``h`` only is in the set.
    """
    rng = np.random.default_rng(7)
    n = 3000
    g = rng.permutation(np.concatenate([rng.integers(6, size=n - 18),
                                        np.full(6, 6), np.full(12, 7)]))
    small_h = np.repeat(np.arange(10, 20), np.arange(1, 11))  # levels of 1-10 rows
    h = rng.permutation(np.concatenate([rng.integers(10, size=n - small_h.size), small_h]))
    h[np.flatnonzero(g == 6)[:3]] = 19  # three rows in small levels of g and of h
    x = rng.normal(size=n)
    eta = (-0.3 + 0.6 * rng.normal(size=8)[g] + (0.5 + 0.4 * rng.normal(size=8)[g]) * x
           + 0.7 * rng.normal(size=20)[h])
    y = (rng.random(n) < expit(eta)).astype(np.int64)
    with pm.Model():
        mu = pm.Normal("mu", 0.0, 2.5)
        b = pm.Normal("b", 0.0, 1.0)
        s = pm.HalfNormal("s", 1.0, shape=3)
        za = pm.Normal("za", 0.0, 1.0, shape=8)
        zb = pm.Normal("zb", 0.0, 1.0, shape=8)
        zc = pm.Normal("zc", 0.0, 1.0, shape=20)
        pm.Bernoulli("y", logit_p=mu + s[0] * za[g] + (b + s[1] * zb[g]) * x + s[2] * zc[h],
                     observed=y)
        step = MinibatchBarker(control_variate="taylor", proposal="mala")
    cv = step.control_variate
    in_set = np.zeros(n, dtype=bool)
    in_set[cv.set_positions] = True
    assert not in_set[(g >= 6) | (h == 19)].any()
    assert in_set[(h >= 10) & (h < 19)].all()
    _assert_exact_at_two_pairs(step)
