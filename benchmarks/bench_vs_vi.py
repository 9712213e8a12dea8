"""Benchmark: the step against what tall-data users pick today — ADVI and Pathfinder.

For models of the real-data zoo (:mod:`real_zoo`) at a few row counts, one after another
in one process, with nutpie as the accuracy reference:

- ``step``: this package's default step, ``pm.sample(step=MinibatchBarker(), chains=2,
  cores=1)`` with PyMC's default draws and tuning (bambi entries: ``Model.fit(step=...)``;
  pymc-marketing entries: ``fit(method="mcmc", step=...)``);
- ``advi-mb<m>``: mean-field ADVI on the same model written with :class:`pymc.Minibatch`
  of ``m`` rows and ``total_size`` (the zoo's ``build(df, batch_size=m)``, as PyMC's
  documentation writes minibatch ADVI; for an entry written through a client, its
  by-hand twin ``minibatch(df, m)``, where it has one);
- ``advi``: full-data mean-field ADVI; ``fullrank``: full-data full-rank ADVI (only where
  the model has at most ``--fullrank-max-d`` unconstrained dimensions);
- ``pathfinder``: ``pymc_extras.fit(method="pathfinder")`` (its PyMC backend, one process);
- ``nutpie``: ``nutpie.sample(compiled, chains=2, cores=1)``, the reference.

Every ADVI fit is ``pm.fit(n=cap, method=..., obj_optimizer=pm.adam(learning_rate=lr),
callbacks=[CheckParametersConvergence(every=..., diff="absolute", tolerance=...)])``
(``pymc.variational.callbacks``): it stops when no parameter of the approximation (means
and log-scale parameters) moved by more than the tolerance over ``every`` iterations, or at
the cap, and the record says which (``converged``, ``iterations``) and the last changes it
measured (``last_changes``). The optimiser and its settings are in the results' header.

Columns: wall time to a posterior (ADVI and Pathfinder: building the model, compiling,
fitting to convergence and drawing from the approximation; the step: building, set-up and
sampling; nutpie: building, compiling and sampling); for the samplers, that time per 1,000
effective draws (the smallest bulk ESS over the scalars); and accuracy against nutpie over every
scalar of the model's free variables: the largest ``|Δmean|`` in reference sds, the largest
and the median ``|sd ratio − 1|``, and the coverage: the share of the reference's draws
inside the method's central 95 % interval (2.5–97.5 % quantiles of its draws), averaged over
the scalars (0.95 when the method's marginals match the reference's), and its smallest value.

The methods run one after another in the same process with the compilation caches as they
are found on disk (the first run of a model compiles; ``bench_real_zoo.py --cold`` measures
the step's cold start).

Run (from the repository root)::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/bench_vs_vi.py \\
        --models fertility_morekids_logistic,birthdays_state_poisson --rows 10000,100000 \\
        --plot benchmarks/results/vs_vi.png
    OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/bench_vs_vi.py \
        --models fertility_morekids_logistic,birthdays_state_poisson --rows 10000,100000 \
        --methods advi-mb,advi,fullrank --every 100 --out benchmarks/results/vs_vi_every100.json
    .venv/bin/python benchmarks/bench_vs_vi.py --report benchmarks/results/vs_vi.json \
        --plot docs/_static/vs_vi_error_seconds.png

Results are written as JSON (a header with the machine, versions, commit, command and
settings, and a list of records) to ``--out`` and printed as a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
import warnings
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "vs_vi.json"
DEFAULT_MODELS = "fertility_morekids_logistic,diamonds_logprice_normal,birthdays_state_poisson"
METHODS = ("step", "advi-mb", "advi", "fullrank", "pathfinder")
#: Plot markers, one per method.
MARKERS = {"step": "o", "advi-mb100": "<", "advi-mb500": "v", "advi-mb5000": "^", "advi": "s",
           "fullrank": "D", "pathfinder": "P", "nutpie": "*"}


# --------------------------------------------------------------------------- accuracy
def draws_of(idata: Any, names: list[str]) -> dict[str, np.ndarray]:
    """The free variables' draws as scalars: label -> (chain, draw)."""
    from bench_tall_glm import scalars

    from pymc_minibatch_mh.model.compat import posterior

    post = posterior(idata)
    return scalars({n: post[n].values for n in names}, names)


def accuracy(sc: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> dict[str, Any]:
    """A method's marginals against the reference's, over every scalar.

    Returns the largest ``|Δmean| / sd_ref`` (and where), the largest (and where) and the
    median ``|sd / sd_ref − 1|``, and the share of the reference's draws inside the method's
    2.5–97.5 % quantiles, averaged over the scalars and at its smallest.
    """
    dmean, ratio, cover = {}, {}, {}
    for k, a in sc.items():
        a, b = np.ravel(a), np.ravel(ref[k])
        sd_ref = b.std()
        dmean[k] = abs(a.mean() - b.mean()) / sd_ref
        ratio[k] = abs(a.std() / sd_ref - 1.0)
        lo, hi = np.quantile(a, [0.025, 0.975])
        cover[k] = float(np.mean((b >= lo) & (b <= hi)))
    dm_at, sd_at = max(dmean, key=dmean.get), max(ratio, key=ratio.get)
    return {"dmean_max": float(dmean[dm_at]), "dmean_at": dm_at,
            "sd_ratio_max": float(ratio[sd_at]), "sd_at": sd_at,
            "sd_ratio_median": float(np.median(list(ratio.values()))),
            "coverage_mean": float(np.mean(list(cover.values()))),
            "coverage_min": float(min(cover.values()))}


# --------------------------------------------------------------------------- methods
def unconstrained_size(model: Any) -> int:
    """The number of unconstrained dimensions of a model's free variables."""
    point = model.initial_point()
    return int(sum(np.size(point[v.name]) for v in model.value_vars))


class ParameterChanges:
    """A ``pm.fit`` callback that keeps the quantity ``CheckParametersConvergence`` tests:
    the largest absolute change of any parameter of the approximation over ``every``
    iterations, at each check (how far from the tolerance a run stopped)."""

    def __init__(self, every: int) -> None:
        self.every, self.previous, self.changes = every, None, []

    def __call__(self, approx: Any, loss: np.ndarray, i: int) -> None:
        if i % self.every:
            return
        current = np.concatenate([p.get_value().ravel() for p in approx.params])
        if self.previous is not None:
            self.changes.append(float(np.max(np.abs(current - self.previous))))
        self.previous = current

    def last(self, k: int) -> list[float]:
        """The last ``k`` changes."""
        return self.changes[-k:]


def run_advi(model: Any, method: str, args: argparse.Namespace) -> tuple[Any, dict]:
    """``pm.fit`` to convergence (or the cap), then ``--vi-draws`` draws."""
    import pymc as pm
    from pymc.variational.callbacks import CheckParametersConvergence  # PyMC 5 and 6

    cap = args.max_iter_minibatch if method == "advi-mb" else args.max_iter
    check = CheckParametersConvergence(every=args.every, diff="absolute",
                                       tolerance=args.tolerance)
    changes = ParameterChanges(args.every)
    t0 = time.perf_counter()
    with model:
        approx = pm.fit(n=cap, method="fullrank_advi" if method == "fullrank" else "advi",
                        obj_optimizer=pm.adam(learning_rate=args.lr),
                        callbacks=[changes, check], random_seed=args.seed,
                        progressbar=False)
    t1 = time.perf_counter()
    idata = approx.sample(args.vi_draws, random_seed=args.seed)
    t2 = time.perf_counter()
    iterations = len(approx.hist)
    loss = np.asarray(approx.hist[-min(iterations, 1000):], dtype=float)
    return idata, {"fit_s": t1 - t0, "draw_s": t2 - t1, "iterations": iterations,
                   "cap": cap, "converged": iterations < cap,
                   "last_changes": changes.last(5),
                   "final_loss": float(np.mean(loss[np.isfinite(loss)]))
                   if np.isfinite(loss).any() else None}


def run_pathfinder(model: Any, args: argparse.Namespace) -> tuple[Any, dict]:
    """Multi-path Pathfinder from pymc-extras, PyMC backend, in this process."""
    import pymc_extras as pmx

    t0 = time.perf_counter()
    with model:
        idata = pmx.fit(method="pathfinder", num_draws=args.vi_draws, concurrent=None,
                        random_seed=args.seed, progressbar=False, display_summary=False)
    return idata, {"fit_s": time.perf_counter() - t0, "draw_s": 0.0}


def one_method(method: str, entry: Any, df: Any, args: argparse.Namespace,
               base: dict, ref_sc: dict | None, batch_size: int | None = None) -> dict:
    """Build the model, run one method, score it against the reference; its record."""
    import real_zoo
    from bench_real_zoo import summarise

    label = f"advi-mb{batch_size}" if batch_size else method
    rec = dict(base, method=label, batch_size=batch_size)
    try:
        if method == "step":
            idata, timing = real_zoo.run_step(entry, df, draws=args.draws, tune=args.tune,
                                              chains=2, seed=args.seed)
            rec.update(model_s=timing["model_s"], fit_s=timing["setup_s"]
                       + timing["sampling_s"], setup_s=timing["setup_s"],
                       sampling_s=timing["sampling_s"], draws=args.draws, tune=args.tune)
            names = timing["names"]
            rec.update(summarise(idata, names)[1])
        else:
            t0 = time.perf_counter()
            if batch_size is not None and entry.minibatch is not None:
                model = entry.minibatch(df, batch_size)
            elif batch_size is not None:
                model = entry.build(df, batch_size=batch_size)
            else:
                model = real_zoo.pymc_model(entry, df)
            rec.update(model_s=time.perf_counter() - t0, d=unconstrained_size(model))
            if method == "fullrank" and rec["d"] > args.fullrank_max_d:
                rec.update(status="skipped", message=f"d = {rec['d']} > --fullrank-max-d "
                           f"{args.fullrank_max_d}")
                return rec
            if method == "pathfinder":
                idata, timing = run_pathfinder(model, args)
            else:
                idata, timing = run_advi(model, method, args)
            rec.update(timing)
            names = real_zoo.free_names(model)
        rec["wall_s"] = rec["model_s"] + rec["fit_s"] + rec.get("draw_s", 0.0)
        rec["status"] = "ok"
        if ref_sc is not None:
            rec.update(accuracy(draws_of(idata, names), ref_sc))
    # Recorded and printed (traceback and table): one method's failure ends no benchmark.
    except Exception as err:  # noqa: BLE001
        traceback.print_exc()
        rec.update(status="error", error=type(err).__name__, message=str(err)[:500])
    return rec


def run_config(name: str, rows: int, args: argparse.Namespace) -> list[dict]:
    """Every method on one model at one row count (0: all its rows), nutpie first."""
    import real_zoo
    from bench_real_zoo import record_run

    entry = real_zoo.MODELS[name]
    full = entry.load()
    rows = rows or len(full)
    base = dict(model=name, family=entry.family, shape=entry.shape, written=entry.written,
                rows=rows)
    if rows > len(full):
        return [dict(base, method="all", status="not run",
                     message=f"the data set has {len(full):,} rows")]
    df = real_zoo.subset(full, rows, seed=args.seed)
    ref = dict(base, method="nutpie")
    # Above --per-row-reference-max rows, the same posterior from the data's sufficient
    # statistics where the entry has it: nutpie on the per-row model would take hours.
    reference = entry.reference is not None and rows > args.per_row_reference_max
    if reference:
        ref["reference_model"] = entry.reference.__name__
    idata, timing = real_zoo.run_nutpie(entry, df, draws=args.draws, tune=args.tune,
                                        chains=2, seed=args.seed, reference=reference)
    ref_sc = record_run(ref, idata, timing)
    ref.update(fit_s=timing["setup_s"] + timing["sampling_s"], draws=args.draws,
               tune=args.tune)
    records = [ref]
    for method in args.methods:
        if method == "advi-mb":
            if entry.written != "by hand" and entry.minibatch is None:
                records.append(dict(base, method="advi-mb", status="not run",
                                    message=f"{entry.written} does not write the model on "
                                    "pm.Minibatch, and the entry has no by-hand twin"))
                continue
            for m in args.batch_sizes:
                if m >= rows:
                    continue
                records.append(one_method(method, entry, df, args, base, ref_sc, m))
        else:
            records.append(one_method(method, entry, df, args, base, ref_sc))
        print(table(records[-1:], header=False), flush=True)
    return records


# --------------------------------------------------------------------------- report
def table(records: list[dict], header: bool = True) -> str:
    """The records as a Markdown table."""
    from bench_real_zoo import fmt

    columns = ["model", "rows", "method", "seconds", "s / 1,000 ESS", "iterations", "converged",
               "max \\|Δmean\\|/sd", "max \\|sd ratio − 1\\|", "median \\|sd ratio − 1\\|",
               "95 % coverage (mean / min)"]
    lines = (["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
             if header else [])
    for r in records:
        if r.get("status") != "ok":
            msg = (r.get("message") or "").splitlines()[0][:100].replace("|", "\\|")
            lines.append(f"| {r['model']} | {r['rows']:,} | {r['method']} | "
                         f"{r['status']}: {r.get('error', '')} {msg} |" + " |" * 7)
            continue
        its = r.get("iterations")
        conv = r.get("converged")
        cover = (f"{r['coverage_mean']:.3f} / {r['coverage_min']:.3f}"
                 if "coverage_mean" in r else "–")
        # a reference sampled on another model of the posterior: its seconds not shown
        wall = None if "reference_model" in r else r["wall_s"]
        ess = r.get("min_ess_bulk")
        per_ess = 1000.0 * wall / ess if wall and ess else None
        lines.append(
            f"| {r['model']} | {r['rows']:,} | {r['method']} | {fmt(wall)} | "
            f"{fmt(per_ess)} | {fmt(its, ',d')} | {fmt(conv)} | {fmt(r.get('dmean_max'), '.3f')} | "
            f"{fmt(r.get('sd_ratio_max'), '.3f')} | {fmt(r.get('sd_ratio_median'), '.3f')} | "
            f"{cover} |")
    return "\n".join(lines)


def summary(records: list[dict]) -> str:
    """One line per model and row count: each method's seconds, largest |Δmean| / sd and
    largest |sd ratio − 1|.

    Minibatch ADVI shows its most accurate batch size; a method that did not run shows
    "–"; a fit that stopped at its cap is marked "(cap)".
    """
    from bench_real_zoo import fmt

    def cell(r: dict | None) -> str:
        if r is None or r.get("status") != "ok":
            return "–"
        if "reference_model" in r:  # nutpie on another model of the same posterior
            return "(sufficient statistics)"
        cap = " (cap)" if r.get("converged") is False else ""
        err = (f", {r['dmean_max']:.2f} / {r['sd_ratio_max']:.2f}" if "dmean_max" in r
               else "")
        return f"{fmt(r['wall_s'])} s{err}{cap}"

    columns = ["model", "rows", "nutpie", "step", "minibatch ADVI", "ADVI", "Pathfinder"]
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    for model, rows in dict.fromkeys((r["model"], r["rows"]) for r in records):
        mine = {r["method"]: r for r in records if (r["model"], r["rows"]) == (model, rows)}
        batches = [r for m, r in mine.items() if m.startswith("advi-mb") and "dmean_max" in r]
        best = min(batches, key=lambda r: r["dmean_max"]) if batches else None
        lines.append(f"| {model} | {rows:,} | {cell(mine.get('nutpie'))} | "
                     f"{cell(mine.get('step'))} | {cell(best)} | {cell(mine.get('advi'))} | "
                     f"{cell(mine.get('pathfinder'))} |")
    return "\n".join(lines)


def plot(records: list[dict], path: Path) -> None:
    """Error (max |Δmean| / sd) against seconds, one marker per method, log-log."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in records if r.get("status") == "ok" and "dmean_max" in r]
    configs = sorted({(r["model"], r["rows"]) for r in ok})
    colours = dict(zip(configs, plt.cm.tab20.colors, strict=False))  # up to 20
    fig, ax = plt.subplots(figsize=(9.5, 5))
    for r in ok:
        ax.scatter(r["wall_s"], max(r["dmean_max"], 1e-3), s=60, alpha=0.85,
                   marker=MARKERS.get(r["method"], "x"), color=colours[(r["model"], r["rows"])])
    for method, marker in MARKERS.items():
        if any(r["method"] == method for r in ok):
            ax.scatter([], [], marker=marker, color="grey", label=method)
    for (model, rows), colour in colours.items():
        ax.scatter([], [], marker="s", color=colour, label=f"{model}, {rows:,} rows")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("seconds to a posterior (set-up and compilation included)")
    ax.set_ylabel("max |Δmean| / reference sd")
    ax.axhline(0.1, color="grey", lw=0.8, ls=":")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title("Accuracy against nutpie and wall time")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    import real_zoo

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=DEFAULT_MODELS,
                   help=f"comma-separated catalogue names (default: {DEFAULT_MODELS})")
    p.add_argument("--rows", default="10000,100000",
                   help="comma-separated row counts, or 'all' (a data set with fewer rows "
                   "is not run)")
    p.add_argument("--methods", default=",".join(METHODS),
                   help=f"comma-separated, from {', '.join(METHODS)}")
    p.add_argument("--batch-sizes", default="500,5000", help="minibatch ADVI's batch sizes")
    p.add_argument("--draws", type=int, default=1000, help="the step's and nutpie's draws")
    p.add_argument("--tune", type=int, default=1000, help="the step's and nutpie's tuning")
    p.add_argument("--lr", type=float, default=0.003, help="Adam's learning rate (ADVI)")
    p.add_argument("--tolerance", type=float, default=0.03,
                   help="CheckParametersConvergence's absolute tolerance")
    p.add_argument("--every", type=int, default=1000,
                   help="CheckParametersConvergence's interval in iterations")
    p.add_argument("--max-iter", type=int, default=20_000, help="full-data ADVI's cap")
    p.add_argument("--max-iter-minibatch", type=int, default=30_000,
                   help="minibatch ADVI's cap")
    p.add_argument("--fullrank-max-d", type=int, default=30)
    p.add_argument("--per-row-reference-max", type=int, default=100_000,
                   help="above this many rows, nutpie samples an entry's reference model "
                   "(the same posterior from sufficient statistics) where it has one")
    p.add_argument("--vi-draws", type=int, default=2000,
                   help="draws from each ADVI and Pathfinder approximation")
    p.add_argument("--seed", type=int, default=real_zoo.DEFAULT_SEED)
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--plot", type=Path, default=None, help="write the error/seconds figure")
    p.add_argument("--report", type=Path, nargs="+", default=None, metavar="JSON",
                   help="run nothing: print the table (and --plot) of earlier results files")
    args = p.parse_args(argv)
    args.models = args.models.split(",")
    unknown = [m for m in args.models if m not in real_zoo.MODELS]
    if unknown:
        p.error(f"unknown models {unknown}; the catalogue has: {', '.join(real_zoo.MODELS)}")
    args.methods = args.methods.split(",")
    bad = [m for m in args.methods if m not in METHODS]
    if bad:
        p.error(f"unknown methods {bad}; choose from {', '.join(METHODS)}")
    args.rows = [0 if r == "all" else int(r) for r in args.rows.split(",")]
    args.batch_sizes = [int(m) for m in args.batch_sizes.split(",")]
    return args


def header(argv: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """Machine, versions, commit, command, and the VI settings."""
    from bench_real_zoo import machine

    try:
        extras = version("pymc-extras")
    except PackageNotFoundError:
        extras = None
    return {**machine(argv), "pymc-extras": extras,
            "settings": {"optimizer": f"pm.adam(learning_rate={args.lr})",
                         "convergence": f"CheckParametersConvergence(every={args.every}, "
                                        f"diff='absolute', tolerance={args.tolerance})",
                         "max_iter": args.max_iter,
                         "max_iter_minibatch": args.max_iter_minibatch,
                         "vi_draws": args.vi_draws, "draws": args.draws, "tune": args.tune,
                         "chains": 2, "cores": 1, "seed": args.seed}}


def report_records(paths: list[Path]) -> list[dict]:
    """The records of several results files, grouped by model and row count (in the
    order they first appear), with one reference each: a file that ran some methods
    again re-runs nutpie too, and its reference is not repeated (the first file's
    stands)."""
    records: list[dict] = []
    for path in paths:
        seen = {(r["model"], r["rows"]) for r in records if r["method"] == "nutpie"}
        records += [r for r in json.loads(path.read_text())["records"]
                    if r["method"] != "nutpie" or (r["model"], r["rows"]) not in seen]
    order: dict[tuple, int] = {}
    for r in records:
        order.setdefault((r["model"], r["rows"]), len(order))
    return sorted(records, key=lambda r: order[(r["model"], r["rows"])])


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    sys.path.insert(0, str(HERE))
    args = parse_args(argv)
    if args.report is not None:
        records = report_records(args.report)
        print(table(records))
        print()
        print(summary(records))
        if args.plot is not None:
            plot(records, args.plot)
            print(f"figure written to {args.plot}")
        return
    warnings.filterwarnings("ignore", category=FutureWarning)
    records: list[dict] = []
    for rows in args.rows:
        for name in args.models:
            print(f"\n## {name}, {f'{rows:,} rows' if rows else 'all rows'}", flush=True)
            records += run_config(name, rows, args)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps({"machine": header(argv, args),
                                            "records": records}, indent=1, default=float))
    print()
    print(table(records))
    print(f"\nwritten to {args.out}")
    if args.plot is not None:
        plot(records, args.plot)
        print(f"figure written to {args.plot}")


if __name__ == "__main__":
    main()
