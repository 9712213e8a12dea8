"""Study: is the error budget's choice of m right? Two checks of zero-config's law.

1. **The audit** (``--audit``): the zero-config step with ``audit_every`` on the MH-SS
   grid's flat-prior logistic regression (``bench_mhss.make_flat_model``, data from
   ``bench_tall_glm.make_data``, seed 2017), PyMC's default draws, 2 chains. Per
   configuration: the test and m the chain chose, the audited bias of the acceptance
   probability (``audit_summary``'s ``error_mean``, and ``aligned_error_mean``, with 95 %
   intervals) and the mean ``error_estimate`` of the steps. The estimate is not
   optimistic when the bias is not resolved above it.
2. **The budget over seeds** (``--seeds``): the fast test's model (logistic regression,
   N = 10⁴, d = 10, N(0, 5²) prior: ``tests/test_batch_budget.py``'s), one chain of
   1000 + 1000 per seed. Per seed: the chosen m, the sampled draws' mean
   ``error_estimate`` over the budget (1e-3) with its standard error, and the bulk ESS.
   The choice holds an upper bound of the predicted mean to the budget, so the draws'
   mean should be within it in most chains.

Usage::

    python benchmarks/study_budget_audit.py --audit 1e6:10,1e7:10 --seeds 16

Each 10⁷-row audit reads the whole data set at every fifth step (about 30 min here).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import arviz as az
import numpy as np
import pymc as pm

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_mhss import make_flat_model, parse_config  # noqa: E402
from bench_tall_glm import design_dtype, make_data  # noqa: E402

from pymc_minibatch_mh import MinibatchBarker, audit_summary  # noqa: E402
from pymc_minibatch_mh.core.batch_budget import DEFAULT_ERROR_TOLERANCE  # noqa: E402
from pymc_minibatch_mh.model.compat import posterior, sample_stats  # noqa: E402


def audit(text: str, every: int, seed: int) -> str:
    cfg = parse_config(text)
    data = make_data(cfg, seed, design_dtype(cfg, "auto"))
    model = make_flat_model(cfg, data)
    start = time.perf_counter()
    with model:
        step = MinibatchBarker(control_variate="taylor", audit_every=every)
        idata = pm.sample(step=step, chains=2, cores=1, random_seed=seed, progressbar=False,
                          compute_convergence_checks=False)
    row = audit_summary(idata).loc["all"]
    test = (f"penalty, σ = {step.sigma:g}" if step.acceptance == "penalty"
            else f"Barker, σ = {step.sigma:g}")

    def interval(name: str) -> str:
        return (f"{row[name + '_mean']:.5f} [{row[name + '_low']:.5f}, "
                f"{row[name + '_high']:.5f}]")

    return (f"| {cfg.n:.0e}, {cfg.d} | {test} | {step.rows_choice.rows} | "
            f"{int(row['audited'])} | {interval('error')} | {interval('aligned_error')} | "
            f"{interval('error_estimate')} | {time.perf_counter() - start:.0f} |")


def logistic_model(n: int = 10_000, d: int = 10, seed: int = 2) -> pm.Model:
    """The fast test's model (``tests/test_batch_budget.py``)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d - 1))
    y = rng.binomial(1, 1.0 / (1.0 + np.exp(-(0.3 + x @ np.full(d - 1, 0.5)))))
    with pm.Model() as model:
        b = pm.Normal("b", 0.0, 5.0, shape=d)
        pm.Bernoulli("y", logit_p=b[0] + pm.math.dot(x, b[1:]), observed=y)
    return model


def budget_over_seeds(seeds: int) -> list[str]:
    model = logistic_model()
    lines = []
    for seed in range(1, seeds + 1):
        with model:
            step = MinibatchBarker(control_variate="taylor")
            idata = pm.sample(step=step, chains=1, cores=1, random_seed=seed,
                              progressbar=False, compute_convergence_checks=False)
        estimate = np.asarray(sample_stats(idata)["error_estimate"]).ravel()
        ratio = estimate.mean() / DEFAULT_ERROR_TOLERANCE
        se = estimate.std(ddof=1) / np.sqrt(estimate.size) / DEFAULT_ERROR_TOLERANCE
        draws = np.asarray(posterior(idata)["b"])  # (chain, draw, d)
        bulk = min(float(az.ess(draws[..., j])) for j in range(draws.shape[-1]))
        lines.append(f"| {seed} | {step.rows_choice.rows} | {ratio:.2f} ({se:.2f}) | "
                     f"{bulk:,.0f} |")
        print(lines[-1], flush=True)
    return lines


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--audit", default="", help="comma-separated N:d of the MH-SS grid")
    p.add_argument("--audit-every", type=int, default=5)
    p.add_argument("--seeds", type=int, default=0, help="seeds of the budget check")
    p.add_argument("--seed", type=int, default=2017, help="data and chains of the audit")
    args = p.parse_args(argv)
    if args.audit:
        print("| N, d | test | m | audited steps | audited bias [95 %] | aligned bias [95 %] "
              "| mean error_estimate [95 %] | s |")
        print("| --- | --- | ---: | ---: | --- | --- | --- | ---: |")
        for text in args.audit.split(","):
            print(audit(text, args.audit_every, args.seed), flush=True)
    if args.seeds:
        print("| seed | m | mean error_estimate / budget (se) | min bulk ESS |")
        print("| ---: | ---: | --- | ---: |")
        lines = budget_over_seeds(args.seeds)
        ratios = [float(line.split("|")[3].split()[0]) for line in lines]
        print(f"\nmean {np.mean(ratios):.2f}, largest {max(ratios):.2f}, "
              f"{sum(r > 1.0 for r in ratios)} of {len(ratios)} above the budget")


if __name__ == "__main__":
    main()
