"""Crossed random intercepts: zero-config against a converged full-data reference.

nutpie does not converge on the model zoo's crossed family (``bench_model_zoo.py``), so
its accuracy is checked against the same step with ``batch_size = N``: every test is then
the exact Barker test on all rows, and its law does not depend on the minibatch error.
The reference is slow (about 440 s of sampling at N = 3·10⁴ and 3,300 s at 3·10⁵ on this
machine), so it is written to ``--cache`` and read from there on later runs.

Prints, for the zero-config chain: set-up and sampling seconds, min bulk ESS, max R-hat,
rows per transition (the test's and the others', ``extra_evaluations``: re-centrings),
the rows of the levels expanded around their shift, and over every scalar the largest
|Δmean| in combined Monte Carlo standard errors and the largest |sd ratio − 1| against
the reference, and how many scalars are beyond 3 MCSE.

    OPENBLAS_NUM_THREADS=1 python benchmarks/bench_crossed_reference.py --n 3e4
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import arviz as az
import numpy as np
import pymc as pm

sys.path.insert(0, str(Path(__file__).parent))
from bench_model_zoo import make_model

from pymc_minibatch_mh import MinibatchBarker


def run(model: pm.Model, seed: int, draws: int = 1000, tune: int = 1000,
        **settings) -> tuple[az.InferenceData, dict]:
    """Zero-config (with ``settings``) on ``model``, 2 chains (PyMC's default draws)."""
    with model:
        t0 = time.perf_counter()
        step = MinibatchBarker(control_variate="taylor", **settings)
        t1 = time.perf_counter()
        idata = pm.sample(draws=draws, tune=tune, step=step, chains=2, cores=1,
                          random_seed=seed, progressbar=False,
                          compute_convergence_checks=False)
        t2 = time.perf_counter()
    stats = idata.sample_stats
    per_draw = step.steps_per_draw
    return idata, {
        "set-up s": t1 - t0, "sampling s": t2 - t1,
        "test rows": float(stats["batch_size"].mean()) / per_draw,
        "extra rows": float(stats["extra_evaluations"].mean()) / per_draw,
        "set rows": step.control_variate.set_rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=float, default=3e4, help="rows N (default 3e4)")
    parser.add_argument("--seed", type=int, default=2017, help="data and chain seed")
    parser.add_argument("--cache", type=Path, default=Path("benchmarks/output"),
                        help="where the reference is kept (reference_<N>.nc)")
    parser.add_argument("--reference-draws", type=int, default=1000,
                        help="draws and tuning steps per chain of a new reference (shorter "
                             "at large N: about 3 h at N = 10⁶ with 1000)")
    args = parser.parse_args()
    n = int(args.n)
    model = make_model("crossed", n, args.seed)
    path = args.cache / f"reference_{n}.nc"
    if path.exists():
        reference = az.from_netcdf(path)
        print(f"reference read from {path} "
              f"({reference.posterior.sizes['draw']} draws per chain)")
    else:
        reference, info = run(model, 7, args.reference_draws, args.reference_draws,
                              batch_size=n)
        args.cache.mkdir(parents=True, exist_ok=True)
        reference.to_netcdf(path)
        print(f"reference (batch_size = N): sampling {info['sampling s']:.0f} s, "
              f"written to {path}")
    idata, info = run(model, args.seed)
    a = az.summary(idata, round_to="none")
    b = az.summary(reference, round_to="none")
    z = ((a["mean"] - b["mean"]) / np.hypot(a["mcse_mean"], b["mcse_mean"])).abs()
    r = (a["sd"] / b["sd"] - 1.0).abs()
    print(f"N = {n:,}: set-up {info['set-up s']:.0f} s, sampling {info['sampling s']:.0f} s, "
          f"min bulk ESS {a['ess_bulk'].min():,.0f}, max R-hat {a['r_hat'].max():.3f}, rows "
          f"per transition {info['test rows'] + info['extra rows']:,.0f} (test "
          f"{info['test rows']:,.0f}, others {info['extra rows']:,.0f}); the set of levels "
          f"expanded around their shift: {info['set rows']:,} rows")
    print(f"against the reference ({b['ess_bulk'].min():,.0f} min bulk ESS, max R-hat "
          f"{b['r_hat'].max():.3f}): max |Δmean|/MCSE {z.max():.2f} ({z.idxmax()}), max "
          f"|sd ratio − 1| {r.max():.3f} ({r.idxmax()}), {int((z > 3).sum())} of {z.size} "
          "scalars beyond 3 MCSE")


if __name__ == "__main__":
    main()
