"""The cache of compiled functions (``model/function_cache.py``).

A second process loads a function instead of rewriting its graph again; these tests check
that a loaded function is the function that would have been compiled: the key does not
change with the process (its hash seed, what it compiled before), it does change with
anything that changes the function (a constant's value, an op, a type, the mode), a loaded
function reads the caller's shared variables (``pm.set_data``), a bad entry is compiled
again, and sampling gives the same draws with the cache cold or warm.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
import pytest
from conftest import sample_kwargs

from pymc_minibatch_mh import MinibatchBarker
from pymc_minibatch_mh.model import function_cache
from pymc_minibatch_mh.model.compat import posterior
from pymc_minibatch_mh.model.compilation import compile_derived, compile_function

GRAPH = """
import numpy as np, pytensor, pytensor.tensor as pt
x = pt.vector("x")
s = pytensor.shared(np.arange(3.0), name="s")
c = pt.constant(np.array([1.0, 2.0, 4.0]))
out = [pt.all(x > 0), pt.exp(x) * c + s, pt.sum(pt.log1p(x ** 2)) * 3]
"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PYMC_MINIBATCH_MH_FUNCTION_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("PYMC_MINIBATCH_MH_FUNCTION_CACHE", raising=False)
    return tmp_path


def _graph():
    space: dict = {}
    exec(GRAPH, space)
    return space["x"], space["s"], space["out"]


def _counting(monkeypatch):
    compiled = []
    real = pytensor.function

    def counted(*args, **kwargs):
        compiled.append(kwargs.get("mode"))
        return real(*args, **kwargs)

    monkeypatch.setattr(pytensor, "function", counted)
    return compiled


def test_key_does_not_depend_on_the_process():
    # This process has compiled the graph's ops before (All caches its ufunc), the other
    # one has not, and it hashes strings with another seed.
    x, _, out = _graph()
    pytensor.function([x], out, mode="FAST_COMPILE")(np.ones(3))
    assert "_ufunc" in vars(out[0].owner.op)     # a cache in the op: not in its meaning
    here = function_cache.graph_key([x], out, "NUMBA")
    code = GRAPH + textwrap.dedent("""
        from pymc_minibatch_mh.model.function_cache import graph_key
        print(graph_key([x], out, "NUMBA"))
    """)
    env = dict(os.environ, PYTHONHASHSEED="12345")
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=env, check=True).stdout.split()[-1]
    assert here is not None and here == there


def test_key_changes_with_what_the_function_computes():
    x, s, out = _graph()
    key = function_cache.graph_key([x], out, "NUMBA")
    y = pt.vector("y")
    others = [
        ([x], [pt.all(x > 0), pt.exp(x) * pt.constant(np.array([1.0, 2.0, 5.0])) + s,
               out[2]], "NUMBA"),                                      # a constant's value
        ([x], [pt.all(x > 0), pt.log(x) * pt.constant(np.array([1.0, 2.0, 4.0])) + s,
               out[2]], "NUMBA"),                                      # an op
        ([x], [pt.any(x > 0), *out[1:]], "NUMBA"),                     # an op's class
        ([x], [out[0], out[1], pt.sum(pt.log1p(x ** 2)) * 2], "NUMBA"),  # a scalar constant
        ([x], out[::-1], "NUMBA"),                                     # the outputs' order
        ([x], out, "FAST_COMPILE"),                                    # the mode
        ([y], [pt.all(y > 0), pt.exp(y) * pt.constant(np.array([1.0, 2.0, 4.0])) + s,
               pt.sum(pt.log1p(y ** 2)) * 3], "NUMBA"),                # renamed: the same
    ]
    keys = [function_cache.graph_key(i, o, m) for i, o, m in others]
    assert len(set(keys[:-1])) == len(keys) - 1 and key not in keys[:-1]
    assert keys[-1] == key
    f = pt.fvector("x")
    assert function_cache.graph_key([f], [pt.exp(f)], "NUMBA") != \
        function_cache.graph_key([x], [pt.exp(x)], "NUMBA")            # a dtype


def test_a_key_blind_to_constants_would_load_a_wrong_function(cache, monkeypatch):
    # The broken variant: digests that skip a constant's bytes collide, and the cache
    # then returns the first function for the second graph (this test's premise).
    x = pt.vector("x")
    one, two = x + np.array([1.0, 1.0]), x + np.array([2.0, 2.0])
    assert compile_function([x], one, "FAST_COMPILE")[0](np.zeros(2))[0] == 1.0
    assert compile_function([x], two, "FAST_COMPILE")[0](np.zeros(2))[0] == 2.0
    monkeypatch.setattr(function_cache, "_constant_digest",
                        lambda v, data: function_cache._sha(b"constant"))
    assert compile_function([x], one, "FAST_COMPILE")[0](np.zeros(2))[0] == 1.0
    assert compile_function([x], two, "FAST_COMPILE")[0](np.zeros(2))[0] == 1.0


def test_loaded_function_reads_the_callers_shared_variable(cache, monkeypatch):
    x, s, out = _graph()
    compiled = _counting(monkeypatch)
    fn, _ = compile_function([x], out, "NUMBA")
    assert len(compiled) == 1 and len(list(cache.glob("*.pkl"))) == 1
    x2, s2, out2 = _graph()                      # the same graph, another shared variable
    s2.set_value(np.array([10.0, 20.0, 30.0]))
    loaded, _ = compile_function([x2], out2, "NUMBA")
    assert len(compiled) == 1                    # loaded, not compiled
    v = np.array([0.5, 1.0, 2.0])
    expected = np.exp(v) * [1.0, 2.0, 4.0] + [10.0, 20.0, 30.0]
    np.testing.assert_allclose(loaded(v)[1], expected)
    s2.set_value(np.zeros(3))                    # as pm.set_data does
    np.testing.assert_allclose(loaded(v)[1], np.exp(v) * [1.0, 2.0, 4.0])
    np.testing.assert_allclose(fn(v)[1], np.exp(v) * [1.0, 2.0, 4.0] + [0.0, 1.0, 2.0])


@pytest.mark.parametrize("mode", ["NUMBA", "CVM"])
def test_shared_values_are_not_stored(cache, monkeypatch, mode):
    """A shared variable of 8 MB (the data of the split's reference at large N) is cached
    by its type: the entry holds an empty array in its place, the caller's value is intact
    after the entry is written, and the loaded function reads the second caller's."""
    rng = np.random.default_rng(0)

    def graph(value):
        s = pytensor.shared(value, borrow=True, shape=value.shape)
        x = pt.vector("x")
        return x, s, pt.dot(s, x)

    first = rng.normal(size=(500_000, 2))
    x, s, out = graph(first)
    compiled = _counting(monkeypatch)
    fn, _ = compile_function([x], out, mode)
    (entry,) = cache.glob("*.pkl")
    assert entry.stat().st_size < 200_000 < first.nbytes
    assert s.get_value(borrow=True) is first
    v = np.array([0.5, -2.0])
    np.testing.assert_allclose(fn(v), first @ v)
    second = rng.normal(size=first.shape)
    x2, _, out2 = graph(second)
    loaded, _ = compile_function([x2], out2, mode)
    assert len(compiled) == 1
    np.testing.assert_allclose(loaded(v), second @ v)


def test_unreadable_entry_is_compiled_again(cache, monkeypatch, caplog):
    x, _, out = _graph()
    compile_function([x], out, "FAST_COMPILE")
    (entry,) = cache.glob("*.pkl")
    entry.write_bytes(b"not a pickle")
    compiled = _counting(monkeypatch)
    x, _, out = _graph()
    with caplog.at_level("INFO", logger="pymc_minibatch_mh"):
        fn, _ = compile_function([x], out, "FAST_COMPILE")
    assert len(compiled) == 1 and "could not be read" in caplog.text
    assert fn(np.ones(3))[0] and entry.read_bytes() != b"not a pickle"


def test_what_is_not_cached(cache, monkeypatch):
    x, _, out = _graph()
    monkeypatch.setattr(function_cache, "MAX_CONSTANT_BYTES", 16)   # a constant of 3 floats
    assert function_cache.graph_key([x], out, "NUMBA") is None
    monkeypatch.undo()
    monkeypatch.setenv("PYMC_MINIBATCH_MH_FUNCTION_CACHE_DIR", str(cache))
    monkeypatch.setenv("PYMC_MINIBATCH_MH_FUNCTION_CACHE", "0")
    compile_function([x], out, "NUMBA")
    assert not list(cache.glob("*.pkl"))
    monkeypatch.delenv("PYMC_MINIBATCH_MH_FUNCTION_CACHE")
    missing = pt.vector("missing")
    assert function_cache.graph_key([x], [x + missing], "NUMBA") is None


def test_oldest_entries_are_pruned(cache, monkeypatch):
    x = pt.vector("x")
    for k in range(4):
        compile_function([x], x + float(k), "FAST_COMPILE")
    sizes = sorted(p.stat().st_size for p in cache.glob("*.pkl"))
    monkeypatch.setattr(function_cache, "MAX_CACHE_BYTES", sizes[-1] + sizes[-2])
    compile_function([x], x + 4.0, "FAST_COMPILE")
    assert len(list(cache.glob("*.pkl"))) == 2


def _sample(seed):
    rng = np.random.default_rng(3)
    X = rng.normal(size=(3000, 2))
    y = (rng.random(3000) < 1 / (1 + np.exp(-X @ [1.0, -0.5]))).astype(int)
    with pm.Model():
        xd = pm.Data("X", X)
        b = pm.Normal("b", 0, 1, shape=2)
        pm.Bernoulli("y", logit_p=xd @ b, observed=y, shape=xd.shape[0])
        idata = pm.sample(step=MinibatchBarker(control_variate="taylor"), draws=60, tune=60,
                          chains=1, **sample_kwargs(random_seed=seed))
    return posterior(idata)["b"].values


def test_same_draws_with_the_cache_cold_and_warm(cache, monkeypatch):
    compiled = _counting(monkeypatch)
    cold = _sample(5)
    n_cold, entries = len(compiled), len(list(cache.glob("*.pkl")))
    assert entries >= 3
    warm = _sample(5)
    assert len(compiled) - n_cold < n_cold       # the cached functions were loaded
    assert len(list(cache.glob("*.pkl"))) == entries
    np.testing.assert_array_equal(cold, warm)


# ------------------------------------------------------------------ derived functions
def _derived(recipe, derivations, source_value=1.0):
    """A source graph ``exp(x) * c`` and, by ``recipe``, its gradient or second derivative
    (counted in ``derivations``)."""
    x = pt.vector("x")
    c = pytensor.shared(np.full(2, source_value), name="c")
    source = pt.exp(x) * c

    def derive():
        derivations.append(recipe)
        first = pytensor.gradient.grad(pt.sum(source), x)
        out = first if recipe == "gradient" else pytensor.gradient.grad(pt.sum(first * x), x)
        return [x], out, {"recipe": recipe}

    return x, c, source, derive


def test_derived_function_is_found_by_its_source(cache):
    derivations = []
    x, _, source, derive = _derived("gradient", derivations)
    fn, _, facts = compile_derived([x], source, "gradient", derive, "FAST_COMPILE")
    assert derivations == ["gradient"] and facts == {"recipe": "gradient"}
    v = np.array([0.0, 1.0])
    np.testing.assert_allclose(fn(v), np.exp(v))
    # Another process builds the same source: nothing is derived again, the facts come
    # from the cache, and the loaded function reads the caller's shared variable.
    x2, c2, source2, derive2 = _derived("gradient", derivations)
    c2.set_value(np.array([2.0, 3.0]))
    loaded, _, facts = compile_derived([x2], source2, "gradient", derive2, "FAST_COMPILE")
    assert derivations == ["gradient"] and facts == {"recipe": "gradient"}
    np.testing.assert_allclose(loaded(v), [2.0, 3.0] * np.exp(v))
    # Another recipe on the same source is another function.
    x3, _, source3, derive3 = _derived("second", derivations)
    second, _, _ = compile_derived([x3], source3, "second", derive3, "FAST_COMPILE")
    assert derivations == ["gradient", "second"]
    np.testing.assert_allclose(second(v), np.exp(v) * (1.0 + v))


def test_a_key_blind_to_the_recipe_would_load_a_wrong_function(cache, monkeypatch):
    # The broken variant: without the recipe in the key, the second derivation of the
    # same source loads the first one's function (this test's premise).
    real = function_cache._key_and_shared
    monkeypatch.setattr(function_cache, "_key_and_shared",
                        lambda inputs, outputs, mode, recipe="": real(inputs, outputs, mode))
    derivations = []
    x, _, source, derive = _derived("gradient", derivations)
    compile_derived([x], source, "gradient", derive, "FAST_COMPILE")
    x2, _, source2, derive2 = _derived("second", derivations)
    wrong, _, facts = compile_derived([x2], source2, "second", derive2, "FAST_COMPILE")
    assert derivations == ["gradient"] and facts == {"recipe": "gradient"}
    np.testing.assert_allclose(wrong(np.zeros(2)), np.ones(2))     # the gradient's value


def test_derived_function_with_its_own_shared_variable_is_not_stored(cache):
    x = pt.vector("x")
    own = []

    def derive():
        own.append(pytensor.shared(np.ones(2), name="own"))
        return [x], pt.exp(x) * own[-1]

    compile_derived([x], pt.exp(x), "own", derive, "FAST_COMPILE")
    assert not list(cache.glob("*.pkl"))
    compile_derived([x], pt.exp(x), "own", derive, "FAST_COMPILE")
    assert len(own) == 2                         # derived again


def test_the_package_code_is_part_of_the_key(tmp_path):
    package = tmp_path / "package"
    (package / "model").mkdir(parents=True)
    source = package / "model" / "rule.py"
    source.write_text("RULE = 1\n")
    before = function_cache._package_digest(package)
    source.write_text("RULE = 2\n")
    function_cache._package_digest.cache_clear()
    assert function_cache._package_digest(package) != before
    assert function_cache._package_digest().encode() in function_cache._environment()


def _rewritten():
    """A graph that PyTensor's rewrites change a lot (fusion, shapes, canonical forms)."""
    x = pt.vector("x")
    y = pt.exp(x) * 2.0 + pt.log1p(x ** 2) - pt.exp(x)
    out = [pt.sum(y * y) + x.shape[0], pytensor.grad(pt.sum(pt.sigmoid(y) * x), x)]
    return x, out


@pytest.mark.parametrize("mode", ["NUMBA", "CVM"])
def test_stored_function_keeps_only_its_graph(cache, mode):
    """The entry holds the compiled graph, not what its rewriting left behind: every
    client entry is a variable of the graph (a store that kept the removed variables'
    entries fails this), and the loaded function computes what the compiled one does."""
    x, out = _rewritten()
    fn, _ = compile_function([x], out, mode)
    fgraph = fn.maker.fgraph
    assert not hasattr(fgraph, "shape_feature") and not hasattr(fgraph, "merge_feature")
    x2, out2 = _rewritten()
    loaded, _ = compile_function([x2], out2, mode)
    loaded_graph = loaded.maker.fgraph
    assert loaded_graph is not fgraph
    for graph in (fgraph, loaded_graph):
        assert set(graph.clients) <= set(graph.variables)
        handler = getattr(graph, "destroy_handler", None)
        if handler is not None:
            assert set(handler.clients) <= set(graph.variables)
    v = np.array([0.3, -1.2, 2.0])
    for got, want in zip(loaded(v), fn(v), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_a_store_that_kept_the_rewrites_residue_is_larger(cache, monkeypatch):
    """The broken variant of the test above: without dropping the rewriting's state, the
    removed variables' client entries are stored, and the entry is larger (1.7–3 × here;
    7.8 MB against 0.4–1.0 MB on the zoo's negative binomial)."""
    x, out = _rewritten()
    compile_function([x], out, "NUMBA")
    (lean,) = cache.glob("*.pkl")
    lean_size = lean.stat().st_size
    lean.unlink()
    monkeypatch.setattr(function_cache, "drop_rewrite_state", lambda fgraph: None)
    x, out = _rewritten()
    fn, _ = compile_function([x], out, "NUMBA")
    (heavy,) = cache.glob("*.pkl")
    assert not set(fn.maker.fgraph.clients) <= set(fn.maker.fgraph.variables)
    assert heavy.stat().st_size > 1.5 * lean_size
