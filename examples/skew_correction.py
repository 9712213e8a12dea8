"""The acceptance error of the plain and the skew-corrected minibatch Barker test against b.

The exact Barker test accepts with probability g(Δ). The minibatch test accepts with
P_test(accept | Δ), which differs from g(Δ) by about (κ₃/6 − cov(Δ*, s²)/2) · g‴(Δ) when
the per-row ratios are skewed: a term of order skew/√b. The skew-corrected test
(``skew_correction=True``) draws its top-up noise with the third cumulant that cancels it
(:mod:`pymc_minibatch_mh.core.skew`).

For populations of N ratios (lognormal with σ = 1, skewness about 6; Student-t with ν = 3,
symmetric with heavy tails) scaled so that Var(Δ*) = ``--variance`` at b rows, this script
runs the package's test (``BarkerTest``) with ``batch_size = b`` and estimates
P_test(accept | Δ) − g(Δ) on a grid of Δ from the same minibatches
(:func:`~pymc_minibatch_mh.core.calibration.barker_acceptance_error`: closed-form
acceptance probability given the minibatch, control variates of known mean). It reports
the largest error over the grid, with its Monte Carlo standard error, and the fraction of
steps in which the skew correction fell back to the Gaussian top-up.

Writes a Markdown table and a log-log figure to ``--out``. The defaults take about half
an hour; ``--replications`` and ``--batch-sizes`` change the size.
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

from pymc_minibatch_mh.core.calibration import barker_acceptance_error

POPULATIONS = {
    "lognormal": lambda rng, n: rng.lognormal(0.0, 1.0, n),
    "student_t3": lambda rng, n: rng.standard_t(3.0, n),
}
DELTAS = np.arange(-3.0, 3.01, 0.5)


def population(kind: str, n: int, seed: int) -> np.ndarray:
    """Centred ratios of one kind (scaled later for each b)."""
    x = POPULATIONS[kind](np.random.default_rng(seed), n)
    return x - x.mean()


def measure(kind: str, args: argparse.Namespace) -> list[dict]:
    x = population(kind, args.n, args.seed)
    rows = []
    for b in args.batch_sizes:
        values = x * math.sqrt(args.variance * b / (args.n**2 * x.var()))
        row = {"population": kind, "b": b}
        for label, skew in (("plain", False), ("skew", True)):
            start = time.perf_counter()
            result = barker_acceptance_error(
                values, DELTAS, batch_size=b, replications=args.replications,
                rng=np.random.default_rng(args.seed + b), skew_correction=skew,
            )
            worst = int(np.argmax(np.abs(result.error)))
            row[label] = {
                "max_error": float(abs(result.error[worst])),
                "se": float(result.standard_error[worst]),
                "at_delta": float(DELTAS[worst]),
                "error": result.error.tolist(),
                "fallback_rate": result.fallback_rate,
                "mean_batch_size": result.mean_batch_size,
                "seconds": time.perf_counter() - start,
            }
        rows.append(row)
        print(f"{kind:>10} b={b:>6}: plain {row['plain']['max_error']:.2e} "
              f"± {row['plain']['se']:.1e}, skew {row['skew']['max_error']:.2e} "
              f"± {row['skew']['se']:.1e} (fallback {row['skew']['fallback_rate']:.3f})",
              flush=True)
    return rows


def table(rows: list[dict]) -> str:
    lines = [
        "| ratios | b | plain: largest error (at Δ) | skew-corrected: largest error (at Δ) "
        "| fallback | mean rows |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        p, s = r["plain"], r["skew"]
        lines.append(
            f"| {r['population']} | {r['b']:,} | {p['max_error']:.1e} ± {p['se']:.0e} "
            f"({p['at_delta']:+.1f}) | {s['max_error']:.1e} ± {s['se']:.0e} "
            f"({s['at_delta']:+.1f}) | {s['fallback_rate']:.1%} | {p['mean_batch_size']:,.0f} |"
        )
    return "\n".join(lines)


def figure(rows: list[dict], path: Path, variance: float) -> None:
    kinds = list(dict.fromkeys(r["population"] for r in rows))
    fig, axes = plt.subplots(1, len(kinds), figsize=(5.2 * len(kinds), 4.2), squeeze=False)
    for ax, kind in zip(axes[0], kinds, strict=True):
        sub = [r for r in rows if r["population"] == kind]
        b = np.array([r["b"] for r in sub], dtype=float)
        for label, colour, name in (("plain", "C0", "plain"), ("skew", "C3", "skew-corrected")):
            err = np.array([r[label]["max_error"] for r in sub])
            se = np.array([r[label]["se"] for r in sub])
            ax.errorbar(b, np.maximum(err, 1e-7), yerr=2 * se, color=colour, marker="o",
                        capsize=3, label=name)
        noise = np.array([max(r["plain"]["se"], r["skew"]["se"]) for r in sub])
        ax.plot(b, 2 * noise, color="0.6", ls=":", label="2 × Monte Carlo s.e.")
        # Guides through the plain test's error at the middle batch size.
        mid = len(sub) // 2
        anchor, b0 = sub[mid]["plain"]["max_error"], b[mid]
        ax.plot(b, anchor * (b / b0) ** -0.5, color="0.3", lw=0.8, ls="--",
                label=r"$\propto b^{-1/2}$")
        ax.plot(b, anchor * (b / b0) ** -1.0, color="0.3", lw=0.8, ls="-.",
                label=r"$\propto b^{-1}$")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("batch size b")
        ax.set_ylabel(r"max$_\Delta$ |P$_{test}$(accept | Δ) − g(Δ)|")
        ax.set_title(f"{kind} ratios, Var(Δ*) = {variance:g} at b rows")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000, help="population size N")
    parser.add_argument("--replications", type=int, default=40_000)
    parser.add_argument("--batch-sizes", type=lambda s: [int(v) for v in s.split(",")],
                        default=[100, 300, 1000, 3000, 10_000])
    parser.add_argument("--variance", type=float, default=0.25,
                        help="Var(Δ*) at b rows (the test needs s² < σ² = 1)")
    parser.add_argument("--populations", default="lognormal,student_t3")
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("examples/output"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for kind in args.populations.split(","):
        rows.extend(measure(kind, args))
    text = table(rows)
    (args.out / "skew_correction.md").write_text(text + "\n")
    figure(rows, args.out / "skew_correction.png", args.variance)
    print(text)
    return {"rows": rows, "table": text}


if __name__ == "__main__":
    main()
