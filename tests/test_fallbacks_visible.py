"""When a faster or more thorough path is given up, the user is told (a RuntimeWarning).

The batched products' fallback is tested with them, in ``test_pytensor_internals.py``."""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytensor.link.numba.dispatch as numba_dispatch
import pytensor.tensor as pt
import pytest

from pymc_minibatch_mh.model import function_cache
from pymc_minibatch_mh.model.checks import validate_split
from pymc_minibatch_mh.model.compilation import object_mode_ops


def test_a_scalar_op_numba_cannot_be_asked_about_is_said(monkeypatch):
    x = pt.dvector("x")

    def fails(*args, **kwargs):
        raise TypeError("cannot build this node")

    monkeypatch.setattr(numba_dispatch, "numba_funcify", fails)
    with pytest.warns(RuntimeWarning, match="could not be asked ahead of compiling.*TypeError"):
        assert object_mode_ops(pt.exp(x)) == []


def test_a_function_that_does_not_pickle_is_not_cached_and_said(tmp_path):
    with pytest.warns(RuntimeWarning, match="not stored, so a new process compiles it again"):
        function_cache._store(tmp_path / "entry.pkl", (lambda: 1,), [])
    assert not list(tmp_path.iterdir())


def test_split_check_points_the_model_cannot_evaluate_are_said():
    n = 40
    with pm.Model() as model:
        pm.Normal("mu")
    start = model.initial_point()

    def full_loglik(flat):
        if flat[0] != start["mu"]:
            raise FloatingPointError("overflow at this point")
        return np.zeros(n)

    with pytest.warns(RuntimeWarning, match="not at 2 of the 2 random points.*FloatingPointError"):
        validate_split(model, start, n_rows=n,
                       set_point=lambda p: np.atleast_1d(np.asarray(p["mu"], dtype=float)),
                       full_loglik=full_loglik,
                       rows_loglik=lambda flat, rows: np.zeros(rows.shape[0]),
                       data_lengths=dict)
