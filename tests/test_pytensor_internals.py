"""The facts about PyTensor's internals that ``adapter/pytensor_internals.py`` relies on.

If an upgrade of PyTensor changes any of them, these tests fail loudly (instead of the
step giving silently wrong numbers): the jitted graph is ``fn.vm.jit_fn``, the shared
variables' storage cells follow the explicit inputs in ``fn.vm.inputs``, and
``fn.maker.inputs`` marks which inputs are shared.
"""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.compile.mode import Mode

from pymc_minibatch_mh.model.internals import (
    DirectCall,
    direct_call,
    explicit_inputs_first,
    jitted_parts,
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
