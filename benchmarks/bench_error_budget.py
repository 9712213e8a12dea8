"""Benchmark: rows per round sized by the error budget against the fixed 100 rows, same run.

The zero-config step ``MinibatchBarker(control_variate="taylor")`` twice per configuration,
in one process, with the same data and seed: ``batch_size=100`` (100 rows per round at every
transition) and ``batch_size="auto"`` (the default: rows per round sized by
``error_tolerance`` = 10⁻³ from the tuning's measuring transitions; see
``pymc_minibatch_mh.core.batch_budget``). Logistic regressions of ``bench_tall_glm.py``
(same data, same prior), PyMC's default draws, chains one after another. A first step is
built and discarded so that both arms find the same warm compilation caches.

Per arm it prints: set-up and sampling seconds, min bulk ESS and max R-hat over the
coefficients, the rows per round of the sampled draws, rows per transition while
sampling, rows per ESS (every row the step read after its set-up, tuning included, over
the min bulk ESS, as ``bench_mhss.py`` counts them), ESS per transition, ESS/s with
set-up, the mean ``error_estimate`` of the sampled draws, and the largest
|Δmean|/combined MCSE between the arms. Rows are ``batch_size`` + ``extra_evaluations``.

    PYTHONPATH=$PWD python benchmarks/bench_error_budget.py    # N ∈ 1e5, 1e6; d ∈ 10, 30, 100
    PYTHONPATH=$PWD python benchmarks/bench_error_budget.py --configs logistic:1e7:10
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pymc as pm

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_tall_glm as tall

from pymc_minibatch_mh import MinibatchBarker
from pymc_minibatch_mh.model.compat import group, posterior, sample_stats

DEFAULT_CONFIGS = [f"logistic:{n}:{d}" for n in ("1e5", "1e6") for d in (10, 30, 100)]
ARMS = {"fixed 100": (MinibatchBarker, {"batch_size": 100}),
        "auto": (MinibatchBarker, {})}


def run_arm(cfg, model, kwargs, seed, cls=MinibatchBarker):
    """One arm: ``cls(control_variate="taylor", **kwargs)`` with PyMC's defaults, 2 chains."""
    start = time.perf_counter()
    with model:
        step = cls(control_variate="taylor", **kwargs)
    setup = time.perf_counter() - start
    start = time.perf_counter()
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        idata = pm.sample(step=step, chains=2, cores=1, random_seed=seed, progressbar=False,
                          compute_convergence_checks=False, discard_tuned_samples=False)
    sampling = time.perf_counter() - start
    stats, warm = sample_stats(idata), group(idata, "warmup_sample_stats")
    rows = sum(float(np.asarray(s[k]).sum()) for s in (stats, warm)
               for k in ("batch_size", "extra_evaluations"))
    draws = tall.scalars({k: np.asarray(posterior(idata)[k]) for k in tall.free_names(cfg)},
                         tall.free_names(cfg))
    ess, _, rhat = tall.ess_rhat(draws)
    transitions = np.asarray(stats["batch_size"]).size * step.steps_per_draw
    sampled_rows = float(np.asarray(stats["batch_size"]).sum())
    return {
        "setup": setup, "sampling": sampling, "ess": ess, "rhat": rhat,
        "m": (sorted(set(np.asarray(stats["rows_per_round"]).ravel().tolist()))
              if "rows_per_round" in stats else [step.batch_size]),
        "rows_per_transition": sampled_rows / transitions,
        "rows_per_ess": rows / ess, "ess_per_transition": ess / transitions,
        "ess_per_s": ess / (setup + sampling),
        "error": float(np.asarray(stats["error_estimate"]).mean()), "draws": draws,
        "accept": float(np.asarray(stats["accepted"]).mean()),
    }


def run_grid(configs: str, arms: dict, seed: int) -> list[str]:
    """Every arm on every configuration; the table's lines (the first arm is the reference
    of the last column). ``arms`` maps a name to ``(step class, keyword arguments)``."""
    lines = [
        f"load average {os.getloadavg()[0]:.2f} at the start; PyMC {pm.__version__}", "",
        "| N, d | arm | set-up s | sampling s | min bulk ESS | R-hat | acceptance "
        "| rows per round | rows/transition | rows/ESS | ESS/transition | ESS/s incl. set-up "
        "| mean error_estimate | max abs Δmean/MCSE |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: "
        "| ---: | ---: |",
    ]
    first = next(iter(arms))
    for text in configs.split(","):
        cfg = tall.parse_config(text)
        data = tall.make_data(cfg, seed, tall.design_dtype(cfg, "auto"))
        model = tall.make_pymc_model(cfg, data)
        with model:
            MinibatchBarker(control_variate="taylor")  # warm the compilation caches
        results = {arm: run_arm(cfg, model, kw, seed, cls) for arm, (cls, kw) in arms.items()}
        ref = results[first]["draws"]
        for arm, r in results.items():
            agree = tall.agreement(r["draws"], ref)[0] if arm != first else float("nan")
            lines.append(
                f"| {cfg.n:.0e}, {cfg.d} | {arm} | {r['setup']:.1f} | {r['sampling']:.1f} "
                f"| {r['ess']:,.0f} | {r['rhat']:.3f} | {r['accept']:.2f} "
                f"| {', '.join(map(str, r['m']))} | {r['rows_per_transition']:.1f} "
                f"| {r['rows_per_ess']:,.1f} | {r['ess_per_transition']:.2f} "
                f"| {r['ess_per_s']:,.0f} | {r['error']:.1e} | {agree:.2f} |"
            )
            print(lines[-1], flush=True)
    return lines


def main(argv=None, default_configs=DEFAULT_CONFIGS, arms=ARMS, doc=__doc__):
    """Parse the command line and print the table (``bench_past_ceiling.py`` reuses it)."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--configs", default=",".join(default_configs),
                   help="comma-separated logistic:N:d")
    p.add_argument("--seed", type=int, default=2017)
    args = p.parse_args(argv)
    print("\n".join(run_grid(args.configs, arms, args.seed)))


if __name__ == "__main__":
    main()
