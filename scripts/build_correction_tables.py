"""Rebuild the shipped correction tables ``pymc_minibatch_mh/core/tables/*.npz``.

Usage::

    python scripts/build_correction_tables.py                 # default sigmas, write tables
    python scripts/build_correction_tables.py --sigmas 1.0 1.1 --out /tmp/tables
    python scripts/build_correction_tables.py --check         # rebuild, compare, write nothing

Each table is the LP solution of ``CorrectionDistribution.build(sigma, method="lp")`` with
default options; the build is deterministic and ``save`` writes byte-reproducible files. A
Markdown table of sigma, method, number of atoms, LP bound and verified L-inf error is
printed (with the paper's ridge+clip result at n = 2000, V = 20, lambda = 10 for comparison
when ``--ridge`` is given).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pymc_minibatch_mh.core.correction import (  # noqa: E402
    CorrectionDistribution,
    ridge_correction,
    table_path,
)

DEFAULT_SIGMAS = (0.8, 0.9, 1.0, 1.1, 1.2, 1.5)
TABLES_DIR = ROOT / "pymc_minibatch_mh" / "core" / "tables"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sigmas", type=float, nargs="+", default=list(DEFAULT_SIGMAS))
    parser.add_argument("--out", type=Path, default=TABLES_DIR)
    parser.add_argument(
        "--check", action="store_true", help="compare with the existing files instead of writing"
    )
    parser.add_argument(
        "--ridge",
        action="store_true",
        help="also report the paper's ridge+clip error (n=2000, V=20, lam=10)",
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    header = "| sigma | method | atoms | LP bound | verified L-inf error | size (KB) | seconds |"
    if args.ridge:
        header += " ridge+clip (paper) |"
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    mismatches = 0
    for sigma in args.sigmas:
        started = time.perf_counter()
        dist = CorrectionDistribution.build(sigma, method="lp")
        seconds = time.perf_counter() - started
        path = table_path(sigma, args.out)
        if args.check:
            old = CorrectionDistribution.load(path)
            same = (
                np.array_equal(old.support, dist.support)
                and np.array_equal(old.weights, dist.weights)
                and old.error == dist.error
            )
            if not same:
                mismatches += 1
                print(
                    f"<!-- {path.name}: rebuilt table differs (error {old.error:.3e} -> "
                    f"{dist.error:.3e}) -->"
                )
            size = path.stat().st_size / 1024
        else:
            dist.save(path)
            size = path.stat().st_size / 1024
        row = (
            f"| {sigma:g} | {dist.method} | {dist.support.size} | "
            f"{dist.info['lp_bound']:.2e} | {dist.error:.2e} | {size:.1f} | {seconds:.1f} |"
        )
        if args.ridge:
            _, _, ridge_err = ridge_correction(sigma, n=2000, V=20.0, lam=10.0)
            row += f" {ridge_err:.2e} |"
        print(row, flush=True)
    return 1 if mismatches else 0


if __name__ == "__main__":
    raise SystemExit(main())
