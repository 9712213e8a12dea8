"""The warning of a default error budget that its 100-row cap misses: it names the cap, says
that an explicit ``error_tolerance`` has none, and prints the predicted error and the
budget so that they read differently."""

from __future__ import annotations

import dataclasses
import re
import warnings

import numpy as np
import pymc as pm
import pytest
from conftest import sample_kwargs

from pymc_minibatch_mh import MinibatchBarker
from pymc_minibatch_mh.core.batch_budget import AUTO_START_ROWS, DEFAULT_ERROR_TOLERANCE

N = 5000

#: The bound the budget holds and the budget, as the message prints them.
NUMBERS = re.compile(r"and (\S+) with .* added .*above the default error_tolerance=(\S+) \(")


def _over_budget_messages(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if "the most the default error budget" in
            str(w.message)]


def _check(message: str, bound: float) -> None:
    assert f"capped at {AUTO_START_ROWS} rows per round" in message
    assert "An explicit error_tolerance has no such cap, even at the default value" in message
    match = NUMBERS.search(message)
    assert match is not None, message
    shown_bound, shown_tolerance = match.groups()
    assert shown_bound != shown_tolerance
    assert float(shown_bound) == pytest.approx(bound, rel=0.05)
    assert float(shown_tolerance) == pytest.approx(DEFAULT_ERROR_TOLERANCE, rel=0.05)


def test_the_capped_default_budget_prints_the_error_and_the_budget_apart():
    # Without control variates at temperature 1, 100 rows per round leave the test's
    # predicted error above the default budget on this model.
    y = np.random.default_rng(3).normal(1.0, 1.0, size=N)
    with pm.Model():
        mu = pm.Normal("mu", 0.0, 10.0)
        pm.Normal("y", mu, 1.0, observed=y)
        step = MinibatchBarker(control_variate=None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pm.sample(draws=10, tune=700, step=step, chains=1, cores=1,
                      **sample_kwargs(random_seed=1))
    choice = step.rows_choice
    assert not choice.within_budget and choice.rows == AUTO_START_ROWS
    assert choice.error_bound > DEFAULT_ERROR_TOLERANCE
    messages = _over_budget_messages(caught)
    assert len(messages) == 1
    _check(messages[0], choice.error_bound)

    # A bound just above the budget, which two significant digits print alike.
    close = dataclasses.replace(choice, error_bound=1.004 * DEFAULT_ERROR_TOLERANCE)
    step._over_budget_warned = False
    with pytest.warns(RuntimeWarning, match="the most the default error budget") as again:
        step._warn_over_budget(close)
    message = _over_budget_messages(list(again))[0]
    _check(message, close.error_bound)
    assert "0.001004" in message
