"""The facts about PyTensor's and PyMC's internals that ``model/internals.py`` and
``model/compilation.py`` rely on.

If an upgrade of PyTensor or PyMC changes any of them, these tests fail loudly (instead of
the step giving silently wrong numbers), one test per fact:

- PyTensor: the jitted graph is ``fn.vm.jit_fn``, the shared variables' storage cells
  follow the explicit inputs in ``fn.vm.inputs``, and ``fn.maker.inputs`` marks which
  inputs are shared;
- PyMC: its progress bar reads ``step._progressbar_config`` and
  ``step._make_progressbar_update_functions``; ``sampling_state`` is built from
  ``_state_class``; ``QuadPotentialFullAdapt`` takes ``initial_weight=`` and has an
  ``adaptation_window`` that doubles while adapting and that ``reset()`` keeps; a NUTS
  step's ``tune`` switches its adaptation; ``CheckParameterValue.can_be_replaced_by_ninf``
  marks the checks PyMC turns into ``-inf``; ``pm.Minibatch`` and ``total_size`` leave the
  op classes of ``MINIBATCH_OPS`` in the graph;
- PyTensor's Numba backend says "Numba will use object mode to run ...'s perform method"
  for an op without a Numba implementation (``compile_function`` reads it to use the C
  backend instead);
- the scalar op classes the decomposition of the per-row quantities recognises;
- PyMC's terms of ``pt.dot`` of a float32 design and float64 coefficients hold PyTensor's
  ``Dot``, which the split's reference runs as ``UpcastDot``;
- PyTensor's ``vectorize_graph`` turns a vector product into one for every row of a
  matrix (the set-up's Jacobians and Hessians in one call).
"""

from __future__ import annotations

import gc
import warnings
import weakref

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
import pytest
from pytensor.compile.mode import Mode
from pytensor.graph.traversal import ancestors

from pymc_minibatch_mh.model import compilation, special_functions
from pymc_minibatch_mh.model.compat import ADVANCED_INDEX_OPS, start_inner_chain
from pymc_minibatch_mh.model.compilation import C_MODE, compile_function, object_mode_ops
from pymc_minibatch_mh.model.graph import (
    BatchedProducts,
    UpcastDot,
    checks_as_ninf,
    frozen_heap,
    has_op,
    reference_graph,
)
from pymc_minibatch_mh.model.internals import (
    MINIBATCH_OPS,
    DirectCall,
    GivenNutsDensity,
    PyMCStepHooks,
    adaptation_window,
    direct_call,
    explicit_inputs_first,
    full_adapt_potential,
    is_ninf_check,
    jitted_parts,
    set_adaptation_window,
    set_step_tuning,
)


def test_numba_function_exposes_the_jitted_graph_and_cells():
    data = pytensor.shared(np.arange(6.0), name="data")
    x = pt.vector("x")
    fn = pytensor.function([x], data * x.sum(), mode="NUMBA")
    assert callable(fn.vm.jit_fn)
    assert explicit_inputs_first(fn)
    assert [getattr(i, "shared", False) for i in fn.maker.inputs] == [False, True]
    jit, cells, single = jitted_parts(fn)
    assert len(cells) == 1 and cells[0][0] is data.get_value(borrow=True)
    # Calling the jitted graph with the explicit inputs then the cells is calling fn.
    out = jit(np.array([1.0, 2.0]), cells[0][0])
    np.testing.assert_array_equal(out[0] if single else out, fn(np.array([1.0, 2.0])))


def test_direct_call_matches_function_and_sees_set_value():
    data = pytensor.shared(np.arange(6.0), name="data")
    scale = pytensor.shared(np.array(2.0), name="scale")
    x = pt.vector("x")
    rows = pt.vector("rows", dtype="int64")
    multi = pytensor.function([x, rows], [data[rows] * x.sum(), x * scale], mode="NUMBA")
    single = pytensor.function([x, rows], data[rows] + x[0], mode="NUMBA")
    args = (np.array([1.0, 2.0]), np.array([1, 4], dtype=np.int64))
    for fn in (multi, single):
        fn.trust_input = True
        fast = direct_call(fn)
        assert isinstance(fast, DirectCall)
        for value in (np.arange(6.0), np.arange(6.0) * 10.0):
            data.set_value(value, borrow=True)
            scale.set_value(np.array(value[1]))
            expected, got = fn(*args), fast(*args)
            if isinstance(expected, list):
                assert isinstance(got, tuple | list) and len(got) == len(expected)
                for e, g in zip(expected, got, strict=True):
                    np.testing.assert_array_equal(e, g)
            else:
                np.testing.assert_array_equal(expected, got)


def test_functions_that_cannot_be_called_directly_are_returned_unchanged():
    data = pytensor.shared(np.arange(3.0), name="data")
    x = pt.vector("x")
    with_update = pytensor.function([x], x.sum(), updates={data: data + 1.0}, mode="NUMBA")
    python_vm = pytensor.function([x], x * 2.0, mode=Mode(linker="py"))
    for fn in (with_update, python_vm):
        assert jitted_parts(fn) is None
        assert direct_call(fn) is fn


def test_direct_call_survives_pickling():
    import pickle

    data = pytensor.shared(np.arange(4.0), name="data")
    x = pt.vector("x")
    fn = pytensor.function([x], [data * x.sum(), x + 1.0], mode="NUMBA")
    fast = pickle.loads(pickle.dumps(direct_call(fn)))
    out = fast(np.array([1.0, 1.0]))
    np.testing.assert_array_equal(out[0], np.arange(4.0) * 2.0)


def test_shared_inputs_before_explicit_ones_are_refused():
    data = pytensor.shared(np.arange(3.0), name="data")
    x = pt.vector("x")
    fn = pytensor.function([x], data * x.sum(), mode="NUMBA")
    # Reorder the maker's inputs as an upgrade might: the check must notice.
    fn.maker.inputs = list(reversed(fn.maker.inputs))
    assert not explicit_inputs_first(fn)
    assert jitted_parts(fn) is None


# --------------------------------------------------------------------------- PyMC
class _Hooked(PyMCStepHooks):
    """The smallest step-like object with the hooks; records PyMC's calls."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def progress_bar_columns(self, n_chains):
        self.calls.append("columns")
        return [], {"mine": [0] * n_chains}

    def progress_bar_updates(self):
        self.calls.append("updates")
        return (lambda stats: {"mine": 1},)


def test_pymc_progress_bar_reads_the_step_hooks():
    from pymc.progress_bar.progress import MCMCProgressBarManager

    step = _Hooked()
    manager = MCMCProgressBarManager(step, chains=2, draws=3, tune=1, progressbar=False)
    assert step.calls == ["columns", "updates"]
    assert manager.progress_stats["mine"] == [0, 0]
    assert len(manager.update_stats_functions) == 1


def test_pymc_sampling_state_is_built_from_state_class():
    from pymc.step_methods.state import DataClassState, WithSamplingState, dataclass_state

    @dataclass_state
    class _State(DataClassState):
        count: int

    class _Step(PyMCStepHooks, WithSamplingState):
        state_class = _State

        def __init__(self) -> None:
            self.count = 3

    step = _Step()
    assert _Step._state_class is _State
    state = step.sampling_state
    assert isinstance(state, _State) and state.count == 3
    step.count = 0
    step.sampling_state = state
    assert step.count == 3


def test_full_adapt_potential_weight_and_window():
    rng = np.random.default_rng(0)
    mean, cov = np.zeros(2), 4.0 * np.eye(2)
    samples = rng.normal(scale=0.1, size=(5, 2))
    velocities = {}
    for weight in (1, 1000):
        potential = full_adapt_potential(2, mean, cov.copy(), initial_weight=weight)
        for x in samples:
            potential.update(x, np.zeros(2), tune=True)
        velocities[weight] = potential.velocity(np.ones(2))
    # initial_weight= is the weight of the initial covariance (4 I) against the samples.
    np.testing.assert_allclose(velocities[1000], 4.0, rtol=0.02)
    assert np.all(velocities[1] < 2.0)
    # The window doubles at each of its ends while adapting; reset() keeps the last one.
    potential = full_adapt_potential(2, mean, cov.copy(), initial_weight=10)
    first = adaptation_window(potential)
    for _ in range(first + 1):
        potential.update(rng.normal(size=2), np.zeros(2), tune=True)
    assert adaptation_window(potential) == 2 * first
    potential.update(rng.normal(size=2), np.zeros(2), tune=False)  # no adaptation
    assert adaptation_window(potential) == 2 * first
    potential.reset()
    assert adaptation_window(potential) == 2 * first
    set_adaptation_window(potential, first)
    assert adaptation_window(potential) == first


def test_nuts_tune_flag_switches_its_adaptation():
    with pm.Model():
        pm.Normal("x", 0.0, 1.0, shape=2)
        step = pm.NUTS()
    start_inner_chain(step, np.random.default_rng(1))
    point = {"x": np.zeros(2)}
    sizes = {}
    for tune in (True, False):
        set_step_tuning(step, tune)
        assert step.tune is tune
        seen = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in range(10):
                point, stats = step.step(point)
                seen.append(float(stats[0]["step_size"]))
        sizes[tune] = seen
    assert len(set(sizes[True])) > 1  # adapting: the step size moves
    assert len(set(sizes[False])) == 1  # not adapting: fixed


def test_density_function_is_what_pymcs_integrator_evaluates():
    from pymc_minibatch_mh.proposals.nuts import density_function

    with pm.Model() as model:
        pm.Normal("x", 1.0, 2.0, shape=3)
        step = pm.NUTS(mode="NUMBA")
    q = np.array([0.5, -1.0, 2.0])
    density = density_function(model)
    assert isinstance(density, DirectCall)  # the Numba function, called directly
    logp, grad = density(q)
    ref_logp, ref_grad = step.integrator._logp_dlogp_func(q, None)
    assert float(logp) == pytest.approx(float(ref_logp), abs=1e-12)
    np.testing.assert_allclose(grad, ref_grad, atol=1e-12)
    np.testing.assert_allclose(grad, -(q - 1.0) / 4.0, atol=1e-12)
    # A NUTS given a density (GivenNutsDensity) evaluates that one and compiles none.
    calls = []
    with model:
        step = pm.NUTS(logp_dlogp_func=GivenNutsDensity(
            lambda q: calls.append(q.copy()) or density(q)))
    start_inner_chain(step, np.random.default_rng(1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step.step({"x": np.zeros(3)})
    assert len(calls) >= 2


def test_parameter_checks_replaceable_by_ninf():
    from pymc.logprob.utils import CheckParameterValue

    sigma, value = pt.scalar("sigma"), pt.scalar("value")
    logp = pm.logp(pm.Normal.dist(0.0, sigma), value)
    assert any(v.owner is not None and is_ninf_check(v.owner.op) for v in ancestors([logp]))
    strict = pytensor.function([sigma, value], logp, mode="FAST_COMPILE")
    with pytest.raises(Exception, match="sigma > 0"):
        strict(-1.0, 0.0)
    (lenient,) = checks_as_ninf([logp])
    assert pytensor.function([sigma, value], lenient, mode="FAST_COMPILE")(-1.0, 0.0) == -np.inf
    # PyMC marks the checks of icdf as not replaceable: they must stay errors.
    q = pt.scalar("q")
    icdf = pm.icdf(pm.Normal.dist(0.0, sigma), q)
    assert any(v.owner is not None and isinstance(v.owner.op, CheckParameterValue)
               for v in ancestors([icdf]))
    assert not any(v.owner is not None and is_ninf_check(v.owner.op) for v in ancestors([icdf]))


@pytest.mark.filterwarnings("ignore:total_size not provided")
def test_minibatch_and_total_size_leave_minibatch_ops():
    data = np.zeros(100)
    with pm.Model() as plain:
        mu = pm.Normal("mu")
        pm.Normal("y", mu, 1.0, observed=data)
    with pm.Model() as minibatch:
        mu = pm.Normal("mu")
        pm.Normal("y", mu, 1.0, observed=pm.Minibatch(data, batch_size=10))
    with pm.Model() as total_size:
        mu = pm.Normal("mu")
        pm.Normal("y", mu, 1.0, observed=data, total_size=1000)
    assert not has_op(plain.observed_RVs, MINIBATCH_OPS)
    assert has_op(minibatch.observed_RVs, MINIBATCH_OPS)
    assert has_op(total_size.observed_RVs, MINIBATCH_OPS)


def test_op_classes_of_the_decomposition():
    from pytensor.scalar.basic import Add, Exp, Mul, Neg, Sub, TrueDiv
    from pytensor.scalar.math import Sigmoid, Softplus
    from pytensor.tensor.elemwise import CAReduce

    x, y = pt.vector("x"), pt.vector("y")
    cases = [(x + y, Add), (x - y, Sub), (-x, Neg), (x * y, Mul), (x / y, TrueDiv),
             (pt.sigmoid(x), Sigmoid), (pt.exp(x), Exp), (pt.softplus(x), Softplus)]
    for expr, op_class in cases:
        assert isinstance(expr.owner.op.scalar_op, op_class), (expr, op_class)
    total = pt.sum(pt.matrix("m"), axis=1)
    assert isinstance(total.owner.op, CAReduce) and isinstance(total.owner.op.scalar_op, Add)
    index = pt.vector("v")[pt.vector("idx", dtype="int64")]
    assert isinstance(index.owner.op, ADVANCED_INDEX_OPS)


def test_no_function_runs_in_numba_object_mode(monkeypatch):
    from scipy.special import polygamma, psi

    # what is compiled, and for which backend: functions loaded from the cache are not
    monkeypatch.setenv("PYMC_MINIBATCH_MH_FUNCTION_CACHE", "0")

    x = pt.vector("x", dtype="float64")
    values = np.array([0.5, 3.0, 40.0])
    # polygamma(2, ·) (the third derivative of gammaln) has no Numba implementation:
    # PyTensor warns, and the function is compiled for the C backend.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        raw = pytensor.function([x], pt.polygamma(2, x), mode="NUMBA")
    assert any("Numba will use object mode to run polygamma" in str(w.message) for w in caught)
    assert "Numba" in type(raw.maker.linker).__name__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fn, ops = compile_function([x], pt.polygamma(2, x), "NUMBA")
        assert ops == ["polygamma"]
        assert "Numba" not in type(fn.maker.linker).__name__
        np.testing.assert_allclose(fn(values), polygamma(2, values), rtol=1e-7)
        # digamma and trigamma have the package's (see below): Numba is kept.
        fn, ops = compile_function([x], pt.psi(x), "NUMBA")
        assert ops == [] and "Numba" in type(fn.maker.linker).__name__
        np.testing.assert_allclose(fn(values), psi(values), rtol=1e-13)
        fn, ops = compile_function([x], pt.tri_gamma(x), "NUMBA")
        assert ops == [] and "Numba" in type(fn.maker.linker).__name__
    # Other warnings of the compilation still reach the user.
    real = pytensor.function
    # The op is found in the graph as given (here a gradient graph, before any rewrite),
    # and the function is then compiled once, for the C backend, not first for Numba.
    hessian = pytensor.grad(pt.sum(pt.polygamma(2, x)), x)
    assert object_mode_ops([hessian]) == ["polygamma"]
    assert object_mode_ops([pt.psi(x), x + 1]) == []
    modes = []

    def counted(*args, **kwargs):
        modes.append(kwargs["mode"])
        return real(*args, **kwargs)

    monkeypatch.setattr(pytensor, "function", counted)
    fn, ops = compile_function([x], hessian, "NUMBA")
    assert ops == ["polygamma"] and modes == [C_MODE]
    np.testing.assert_allclose(fn(values), polygamma(3, values), rtol=1e-7)
    # An op the scan does not see is still caught by the build's warnings (two builds).
    monkeypatch.setattr(compilation, "object_mode_ops", lambda outputs: [])
    modes.clear()
    fn, ops = compile_function([x], hessian, "NUMBA")
    assert ops == ["polygamma"] and modes == ["NUMBA", C_MODE]
    monkeypatch.undo()
    monkeypatch.setenv("PYMC_MINIBATCH_MH_FUNCTION_CACHE", "0")

    def noisy(*args, **kwargs):
        warnings.warn("a warning of the compilation", UserWarning, stacklevel=2)
        return real(*args, **kwargs)

    monkeypatch.setattr(pytensor, "function", noisy)
    with pytest.warns(UserWarning, match="a warning of the compilation"):
        compile_function([x], pt.psi(x), "NUMBA")


@pytest.mark.parametrize("name", ["psi", "tri_gamma"])
def test_digamma_and_trigamma_run_in_numba_and_agree_with_scipy_and_c(monkeypatch, name):
    # The package's functions compiled for Numba take psi and tri_gamma as ops with a Numba
    # implementation of their own (PyTensor's Numba backend has none for tri_gamma, and
    # calls SciPy's psi through a pointer that Numba cannot cache): no object mode; psi
    # within 1e-13 of SciPy's (+inf at 0 and the negative integers, as PyTensor's C code);
    # tri_gamma the C backend's algorithm (equal to rounding), within 2e-8 of SciPy's for
    # x > 0. The given graph is not changed.
    from scipy.special import polygamma

    monkeypatch.setenv("PYMC_MINIBATCH_MH_FUNCTION_CACHE", "0")
    order = {"psi": 0, "tri_gamma": 1}[name]
    x = pt.vector("x", dtype="float64")
    out = getattr(pt, name)(x)
    values = np.concatenate([[-3.5, -1.0, -0.25, 0.0, 1e-6, 1e-4, 2e-4],
                             np.geomspace(1e-3, 1e6, 300), [np.inf, np.nan]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no object-mode warning
        numba_fn, ops = compile_function([x], out, "NUMBA")
    assert ops == [] and "Numba" in type(numba_fn.maker.linker).__name__
    swapped = [type(n.op.scalar_op) for n in numba_fn.maker.fgraph.toposort()
               if hasattr(n.op, "scalar_op")]
    assert swapped == [special_functions.CephesPsi if name == "psi"
                       else special_functions.AS121TriGamma]
    assert type(out.owner.op.scalar_op).__name__ in ("Psi", "TriGamma")  # not changed
    got = numba_fn(values)
    c_fn, _ = compile_function([x], out, C_MODE)
    c_values = c_fn(values)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(values))
    poles = (values <= 0) & (values == np.floor(values))
    if name == "psi":
        assert np.all(got[poles] == np.inf) and np.all(c_values[poles] == np.inf)
        regular = ~poles & np.isfinite(values)
        np.testing.assert_allclose(got[regular], polygamma(0, values[regular]), rtol=1e-13,
                                   atol=1e-13)
    else:
        finite = ~np.isnan(values)
        np.testing.assert_allclose(got[finite], c_values[finite], rtol=1e-14, atol=0)
        positive = (values > 0) & np.isfinite(values)
        np.testing.assert_allclose(got[positive], polygamma(1, values[positive]), rtol=2e-8)
    # inside a fused elementwise graph, and in float32
    y = pt.vector("y", dtype="float32")
    fused, _ = compile_function([y], 2.0 * getattr(pt, name)(y) + y, "NUMBA")
    result = fused(np.array([0.5, 3.0], dtype="float32"))
    assert result.dtype == np.float32
    np.testing.assert_allclose(result, 2.0 * polygamma(order, [0.5, 3.0]) + [0.5, 3.0],
                               rtol=1e-6)


def test_reference_graph_converts_float32_products_in_blocks():
    """The float32 design's product in a model's terms is PyTensor's ``Dot``; the split's
    reference has ``UpcastDot`` instead and the data as shared variables, with the same
    values. The product's rows span several blocks (1,024 rows each at d = 300), the last
    one short; ``UpcastDot`` also takes the narrower factor on the right."""
    from pytensor.compile.sharedvalue import SharedVariable
    from pytensor.graph.basic import Constant
    from pytensor.graph.traversal import graph_inputs
    from pytensor.tensor.math import Dot

    rng = np.random.default_rng(3)
    n, d = 2 * 1024 + 3, 300
    x = rng.normal(size=(n, d)).astype(np.float32)
    with pm.Model() as model:
        b = pm.Normal("b", 0.0, 1.0, shape=d)
        pm.Normal("y", pt.dot(x, b), 1.0, observed=rng.normal(size=n))
    terms = model.logp(vars=model.observed_RVs, sum=False)
    assert has_op(terms, (Dot,))
    data = [v for v in graph_inputs(terms) if isinstance(v, Constant) and v.ndim >= 1]
    ref = reference_graph(terms, data)
    assert has_op(ref, (UpcastDot,)) and not has_op(ref, (Dot,))
    assert not [v for v in graph_inputs(ref) if isinstance(v, Constant) and v.ndim >= 1]
    shared = [v for v in graph_inputs(ref) if isinstance(v, SharedVariable)]
    assert any(v.get_value(borrow=True) is x for v in shared)  # not copied
    value = {model.rvs_to_values[b]: np.linspace(-1.0, 1.0, d)}
    expected = pytensor.function([], terms[0], givens=value)()
    got = pytensor.function([], ref[0], givens=value, mode="FAST_COMPILE")()
    np.testing.assert_allclose(got, expected, rtol=1e-13, atol=0)
    coefs = pt.matrix("c", dtype="float64")
    right = pytensor.function([coefs], UpcastDot()(coefs, pt.as_tensor(x.T)))
    c = rng.normal(size=(2, d))
    np.testing.assert_allclose(right(c), c @ x.T.astype(np.float64), rtol=1e-13)


def test_batched_products_equal_one_product_per_row(monkeypatch):
    """Vector-Jacobian products of a non-linear map (its Jacobian is not symmetric, so a
    transposed result fails): the first LOOP_PRODUCTS one call per row, then the batched
    graph, the same numbers; where PyTensor cannot vectorise the graph, one call per row
    throughout and a warning."""
    from pymc_minibatch_mh.model import graph

    x, u = pt.vector("x"), pt.vector("u")
    f = pt.stack([pt.exp(x[0]) * x[1], pt.log1p(x[1] ** 2) * x[2] ** 3, x[0] / (1 + x[2])])
    vjp = pytensor.grad(pt.dot(u, f), x)
    one = pytensor.function([x, u], vjp)
    calls = []

    def counted(*args):
        calls.append(args)
        return one(*args)

    monkeypatch.setattr(graph, "LOOP_PRODUCTS", 6)
    products = BatchedProducts(lambda: ([x], vjp, u), "test rows", counted)
    point = np.array([0.3, -1.2, 0.7])
    eye = np.eye(3)
    expected = np.array([one(point, e) for e in eye])
    assert not np.allclose(expected, expected.T)
    for _ in range(4):
        np.testing.assert_allclose(products(point, eye), expected, rtol=1e-14)
    assert len(calls) == 6 and products._batched  # two calls row by row, then batched

    def refuse(*args, **kwargs):
        raise NotImplementedError("no vectorised form")

    monkeypatch.setattr(graph, "vectorize_graph", refuse)
    products = BatchedProducts(lambda: ([x], vjp, u), "test rows", counted)
    with pytest.warns(RuntimeWarning, match="test rows are computed one vector product at a "
                                            "time"):
        for _ in range(4):
            np.testing.assert_allclose(products(point, eye), expected, rtol=1e-14)
    assert len(calls) == 6 + 12


def test_batched_products_of_an_output_that_ignores_the_vector(monkeypatch):
    """A flat prior's Hessian-vector products are zeros whatever the vector, and PyTensor's
    vectorised graph then has no row dimension: the batched products must still have one
    row per row of the matrix (a (d,) array made the prior Hessian of a Taylor reference
    the wrong shape once the batched graph took over, at N = 10⁶, d = 100)."""
    from pymc_minibatch_mh.model import graph

    x, u = pt.vector("x"), pt.vector("u")
    zeros = pt.zeros_like(x) * 0.0 + 0.0 * pt.sum(x)
    one = pytensor.function([x, u], zeros, on_unused_input="ignore")
    monkeypatch.setattr(graph, "LOOP_PRODUCTS", 3)
    products = BatchedProducts(lambda: ([x], zeros, u), "zero rows", one)
    point, eye = np.array([0.3, -1.2, 0.7]), np.eye(3)
    for _ in range(3):
        out = products(point, eye)
        assert out.shape == (3, 3) and not np.any(out)
    assert products._batched  # the last call was the batched graph's


def test_frozen_heap_confines_collections_to_new_objects():
    gc.unfreeze()                             # Python 3.12 starts with some frozen
    with frozen_heap():
        frozen = gc.get_freeze_count()
        assert frozen > 0                     # what existed is out of the collector's way
        # Objects made inside the block stay unfrozen, in a nested block too. A frozen
        # object may still be freed by reference counting at any time (a pytest-xdist
        # run saw the count fall by 2 between two reads), so it may fall, never grow.
        made = [[] for _ in range(10_000)]
        with frozen_heap():                   # nested: nothing more, nothing undone
            assert 0 < gc.get_freeze_count() <= frozen
        assert 0 < gc.get_freeze_count() <= frozen
        assert gc.isenabled()                 # new objects are still collected
        del made
    assert gc.get_freeze_count() == 0


def test_frozen_heap_frees_its_cyclic_garbage_when_it_ends():
    # The block's closing collection: cyclic garbage made inside it is freed at its end,
    # before any later allocation could trigger a collection.
    class Node:
        pass

    with frozen_heap():
        cycle = Node()
        cycle.self = cycle
        alive = weakref.ref(cycle)
        del cycle                             # only the collector frees a cycle
    assert alive() is None
