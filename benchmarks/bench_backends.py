"""Benchmark: PyTensor's C and Numba backends for the per-step minibatch function.

For two models (the paper's Gaussian mixture, N = 10⁶, and a logistic regression with
d = 20, N = 10⁵) and several batch sizes, times one call of the compiled function that a
minibatch step makes (tempered log-likelihood ratios of b random rows between two
parameter values, and the data-free part, in one call; the rows are gathered from the
data as stored, inside the timed call), and the log prior at one point, under both
backends, in the same run. The package's default backend per PyTensor line
(:func:`pymc_minibatch_mh.model.compat.default_mode`) is the one this table favours.

Run: ``python benchmarks/bench_backends.py``.
"""

from __future__ import annotations

import statistics
import time
import warnings

import numpy as np
import pymc as pm
import pytensor

from pymc_minibatch_mh.datasets import gaussian_mixture_data, gaussian_mixture_model
from pymc_minibatch_mh.model.compat import default_mode
from pymc_minibatch_mh.model.likelihood import MinibatchLikelihood

warnings.filterwarnings("ignore")
MODES = ("FAST_RUN", "NUMBA")


def logistic_model(n=100_000, d=20, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    beta = rng.normal(size=d) / np.sqrt(d)
    y = rng.random(n) < 1 / (1 + np.exp(-X @ beta))
    with pm.Model() as model:
        Xd = pm.Data("X", X)
        b = pm.Normal("beta", 0, 1, shape=d)
        pm.Bernoulli("y", logit_p=Xd @ b, observed=y.astype("int64"))
    return model, n


def median_call(fn, make_args, repeats=7, number=1000):
    for _ in range(100):
        fn(*make_args())
    blocks = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            fn(*make_args())
        blocks.append((time.perf_counter() - start) / number)
    return statistics.median(blocks)


def bench_model(name, model, n, batches):
    rng = np.random.default_rng(1)
    order = rng.permutation(n).astype(np.int64)
    rows = {}
    for mode in MODES:
        lik = MinibatchLikelihood(model, model.value_vars, mode=mode)
        x0 = lik.point_map.to_flat(model.initial_point())
        x1 = x0 + 0.01
        inv_t = np.array(1.0)
        for b in batches:
            counter = [0]

            def args(b=b, counter=counter, x0=x0, x1=x1, inv_t=inv_t):
                start = (counter[0] * b) % (n - b)
                counter[0] += 1
                return x0, x1, order[start : start + b], inv_t

            rows.setdefault(b, {})[mode] = median_call(lik.delta, args)
        rows.setdefault("prior", {})[mode] = median_call(lik._prior_fn, lambda x=x0: (x,))
    for key, by_mode in rows.items():
        c, nb = by_mode["FAST_RUN"], by_mode["NUMBA"]
        label = f"b = {key}" if key != "prior" else "log prior at one point"
        print(f"| {name} | {label} | {c * 1e6:.1f} | {nb * 1e6:.1f} | {nb / c:.2f} |")
    return rows


def main():
    print(f"# Backends for the per-step function (pymc {pm.__version__}, "
          f"pytensor {pytensor.__version__})")
    print()
    print("| model | call | C (µs) | Numba (µs) | Numba / C |")
    print("| --- | --- | --- | --- | --- |")
    x = gaussian_mixture_data(1_000_000, seed=0)
    gmm = bench_model("Gaussian mixture", gaussian_mixture_model(x), x.size, (50, 200, 1000))
    model, n = logistic_model()
    logit = bench_model("logistic d = 20", model, n, (50, 200, 1000))
    ratios = [r["NUMBA"] / r["FAST_RUN"] for t in (gmm, logit) for k, r in t.items()
              if k != "prior"]
    faster = "NUMBA" if statistics.median(ratios) < 1 else "FAST_RUN"
    print()
    print(f"median Numba / C ratio: {statistics.median(ratios):.2f} -> faster here: {faster}; "
          f"package default on this PyTensor line: {default_mode()}")


if __name__ == "__main__":
    main()
