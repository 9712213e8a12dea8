"""Each rule of the core has one home, and the callers get the home's numbers.

The rules: the finite-population variance ``s²`` of Δ*, the minibatch growth factor,
Barker's ``g`` and the exact decisions, the ``batch_size`` check, the per-step error
estimates of the threshold tests, and the correction table's error.
"""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pymc as pm
import pytest
from scipy import special

from pymc_minibatch_mh import AustereMH, MHSubLhd, MinibatchBarker, MinibatchGibbs
from pymc_minibatch_mh.core import austere, barker, common, exact, subsampling
from pymc_minibatch_mh.core.acceptance_error import threshold_error_estimate
from pymc_minibatch_mh.core.correction import get_correction
from pymc_minibatch_mh.core.logistic import (
    barker_accepts,
    barker_probabilities,
    barker_probability,
)
from pymc_minibatch_mh.core.moments import (
    delta_star_variance,
    finite_population_factor,
    mean_variance,
)
from pymc_minibatch_mh.core.source import ArraySource
from pymc_minibatch_mh.estimators import ratio

PACKAGE = Path(__file__).resolve().parent.parent / "pymc_minibatch_mh"


def package_trees():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text())


# ------------------------------------------------------------------- one home each
def test_each_rule_is_written_once():
    """``check_batch_size`` is defined once, 1.15 appears once, scipy's expit nowhere."""
    definitions, growth, expit = [], [], []
    for name, tree in package_trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name == "check_batch_size":
                definitions.append(name)
            if isinstance(node, ast.Constant) and node.value == 1.15:
                growth.append(name)
            if isinstance(node, ast.alias) and node.name == "expit":
                expit.append(name)
            if isinstance(node, ast.Attribute) and node.attr == "expit":
                expit.append(name)
    assert definitions == ["core/common.py"]
    assert growth == ["core/barker.py"]
    assert expit == []
    assert ratio.GROWTH_FACTOR is barker.GROWTH_FACTOR == 1.15


# --------------------------------------------------------------- s² of Δ* (rule 1)
@pytest.mark.parametrize(("b", "n_total"), [(2, 3), (10, 50), (49, 50), (50, 50), (7, 10**6)])
def test_delta_star_variance_is_the_formula_of_the_notes(b, n_total):
    values = np.random.default_rng(b).normal(size=b)
    m2 = float(((values - values.mean()) ** 2).sum())
    expected = n_total**2 * values.var(ddof=1) / b * (1 - (b - 1) / (n_total - 1))
    assert delta_star_variance(m2, b, n_total) == pytest.approx(expected, rel=1e-12, abs=0)
    assert mean_variance(m2, b, n_total) * n_total**2 == pytest.approx(expected, rel=1e-12)
    assert finite_population_factor(b, n_total) == 1 - (b - 1) / (n_total - 1)
    assert delta_star_variance(m2, 1, n_total) == math.inf
    assert delta_star_variance(m2, n_total, n_total) == 0.0


class RecordingSource(ArraySource):
    """An ArraySource that keeps the values it hands out in the step."""

    def start_step(self):
        super().start_step()
        self.drawn = []

    def draw_values(self, count):
        values = super().draw_values(count)
        self.drawn.append(np.array(values))
        return values


def test_every_test_uses_the_one_variance():
    """Barker's s² and AustereMH's standard error are the home's numbers for their rows."""
    rng = np.random.default_rng(3)
    n_total, b = 400, 40
    values = rng.normal(0.0, 0.01, size=n_total)  # s² ≈ 0.36 < σ² = 1 at b = 40
    source = RecordingSource(values, rng=rng)
    source.start_step()
    out = barker.barker_test(rng, source, 0.0, batch_size=b, correction=get_correction(1.0))
    used = np.concatenate(source.drawn)[: out.batch_size]
    assert not out.full_data and out.batch_size == b == used.size
    expected = n_total**2 * used.var(ddof=1) / b * (1 - (b - 1) / (n_total - 1))
    assert out.variance == pytest.approx(expected, rel=1e-12)
    source.start_step()
    a = austere.austere_test(rng, source, 0.0, batch_size=b, epsilon=0.49)
    used = np.concatenate(source.drawn)
    assert not a.full_data and a.batch_size == used.size
    n = used.size
    assert a.std_error**2 == pytest.approx(
        used.var(ddof=1) / n * (1 - (n - 1) / (n_total - 1)), rel=1e-12
    )
    # The t-test's p-value is the threshold estimate of the same rows (the same s).
    sd = float(used.std(ddof=1))
    assert threshold_error_estimate(a.mean, a.mu0, sd, n, n_total) == pytest.approx(
        a.p_value, rel=1e-9
    )


# --------------------------------------------------------- g and the exact decisions
def test_barker_function_has_one_implementation():
    x = np.array([-800.0, -40.0, -1.5, 0.0, 1e-9, 2.0, 40.0, 800.0])
    many = barker_probabilities(x.reshape(2, 4))
    assert many.shape == (2, 4)
    np.testing.assert_array_equal(many.ravel(), [barker_probability(v) for v in x])
    np.testing.assert_allclose(many.ravel(), special.expit(x), rtol=1e-15, atol=0)
    assert barker_probabilities(np.float64(0.3)).shape == ()
    assert math.isnan(barker_probability(math.nan))


def test_exact_rules():
    assert exact.full_data_delta(np.array([0.5, -0.25]), 1.0) == 1.25
    assert exact.full_data_delta(np.array([np.nan]), -math.inf) == -math.inf
    assert exact.exact_accept_probability(0.7) == barker_probability(0.7)
    assert exact.exact_accept_probability(-0.7, "metropolis") == math.exp(-0.7)
    assert exact.exact_accept_probability(0.7, "metropolis") == 1.0
    for bad in (math.nan, math.inf, -math.inf):
        assert exact.exact_accept_probability(bad) == 0.0
        assert exact.exact_accept_probability(bad, "metropolis") == 0.0
        assert not exact.metropolis_accepts(bad, 1.0, 0.0)
    assert exact.metropolis_accepts(0.0, 0.1, 0.0) and not exact.metropolis_accepts(0.0, 0.0, 0.0)
    # Barker's decision accepts with probability g(Δ) (binomial error, 5 sd).
    rng = np.random.default_rng(11)
    reps, delta = 20_000, 0.8
    rate = np.mean([barker_accepts(rng, delta) for _ in range(reps)])
    p = barker_probability(delta)
    assert abs(rate - p) < 5 * math.sqrt(p * (1 - p) / reps)


# -------------------------------------------------------------- batch_size (rule 4)
REFUSED = [(2.0, "positive integer.*float.*pass an int"), (True, "positive integer.*bool"),
           (np.float64(3.0), "positive integer"), ("10", "positive integer"),
           (0, "at least 1"), (-3, "at least 1")]


@pytest.mark.parametrize(("value", "match"), REFUSED)
def test_core_refuses_bad_batch_sizes(value, match):
    rng = np.random.default_rng(0)
    source = ArraySource(np.zeros(20), rng=rng)
    source.start_step()
    runs = {
        "check": lambda: common.check_batch_size(value),
        "barker": lambda: barker.barker_test(
            rng, source, 0.0, batch_size=value, correction=get_correction(1.0)
        ),
        "austere": lambda: austere.austere_test(
            rng, source, 0.0, batch_size=value, epsilon=0.05
        ),
        "mhsublhd": lambda: subsampling.mhsublhd_test(
            rng, source, 0.0, batch_size=value, range_bound=1.0
        ),
    }
    for name, run in runs.items():
        with pytest.raises(ValueError, match=f"batch_size must be.*{match}"):
            run()
        assert name


def test_core_accepts_integers():
    assert common.check_batch_size(np.int64(7)) == 7 and common.check_batch_size(1) == 1
    assert type(common.check_batch_size(np.int32(3))) is int


@pytest.mark.parametrize("value", [2.0, True])
@pytest.mark.parametrize("step", [MinibatchBarker, AustereMH, MHSubLhd, MinibatchGibbs])
def test_step_constructors_refuse_bad_batch_sizes(step, value):
    with pm.Model():
        if step is MinibatchGibbs:
            g = pm.Bernoulli("g", 0.5)
            pm.Normal("y", g, 1, observed=np.zeros(10))
        else:
            mu = pm.Normal("mu")
            pm.Normal("y", mu, 1, observed=np.zeros(10))
        with pytest.raises(ValueError, match="batch_size must be a positive integer"):
            step(batch_size=value)


# --------------------------------------------------------- error estimates (rule 5)
def test_error_estimates_of_the_threshold_tests():
    rng = np.random.default_rng(5)
    n_total = 300
    values = rng.normal(0.002, 0.05, size=n_total)
    shifted = rng.normal(0.12, 0.3, size=n_total)  # MHSubLhd stops short of N on these
    faulty = values.copy()
    faulty[::7] = np.nan
    cases = [(values, 0.0), (values, -0.3), (values, 0.4), (values, -math.inf),
             (faulty, 0.0), (shifted, 0.0), (shifted, 0.5)]
    kinds, partial = set(), []
    for data, c in cases:
        for b in (30, 150, 300):
            source = ArraySource(data, rng=rng)
            source.start_step()
            a = austere.austere_test(rng, source, c, batch_size=b, epsilon=0.05)
            new = austere.austere_error_estimate(a, n_total)
            # Its one home is the core function; here only what it must be:
            # 0 at full data, NaN without rows, else a probability (of a wrong decision
            # averaged over u, every look counted: tests/test_austere_error_estimate.py).
            if a.full_data:
                assert new == 0.0
            elif not a.batch_size or not math.isfinite(a.std_error):  # no rows, or NaN rows
                assert math.isnan(new)
            else:
                assert 0.0 < new <= 1.0
            source.start_step()
            m = subsampling.mhsublhd_test(rng, source, c, batch_size=b, range_bound=0.05)
            settings = dict(batch_size=b, delta=0.01, gamma=1.5, p=2.0)
            estimate = subsampling.mhsublhd_error_estimate(m, n_total, **settings)
            if m.full_data:
                assert estimate == 0.0
            elif not m.batch_size or not math.isfinite(m.bound):
                assert math.isnan(estimate)
            else:  # MHSubLhd's own guarantee, whatever the rows said
                assert estimate == subsampling.check_budget(n_total, **settings) < 0.01
            kinds.add((a.full_data, a.batch_size > 0, math.isnan(estimate)))
            if 0.0 < estimate < 0.5:
                partial.append(estimate)
    assert len(kinds) >= 3  # full data, partial data and rejections without rows
    assert partial  # some MHSubLhd estimates from a minibatch (neither 0 nor NaN)


# ------------------------------------------------------------ correction.error (6)
def test_the_correction_must_declare_its_error():
    class NoError:
        sigma = 1.0

        def sample(self, rng):
            return 0.0

    with pytest.raises(AttributeError, match="error"):
        barker.BarkerTest(10, NoError())

    class Declared(NoError):
        error = 0.25

    rng = np.random.default_rng(2)
    source = ArraySource(rng.normal(0.0, 1e-3, size=1000), rng=rng)
    source.start_step()
    out = barker.barker_test(rng, source, 0.0, batch_size=50, correction=Declared())
    assert not out.full_data and out.variance < 1.0
    assert out.error_estimate >= 0.25  # the table's error enters the estimate
