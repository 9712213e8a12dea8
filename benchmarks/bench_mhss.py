"""Benchmark: MH-SS (``pymhss``) against this package's zero-config step, flat prior.

MH-SS is the exact subsampled Metropolis-Hastings of Prado, Nemeth and Sherlock
("Metropolis-Hastings with Scalable Subsampling", arXiv:2407.19602), as published on PyPI
as ``pymhss`` 0.1.5 (module ``PyMHSS``): a random-walk proposal ``N(θ, (κ²/d) V)``,
second-order Taylor control variates around θ̂, a first, delayed-acceptance stage on the
Taylor surrogate and a second stage on a Poisson-sized batch of rows drawn with
probability ∝ their bound ``c_i``. It is an optional peer: it needs TensorFlow (imported
by ``PyMHSS``), JAX and statsmodels (imported but not declared by ``pymhss``), e.g.::

    python3 -m venv .venv-mhss
    .venv-mhss/bin/pip install -e ".[bench,mhss]"
    PYTHONPATH=$PWD .venv-mhss/bin/python benchmarks/bench_mhss.py --quick

Models: logistic regression, an intercept and d − 1 standard-normal features, data from
``bench_tall_glm.make_data`` (same seeds). MH-SS's target has no prior term, so both sides
use a FLAT prior (``pm.Flat`` on the coefficients here).

Samplers, one after another, chains one after another:

- **MH-SS**: ``PyMHSS.MH_SS(y, x, V, θ̂, nburn, npost, model="logistic",
  implementation="vectorised", control_variates=True, taylor_order=2, chi=0,
  phi_function="min", kappa=--mhss-kappa)``. θ̂ is the full-data MLE from SciPy's L-BFGS
  (``--mhss-map scipy``, float64; as the HMCECS peer of ``bench_tall_glm.py``) or from
  pymhss's own float32 full-batch gradient descent (``--mhss-map sgd``,
  ``get_theta_hat_and_var_cov_matrix``); V = (Xᵀ W X)⁻¹ at θ̂, as pymhss computes it.
  ``MH_SS`` takes its ``x0`` argument as θ̂ and starts the chain at a draw from the
  proposal around it.
- **this package**: the zero-config step exactly as ``bench_tall_glm.make_package_step``
  builds it, sampled by ``bench_tall_glm.run_package`` (PyMC's ``pm.sample``, cores=1).

Rows (a row is one observation's log-likelihood evaluated at the current and the proposed
point, as this package's ``batch_size`` stat counts them):

- this package: ``batch_size`` + ``extra_evaluations`` over all iterations (tuning
  included); set-up rows = ``step.control_variate.setup_evaluations`` plus the error
  budget's pilot (``step.pilot_rows``)
  (``bench_tall_glm.run_package``).
- MH-SS: pymhss's per-row log-likelihood ``logistic_log_target_i`` is wrapped to count
  the rows it is called on. In the sampling loop it is called twice per iteration that
  passes the first (surrogate) stage, at θ and at θ′, on the same Poisson-sized batch
  (B rows, drawn with replacement), or on all N rows when the Poisson rate reaches N;
  rows = those evaluations / 2, burn-in included. Iterations rejected at the first stage
  cost no rows. Set-up rows = N per full-data pass: every MAP objective evaluation, the
  V pass, and per chain ``MH_SS``'s own passes (gradients at θ̂, Hessians at θ̂ and the
  per-row bounds ``c_i``).

Set-up time = the MAP and V, plus per chain the time ``MH_SS`` spends before its loop
(passes at θ̂, bounds, pre-drawing the weighted row indices); sampling time = its loop.

Memory quirk: pymhss's ``logistic_hessian_log_target_i`` materialises every row's d × d
Hessian (N·d²·8 bytes: 7 GB at N = 10⁶, d = 30; 80 GB at d = 100) only to sum them and
keep the per-row weights. This script replaces it (module attribute) by one returning the
same sum Xᵀ diag(−p(1−p)) X and the same weights without the N × d × d array; the
sampler's arithmetic is unchanged. pymhss's own ESS (statsmodels) at the end of
``MH_SS`` is skipped (ArviZ is used on both sides).

Time budget: ``--budget`` seconds per sampler and configuration (set-up included). MH-SS
runs up to ``--mhss-burn`` + ``--mhss-draws`` iterations per chain; its first chain stops
its loop when its share of the budget is spent (at least the burn-in + 200 draws) and the
other chains then run as many iterations. This package runs a
pilot (one chain, 100 + 100) to time its set-up and iterations, then PyMC's default
1000 + 1000 per chain, or fewer so that the run fits the budget (at least 100 + 100); its
set-up is the larger of the pilot's and the main run's (the pilot builds first, with
colder caches).

Printed and written to ``benchmarks/output/mhss.md``: per configuration and sampler, min
bulk and tail ESS (ArviZ, over the coefficients), max R-hat, iterations, set-up and
sampling seconds, bulk ESS per draw (per kept draw), ESS/s with set-up, rows per bulk
ESS (sampling only, and with the set-up), mean rows per iteration; and the agreement of
the two: the largest |mean difference| / combined MCSE, the largest |sd ratio − 1|
(package / MH-SS) and the largest |sd difference| / combined MCSE of the sd; and per
sampler the largest |sd / sd_Laplace − 1|, sd_Laplace from (Xᵀ W X)⁻¹ at the MLE (the
flat-prior posterior's Laplace approximation, relative error O(1/N), so a third opinion
on the sds). The numbers are also written to ``benchmarks/output/mhss.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import os
import sys
import time
import traceback
import warnings
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
import pymc as pm  # noqa: E402
import pytensor.tensor as pt  # noqa: E402
from bench_tall_glm import (  # noqa: E402
    Config,
    Result,
    agreement,
    design_dtype,
    ess_rhat,
    finish_args,
    fmt,
    make_data,
    run_package,
    scalars,
)
from scipy.optimize import minimize  # noqa: E402
from scipy.special import expit, log_expit  # noqa: E402

warnings.filterwarnings("ignore", category=DeprecationWarning)
warnings.filterwarnings("ignore", category=FutureWarning)
OUT = HERE / "output"
CHUNK = 1 << 20
DEFAULT_CONFIGS = [f"{n}:{d}" for n in ("1e5", "1e6", "1e7") for d in (10, 30, 100)]
QUICK_CONFIGS = ["1e4:5"]
SAMPLERS = ("mhss", "package")


def parse_config(text: str) -> Config:
    parts = text.strip().split(":")
    if parts[0] == "logistic":
        parts = parts[1:]
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"bad config {text!r}: use N:d (e.g. 1e5:10)")
    return Config("logistic", int(float(parts[0])), int(parts[1]))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default=None,
                   help="comma-separated N:d, e.g. 1e5:10,1e6:10 "
                        f"(default: {','.join(DEFAULT_CONFIGS)})")
    p.add_argument("--quick", action="store_true",
                   help=f"smoke run: {','.join(QUICK_CONFIGS)}, budget 30 s, short chains")
    p.add_argument("--budget", type=float, default=None,
                   help="seconds per sampler and configuration, set-up included "
                        "(default 300; --quick 30)")
    p.add_argument("--chains", type=int, default=2, help="run one after another")
    p.add_argument("--skip", default="", help=f"comma-separated subset of {SAMPLERS}")
    p.add_argument("--mhss-kappa", type=float, default=1.5,
                   help="MH-SS proposal scale κ (proposal N(θ, κ²/d V); pymhss's default 1.5)")
    p.add_argument("--mhss-burn", type=int, default=None,
                   help="MH-SS burn-in iterations per chain (default 5000; --quick 500)")
    p.add_argument("--mhss-draws", type=int, default=None,
                   help="MH-SS maximum kept iterations per chain; the budget may stop it "
                        "sooner (default 300000; --quick 5000)")
    p.add_argument("--mhss-map", choices=("scipy", "sgd"), default="scipy",
                   help="θ̂ for MH-SS: SciPy L-BFGS (float64) or pymhss's own float32 "
                        "gradient descent")
    p.add_argument("--package-draws", type=int, default=None,
                   help="draws per chain for this package (default 1000, or fewer to fit "
                        "the budget; --quick 300)")
    p.add_argument("--package-tune", type=int, default=None,
                   help="tuning iterations per chain for this package (default: as draws)")
    p.add_argument("--dtype", choices=("auto", "float64", "float32"), default="auto",
                   help="design-matrix dtype; auto: float32 above N·d = 5e8")
    p.add_argument("--seed", type=int, default=2017)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    finish_args(p, args, quick=QUICK_CONFIGS, default=DEFAULT_CONFIGS, parse=parse_config,
                samplers=SAMPLERS)
    if args.budget is None:
        args.budget = 30.0 if args.quick else 300.0
    if args.mhss_burn is None:
        args.mhss_burn = 500 if args.quick else 5000
    if args.mhss_draws is None:
        args.mhss_draws = 5000 if args.quick else 300_000
    return args


# --------------------------------------------------------------------------- models
def make_flat_model(cfg: Config, data) -> pm.Model:
    """Flat prior on every coefficient (MH-SS's target has no prior term)."""
    with pm.Model() as model:
        b = pm.Flat("b", shape=cfg.d)
        pm.Bernoulli("y", logit_p=pt.dot(data.x, b), observed=data.y)
    return model


def loglik_and_grad(beta, x, y):
    """Full-data logistic log-likelihood and gradient, float64, in chunks."""
    val, grad = 0.0, np.zeros_like(beta)
    for s in range(0, len(y), CHUNK):
        xc = np.asarray(x[s:s + CHUNK], dtype=np.float64)
        yc = y[s:s + CHUNK]
        eta = xc @ beta
        val += float(np.sum(yc * eta + log_expit(-eta)))
        grad += xc.T @ (yc - expit(eta))
    return val, grad


def fisher_information(beta, x):
    h = np.zeros((len(beta), len(beta)))
    for s in range(0, x.shape[0], CHUNK):
        xc = np.asarray(x[s:s + CHUNK], dtype=np.float64)
        p = expit(xc @ beta)
        h += xc.T @ (xc * (p * (1.0 - p))[:, None])
    return h


def laplace(cfg: Config, data):
    """θ̂ (SciPy L-BFGS, float64) and (Xᵀ W X)⁻¹ at θ̂: the Laplace approximation of the
    flat-prior posterior, a reference for the sds (its relative error is O(1/N))."""
    opt = minimize(lambda b: tuple(-v for v in loglik_and_grad(b, data.x, data.y)),
                   np.zeros(cfg.d), jac=True, method="L-BFGS-B",
                   options={"maxiter": 1000, "gtol": 1e-8, "ftol": 1e-15})
    return opt.x, np.linalg.inv(fisher_information(opt.x, data.x))


# --------------------------------------------------------------------------- MH-SS
_COUNT = {"loglik": 0, "setup": 0}
_LOOP = {}


class _SummedHessian:
    """Stands for pymhss's N × d × d array of per-row Hessians: ``np.sum(·, axis=0)``
    (the only use ``define_target_and_bounds`` makes of it) returns the precomputed sum."""

    def __init__(self, total):
        self.total = total

    def sum(self, axis=None, out=None, **_):
        if axis != 0:
            raise NotImplementedError("only the sum over rows is available")
        return self.total


def _timed_iterations(iterable, *_, **__):
    """Replaces pymhss's ``tqdm`` around the MH-SS loop: marks the loop's start (end of
    its set-up) and stops the loop at the chain's deadline."""
    _LOOP["start"] = time.perf_counter()
    _LOOP["rows_at_start"] = _COUNT["loglik"]
    _LOOP["iterations"] = 0
    minimum = _LOOP["minimum"]
    for i in iterable:
        if i >= minimum and time.perf_counter() > _LOOP["deadline"]:
            break
        _LOOP["iterations"] = i + 1
        yield i
    _LOOP["end"] = time.perf_counter()


def import_mhss():
    """Import ``PyMHSS`` and install the counting wrappers (once)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import PyMHSS.algorithms as alg

    if getattr(alg, "_bench_wrapped", False):
        return alg
    loglik, grad = alg.logistic_log_target_i, alg.logistic_grad_log_target_i
    norms = alg.L2_norm_matrix

    def counted_loglik(beta, y, x):
        _COUNT["loglik"] += len(y)
        return loglik(beta, y, x)

    def counted_grad(beta, x, y):
        _COUNT["setup"] += len(y)
        return grad(beta, x, y)

    def summed_hessian(beta, x, y):
        _COUNT["setup"] += len(y)
        aux = expit(x @ beta)
        aux *= 1.0 - aux
        total = np.zeros((x.shape[1], x.shape[1]))
        for s in range(0, x.shape[0], CHUNK):
            xc = x[s:s + CHUNK]
            total -= xc.T @ (xc * aux[s:s + CHUNK, None])
        return _SummedHessian(total), -aux

    def counted_norms(x):
        _COUNT["setup"] += x.shape[0]
        return norms(x)

    alg.logistic_log_target_i = counted_loglik
    alg.logistic_grad_log_target_i = counted_grad
    alg.logistic_hessian_log_target_i = summed_hessian
    alg.L2_norm_matrix = counted_norms
    alg.tqdm = _timed_iterations
    alg.effective_sample_size = lambda x: None
    alg._bench_wrapped = True
    return alg


def run_mhss(cfg: Config, data, args) -> Result:
    alg = import_mhss()
    x, y, n = data.x, data.y, cfg.n
    t0 = time.perf_counter()
    # ---- θ̂ and V (shared by the chains)
    if args.mhss_map == "scipy":
        nfev = 0

        def fun(beta):
            nonlocal nfev
            nfev += 1
            v, g = loglik_and_grad(beta, x, y)
            return -v, -g

        opt = minimize(fun, np.zeros(cfg.d), jac=True, method="L-BFGS-B",
                       options={"maxiter": 1000, "gtol": 1e-8, "ftol": 1e-15})
        theta_hat = opt.x
        V = np.linalg.inv(fisher_information(theta_hat, x))
        map_rows = float(n) * (nfev + 1)
        map_note = f"θ̂ by SciPy L-BFGS ({nfev} evaluations, {opt.message})"
    else:
        before = _COUNT["setup"]
        with contextlib.redirect_stdout(io.StringIO()):
            theta_hat, V = alg.get_theta_hat_and_var_cov_matrix("logistic", x, y)
        theta_hat = np.asarray(theta_hat, dtype=np.float64)
        passes = (_COUNT["setup"] - before) / n
        _COUNT["setup"] = before
        map_rows = float(n) * (passes + 1)
        map_note = f"θ̂ by pymhss's float32 gradient descent ({passes:.0f} passes)"
    map_s = time.perf_counter() - t0
    print(f"  MH-SS θ̂ and V: {map_s:.1f} s; {map_note}", flush=True)

    chain_share = max(args.budget - map_s, 1.0) / args.chains
    np.random.seed(args.seed)  # noqa: NPY002 (pymhss draws from NumPy's global generator)
    draws, setup_s, sampling_s, rows_loop, rows_setup, iters = [], map_s, 0.0, 0.0, map_rows, []
    acc, mean_b = [], []
    npost = args.mhss_draws
    for c in range(args.chains):
        start = time.perf_counter()
        _LOOP.clear()
        # The first chain gets its share of the budget; the others then run as many
        # iterations as it did (equal lengths), with a generous deadline as a guard.
        _LOOP["deadline"] = start + chain_share * (1 if c == 0 else 2)
        _LOOP["minimum"] = args.mhss_burn + 200
        _COUNT["loglik"] = 0
        _COUNT["setup"] = 0
        out = alg.MH_SS(y, x, V, theta_hat, args.mhss_burn, npost, "logistic",
                        "vectorised", control_variates=True, chi=0, taylor_order=2,
                        phi_function="min", kappa=args.mhss_kappa)
        setup_s += _LOOP["start"] - start
        sampling_s += _LOOP["end"] - _LOOP["start"]
        rows_loop += (_COUNT["loglik"] - _LOOP["rows_at_start"]) / 2.0
        rows_setup += _COUNT["setup"] + _LOOP["rows_at_start"] / 2.0
        total = _LOOP["iterations"]
        kept = max(total - args.mhss_burn, 0)
        iters.append(total)
        draws.append(np.asarray(out["parameters"])[:kept])
        acc.append(float(out["acc_rate"]) * npost / max(kept, 1))
        mean_b.append(float(np.asarray(out["BoverN"])[:kept].mean()) * n)
        if c == 0:
            npost = kept
    kept = min(len(a) for a in draws)
    stacked = np.stack([a[:kept] for a in draws])  # (chain, draw, d)
    hit = [i < args.mhss_burn + args.mhss_draws for i in iters]
    note = (f"κ = {args.mhss_kappa}, taylor_order 2, burn-in {args.mhss_burn}, kept "
            f"{'/'.join(str(max(i - args.mhss_burn, 0)) for i in iters)} per chain "
            f"({kept} used per chain"
            f"{', the first chain stopped by the budget' if hit[0] else ''}); acceptance "
            f"{'/'.join(f'{a:.2f}' for a in acc)}; mean Poisson batch B "
            f"{'/'.join(f'{b:.1f}' for b in mean_b)} (drawn, before the first stage); "
            f"{map_note}")
    r = Result("mhss", {"b": stacked}, setup_s, sampling_s, rows_loop, rows_setup, note=note)
    r.laplace = (np.asarray(theta_hat, dtype=np.float64), V)
    r.iterations = sum(iters)
    r.kept = kept * args.chains
    return r


# --------------------------------------------------------------------------- this package
def run_package_budget(cfg: Config, model, args) -> Result:
    """bench_tall_glm.run_package, with draws sized to the budget by a pilot run."""
    base = dict(quick=args.quick, draws=1000, tune=1000, chains=args.chains, seed=args.seed)
    pilot_setup = 0.0
    if args.package_draws is not None:
        draws = args.package_draws
        tune = args.package_tune if args.package_tune is not None else draws
        how = "as given"
    else:
        default = 300 if args.quick else 1000
        pilot = run_package(cfg, model, SimpleNamespace(**{**base, "chains": 1},
                                                         package_draws=100,
                                                         package_tune=100))
        per_iter = pilot.sampling_s / 200.0
        room = args.budget - pilot.setup_s
        fit = int(room / (args.chains * 2 * max(per_iter, 1e-6)))
        draws = max(100, min(default, fit))
        tune = args.package_tune if args.package_tune is not None else draws
        how = (f"pilot: set-up {pilot.setup_s:.1f} s, {per_iter * 1e3:.2f} ms/iteration"
               + ("" if draws == default else "; shortened to fit the budget"))
        pilot_setup = pilot.setup_s
        del pilot
        gc.collect()
    r = run_package(cfg, model, SimpleNamespace(**base, package_draws=draws,
                                                 package_tune=tune))
    if args.package_draws is None and pilot_setup > r.setup_s:
        # The pilot built the step first (compilation caches cold); count that set-up.
        how += (f"; set-up counted as the pilot's {pilot_setup:.1f} s "
                f"(main run {r.setup_s:.1f} s)")
        r.setup_s = pilot_setup
    r.iterations = args.chains * (draws + tune)
    r.kept = args.chains * draws
    r.note += f"; {how}"
    return r


# --------------------------------------------------------------------------- tables
HEADER = ("| sampler | iterations (kept) | min bulk ESS | min tail ESS | max R-hat | set-up s "
          "| sampling s | ESS/draw | ESS/s | ESS/s incl. set-up | rows/ESS "
          "| rows/ESS incl. set-up | rows/iteration | max abs(sd/sd_Laplace − 1) |")
ALIGN = ("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
         "| ---: | ---: |")


def config_table(cfg, results, dtype, load_note, lap):
    lines = [f"## {cfg.label} (flat prior, design {np.dtype(dtype).name})", "",
             load_note, "", HEADER, ALIGN]
    stats, sc = {}, {}
    sd_lap = np.sqrt(np.diag(lap[1]))
    for r in results:
        sc[r.sampler] = scalars(r.draws, ["b"])
        bulk, tail, rhat = ess_rhat(sc[r.sampler])
        sd = np.asarray(r.draws["b"]).reshape(-1, cfg.d).std(axis=0)
        lap_dev = np.abs(sd / sd_lap - 1.0)
        st = dict(bulk=bulk, tail=tail, rhat=rhat,
                  ess_draw=bulk / r.kept, ess_s=bulk / r.sampling_s,
                  sd_laplace=float(lap_dev.max()), sd_laplace_at=int(lap_dev.argmax()),
                  iterations=r.iterations, kept=r.kept, rows_sampling=r.rows_sampling,
                  rows_setup=r.rows_setup,
                  ess_s_all=bulk / (r.sampling_s + r.setup_s),
                  rows=r.rows_sampling / bulk,
                  rows_all=(r.rows_sampling + r.rows_setup) / bulk,
                  rows_iter=r.rows_sampling / r.iterations,
                  setup=r.setup_s, sampling=r.sampling_s)
        stats[r.sampler] = st
        lines.append(
            f"| {r.sampler} | {r.iterations:,} ({r.kept:,}) | {bulk:,.0f} | {tail:,.0f} "
            f"| {rhat:.3f} | {r.setup_s:.1f} | {r.sampling_s:.1f} | {st['ess_draw']:.3g} "
            f"| {st['ess_s']:.3g} | {st['ess_s_all']:.3g} | {fmt(st['rows'])} "
            f"| {fmt(st['rows_all'])} | {st['rows_iter']:,.1f} "
            f"| {st['sd_laplace']:.3f} (b[{st['sd_laplace_at']}]) |")
    lines.append("")
    if "mhss" in sc and "package" in sc:
        z, sdr, z_at, sd_at, zsd = agreement(sc["package"], sc["mhss"])
        stats["agree"] = dict(z=z, sdr=sdr, zsd=zsd, z_at=z_at, sd_at=sd_at)
        lines.append(f"Agreement (package against MH-SS): max |Δmean|/combined MCSE "
                     f"{z:.2f} ({z_at}); max |sd ratio − 1| {sdr:.3f} ({sd_at}); "
                     f"max |Δsd|/combined MCSE(sd) {zsd:.2f}.")
        lines.append("")
    lines += [f"- {r.sampler}: {r.note}" for r in results if r.note]
    lines.append("- sd_Laplace: sqrt of the diagonal of (Xᵀ W X)⁻¹ at the MLE, the flat-prior "
                 "posterior's Laplace approximation (relative error O(1/N)); the Monte Carlo "
                 "error of an sd is about sd/√(2 ESS).")
    return lines, stats


def summary(all_stats, not_run):
    lines = ["## Summary", "",
             "| configuration | rows/ESS MH-SS | rows/ESS package | incl. set-up MH-SS "
             "| incl. set-up package | ESS/draw MH-SS | ESS/draw package "
             "| ESS/s incl. set-up MH-SS | ESS/s incl. set-up package "
             "| max abs Δmean/MCSE | max abs(sd ratio − 1) "
             "| sd vs Laplace MH-SS | sd vs Laplace package |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
             "| ---: | ---: |"]
    for cfg, st in all_stats.items():
        m, p, a = st.get("mhss", {}), st.get("package", {}), st.get("agree", {})

        def g(dct, key, spec):
            return fmt(dct.get(key), spec)

        lines.append(
            f"| N={cfg.n:.0e} d={cfg.d} | {g(m, 'rows', ',.0f')} | {g(p, 'rows', ',.0f')} "
            f"| {g(m, 'rows_all', ',.0f')} | {g(p, 'rows_all', ',.0f')} "
            f"| {g(m, 'ess_draw', '.3g')} | {g(p, 'ess_draw', '.3g')} "
            f"| {g(m, 'ess_s_all', '.3g')} | {g(p, 'ess_s_all', '.3g')} "
            f"| {g(a, 'z', '.2f')} | {g(a, 'sdr', '.3f')} "
            f"| {g(m, 'sd_laplace', '.3f')} | {g(p, 'sd_laplace', '.3f')} |")
    if not_run:
        lines += ["", "Not measured:"] + [f"- {t}" for t in not_run]
    return lines


def load_note():
    try:
        one, five, _ = os.getloadavg()
    except OSError:
        return "Machine load: unknown."
    return (f"Machine: {os.cpu_count()} cores shared with other work (load average "
            f"{one:.2f} / {five:.2f} over 1 / 5 min when the table was made); one sampler "
            "at a time, one thread (OMP/OPENBLAS/MKL_NUM_THREADS=1).")


# --------------------------------------------------------------------------- main
def main(argv=None):
    args = parse_args(argv)
    skipped = {s: "--skip" for s in args.skip}
    if "mhss" not in skipped:
        try:
            import_mhss()
        except Exception as err:  # noqa: BLE001 - any import failure skips MH-SS, with reason
            skipped["mhss"] = (f"cannot import PyMHSS ({type(err).__name__}: {err}); "
                               "pip install -e '.[mhss]' (pymhss 0.1.5, TensorFlow, JAX, "
                               "statsmodels)")
    for s, why in skipped.items():
        print(f"skipping {s}: {why}")
    from importlib.metadata import version

    versions = []
    for dist in ("pymc", "numpy", "arviz", "pymhss", "tensorflow", "jax", "scipy"):
        with contextlib.suppress(Exception):
            versions.append(f"{dist} {version(dist)}")
    out_lines = ["# MH-SS against this package (flat-prior logistic regression)", "",
                 f"Versions: {', '.join(versions)}. Chains: {args.chains}, one after "
                 f"another; budget {args.budget:.0f} s per sampler and configuration.", ""]
    all_stats, not_run, json_stats = {}, [], {}
    for cfg in args.configs:
        dtype = design_dtype(cfg, args.dtype)
        print(f"\n=== {cfg.label}: generating data ({np.dtype(dtype).name} design)", flush=True)
        t0 = time.perf_counter()
        data = make_data(cfg, args.seed, dtype)
        print(f"  data: {time.perf_counter() - t0:.1f} s", flush=True)
        results = []
        for sampler in SAMPLERS:
            if sampler in skipped:
                not_run.append(f"{cfg.label}: {sampler} ({skipped[sampler]})")
                continue
            print(f"  running {sampler} ...", flush=True)
            try:
                if sampler == "mhss":
                    r = run_mhss(cfg, data, args)
                else:
                    model = make_flat_model(cfg, data)
                    r = run_package_budget(cfg, model, args)
                    del model
            except Exception as err:  # noqa: BLE001 - printed and listed; the others still run
                print(f"  {sampler} FAILED: {type(err).__name__}: {err}")
                traceback.print_exc(limit=4)
                not_run.append(f"{cfg.label}: {sampler} failed ({type(err).__name__}: "
                               f"{err})")
                continue
            print(f"  {sampler}: set-up {r.setup_s:.1f} s, sampling {r.sampling_s:.1f} s",
                  flush=True)
            results.append(r)
            gc.collect()
        lap = next((r.laplace for r in results if hasattr(r, "laplace")), None)
        if lap is None or args.mhss_map != "scipy":
            lap = laplace(cfg, data)
        lines, stats = config_table(cfg, results, dtype, load_note(), lap)
        print("\n".join(lines), flush=True)
        out_lines += lines + [""]
        all_stats[cfg] = stats
        json_stats[f"{cfg.n:.0e}:{cfg.d}"] = stats
        del data, results
        gc.collect()
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "mhss.md").write_text("\n".join(out_lines + summary(all_stats, not_run))
                                          + "\n")
        (args.out / "mhss.json").write_text(json.dumps(json_stats, indent=1, default=float))
    lines = summary(all_stats, not_run)
    print("\n".join(lines))
    out_lines += lines
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "mhss.md").write_text("\n".join(out_lines) + "\n")
    return all_stats


if __name__ == "__main__":
    main()
