"""Benchmark: rows per step and audited error of MinibatchBarker for each shipped σ.

Rows per step relative to σ = 1 could be computed as ``1/σ²`` (the test stops once s² < σ²,
and s² falls like 1/b). This measures them instead, with the error that each σ's steps
actually make, on the Gaussian mixture of Seita et al. (2017, section 6.1: N = 10⁶,
temperature 10,000, random-walk sd 0.15, first minibatch 50, no tuning), the same proposals
for every σ (same seed, same chains):

- ``rows per step``: the mean ``batch_size`` over all steps and chains, and its ratio to
  σ = 1's (the computed ``1/σ²`` beside it);
- the exact audit (``audit_every``): the mean signed error of the acceptance probability
  (``error_mean``, an unbiased estimate of the test's bias) and ``aligned_error_mean``
  (a lower bound of the mean absolute bias), with 95 % intervals, and the mean
  ``error_estimate``; the correction table's own L∞ error.

Rows are compared at equal audited error where the error intervals of two σ overlap; the
table says which do not.

Run: ``python benchmarks/bench_sigma.py [--draws 3000] [--chains 4] [--audit-every 4]``
(about 10 minutes with the defaults on two cores).
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import pandas as pd
import pymc as pm

from pymc_minibatch_mh import MinibatchBarker, audit_summary
from pymc_minibatch_mh.core.correction import get_correction, shipped_sigmas
from pymc_minibatch_mh.datasets import gaussian_mixture_data, gaussian_mixture_model
from pymc_minibatch_mh.model.compat import sample_stats


def run_sigma(model: pm.Model, sigma: float, args: argparse.Namespace) -> dict[str, float]:
    """One σ: ``chains`` chains of ``draws`` steps with the audit; the table's row."""
    with model:
        step = MinibatchBarker(control_variate=None,
                               batch_size=50, sigma=sigma, temperature=1e4, S=[0.15, 0.15],
                               tune=False, audit_every=args.audit_every)
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            idata = pm.sample(draws=args.draws, tune=0, step=step, chains=args.chains,
                              cores=1, random_seed=args.seed, progressbar=False,
                              compute_convergence_checks=False)
        seconds = time.perf_counter() - start
    stats = sample_stats(idata)
    audit = audit_summary(idata).loc["all"]
    return {
        "sigma": sigma,
        "rows per step": float(np.asarray(stats["batch_size"]).mean()),
        "table error": get_correction(sigma).error,
        "audited": int(audit["audited"]),
        "error_mean": audit["error_mean"],
        "error_low": audit["error_low"],
        "error_high": audit["error_high"],
        "aligned": audit["aligned_error_mean"],
        "aligned_low": audit["aligned_error_low"],
        "aligned_high": audit["aligned_error_high"],
        "error_estimate": audit["error_estimate_mean"],
        "accept": float(np.asarray(stats["accepted"]).mean()),
        "seconds": seconds,
    }


def main(argv: list[str] | None = None) -> pd.DataFrame:
    """Run every shipped σ and print the table (markdown)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--draws", type=int, default=3000)
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--audit-every", type=int, default=4)
    parser.add_argument("--seed", type=int, default=2017)
    parser.add_argument("--sigmas", default=",".join(str(s) for s in shipped_sigmas()))
    args = parser.parse_args(argv)
    model = gaussian_mixture_model(gaussian_mixture_data(args.n, seed=0))
    rows = [run_sigma(model, float(s), args) for s in args.sigmas.split(",")]
    table = pd.DataFrame(rows).set_index("sigma")
    base = table.loc[1.0, "rows per step"] if 1.0 in table.index else np.nan
    table["rows vs sigma=1"] = table["rows per step"] / base
    table["computed 1/sigma^2"] = 1.0 / table.index.to_numpy() ** 2

    def interval(mean: str, low: str, high: str) -> pd.Series:
        return table.apply(
            lambda r: f"{r[mean]:+.1e} [{r[low]:+.1e}, {r[high]:+.1e}]", axis=1
        )

    show = pd.DataFrame({
        "rows per step": table["rows per step"].map("{:.1f}".format),
        "rows vs σ=1 (measured)": table["rows vs sigma=1"].map("{:.2f}".format),
        "1/σ² (computed)": table["computed 1/sigma^2"].map("{:.2f}".format),
        "audited bias [95 %]": interval("error_mean", "error_low", "error_high"),
        "aligned bias [95 %]": interval("aligned", "aligned_low", "aligned_high"),
        "mean error_estimate": table["error_estimate"].map("{:.1e}".format),
        "table L∞ error": table["table error"].map("{:.1e}".format),
        "audited steps": table["audited"],
        "acceptance": table["accept"].map("{:.3f}".format),
        "seconds": table["seconds"].map("{:.0f}".format),
    })
    print(f"Gaussian mixture, N = {args.n:,}, K = 10,000, {args.chains} chains × "
          f"{args.draws} steps per σ, audit every {args.audit_every} steps, seed {args.seed}")
    print(show.to_string())
    return table


if __name__ == "__main__":
    main()
