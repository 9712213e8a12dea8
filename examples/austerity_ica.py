"""ICA on the Stiefel manifold (Korattikara, Chen and Welling 2014, section 5.2, Figure 5).

The model of the paper: whitened data x ∈ R^D (D = 4), an orthogonal unmixing matrix W with
a uniform prior on the manifold, and the likelihood

    p(x | W) = |det W| ∏_j [4 cosh²(½ w_jᵀx)]⁻¹,

a product of standard logistic densities of the unmixed components w_jᵀx (written as an
observed ``pm.CustomDist`` with one log-likelihood per row). The proposal is a symmetric
random walk on the orthogonal matrices,
:class:`~pymc_minibatch_mh.proposals.StiefelRandomWalk` (``W expm(s A)``, A skew-symmetric
Gaussian; the paper used Ouyang's walk, another symmetric walk on the manifold).

Data: the paper mixed 43 s of a classical music recording, street noise and two standard
Gaussian noise sources (1.95 million samples at 44.1 kHz). The recordings are not public;
here two heavy-tailed signals stand in for them (Laplace and Student-t with 5 degrees of
freedom, scaled to unit variance) with two standard Gaussian sources, mixed by a random
matrix A and whitened as the paper does. The test function is the Amari distance
``d_A(W, W0)`` to the true unmixing matrix ``W0`` (the inverse of the whitened mixing
matrix), and the quantity estimated is its posterior mean ``I = E[d_A(W, W0) | data]``.

Methods: exact MH (``ExactMH``, the full data at every step), AustereMH (Korattikara et al.'s
sequential t-test) at each ``--epsilons`` value, and the minibatch Barker test
(``MinibatchBarker``), all with the same proposal and the same fixed scale. The reference
``I`` comes from a long exact run (``--reference-seconds`` after ``--reference-tune``
tuning steps, which also tune the proposal's scale, target acceptance 0.25). Every chain,
the reference's too, starts at the orthogonal matrix nearest to ``W0`` (its polar
factor): the risk curves include the burn-in. Each method runs ``--chains`` chains for
``--seconds`` of wall-clock time each (after a few untimed draws that compile the step's
Numba functions); the risk at time t is the squared error of each chain's running mean
of ``d_A`` against the reference, averaged over the chains (the paper's Figure 5).
Writes ``austerity_ica.png`` and ``austerity_ica.md`` to ``--out``.

The paper ran 10 chains of about 6,400 s per method on 1.95·10⁶ rows, with a reference of
10⁵ exact samples. The defaults here (2·10⁶ rows, 4 chains of 120 s per method, a 600 s
reference) take about an hour on two shared cores: an exact step costs about 1.6 s there.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pymc as pm
import pytensor.tensor as pt
import scipy.linalg
from numpy.typing import NDArray

from pymc_minibatch_mh import AustereMH, ExactMH, MinibatchBarker, mcse, posterior, sample_stats
from pymc_minibatch_mh.proposals import StiefelRandomWalk

D = 4
#: The paper's Figure 5: exact MH (ε = 0) against these ε.
PAPER_EPSILONS = (0.01, 0.05, 0.1, 0.2)
#: PyMC allocates the trace for all draws up front: a timed chain asks for this many draws
#: per second (far more than a step of this model makes) and is stopped by the clock.
MAX_DRAWS_PER_SECOND = 3000


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-rows", type=int, default=2_000_000,
                        help="rows of mixed data (paper: about 1.95 million)")
    parser.add_argument("--chains", type=int, default=4, help="chains per method (paper: 10)")
    parser.add_argument("--seconds", type=float, default=120.0,
                        help="wall-clock seconds per chain (paper: about 6400)")
    parser.add_argument("--reference-seconds", type=float, default=600.0,
                        help="wall-clock seconds of the exact reference run (after tuning)")
    parser.add_argument("--reference-tune", type=int, default=300,
                        help="tuning steps of the reference run (they tune the scale)")
    parser.add_argument("--epsilons", type=float, nargs="*", default=list(PAPER_EPSILONS),
                        help="AustereMH's ε values")
    parser.add_argument("--barker", action=argparse.BooleanOptionalAction, default=True,
                        help="also run MinibatchBarker")
    parser.add_argument("--batch-size", type=int, default=500,
                        help="minibatch size (AustereMH's and MinibatchBarker's m)")
    parser.add_argument("--seed", type=int, default=2014)
    parser.add_argument("--out", type=Path, default=Path("examples/output"))
    args = parser.parse_args(argv)
    if args.n_rows < 10 * D:
        parser.error(f"--n-rows must be at least {10 * D}")
    if args.chains < 1 or args.seconds <= 0 or args.reference_seconds <= 0:
        parser.error("--chains, --seconds and --reference-seconds must be positive")
    bad = [e for e in args.epsilons if not 0.0 < e < 0.5]
    if bad:
        parser.error(f"--epsilons must lie in (0, 0.5), got {bad}")
    if args.batch_size < 2 or args.batch_size > args.n_rows:
        parser.error("--batch-size must be between 2 and --n-rows")
    return args


def mixed_sources(n_rows: int, seed: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Whitened mixtures of 4 sources and the true unmixing matrix ``W0`` (orthogonal up to
    sampling error).

    Sources (unit variance): Laplace, Student-t(5), and two standard Gaussians. They are
    mixed by a standard-normal matrix ``A``, centred and whitened with the sample
    covariance ``C = E Λ Eᵀ``: ``z = K x`` with ``K = Λ^{-1/2} Eᵀ``; ``W0 = (K A)⁻¹``.
    """
    rng = np.random.default_rng(seed)
    sources = np.column_stack([
        rng.laplace(scale=1.0 / math.sqrt(2.0), size=n_rows),
        rng.standard_t(5.0, size=n_rows) / math.sqrt(5.0 / 3.0),
        rng.standard_normal((n_rows, 2)),
    ])
    mixing = rng.standard_normal((D, D))
    x = sources @ mixing.T
    x -= x.mean(axis=0)
    evals, evecs = np.linalg.eigh(np.cov(x, rowvar=False))
    whitening = (evecs / np.sqrt(evals)).T
    z = x @ whitening.T
    return z, np.linalg.inv(whitening @ mixing)


def ica_model(z: NDArray[np.float64], initval: NDArray[np.float64] | None = None) -> pm.Model:
    """The paper's ICA likelihood on whitened rows ``z`` (N × D), ``W ~ Flat`` (D × D).

    ``log p(z_i | W) = log|det W| + Σ_j log Logistic(w_jᵀz_i; 0, 1)``, since
    ``[4 cosh²(u/2)]⁻¹`` is the standard logistic density. Restricted to the orthogonal
    matrices, where the random walk keeps the chain, the flat prior is the uniform one.
    """
    d = z.shape[1]

    def logp(value, w):
        w = w.reshape((d, d))  # the core parameter arrives with a batch dimension of 1
        u = pt.dot(value, w.T)
        logistic = pm.logp(pm.Logistic.dist(0.0, 1.0), u)
        return pt.linalg.slogdet(w)[1] + logistic.sum(axis=-1)

    with pm.Model() as model:
        w = pm.Flat("W", shape=(d, d), initval=np.eye(d) if initval is None else initval)
        pm.CustomDist("z", w, logp=logp, observed=z, signature="(d,d)->(d)")
    return model


def amari_distance(w: NDArray[np.float64], w0: NDArray[np.float64]) -> NDArray[np.float64]:
    """Amari et al.'s (1996) distance between unmixing matrices, normalised to [0, 1].

    With ``P = W W0⁻¹`` (``w`` may be a stack of matrices, shape ``(..., D, D)``)::

        d = [Σ_i (Σ_j |p_ij| / max_k |p_ik| − 1) + Σ_j (Σ_i |p_ij| / max_k |p_kj| − 1)]
            / (2 D (D − 1)),

    0 exactly when ``W`` equals ``W0`` up to a permutation and scaling of its rows, the
    ambiguities of ICA.
    """
    p = np.abs(np.asarray(w) @ np.linalg.inv(w0))
    d = p.shape[-1]
    rows = (p.sum(axis=-1) / p.max(axis=-1) - 1.0).sum(axis=-1)
    cols = (p.sum(axis=-2) / p.max(axis=-2) - 1.0).sum(axis=-1)
    return (rows + cols) / (2.0 * d * (d - 1))


def make_step(model: pm.Model, method: str, scale: float, batch_size: int,
              tune: bool):
    """The step of ``method`` (``"exact"``, ``"barker"`` or ``"austere-<ε>"``) on ``model``."""
    common = dict(proposal=StiefelRandomWalk(D), scaling=scale, tune=tune)
    with model:
        if method == "exact":
            return ExactMH(**common)
        if method == "barker":
            return MinibatchBarker(control_variate=None, batch_size=batch_size, **common)
        return AustereMH(batch_size=batch_size, epsilon=float(method.split("-", 1)[1]),
                         **common)


def label_of(method: str) -> str:
    if method == "exact":
        return "exact MH (ε = 0)"
    if method == "barker":
        return "MinibatchBarker (σ = 1)"
    return f"AustereMH, ε = {method.split('-', 1)[1]}"


def timed_chain(model: pm.Model, step, start: NDArray[np.float64], seconds: float,
                seed: int, tune: int = 0) -> dict:
    """One chain run for ``seconds`` of wall-clock time after its tuning steps.

    PyMC calls ``callback`` after each draw; it records the time and stops the chain (a
    ``KeyboardInterrupt``, which PyMC documents for this) when the time is up.
    """
    stamps: list[float] = []
    origin = [math.nan]

    def callback(trace, draw) -> None:
        now = time.perf_counter()
        if draw.tuning:
            origin[0] = now
            return
        if math.isnan(origin[0]):
            origin[0] = now
        stamps.append(now - origin[0])
        if stamps[-1] >= seconds:
            raise KeyboardInterrupt

    with model:
        origin[0] = math.nan if tune else time.perf_counter()
        idata = pm.sample(draws=math.ceil(seconds * MAX_DRAWS_PER_SECOND), tune=tune,
                          step=step, chains=1, cores=1, random_seed=seed,
                          initvals={"W": start}, progressbar=False,
                          compute_convergence_checks=False, callback=callback)
    stats = sample_stats(idata)
    w = np.asarray(posterior(idata)["W"])[0]
    n = min(len(stamps), w.shape[0])
    return {
        "W": w[:n],
        "times": np.asarray(stamps[:n]),
        "batch_size": np.asarray(stats["batch_size"])[0, :n],
        "accepted": np.asarray(stats["accepted"], dtype=float)[0, :n],
        "scaling": float(np.asarray(stats["scaling"])[0, -1]),
    }


def risk_curve(chains: list[dict], reference: float, grid: NDArray[np.float64]) -> NDArray:
    """Mean over chains of (running mean of d_A at time t − reference)², on ``grid``.

    At each time the chain's estimate is the mean of its draws up to then (NaN before its
    first draw).
    """
    errors = []
    for c in chains:
        running = np.cumsum(c["amari"]) / np.arange(1, c["amari"].size + 1)
        index = np.searchsorted(c["times"], grid, side="right") - 1
        value = np.where(index >= 0, running[np.maximum(index, 0)], np.nan)
        errors.append((value - reference) ** 2)
    return np.mean(errors, axis=0)


def figure(results: dict, reference: dict, args: argparse.Namespace, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7.5, 5.0))
    for k, r in enumerate(results.values()):
        ax.plot(r["grid"], r["risk"], color=f"C{k}", label=r["label"])
    ax.axhline(reference["mcse"] ** 2, color="k", ls=":", lw=1,
               label="reference's own error (MCSE²)")
    ax.set(xscale="log", yscale="log", xlabel="wall-clock time per chain (s)",
           ylabel="risk of the mean Amari distance",
           title=f"ICA, N = {args.n_rows:,}, D = {D}: mean over {args.chains} chains")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    z, w0 = mixed_sources(args.n_rows, args.seed)
    start = scipy.linalg.polar(w0)[0]  # the nearest orthogonal matrix to W0
    model = ica_model(z, start)
    methods = (["exact"] + [f"austere-{e:g}" for e in args.epsilons]
               + (["barker"] if args.barker else []))
    print(f"ICA: N = {args.n_rows:,} whitened rows, D = {D}; {args.chains} chains × "
          f"{args.seconds:g} s per method ({', '.join(methods)}); reference: exact MH, "
          f"{args.reference_tune} tuning steps + {args.reference_seconds:g} s")

    # The reference: a long exact run, whose tuning phase also sets the common scale.
    seed = np.random.SeedSequence(args.seed)
    seeds = [int(s.generate_state(1)[0]) for s in seed.spawn(1 + len(methods))]
    build = time.perf_counter()
    ref_step = make_step(model, "exact", 2.0 / math.sqrt(args.n_rows), args.batch_size,
                         tune=True)
    build = time.perf_counter() - build
    ref = timed_chain(model, ref_step, start, args.reference_seconds, seeds[0],
                      tune=args.reference_tune)
    scale = ref["scaling"]
    ref_amari = amari_distance(ref["W"], w0)
    reference = {"value": float(ref_amari.mean()), "mcse": mcse(ref_amari),
                 "draws": int(ref_amari.size), "scale": scale,
                 "acceptance": float(ref["accepted"].mean())}
    print(f"reference: E[d_A] = {reference['value']:.4f} ± {reference['mcse']:.4f} (MCSE) "
          f"from {reference['draws']:,} exact draws (acceptance "
          f"{reference['acceptance']:.2f}, tuned scale {scale:.3g}; step built in "
          f"{build:.1f} s)")

    grid = np.geomspace(args.seconds / 300.0, args.seconds, 120)
    results: dict[str, dict] = {}
    for k, method in enumerate(methods, start=1):
        t0 = time.perf_counter()
        step = make_step(model, method, scale, args.batch_size, tune=False)
        built = time.perf_counter() - t0
        # Untimed: the first draws compile the step's Numba functions.
        timed_chain(model, step, start, 0.5, seeds[k] - 1)
        chains = []
        for c in range(args.chains):
            chain = timed_chain(model, step, start, args.seconds, seeds[k] + c)
            chain["amari"] = amari_distance(chain["W"], w0)
            chains.append(chain)
        draws = np.array([c["amari"].size for c in chains])
        rows = np.concatenate([c["batch_size"] for c in chains])
        label = label_of(method)
        risk = risk_curve(chains, reference["value"], grid)
        final = np.array([c["amari"].mean() for c in chains])
        results[method] = {
            "label": label, "grid": grid, "risk": risk,
            "draws_per_chain": float(draws.mean()),
            "draws_per_second": float(draws.mean() / args.seconds),
            "data_fraction": float(rows.mean() / args.n_rows),
            "acceptance": float(np.concatenate([c["accepted"] for c in chains]).mean()),
            "final_risk": float(np.mean((final - reference["value"]) ** 2)),
            "final_bias": float(final.mean() - reference["value"]),
            "build_seconds": built,
        }
        r = results[method]
        print(f"{label}: {r['draws_per_chain']:,.0f} draws per chain "
              f"({r['draws_per_second']:,.1f}/s), data per step {100 * r['data_fraction']:.2f} "
              f"%, acceptance {r['acceptance']:.2f}, final risk {r['final_risk']:.2e} "
              f"(bias {r['final_bias']:+.4f}); step built in {built:.1f} s")

    args.out.mkdir(parents=True, exist_ok=True)
    paths = {"figure": args.out / "austerity_ica.png", "table": args.out / "austerity_ica.md"}
    figure(results, reference, args, paths["figure"])
    lines = [
        "# ICA on the Stiefel manifold (Korattikara et al. 2014, section 5.2, Figure 5)",
        "",
        f"N = {args.n_rows:,} whitened rows from 4 sources (Laplace, Student-t(5), 2 "
        f"Gaussian), D = {D}; Stiefel random walk with scale {scale:.3g} (tuned by the "
        f"reference run), m = {args.batch_size}; {args.chains} chains × {args.seconds:g} s "
        f"per method. Reference E[d_A] = {reference['value']:.4f} ± {reference['mcse']:.4f} "
        f"(MCSE; {reference['draws']:,} exact draws).",
        "",
        "| method | draws per second | data per step (% of N) | acceptance | risk at the end "
        "| bias at the end |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in results.values():
        lines.append(
            f"| {r['label']} | {r['draws_per_second']:,.1f} | {100 * r['data_fraction']:.2f} "
            f"| {r['acceptance']:.2f} | {r['final_risk']:.2e} | {r['final_bias']:+.4f} |"
        )
    table = "\n".join(lines) + "\n"
    paths["table"].write_text(table, encoding="utf-8")
    print(f"written: {', '.join(str(p) for p in paths.values())}")
    return {
        "n_rows": args.n_rows,
        "reference": reference,
        "methods": {m: {k: v for k, v in r.items() if k not in ("grid", "risk", "label")}
                    | {"label": r["label"], "risk": r["risk"].tolist()}
                    for m, r in results.items()},
        "grid": grid.tolist(),
        "table": table,
        "files": {k: str(v) for k, v in paths.items()},
    }


if __name__ == "__main__":
    main()
