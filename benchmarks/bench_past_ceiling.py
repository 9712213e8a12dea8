"""Benchmark: past Barker's acceptance ceiling.

Barker's test accepts at most about half of even a perfect proposal, so with Barker's
test the step needs about 4.5 transitions per effective sample on the logistic grid. A
Metropolis-type test accepts a near-perfect proposal almost always. This script measures,
in one run, same data and seed (logistic regressions of ``bench_tall_glm.py``, PyMC's
default draws, 2 chains one after another, control variates on every arm, the
Crank–Nicolson proposal that zero-config picks, rows per round sized by the error budget):

- ``zero-config``: ``MinibatchBarker(control_variate="taylor")`` (``acceptance="auto"``:
  the penalty test at the σ of ``PENALTY_SIGMAS`` with the least predicted work per
  effective sample and one transition per draw, or Barker's test with 3 where that
  predicts less);
- ``barker``: the same with ``acceptance="barker"`` (3 transitions per draw; the
  zero-config step before the penalty test);
- ``barker, 1/draw``: Barker's test with one transition per draw;
- ``penalty σ, k/draw``: the penalty test (:mod:`pymc_minibatch_mh.core.penalty`) with σ
  and k transitions per draw;
- ``austere 20``: ``AustereMH(control_variate="taylor", batch_size=20, steps_per_draw=1)``,
  Korattikara et al.'s sequential t-test (a Metropolis-type threshold test) on the Taylor
  residuals, with a fixed design; its ``error_estimate`` is a bound, not an estimate.

Columns as ``bench_error_budget.py`` (rows per ESS count every row after the set-up,
tuning included), plus the acceptance rate. The last column compares each arm's means with
the first arm's.

    PYTHONPATH=$PWD python benchmarks/bench_past_ceiling.py   # 1e5:10, 1e6:10, 1e6:30
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_error_budget as budget

from pymc_minibatch_mh import AustereMH, MinibatchBarker

DEFAULT_CONFIGS = ["logistic:1e5:10", "logistic:1e6:10", "logistic:1e6:30"]
ARMS = {
    "zero-config": (MinibatchBarker, {}),
    "barker": (MinibatchBarker, {"acceptance": "barker"}),
    "barker, 1/draw": (MinibatchBarker, {"acceptance": "barker", "steps_per_draw": 1}),
    **{f"penalty {sigma}, 1/draw": (
        MinibatchBarker, {"acceptance": "penalty", "sigma": sigma, "steps_per_draw": 1})
       for sigma in (1.0, 0.75, 0.5, 0.35, 0.25, 0.1)},
    "penalty 0.5, 3/draw": (MinibatchBarker, {"acceptance": "penalty", "sigma": 0.5,
                                              "steps_per_draw": 3}),
    "austere 20": (AustereMH, {"batch_size": 20, "steps_per_draw": 1}),
}


def main(argv=None):
    budget.main(argv, DEFAULT_CONFIGS, ARMS, __doc__)


if __name__ == "__main__":
    main()
