"""Reproduce the experiments of Seita et al. (2017) end to end and write one report.

One command runs the four acceptance tests of the paper, MinibatchBarker, AustereMH(nc)
(adaptive design; its full pass per step counted), AustereMH(c) and MHSubLhd, at the
settings of the paper (section 6, Table 5) and of the authors' scripts
(``code/gaussianMixtureModel.ssc`` and ``code/logisticRegressionModel.ssc`` in the public
repository DanielTakeshi/New_MH_Test; see the docstrings of ``examples/gaussian_mixture.py``
and ``examples/logistic_mnist.py``: proposal scales are standard deviations, MNIST chains
start at θ = 0, labels ±1, no intercept, flat prior) through the example scripts, and
writes ``benchmarks/output/report.md`` with every table next to the paper's numbers, the
figures, wall time and data consumed per sample (full passes counted separately), and a
sentence wherever a number differs from the paper's by more than two of the paper's
standard deviations.

Experiments (``--only``): ``table3`` (the correction distribution, Table 3), ``gmm`` and
``gmm_sigma09`` (Gaussian mixture, Tables 1 and 4, Figures 1-2, with σ = 1 and with the
σ = 0.9 of the authors' script), ``mnist13k`` and ``mnist100k`` (logistic regression,
Table 2, Figures 3-5), ``sweep`` (Figure 6).

Runtime: the full run (the paper's 10 trials, 5 on MNIST-100k) takes about a day on two
shared cores, almost all of it in AustereMH(nc) and MHSubLhd, which evaluate all N rows
at every step (0.2 s per sample on the mixture, 0.5-0.8 s on MNIST-13k, 1-2 s on
MNIST-100k here); the report gives the estimate from the measured seconds per sample.
``--quick`` (about 10-15 minutes) runs fewer trials and samples, and says which and why,
in the report. Each experiment's results are cached in ``benchmarks/output/results/``, so
experiments can be run separately (``--only``) and the report rebuilt from them
(``--report-only``).

Usage::

    python benchmarks/reproduce.py --quick
    python benchmarks/reproduce.py                      # the paper's trials (hours)
    python benchmarks/reproduce.py --only gmm --trials 3
    python benchmarks/reproduce.py --report-only
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import correction_distribution  # noqa: E402
import gaussian_mixture  # noqa: E402
import logistic_mnist  # noqa: E402
import step_size_sweep  # noqa: E402

EXPERIMENTS = ("table3", "gmm", "gmm_sigma09", "mnist13k", "mnist100k", "sweep")
MNIST_ALL = "barker,austere-nc,austere-c,mhsublhd"
GMM_ALL = "barker,austere,mhsublhd"
#: The paper's trials × samples per experiment.
PAPER_RUNS = {"gmm": (10, 3000), "gmm_sigma09": (10, 3000), "mnist13k": (10, 5000),
              "mnist100k": (5, 3000), "sweep": (1, 3000)}
#: Why --quick cuts each method (written into the report).
QUICK_REASONS = {
    "mhsublhd": "its range bound C_{θ,θ'} needs a pass over all N rows at every step "
                "(about 0.2 s per sample on the mixture, 0.8 s on MNIST-13k, 1-2 s on "
                "MNIST-100k on 2 shared cores)",
    "austere-nc": "its adaptive design needs a pass over all N rows at every step (about "
                  "0.5 s per sample on MNIST-13k, 1 s on MNIST-100k on 2 shared cores)",
    "austere-c": "it uses ~2,000-3,000 rows per step (25-50 ms per sample here)",
    "austere": "it uses ~10⁴ rows per step",
    "barker": "to keep --quick short",
}


# ------------------------------------------------------------------------ plans
def plan(name: str, quick: bool, trials: int | None) -> dict:
    """Arguments of the example script for one experiment (before per-method overrides)."""
    if name == "table3":
        if quick:
            return {"script": "correction_distribution",
                    "argv": ["--n", "2000", "--sigmas", "1.0"],
                    "note": "--quick: n = 2000 and σ = 1 only (each ridge solve takes about "
                            "10 s here; the full run does n ∈ {2000, 4000} × σ ∈ {0.8, "
                            "0.9, 1.0, 1.1} × 5 λ)."}
        return {"script": "correction_distribution", "argv": ["--full"], "note": ""}
    if name in ("gmm", "gmm_sigma09"):
        if name == "gmm_sigma09":
            argv = ["--methods", "barker", "--sigma", "0.9",
                    "--trials", str(trials or (3 if quick else 10))]
            return {"script": "gaussian_mixture", "argv": argv, "note": ""}
        argv = ["--methods", GMM_ALL, "--trials", str(trials or (3 if quick else 10))]
        if quick:
            argv += ["--method-trials", "austere=2,mhsublhd=1",
                     "--method-draws", "mhsublhd=300"]
        return {"script": "gaussian_mixture", "argv": argv, "note": ""}
    if name in ("mnist13k", "mnist100k"):
        data = name.removeprefix("mnist")
        paper_trials = 10 if data == "13k" else 5
        argv = ["--data", data, "--methods", MNIST_ALL,
                "--trials", str(trials or (2 if quick else paper_trials))]
        if quick and data == "13k":
            argv += ["--method-trials", "austere-c=1,austere-nc=1,mhsublhd=1",
                     "--method-draws", "austere-c=1000,austere-nc=100,mhsublhd=100"]
        elif quick:
            argv = ["--data", data, "--methods", "barker,austere-c",
                    "--trials", str(trials or 2), "--method-trials", "austere-c=1",
                    "--method-draws", "austere-c=500"]
        return {"script": "logistic_mnist", "argv": argv,
                "note": "--quick: AustereMH(nc) and MHSubLhd are not run on MNIST-100k "
                        "(a pass over all 100,007 rows per step, 1-2 s per sample here)."
                if quick and data == "100k" else ""}
    if name == "sweep":
        argv = ["--data", "100k"] + (["--draws", "1000"] if quick else [])
        return {"script": "step_size_sweep", "argv": argv,
                "note": "--quick: 1000 samples per step size (the paper: 3000)."
                if quick else ""}
    raise ValueError(name)


SCRIPTS = {"correction_distribution": correction_distribution,
           "gaussian_mixture": gaussian_mixture, "logistic_mnist": logistic_mnist,
           "step_size_sweep": step_size_sweep}


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, str):
        return value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _with_overrides(script: str, argv: list[str], args: argparse.Namespace) -> list[str]:
    """Merge ``--method-trials`` / ``--method-draws`` into the script's arguments.

    Items naming a method the script does not have are left out (``mhsublhd`` exists in
    both scripts, ``austere-nc`` only in the MNIST one).
    """
    methods = {"gaussian_mixture": set(gaussian_mixture.LABELS),
               "logistic_mnist": set(logistic_mnist.METHODS)}.get(script)
    if methods is None:
        return argv
    argv = list(argv)
    for flag, extra in (("--method-trials", args.method_trials),
                        ("--method-draws", args.method_draws)):
        items = [i for i in extra.split(",") if i.strip().partition("=")[0] in methods]
        if not items:
            continue
        if flag in argv:
            k = argv.index(flag)
            argv[k + 1] = ",".join([argv[k + 1], *items])  # later items win
        else:
            argv += [flag, ",".join(items)]
    return argv


def run_experiment(name: str, args: argparse.Namespace) -> dict:
    p = plan(name, args.quick, args.trials)
    out = args.out / name
    argv = [*_with_overrides(p["script"], p["argv"], args), "--out", str(out)]
    print(f"\n=== {name}: python examples/{p['script']}.py {' '.join(argv)}", flush=True)
    start = time.perf_counter()
    result = SCRIPTS[p["script"]].main(argv)
    seconds = time.perf_counter() - start
    record = {
        "name": name,
        "script": p["script"],
        "argv": argv,
        "quick": args.quick,
        "trials_flag": args.trials,
        "reason": args.reason,
        "note": p["note"],
        "seconds": seconds,
        "finished": datetime.now(UTC).isoformat(timespec="seconds"),
        "result": _jsonable(result),
    }
    path = args.out / "results" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1), encoding="utf-8")
    print(f"=== {name}: {seconds / 60:.1f} min", flush=True)
    return record


# ----------------------------------------------------------------------- report
def _fmt(mean: float, sd: float | None, digits: int = 1) -> str:
    if sd is None or not math.isfinite(sd):
        return f"{mean:,.{digits}f}"
    return f"{mean:,.{digits}f} ± {sd:,.{digits}f}"


def _stats(per_trial: list[float]) -> tuple[float, float | None]:
    n = len(per_trial)
    mean = sum(per_trial) / n
    if n < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in per_trial) / (n - 1))


def _demote(markdown: str, levels: int = 2) -> str:
    """Shift the headings of an example's Markdown down (they nest under the report's)."""
    out = []
    for line in markdown.splitlines():
        if line.startswith("#"):
            line = "#" * levels + line
        out.append(line)
    return "\n".join(out)


#: Why a number can differ from the paper's (used when it differs by > 2 paper sds). The
#: authors' code referred to is in the public repository DanielTakeshi/New_MH_Test
#: (code/adaptiveMHTest.ssc, code/cutMHTest.ssc), read for these explanations.
_MHSUBLHD_WHY = (
    "the authors' MHSubLhd (code/adaptiveMHTest.ssc in DanielTakeshi/New_MH_Test) is a "
    "variant of Bardenet et al.'s test: it takes C_{θ,θ'} = max_i |l_i| rather than the "
    "range max_i l_i − min_i l_i, the standard deviation of all N ratios rather than the "
    "minibatch's, no without-replacement (Serfling) factor, and starts the error split at "
    "k = 2, and its ψ omits the prior term. On the mixture these details do not move the "
    "data use much (a 400-sample chain used 68.0k rows per step with C = max|l_i| and no "
    "Serfling factor against 69.4k with this package's bound, same seed), while single "
    "chains differ from each other by thousands of rows (one 300-sample chain used 49.6k), "
    "so the trial-to-trial spread of a few trials is the first suspect."
)
REASONS = {
    ("gmm", "barker", "low"):
        "σ = 1 here, while the authors' script used σ = 0.9, which needs s² < 0.81 and so "
        "larger minibatches (the σ = 0.9 run is the next row); the data set is also a fresh "
        "draw of 10⁶ points.",
    ("gmm_sigma09", "barker", "high"):
        "with σ = 0.9 the test needs s² < 0.81; the paper's 182.3 lies between this run's "
        "σ = 1 and σ = 0.9 averages, and its data set was another draw of 10⁶ points.",
    ("gmm", "austere", "low"):
        "the paper does not state AustereMH(c)'s minibatch size m for this experiment; the "
        "authors' script sets the per-test ε = 0.005 and uses the common initial minibatch, "
        "which is what runs here (m = 50). Its data use depends on how often |μ − μ0| is "
        "small along the chain, i.e. on the tempered posterior of the particular data draw.",
    ("gmm", "austere", "high"):
        "the paper does not state AustereMH(c)'s minibatch size m for this experiment; here "
        "the per-test ε = 0.005 with m = 50 (as in the authors' script).",
    ("gmm", "mhsublhd", "low"): _MHSUBLHD_WHY,
    ("gmm", "mhsublhd", "high"): _MHSUBLHD_WHY,
    ("mnist13k", "mhsublhd", "low"): _MHSUBLHD_WHY.split(". On the mixture")[0] + ".",
    ("mnist13k", "mhsublhd", "high"): _MHSUBLHD_WHY.split(". On the mixture")[0] + ".",
    ("mnist13k", "barker", "high"):
        "the chains start at θ = 0 and spend their first steps where s²(Δ*) is larger; the "
        "notes measured about 133 over 5000 samples from θ = 0 at these settings.",
    ("mnist13k", "austere-nc", "low"):
        "this package reads the design table at the largest tabulated |μ_std| not above the "
        "actual one (a conservative rounding that never exceeds the error bound); the "
        "authors' code (code/cutMHTest.ssc) picks the grid value closest to the signed "
        "μ_std from a MATLAB table that is not public. If that table holds only μ_std ≥ 0, "
        "every step with μ < μ0 used the worst-case (μ_std = 0) design, which needs several "
        "times more data; that would explain a paper value this much higher.",
    ("mnist13k", "austere-c", "high"):
        "the design is the paper's (m = 450, ε = 0.01, the dynamic program picks it for the "
        "bound 0.1); its data use depends on how often |μ − μ0| is small along the chain.",
}
_DATA_100K = ("MNIST-100k here is an approximation: the 13,007 real digits plus 87,000 "
              "elastically deformed copies instead of the paper's infinite-MNIST digits, so "
              "the data set itself differs.")
for _method in ("barker", "austere-nc", "austere-c", "mhsublhd"):
    for _direction in ("low", "high"):
        _same = REASONS.get(("mnist13k", _method, _direction), "")
        if _method == "austere-c":
            _same = ("The design is the paper's (m = 300, ε = 0.01; the dynamic program "
                     "picks it for the bound 0.2).")
        REASONS[("mnist100k", _method, _direction)] = (
            _DATA_100K + (" " + _same[0].upper() + _same[1:] if _same else ""))


def _discrepancy(exp: str, method: str, label: str, ours: tuple, paper: tuple,
                 trials: int, draws: int, paper_run: tuple) -> str | None:
    mean, _ = ours
    p_mean, p_sd = paper
    if p_sd is None or p_sd <= 0:
        return None
    z = (mean - p_mean) / p_sd
    if abs(z) <= 2:
        return None
    direction = "high" if z > 0 else "low"
    why = REASONS.get((exp, method, direction))
    parts = [f"**{label}** ({exp}): {mean:,.1f} against the paper's {p_mean:,} ± {p_sd:,} "
             f"({z:+.1f} paper standard deviations)."]
    if draws < paper_run[1]:
        parts.append(f"This run used {trials} trial(s) × {draws} samples (the paper: "
                     f"{paper_run[0]} × {paper_run[1]}): a shorter chain from the same start "
                     "weights the start-up phase more (on MNIST the first samples from θ = 0 "
                     "need larger minibatches), so part of the difference is that.")
    elif trials < paper_run[0]:
        parts.append(f"This run used {trials} of the paper's {paper_run[0]} trials.")
    if why:
        parts.append("Why: " + why[0].upper() + why[1:])
    elif (trials, draws) == paper_run:
        parts.append("Why: not explained yet (same settings as the paper).")
    return " ".join(parts)


def _estimate_full_hours(records: dict) -> tuple[float, list[str]]:
    """Full-run hours from measured seconds per sample (paper's trials and samples)."""
    lines, total = [], 0.0
    for name, (trials, draws) in PAPER_RUNS.items():
        rec = records.get(name)
        if rec is None:
            continue
        res = rec["result"]
        methods = res.get("methods")
        if name == "sweep":
            draws_run = _sweep_draws(rec)
            secs = sum(float(v) / draws_run * draws for v in res["seconds"].values())
        else:
            secs = sum(m["seconds_per_sample"] * trials * draws for m in methods.values())
            if name.startswith("mnist"):  # the schedule run (MinibatchBarker) too
                secs += methods.get("barker", {}).get("seconds_per_sample", 0) * trials * draws
        if name.startswith("mnist"):
            missing = set(logistic_mnist.METHODS) - set(methods)
            if missing:
                # not measured in this run: extrapolate from the data they need per step
                secs += sum(_guess_seconds(name, m) * trials * draws for m in missing)
        when = f"{secs / 3600:.1f} h" if secs >= 3600 else f"{secs / 60:.0f} min"
        lines.append(f"| {name} | {trials} × {draws} | {when} |")
        total += secs
    return total / 3600, lines


def _sweep_draws(rec: dict) -> int:
    argv = rec["argv"]
    return int(argv[argv.index("--draws") + 1]) if "--draws" in argv else 3000


def _guess_seconds(name: str, method: str) -> float:
    """Seconds per sample of a method not run (measured on 2 shared cores)."""
    return {("mnist100k", "austere-nc"): 1.9, ("mnist100k", "mhsublhd"): 2.1,
            ("mnist13k", "austere-nc"): 0.5, ("mnist13k", "mhsublhd"): 0.8}.get(
        (name, method), 0.05)


def write_report(args: argparse.Namespace, wall_seconds: float | None) -> Path:
    records = {}
    for name in EXPERIMENTS:
        path = args.out / "results" / f"{name}.json"
        if path.is_file():
            records[name] = json.loads(path.read_text(encoding="utf-8"))
    import numpy
    import pymc
    import pytensor

    modes = {("quick" if r["quick"] else "full") for r in records.values()}
    lines = [
        "# Reproducing Seita et al. (2017): report",
        "",
        f"Generated {datetime.now(UTC).isoformat(timespec='seconds')} by "
        "`benchmarks/reproduce.py` on "
        f"{platform.system()} {platform.machine()} with {os.cpu_count()} CPU(s) (shared with "
        f"other jobs); Python {platform.python_version()}, PyMC {pymc.__version__}, PyTensor "
        f"{pytensor.__version__}, NumPy {numpy.__version__}. Mode of the cached experiments: "
        f"{', '.join(sorted(modes)) or 'none'}."
        + (f" This invocation took {wall_seconds / 60:.1f} minutes." if wall_seconds else ""),
        "",
        "Settings follow the paper (section 6, Table 5) and the authors' scripts "
        "(DanielTakeshi/New_MH_Test, as the docstrings of `examples/gaussian_mixture.py` and "
        "`examples/logistic_mnist.py` state them): proposal scales are standard deviations; "
        "MNIST chains start at θ = 0 with labels ±1, no intercept and a flat prior. "
        "Minibatch sizes exclude the full passes of AustereMH(nc) and MHSubLhd, as in the "
        "paper; those passes are counted in their own columns.",
        "",
    ]
    hours, estimate_lines = _estimate_full_hours(records)
    if estimate_lines:
        lines += [
            "## Runtime of the full run",
            "",
            "Estimated from the seconds per sample measured in these runs, at the paper's "
            "trials × samples (methods not run are extrapolated from measurements on 2 "
            "shared cores):",
            "",
            "| experiment | trials × samples | estimated time |",
            "| --- | --- | --- |",
            *estimate_lines,
            f"| **total** | | **{hours:.1f} h** (+ about 0.5 h for Table 3 at n = 4000) |",
            "",
            "Almost all of it is the per-step full passes of AustereMH(nc) and MHSubLhd "
            "(the estimator evaluates them through row-index gathers of all N rows, at several "
            "µs per row for the 784-pixel rows).",
            "",
        ]

    summary = ["## Summary: average minibatch size against the paper", "",
               "| experiment | method | trials × samples | this run | paper | "
               "full-pass rows / sample | all rows / sample | wall s / sample |",
               "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    sentences: list[str] = []
    for exp in ("gmm", "gmm_sigma09", "mnist13k", "mnist100k"):
        rec = records.get(exp)
        if rec is None:
            continue
        res = rec["result"]
        if exp.startswith("gmm"):
            paper_of, labels = gaussian_mixture.PAPER_TABLE1, gaussian_mixture.LABELS
            extra_key = "extra_per_step"
        else:
            paper_of = logistic_mnist.PAPER_TABLE2[res["data"]]
            labels = logistic_mnist.LABELS
            extra_key = "extra_per_sample"
        for method, m in res["methods"].items():
            ours = _stats(m["per_trial"])
            paper = paper_of[method]
            label = labels[method] + (" (σ = 0.9)" if exp == "gmm_sigma09" else "")
            trials, draws = len(m["per_trial"]), m.get("draws") or PAPER_RUNS[exp][1]
            extra = m[extra_key]
            summary.append(
                f"| {exp} | {label} | {trials} × {draws} | {_fmt(*ours)} | "
                f"{paper[0]:,} ± {paper[1]:,} | {extra:,.0f} | {ours[0] + extra:,.0f} | "
                f"{m['seconds_per_sample']:.3g} |")
            text = _discrepancy(exp, method, label, ours, paper, trials, draws,
                                PAPER_RUNS[exp])
            if text:
                sentences.append(text)
    lines += summary + [""]
    if sentences:
        lines += ["### Where this run differs from the paper by more than two standard "
                  "deviations", ""] + [f"- {s}" for s in sentences] + [""]

    titles = {
        "table3": "Table 3: the correction distribution",
        "gmm": "Section 6.1: Gaussian mixture (Tables 1 and 4, Figures 1 and 2)",
        "gmm_sigma09": "Section 6.1 with σ = 0.9 (the authors' script)",
        "mnist13k": "Section 6.2: logistic regression on MNIST-13k (Table 2, Figures 3, 5)",
        "mnist100k": "Section 6.2: logistic regression on MNIST-100k (Table 2, Figures 3, 4)",
        "sweep": "Appendix C.3: proposal step size (Figure 6)",
    }
    for name in EXPERIMENTS:
        rec = records.get(name)
        lines += [f"## {titles[name]}", ""]
        if rec is None:
            lines += ["Not run (see `--only`).", ""]
            continue
        lines += [f"Command: `python examples/{rec['script']}.py {' '.join(rec['argv'])}` "
                  f"({rec['seconds'] / 60:.1f} min, finished {rec['finished']}).", ""]
        reduced = _reductions(name, rec)
        if reduced:
            lines += [reduced, ""]
        if rec["note"]:
            lines += [rec["note"], ""]
        res = rec["result"]
        lines += [_demote(res["table"]), ""]
        lines += _extra_commentary(name, res)
        base = args.out / name
        for png in sorted(base.glob("*.png")):
            lines += [f"![{png.stem}]({name}/{png.name})", ""]
    path = args.out / "report.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _reductions(name: str, rec: dict) -> str:
    """A sentence naming the methods run with fewer trials or samples than the paper, and why."""
    if name not in PAPER_RUNS or name == "sweep":
        return ""
    paper_trials, paper_draws = PAPER_RUNS[name]
    cut = []
    for method, m in rec["result"]["methods"].items():
        trials, draws = len(m["per_trial"]), m.get("draws") or paper_draws
        if trials < paper_trials or draws < paper_draws:
            if rec.get("reason"):
                why = rec["reason"]
            elif rec["quick"]:
                why = f"--quick: {QUICK_REASONS.get(method, '')}"
            else:
                why = "set on the command line"
            cut.append(f"{method}: {trials} trial(s) × {draws} samples ({why})")
    if not cut:
        return ""
    return (f"Fewer trials or samples than the paper's {paper_trials} × {paper_draws}: "
            + "; ".join(cut) + ".")


#: What was checked about Table 3 cells that are not reproduced.
KNOWN_TABLE3 = {
    (4000, 1.1, 0.1): " (the same normal equations solved by Cholesky, by symmetric "
                      "indefinite and by general LU all give 0.0190, so it is not rounding "
                      "in this solve; the published value may be a slip for 1.9e-2)",
}


def _extra_commentary(name: str, res: dict) -> list[str]:
    if name == "table3":
        rows = [r for r in res["ridge"] if r.get("paper")]
        if not rows:
            return []
        far = [r for r in rows if abs(r["error"] / r["paper"] - 1.0) > 0.05]
        text = (f"{len(rows) - len(far)} of {len(rows)} ridge-then-clip errors are within 5% "
                "of the published ones (given to two significant digits).")
        if far:
            text += " Not reproduced: " + "; ".join(
                f"n = {r['n']}, σ = {r['sigma']:g}, λ = {r['lam']:g}: {r['error']:.2g} "
                f"against {r['paper']:.2g}" + KNOWN_TABLE3.get(
                    (r["n"], round(r["sigma"], 4), r["lam"]), "")
                for r in far) + "."
        return [text + " The package does not use these tables: its linear-program tables "
                "are 10³-10⁵ times more accurate at the same σ (second table), and their "
                "error is a floor under every test's error.", ""]
    if name == "sweep":
        out = []
        for sd, value in res["mean_batch_size"].items():
            paper = step_size_sweep.PAPER.get(float(sd))
            if paper and res["data"] == "100k":
                out.append(f"step {sd}: {value:,.1f} against {paper:,} "
                           f"(ratio {value / paper:.2f})")
        if out:
            return ["The paper reports one trial without a standard deviation: "
                    + "; ".join(out) + ". The MNIST-100k here is an approximation "
                    "(elastic deformations of the real digits instead of infinite MNIST), "
                    "so the data set, not only the sampler, differs.", ""]
    if name.startswith("gmm"):
        return ["Table 4's values depend on the binning, which the paper does not give, so "
                "only the comparison with independent draws (same n) and between methods "
                "carries over; autocorrelated MCMC samples give larger chi-squared values "
                "than independent draws for every method.", ""]
    return []


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="fewer trials and samples (about 10-15 minutes; the report says "
                             "which and why)")
    parser.add_argument("--trials", type=int, default=None,
                        help="trials per method (default: the paper's, 10 or 5; --quick: 2-3)")
    parser.add_argument("--method-trials", default="",
                        help="per-method trials for the selected experiments, e.g. "
                             "austere-nc=2,mhsublhd=2 (give --reason)")
    parser.add_argument("--method-draws", default="",
                        help="per-method samples for the selected experiments")
    parser.add_argument("--reason", default="",
                        help="why trials or samples are fewer than the paper's (goes into the "
                             "report)")
    parser.add_argument("--only", default=",".join(EXPERIMENTS),
                        help=f"comma-separated subset of {','.join(EXPERIMENTS)}")
    parser.add_argument("--report-only", action="store_true",
                        help="rebuild report.md from the cached results")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "output")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = sorted(set(names) - set(EXPERIMENTS))
    if unknown:
        parser.error(f"unknown experiments {unknown}; choose from {', '.join(EXPERIMENTS)}")
    if (args.method_trials or args.method_draws or args.trials) and not (
        args.reason or args.quick or args.report_only
    ):
        parser.error("fewer trials or samples than the paper's need a --reason for the report")
    start = time.perf_counter()
    if not args.report_only:
        for name in EXPERIMENTS:
            if name in names:
                run_experiment(name, args)
    wall = None if args.report_only else time.perf_counter() - start
    path = write_report(args, wall)
    print(f"\nreport written to {path}")
    return path


if __name__ == "__main__":
    main()
