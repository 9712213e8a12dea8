"""Benchmark: MinibatchBarker on the Gaussian mixture of Seita et al. (2017, section 6.1).

Settings of the paper: N = 10⁶, temperature 10,000, random-walk proposal with standard
deviation 0.15 per coordinate, initial minibatch 50, σ = 1, 3000 samples.

Measured in the same run, so that the table reads as ratios on whatever machine runs it:

- MinibatchBarker inside ``pm.sample``: average batch size and time per step;
- one call of the compiled minibatch evaluation at the average batch size, for the C and
  the Numba backends of PyTensor (the faster one is the package's default on this line);
- a no-op step method inside ``pm.sample`` (PyMC's own per-step overhead);
- ``pm.Metropolis`` on the same model (one full-data evaluation per draw: full-data MH).

Targets (issue "MinibatchBarker"): average batch size ≤ 205 (paper: 182.3 ± 11.4 with
σ = 0.9); time per step ≤ 2 × (one minibatch evaluation + one no-op PyMC step); at least
1000 × faster per step than full-data MH.

Run: ``python benchmarks/bench_gaussian_mixture.py [--draws 3000] [--trials 3]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import numpy as np
import pymc as pm
from pymc.step_methods.compound import BlockedStep

from pymc_minibatch_mh import MinibatchBarker
from pymc_minibatch_mh.adapter.compat import default_mode, sample_stats
from pymc_minibatch_mh.adapter.likelihood import MinibatchLikelihood
from pymc_minibatch_mh.datasets import gaussian_mixture_data, gaussian_mixture_model

warnings.filterwarnings("ignore")
START = {"theta": np.array([0.0, 1.0])}


class NoOpStep(BlockedStep):
    """A step method that returns the point unchanged (PyMC's per-step floor)."""

    name = "noop"
    stats_dtypes_shapes = {"accepted": (np.float64, [])}

    def __init__(self, vars=None, model=None, rng=None, blocked=True):
        model = pm.modelcontext(model)
        self.vars = vars or model.value_vars
        self.rng = rng

    def step(self, point):
        return point, [{"accepted": 1.0}]


def per_step_seconds(model, step, draws, seed):
    with model:
        idata = pm.sample(draws=draws, tune=0, step=step, chains=1, cores=1, random_seed=seed,
                          initvals=START, progressbar=False, compute_convergence_checks=False)
    ss = sample_stats(idata)
    return float(ss.attrs["sampling_time"]) / draws, ss


def time_call(fn, args_iter, repeats=7, number=2000):
    """Median over ``repeats`` blocks of the mean time of ``number`` calls."""
    blocks = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            fn(*next(args_iter))
        blocks.append((time.perf_counter() - start) / number)
    return statistics.median(blocks)


def eval_seconds(model, mode, batch, n):
    lik = MinibatchLikelihood(model, model.value_vars, mode=mode)
    order = np.random.default_rng(0).permutation(n).astype(np.int64)
    x0 = np.array([0.0, 1.0])
    x1 = np.array([0.1, 0.9])
    inv_t = np.array(1e-4)

    def args():
        k = 0
        while True:
            start = (k * batch) % (n - batch)
            yield x0, x1, order[start : start + batch], inv_t
            k += 1

    it = args()
    for _ in range(200):  # warm-up (Numba compiles on the first call)
        lik.delta(*next(it))
    return time_call(lik.delta, it)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--draws", type=int, default=3000)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--metropolis-draws", type=int, default=15)
    args = parser.parse_args(argv)

    x = gaussian_mixture_data(args.n, seed=0)
    model = gaussian_mixture_model(x)
    with model:
        step = MinibatchBarker(batch_size=50, sigma=1.0, temperature=1e4, S=[0.15, 0.15],
                               tune=False)
    sizes, step_times = [], []
    for trial in range(args.trials):
        seconds, ss = per_step_seconds(model, step, args.draws, seed=trial)
        sizes.append(float(np.asarray(ss["batch_size"]).mean()))
        step_times.append(seconds)
    avg_batch = statistics.mean(sizes)
    batch = int(round(avg_batch))
    t_step = statistics.median(step_times)

    evals = {mode: eval_seconds(model, mode, batch, args.n) for mode in ("FAST_RUN", "NUMBA")}
    t_eval = evals[default_mode()]
    noop = statistics.median(
        per_step_seconds(model, NoOpStep(model=model), 20_000, seed=t)[0] for t in range(3)
    )
    with model:
        metro = pm.Metropolis(S=np.array([0.15, 0.15]), tune=False)
    t_metro, _ = per_step_seconds(model, metro, args.metropolis_draws, seed=0)

    budget = 2 * (t_eval + noop)
    us = 1e6
    print(f"# MinibatchBarker on the Gaussian mixture (N = {args.n:,}, K = 10^4, sd 0.15, m = 50)")
    print()
    print(f"pymc {pm.__version__}; default backend {default_mode()}; "
          f"{args.trials} trials × {args.draws} draws")
    print()
    print("| quantity | value | target |")
    print("| --- | --- | --- |")
    print(f"| average batch size (mean ± sd over trials) | {avg_batch:.1f} ± "
          f"{statistics.pstdev(sizes):.1f} | ≤ 205 (paper 182.3 ± 11.4) |")
    print(f"| time per step (MinibatchBarker in pm.sample) | {t_step * us:.1f} µs | "
          f"≤ {budget * us:.1f} µs |")
    for mode, seconds in evals.items():
        mark = " (default)" if mode == default_mode() else ""
        label = f"one minibatch evaluation at b = {batch}, {mode}{mark}"
        print(f"| {label} | {seconds * us:.1f} µs | |")
    print(f"| no-op PyMC step | {noop * us:.1f} µs | |")
    print(f"| step / (evaluation + no-op step) | {t_step / (t_eval + noop):.2f} | ≤ 2 |")
    print(f"| pm.Metropolis (full-data MH) per draw | {t_metro * 1e3:.1f} ms | |")
    print(f"| speed-up over full-data MH | {t_metro / t_step:,.0f} × | ≥ 1000 × |")
    ok = avg_batch <= 205 and t_step <= budget and t_metro / t_step >= 1000
    print()
    print("all targets met" if ok else "TARGETS NOT MET")
    return ok


if __name__ == "__main__":
    main()
