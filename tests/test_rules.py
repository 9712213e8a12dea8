"""Each rule of the core has one home, and the callers get the home's numbers.

The rules: the finite-population variance ``s²`` of Δ* (and its factor
``1 − (n − 1)/(N − 1)``), the minibatch growth factor, Barker's ``g`` and the exact
decisions, the ``batch_size`` check, the per-step error estimates of the threshold tests,
the correction table's error, and the second-order Taylor form of the control variates.
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
from pymc_minibatch_mh.core import austere, barker, calibration, common, exact, subsampling
from pymc_minibatch_mh.core.acceptance_error import threshold_error_estimate
from pymc_minibatch_mh.core.control_variate import second_order
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
from pymc_minibatch_mh.estimators.expansion import bilinear, inner

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


def _functions(tree):
    """``(function name, node)`` for every node inside a function (the innermost one)."""
    def visit(node, name):
        for child in ast.iter_child_nodes(node):
            inner_name = child.name if isinstance(child, ast.FunctionDef) else name
            yield inner_name, child
            yield from visit(child, inner_name)

    yield from visit(tree, None)


def _factors(node):
    """The factors of a product or quotient (signs dropped)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult | ast.Div):
        return _factors(node.left) + _factors(node.right)
    if isinstance(node, ast.UnaryOp):
        return _factors(node.operand)
    return [node]


def _is_half(node):
    return isinstance(node, ast.Constant) and node.value == 0.5


def _halves_added(node):
    """Whether ``node`` adds or subtracts a term with the factor ½, or chooses ½ as one.

    The shape of the Taylor form's ``½ aᵀHb`` joined to the other terms; a symmetrisation
    ``½ (H + Hᵀ)`` or an interpolation weight is not joined to anything.
    """
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub):
        return any(_is_half(f) for side in (node.left, node.right) for f in _factors(side))
    if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add | ast.Sub):
        return any(_is_half(f) for f in _factors(node.value))
    if isinstance(node, ast.IfExp):
        return _is_half(node.body) or _is_half(node.orelse)
    return False


def _is_population_minus(node):
    """``n_total − x`` with ``x`` not a constant: the rows not drawn, N − n."""
    return (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub)
            and not isinstance(node.right, ast.Constant)
            and (isinstance(node.left, ast.Name) and node.left.id == "n_total"
                 or isinstance(node.left, ast.Attribute) and node.left.attr == "n_total"))


def _is_minus_one(node):
    return (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub)
            and isinstance(node.right, ast.Constant) and node.right.value == 1)


def _finite_population_form(node):
    """``(n − 1)/(N − 1)``, or ``N − n`` as a factor of a product or quotient."""
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult | ast.Div)):
        return False
    if isinstance(node.op, ast.Div) and _is_minus_one(node.left) and _is_minus_one(node.right):
        return True
    return _is_population_minus(node.left) or _is_population_minus(node.right)


def test_taylor_form_and_finite_population_factor_are_written_once():
    """The second-order form ``v + gᵀa + ½ aᵀHb`` is evaluated by ``second_order`` alone
    (the core's, which the estimators' per-row expansions and the core's closed-form sums
    both call); the factor ``1 − (n − 1)/(N − 1)`` is written
    in ``core/moments.py`` only (the third cumulant's own factor
    ``(N − n)(N − 2n)/((N − 1)(N − 2))`` is another rule)."""
    taylor, population, definitions = set(), set(), []
    for name, tree in package_trees():
        for function, node in _functions(tree):
            if isinstance(node, ast.FunctionDef) and node.name == "second_order":
                definitions.append(name)
            if (name.startswith("estimators/") or name == "core/control_variate.py") \
                    and _halves_added(node):
                taylor.add((name, function))
            if _finite_population_form(node):
                population.add((name, function))
    assert definitions == ["core/control_variate.py"]
    assert taylor == {("core/control_variate.py", "second_order")}
    assert ("core/moments.py", "finite_population_factor") in population
    assert {hit for hit in population if hit[0] != "core/moments.py"} == {
        ("core/acceptance_error.py", "third_cumulant")}


def test_the_taylor_form_is_one_expression():
    """``second_order``, ``inner`` and ``bilinear`` give the expansion's numbers."""
    rng = np.random.default_rng(4)
    g, a, b = rng.normal(size=3), rng.normal(size=3), rng.normal(size=3)
    h = rng.normal(size=(3, 3))
    h = h + h.T
    h[0, 2] = h[2, 0] = 0.0  # a zero entry is left out
    entries = [(j, k, h[j, k]) for j in range(3) for k in range(j, 3) if h[j, k] != 0.0]
    assert inner(g, a) == pytest.approx(g @ a, rel=1e-14)
    assert bilinear(entries, a, b) == pytest.approx(a @ h @ b, rel=1e-12)
    assert second_order(g @ a, a @ h @ b, value=1.5) == pytest.approx(
        1.5 + g @ a + 0.5 * a @ h @ b, rel=1e-14)
    assert second_order(g @ a, a @ h @ b) == pytest.approx(g @ a + 0.5 * a @ h @ b, rel=1e-14)


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


@pytest.mark.parametrize(("b", "n_total"), [(1, 2), (2, 2), (3, 10), (50, 1000), (100, 10**6)])
def test_calibration_uses_the_finite_population_factor(b, n_total):
    """The mean of the calibration's control ``e₁²``, ``N S² (N − b)/b`` with ``S²`` the
    population's variance (divisor N − 1), is ``N² σ²/b`` times the home's factor."""
    population = np.random.default_rng(b).lognormal(size=n_total)
    factor = finite_population_factor(b, n_total)
    expected = n_total * population.var(ddof=1) * (n_total - b) / b
    assert n_total**2 * population.var() / b * factor == pytest.approx(expected, rel=1e-12,
                                                                        abs=0)


def test_calibration_calls_the_home(monkeypatch):
    """The calibration's ``e₁²`` control takes its factor from ``finite_population_factor``."""
    calls = []

    def recorded(n, big_n):
        calls.append((n, big_n))
        return finite_population_factor(n, big_n)

    monkeypatch.setattr(calibration, "finite_population_factor", recorded)
    values = np.random.default_rng(0).normal(0.0, 0.01, size=60)
    calibration.barker_acceptance_error(values, [0.0], batch_size=10, replications=5,
                                        rng=np.random.default_rng(1))
    assert calls == [(10, 60)]


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
