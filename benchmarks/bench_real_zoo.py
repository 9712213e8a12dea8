"""Benchmark: the real-data model zoo, the zero-config step against nutpie.

For each model of :mod:`real_zoo` (real public data bundled in registry packages), in one
process: this package's bare default step, ``MinibatchBarker()`` (by hand:
``pm.sample(step=MinibatchBarker(), chains=2, cores=1)``; bambi:
``Model.fit(step=MinibatchBarker(), ...)``), then the reference, nutpie
(``nutpie.compile_pymc_model(model)``, ``nutpie.sample(compiled, chains=2, cores=1)``), or
PyMC's NUTS where nutpie cannot take the model (the ``sampler`` column says which, and the
record keeps nutpie's error).

Each model runs in a new subprocess (``OPENBLAS_NUM_THREADS=1``):

- ``--cold``: with empty caches for both samplers: fresh temporary folders for PyTensor
  (``PYTENSOR_FLAGS=compiledir=...``), Numba (``NUMBA_CACHE_DIR``) and this package's
  compiled functions (``PYMC_MINIBATCH_MH_FUNCTION_CACHE_DIR``), as every new user starts;
- ``--warm``: with caches that an earlier run filled (``--both`` runs cold, then warm on the
  cold run's folders; ``--warm`` alone keeps its folders in the temporary directory and
  fills them first with a short untimed run when they are new).

Columns: wall time (the model's construction, the step's set-up or nutpie's compilation,
and sampling), the smallest bulk ESS over every scalar of the model's free variables, ESS/s
on the wall time, the largest R-hat, and agreement with the reference: the largest
|Δmean| in combined MCSE units and the largest |sd ratio − 1|. A model passes when the
step's R-hat < 1.01, |Δmean| < 4 combined MCSE and the sds are within 10 %. A model the
package refuses with a clear message (``ModelNotSupportedError``, ``ControlVariateError``)
is recorded as ``refused`` with the message.

Run (from the repository root)::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/bench_real_zoo.py --warm \\
        --models diamonds_logprice_normal,star_math_school_bambi
    .venv/bin/python benchmarks/bench_real_zoo.py --both --rows 100000 \\
        --models birthdays_state_poisson --draws 500 --tune 500

``--reference-draws`` and ``--reference-tune`` run nutpie longer than the step where it
mixes slowly (its records keep its own ``draws`` and ``tune``); ESS/s is per second of
each sampler's own run.

Results are written as JSON (a header with the machine, versions, commit and command, and
a list of records) to ``--out`` after every model, and printed as a Markdown table;
``--report FILE ...`` prints the summary (cold and warm ratios side by side) of earlier
results files (those of one PyMC line merged: a model run again in a later file replaces
its earlier records), and ``--plot`` draws them (the tables and the figure of the README, of
``benchmarks/README.md`` and of the guide's performance page)::

    .venv/bin/python benchmarks/bench_real_zoo.py --both --rows 30000 \\
        --out benchmarks/results/real_zoo_30k_pymc5.json
    .venv/bin/python benchmarks/bench_real_zoo.py --report \\
        benchmarks/results/real_zoo_30k_pymc5.json benchmarks/results/real_zoo_30k_pymc6.json \\
        --plot docs/_static/real_zoo_ratios.png
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / "results" / "real_zoo.json"
#: Draws and tuning of the untimed run that fills ``--warm``'s new cache folders.
PRIMING_DRAWS = 50
#: The pass rule (the step against the reference).
RHAT_MAX, Z_MAX, SD_MAX = 1.01, 4.0, 0.10


# --------------------------------------------------------------------------- one model
def summarise(idata: Any, names: list[str]) -> tuple[dict, dict[str, float]]:
    """Scalars of the free variables, and their min bulk / tail ESS and max R-hat."""
    from bench_tall_glm import ess_rhat, scalars

    from pymc_minibatch_mh.model.compat import posterior

    post = posterior(idata)
    sc = scalars({n: post[n].values for n in names}, names)
    bulk, tail, rhat = ess_rhat(sc)
    return sc, {"min_ess_bulk": bulk, "min_ess_tail": tail, "rhat_max": rhat}


def record_run(rec: dict, idata: Any, timing: dict) -> dict:
    """Fill a record's timings and diagnostics; return the draws' scalars."""
    sc, diag = summarise(idata, timing["names"])
    wall = timing["model_s"] + timing["setup_s"] + timing["sampling_s"]
    rec.update(status="ok", model_s=timing["model_s"], setup_s=timing["setup_s"],
               sampling_s=timing["sampling_s"], wall_s=wall, **diag,
               ess_per_s=diag["min_ess_bulk"] / wall, scalars=len(sc))
    return sc


def run_child(args: argparse.Namespace) -> list[dict]:
    """Run one model in this process: the step, then the reference; return the records."""
    import real_zoo
    from bench_tall_glm import agreement

    from pymc_minibatch_mh.errors import ControlVariateError, ModelNotSupportedError

    entry = real_zoo.MODELS[args.models]
    df = real_zoo.subset(entry.load(), args.rows, seed=args.seed)
    base = dict(model=entry.name, family=entry.family, shape=entry.shape,
                written=entry.written, source=entry.source, rows=len(df), mode=args.mode,
                draws=args.draws, tune=args.tune, chains=2)
    size = dict(draws=args.draws, tune=args.tune, chains=2, seed=args.seed)

    step = dict(base, sampler="package: MinibatchBarker()")
    step_sc = None
    try:
        idata, timing = real_zoo.run_step(entry, df, **size)
        step_sc = record_run(step, idata, timing)
    except (ModelNotSupportedError, ControlVariateError) as err:
        step.update(status="refused", error=type(err).__name__, message=str(err))
    except Exception as err:  # noqa: BLE001 - recorded and printed: one model cannot end the run
        traceback.print_exc()
        step.update(status="error", error=type(err).__name__, message=str(err))
    records = [step]
    if args.skip_nutpie:
        return records

    # The reference may run longer than the step (--reference-draws): where nutpie mixes
    # slowly, PyMC's default draws leave it unconverged. Its ESS/s is still per second.
    ref_size = dict(size, draws=args.reference_draws or args.draws,
                    tune=args.reference_tune or args.tune)
    ref = dict(base, sampler="nutpie", draws=ref_size["draws"], tune=ref_size["tune"])
    try:
        idata, timing = real_zoo.run_nutpie(entry, df, **ref_size)
    except Exception as err:  # noqa: BLE001 - nutpie refused the model: PyMC NUTS, recorded
        warnings.warn(f"nutpie failed on {entry.name} ({type(err).__name__}: {err}); "
                      "the reference is PyMC's NUTS", stacklevel=1)
        ref.update(sampler="pymc NUTS", nutpie_error=f"{type(err).__name__}: {err}")
        idata, timing = real_zoo.run_pymc_nuts(entry, df, **ref_size)
    ref_sc = record_run(ref, idata, timing)
    records.append(ref)
    if step_sc is not None:
        z, sd, z_at, sd_at, zsd = agreement(step_sc, ref_sc)
        step.update(z_max=z, z_at=z_at, sd_ratio_max=sd, sd_at=sd_at, zsd_max=zsd,
                    ess_per_s_ratio=step["ess_per_s"] / ref["ess_per_s"],
                    reference_converged=ref["rhat_max"] < RHAT_MAX,
                    passed=bool(step["rhat_max"] < RHAT_MAX and z < Z_MAX and sd < SD_MAX))
    return records


# --------------------------------------------------------------------------- subprocesses
def cache_env(folder: Path) -> dict[str, str]:
    """The environment of a run whose caches live in ``folder``."""
    env = dict(os.environ)
    flags = env.get("PYTENSOR_FLAGS", "")
    env["PYTENSOR_FLAGS"] = ",".join(
        f for f in (flags, f"compiledir={folder / 'pytensor'}") if f)
    env["NUMBA_CACHE_DIR"] = str(folder / "numba")
    env["PYMC_MINIBATCH_MH_FUNCTION_CACHE_DIR"] = str(folder / "functions")
    env["OPENBLAS_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(HERE), str(ROOT), env.get("PYTHONPATH", "")) if p)
    for sub in ("pytensor", "numba", "functions"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    return env


def spawn(args: argparse.Namespace, name: str, mode: str, folder: Path,
          draws: int, tune: int) -> list[dict]:
    """Run one model in a new process with the caches in ``folder``; its records."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = Path(f.name)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--models", name,
           "--mode", mode, "--draws", str(draws), "--tune", str(tune), "--seed",
           str(args.seed), "--out", str(out)]
    if args.rows is not None:
        cmd += ["--rows", str(args.rows)]
    if args.skip_nutpie:
        cmd.append("--skip-nutpie")
    if mode != "priming":
        for flag in ("reference_draws", "reference_tune"):
            if getattr(args, flag):
                cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=cache_env(folder), check=False)
    try:
        records = json.loads(out.read_text()) if proc.returncode == 0 else []
    finally:
        out.unlink(missing_ok=True)
    if proc.returncode != 0:
        records = [dict(model=name, mode=mode, sampler="package: MinibatchBarker()",
                        status="error", error="subprocess",
                        message=f"the run's process exited with code {proc.returncode}")]
    for r in records:
        r["process_s"] = time.perf_counter() - t0
    return records


def warm_folder(name: str, rows: int | None) -> Path:
    """Where ``--warm`` alone keeps a model's caches between runs."""
    return Path(tempfile.gettempdir()) / "pymc-minibatch-mh-real-zoo-warm" / f"{name}-{rows}"


def run_model(args: argparse.Namespace, name: str) -> list[dict]:
    """The model's cold and/or warm runs, each in a new process."""
    records = []
    if args.mode in ("cold", "both"):
        folder = Path(tempfile.mkdtemp(prefix="real-zoo-cold-"))
        try:
            records += spawn(args, name, "cold", folder, args.draws, args.tune)
            if args.mode == "both":
                records += spawn(args, name, "warm", folder, args.draws, args.tune)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    else:
        folder = warm_folder(name, args.rows)
        if not (folder / "primed").exists():
            print(f"[{name}] filling new cache folders {folder} with a short untimed run",
                  file=sys.stderr, flush=True)
            spawn(args, name, "priming", folder, PRIMING_DRAWS, PRIMING_DRAWS)
            (folder / "primed").touch()
        records += spawn(args, name, "warm", folder, args.draws, args.tune)
    return records


# --------------------------------------------------------------------------- report
def machine(argv: list[str]) -> dict[str, Any]:
    """Platform, CPU count, versions, commit and command line of this run."""
    def v(pkg: str) -> str | None:
        try:
            return version(pkg)
        except PackageNotFoundError:
            return None

    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                    cwd=ROOT, capture_output=True, text=True).stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = None, None
    return {"platform": platform.platform(), "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            **{pkg: v(pkg) for pkg in ("pymc", "pytensor", "nutpie", "bambi", "arviz",
                                       "pymc-minibatch-mh")},
            "git_commit": commit, "git_dirty": dirty,
            "command": " ".join([Path(sys.executable).name, *argv])}


def fmt(value: Any, spec: str = ".1f") -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "**no**"
    return format(value, spec)


def table(records: list[dict]) -> str:
    """The records as a Markdown table (the step's row carries the agreement)."""
    columns = ["model", "family", "shape", "written", "rows", "mode", "sampler", "status",
               "set-up s", "sampling s", "wall s", "min bulk ESS", "ESS/s", "R-hat max",
               "ESS/s ratio", "max \\|Δmean\\|/MCSE", "max \\|sd ratio − 1\\|", "pass"]
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    for r in records:
        if r.get("status") != "ok":
            msg = (r.get("message") or " ").splitlines()[0][:120].replace("|", "\\|")
            lines.append(f"| {r['model']} | {r.get('family', '')} | {r.get('shape', '')} | "
                         f"{r.get('written', '')} | {r.get('rows', '')} | {r['mode']} | "
                         f"{r['sampler']} | {r['status']}: {r.get('error', '')} {msg} |"
                         + " |" * 10)
            continue
        lines.append(
            f"| {r['model']} | {r['family']} | {r['shape']} | {r['written']} | "
            f"{r['rows']:,} | {r['mode']} | {r['sampler']} | ok | "
            f"{fmt(r['model_s'] + r['setup_s'])} | {fmt(r['sampling_s'])} | "
            f"{fmt(r['wall_s'])} | {fmt(r['min_ess_bulk'], '.0f')} | "
            f"{fmt(r['ess_per_s'], '.2f')} | {fmt(r['rhat_max'], '.3f')} | "
            f"{fmt(r.get('ess_per_s_ratio'), '.2f')} | {fmt(r.get('z_max'), '.2f')} | "
            f"{fmt(r.get('sd_ratio_max'), '.3f')} | {fmt(r.get('passed'))} |")
    return "\n".join(lines)


def load_results(files: list[Path]) -> list[dict]:
    """The results files' contents (header and records), in order."""
    return [json.loads(Path(file).read_text()) for file in files]


def by_model(records: list[dict]) -> dict[str, dict[tuple[str, str], dict]]:
    """Records by model, each keyed by ``(mode, role)``, role ``"package"`` or
    ``"reference"`` (nutpie, or PyMC's NUTS where nutpie could not run)."""
    grouped: dict[str, dict[tuple[str, str], dict]] = {}
    for r in records:
        role = "package" if r.get("sampler", "").startswith("package") else "reference"
        grouped.setdefault(r["model"], {})[(r["mode"], role)] = r
    return grouped


def summary(files: list[Path]) -> str:
    """One row per model and PyMC line (:func:`by_line`): the cold and warm ratios side by
    side.

    "×" is the package's ESS/s over the reference's in the same run (set-up included);
    "set-up s" the package's set-up against nutpie's compilation, in the cold run.
    """
    lines = ["| model | rows | PyMC | × nutpie, cold | × nutpie, warm | set-up s, cold "
             "(package / nutpie) | R-hat (package / reference) | \\|Δmean\\|/MCSE | "
             "\\|sd ratio − 1\\| | right |",
             "|" + " --- |" * 10]
    for data in by_line(files):
        pymc_version = data["machine"].get("pymc")
        for name, by in by_model(data["records"]).items():
            cold, warm = by.get(("cold", "package")), by.get(("warm", "package"))
            ref_cold = by.get(("cold", "reference"))
            ref = by.get(("warm", "reference"), ref_cold)
            last = warm or cold
            if last is None or last.get("status") != "ok":
                status = (last or {}).get("status", "missing")
                msg = ((last or {}).get("message") or "").splitlines()[0][:80] if last else ""
                lines.append(f"| {name} | {(last or {}).get('rows', '')} | {pymc_version} | "
                             f"{status}: {msg} |" + " |" * 6)
                continue
            setup = (f"{fmt(cold['model_s'] + cold['setup_s'])} / "
                     f"{fmt(ref_cold['setup_s'])}" if cold and ref_cold and
                     cold.get("status") == "ok" else "–")
            rhat_ref = fmt(ref.get("rhat_max"), ".3f") if ref else "–"
            lines.append(
                f"| {name} | {last['rows']:,} | {pymc_version} | "
                f"{fmt((cold or {}).get('ess_per_s_ratio'))} | "
                f"{fmt((warm or {}).get('ess_per_s_ratio'))} | {setup} | "
                f"{fmt(last['rhat_max'], '.3f')} / {rhat_ref} | "
                f"{fmt(last.get('z_max'), '.1f')} | {fmt(last.get('sd_ratio_max'), '.3f')} | "
                f"{fmt(last.get('passed'))} |")
    return "\n".join(lines)


def by_line(files: list[Path]) -> list[dict]:
    """The results files merged per PyMC version, in order of first appearance.

    Files of the same PyMC line make one run: a model's records in a later file replace
    those of an earlier one (a model run again at a later commit). Each merged run keeps
    the first file's ``machine``.
    """
    merged: dict[str, dict] = {}
    for data in load_results(files):
        line = merged.setdefault(str(data["machine"].get("pymc")),
                                 {"machine": data["machine"], "records": []})
        again = {r["model"] for r in data["records"]}
        line["records"] = [r for r in line["records"] if r["model"] not in again]
        line["records"] += data["records"]
    return list(merged.values())


def side_by_side(files: list[Path]) -> str:
    """One row per model: × nutpie cold and warm, and the agreement, per PyMC line
    (:func:`by_line`)."""
    runs = by_line(files)
    heads = [f"PyMC {data['machine'].get('pymc')}" for data in runs]
    lines = ["| model | family, shape | rows | " + " | ".join(
        f"× cold / warm, {head} | right" for head in heads) + " |",
        "|" + " --- |" * (3 + 2 * len(runs))]
    grouped = [by_model(data["records"]) for data in runs]
    names = dict.fromkeys(name for by in grouped for name in by)
    for name in names:
        first = next(r for by in grouped for (_, role), r in by.get(name, {}).items()
                     if role == "package")
        cells = []
        for by in grouped:
            runs_of = by.get(name, {})
            cold = runs_of.get(("cold", "package"), {})
            warm = runs_of.get(("warm", "package"), {})
            last = warm or cold
            if not last:
                cells += ["not run", "–"]
            elif last.get("status") != "ok":
                cells += [last.get("status", ""), "–"]
            else:
                cells += [f"{fmt(cold.get('ess_per_s_ratio'))} / "
                          f"{fmt(warm.get('ess_per_s_ratio'))}", fmt(last.get("passed"))]
        rows = first.get("rows")
        lines.append(f"| {name} | {first.get('family', '')}, {first.get('shape', '')} | "
                     f"{rows:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(files: list[Path], path: Path) -> None:
    """× nutpie (ESS/s, set-up included) per model, cold and warm, one colour per PyMC
    line (:func:`by_line`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = by_line(files)
    names = list(dict.fromkeys(r["model"] for data in runs for r in data["records"]))
    fig, ax = plt.subplots(figsize=(10, 5.2))
    markers = {"cold": "o", "warm": "^"}
    offsets = np.linspace(-0.15, 0.15, max(len(runs), 1))
    for data, colour, offset in zip(runs, plt.cm.tab10.colors, offsets, strict=False):
        machine_ = data["machine"]
        for r in data["records"]:
            ratio = r.get("ess_per_s_ratio")
            if ratio is None or r.get("mode") not in markers:
                continue
            ax.scatter(names.index(r["model"]) + offset, ratio, marker=markers[r["mode"]],
                       s=50, color=colour, alpha=0.9,
                       facecolors=colour if r.get("passed") else "none")
        ax.scatter([], [], marker="s", color=colour,
                   label=f"PyMC {machine_.get('pymc')}, nutpie {machine_.get('nutpie')}")
    for mode, marker in markers.items():
        ax.scatter([], [], marker=marker, color="grey", label=f"{mode} caches")
    ax.scatter([], [], marker="o", facecolors="none", color="grey",
               label="hollow: R-hat, means or sds off")
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.axhline(5.0, color="grey", lw=0.8, ls="--")
    ax.set_yscale("log")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("ESS per second / nutpie's (set-up included)")
    ax.set_title("The default MinibatchBarker() against nutpie on the real-data zoo")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    import real_zoo

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(real_zoo.MODELS),
                   help="comma-separated catalogue names (default: all)")
    p.add_argument("--skip-nutpie", action="store_true", help="run the step only")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--cold", dest="mode", action="store_const", const="cold")
    mode.add_argument("--warm", dest="mode", action="store_const", const="warm")
    mode.add_argument("--both", dest="mode", action="store_const", const="both")
    p.set_defaults(mode="warm")
    p.add_argument("--draws", type=int, default=1000)
    p.add_argument("--tune", type=int, default=1000)
    p.add_argument("--reference-draws", type=int, default=None,
                   help="nutpie's draws (default: --draws), for a converged reference "
                   "where nutpie mixes slowly")
    p.add_argument("--reference-tune", type=int, default=None,
                   help="nutpie's tuning (default: --tune)")
    p.add_argument("--rows", type=int, default=None,
                   help="subsample each data set to this many rows (default: all)")
    p.add_argument("--seed", type=int, default=real_zoo.DEFAULT_SEED)
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--report", type=Path, nargs="+", default=None, metavar="JSON",
                   help="run nothing: print the summary table of earlier results files")
    p.add_argument("--plot", type=Path, default=None,
                   help="with --report: write the figure of the ratios, model by model")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", dest="mode", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    unknown = [m for m in args.models.split(",") if m not in real_zoo.MODELS]
    if unknown:
        p.error(f"unknown models {unknown}; the catalogue has: {', '.join(real_zoo.MODELS)}")
    return args


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    sys.path.insert(0, str(HERE))
    args = parse_args(argv)
    if args.report:
        print(summary(args.report))
        if len(args.report) > 1:
            print()
            print(side_by_side(args.report))
        if args.plot is not None:
            plot(args.report, args.plot)
        return
    if args.child:
        args.out.write_text(json.dumps(run_child(args), default=float))
        return
    records: list[dict] = []
    header = machine(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for name in args.models.split(","):
        records += run_model(args, name)
        print(table([r for r in records if r["model"] == name]), flush=True)
        # Written after every model, so that a long run's finished models are kept.
        args.out.write_text(json.dumps({"machine": header, "records": records},
                                       indent=1, default=float))
    print()
    print(table(records))
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
