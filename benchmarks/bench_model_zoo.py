"""Benchmark: a model zoo, the zero-config step against nutpie, and where the set-up goes.

Nine model families on generated data (fixed seeds, no downloads), each written as a new
PyMC user would write it:

- ``poisson``: counts, log link, an exposure offset (4 covariates);
- ``normal``: a continuous outcome with unknown σ (4 covariates);
- ``studentt``: heavy-tailed errors (true ν = 4) with unknown ν ~ Gamma(2, 0.1);
- ``negbin``: overdispersed counts (true α = 2) with unknown α;
- ``logistic``: binary, 10 covariates and the outcome in ``pm.Data``;
- ``random_intercepts``: logistic, 20 groups, non-centred intercepts;
- ``ordered``: ordered logistic, 11 levels (10 cut points, PyMC's ``ordered`` transform);
- ``categorical``: softmax regression, 5 classes (class 0 the reference);
- ``crossed``: logistic with crossed non-centred random intercepts, 16 levels and 200
  levels whose sizes follow a power law down to 1 row (:func:`tail_sizes`).

In one process, family after family: this package's zero-config step
``MinibatchBarker(control_variate="taylor")`` with PyMC's defaults
(``pm.sample(step=step, chains=2, cores=1)``, default draws and tuning), then nutpie
(``nutpie.compile_pymc_model(model, backend="numba")``, ``nutpie.sample(compiled,
chains=2, cores=1)``, its default draws unless ``--nutpie-draws``/``--nutpie-tune``).
Set-up is building the step (package) and the compilation (nutpie); sampling is the
``pm.sample`` / ``nutpie.sample`` call (for the package this includes the per-chain start
check and any just-in-time compilation left for the first step). Columns: min bulk and
tail ESS and max R-hat over every scalar of every free variable (helpers of
``bench_tall_glm.py``), ESS/s with the set-up and its ratio to nutpie's, the largest
|Δmean| / combined MCSE and |sd ratio − 1| against nutpie, and the package's mean rows
evaluated per draw (``batch_size`` + ``extra_evaluations``, summed over a draw's
transitions, averaged over the kept draws).

``--proposals auto,crank_nicolson`` runs the package once per ``proposal=`` setting (rows
"package" for the zero-config step and "package, <name>"), each against the same nutpie run.

``--profile`` adds a second table: where the step's construction time goes, measured from
the benchmark side only (nothing in the package is changed). Time is split exclusively
(a region's time minus that of the regions inside it) into PyTensor graph rewriting
(``FunctionMaker.prepare_fgraph``), linking (``FunctionMaker.create``: C compilation or the
Numba conversion), Numba JIT compilation (Numba's ``numba:compile`` events), the graph
split (``split_model``), the split's validation (``validate_split``), the Taylor
estimator's MAP search (``TaylorPasses.find_map`` without its passes and compilations), its
full passes (``_full_pass`` / ``PredictorPasses.sums``), the proposal, and the rest. A
third table lists every PyTensor function compiled during construction with its call site,
backend and seconds. ``--setup-only`` builds the steps without sampling (a quick profile;
run it twice to see warm caches). ``--cprofile DIR`` also writes a cProfile of each
construction. "Numba will use object mode" warnings are caught per family and listed.

Run (from the repository root; the peers come with the package's ``bench`` extra)::

    bash scripts/setup_env.sh python3 .venv-bench bench
    OPENBLAS_NUM_THREADS=1 .venv-bench/bin/python benchmarks/bench_model_zoo.py --profile
    .venv-bench/bin/python benchmarks/bench_model_zoo.py --n 1e6 --nutpie-draws 300 \\
        --nutpie-tune 300 --families poisson,logistic

Tables are printed and written to ``benchmarks/output/model_zoo_<N>.md``.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import io
import math
import pstats
import sys
import time
import traceback
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
from bench_tall_glm import agreement, available, ess_rhat, fmt, scalars
from scipy.special import expit, softmax

from pymc_minibatch_mh import MinibatchBarker
from pymc_minibatch_mh.model.compat import group, posterior, sample_stats

OUT = Path(__file__).resolve().parent / "output"
FAMILIES = ("poisson", "normal", "studentt", "negbin", "logistic", "random_intercepts",
            "ordered", "categorical", "crossed")
CROSSED_LEVELS = (16, 200)


# --------------------------------------------------------------------------- data, models
def tail_sizes(n: int, levels: int) -> np.ndarray:
    """Group sizes ``∝ k^-a`` summing to ``n``, ``a`` chosen so the smallest is 1 row."""
    k = np.arange(1, levels + 1, dtype=float)
    lo, hi = 0.0, 10.0
    for _ in range(60):  # bisection: the last group's share is 1/n
        a = 0.5 * (lo + hi)
        w = k ** -a
        if n * w[-1] / w.sum() > 1.0:
            lo = a
        else:
            hi = a
    w = k ** -hi
    sizes = np.maximum(1, np.floor(n * w / w.sum())).astype(np.int64)
    sizes[0] += n - sizes.sum()
    return sizes


def family_rng(family: str, seed: int) -> np.random.Generator:
    """The generator of a family's data (:func:`make_model`)."""
    return np.random.default_rng([seed, FAMILIES.index(family)])


def crossed_data(n: int, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """The crossed family's data: ``g1``, ``g2`` (levels), ``x`` (n × 3) and ``y``."""
    l1, l2 = CROSSED_LEVELS
    g1 = rng.integers(l1, size=n)
    g2 = rng.permutation(np.repeat(np.arange(l2), tail_sizes(n, l2)))
    x = rng.normal(size=(n, 3))
    a1, a2 = 0.5 * rng.normal(size=l1), 0.8 * rng.normal(size=l2)
    eta = -0.3 + a1[g1] + a2[g2] + x @ np.array([0.5, -0.5, 0.25])
    y = (rng.random(n) < expit(eta)).astype(np.int64)
    return g1, g2, x, y


def make_model(family: str, n: int, seed: int) -> pm.Model:
    """Seeded data and the model a new user would write for them."""
    rng = family_rng(family, seed)
    if family == "poisson":
        x = rng.normal(0.0, 0.5, size=(n, 4))
        exposure = rng.gamma(2.0, 1.0, size=n)
        y = rng.poisson(exposure * np.exp(0.5 + x @ np.array([0.3, -0.2, 0.1, 0.4])))
        with pm.Model() as model:
            intercept = pm.Normal("intercept", 0.0, 2.5)
            b = pm.Normal("b", 0.0, 1.0, shape=4)
            mu = pm.math.exp(intercept + pm.math.dot(x, b) + np.log(exposure))
            pm.Poisson("y", mu=mu, observed=y)
    elif family == "normal":
        x = rng.normal(size=(n, 4))
        y = 1.0 + x @ np.array([0.5, -0.3, 0.2, 0.0]) + 1.5 * rng.normal(size=n)
        with pm.Model() as model:
            intercept = pm.Normal("intercept", 0.0, 10.0)
            b = pm.Normal("b", 0.0, 1.0, shape=4)
            sigma = pm.HalfNormal("sigma", 5.0)
            pm.Normal("y", mu=intercept + pm.math.dot(x, b), sigma=sigma, observed=y)
    elif family == "studentt":
        x = rng.normal(size=(n, 4))
        y = 1.0 + x @ np.array([0.5, -0.3, 0.2, 0.0]) + rng.standard_t(4.0, size=n)
        with pm.Model() as model:
            intercept = pm.Normal("intercept", 0.0, 10.0)
            b = pm.Normal("b", 0.0, 1.0, shape=4)
            sigma = pm.HalfNormal("sigma", 5.0)
            nu = pm.Gamma("nu", alpha=2.0, beta=0.1)
            pm.StudentT("y", nu=nu, mu=intercept + pm.math.dot(x, b), sigma=sigma,
                        observed=y)
    elif family == "negbin":
        x = rng.normal(0.0, 0.5, size=(n, 4))
        mu = np.exp(1.0 + x @ np.array([0.3, -0.2, 0.1, 0.4]))
        alpha = 2.0
        y = rng.negative_binomial(alpha, alpha / (alpha + mu))
        with pm.Model() as model:
            intercept = pm.Normal("intercept", 0.0, 2.5)
            b = pm.Normal("b", 0.0, 1.0, shape=4)
            alpha_ = pm.HalfNormal("alpha", 5.0)
            pm.NegativeBinomial("y", mu=pm.math.exp(intercept + pm.math.dot(x, b)),
                                alpha=alpha_, observed=y)
    elif family == "logistic":
        x = rng.normal(size=(n, 10))
        beta = rng.normal(0.0, 1.5 / math.sqrt(10), size=10)
        y = (rng.random(n) < expit(-0.5 + x @ beta)).astype(np.int64)
        with pm.Model() as model:
            x_data = pm.Data("X", x)
            y_data = pm.Data("y_obs", y)
            intercept = pm.Normal("intercept", 0.0, 2.5)
            b = pm.Normal("b", 0.0, 1.0, shape=10)
            pm.Bernoulli("y", logit_p=intercept + pm.math.dot(x_data, b), observed=y_data)
    elif family == "random_intercepts":
        groups = 20
        g = rng.integers(groups, size=n)
        x = rng.normal(size=(n, 3))
        a = 0.3 + 0.7 * rng.normal(size=groups)
        y = (rng.random(n) < expit(a[g] + x @ np.array([0.5, -0.5, 0.25]))).astype(np.int64)
        with pm.Model(coords={"group": np.arange(groups)}) as model:
            mu_a = pm.Normal("mu_a", 0.0, 2.5)
            sigma_a = pm.HalfNormal("sigma_a", 1.0)
            z = pm.Normal("z", 0.0, 1.0, dims="group")
            b = pm.Normal("b", 0.0, 1.0, shape=3)
            a_ = mu_a + sigma_a * z
            pm.Bernoulli("y", logit_p=a_[g] + pm.math.dot(x, b), observed=y)
    elif family == "ordered":
        x = rng.normal(size=(n, 3))
        cut = np.linspace(-3.0, 3.0, 10)
        latent = x @ np.array([0.8, -0.5, 0.3]) + rng.logistic(size=n)
        y = (latent[:, None] > cut).sum(axis=1)
        with pm.Model() as model:
            b = pm.Normal("b", 0.0, 2.5, shape=3)
            cutpoints = pm.Normal("cutpoints", mu=np.linspace(-2.0, 2.0, 10), sigma=5.0,
                                  shape=10, transform=pm.distributions.transforms.ordered)
            # compute_p=False: the default stores an N × 11 Deterministic per draw.
            pm.OrderedLogistic("y", eta=pm.math.dot(x, b), cutpoints=cutpoints,
                               observed=y, compute_p=False)
    elif family == "categorical":
        classes, d = 5, 4
        x = rng.normal(size=(n, d))
        coef = np.column_stack([np.zeros(d), rng.normal(0.0, 0.7, size=(d, classes - 1))])
        icpt = np.concatenate([[0.0], rng.normal(0.0, 0.5, size=classes - 1)])
        p = softmax(icpt + x @ coef, axis=1)
        y = (rng.random(n)[:, None] > np.cumsum(p, axis=1)).sum(axis=1).clip(0, classes - 1)
        with pm.Model() as model:
            alpha = pm.Normal("alpha", 0.0, 2.5, shape=classes - 1)
            beta = pm.Normal("beta", 0.0, 1.0, shape=(d, classes - 1))
            eta = alpha + pm.math.dot(x, beta)
            # Class 0 is the reference. Written with pt.zeros((n, 1)) (a constant of the
            # data's length) the step refuses the model: the split cannot slice it.
            logits = pt.concatenate([pt.zeros_like(eta[:, :1]), eta], axis=1)
            pm.Categorical("y", p=pm.math.softmax(logits, axis=-1), observed=y)
    elif family == "crossed":
        l1, l2 = CROSSED_LEVELS
        g1, g2, x, y = crossed_data(n, rng)
        with pm.Model(coords={"g1": np.arange(l1), "g2": np.arange(l2)}) as model:
            mu = pm.Normal("mu", 0.0, 2.5)
            sigma_1 = pm.HalfNormal("sigma_1", 1.0)
            sigma_2 = pm.HalfNormal("sigma_2", 1.0)
            z_1 = pm.Normal("z_1", 0.0, 1.0, dims="g1")
            z_2 = pm.Normal("z_2", 0.0, 1.0, dims="g2")
            b = pm.Normal("b", 0.0, 1.0, shape=3)
            eta_ = mu + sigma_1 * z_1[g1] + sigma_2 * z_2[g2] + pm.math.dot(x, b)
            pm.Bernoulli("y", logit_p=eta_, observed=y)
    else:  # pragma: no cover - parse_args checks
        raise ValueError(family)
    return model


def free_names(model: pm.Model) -> list[str]:
    return [rv.name for rv in model.free_RVs]


# --------------------------------------------------------------------------- set-up profile
@dataclass
class Compiled:
    site: str
    backend: str
    rewrite_s: float = 0.0
    link_s: float = 0.0
    jit_s: float = 0.0
    phase: str = "construction"


@dataclass
class Profile:
    """Exclusive seconds per region and the PyTensor functions compiled, per phase."""

    exclusive: dict = field(default_factory=lambda: defaultdict(float))
    counts: dict = field(default_factory=lambda: defaultdict(int))
    functions: list = field(default_factory=list)
    phase: str = "construction"


class SetupProfiler:
    """Wraps PyTensor's, Numba's and the package's set-up functions (this process only).

    Regions nest; each records its time minus that of the regions inside it, so the
    exclusive times of a phase add up to the phase's wall time ("other" is the rest).
    """

    def __init__(self) -> None:
        # [label, start, child seconds, Compiled or None, Numba dispatcher or None]
        self.stack: list[list] = []
        self.profile: Profile | None = None
        self.by_dispatcher: dict[int, Compiled] = {}
        self._installed = False

    # ---- regions
    def enter(self, label: str, record: Compiled | None = None, dispatcher=None) -> None:
        self.stack.append([label, time.perf_counter(), 0.0, record, dispatcher])

    def leave(self) -> float:
        label, start, child, record, _ = self.stack.pop()
        total = time.perf_counter() - start
        if self.profile is not None:
            self.profile.exclusive[label] += total - child
            self.profile.counts[label] += 1
        if self.stack:
            self.stack[-1][2] += total
        if record is not None:
            if label == "rewrite":
                record.rewrite_s += total
            elif label == "link":
                record.link_s += total - child
        return total

    def wrap(self, owner, name: str, label: str, static: bool = False) -> None:
        original = owner.__dict__[name] if static else getattr(owner, name)
        inner = original.__func__ if static else original
        profiler = self

        @functools.wraps(inner)
        def wrapper(*args, **kwargs):
            profiler.enter(label)
            try:
                return inner(*args, **kwargs)
            finally:
                profiler.leave()

        setattr(owner, name, staticmethod(wrapper) if static else wrapper)

    # ---- installation
    def install(self) -> None:
        if self._installed:
            return
        self._installed = True
        from numba.core import event
        from pytensor.compile.function.types import FunctionMaker

        import pymc_minibatch_mh.model.likelihood as likelihood
        import pymc_minibatch_mh.transition.step as step
        from pymc_minibatch_mh.estimators import (
            predictor_analysis,
            predictor_passes,
            reference,
            registry,
        )
        from pymc_minibatch_mh.estimators.predictor_passes import PredictorPasses
        from pymc_minibatch_mh.estimators.reference import TaylorPasses

        profiler = self
        maker_init, maker_create = FunctionMaker.__init__, FunctionMaker.create
        prepare = FunctionMaker.__dict__["prepare_fgraph"].__func__

        def init(self_, inputs, outputs, mode=None, *args, **kwargs):
            record = Compiled(call_site(), backend_of(mode), phase=profiler.phase())
            self_._zoo_record = record
            if profiler.profile is not None:
                profiler.profile.functions.append(record)
            profiler._current = record
            profiler.enter("compile (other)")
            try:
                return maker_init(self_, inputs, outputs, mode, *args, **kwargs)
            finally:
                profiler.leave()

        def prepare_fgraph(*args, **kwargs):
            profiler.enter("rewrite", getattr(profiler, "_current", None))
            try:
                return prepare(*args, **kwargs)
            finally:
                profiler.leave()

        def create(self_, *args, **kwargs):
            record = getattr(self_, "_zoo_record", None)
            profiler.enter("link", record)
            try:
                fn = maker_create(self_, *args, **kwargs)
            finally:
                profiler.leave()
            jit = getattr(getattr(fn, "vm", None), "jit_fn", None)
            if jit is not None and record is not None:
                profiler.by_dispatcher[id(jit)] = record
            return fn

        FunctionMaker.__init__ = init
        FunctionMaker.prepare_fgraph = staticmethod(prepare_fgraph)
        FunctionMaker.create = create

        class JitListener(event.Listener):
            def on_start(self_, ev):
                profiler.enter("numba JIT", dispatcher=(ev.data or {}).get("dispatcher"))

            def on_end(self_, ev):
                dispatcher = profiler.stack[-1][4]
                total = profiler.leave()
                # Helpers compiled inside a graph's JIT are not mapped: no double count.
                record = profiler.by_dispatcher.get(id(dispatcher))
                if record is not None:
                    record.jit_s += total

        event.register("numba:compile", JitListener())

        # pfunc: cloning the graphs and the shared variables before FunctionMaker.
        self.wrap(sys.modules["pytensor.compile.function"], "pfunc", "compile (other)")
        # Gradient graphs (symbolic differentiation, before any compilation).
        import pytensor.gradient

        for module in (pytensor.gradient, reference, predictor_passes, predictor_analysis):
            self.wrap(module, "grad", "gradient graphs")
        self.wrap(likelihood, "split_model", "graph split")
        self.wrap(likelihood, "make_store", "row store")
        self.wrap(likelihood, "validate_split", "checks")
        self.wrap(likelihood.MinibatchLikelihood, "check_point", "start checks")
        self.wrap(registry, "select", "predictor analysis")
        self.wrap(predictor_passes, "rewrite_graph", "rewrite_graph")
        self.wrap(step, "make_estimator", "estimator (other)")
        self.wrap(TaylorPasses, "find_map", "MAP search")
        self.wrap(TaylorPasses, "_full_pass", "full passes")
        self.wrap(PredictorPasses, "sums", "full passes")
        self.wrap(step, "make_proposal", "proposal")

    def phase(self) -> str:
        return "construction" if self.profile is None else self.profile.phase

    def run(self, profile: Profile, phase: str, fn, *args, **kwargs):
        """Run ``fn`` as one phase of ``profile`` and return its result."""
        self.profile, profile.phase = profile, phase
        self.enter("other")
        try:
            return fn(*args, **kwargs)
        finally:
            self.leave()
            self.profile = None


def call_site() -> str:
    """Where a function is compiled: the caller outside PyTensor, then the package's lines.

    E.g. ``pymc/initial_point.py:… ← model/likelihood.py:93 __init__``; a package helper
    that only compiles (``compile``, ``_compile_fn``) is followed by its caller.
    """
    frame = sys._getframe(2)
    parts: list[str] = []
    while frame is not None and len(parts) < 3:
        path = frame.f_code.co_filename
        name = frame.f_code.co_name
        if "pymc_minibatch_mh" in path:
            parts.append(f"{path.split('pymc_minibatch_mh/')[-1]}:{frame.f_lineno} {name}")
            if name not in ("compile", "_compile_fn", "<lambda>") and len(parts) >= 1:
                break
        elif not parts and "/pytensor/" not in path and "functools" not in path \
                and "bench_model_zoo" not in path:
            parts.append(f"{Path(path).parent.name}/{Path(path).name}:{frame.f_lineno} {name}")
        frame = frame.f_back
    return " ← ".join(parts) or "?"


def backend_of(mode) -> str:
    from pytensor.compile.mode import get_mode

    try:
        m = get_mode(mode)
    except Exception:  # noqa: BLE001 - a label only
        return str(mode)
    linker = type(m.linker).__name__.replace("Linker", "")
    name = "C" if linker in ("VM", "CVM") and getattr(m.linker, "c_thunks", True) else linker
    if linker in ("VM", "CVM") and not getattr(m.linker, "c_thunks", True):
        name = "Python VM"
    opt = getattr(m, "provided_optimizer", None)
    return f"{name} ({opt})" if isinstance(opt, str) else name


PROFILER = SetupProfiler()
PROFILE_COLUMNS = ("rewrite", "rewrite_graph", "link", "numba JIT", "compile (other)",
                   "gradient graphs", "graph split", "checks", "predictor analysis",
                   "MAP search", "full passes", "proposal", "estimator (other)", "row store",
                   "other")


# --------------------------------------------------------------------------- runs
@dataclass
class Run:
    family: str
    sampler: str
    setup_s: float
    sampling_s: float = math.nan
    draws: dict | None = None
    rows_per_draw: float | None = None
    note: str = ""
    profile: Profile | None = None
    sample_profile: Profile | None = None
    passes: float | None = None
    warnings: list = field(default_factory=list)


def build_step(model: pm.Model, proposal: str = "auto") -> MinibatchBarker:
    """The package's step; ``proposal`` may end in ``:m`` for a fixed ``batch_size=m``
    and in ``@test`` for ``acceptance=test`` (e.g. ``auto@barker``)."""
    proposal, _, acceptance = proposal.partition("@")
    name, _, rows = proposal.partition(":")
    kwargs = {"batch_size": int(rows)} if rows else {}
    if acceptance:
        kwargs["acceptance"] = acceptance
    with model:
        return MinibatchBarker(control_variate="taylor", proposal=name, **kwargs)


def package_name(proposal: str) -> str:
    """The sampler column of the package with ``proposal`` ("package" for zero-config)."""
    return "package" if proposal == "auto" else f"package, {proposal}"


def run_package(family: str, model: pm.Model, args, proposal: str = "auto") -> Run:
    profile = Profile() if args.profile else None
    cprof = cProfile.Profile() if args.cprofile else None
    start = time.perf_counter()
    if cprof is not None:
        cprof.enable()
    if profile is not None:
        step = PROFILER.run(profile, "construction", build_step, model, proposal)
    else:
        step = build_step(model, proposal)
    if cprof is not None:
        cprof.disable()
        args.cprofile.mkdir(parents=True, exist_ok=True)
        cprof.dump_stats(args.cprofile / f"setup_{family}.prof")
        buf = io.StringIO()
        pstats.Stats(cprof, stream=buf).sort_stats("cumulative").print_stats(12)
        print(buf.getvalue())
    setup = time.perf_counter() - start
    run = Run(family, package_name(proposal), setup, profile=profile,
              passes=float(getattr(step, "setup_passes", math.nan)),
              note=f"proposal {step.proposal.name!r}, {step.steps_per_draw} transition(s) "
                   f"per draw, batch_size {step.batch_size}")
    if args.setup_only:
        return run
    sample_profile = Profile() if args.profile else None

    def sample():
        with model:
            return pm.sample(step=step, chains=args.chains, cores=1, random_seed=args.seed,
                             progressbar=False)

    start = time.perf_counter()
    if sample_profile is not None:
        idata = PROFILER.run(sample_profile, "pm.sample", sample)
    else:
        idata = sample()
    run.sampling_s = time.perf_counter() - start
    run.sample_profile = sample_profile
    ss = sample_stats(idata)
    rows = np.asarray(ss["batch_size"], dtype=float) + np.asarray(ss["extra_evaluations"])
    run.rows_per_draw = float(rows.mean())
    # The test, its σ and the transitions per draw may change during tuning: the last
    # chain's, and each draw's σ.
    run.note = (f"proposal {step.proposal.name!r}, {step.steps_per_draw} transition(s) per "
                f"draw when sampling, batch_size {step.batch_size}")
    if "rows_per_round" in ss:
        run.note += (", rows per round when sampling "
                     f"{sorted(set(np.asarray(ss['rows_per_round']).ravel().tolist()))}")
    if "test_sigma" in ss:
        run.note += (", test σ when sampling "
                     f"{sorted(set(np.asarray(ss['test_sigma']).ravel().tolist()))}")
    post = posterior(idata)
    run.draws = {k: np.asarray(post[k]) for k in free_names(model)}
    return run


def run_nutpie(family: str, model: pm.Model, args) -> Run:
    import nutpie

    start = time.perf_counter()
    compiled = nutpie.compile_pymc_model(model, backend="numba")
    setup = time.perf_counter() - start
    kwargs = {}
    if args.nutpie_draws is not None:
        kwargs["draws"] = args.nutpie_draws
    if args.nutpie_tune is not None:
        kwargs["tune"] = args.nutpie_tune
    start = time.perf_counter()
    trace = nutpie.sample(compiled, chains=args.chains, cores=1, seed=args.seed,
                          progress_bar=False, **kwargs)
    sampling = time.perf_counter() - start
    post = posterior(trace)
    draws = {k: np.asarray(post[k]) for k in free_names(model)}
    steps = np.asarray(group(trace, "sample_stats")["n_steps"], dtype=float)
    shape = next(iter(draws.values())).shape[:2]
    return Run(family, "nutpie", setup, sampling, draws,
               note=f"{shape[1]} draws per chain ({'defaults' if not kwargs else kwargs}); "
                    f"{steps.mean():.1f} leapfrog steps per draw")


def run_family(family: str, args, skipped: dict) -> tuple[list[Run], list[str]]:
    t0 = time.perf_counter()
    model = make_model(family, args.n, args.seed)
    print(f"\n=== {family}, N = {args.n:,}: model in {time.perf_counter() - t0:.1f} s",
          flush=True)
    runs = []
    samplers = [package_name(p) for p in args.proposals] + (
        [] if "nutpie" in skipped or args.setup_only else ["nutpie"])
    for sampler, proposal in zip(samplers, [*args.proposals, None], strict=False):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            warnings.filterwarnings("ignore", category=DeprecationWarning)
            warnings.filterwarnings("ignore", category=FutureWarning)
            try:
                run = (run_nutpie(family, model, args) if sampler == "nutpie"
                       else run_package(family, model, args, proposal))
            except Exception as err:  # noqa: BLE001 - report and go on
                print(f"  {sampler} FAILED: {type(err).__name__}: {err}")
                traceback.print_exc(limit=4)
                continue
        seen = []
        for w in caught:
            text = f"{w.category.__name__}: {w.message}"
            if text not in seen:
                seen.append(text)
        run.warnings = seen
        for text in seen:
            print(f"  [{sampler} warning] {text[:300]}")
        print(f"  {sampler}: set-up {run.setup_s:.1f} s, sampling {run.sampling_s:.1f} s"
              + (f"; {run.note}" if run.note else ""), flush=True)
        runs.append(run)
    return runs, free_names(model)


# --------------------------------------------------------------------------- tables
def zoo_table(all_runs: dict, names: dict) -> list[str]:
    lines = ["| family | sampler | set-up s | sampling s | min bulk ESS | min tail ESS "
             "| max R-hat | ESS/s incl. set-up | × nutpie | max abs Δmean/MCSE "
             "| max abs(sd ratio − 1) | rows per draw |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for family, runs in all_runs.items():
        ref = next((r for r in runs if r.sampler == "nutpie" and r.draws), None)
        ref_sc = None if ref is None else scalars(ref.draws, names[family])
        rates = {}
        rows_out = []
        for r in runs:
            if not r.draws:
                continue
            sc = scalars(r.draws, names[family])
            bulk, tail, rhat = ess_rhat(sc)
            rate = bulk / (r.setup_s + r.sampling_s)
            rates[r.sampler] = rate
            if r.sampler.startswith("package") and ref_sc is not None:
                z, sdr, z_at, sd_at, _ = agreement(sc, ref_sc)
                zs, sds = f"{z:.2f} ({z_at})", f"{sdr:.3f} ({sd_at})"
            else:
                zs = sds = "ref" if r.sampler == "nutpie" else "n/a"
            rows_out.append((r, bulk, tail, rhat, rate, zs, sds))
        for r, bulk, tail, rhat, rate, zs, sds in rows_out:
            ratio = (rates[r.sampler] / rates["nutpie"]
                     if r.sampler.startswith("package") and "nutpie" in rates else None)
            lines.append(
                f"| {family} | {r.sampler} | {r.setup_s:.1f} | {r.sampling_s:.1f} "
                f"| {bulk:,.0f} | {tail:,.0f} | {rhat:.3f} | {rate:.3g} "
                f"| {fmt(ratio, '.2f')} | {zs} | {sds} "
                f"| {fmt(r.rows_per_draw) if r.sampler.startswith('package') else ''} |")
    return lines


def profile_tables(all_runs: dict) -> list[str]:
    head = ["| family | construction s | functions (backend: n) | passes |"
            + "".join(f" {c} |" for c in PROFILE_COLUMNS)
            + " pm.sample: compile / JIT / start checks s |",
            "| --- | ---: | --- | ---: |" + " ---: |" * len(PROFILE_COLUMNS) + " --- |"]
    detail = ["| family | phase | call site | backend | rewrite s | link s | Numba JIT s |",
              "| --- | --- | --- | --- | ---: | ---: | ---: |"]
    for family, runs in all_runs.items():
        r = next((r for r in runs if r.sampler == "package"), None)
        if r is None or r.profile is None:
            continue
        p = r.profile
        backends = defaultdict(int)
        for f in p.functions:
            backends[f.backend] += 1
        kinds = ", ".join(f"{k}: {v}" for k, v in sorted(backends.items()))
        cells = "".join(f" {p.exclusive.get(c, 0.0):.2f} |" for c in PROFILE_COLUMNS)
        sp = r.sample_profile
        if sp is not None:
            comp = sp.exclusive.get("rewrite", 0.0) + sp.exclusive.get("link", 0.0)
            tail = (f" {comp:.2f} ({len(sp.functions)} fns) / "
                    f"{sp.exclusive.get('numba JIT', 0.0):.2f} / "
                    f"{sp.exclusive.get('start checks', 0.0):.2f} |")
        else:
            tail = " n/a |"
        head.append(f"| {family} | {r.setup_s:.1f} | {len(p.functions)} ({kinds}) "
                    f"| {fmt(r.passes, '.2f')} |{cells}{tail}")
        for prof in (p, sp):
            if prof is None:
                continue
            for f in prof.functions:
                detail.append(f"| {family} | {f.phase} | `{f.site}` | {f.backend} "
                              f"| {f.rewrite_s:.2f} | {f.link_s:.2f} | {f.jit_s:.2f} |")
    return head + ["", "Every PyTensor function compiled (Numba JIT: compile events of its "
                   "jitted graph, wherever they happened):", ""] + detail


def warning_lines(all_runs: dict) -> list[str]:
    lines = []
    for family, runs in all_runs.items():
        for r in runs:
            hits = [w for w in r.warnings if "object mode" in w]
            others = [w for w in r.warnings if "object mode" not in w]
            if hits:
                lines.append(f"- {family} ({r.sampler}): " + "; ".join(h[:200] for h in hits))
            if others and r.sampler == "package":
                lines.append(f"- {family} ({r.sampler}), other warnings: "
                             + "; ".join(o[:160] for o in others[:3]))
    return lines or ["- none"]


# --------------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=float, default=3e4, help="rows per data set (3e4; 1e6)")
    p.add_argument("--families", default=",".join(FAMILIES),
                   help=f"comma-separated subset of {','.join(FAMILIES)}")
    p.add_argument("--nutpie-draws", type=int, default=None,
                   help="draws per chain for nutpie (default: nutpie's own)")
    p.add_argument("--nutpie-tune", type=int, default=None,
                   help="tuning draws per chain for nutpie (default: nutpie's own)")
    p.add_argument("--skip-nutpie", action="store_true", help="run this package only")
    p.add_argument("--profile", action="store_true",
                   help="also profile the step's construction (second and third tables)")
    p.add_argument("--setup-only", action="store_true",
                   help="build the steps only (no sampling, no nutpie); use with --profile")
    p.add_argument("--cprofile", type=Path, default=None,
                   help="write a cProfile of each step construction into this folder")
    p.add_argument("--proposals", default="auto",
                   help="comma-separated proposal= settings of the package's step, each run "
                        "(default: auto, the zero-config step; e.g. auto,crank_nicolson); "
                        "name:m also fixes batch_size=m (e.g. auto,auto:100), name@test "
                        "the acceptance function (e.g. auto,auto@barker)")
    p.add_argument("--chains", type=int, default=2, help="chains, one after another")
    p.add_argument("--seed", type=int, default=2017)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    args.n = int(args.n)
    args.families = [f.strip() for f in args.families.split(",") if f.strip()]
    args.proposals = [q.strip() for q in args.proposals.split(",") if q.strip()]
    unknown = set(args.families) - set(FAMILIES)
    if unknown:
        p.error(f"--families: unknown {sorted(unknown)}; choose from {FAMILIES}")
    if args.n < 1000:
        p.error("--n: use at least 1000 rows")
    return args


def main(argv=None):
    args = parse_args(argv)
    skipped = available({"hmcecs"} | ({"nutpie"} if args.skip_nutpie else set()))
    if "nutpie" in skipped and not args.setup_only:
        print(f"skipping nutpie: {skipped['nutpie']}")
    if args.profile:
        PROFILER.install()
    all_runs, names = {}, {}
    wall = time.perf_counter()
    for family in args.families:
        all_runs[family], names[family] = run_family(family, args, skipped)
    title = (f"# Model zoo, N = {args.n:,} (PyMC {pm.__version__}, PyTensor "
             f"{pytensor.__version__}, chains {args.chains} one after another)")
    out = [title, ""]
    if not args.setup_only:
        out += zoo_table(all_runs, names) + [""]
        out += [f"- {r.family} {r.sampler}: {r.note}" for runs in all_runs.values()
                for r in runs if r.note] + [""]
    else:
        out += ["| family | step built in s | passes | note |", "| --- | ---: | ---: | --- |"]
        out += [f"| {r.family} | {r.setup_s:.1f} | {fmt(r.passes, '.2f')} | {r.note} |"
                for runs in all_runs.values() for r in runs] + [""]
    if args.profile:
        out += ["## Where the step's construction goes (exclusive seconds)", ""]
        out += profile_tables(all_runs) + [""]
    out += ["## Warnings", ""] + warning_lines(all_runs) + [""]
    out.append(f"Total wall time {time.perf_counter() - wall:.0f} s.")
    print("\n" + "\n".join(out), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = "_setup" if args.setup_only else ""
    (args.out / f"model_zoo_{args.n:.0e}{suffix}.md").write_text("\n".join(out) + "\n")
    return all_runs


if __name__ == "__main__":
    main()
