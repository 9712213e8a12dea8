"""The settings guide's σ table is measured by benchmarks/bench_sigma.py.

The table gives rows per step relative to σ = 1 as measured, not as the computed 1/σ². The
benchmark measures them with the exact audit; this runs it at a tiny size and checks that what it
reports is what the step did, and that the guide shows the measured column and names the
command that measured it.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    path = ROOT / "benchmarks" / "bench_sigma.py"
    spec = importlib.util.spec_from_file_location("bench_sigma", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_sigma_measures_rows_and_audited_error(capsys):
    table = _bench().main(["--n", "20000", "--draws", "60", "--chains", "1",
                           "--audit-every", "3", "--sigmas", "1.0,1.5"])
    assert list(table.index) == [1.0, 1.5]
    assert (table["audited"] == 20).all()
    # measured, not computed: the ratio is the two runs' mean batch sizes
    ratio = table.loc[1.5, "rows per step"] / table.loc[1.0, "rows per step"]
    assert table.loc[1.5, "rows vs sigma=1"] == pytest.approx(ratio)
    assert table.loc[1.5, "computed 1/sigma^2"] == pytest.approx(1 / 1.5**2)
    assert (table["rows per step"] >= 50).all()  # never below the first minibatch
    for column in ("error_low", "error_mean", "error_high"):
        assert np.isfinite(table[column]).all()
    assert (table["error_low"] <= table["error_mean"]).all()
    assert "rows vs σ=1 (measured)" in capsys.readouterr().out


def test_settings_guide_shows_the_measured_rows():
    text = (ROOT / "docs" / "guide" / "settings.md").read_text(encoding="utf-8")
    section = text[text.index("## σ and the correction table"):]
    section = section[: section.index("\n## ", 5)]
    assert "benchmarks/bench_sigma.py" in section
    assert "(measured)" in section
    assert not re.search(r"round\(1 / s\*\*2", section)  # the computed column is gone
