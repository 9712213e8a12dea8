"""Gaussian mixture of Seita et al. (2017, section 6.1) with MinibatchBarker.

N = 10⁶ observations from 0.5 N(θ1, 2) + 0.5 N(θ1 + θ2, 2) at θ = (0, 1), prior
θ ~ N(0, diag(10, 1)), temperature K = 10,000, random-walk proposal with standard
deviation 0.15 per coordinate (the paper writes "covariance"; the authors' code uses a
standard deviation), initial minibatch m = 50, σ = 1, 3000 samples per chain.

Prints the average minibatch size next to the paper's 182.3 ± 11.4 (the authors' script
used σ = 0.9, which needs slightly larger batches than σ = 1) and writes a figure with
the samples over the contours of the tempered log posterior, and the histogram of batch
sizes (log-log, as the paper's Figure 2).

Run ``python examples/gaussian_mixture.py --help`` for the options.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pymc as pm  # noqa: E402

from pymc_minibatch_mh import MinibatchBarker  # noqa: E402
from pymc_minibatch_mh.adapter.compat import posterior, sample_stats  # noqa: E402
from pymc_minibatch_mh.datasets import (  # noqa: E402
    gaussian_mixture_data,
    gaussian_mixture_model,
    log_posterior_grid,
)

PAPER_BATCH = (182.3, 11.4)


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="observations (paper: 10^6)")
    parser.add_argument("--draws", type=int, default=3000, help="samples per chain (paper: 3000)")
    parser.add_argument("--chains", type=int, default=2)
    parser.add_argument("--cores", type=int, default=1)
    parser.add_argument("--temperature", type=float, default=10_000.0)
    parser.add_argument("--step-sd", type=float, default=0.15)
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--sigma", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=2017)
    parser.add_argument("--out", type=Path, default=Path("examples/output"))
    args = parser.parse_args(argv)

    x = gaussian_mixture_data(args.n, seed=args.seed)
    model = gaussian_mixture_model(x)
    with model:
        step = MinibatchBarker(
            batch_size=args.batch_size,
            sigma=args.sigma,
            temperature=args.temperature,
            S=[args.step_sd, args.step_sd],
            tune=False,
        )
        start = time.perf_counter()
        idata = pm.sample(
            draws=args.draws,
            tune=0,
            step=step,
            chains=args.chains,
            cores=args.cores,
            random_seed=args.seed,
            initvals={"theta": np.array([0.0, 1.0])},
            progressbar=False,
            compute_convergence_checks=False,
        )
        elapsed = time.perf_counter() - start

    stats = sample_stats(idata)
    sizes = np.asarray(stats["batch_size"])
    per_chain = sizes.mean(axis=1)
    theta = np.asarray(posterior(idata)["theta"]).reshape(-1, 2)
    print(f"Gaussian mixture, N = {args.n:,}, K = {args.temperature:g}, "
          f"proposal sd {args.step_sd}, m = {args.batch_size}, sigma = {args.sigma}")
    print(f"correction table L-inf error: {step.correction.error:.2e}")
    print(f"average minibatch size: {sizes.mean():.1f} (per chain: "
          f"{', '.join(f'{v:.1f}' for v in per_chain)}); "
          f"paper (sigma = 0.9 in the authors' script): {PAPER_BATCH[0]} ± {PAPER_BATCH[1]}")
    print(f"acceptance rate: {float(np.asarray(stats['accepted']).mean()):.3f}; "
          f"full-data steps: {int(np.asarray(stats['full_data']).sum())}; "
          f"median epsilon: {float(np.median(stats['epsilon'])):.3f}")
    print(f"sampling time: {elapsed:.1f} s for {sizes.size} steps "
          f"({1e6 * elapsed / sizes.size:.0f} µs per step, including compilation and start-up)")

    args.out.mkdir(parents=True, exist_ok=True)
    t1 = np.linspace(-1.5, 2.5, 161)
    t2 = np.linspace(-3.0, 3.0, 161)
    logp = log_posterior_grid(x, args.temperature, t1, t2)
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 4.5))
    ax0.contour(t1, t2, logp - logp.max(), levels=np.linspace(-12, 0, 13), cmap="viridis")
    ax0.scatter(theta[:, 0], theta[:, 1], s=2, alpha=0.25, color="k")
    ax0.set(xlabel=r"$\theta_1$", ylabel=r"$\theta_2$",
            title="MinibatchBarker samples over the tempered log posterior")
    top = max(sizes.max(), 10 * args.batch_size)
    bins = np.logspace(np.log10(args.batch_size), np.log10(top), 30)
    ax1.hist(sizes.ravel(), bins=bins, color="C0")
    ax1.set(xscale="log", yscale="log", xlabel="minibatch size", ylabel="count",
            title=f"Minibatch sizes (mean {sizes.mean():.1f})")
    fig.tight_layout()
    path = args.out / "gaussian_mixture.png"
    fig.savefig(path, dpi=120)
    print(f"figure written to {path}")
    return {"mean_batch_size": float(sizes.mean()), "seconds": elapsed}


if __name__ == "__main__":
    main()
