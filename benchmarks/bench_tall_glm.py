"""Benchmark: tall logistic regressions against nutpie NUTS and NumPyro HMCECS.

In one process, one configuration after another, one sampler after another:

- **nutpie** NUTS on the full data (``nutpie.compile_pymc_model(model, backend="numba")``,
  then ``nutpie.sample(compiled, chains=…, cores=1)``): the reference posterior;
- **NumPyro HMCECS** with its second-order Taylor proxy (``HMCECS(NUTS(model),
  proxy=HMCECS.taylor_proxy(MAP), num_blocks=…)``, subsample size ``--hmcecs-batch``), the
  MAP found with SciPy's L-BFGS on the full-data potential, JAX in float64;
- **this package's zero-config setting** (:func:`make_package_step`).

Models (prior N(0, 5²) on every coefficient, temperature 1):

- ``logistic:N:d``: an intercept and d − 1 standard-normal features; true intercept
  N(0, 0.5²), true slopes N(0, 1.5²/(d − 1)) so the linear predictor has sd ≈ 1.5 at
  every d;
- ``hier:N:G[:d]``: non-centred hierarchical logistic regression, G groups (rows spread
  uniformly), ``α_g = μ + τ z_g``, ``z_g ~ N(0, 1)``, ``μ ~ N(0, 5²)``, ``τ ~ HalfNormal(1)``,
  d standard-normal features (default 10) with coefficients ``b ~ N(0, 5²)``.

Data are generated in chunks of 2²⁰ rows, each from its own seeded generator, so a
configuration's data do not depend on the chunking or on other configurations. The
design is float64, except with ``--dtype auto`` (the default) above N·d = 5·10⁸, where it
is float32 (N = 10⁷, d = 100 is 8 GB in float64 and the three samplers may each hold a
copy); the samplers compute in float64 either way. A float32 design handicaps nutpie:
its Numba-compiled ``dot`` of a float32 matrix with float64 coefficients ran 11 × slower
per leapfrog step than the float64 one (measured, N = 2·10⁵, d = 100), so a float32 row
is not a fair comparison with nutpie.

Printed per configuration and sampler: min bulk and tail ESS (ArviZ, over every scalar of
every free variable), largest R-hat, set-up and sampling seconds, min bulk ESS per second
without and with the set-up, rows evaluated per bulk ESS (sampling only, and with the
set-up), and against nutpie the largest |mean difference| / combined MCSE and the
largest |sd ratio − 1|. What counts as set-up and as rows:

- nutpie: set-up = compilation; rows = N × leapfrog steps (``n_steps``, warm-up
  included); sampling = warm-up and draws.
- HMCECS: set-up = the MAP search (its JIT compilation included) plus the JAX
  compilation that happens inside NumPyro's warm-up and sampling calls (trace, lowering
  and XLA compile times, read from JAX's monitoring events and subtracted from the run's
  time; the proxy's full-data passes stay in the sampling time); rows ≈ subsample size × (leapfrog
  steps + 2) per iteration (trajectory, plus the Gibbs update's potential and refresh);
  set-up rows = N × (MAP evaluations + 3 per chain for the proxy's value, gradient and
  Hessian).
- this package: set-up = building the step (MAP search, passes at θ̂, compilation) and
  one warm-up call of its compiled per-step function; rows = ``batch_size`` +
  ``extra_evaluations`` stats over all iterations (tuning included), set-up rows =
  ``step.control_variate.setup_evaluations`` plus the error budget's pilot
  (``step.pilot_rows``).

Targets (same run, set-up included on both sides): logistic
N = 10⁶, d = 50: min ESS/s ≥ 100 × nutpie's; N = 10⁵, d = 50: ≥ 20 ×; N = 10⁶, d = 100:
≥ 30 ×; hierarchical N = 10⁶: ≥ 10 × with R-hat < 1.01; every configuration: means within
3 combined MCSE of nutpie, sds within 5 %; rows per ESS after set-up flat within 2 × from
N = 10⁵ to 10⁷ (per d).

Long: hours at the full sizes (nutpie on N = 10⁷ dominates). ``--quick`` runs tiny sizes
as a smoke test; ``--configs`` picks configurations, ``--skip nutpie,hmcecs`` samplers.
Tables are printed and written to ``benchmarks/output/tall_glm.md``.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import math
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import arviz as az
import numpy as np
import pymc as pm
import pytensor.tensor as pt
from scipy.special import expit

from pymc_minibatch_mh import MinibatchBarker
from pymc_minibatch_mh.model.compat import group, mcse, posterior, sample_stats

# Quiet the libraries' deprecation chatter, but keep UserWarnings: the package says
# there when the zero-config step falls back (a silenced one hid a random-walk fallback).
warnings.filterwarnings("ignore", category=DeprecationWarning)
warnings.filterwarnings("ignore", category=FutureWarning)
OUT = Path(__file__).resolve().parent / "output"
CHUNK = 1 << 20
SAMPLERS = ("nutpie", "hmcecs", "package")
DEFAULT_CONFIGS = [f"logistic:{n}:{d}" for n in ("1e5", "1e6", "1e7") for d in (10, 50, 100)]
DEFAULT_CONFIGS.append("hier:1e6:20")
QUICK_CONFIGS = ["logistic:1e4:5", "hier:1e4:5:3"]
#: ESS/s ratio targets against nutpie (set-up included): (kind, N, d or None) -> factor.
RATIO_TARGETS = {
    ("logistic", 10**6, 50): 100.0,
    ("logistic", 10**5, 50): 20.0,
    ("logistic", 10**6, 100): 30.0,
    ("hier", 10**6, None): 10.0,
}


# --------------------------------------------------------------------------- configuration
@dataclass(frozen=True)
class Config:
    kind: str  # "logistic" or "hier"
    n: int
    d: int  # features (logistic: including the intercept column)
    groups: int = 0

    @property
    def label(self) -> str:
        if self.kind == "logistic":
            return f"logistic N={self.n:.0e} d={self.d}"
        return f"hier N={self.n:.0e} G={self.groups} d={self.d}"


def parse_config(text: str) -> Config:
    parts = text.strip().split(":")
    kind = parts[0]
    if kind == "logistic" and len(parts) == 3:
        return Config("logistic", int(float(parts[1])), int(parts[2]))
    if kind == "hier" and len(parts) in (3, 4):
        d = int(parts[3]) if len(parts) == 4 else 10
        return Config("hier", int(float(parts[1])), d, int(parts[2]))
    raise argparse.ArgumentTypeError(
        f"bad config {text!r}: use logistic:N:d or hier:N:G[:d] (e.g. logistic:1e5:50)"
    )


def finish_args(p: argparse.ArgumentParser, args: argparse.Namespace, *, quick: list[str],
                default: list[str], parse, samplers: tuple[str, ...]) -> None:
    """The parsing both scripts share (this one and ``bench_mhss.py``): ``--configs``
    (``quick`` or ``default`` when absent, each parsed by ``parse``) and ``--skip`` (a set,
    checked against ``samplers``)."""
    if args.configs is None:
        args.configs = ",".join(quick if args.quick else default)
    args.configs = [parse(c) for c in args.configs.split(",") if c.strip()]
    args.skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    unknown = args.skip - set(samplers)
    if unknown:
        p.error(f"--skip: unknown sampler(s) {sorted(unknown)}; choose from {samplers}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default=None,
                   help="comma-separated, e.g. logistic:1e5:50,hier:1e6:20 "
                        f"(default: {','.join(DEFAULT_CONFIGS)})")
    p.add_argument("--quick", action="store_true",
                   help=f"smoke run: {','.join(QUICK_CONFIGS)}, 300 tuning + 300 draws")
    p.add_argument("--draws", type=int, default=None,
                   help="draws per chain for nutpie and HMCECS (default 1000; --quick 300)")
    p.add_argument("--tune", type=int, default=None,
                   help="tuning/warm-up iterations per chain for nutpie and HMCECS "
                        "(default 1000; --quick 300)")
    p.add_argument("--nutpie-draws", type=int, default=None,
                   help="draws per chain for nutpie only (default: --draws); nutpie's cost "
                        "grows with N, so fewer draws keep N = 1e7 affordable")
    p.add_argument("--nutpie-tune", type=int, default=None,
                   help="tuning iterations per chain for nutpie only (default: --tune)")
    p.add_argument("--package-draws", type=int, default=None,
                   help="draws per chain for this package (default: --draws for the "
                        "zero-config step, 20000 (--quick 5000) for the fallback recipe)")
    p.add_argument("--package-tune", type=int, default=None,
                   help="tuning iterations per chain for this package (default: --tune)")
    p.add_argument("--chains", type=int, default=2, help="run one after another (cores=1)")
    p.add_argument("--skip", default="", help=f"comma-separated subset of {SAMPLERS}")
    p.add_argument("--hmcecs-batch", type=int, default=1000, help="HMCECS subsample size")
    p.add_argument("--hmcecs-blocks", type=int, default=100,
                   help="HMCECS blocks (one block of the subsample is renewed per step)")
    p.add_argument("--dtype", choices=("auto", "float64", "float32"), default="auto",
                   help="design-matrix dtype; auto: float32 above N·d = 5e8 (slows nutpie)")
    p.add_argument("--seed", type=int, default=2017)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    finish_args(p, args, quick=QUICK_CONFIGS, default=DEFAULT_CONFIGS, parse=parse_config,
                samplers=SAMPLERS)
    default_len = 300 if args.quick else 1000
    args.draws = default_len if args.draws is None else args.draws
    args.tune = default_len if args.tune is None else args.tune
    args.nutpie_draws = args.draws if args.nutpie_draws is None else args.nutpie_draws
    args.nutpie_tune = args.tune if args.nutpie_tune is None else args.nutpie_tune
    return args


# --------------------------------------------------------------------------- data
@dataclass
class Data:
    x: np.ndarray
    y: np.ndarray
    g: np.ndarray | None = None
    truth: dict = field(default_factory=dict)


def design_dtype(cfg: Config, choice: str):
    if choice == "auto":
        return np.float32 if cfg.n * cfg.d > 5 * 10**8 else np.float64
    return np.dtype(choice).type


def make_data(cfg: Config, seed: int, dtype) -> Data:
    """Seeded, in chunks of 2²⁰ rows (one generator per chunk)."""
    rng = np.random.default_rng([seed, cfg.d, cfg.groups])
    n, d = cfg.n, cfg.d
    x = np.empty((n, d), dtype=dtype)
    y = np.empty(n, dtype=np.int64)
    g = np.empty(n, dtype=np.int64) if cfg.kind == "hier" else None
    if cfg.kind == "logistic":
        slopes = rng.normal(0.0, 1.5 / math.sqrt(max(d - 1, 1)), size=d - 1)
        beta = np.concatenate([[rng.normal(0.0, 0.5)], slopes])
        truth = {"b": beta}
    else:
        beta = rng.normal(0.0, 1.0 / math.sqrt(d), size=d)
        mu, tau = 0.3, 0.7
        alpha = mu + tau * rng.normal(size=cfg.groups)
        truth = {"b": beta, "mu": mu, "tau": tau, "alpha": alpha}
    for k, start in enumerate(range(0, n, CHUNK)):
        stop = min(start + CHUNK, n)
        r = np.random.default_rng([seed, cfg.d, cfg.groups, k])
        m = stop - start
        if cfg.kind == "logistic":
            xc = np.empty((m, d))
            xc[:, 0] = 1.0
            xc[:, 1:] = r.normal(size=(m, d - 1))
            eta = xc @ beta
        else:
            xc = r.normal(size=(m, d))
            gc_ = r.integers(cfg.groups, size=m)
            g[start:stop] = gc_
            eta = xc @ beta + alpha[gc_]
        x[start:stop] = xc
        y[start:stop] = r.random(m) < expit(eta)
    return Data(x, y, g, truth)


def make_pymc_model(cfg: Config, data: Data) -> pm.Model:
    with pm.Model() as model:
        if cfg.kind == "logistic":
            b = pm.Normal("b", 0.0, 5.0, shape=cfg.d)
            pm.Bernoulli("y", logit_p=pt.dot(data.x, b), observed=data.y)
        else:
            mu = pm.Normal("mu", 0.0, 5.0)
            tau = pm.HalfNormal("tau", 1.0)
            z = pm.Normal("z", 0.0, 1.0, shape=cfg.groups)
            b = pm.Normal("b", 0.0, 5.0, shape=cfg.d)
            eta = mu + tau * z[data.g] + pt.dot(data.x, b)
            pm.Bernoulli("y", logit_p=eta, observed=data.y)
    return model


def free_names(cfg: Config) -> list[str]:
    return ["b"] if cfg.kind == "logistic" else ["mu", "tau", "z", "b"]


# --------------------------------------------------------------------------- results
@dataclass
class Result:
    sampler: str
    draws: dict  # name -> (chain, draw, ...) array
    setup_s: float
    sampling_s: float
    rows_sampling: float | None  # rows evaluated after set-up (None: n/a)
    rows_setup: float | None
    note: str = ""


def scalars(draws: dict, names: list[str]) -> dict[str, np.ndarray]:
    """Flatten every free variable into scalars: label -> (chain, draw)."""
    out = {}
    for name in names:
        a = np.asarray(draws[name], dtype=float)
        if a.ndim == 2:
            out[name] = a
        else:
            flat = a.reshape(a.shape[0], a.shape[1], -1)
            for j in range(flat.shape[-1]):
                out[f"{name}[{j}]"] = flat[..., j]
    return out


def ess_rhat(sc: dict[str, np.ndarray]) -> tuple[float, float, float]:
    bulk = min(float(np.asarray(az.ess(a, method="bulk")).squeeze()) for a in sc.values())
    tail = min(float(np.asarray(az.ess(a, method="tail", prob=(0.05, 0.95))).squeeze())
               for a in sc.values())
    rhat = max(float(np.asarray(az.rhat(a)).squeeze()) for a in sc.values())
    return bulk, tail, rhat


def agreement(sc: dict, ref: dict) -> tuple[float, float, str, str, float]:
    """Over the scalars: the largest |mean difference| / combined MCSE, the largest
    |sd ratio − 1| (and where), and the largest |sd difference| / combined MCSE of the sd
    (ArviZ's ``mcse(method="sd")``), which says whether an sd difference is more than
    Monte Carlo noise."""
    z_max, sd_max, z_at, sd_at, zsd_max = 0.0, 0.0, "", "", 0.0
    for k, a in sc.items():
        b = ref[k]
        se = math.hypot(mcse(a), mcse(b))
        z = abs(a.mean() - b.mean()) / se if se > 0 else math.inf
        r = abs(a.std() / b.std() - 1.0)
        se_sd = math.hypot(mcse(a, method="sd"), mcse(b, method="sd"))
        zsd = abs(a.std() - b.std()) / se_sd if se_sd > 0 else math.inf
        if z > z_max:
            z_max, z_at = z, k
        if r > sd_max:
            sd_max, sd_at = r, k
        zsd_max = max(zsd_max, zsd)
    return z_max, sd_max, z_at, sd_at, zsd_max


# --------------------------------------------------------------------------- this package
# ============ THIS PACKAGE'S SETTING: the lead updates make_package_step when the API lands
def _accepts_proposal_keyword() -> bool:
    """Whether the step's constructor chain (it forwards **kwargs) names ``proposal``."""
    for klass in MinibatchBarker.__mro__:
        init = klass.__dict__.get("__init__")
        if init is not None and "proposal" in inspect.signature(init).parameters:
            return True
    return False


def make_package_step(model):
    """This package's step for the benchmark, and how to sample with it.

    The zero-config setting is ``MinibatchBarker(control_variate="taylor")`` with PyMC's
    default draws/tune, once the step picks a surrogate-guided proposal by itself (the
    ``proposal`` keyword). Until then (the keyword is not accepted), today's recipe:
    ``MinibatchBarker(control_variate="taylor", S="laplace", scaling=2.38/√d, tune=False,
    batch_size=50)`` started at θ̂ (``initvals=step.control_variate.reference_point()``).

    Returns
    -------
    (step, initvals, description, zero_config)

    """
    d = sum(np.size(v) for v in model.initial_point().values())
    with model:
        if _accepts_proposal_keyword():
            try:
                step = MinibatchBarker(control_variate="taylor")
                return step, None, ('MinibatchBarker(control_variate="taylor"), proposal '
                                    f"{step.proposal.name!r}"), True
            except TypeError:
                pass
        step = MinibatchBarker(control_variate="taylor", S="laplace",
                               scaling=2.38 / math.sqrt(d), tune=False, batch_size=50)
    desc = (f'fallback: MinibatchBarker(control_variate="taylor", S="laplace", '
            f"scaling=2.38/√{d}, tune=False, batch_size=50), initvals=θ̂")
    return step, step.control_variate.reference_point(), desc, False
# ============ end of this package's setting


def run_package(cfg, model, args) -> Result:
    start = time.perf_counter()
    step, initvals, desc, zero = make_package_step(model)
    cv = step.control_variate
    try:  # JIT the per-step function now: part of the set-up, not of sampling
        x_hat = np.array(cv.reference.theta)
        b = int(getattr(step, "batch_size", 50))
        cv.fn(x_hat, x_hat, np.array(1.0), *cv.store.rows(np.arange(b)))
    except Exception as err:  # noqa: BLE001 - printed; the first step then compiles instead
        print(f"  (package warm-up call skipped: {type(err).__name__}: {err})")
    setup = time.perf_counter() - start
    print(f"  package step: {desc}")
    if zero:
        draws = args.package_draws or args.draws
    else:
        draws = args.package_draws or (5000 if args.quick else 20_000)
    tune = args.tune if args.package_tune is None else args.package_tune
    start = time.perf_counter()
    with model:
        idata = pm.sample(
            draws=draws, tune=tune, step=step, chains=args.chains, cores=1, initvals=initvals,
            random_seed=args.seed, progressbar=False, compute_convergence_checks=False,
            discard_tuned_samples=False,
        )
    sampling = time.perf_counter() - start
    rows = 0.0
    for name in ("sample_stats", "warmup_sample_stats"):
        try:
            ss = group(idata, name)
        except (KeyError, AttributeError):
            continue
        rows += float(np.asarray(ss["batch_size"]).sum())
        rows += float(np.asarray(ss["extra_evaluations"]).sum())
    post = posterior(idata)
    per_draw = int(getattr(step, "steps_per_draw", 1))
    mean_batch = float(np.asarray(sample_stats(idata)["batch_size"]).mean()) / per_draw
    return Result("package", {k: np.asarray(post[k]) for k in free_names(cfg)}, setup,
                  sampling, rows,
                  float(cv.setup_evaluations + getattr(step, "pilot_rows", 0)),
                  note=f"{'zero-config' if zero else 'fallback'}; {draws}+{tune} per chain; "
                       f"{per_draw} transition(s) per draw; mean batch {mean_batch:.0f} rows "
                       "per transition")


# --------------------------------------------------------------------------- nutpie
def run_nutpie(cfg, model, args) -> Result:
    import nutpie

    start = time.perf_counter()
    compiled = nutpie.compile_pymc_model(model, backend="numba")
    setup = time.perf_counter() - start
    start = time.perf_counter()
    trace = nutpie.sample(compiled, draws=args.nutpie_draws, tune=args.nutpie_tune,
                          chains=args.chains,
                          cores=1, seed=args.seed, progress_bar=False, save_warmup=True)
    sampling = time.perf_counter() - start
    steps = 0.0
    for name in ("sample_stats", "warmup_sample_stats"):
        try:
            steps += float(np.asarray(group(trace, name)["n_steps"]).sum())
        except (KeyError, AttributeError):
            pass
    post = posterior(trace)
    iters = args.chains * (args.nutpie_draws + args.nutpie_tune)
    return Result("nutpie", {k: np.asarray(post[k]) for k in free_names(cfg)}, setup,
                  sampling, steps * cfg.n, 0.0,
                  note=f"{args.nutpie_draws}+{args.nutpie_tune} per chain; "
                       f"{steps / iters:.1f} leapfrog/iter")


# --------------------------------------------------------------------------- NumPyro HMCECS
def run_hmcecs(cfg, data, args) -> Result:
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist
    from jax.flatten_util import ravel_pytree
    from numpyro.infer import HMCECS, MCMC, NUTS
    from numpyro.infer.util import initialize_model
    from scipy.optimize import minimize

    x = jnp.asarray(data.x)
    y = jnp.asarray(data.y)
    g = None if data.g is None else jnp.asarray(data.g)
    m = min(args.hmcecs_batch, cfg.n)

    def model(x, y, g, subsample_size):
        if cfg.kind == "logistic":
            b = numpyro.sample("b", dist.Normal(0.0, 5.0).expand([cfg.d]).to_event(1))
        else:
            mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
            tau = numpyro.sample("tau", dist.HalfNormal(1.0))
            z = numpyro.sample("z", dist.Normal(0.0, 1.0).expand([cfg.groups]).to_event(1))
            b = numpyro.sample("b", dist.Normal(0.0, 5.0).expand([cfg.d]).to_event(1))
        with numpyro.plate("N", cfg.n, subsample_size=subsample_size):
            xb = numpyro.subsample(x, event_dim=1)
            yb = numpyro.subsample(y, event_dim=0)
            eta = xb @ b
            if cfg.kind == "hier":
                gb = numpyro.subsample(g, event_dim=0)
                eta = eta + mu + tau * z[gb]
            numpyro.sample("y", dist.Bernoulli(logits=eta), obs=yb)

    # ---- set-up: MAP on the full data (L-BFGS on the jitted potential and its gradient)
    start = time.perf_counter()
    info = initialize_model(jax.random.PRNGKey(args.seed), model,
                            model_args=(x, y, g, None))
    z0 = info.param_info.z
    flat0, unravel = ravel_pytree(z0)
    value_grad = jax.jit(jax.value_and_grad(lambda f: info.potential_fn(unravel(f))))

    def fun(f):
        v, gr = value_grad(jnp.asarray(f))
        return float(v), np.asarray(gr, dtype=float)

    opt = minimize(fun, np.zeros_like(np.asarray(flat0)), jac=True, method="L-BFGS-B",
                   options={"maxiter": 1000, "gtol": 1e-6})
    z_map = unravel(jnp.asarray(opt.x))
    constrained = info.postprocess_fn(z_map)
    ref = {k: constrained[k] for k in free_names(cfg)}
    setup = time.perf_counter() - start

    blocks = min(args.hmcecs_blocks, m)
    init = {k: jnp.stack([v] * args.chains) for k, v in z_map.items()}
    fields = ("hmc_state.num_steps",)

    def run(tune, draws):
        """A fresh kernel and MCMC (so JAX compiles again); (seconds, leapfrog steps, draws)."""
        kernel = HMCECS(NUTS(model), num_blocks=blocks, proxy=HMCECS.taylor_proxy(ref))
        mcmc = MCMC(kernel, num_warmup=tune, num_samples=draws, num_chains=args.chains,
                    chain_method="sequential", progress_bar=False)
        key_w, key_s = jax.random.split(jax.random.PRNGKey(args.seed))
        _count_compile_time()
        _COMPILE_SECONDS.clear()
        start = time.perf_counter()
        mcmc.warmup(key_w, x, y, g, m, extra_fields=fields, collect_warmup=True,
                    init_params=init)
        steps = float(np.asarray(mcmc.get_extra_fields()["hmc_state.num_steps"]).sum())
        mcmc.run(key_s, x, y, g, m, extra_fields=fields)
        steps += float(np.asarray(mcmc.get_extra_fields()["hmc_state.num_steps"]).sum())
        samples = mcmc.get_samples(group_by_chain=True)
        return time.perf_counter() - start, steps, samples

    # JAX compiles inside NumPyro's calls; the time spent tracing, lowering and compiling
    # is read from JAX's own monitoring events and moved from sampling to set-up.
    total_s, steps, samples = run(args.tune, args.draws)
    compile_s = min(sum(_COMPILE_SECONDS.values()), total_s)
    sampling = max(total_s - compile_s, 1e-3)
    iters = args.chains * (args.draws + args.tune)
    out = {k: np.asarray(samples[k]) for k in free_names(cfg)}
    jax.clear_caches()
    return Result("hmcecs", out, setup + compile_s, sampling, m * (steps + 2 * iters),
                  float(cfg.n) * (opt.nfev + 3 * args.chains),
                  note=f"b={m}, {blocks} blocks; set-up = MAP ({setup:.1f} s, {opt.nfev} "
                       f"evaluations, compilation included) + JAX compilation during the run "
                       f"({compile_s:.1f} s of its {total_s:.1f} s); "
                       f"{steps / iters:.1f} leapfrog/iter")


_COMPILE_SECONDS: dict[str, float] = {}


def _count_compile_time() -> None:
    """Sum JAX's trace/lower/compile durations into ``_COMPILE_SECONDS`` (once)."""
    from jax import monitoring

    if getattr(_count_compile_time, "done", False):
        return

    def listener(name, seconds, **_):
        if name.startswith("/jax/core/compile/"):
            _COMPILE_SECONDS[name] = _COMPILE_SECONDS.get(name, 0.0) + seconds

    monitoring.register_event_duration_secs_listener(listener)
    _count_compile_time.done = True


# --------------------------------------------------------------------------- tables
def fmt(v, spec=",.0f"):
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    return format(v, spec)


def config_table(cfg, results, dtype, ref_sc) -> tuple[list[str], dict]:
    lines = [f"## {cfg.label} (design {np.dtype(dtype).name})", "",
             "| sampler | min bulk ESS | min tail ESS | max R-hat | set-up s | sampling s "
             "| ESS/s | ESS/s incl. set-up | rows/ESS | rows/ESS incl. set-up "
             "| max abs Δmean/MCSE | max abs(sd ratio − 1) | max abs Δsd/MCSE(sd) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
             "| ---: |"]
    stats = {}
    for r in results:
        sc = scalars(r.draws, free_names(cfg))
        bulk, tail, rhat = ess_rhat(sc)
        ess_s = bulk / r.sampling_s
        ess_s_all = bulk / (r.sampling_s + r.setup_s)
        rows = None if r.rows_sampling is None else r.rows_sampling / bulk
        rows_all = (None if r.rows_sampling is None or r.rows_setup is None
                    else (r.rows_sampling + r.rows_setup) / bulk)
        if ref_sc is not None and r.sampler != "nutpie":
            z, sdr, z_at, sd_at, zsd = agreement(sc, ref_sc)
            zs, sds, zsds = f"{z:.2f} ({z_at})", f"{sdr:.3f} ({sd_at})", f"{zsd:.2f}"
        else:
            z = sdr = None
            zs = sds = zsds = "ref" if r.sampler == "nutpie" else "n/a"
        stats[r.sampler] = dict(bulk=bulk, tail=tail, rhat=rhat, ess_s=ess_s,
                                ess_s_all=ess_s_all, rows=rows, rows_all=rows_all, z=z, sdr=sdr)
        lines.append(
            f"| {r.sampler} | {bulk:,.0f} | {tail:,.0f} | {rhat:.3f} | {r.setup_s:.1f} "
            f"| {r.sampling_s:.1f} | {ess_s:.3g} | {ess_s_all:.3g} | {fmt(rows)} "
            f"| {fmt(rows_all)} | {zs} | {sds} | {zsds} |")
    lines.append("")
    lines += [f"- {r.sampler}: {r.note}" for r in results if r.note]
    return lines, stats


def target_for(cfg):
    key = (cfg.kind, cfg.n, None if cfg.kind == "hier" else cfg.d)
    return RATIO_TARGETS.get(key)


def summary(all_stats: dict) -> list[str]:
    lines = ["## Summary (this package against nutpie, set-up included on both sides)", "",
             "| configuration | ESS/s ratio | target | ratio met | accuracy (3 MCSE, 5 %) "
             "| R-hat < 1.01 | rows/ESS after set-up |",
             "| --- | ---: | ---: | --- | --- | --- | ---: |"]
    checks = []
    for cfg, st in all_stats.items():
        p, nu = st.get("package"), st.get("nutpie")
        if p is None:
            continue
        ratio = p["ess_s_all"] / nu["ess_s_all"] if nu else None
        target = target_for(cfg)
        met = "n/a" if ratio is None or target is None else ("met" if ratio >= target
                                                             else "NOT met")
        acc = ("n/a" if p["z"] is None else
               ("met" if p["z"] <= 3.0 and p["sdr"] <= 0.05 else "NOT met"))
        rhat = "met" if p["rhat"] < 1.01 else "NOT met"
        lines.append(f"| {cfg.label} | {fmt(ratio, '.1f')} | {fmt(target, '.0f')} | {met} "
                     f"| {acc} | {rhat} | {fmt(p['rows'])} |")
        if met != "n/a":
            checks.append(met == "met")
        if acc != "n/a":
            checks.append(acc == "met")
        if cfg.kind == "hier":
            checks.append(rhat == "met")
    # rows per ESS flat in N, per d (logistic)
    lines.append("")
    by_d: dict[int, list] = {}
    for cfg, st in all_stats.items():
        if cfg.kind == "logistic" and st.get("package") and st["package"]["rows"]:
            by_d.setdefault(cfg.d, []).append((cfg.n, st["package"]["rows"]))
    for d, pts in sorted(by_d.items()):
        if len(pts) < 2:
            continue
        vals = [v for _, v in sorted(pts)]
        spread = max(vals) / min(vals)
        ok = spread <= 2.0
        checks.append(ok)
        lines.append(f"- rows/ESS after set-up, d = {d}, N = "
                     + ", ".join(f"{n:.0e}: {v:,.0f}" for n, v in sorted(pts))
                     + f": max/min {spread:.2f} ({'met' if ok else 'NOT met'}, target ≤ 2)")
    lines.append("")
    lines.append(f"Targets checked: {sum(checks)} of {len(checks)} met.")
    return lines


# --------------------------------------------------------------------------- main
def available(skip: set[str]) -> dict[str, str]:
    """Sampler -> reason it is skipped."""
    reasons = {s: "--skip" for s in skip}
    if "nutpie" not in reasons:
        try:
            import nutpie  # noqa: F401
        except Exception as err:  # noqa: BLE001 - ImportError, or a broken binary; printed
            reasons["nutpie"] = f"cannot import nutpie ({type(err).__name__}: {err}); " \
                                "pip install 'pymc-minibatch-mh[bench]'"
    if "hmcecs" not in reasons:
        try:
            import jax  # noqa: F401
            import numpyro  # noqa: F401
        except Exception as err:  # noqa: BLE001 - ImportError, or a broken binary; printed
            reasons["hmcecs"] = f"cannot import numpyro/jax ({type(err).__name__}: {err}); " \
                                "pip install 'pymc-minibatch-mh[bench]'"
    return reasons


def main(argv=None):
    args = parse_args(argv)
    skipped = available(args.skip)
    for s, why in skipped.items():
        print(f"skipping {s}: {why}")
    out_lines = [f"# Tall GLM benchmark (PyMC {pm.__version__}, chains {args.chains}, "
                 f"one after another)", ""]
    all_stats = {}
    for cfg in args.configs:
        dtype = design_dtype(cfg, args.dtype)
        print(f"\n=== {cfg.label}: generating data ({np.dtype(dtype).name} design)", flush=True)
        t0 = time.perf_counter()
        data = make_data(cfg, args.seed, dtype)
        model = make_pymc_model(cfg, data)
        print(f"  data and model: {time.perf_counter() - t0:.1f} s", flush=True)
        results = []
        for sampler in SAMPLERS:
            if sampler in skipped:
                continue
            print(f"  running {sampler} ...", flush=True)
            try:
                if sampler == "nutpie":
                    r = run_nutpie(cfg, model, args)
                elif sampler == "hmcecs":
                    r = run_hmcecs(cfg, data, args)
                else:
                    r = run_package(cfg, model, args)
            except Exception as err:  # noqa: BLE001 - printed; the other samplers still run
                print(f"  {sampler} FAILED: {type(err).__name__}: {err}")
                traceback.print_exc(limit=3)
                continue
            print(f"  {sampler}: set-up {r.setup_s:.1f} s, sampling {r.sampling_s:.1f} s",
                  flush=True)
            results.append(r)
            gc.collect()
        ref = next((r for r in results if r.sampler == "nutpie"), None)
        ref_sc = None if ref is None else scalars(ref.draws, free_names(cfg))
        lines, stats = config_table(cfg, results, dtype, ref_sc)
        print("\n".join(lines), flush=True)
        out_lines += lines + [""]
        all_stats[cfg] = stats
        del data, model, results, ref, ref_sc
        gc.collect()
    lines = summary(all_stats)
    print("\n".join(lines))
    out_lines += lines
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tall_glm.md").write_text("\n".join(out_lines) + "\n")
    return all_stats


if __name__ == "__main__":
    main()
