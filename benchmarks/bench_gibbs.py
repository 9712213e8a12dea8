"""Benchmark: MinibatchGibbs against ``pm.BinaryGibbsMetropolis`` on N = 10⁶ rows.

A logistic regression with D = 10 inclusion indicators and fixed coefficients (three
clear effects, five small ones, two zeros), ``y_i ~ Bernoulli(logit⁻¹(α + Σ_j γ_j β_j
x_ij))`` with ``γ_j ~ Bernoulli(1/2)`` the only free variables, N = 10⁶ generated rows.
Each sampler runs the same number of sweeps over γ in the same process, one after the
other; the table gives the data per update (rows whose log-likelihood was evaluated per
indicator update) and the wall time per update, after one warm-up run of each sampler
(compilation excluded).

``pm.BinaryGibbsMetropolis`` evaluates the full-data log-probability once per step and
once per proposed flip (it proposes with probability ``transit_p = 0.8``), so it uses
``(1 + 0.8 D) N / D`` rows per update on average.

Run: ``PYTHONPATH=$PWD python benchmarks/bench_gibbs.py [--n 1000000] [--draws 100]``.
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import pymc as pm
from scipy import special

from pymc_minibatch_mh import MinibatchGibbs
from pymc_minibatch_mh.model.compat import PYMC_MAJOR, posterior, sample_stats

warnings.filterwarnings("ignore")
BETA = np.array([0.3, -0.2, 0.1, 0.006, 0.004, 0.003, 0.002, 0.001, 0.0, 0.0])


def model_for(n: int, seed: int = 0) -> pm.Model:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, BETA.size))
    y = (rng.random(n) < special.expit(-0.5 + x @ BETA)).astype(np.int64)
    with pm.Model() as model:
        gamma = pm.Bernoulli("gamma", 0.5, shape=BETA.size)
        pm.Bernoulli("y", logit_p=-0.5 + pm.math.dot(x, gamma * BETA), observed=y)
    return model


def run(model: pm.Model, make_step, draws: int, seed: int) -> tuple[float, object]:
    with model:
        step = make_step()
        start = time.perf_counter()
        idata = pm.sample(draws=draws, tune=0, step=step, chains=1, random_seed=seed,
                          progressbar=False, compute_convergence_checks=False,
                          initvals={"gamma": np.ones(BETA.size, dtype=np.int64)})
        return time.perf_counter() - start, idata


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--draws", type=int, default=100)
    args = parser.parse_args()
    n, d, draws = args.n, BETA.size, args.draws
    model = model_for(n)
    samplers = {
        "pm.BinaryGibbsMetropolis": lambda: pm.BinaryGibbsMetropolis([model["gamma"]]),
        "MinibatchGibbs exact": lambda: MinibatchGibbs(test="exact"),
        "MinibatchGibbs t-test ε = 0.01, m = 500": lambda: MinibatchGibbs(
            test="austere", epsilon=0.01, batch_size=500),
        "MinibatchGibbs Barker, m = 500": lambda: MinibatchGibbs(test="barker", batch_size=500),
    }
    print(f"PyMC {pm.__version__} (line {PYMC_MAJOR}), N = {n:,}, D = {d}, {draws} sweeps")
    print("| sampler | data per update (rows) | share of N | time per update | "
          "inclusion P(γ_j = 1) |")
    print("| --- | --- | --- | --- | --- |")
    for name, make in samplers.items():
        run(model, make, 2, 0)  # warm-up: compilation
        seconds, idata = run(model, make, draws, 1)
        if name.startswith("pm."):
            rows = (1 + 0.8 * d) * n / d  # expected; BinaryGibbsMetropolis has no stats
        else:
            rows = float(np.asarray(sample_stats(idata)["rows_per_update"]).mean())
        incl = np.asarray(posterior(idata)["gamma"]).reshape(-1, d).mean(axis=0)
        print(f"| {name} | {rows:,.0f} | {100 * rows / n:.2f} % | "
              f"{1e3 * seconds / (draws * d):.3f} ms | {np.round(incl, 2).tolist()} |",
              flush=True)


if __name__ == "__main__":
    main()
