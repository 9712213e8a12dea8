"""What users met: Ctrl-C inside a jitted graph, missing values in discrete observed data,
integer labels in a wider type than the model's, a long set-up outside a terminal."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
import pytest
from conftest import sample_kwargs
from test_out_of_core import store_of

from pymc_minibatch_mh import MinibatchBarker
from pymc_minibatch_mh.errors import (
    DataStoreError,
    ModelNotSupportedError,
    StartPointError,
)
from pymc_minibatch_mh.model import internals
from pymc_minibatch_mh.model.internals import direct_call
from pymc_minibatch_mh.progress import note, setup_progress


# ------------------------------------------------------------------ Ctrl-C
def test_ctrl_c_while_a_jitted_graph_runs_is_a_keyboard_interrupt():
    """A real SIGINT during a direct call: Numba's dispatcher reports it as a SystemError
    chained from the KeyboardInterrupt; the call raises the KeyboardInterrupt."""
    x = pt.dvector("x")
    scale = pytensor.shared(np.ones(3))
    y = pt.sum(pt.exp(pt.sin(x[:, None] * scale[None, :])), axis=1)
    fn = direct_call(pytensor.function([x], [y, y.sum()], mode="NUMBA", trust_input=True))
    assert isinstance(fn, internals.DirectCall)
    big = np.linspace(0.0, 1.0, 2_000_000)
    fn(big[:10])
    # Python's own handler, whatever an earlier test in this process (PyMC's parallel
    # sampling, a test runner's worker) left in place.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
    try:
        timer.start()
        # Calls of about 0.1-0.5 s each, back to back, until the signal arrives (inside one
        # of them, almost surely); a loaded machine may delay the timer's thread.
        deadline = time.monotonic() + 60.0
        with pytest.raises(KeyboardInterrupt):
            while time.monotonic() < deadline:
                fn(big)
    finally:
        timer.join()
        signal.signal(signal.SIGINT, previous)


def _interrupt_at_call(monkeypatch):
    """Direct calls built from now on raise, at call ``state["at"]`` of them all, what
    Numba raises on Ctrl-C; ``state["calls"]`` counts them."""
    state = {"calls": 0, "at": None}
    bind = internals.DirectCall._bind

    def wrapped_bind(self):
        bind(self)
        jit = self._jit

        def interrupted(*args):
            state["calls"] += 1
            if state["calls"] == state["at"]:
                try:
                    raise KeyboardInterrupt
                except KeyboardInterrupt as err:
                    raise SystemError("CPUDispatcher(<function numba_funcified_fgraph>) "
                                      "returned a result with an exception set") from err
            return jit(*args)

        self._jit = interrupted

    monkeypatch.setattr(internals.DirectCall, "_bind", wrapped_bind)
    return state


def test_pm_sample_keeps_the_draws_made_before_ctrl_c_in_a_jitted_graph(monkeypatch):
    data = np.random.default_rng(3).normal(1.0, 1.0, size=2000)
    state = _interrupt_at_call(monkeypatch)
    with pm.Model():
        mu = pm.Normal("mu")
        pm.Normal("y", mu, 1.0, observed=data)
        step = MinibatchBarker(batch_size=100, S=[0.05], tune=False)
        pm.sample(draws=20, tune=0, step=step, chains=1, **sample_kwargs())
        per_draw = state["calls"] / 20
        assert per_draw >= 1  # the step's rows go through direct calls
        state["calls"], state["at"] = 0, int(30 * per_draw)
        idata = pm.sample(draws=100, tune=0, step=step, chains=1, **sample_kwargs())
    assert state["calls"] >= state["at"]
    kept = idata["posterior"].sizes["draw"]
    assert 0 < kept < 100


# ------------------------------------------------------------------ missing values
@pytest.mark.filterwarnings("ignore:Data in obs contains missing values")
@pytest.mark.parametrize("only_mu", [False, True])
def test_missing_counts_are_refused_as_missing_values_not_as_discrete(only_mu):
    y = np.random.default_rng(0).poisson(3.0, size=200).astype(float)
    y[[3, 7]] = np.nan
    with pm.Model():
        mu = pm.Normal("mu")
        pm.Poisson("obs", pm.math.exp(mu), observed=y)
        with pytest.raises(ModelNotSupportedError) as info:
            MinibatchBarker(vars=[mu] if only_mu else None)
    message = str(info.value)
    assert "'obs' contain 2 missing values" in message
    assert "obs_unobserved" in message
    assert "Drop the rows with missing values" in message
    assert "discrete" not in message


# ------------------------------------------------------------------ integer labels
def _labels_model(x, y):
    with pm.Model() as model:
        xd = pm.Data("X", x)
        yd = pm.Data("y", y)
        b = pm.Normal("b", 0.0, 1.0, shape=(x.shape[1], 3))
        pm.Categorical("obs", logit_p=xd @ b, observed=yd)
    return model


@pytest.mark.parametrize("kind", ["numpy", "dask"])
def test_int64_labels_are_read_into_the_models_int32_when_they_fit(kind):
    rng = np.random.default_rng(2)
    n = 3000
    x = rng.normal(size=(n, 2))
    x[:, 0] = np.arange(n)  # the row number, to find each row's label
    y = rng.integers(0, 3, size=n, dtype=np.int64)
    model = _labels_model(x[:50], y[:50])
    assert model["y"].dtype == "int32"  # what PyMC makes of the slice
    data = {"X": x, "y": y}
    if kind == "dask":
        da = pytest.importorskip("dask.array")
        data = {"X": da.from_array(x, chunks=(700, 2)), "y": da.from_array(y, chunks=700)}
    store = store_of(model, data)
    try:
        names = [store.name(i) for i in range(2)]
        store.start_chain(np.random.default_rng(5))
        store.start_step()
        rows = store.take(400)
        got_x, got_y = rows[names.index("X")], rows[names.index("y")]
        assert got_y.dtype == np.int32
        np.testing.assert_array_equal(got_y, y[got_x[:, 0].astype(int)])
    finally:
        getattr(store, "close", lambda: None)()


def test_int64_labels_that_do_not_fit_the_models_int32_are_refused_with_the_value():
    x = np.zeros((500, 2))
    y = np.zeros(500, dtype=np.int64)
    y[17] = 2**40
    store = store_of(_labels_model(x[:50], y[:50]), {"X": x, "y": y})
    with pytest.raises(DataStoreError, match=f"value {2**40}, outside the range of the model's "
                                             "int32"):
        for _ in store.chunks():
            pass


# ------------------------------------------------------------------ set-up progress
def test_the_setup_phases_are_logged_after_the_delay(caplog):
    caplog.set_level(logging.INFO, logger="pymc_minibatch_mh")
    with setup_progress("Step", delay=0.2):
        note("quick phase")
        time.sleep(0.5)  # the phase running at the delay is logged then, with no new note
        assert "Step set-up: quick phase" in caplog.text
        note("copying rows 1,000 of 5,000")
        note("copying rows 2,000 of 5,000")  # the same phase: one line
        note("full pass")
    lines = [r.getMessage() for r in caplog.records if r.name == "pymc_minibatch_mh"]
    assert sum("copying rows" in line for line in lines) == 1
    assert any("Step set-up: full pass" in line for line in lines)
    assert "Step set-up: done in" in lines[-1]


def test_a_quick_setup_logs_nothing(caplog):
    caplog.set_level(logging.INFO, logger="pymc_minibatch_mh")
    with setup_progress("Step", delay=5.0):
        note("quick phase")
    assert not caplog.records


def test_the_setup_phases_reach_standard_error_that_is_not_a_terminal():
    """As PyMC's "Sequential sampling ..." lines do, with no logging set up by the program."""
    code = ("import time, pymc_minibatch_mh\n"
            "from pymc_minibatch_mh.progress import note, setup_progress\n"
            "with setup_progress('MinibatchBarker', delay=0.0):\n"
            "    note('compiling the per-row likelihood')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert "MinibatchBarker set-up: compiling the per-row likelihood" in out.stderr


def test_a_row_without_likelihood_at_the_start_is_refused_not_worked_around():
    """With ``control_variate="auto"`` a data fault is raised, not a fallback warning."""
    y = np.random.default_rng(0).exponential(1.0, size=2_000)
    y[10] = -1.0
    with pm.Model():
        lam = pm.HalfNormal("lam", 2)
        pm.Exponential("y", lam, observed=y)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(StartPointError, match="row 10"):
                MinibatchBarker()
    assert not [w for w in caught if "control variates do not apply" in str(w.message)]
