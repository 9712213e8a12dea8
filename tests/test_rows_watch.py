"""Never grind silently: a chain whose test reads most of the data says so after 100
transitions (a warning once per chain and the ``grinding`` stat), and a chain whose
minibatches stay small does not."""

from __future__ import annotations

import warnings

import numpy as np
import pymc as pm
from conftest import sample_kwargs

from pymc_minibatch_mh import ExactMH, MinibatchBarker
from pymc_minibatch_mh.model.compat import sample_stats
from pymc_minibatch_mh.transition.rows_watch import WINDOW, RowsWatch

N = 2000


def normal_model():
    y = np.random.default_rng(3).normal(1.0, 1.0, size=N)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 10.0)
        pm.Normal("y", mu, 1.0, observed=y)
    return model


def test_block_mean_and_share():
    watch = RowsWatch(window=4, share=0.25)
    # Not before the first block is complete, however large the rows.
    assert [watch.update(100, 100) for _ in range(3)] == [False] * 3
    assert watch.update(100, 100)
    assert watch.mean == 100
    # The verdict holds until the next block is complete: 10, 10, 10, 70 -> 25, not over.
    assert all(watch.update(10, 100) for _ in range(3))
    assert not watch.update(70, 100)
    assert watch.mean == 25
    # At exactly the share it is not over it.
    assert not RowsWatch(window=1, share=0.25).update(25, 100)


def _sample(step, draws=150):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        idata = pm.sample(draws=draws, tune=0, step=step, chains=2, cores=1,
                          **sample_kwargs(random_seed=4))
    grinding = [w for w in caught if "'grinding' sample stat" in str(w.message)]
    return np.asarray(sample_stats(idata)["grinding"]), grinding


def test_a_grinding_chain_warns_once_per_chain_with_what_it_measured():
    # Moves of ten posterior sds at temperature 1 without control variates: the test
    # needs almost every row at each step.
    with normal_model():
        step = MinibatchBarker(batch_size=50, S=[10.0 / np.sqrt(N)], tune=False,
                               control_variate=None)
        flags, caught = _sample(step)
    assert len(caught) == 2  # one per chain
    message = str(caught[0].message)
    assert f"of the N = {N:,} rows" in message and f"over {WINDOW} transitions" in message
    assert "control_variate='auto'" in message
    # Not before the first block is complete; then on every draw (the test stays near N).
    assert not flags[:, : WINDOW - 1].any()
    assert flags[:, WINDOW - 1:].all()


def test_small_minibatches_and_full_data_methods_do_not_warn():
    with normal_model():
        flags, caught = _sample(MinibatchBarker(control_variate="taylor"))
        assert not caught and not flags.any()
        # ExactMH reads N rows by design: never called grinding.
        flags, caught = _sample(ExactMH(), draws=110)
        assert not caught and not flags.any()
