"""Logistic regression at temperature 1 with Taylor control variates.

Synthetic logistic regression (an intercept and ``d − 1`` standard-normal features,
prior N(0, 5²)) sampled at temperature 1 with a random-walk proposal as wide as the
posterior (the Laplace covariance at the MAP times 2.38/√d), twice:

- ``MinibatchBarker(control_variate="taylor")``: the closed-form sum of second-order
  Taylor expansions around the MAP plus a minibatch estimate of the residuals;
- the plain ``MinibatchBarker`` with the same proposal, for a few hundred steps (it needs
  most of the data at every step).

Reports what the control variates cost (set-up time and passes over the data, time per
step) and what they save (rows per step), and compares the posterior with the Laplace
approximation at the MAP (for tall data, close to the posterior). Writes a Markdown table
and a figure to ``--out``. ``python examples/logistic_control_variates.py`` runs in about
a minute; ``--n``, ``--d`` and ``--draws`` change the size.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pymc as pm
import pytensor.tensor as pt
from scipy.special import expit

from pymc_minibatch_mh import MinibatchBarker, posterior, sample_stats


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--d", type=int, default=5)
    parser.add_argument("--draws", type=int, default=10_000)
    parser.add_argument("--plain-draws", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path("examples/output"))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    n, d = args.n, args.d
    rng = np.random.default_rng(args.seed)
    x = np.column_stack([np.ones(n), rng.normal(size=(n, d - 1))])
    y = (rng.random(n) < expit(x @ rng.normal(0.0, 0.5, size=d))).astype(np.int64)
    with pm.Model() as model:
        b = pm.Normal("b", 0.0, 5.0, shape=d)
        pm.Bernoulli("y", logit_p=pt.dot(x, b), observed=y)

    # The step finds the MAP, the full-data sums G and H there, and compiles the
    # residual estimator: a one-time cost, shared by all chains.
    start = time.perf_counter()
    with model:
        step = MinibatchBarker(control_variate="taylor", batch_size=args.batch_size,
                               S="laplace", scaling=2.38 / math.sqrt(d), tune=False)
    setup = time.perf_counter() - start
    cv = step.control_variate
    map_point = cv.reference_point()
    cov = cv.laplace_covariance()

    results = {}
    for label, kwargs, draws in [
        ("with control variates", dict(step=step), args.draws),
        ("without", dict(step=MinibatchBarker(
            control_variate=None, batch_size=args.batch_size, S=cov,
            scaling=2.38 / math.sqrt(d), tune=False,
            model=model)), args.plain_draws),
    ]:
        start = time.perf_counter()
        with model:
            idata = pm.sample(draws=draws, tune=200, chains=1, initvals=map_point,
                              random_seed=args.seed, progressbar=False,
                              compute_convergence_checks=False, **kwargs)
        seconds = time.perf_counter() - start
        ss = sample_stats(idata)
        results[label] = dict(
            sizes=np.asarray(ss["batch_size"]).ravel(), seconds=seconds,
            per_step=seconds / (draws + 200), draws=np.asarray(posterior(idata)["b"])[0],
            accept=float(np.asarray(ss["accepted"]).mean()),
        )

    cvr = results["with control variates"]
    laplace_sd = np.sqrt(np.diag(cov))
    z = (cvr["draws"].mean(0) - cv.reference.theta) / laplace_sd
    lines = [
        f"# Logistic regression at temperature 1: N = {n:,}, d = {d}",
        "",
        f"Set-up of the control variates: {setup:.1f} s, "
        f"{cv.setup_evaluations / n:.0f} passes over the data (MAP search and the pass "
        "at θ̂) and compilation.",
        "",
        "| | mean rows per step | time per step | acceptance |",
        "| --- | ---: | ---: | ---: |",
    ]
    for label, r in results.items():
        lines.append(f"| {label} | {r['sizes'].mean():,.0f} | {r['per_step'] * 1e3:.2f} ms "
                     f"| {r['accept']:.2f} |")
    lines += [
        "",
        "Posterior with control variates against the Laplace approximation at the MAP:",
        "",
        "| coefficient | MAP | Laplace sd | posterior mean | posterior sd |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for j in range(d):
        lines.append(f"| b[{j}] | {cv.reference.theta[j]:.4f} | {laplace_sd[j]:.4f} "
                     f"| {cvr['draws'][:, j].mean():.4f} | {cvr['draws'][:, j].std():.4f} |")
    table = "\n".join(lines)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "logistic_control_variates.md").write_text(table + "\n")

    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(12, 4.8))
    bins = np.logspace(np.log10(max(1, args.batch_size // 2)), np.log10(n), 40)
    for label, r in results.items():
        ax0.hist(r["sizes"], bins=bins, histtype="step", linewidth=1.5,
                 label=f"{label} (mean {r['sizes'].mean():,.0f})")
    ax0.set(xscale="log", yscale="log", xlabel="rows used by the step's test",
            ylabel="steps", title="Rows per step at temperature 1")
    ax0.legend(fontsize=8)
    ax1.plot(cvr["draws"][:, 1], cvr["draws"][:, 2], ",", alpha=0.5, label="draws")
    theta = np.linspace(0, 2 * np.pi, 200)
    chol = np.linalg.cholesky(cov[1:3, 1:3])
    for k in (1, 2, 3):
        ring = cv.reference.theta[1:3, None] + k * chol @ np.vstack([np.cos(theta),
                                                                     np.sin(theta)])
        ax1.plot(*ring, "k--", linewidth=0.8)
    ax1.set(xlabel="b[1]", ylabel="b[2]",
            title="Draws with control variates; Laplace 1, 2, 3 sd (dashed)")
    fig.tight_layout()
    path = args.out / "logistic_control_variates.png"
    fig.savefig(path, dpi=120)
    print(f"\nfigure written to {path}")
    return {
        "files": {"table": str(args.out / "logistic_control_variates.md"),
                  "figure": str(path)},
        "setup_seconds": setup,
        "setup_passes": cv.setup_evaluations / n,
        "mean_batch_size": {k: float(r["sizes"].mean()) for k, r in results.items()},
        "per_step_seconds": {k: r["per_step"] for k, r in results.items()},
        "mean_z_vs_laplace": z,
        "table": table,
    }


if __name__ == "__main__":
    main()
