"""Faults during sampling: NaN likelihoods and exceptions inside parallel chains."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pymc as pm
import pytest
from conftest import nan_model, sample_kwargs

from pymc_minibatch_mh import MinibatchBarker
from pymc_minibatch_mh.model.compat import posterior, sample_stats


def test_nan_loglik_rejects_counts_and_warns_once():
    model = nan_model()
    with model:
        step = MinibatchBarker(batch_size=50, temperature=50.0, S=[0.3], tune=False)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            idata = pm.sample(draws=300, tune=0, step=step, chains=1, **sample_kwargs())
    ss = sample_stats(idata)
    nonfinite = np.asarray(ss["nonfinite"])
    assert nonfinite.sum() > 5  # proposals beyond 0.3 happen often
    assert np.all(np.asarray(ss["accepted"])[nonfinite] == 0.0)
    assert np.all(np.asarray(posterior(idata)["mu"]) <= 0.3)
    ours = [w for w in caught if "NaN or infinite log-likelihood" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in caught]


class FailingBarker(MinibatchBarker):
    """Raises inside the chain after a few steps (to test error propagation)."""

    def step(self, point):
        if self._chain_steps >= 5:
            raise RuntimeError("deliberate failure inside the step")
        return super().step(point)


def test_exception_in_parallel_chain_reaches_user_with_chain_number():
    data = np.random.default_rng(1).normal(size=300)
    with pm.Model():
        mu = pm.Normal("mu")
        pm.Normal("y", mu, 1, observed=data)
        step = FailingBarker(batch_size=50, temperature=10.0, S=[0.1], tune=False)
        with pytest.raises(Exception) as info:
            pm.sample(draws=20, tune=0, step=step, chains=2, cores=2, mp_ctx="fork",
                      **sample_kwargs())
    # PyMC's ParallelSamplingError: "Chain 1 failed with: <cause>", cause chained.
    assert re.search(r"Chain \d failed with: deliberate failure inside the step", str(info.value))
    assert isinstance(info.value.__cause__, RuntimeError)
