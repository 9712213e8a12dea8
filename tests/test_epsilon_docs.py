"""What the docs say about ``epsilon``, checked against the code that computes it.

``epsilon`` averages above 1 on real models while the audited errors are small; a user
reading "above 1 the normal approximation is not to be trusted" could not tell whether to
worry. The README and the stats page must say what it bounds, why it
exceeds 1 at small batch sizes (with figures, checked here against
:func:`~pymc_minibatch_mh.core.moments.clt_error_bound` on exactly normal ratios) and
which stats to read instead.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from pymc_minibatch_mh.core.moments import clt_error_bound

ROOT = Path(__file__).resolve().parent.parent
PASSAGES = {
    "README.md": ("The test is approximate", "## Two commands"),
    "docs/guide/sample_stats.md": ("- **`epsilon`**", "- **`delta_variance`**"),
}


def _passage(path: str) -> str:
    text = (ROOT / path).read_text(encoding="utf-8")
    start, end = PASSAGES[path]
    return text[text.index(start):text.index(end)]


def _mean_epsilon_of_normal_ratios(b: int) -> float:
    rng = np.random.default_rng(b)
    return float(np.mean([clt_error_bound(v, v.mean())[0]
                          for v in rng.standard_normal((4000, b))]))


@pytest.mark.parametrize("path", list(PASSAGES))
def test_epsilon_passage_says_what_to_read_instead(path):
    passage = _passage(path)
    for needed in ("error_estimate", "audit_every", "audit_summary", "vacuous",
                   "not by itself a cause for alarm" if path.endswith("stats.md")
                   else "not by themselves a cause for alarm"):
        assert needed in passage, (path, needed)
    # The misleading reading is absent.
    assert "not to be trusted" not in passage and "not trustworthy" not in passage


@pytest.mark.parametrize("path", list(PASSAGES))
def test_epsilon_figures_for_normal_ratios_match_the_code(path):
    passage = _passage(path).replace("$", "").replace(r"\approx", "≈")
    claim = passage[passage.index("11.8/"):]
    claim = claim[:claim.index(";")]
    figures = re.findall(r"(\d\.\d+) at b = (\d+)", claim)
    assert len(figures) >= 2, claim
    for value, b in figures:
        assert _mean_epsilon_of_normal_ratios(int(b)) == pytest.approx(float(value),
                                                                       abs=0.02)
    b_one = int(re.search(r"below 1 only from b ≈ (\d+)", claim).group(1))
    assert _mean_epsilon_of_normal_ratios(b_one - 10) > 1.0
    assert _mean_epsilon_of_normal_ratios(b_one + 10) < 1.0
