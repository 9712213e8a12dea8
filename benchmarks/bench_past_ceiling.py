"""Benchmark (issue 29, item 2, a first measurement): past Barker's acceptance ceiling.

Barker's test accepts at most about half of even a perfect proposal, so the zero-config
step needs about 4.5 transitions per effective sample on the logistic grid. A
Metropolis-type test accepts a near-perfect proposal almost always. This script measures,
in one run, same data and seed (logistic regressions of ``bench_tall_glm.py``, PyMC's
default draws, 2 chains one after another, control variates on every arm, the
Crank–Nicolson proposal that zero-config picks):

- ``barker``: the zero-config ``MinibatchBarker(control_variate="taylor")`` (3 transitions
  per draw, rows per round sized by the error budget);
- ``barker, 1/draw``: the same with one transition per draw;
- ``austere m``: ``AustereMH(control_variate="taylor", batch_size=m, steps_per_draw=1)``,
  Korattikara et al.'s sequential t-test (a Metropolis-type threshold test) on the Taylor
  residuals, with a fixed design; its ``error_estimate`` is a bound, not an estimate.

Columns as ``bench_error_budget.py`` (rows per ESS count every row after the set-up,
tuning included), plus the acceptance rate. The last column compares each arm's means with
the zero-config arm's. This is a measurement, not a recommendation: AustereMH's error
with a 5-row design is a bound from its dynamic program, not audited here.

    PYTHONPATH=$PWD python benchmarks/bench_past_ceiling.py               # 1e5:10, 1e6:10, 1e6:30
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_error_budget as budget  # noqa: E402

from pymc_minibatch_mh import AustereMH, MinibatchBarker  # noqa: E402

DEFAULT_CONFIGS = ["logistic:1e5:10", "logistic:1e6:10", "logistic:1e6:30"]
ARMS = {
    "barker": (MinibatchBarker, {}),
    "barker, 1/draw": (MinibatchBarker, {"steps_per_draw": 1}),
    "austere 5": (AustereMH, {"batch_size": 5, "steps_per_draw": 1}),
    "austere 20": (AustereMH, {"batch_size": 20, "steps_per_draw": 1}),
}


def main(argv=None):
    budget.main(argv, DEFAULT_CONFIGS, ARMS, __doc__)


if __name__ == "__main__":
    main()
