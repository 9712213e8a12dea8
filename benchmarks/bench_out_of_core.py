"""Benchmark: data bigger than memory, against targets for memory, passes and step time.

Two parts, each configuration in a fresh process (so that its peak memory is its own):

``large``: N = 10⁸ rows, d = 10 (logistic regression, float64: 8 GB), written chunk by
chunk to a ``.npy`` file and to Zarr, sampled with ``MinibatchBarker(control_variate=
"taylor")`` from each; the same model at N = 10⁶ in memory for the per-step time. Prints
the peak resident memory (``VmHWM`` from the step's construction on), the set-up time and
passes over the data (local copy, MAP search and sums, start-point check), and the time
per step after the set-up. Targets: peak ≤ 2 GiB, ≤ 10 passes, per-step time within 1.5 ×
of the in-memory N = 10⁶ step.

``agree``: N = 10⁷, d = 10, the same data in memory, in a ``.npy`` file, in Zarr, in
Parquet and in Dask (from the Zarr arrays, persisted on a ``LocalCluster`` of 2 workers),
each sampled with another seed; posterior means within 3 combined MCSE and sds within 5 %
of the in-memory sampler's.

    python benchmarks/bench_out_of_core.py                  # both parts, full sizes
    python benchmarks/bench_out_of_core.py --quick          # small sizes, a minute
    python benchmarks/bench_out_of_core.py --parts agree --agree-n 10000000

Disk: ``--dir`` (default: a temporary directory, removed at the end); the large part needs
about 24 GB there and in ``TMPDIR`` (the .npy file, the Zarr arrays and the step's local
copy of them).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

D = 10
SEED = 20261123


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (about a minute)")
    parser.add_argument("--parts", default="agree,large")
    parser.add_argument("--large-n", type=float, default=1e8)
    parser.add_argument("--memory-n", type=float, default=1e6)
    parser.add_argument("--agree-n", type=float, default=1e7)
    parser.add_argument("--agree-draws", type=int, default=300_000)
    parser.add_argument("--timed-steps", type=int, default=3000)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--kinds", default=None,
                        help="stores to run, e.g. npy,npy-shuffled (default: all of a part)")
    parser.add_argument("--reuse-data", action="store_true",
                        help="large part: use the files a previous run left in --dir")
    args = parser.parse_args(argv)
    if args.quick:
        args.large_n, args.memory_n, args.agree_n = 2e5, 2e4, 5e4
        args.agree_draws, args.timed_steps = 30_000, 1000
    args.kinds = args.kinds.split(",") if args.kinds else None
    for name in ("large_n", "memory_n", "agree_n"):
        setattr(args, name, int(getattr(args, name)))
    return args


# ----------------------------------------------------------------------------- data
def chunks_of_data(n, chunk=1_000_000, seed=SEED):
    """(start, X, y) chunks of the logistic regression (an intercept, d − 1 normals)."""
    from scipy.special import expit

    rng = np.random.default_rng(seed)
    beta = rng.normal(0.0, 0.5, size=D)
    for start in range(0, n, chunk):
        rows = min(chunk, n - start)
        x = np.column_stack([np.ones(rows), rng.normal(size=(rows, D - 1))])
        yield start, x, (rng.random(rows) < expit(x @ beta)).astype(np.float64)


def write_data(folder, n, kinds):
    """Write the data chunk by chunk as .npy files, Zarr arrays and a Parquet file."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    if "npy" in kinds:
        files["npy"] = (np.lib.format.open_memmap(folder / "X.npy", "w+", np.float64, (n, D)),
                        np.lib.format.open_memmap(folder / "y.npy", "w+", np.float64, (n,)))
    if "zarr" in kinds:
        import zarr

        chunk = min(n, 1_000_000)
        files["zarr"] = (
            zarr.create_array(str(folder / "X.zarr"), shape=(n, D), chunks=(chunk, D),
                              dtype="float64", overwrite=True),
            zarr.create_array(str(folder / "y.zarr"), shape=(n,), chunks=(chunk,),
                              dtype="float64", overwrite=True),
        )
    writer = None
    if "parquet" in kinds:
        import pyarrow as pa
        import pyarrow.parquet as pq
    for start, x, y in chunks_of_data(n):
        stop = start + x.shape[0]
        for xs, ys in files.values():
            xs[start:stop] = x
            ys[start:stop] = y
            if hasattr(xs, "flush"):
                xs.flush()
                ys.flush()
        if "parquet" in kinds:
            table = pa.table({**{f"x{j}": x[:, j] for j in range(D)}, "y": y})
            if writer is None:
                writer = pq.ParquetWriter(folder / "data.parquet", table.schema)
            writer.write_table(table, row_group_size=250_000)
    if writer is not None:
        writer.close()
    files.clear()


def store_data(kind, folder):
    """The data= mapping of one store kind (``-shuffled``: the same, read from a shuffled copy)."""
    kind = kind.removesuffix("-shuffled")
    if kind == "npy":
        return {"X": str(folder / "X.npy"), "y": str(folder / "y.npy")}
    if kind == "zarr":
        import zarr

        return {"X": zarr.open_array(str(folder / "X.zarr"), mode="r"),
                "y": zarr.open_array(str(folder / "y.zarr"), mode="r")}
    if kind == "parquet":
        from pymc_minibatch_mh.store.sources import ParquetColumn

        path = folder / "data.parquet"
        return {"X": ParquetColumn(path, [f"x{j}" for j in range(D)]),
                "y": ParquetColumn(path, "y")}
    if kind == "dask":
        import dask.array as da

        return {"X": da.from_zarr(str(folder / "X.zarr")).persist(),
                "y": da.from_zarr(str(folder / "y.zarr")).persist()}
    raise ValueError(kind)


# ----------------------------------------------------------------------------- one run
def peak_rss():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


def run_one(kind, folder, n, seed, draws, tune, timed_steps, out):
    """Build the step on one store, sample, time steps; put a result dict on ``out``."""
    import warnings

    warnings.simplefilter("ignore")
    import pymc as pm
    import pytensor.tensor as pt

    from pymc_minibatch_mh import MinibatchBarker
    from pymc_minibatch_mh.model.compat import posterior

    cluster = client = None
    if kind == "dask":
        from distributed import Client, LocalCluster

        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                               dashboard_address=None)
        client = Client(cluster)
    if kind == "memory":
        x, y = (np.concatenate(parts) for parts in zip(*[(c[1], c[2]) for c in
                                                          chunks_of_data(n)], strict=True))
        data, x_slice, y_slice = None, x, y
    else:
        data = store_data(kind, folder)
        x_slice, y_slice = (np.asarray(data["X"][:1000]), np.asarray(data["y"][:1000])) if (
            kind.startswith(("zarr", "dask"))) else (None, None)
        if x_slice is None:
            first = next(chunks_of_data(1000))
            x_slice, y_slice = first[1], first[2]
    Path("/proc/self/clear_refs").write_text("5")  # the peak from here on
    base = peak_rss()
    with pm.Model():
        xd = pm.Data("X", x_slice)
        yd = pm.Data("y", y_slice)
        b = pm.Normal("b", 0.0, 5.0, shape=D)
        pm.Bernoulli("obs", logit_p=pt.dot(xd, b), observed=yd)
        started = time.perf_counter()
        step = MinibatchBarker(batch_size=100, control_variate="taylor", S="laplace",
                               scaling=2.38 / math.sqrt(D), tune=False, data=data,
                               shuffled_copy=kind.endswith("-shuffled"))
        setup = time.perf_counter() - started
        started = time.perf_counter()
        # The chain starts at θ̂: PyMC's initial point (b = 0) is thousands of posterior
        # sds away at this N, where a random walk of posterior-sized steps would not
        # arrive (and every step would need most of the rows).
        idata = pm.sample(draws=draws, tune=tune, step=step, chains=1, random_seed=seed,
                          initvals=step.control_variate.reference_point(),
                          progressbar=False, compute_convergence_checks=False)
        sampling = time.perf_counter() - started
        point = {"b": np.asarray(posterior(idata)["b"])[0, -1]}
        for _ in range(200):  # warm
            point, _ = step.step(point)
        started = time.perf_counter()
        for _ in range(timed_steps):
            point, _ = step.step(point)
        per_step = (time.perf_counter() - started) / timed_steps
    # A local copy reads the data once; a shuffled copy reads the source and then the copy.
    copy = 2 if kind.endswith("-shuffled") else 1 if kind in ("zarr", "parquet") else 0
    out.put({
        "kind": kind, "n": n, "setup_seconds": setup, "sampling_seconds": sampling,
        # local copy + MAP search and sums + the start-point check of the chain
        "passes": copy + step.setup_passes + 1,
        "per_step_us": 1e6 * per_step,
        "peak_gib": peak_rss() / 2**30, "base_gib": base / 2**30,
        "draws": np.asarray(posterior(idata)["b"])[0],
    })
    if client is not None:
        step.likelihood.store.close()
        client.close()
        cluster.close()


def in_process(kind, folder, n, seed, draws, tune, timed_steps):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=run_one,
                       args=(kind, folder, n, seed, draws, tune, timed_steps, out))
    proc.start()
    result = out.get()
    proc.join()
    return result


# ----------------------------------------------------------------------------- parts
def part_large(args, folder):
    print(f"\n## N = {args.large_n:,}, d = {D} from disk vs N = {args.memory_n:,} in memory\n")
    started = time.perf_counter()
    if not (args.reuse_data and (folder / "X.npy").exists()):
        write_data(folder, args.large_n, ("npy", "zarr"))
        print(f"(data written in {time.perf_counter() - started:.0f} s)\n")
    memory = in_process("memory", folder, args.memory_n, 1, 500, 200, args.timed_steps)
    rows = [memory]
    for kind in args.kinds or ("npy", "npy-shuffled", "zarr", "zarr-shuffled"):
        rows.append(in_process(kind, folder, args.large_n, 1, 500, 200, args.timed_steps))
    print("| store | N | peak RSS (GiB) | set-up (s) | passes | µs per step | vs in memory |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['kind']} | {r['n']:,} | {r['peak_gib']:.2f} | {r['setup_seconds']:.0f} | "
              f"{r['passes']:.1f} | {r['per_step_us']:.0f} | "
              f"{r['per_step_us'] / memory['per_step_us']:.2f} × |")
    print("\nTargets: peak ≤ 2 GiB, passes ≤ 10, per-step time ≤ 1.5 × the in-memory step.")


def part_agree(args, folder):
    from pymc_minibatch_mh.model.compat import mcse

    print(f"\n## N = {args.agree_n:,}, d = {D}: every store against the in-memory sampler "
          f"({args.agree_draws:,} draws each, other seeds)\n")
    write_data(folder, args.agree_n, ("npy", "zarr", "parquet"))
    results = {}
    kinds = args.kinds or ("npy", "npy-shuffled", "zarr", "parquet", "dask")
    for seed, kind in enumerate(("memory", *kinds), start=11):
        results[kind] = in_process(kind, folder, args.agree_n, seed, args.agree_draws, 2000,
                                   200)
    ref = results["memory"]["draws"]
    print("| store | largest |Δ mean| / combined MCSE | largest |sd ratio − 1| | set-up (s) "
          "| peak RSS (GiB) | agrees |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for kind, r in results.items():
        a = r["draws"]
        z = max(abs(a[:, j].mean() - ref[:, j].mean())
                / math.hypot(mcse(a[:, j]), mcse(ref[:, j])) for j in range(D))
        sd = max(abs(a[:, j].std() / ref[:, j].std() - 1) for j in range(D))
        ok = "reference" if kind == "memory" else ("yes" if z < 3 and sd < 0.05 else "NO")
        print(f"| {kind} | {z:.2f} | {100 * sd:.1f} % | {r['setup_seconds']:.0f} | "
              f"{r['peak_gib']:.2f} | {ok} |")


def main(argv=None):
    args = parse_args(argv)
    root = args.dir or Path(tempfile.mkdtemp(prefix="bench_out_of_core_"))
    print(f"python {sys.version.split()[0]}; data in {root}")
    try:
        parts = args.parts.split(",")
        if "agree" in parts:
            part_agree(args, root / "agree")
            shutil.rmtree(root / "agree", ignore_errors=True)
        if "large" in parts:
            part_large(args, root / "large")
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
