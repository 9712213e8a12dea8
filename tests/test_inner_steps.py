"""steps_per_draw: several transitions per draw, and the stats of such a draw.

- the setting: "auto" by the kind of proposal, bad values refused with the reason;
- exactness: with the same seed, steps_per_draw=k gives every k-th state of the chain
  with one transition per draw, and the draw's stats combine its k transitions (rows
  summed, the acceptance averaged, the rest from the last transition);
- the combination rule itself, on made-up stats (an audited transition is the one kept).
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest
from conftest import sample_kwargs
from test_proposal_choice import normal_model

from pymc_minibatch_mh import AustereMH, MinibatchBarker
from pymc_minibatch_mh.model.compat import posterior, sample_stats
from pymc_minibatch_mh.proposals import (
    CrankNicolsonProposal,
    RandomWalkProposal,
    SurrogateNUTSProposal,
    SurrogateTransitionProposal,
)
from pymc_minibatch_mh.transition.inner_steps import merge_stats, resolve_steps_per_draw


def test_auto_and_refusals():
    # what each proposal declares (the proposals are not built: the class attribute is read)
    assert resolve_steps_per_draw("auto", CrankNicolsonProposal) == 3
    assert resolve_steps_per_draw("auto", SurrogateTransitionProposal) == 3
    assert resolve_steps_per_draw("auto", SurrogateNUTSProposal) == 4
    assert resolve_steps_per_draw("auto", RandomWalkProposal) == 1
    assert resolve_steps_per_draw(5, RandomWalkProposal) == 5
    with normal_model():
        # Crank–Nicolson: 3 with Barker's test and the penalty test at σ = 0.5, one with
        # the penalty test at a σ that accepts at least 0.9 of perfect proposals.
        assert MinibatchBarker(control_variate="taylor", acceptance="barker").steps_per_draw == 3
        assert MinibatchBarker(control_variate="taylor").steps_per_draw == 3
        assert MinibatchBarker(control_variate="taylor", acceptance="penalty",
                               sigma=0.25).steps_per_draw == 1
        assert MinibatchBarker(control_variate="taylor", acceptance="penalty", sigma=0.25,
                               steps_per_draw=3).steps_per_draw == 3
        assert MinibatchBarker(batch_size=50, control_variate=None).steps_per_draw == 1
        assert MinibatchBarker(batch_size=50, control_variate=None,
                               steps_per_draw=4).steps_per_draw == 4
        for bad in (0, -1, 2.0, True, "many", None):
            with pytest.raises(ValueError, match="steps_per_draw must be a positive integer"):
                MinibatchBarker(batch_size=50, steps_per_draw=bad)


@pytest.mark.parametrize("step_class", [MinibatchBarker, AustereMH])
def test_k_transitions_per_draw_are_every_kth_state_of_one_per_draw(step_class):
    k, n = 3, 200
    runs = {}
    for per_draw, draws in ((1, k * n), (k, n)):
        with normal_model():
            # a wide random walk in the Laplace metric: both tests accept and reject
            step = step_class(control_variate="taylor", S="laplace", scaling=2.5,
                              batch_size=20, tune=False, steps_per_draw=per_draw)
            idata = pm.sample(draws=draws, tune=0, step=step, chains=1,
                              initvals={"mu": np.array(1.2)}, **sample_kwargs(random_seed=9))
        runs[per_draw] = (np.asarray(posterior(idata)["mu"]).ravel(), sample_stats(idata))
    one, ss1 = runs[1]
    many, ssk = runs[k]
    np.testing.assert_array_equal(many, one[k - 1::k])
    rows1 = np.asarray(ss1["batch_size"]).ravel().reshape(n, k)
    np.testing.assert_array_equal(np.asarray(ssk["batch_size"]).ravel(), rows1.sum(axis=1))
    acc1 = np.asarray(ss1["accepted"]).ravel().reshape(n, k)
    np.testing.assert_allclose(np.asarray(ssk["accepted"]).ravel(), acc1.mean(axis=1))
    assert 0.2 < acc1.mean() < 0.9  # the test moved and rejected: the check has teeth
    last = np.asarray(ss1["mean_batch_size"]).ravel()[k - 1::k]
    np.testing.assert_allclose(np.asarray(ssk["mean_batch_size"]).ravel(), last)


def test_merge_rule():
    base = dict(batch_size=10, growth_rounds=1, extra_evaluations=0, full_data=False,
                nonfinite=False, recentered=False, accepted=1.0, accept=0.6, audited=False,
                error_estimate=0.01, scaling=1.0)
    a = dict(base)
    b = dict(base, batch_size=30, growth_rounds=3, full_data=True, accepted=0.0, accept=0.2,
             audited=True, error_estimate=0.05, extra_evaluations=1000)
    c = dict(base, scaling=2.0, error_estimate=0.02)
    merged = merge_stats([a, b, c])
    assert merged["batch_size"] == 50 and merged["growth_rounds"] == 5
    assert merged["extra_evaluations"] == 1000 and merged["full_data"] is True
    assert merged["accepted"] == pytest.approx(2 / 3) and merged["accept"] == pytest.approx(
        1.4 / 3)
    # the audited transition's own stats are kept, so its error estimate meets its audit
    assert merged["audited"] and merged["error_estimate"] == 0.05 and merged["scaling"] == 1.0
    assert merge_stats([c]) is c
    assert merge_stats([a, c])["scaling"] == 2.0
