"""Summaries of a trace's error stats: the exact audit against the reported estimates.

:func:`~pymc_minibatch_mh.audit_summary` reads the ``audited``, ``audit_disagree``, ``audit_error``,
``audit_kappa3`` and ``error_estimate`` stats of a run with ``audit_every`` set
(see :mod:`~pymc_minibatch_mh.transition.audit`) and returns, per chain and over all
chains, the audit's measurements with confidence intervals next to the mean of the
error estimates the steps reported.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import binomtest, norm

from pymc_minibatch_mh.model.compat import mcse, sample_stats

__all__ = ["audit_summary"]


def _mean_ci(values: np.ndarray, z: float) -> tuple[float, float, float]:
    """Mean of ``(chain, draw)`` values and a normal interval from ArviZ's MCSE."""
    values = values[:, ~np.isnan(values).any(axis=0)] if values.ndim == 2 else values
    if values.size == 0:
        return math.nan, math.nan, math.nan
    mean = float(values.mean())
    if values.shape[-1] < 4 or not np.ptp(values) > 0:
        se = 0.0 if values.shape[-1] >= 4 else math.nan
    else:
        se = mcse(values)
    return mean, mean - z * se, mean + z * se


def _row(stats: dict[str, np.ndarray], z: float, confidence: float) -> dict[str, float]:
    """One row of the summary from ``(chain, draw)`` arrays of the stats."""
    audited = stats["audited"].astype(bool)
    n_audited = int(audited.sum())
    row: dict[str, float] = {"steps": float(audited.size), "audited": float(n_audited)}
    # Audited steps, chain by chain (each chain of one row has the same count here).
    per_chain = [audited[c] for c in range(audited.shape[0])]
    count = min((int(a.sum()) for a in per_chain), default=0)

    def audited_values(name: str) -> np.ndarray:
        return np.stack([stats[name][c][a][:count] for c, a in enumerate(per_chain)])

    disagree = int(stats["audit_disagree"][audited].sum())
    if n_audited:
        ci = binomtest(disagree, n_audited).proportion_ci(confidence, method="wilson")
        row.update(disagree_rate=disagree / n_audited, disagree_low=ci.low, disagree_high=ci.high)
    else:
        row.update(disagree_rate=math.nan, disagree_low=math.nan, disagree_high=math.nan)
    error = audited_values("audit_error").astype(float)
    kappa3 = audited_values("audit_kappa3").astype(float)
    for name, values in (
        ("error", error),
        ("abs_error", np.abs(error)),
        ("aligned_error", -np.sign(np.nan_to_num(kappa3)) * error),
    ):
        row[f"{name}_mean"], row[f"{name}_low"], row[f"{name}_high"] = _mean_ci(values, z)
    estimate = stats["error_estimate"].astype(float)
    finite = np.isfinite(estimate)
    row["error_estimate_mean"] = float(estimate[finite].mean()) if finite.any() else math.nan
    if finite.all():
        row["error_estimate_low"], row["error_estimate_high"] = _mean_ci(estimate, z)[1:]
    else:
        row["error_estimate_low"] = row["error_estimate_high"] = math.nan
    if "epsilon" in stats:
        row["epsilon_mean"] = float(np.nanmean(stats["epsilon"]))
    return row


def audit_summary(result: Any, *, confidence: float = 0.95) -> pd.DataFrame:
    """Summarise the exact audit of a run, per chain and over all chains.

    Parameters
    ----------
    result : arviz.InferenceData or xarray.DataTree
        What ``pm.sample`` returned for a step method with ``audit_every`` set (PyMC 5 or
        6; read through :func:`~pymc_minibatch_mh.model.compat.sample_stats`).
    confidence : float
        Level of the confidence intervals.

    Returns
    -------
    pandas.DataFrame
        One row per chain and a row ``"all"``, with columns:

        - ``steps``, ``audited``: steps in the trace and audited steps;
        - ``disagree_rate`` (``_low``, ``_high``): the share of audited steps whose exact
          decision differed, with a Wilson interval (``scipy.stats.binomtest``). For
          AustereMH and MHSubLhd it is the rate of wrong decisions; for the minibatch
          Barker test it estimates ``E|p − g(Δ)|``, an upper bound of the bias;
        - ``error_mean`` (``_low``, ``_high``): the mean signed error of the acceptance
          probability (``audit_error``), an unbiased estimate of the test's bias
          ``P_mb(accept) − P_exact(accept)`` over the chain's proposals, with an interval
          from ArviZ's MCSE;
        - ``abs_error_mean`` (``_low``, ``_high``): the mean of ``|audit_error|``;
        - ``aligned_error_mean`` (``_low``, ``_high``): the mean of ``audit_error`` times
          ``−sign(audit_kappa3)`` (minibatch Barker test): an unbiased estimate of
          ``E[−sign(κ₃) · bias] ≤ E|bias|``. With symmetric proposals the skewness of Δ*,
          and with it the bias, changes sign with the direction of the move, so
          ``error_mean`` cancels out; a sign that depends on the proposal only (here
          the direction in which the growth rule biases Δ*, see
          :func:`~pymc_minibatch_mh.core.acceptance_error.barker_error_estimate`)
          gives a lower bound of the mean absolute bias that does not;
        - ``error_estimate_mean`` (``_low``, ``_high``): the mean of the steps' reported
          ``error_estimate`` (over all steps; NaN values left out);
        - ``epsilon_mean``: the mean of ``epsilon`` (minibatch Barker test).

    Raises
    ------
    ValueError
        If the trace has no audit stats (the step had no ``audit_every``) or the level is
        not in (0, 1).

    Notes
    -----
    The estimate is not optimistic when ``error_estimate_mean`` is at least the bias the
    audit measured: ``|error_mean|`` and ``aligned_error_mean`` (for the threshold tests,
    ``disagree_rate``), within their intervals.

    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}.")
    dataset = sample_stats(result)
    names = ("audited", "audit_disagree", "audit_error", "audit_kappa3", "error_estimate")
    missing = [name for name in names if name not in dataset]
    if missing:
        raise ValueError(
            f"The trace has no audit stats ({missing} missing): sample with a step method "
            "built with audit_every=k."
        )
    stats = {name: np.asarray(dataset[name]) for name in (*names, "epsilon") if name in dataset}
    if not stats["audited"].any():
        raise ValueError(
            "No step of the trace was audited: audit_every is larger than the number of "
            "draws, or the step had no audit_every."
        )
    z = float(norm.ppf(0.5 + confidence / 2.0))
    chains = [int(c) for c in np.asarray(dataset["chain"])]
    rows = {c: _row({k: v[i : i + 1] for k, v in stats.items()}, z, confidence)
            for i, c in enumerate(chains)}
    rows["all"] = _row(stats, z, confidence)
    return pd.DataFrame.from_dict(rows, orient="index")
