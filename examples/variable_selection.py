"""Variable selection in a tall logistic regression (Austerity §5.3, Appendix E, Figure 13).

Korattikara, Chen and Welling select variables of a logistic regression on 104,052
MiniBooNE rows with reversible-jump moves decided by their sequential test, and compare
the marginal inclusion probabilities ``P(γ_j = 1 | data)`` with an exact run (Figure 13).
Here the same comparison runs on generated data (no download) with a spike-and-slab
model that fits PyMC's fixed dimensions (Kuo and Mallick's indicator form)::

    γ_j ~ Bernoulli(1/2),  β_j ~ N(0, τ²),  α ~ N(0, 1),
    y_i ~ Bernoulli(logit⁻¹(α + Σ_j γ_j β_j x_ij)),

with D = 10 standardised features: three clear effects, two weak ones (inclusion
probabilities strictly between 0 and 1) and five zeros. The indicators γ are updated by
:class:`~pymc_minibatch_mh.MinibatchGibbs` (one test per indicator per step), the
coefficients and the intercept by NUTS; the reference run uses the exact full-data
Gibbs update (``test="exact"``) with the same NUTS, so the runs differ only in the test
of the γ updates. The table gives each method's inclusion probabilities, their largest
difference from the exact run (with the Monte Carlo standard error of that difference),
and the data used per γ update. Writes ``variable_selection.md`` and
``variable_selection.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pymc as pm
from scipy import special

from pymc_minibatch_mh import MinibatchGibbs, mcse, posterior, sample_stats

#: True coefficients: three clear effects, two weak ones, five zeros.
BETA = np.array([0.3, -0.2, 0.1, 0.012, 0.008, 0.0, 0.0, 0.0, 0.0, 0.0])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000, help="rows")
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--tune", type=int, default=200)
    parser.add_argument("--chains", type=int, default=2)
    parser.add_argument("--tau", type=float, default=0.1, help="prior sd of the slab")
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--epsilon", type=float, default=0.01)
    parser.add_argument("--methods", default="exact,austere,barker",
                        type=lambda s: s.split(","))
    parser.add_argument("--seed", type=int, default=2014)
    parser.add_argument("--out", type=Path, default=Path("examples/output"))
    return parser.parse_args(argv)


def selection_model(n: int, tau: float, seed: int) -> pm.Model:
    """The spike-and-slab logistic regression on ``n`` generated rows."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, BETA.size))
    y = (rng.random(n) < special.expit(-0.5 + x @ BETA)).astype(np.int64)
    with pm.Model() as model:
        gamma = pm.Bernoulli("gamma", 0.5, shape=BETA.size)
        beta = pm.Normal("beta", 0.0, tau, shape=BETA.size)
        alpha = pm.Normal("alpha", 0.0, 1.0)
        pm.Bernoulli("y", logit_p=alpha + pm.math.dot(x, gamma * beta), observed=y)
    return model


def run(model: pm.Model, method: str, args: argparse.Namespace) -> dict:
    """One sampler: the γ step with ``method``'s test, NUTS for β and α."""
    with model:
        options = {"exact": {}, "austere": dict(epsilon=args.epsilon)}.get(method, {})
        gibbs = MinibatchGibbs([model["gamma"]], test=method, batch_size=args.batch_size,
                               **options)
        start = time.perf_counter()
        idata = pm.sample(
            draws=args.draws, tune=args.tune, step=[gibbs, pm.NUTS([model["beta"],
                                                                   model["alpha"]])],
            chains=args.chains, cores=1, random_seed=args.seed, progressbar=False,
            compute_convergence_checks=False,
            initvals={"gamma": np.ones(BETA.size, dtype=np.int64)},
        )
        seconds = time.perf_counter() - start
    gamma = np.asarray(posterior(idata)["gamma"])  # (chain, draw, D)
    rows = np.asarray(sample_stats(idata)["rows_per_update"])
    rows = rows[..., 0] if rows.ndim == 3 else rows
    return {
        "inclusion": gamma.mean(axis=(0, 1)),
        "mcse": np.array([mcse(gamma[..., j]) if gamma[..., j].std() > 0 else 0.0
                          for j in range(BETA.size)]),
        "rows_per_update": float(rows.mean()),
        "seconds": seconds,
    }


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    model = selection_model(args.n, args.tau, args.seed)
    print(f"Variable selection: N = {args.n:,}, D = {BETA.size}, τ = {args.tau}, "
          f"m = {args.batch_size}, {args.chains} chains × {args.draws} draws")
    results = {method: run(model, method, args) for method in args.methods}
    reference = results.get("exact")
    for method, r in results.items():
        if reference is not None and method != "exact":
            diff = np.abs(r["inclusion"] - reference["inclusion"])
            se = np.sqrt(r["mcse"] ** 2 + reference["mcse"] ** 2)
            j = int(np.argmax(diff))
            r["max_diff"], r["max_diff_se"] = float(diff[j]), float(se[j])
        print(f"{method}: inclusion {np.round(r['inclusion'], 3)}; data per γ update "
              f"{r['rows_per_update']:,.0f} rows ({100 * r['rows_per_update'] / args.n:.1f} %)"
              f"; {r['seconds']:.1f} s")

    args.out.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), width_ratios=[2, 1])
    ax = axes[0]
    width = 0.8 / len(results)
    for k, (method, r) in enumerate(results.items()):
        ax.bar(np.arange(BETA.size) + (k - (len(results) - 1) / 2) * width, r["inclusion"],
               width, yerr=2 * r["mcse"], label=method, color=f"C{k}")
    ax.set_xticks(np.arange(BETA.size), [f"x{j}\n{b:g}" for j, b in enumerate(BETA)])
    ax.set(ylabel="P(γ_j = 1 | data)", title="Marginal inclusion probabilities (Figure 13)",
           ylim=(0, 1.05))
    ax.legend(fontsize=8)
    ax = axes[1]
    names = list(results)
    ax.bar(names, [100 * results[m]["rows_per_update"] / args.n for m in names],
           color=[f"C{k}" for k in range(len(names))])
    ax.set(ylabel="data per γ update (% of N)", title="Data used per update")
    fig.suptitle(f"Spike-and-slab logistic regression, N = {args.n:,}: γ by MinibatchGibbs, "
                 "β by NUTS")
    fig.tight_layout()
    fig_path = args.out / "variable_selection.png"
    fig.savefig(fig_path, dpi=110)
    plt.close(fig)

    header = "| method | " + " | ".join(f"x{j} ({b:g})" for j, b in enumerate(BETA))
    lines = [
        "# Variable selection, marginal inclusion probabilities (Austerity Figure 13)",
        "",
        f"N = {args.n:,} generated rows, D = {BETA.size}, τ = {args.tau}; γ by "
        f"MinibatchGibbs (m = {args.batch_size}; t-test ε = {args.epsilon}), β and α by "
        f"NUTS; {args.chains} chains × {args.draws} draws after {args.tune} tuning steps.",
        "",
        header + " | max abs diff from exact (± MCSE) | data per γ update | seconds |",
        "| --- " * (BETA.size + 4) + "|",
    ]
    for method, r in results.items():
        diff = (f"{r['max_diff']:.3f} ± {r['max_diff_se']:.3f}" if "max_diff" in r else "–")
        lines.append(
            f"| {method} | " + " | ".join(f"{p:.3f}" for p in r["inclusion"])
            + f" | {diff} | {r['rows_per_update']:,.0f} "
            f"({100 * r['rows_per_update'] / args.n:.1f} %) | {r['seconds']:.1f} |"
        )
    table = "\n".join(lines) + "\n"
    md_path = args.out / "variable_selection.md"
    md_path.write_text(table, encoding="utf-8")
    print(table)
    print(f"written: {md_path}, {fig_path}")
    return {
        "inclusion": {m: r["inclusion"] for m, r in results.items()},
        "rows_per_update": {m: r["rows_per_update"] for m, r in results.items()},
        "max_diff": {m: r.get("max_diff") for m, r in results.items()},
        "n": args.n,
        "table": table,
        "files": {"table": str(md_path), "figure": str(fig_path)},
    }


if __name__ == "__main__":
    main(None if os.environ.get("DOCS_GALLERY") != "reduced" else
         ["--n", "5000", "--draws", "200", "--tune", "100", "--chains", "1"])
