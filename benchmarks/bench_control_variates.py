"""Benchmark: Taylor control variates at temperature 1 on a tall logistic regression.

Synthetic logistic regression, N = 10⁶ rows, d = 10 coefficients (an intercept and nine
standard-normal features), prior N(0, 5²), temperature 1. Random-walk proposal with the
Laplace covariance at the MAP times ``2.38/√d`` (``S="laplace"``). In one run:

- ``MinibatchBarker(control_variate="taylor")``: average batch size, time, ESS per second
  (ArviZ bulk ESS, the smallest over the coefficients), with and without the one-time
  set-up (MAP search, full-data pass at θ̂, compilation);
- the same step without control variates, for a few hundred steps only (it needs most of
  the data at every step; its minibatch grows by 10,000 rows per round, so that a step
  costs a few calls, not thousands): average batch size and time per step;
- PyMC's NUTS on the full data (one chain, the faster of PyTensor's C and Numba backends
  for the full-data log-density and gradient, measured first), started at the MAP: time,
  ESS per second, and the reference posterior means and sds.

Targets: average batch ≤ 1,000 with control
variates (close to N without); posterior means and sds within 3 MCSE of NUTS (MCSE of
the difference: both runs' MCSEs combined); ESS per second ≥ 10 × NUTS's.

Run: ``python benchmarks/bench_control_variates.py`` (about 15–30 minutes, mostly NUTS;
``--nuts-draws``/``--n`` make it shorter). The table is printed and written to
``benchmarks/output/control_variates.md``.
"""

from __future__ import annotations

import argparse
import math
import time
import warnings
from pathlib import Path

import arviz as az
import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
from scipy.special import expit

from pymc_minibatch_mh import MinibatchBarker
from pymc_minibatch_mh.model.compat import mcse, posterior, sample_stats

warnings.filterwarnings("ignore")
OUT = Path(__file__).resolve().parent / "output"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--d", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=50)
    p.add_argument("--draws", type=int, default=25_000, help="per chain, control variates")
    p.add_argument("--chains", type=int, default=2)
    p.add_argument("--tune", type=int, default=1000)
    p.add_argument("--plain-draws", type=int, default=200)
    p.add_argument("--plain-batch-size", type=int, default=10_000,
                   help="rows per round without control variates (it grows to most of N)")
    p.add_argument("--nuts-draws", type=int, default=600)
    p.add_argument("--nuts-tune", type=int, default=300)
    p.add_argument("--seed", type=int, default=2017)
    p.add_argument("--out", type=Path, default=OUT)
    return p.parse_args(argv)


def make_model(n, d, seed):
    rng = np.random.default_rng(seed)
    x = np.column_stack([np.ones(n), rng.normal(size=(n, d - 1))])
    beta = rng.normal(0.0, 0.5, size=d)
    y = (rng.random(n) < expit(x @ beta)).astype(np.int64)
    with pm.Model() as model:
        b = pm.Normal("b", 0.0, 5.0, shape=d)
        pm.Bernoulli("y", logit_p=pt.dot(x, b), observed=y)
    return model


def ess_min(draws):
    """Smallest bulk ESS over the coefficients; draws (chain, draw, d)."""
    return min(float(np.asarray(az.ess(draws[..., j])).squeeze()) for j in range(draws.shape[-1]))


def faster_full_data_mode(model):
    """The PyTensor mode (C or Numba) with the faster full-data log-density and gradient."""
    point = model.initial_point()
    times = {}
    for mode in ("FAST_RUN", "NUMBA"):
        fn = model.compile_fn(
            [model.logp(), *pytensor.grad(model.logp(), model.value_vars)],
            mode=mode, point_fn=True,
        )
        fn(point)  # compile / JIT
        start = time.perf_counter()
        for _ in range(5):
            fn(point)
        times[mode] = (time.perf_counter() - start) / 5
    return min(times, key=times.get), times


def main(argv=None):
    args = parse_args(argv)
    n, d = args.n, args.d
    model = make_model(n, d, args.seed)
    rows = []

    # ---- control variates
    start = time.perf_counter()
    with model:
        step = MinibatchBarker(
            control_variate="taylor", batch_size=args.batch_size, S="laplace",
            scaling=2.38 / math.sqrt(d), tune=False,
        )
        cv = step.control_variate
        # Compile the per-step function's JIT code now: part of the set-up, not of sampling.
        x_hat = np.array(cv.reference.theta)
        cv.fn(x_hat, x_hat, np.array(1.0), *cv.store.rows(np.arange(args.batch_size)))
    setup = time.perf_counter() - start
    map_point = cv.reference_point()
    start = time.perf_counter()
    with model:
        idata = pm.sample(
            draws=args.draws, tune=args.tune, step=step, chains=args.chains, cores=1,
            initvals=map_point, random_seed=args.seed, progressbar=False,
            compute_convergence_checks=False,
        )
    cv_time = time.perf_counter() - start
    cv_draws = np.asarray(posterior(idata)["b"])
    ss = sample_stats(idata)
    cv_steps = args.chains * (args.draws + args.tune)
    cv_ess = ess_min(cv_draws)
    rows.append({
        "method": f"MinibatchBarker + Taylor CV (b = {args.batch_size})",
        "batch": float(ss["batch_size"].mean()),
        "step_us": cv_time / cv_steps * 1e6,
        "time": cv_time, "ess": cv_ess, "ess_s": cv_ess / cv_time,
        "ess_s_setup": cv_ess / (cv_time + setup),
        "accept": float(ss["accepted"].mean()),
    })

    # ---- the same proposal without control variates (a few hundred steps)
    with model:
        plain = MinibatchBarker(
            control_variate=None, batch_size=args.plain_batch_size, S=cv.laplace_covariance(),
            scaling=2.38 / math.sqrt(d), tune=False, check_start=False,
        )
        plain.likelihood.delta(x_hat, x_hat, np.arange(args.batch_size, dtype=np.int64),
                              np.array(1.0))  # JIT
        start = time.perf_counter()
        idata_plain = pm.sample(
            draws=args.plain_draws, tune=0, step=plain, chains=1, cores=1, initvals=map_point,
            random_seed=args.seed, progressbar=False, compute_convergence_checks=False,
        )
    plain_time = time.perf_counter() - start
    ss_plain = sample_stats(idata_plain)
    rows.append({
        "method": f"MinibatchBarker, no CV (b = {args.plain_batch_size}, "
                  f"{args.plain_draws} steps)",
        "batch": float(ss_plain["batch_size"].mean()),
        "step_us": plain_time / args.plain_draws * 1e6,
        "time": plain_time, "ess": math.nan, "ess_s": math.nan, "ess_s_setup": math.nan,
        "accept": float(ss_plain["accepted"].mean()),
    })

    # ---- NUTS on the full data
    mode, mode_times = faster_full_data_mode(model)
    start = time.perf_counter()
    with model:
        nuts = pm.sample(
            draws=args.nuts_draws, tune=args.nuts_tune, chains=1, cores=1, initvals=map_point,
            random_seed=args.seed, progressbar=False, compute_convergence_checks=False,
            compile_kwargs={"mode": mode},
        )
    nuts_time = time.perf_counter() - start
    nuts_draws = np.asarray(posterior(nuts)["b"])
    nuts_ess = ess_min(nuts_draws)
    nuts_steps = int(np.asarray(sample_stats(nuts)["n_steps"]).mean())
    rows.append({
        "method": f"PyMC NUTS, full data ({mode}, 1 chain)",
        "batch": float(n), "step_us": nuts_time / (args.nuts_draws + args.nuts_tune) * 1e6,
        "time": nuts_time, "ess": nuts_ess, "ess_s": nuts_ess / nuts_time,
        "ess_s_setup": nuts_ess / nuts_time, "accept": math.nan,
    })

    # ---- agreement with NUTS
    agree = []
    for j in range(d):
        a, b = cv_draws[..., j], nuts_draws[..., j]
        se_m = math.hypot(mcse(a), mcse(b))
        se_s = math.hypot(mcse(a, "sd"), mcse(b, "sd"))
        agree.append((j, b.mean(), a.mean(), (a.mean() - b.mean()) / se_m,
                      b.std(), a.std(), (a.std() - b.std()) / se_s))

    lines = [
        f"# Taylor control variates: logistic regression, N = {n:,}, d = {d}, temperature 1",
        "",
        f"Set-up of the control variates: {setup:.1f} s (MAP search and pass at θ̂: "
        f"{cv.setup_evaluations / n:.0f} passes over the data, "
        f"{cv.setup_evaluations:,} rows; compilation). NUTS backend: {mode} "
        f"(full-data logp+grad: " + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in
                                              mode_times.items())
        + f"); NUTS mean leapfrog steps per draw: {nuts_steps}.",
        "",
        "| method | avg batch | time per step | wall time | min ESS | ESS/s | ESS/s incl. set-up "
        "| accept |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['method']} | {r['batch']:,.0f} | {r['step_us']:,.0f} µs | {r['time']:.1f} s "
            f"| {r['ess']:,.0f} | {r['ess_s']:.2f} | {r['ess_s_setup']:.2f} | {r['accept']:.2f} |"
        )
    ratio = rows[0]["ess_s"] / rows[2]["ess_s"]
    ratio_setup = rows[0]["ess_s_setup"] / rows[2]["ess_s"]
    max_z = max(max(abs(a[3]), abs(a[6])) for a in agree)
    lines += [
        "",
        f"ESS/s ratio CV / NUTS: {ratio:.0f} × ({ratio_setup:.0f} × with the set-up). "
        f"Average batch with CV: {rows[0]['batch']:.0f}; without: {rows[1]['batch']:,.0f} "
        f"of N = {n:,}. Largest |difference| / MCSE over means and sds: {max_z:.2f}.",
        "",
        "| coef | NUTS mean | CV mean | z | NUTS sd | CV sd | z |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for j, m0, m1, zm, s0, s1, zs in agree:
        lines.append(f"| b[{j}] | {m0:.5f} | {m1:.5f} | {zm:+.2f} | {s0:.5f} | {s1:.5f} "
                     f"| {zs:+.2f} |")
    targets = {
        "average batch ≤ 1000 with CV": rows[0]["batch"] <= 1000,
        "means and sds within 3 MCSE of NUTS": max_z <= 3.0,
        "ESS/s ≥ 10 × NUTS": ratio >= 10,
    }
    lines += ["", "Targets: " + "; ".join(f"{k}: {'met' if v else 'NOT met'}"
                                          for k, v in targets.items()) + "."]
    table = "\n".join(lines)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "control_variates.md").write_text(table + "\n")
    return {"rows": rows, "agreement": agree, "targets": targets, "table": table}


if __name__ == "__main__":
    main()
