"""Logistic regression on data bigger than memory: 10⁸ rows in Zarr, sampled with control variates.

Writes a synthetic logistic regression (an intercept and ``d − 1`` standard-normal
features, true coefficients drawn from N(0, 0.5²)) to two Zarr arrays ``X`` and ``y`` in
``--dir`` (a temporary directory by default, removed at the end), chunk by chunk so that
the data never exist in memory, then builds the model on the first 1,000 rows (for
shapes) and samples it with ``MinibatchBarker(control_variate="taylor", data={"X": X,
"y": y})``. The step copies the Zarr arrays once to uncompressed ``.npy`` files in
``TMPDIR`` (per-step rows are then read from the page cache), finds the MAP and the
control variates' sums in streamed passes, and samples.

Prints the peak resident memory of the set-up and sampling (``VmHWM``, reset after the
data were written; ``ru_maxrss`` where it cannot be reset), the set-up time and passes over
the data, the time per step and the ESS per second. The defaults are the paper-sized run:
``--n 100000000 --d 10`` needs about 16 GB of disk (Zarr data plus the local copy) and
several minutes; ``--n 20000`` runs in seconds.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pymc as pm
import pytensor.tensor as pt
from scipy.special import expit

from pymc_minibatch_mh import MinibatchBarker, posterior, sample_stats


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000_000)
    parser.add_argument("--d", type=int, default=10)
    parser.add_argument("--chunk", type=int, default=1_000_000, help="rows per Zarr chunk")
    parser.add_argument("--draws", type=int, default=5000)
    parser.add_argument("--tune", type=int, default=500, help="tuning draws (discarded)")
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--dir", type=Path, default=None,
                        help="where the Zarr data go (default: a temporary directory, removed)")
    return parser.parse_args(argv)


def peak_rss_bytes() -> int:
    """Peak resident memory of this process since the last :func:`reset_peak_rss`."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def reset_peak_rss() -> bool:
    """Reset the peak (Linux: write 5 to /proc/self/clear_refs); False if not possible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def write_zarr(folder: Path, n: int, d: int, chunk: int, seed: int) -> tuple[object, object]:
    """The data, written chunk by chunk (one chunk in memory at a time)."""
    import zarr

    rng = np.random.default_rng(seed)
    beta = rng.normal(0.0, 0.5, size=d)
    x = zarr.create_array(str(folder / "X.zarr"), shape=(n, d), chunks=(chunk, d),
                          dtype="float64", overwrite=True)
    y = zarr.create_array(str(folder / "y.zarr"), shape=(n,), chunks=(chunk,),
                          dtype="float64", overwrite=True)
    for start in range(0, n, chunk):
        rows = min(chunk, n - start)
        xc = np.column_stack([np.ones(rows), rng.normal(size=(rows, d - 1))])
        x[start : start + rows] = xc
        y[start : start + rows] = (rng.random(rows) < expit(xc @ beta)).astype(np.float64)
    return x, y


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    n, d = args.n, args.d
    folder = args.dir or Path(tempfile.mkdtemp(prefix="out_of_core_zarr_"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        started = time.perf_counter()
        x, y = write_zarr(folder, n, d, min(args.chunk, n), args.seed)
        write_seconds = time.perf_counter() - started
        reset = reset_peak_rss()

        slice_rows = min(1000, n)
        with pm.Model():
            xd = pm.Data("X", x[:slice_rows])
            yd = pm.Data("y", y[:slice_rows])
            b = pm.Normal("b", 0.0, 5.0, shape=d)
            pm.Bernoulli("obs", logit_p=pt.dot(xd, b), observed=yd)
            started = time.perf_counter()
            # Zero-config: the proposal follows the Laplace fit of the control variates
            # (Crank-Nicolson, tuned), and each chain starts from a draw of that fit.
            step = MinibatchBarker(
                batch_size=args.batch_size, control_variate="taylor", data={"X": x, "y": y},
            )
            setup_seconds = time.perf_counter() - started
            started = time.perf_counter()
            idata = pm.sample(draws=args.draws, tune=args.tune, step=step, chains=1,
                              random_seed=args.seed, progressbar=False,
                              compute_convergence_checks=False)
            sample_seconds = time.perf_counter() - started
        peak = peak_rss_bytes()
    finally:
        if args.dir is None:
            shutil.rmtree(folder, ignore_errors=True)

    import arviz as az

    draws = np.asarray(posterior(idata)["b"])
    ess = min(float(np.asarray(az.ess(draws[..., j])).squeeze()) for j in range(d))
    stats = sample_stats(idata)
    per_draw = step.steps_per_draw  # transitions per draw (3 with the surrogate proposal)
    steps = (args.draws + args.tune) * per_draw
    result = {
        "n": n, "d": d,
        "write_seconds": write_seconds,
        "setup_seconds": setup_seconds,
        # The copy of the Zarr arrays to local .npy files is one more pass.
        "setup_passes": step.setup_passes + 1,
        "seconds_per_step": sample_seconds / steps,
        "ess_min": ess,
        "ess_per_second": ess / sample_seconds,
        "ess_per_second_with_setup": ess / (sample_seconds + setup_seconds),
        "mean_batch_size": float(np.asarray(stats["batch_size"]).mean()) / per_draw,
        "peak_rss_gib": peak / 2**30,
        "peak_since": "set-up" if reset else "process start",
        "posterior_mean": draws.reshape(-1, d).mean(axis=0),
    }
    print(f"Logistic regression from Zarr: N = {n:,}, d = {d}")
    print(f"  data written in {write_seconds:.1f} s (not part of the sampler)")
    print(f"  set-up: {setup_seconds:.1f} s, {result['setup_passes']:.1f} passes over the data "
          "(copy, MAP search, sums at the MAP)")
    print(f"  sampling: {1e6 * result['seconds_per_step']:.0f} µs per step, "
          f"{result['mean_batch_size']:.0f} rows per step")
    print(f"  ESS (smallest over the coefficients): {ess:.0f}; {result['ess_per_second']:.1f} "
          f"ESS/s sampling, {result['ess_per_second_with_setup']:.1f} ESS/s with the set-up")
    print(f"  peak resident memory since the {result['peak_since']}: "
          f"{result['peak_rss_gib']:.2f} GiB")
    return result


if __name__ == "__main__":
    main()
