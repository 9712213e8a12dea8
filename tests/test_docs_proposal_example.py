"""The guide's "Writing a proposal" example runs, and samples the right posterior.

The code is read from ``docs/guide/proposals.md`` (the first ``python`` block of the
section), so the page and the test cannot drift apart. The model is conjugate: the chain's
mean of ``mu`` must match the exact posterior mean within 4 Monte Carlo standard errors
(batch means). A proposal that drifts (``x + scale · (u + 0.5)``) but still reports a
log-q ratio of 0 fails this check.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from pymc_minibatch_mh.model.compat import posterior, sample_stats

PAGE = Path(__file__).resolve().parent.parent / "docs" / "guide" / "proposals.md"


def example_code() -> str:
    """The first ``python`` code block of the page's "Writing a proposal" section."""
    text = PAGE.read_text(encoding="utf-8")
    section = text.split("## Writing a proposal", 1)
    assert len(section) == 2, f"{PAGE} has no '## Writing a proposal' section"
    block = re.search(r"```python\n(.*?)```", section[1], flags=re.DOTALL)
    assert block is not None, "the 'Writing a proposal' section has no python block"
    return block.group(1)


def batch_means_mcse(draws: np.ndarray, n_batches: int = 20) -> float:
    """Monte Carlo standard error of the mean of ``draws`` (chain, draw) by batch means."""
    chains, n = draws.shape
    size = n // n_batches
    means = draws[:, : size * n_batches].reshape(chains * n_batches, size).mean(axis=1)
    return float(means.std(ddof=1) / np.sqrt(means.size))


@pytest.fixture(scope="module")
def example() -> dict:
    namespace: dict = {"__name__": "docs_proposal_example"}
    exec(compile(example_code(), str(PAGE), "exec"), namespace)
    return namespace


def test_example_uses_the_custom_proposal(example: dict) -> None:
    step = example["step"]
    assert type(step.proposal).__name__ == "UniformBoxProposal"
    stats = sample_stats(example["idata"])
    assert "scaling" in stats  # uses_scale: the tuned scale is recorded
    assert "rho" not in stats and "step_size" not in stats  # reports_parameters = False
    assert 0.05 < float(stats["accepted"].mean()) < 0.95


def test_example_samples_the_exact_posterior(example: dict) -> None:
    y = example["y"]
    # mu ~ N(0, 10²), y_i ~ N(mu, 2²): the posterior of mu is normal.
    precision = 1.0 / 10.0**2 + y.size / 2.0**2
    exact_mean = (y.sum() / 2.0**2) / precision
    draws = np.asarray(posterior(example["idata"])["mu"])
    mcse = batch_means_mcse(draws)
    assert abs(draws.mean() - exact_mean) < 4.0 * mcse, (draws.mean(), exact_mean, mcse)
    assert draws.std() == pytest.approx(precision**-0.5, rel=0.15)
