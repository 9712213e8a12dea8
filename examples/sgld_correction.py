r"""SGLD corrected by Metropolis-Hastings tests (Korattikara et al. 2014, §5.4, Figure 8).

L1-regularised linear regression with one coefficient: ``N = 10,000`` rows
``y_i = 0.5 x_i + ξ_i``, ``ξ_i ~ N(0, 1/3)``, likelihood ``∝ exp(−λ/2 (y − θx)²)`` with
``λ = 3`` and a Laplace prior ``∝ exp(−λ0 |θ|)`` with ``λ0 = 4950``. SGLD moves
(:class:`~pymc_minibatch_mh.proposals.sgld.StochasticLangevinProposal`) with step
size ``α = 5·10⁻⁶`` on minibatches of ``n = 500`` rows (5 % of N) are

(c) always accepted (plain SGLD), or used as the proposal of
(d) the exact MH test (:class:`~pymc_minibatch_mh.ExactMH`),
(e) AustereMH with ε = 0.1 and (f) ε = 0.5 (tests on rounds of 500 rows), and
(g) the minibatch Barker test (:class:`~pymc_minibatch_mh.MinibatchBarker`, 500 rows).

The paper reports that the corrected chains match the posterior while plain SGLD is
thrown off (the Langevin noise occasionally pushes it into the low-density valley left of
the mode, where the gradient is very large and propels it far to the right), and that
AustereMH used 14.2 % (ε = 0.1) and 5 % (ε = 0.5) of the data per test.

**Data.** The paper does not give the distribution of ``x_i``. ``λ0 = 4950`` just below
``λ E[Σ x_i y_i] = 0.5 λ N E[x²] = 5000`` for ``x_i ~ U(−1, 1)`` (E x² = 1/3) is what
"the prior is not washed out by the likelihood" suggests, and it is used here. The
posterior's shape then depends on the draw: ``λΣx_i y_i − λ0`` is about 58 ± 109 over
data sets, and when it is negative (about 30 % of draws) the posterior mode sits at the
prior's kink θ = 0 with the steep valley immediately to its left, the situation the
paper describes and plots. The default ``--data-seed 9`` is such a draw
(``λΣx_i y_i − λ0 ≈ −134``); with a positive value the mode moves right of 0 and plain
SGLD is much less biased.

ε = 0.5 is run as ε = 0.5 − 10⁻⁹ (:class:`~pymc_minibatch_mh.AustereMH` needs ε < 0.5):
the test then decides on its first minibatch unless ``|t| < 3·10⁻⁹``, as in the paper.

Each panel's histogram is compared with the exact posterior (closed form: two truncated
Gaussians meeting at θ = 0) by the total-variation distance over the histogram's bins;
the same distance for as many i.i.d. exact draws is printed as the floor set by the
sample size alone (the chains are autocorrelated, so their floor is higher).

Writes ``sgld_correction.md`` (the table) and ``sgld_correction.png`` (the panels) to
``--out``. The defaults (the paper's 100,000 samples per panel) take about 1.5 minutes.
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
from numpy.typing import NDArray
from scipy.special import log_ndtr, logsumexp

from pymc_minibatch_mh import AustereMH, ExactMH, MinibatchBarker, posterior, sample_stats
from pymc_minibatch_mh.proposals.sgld import StochasticLangevinProposal

#: Data used per test by AustereMH in the paper (§5.4), in % of N.
PAPER = {"austere-0.1": 14.2, "austere-0.5": 5.0}
#: Panels in order: key, label.
METHODS = {
    "sgld": "(c) SGLD, uncorrected",
    "exact": "(d) SGLD + exact MH test",
    "austere-0.1": "(e) SGLD + AustereMH, ε = 0.1",
    "austere-0.5": "(f) SGLD + AustereMH, ε = 0.5",
    "barker": "(g) SGLD + MinibatchBarker",
}
COLORS = {"sgld": "C3", "exact": "C0", "austere-0.1": "C2", "austere-0.5": "C1",
          "barker": "C4"}
LAMBDA = 3.0
LAMBDA0 = 4950.0
#: ε = 0.5 as AustereMH accepts it (ε < 0.5).
EPSILON_HALF = 0.5 - 1e-9


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parse the command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="rows N (paper: 10,000)")
    parser.add_argument("--draws", type=int, default=100_000,
                        help="samples per panel (paper: 100,000)")
    parser.add_argument("--alpha", type=float, default=5e-6, help="SGLD step size α")
    parser.add_argument("--batch-size", type=int, default=500,
                        help="rows of each SGLD minibatch (paper: 5 %% of N)")
    parser.add_argument("--test-batch-size", type=int, default=500,
                        help="rows per round of the minibatch tests")
    parser.add_argument("--methods", type=lambda s: s.split(","), default=list(METHODS),
                        help="comma-separated subset of " + ",".join(METHODS))
    parser.add_argument("--bins", type=int, default=100)
    parser.add_argument("--data-seed", type=int, default=9)
    parser.add_argument("--seed", type=int, default=2014)
    parser.add_argument("--out", type=Path, default=Path("examples/output"))
    args = parser.parse_args(argv)
    unknown = set(args.methods) - set(METHODS)
    if unknown:
        parser.error(f"unknown methods {sorted(unknown)}; choose from {list(METHODS)}")
    return args


# ------------------------------------------------------------------ the posterior


class L1Posterior:
    r"""The exact posterior of θ: ``log p(θ) = −(P/2)θ² + bθ − λ0|θ| + const``.

    Parameters
    ----------
    x, y : ndarray
        The data; ``P = λΣx_i²`` and ``b = λΣx_i y_i``.

    Notes
    -----
    On each side of 0 the density is a Gaussian ``N(m±, 1/P)`` with
    ``m± = (b ∓ λ0)/P`` restricted to that side, so masses, the CDF and the density are
    in closed form (computed in logs: the unnormalised masses overflow).
    """

    def __init__(self, x: NDArray[np.float64], y: NDArray[np.float64]) -> None:
        self.precision = LAMBDA * float(x @ x)
        self.b = LAMBDA * float(x @ y)
        p = self.precision
        self.m_pos = (self.b - LAMBDA0) / p
        self.m_neg = (self.b + LAMBDA0) / p
        self.root = math.sqrt(p)
        log_pos = 0.5 * p * self.m_pos**2 + log_ndtr(self.m_pos * self.root)
        log_neg = 0.5 * p * self.m_neg**2 + log_ndtr(-self.m_neg * self.root)
        log_z = logsumexp([log_pos, log_neg])
        self.w_pos = math.exp(log_pos - log_z)
        self.w_neg = math.exp(log_neg - log_z)
        # log density = −(P/2)θ² + bθ − λ0|θ| − log_norm
        self.log_norm = float(log_z + 0.5 * math.log(2 * math.pi / p))

    @property
    def mode(self) -> float:
        """The posterior mode (0 when ``b ≤ λ0``)."""
        return max(self.m_pos, 0.0)

    def log_density(self, theta: NDArray[np.float64]) -> NDArray[np.float64]:
        """Normalised log density."""
        return (-0.5 * self.precision * theta**2 + self.b * theta - LAMBDA0 * np.abs(theta)
                - self.log_norm)

    def grad_log_density(self, theta: NDArray[np.float64]) -> NDArray[np.float64]:
        """Gradient of the log posterior (panel b)."""
        return self.b - self.precision * theta - LAMBDA0 * np.sign(theta)

    def cdf(self, t: NDArray[np.float64]) -> NDArray[np.float64]:
        """The posterior CDF."""
        t = np.asarray(t, dtype=np.float64)
        r = self.root
        left = self.w_neg * np.exp(
            log_ndtr((np.minimum(t, 0.0) - self.m_neg) * r) - log_ndtr(-self.m_neg * r)
        )
        right = 1.0 - self.w_pos * np.exp(
            log_ndtr(-(np.maximum(t, 0.0) - self.m_pos) * r) - log_ndtr(self.m_pos * r)
        )
        return np.where(t < 0, left, right)

    def moments(self) -> tuple[float, float]:
        """Posterior mean and standard deviation (quadrature on a fine grid)."""
        lo, hi = self.quantile_range(1e-12)
        grid = np.linspace(lo, hi, 200_001)
        w = np.exp(self.log_density(grid))
        w /= w.sum()
        mean = float(w @ grid)
        return mean, float(math.sqrt(w @ (grid - mean) ** 2))

    def quantile_range(self, tail: float) -> tuple[float, float]:
        """θ below and above which the posterior has mass at most ``tail`` each."""
        width = 40.0 / self.root
        grid = np.linspace(-width, self.mode + width, 400_001)
        c = self.cdf(grid)
        return float(grid[np.searchsorted(c, tail)]), float(grid[np.searchsorted(c, 1 - tail)])

    def sample(self, rng: np.random.Generator, size: int) -> NDArray[np.float64]:
        """Independent draws by inverting the CDF on a fine grid."""
        lo, hi = self.quantile_range(1e-12)
        grid = np.linspace(lo, hi, 400_001)
        return np.interp(rng.random(size), self.cdf(grid), grid)

    def bin_probabilities(self, edges: NDArray[np.float64]) -> NDArray[np.float64]:
        """Mass of each bin; the mass outside the edges is added to the end bins."""
        c = self.cdf(edges)
        p = np.diff(c)
        p[0] += c[0]
        p[-1] += 1.0 - c[-1]
        return p


def total_variation(samples: NDArray[np.float64], probs: NDArray[np.float64],
                    edges: NDArray[np.float64]) -> float:
    """TV distance between the histogram of ``samples`` and the bin masses ``probs``."""
    counts, _ = np.histogram(np.clip(samples, edges[0], edges[-1]), bins=edges)
    return 0.5 * float(np.abs(counts / samples.size - probs).sum())


# --------------------------------------------------------------------- sampling


def make_model(x: NDArray[np.float64], y: NDArray[np.float64]) -> pm.Model:
    """The PyMC model: Laplace prior, Gaussian errors of precision λ."""
    with pm.Model() as model:
        x_data = pm.Data("x", x)
        theta = pm.Laplace("theta", 0.0, 1.0 / LAMBDA0)
        pm.Normal("y", theta * x_data, 1.0 / math.sqrt(LAMBDA), observed=y,
                  shape=x_data.shape)
    return model


def run_sgld(model: pm.Model, args: argparse.Namespace, start: float) -> dict:
    """Plain SGLD: the proposal alone, every move accepted."""
    with model:
        step = ExactMH(scaling=args.alpha, tune=False)  # only for its compiled likelihood
    proposal = StochasticLangevinProposal.for_step(step, batch_size=args.batch_size)
    rng = np.random.default_rng(args.seed)
    state = proposal.init(np.array([start]))
    out = np.empty(args.draws)
    t0 = time.perf_counter()
    for i in range(args.draws):
        state, _ = proposal.propose(rng, state, args.alpha)
        out[i] = state.x[0]
    return {"samples": out, "data_per_test": 0.0, "accept_rate": 1.0,
            "seconds": time.perf_counter() - t0}


def run_corrected(model: pm.Model, method: str, args: argparse.Namespace,
                  start: float) -> dict:
    """SGLD proposals with an acceptance test, through ``pm.sample``."""
    common = dict(scaling=args.alpha, tune=False)
    m = args.test_batch_size
    with model:
        if method == "exact":
            step = ExactMH(**common)
        elif method == "barker":
            step = MinibatchBarker(control_variate=None, batch_size=m, **common)
        else:
            eps = float(method.split("-")[1])
            step = AustereMH(batch_size=m, epsilon=min(eps, EPSILON_HALF), **common)
        step.proposal = StochasticLangevinProposal.for_step(step, batch_size=args.batch_size)
        t0 = time.perf_counter()
        idata = pm.sample(draws=args.draws, tune=0, step=step, chains=1, cores=1,
                          random_seed=args.seed, initvals={"theta": start},
                          progressbar=False, compute_convergence_checks=False)
        seconds = time.perf_counter() - t0
    stats = sample_stats(idata)
    samples = np.asarray(posterior(idata)["theta"]).ravel()
    return {"samples": samples,
            "data_per_test": float(np.mean(stats["batch_size"])) / args.n,
            "accept_rate": float(np.mean(stats["accepted"])), "seconds": seconds}


# ------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> dict:
    """Run the panels, print the table and write the figure; return the numbers."""
    args = parse_args(argv)
    data_rng = np.random.default_rng(args.data_seed)
    x = data_rng.uniform(-1.0, 1.0, size=args.n)
    y = 0.5 * x + data_rng.normal(0.0, math.sqrt(1.0 / 3.0), size=args.n)
    post = L1Posterior(x, y)
    mean, sd = post.moments()
    model = make_model(x, y)
    start = post.mode
    print(f"SGLD correction (Austerity §5.4, Figure 8): N = {args.n:,}, α = {args.alpha:g}, "
          f"n = {args.batch_size} ({100 * args.batch_size / args.n:g} % of N), "
          f"{args.draws:,} samples per panel")
    print(f"λΣx·y − λ0 = {post.b - LAMBDA0:.1f}; posterior mode {post.mode:.4g}, "
          f"mean {mean:.4g}, sd {sd:.4g}")

    results: dict[str, dict] = {}
    for method in args.methods:
        if method == "sgld":
            r = run_sgld(model, args, start)
        else:
            r = run_corrected(model, method, args, start)
        results[method] = r
        used = ("no test" if method == "sgld"
                else f"data per test {100 * r['data_per_test']:.1f} % of N")
        print(f"{METHODS[method]}: {used}, acceptance {r['accept_rate']:.3f}, "
              f"{r['seconds']:.1f} s")

    # Common bins: the posterior's bulk and every sample.
    lo, hi = post.quantile_range(1e-6)
    all_samples = np.concatenate([r["samples"] for r in results.values()])
    lo, hi = min(lo, float(all_samples.min())), max(hi, float(all_samples.max()))
    edges = np.linspace(lo, hi, args.bins + 1)
    probs = post.bin_probabilities(edges)
    for r in results.values():
        r["tv"] = total_variation(r["samples"], probs, edges)
    iid_tv = total_variation(post.sample(np.random.default_rng(args.seed), args.draws),
                             probs, edges)

    lines = [
        "# SGLD corrected by MH tests (Korattikara et al. 2014, Figure 8)",
        "",
        f"N = {args.n:,}, α = {args.alpha:g}, SGLD minibatch n = {args.batch_size}, "
        f"test rounds of {args.test_batch_size} rows, {args.draws:,} samples per method; "
        f"data seed {args.data_seed} (λΣx·y − λ0 = {post.b - LAMBDA0:.1f}). Exact "
        f"posterior: mean {mean:.4g}, sd {sd:.4g}. TV: total-variation distance of the "
        f"histogram ({args.bins} bins) from the exact posterior.",
        "",
        "| method | data per test (% of N) | paper | acceptance | TV | mean | sd |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for method, r in results.items():
        paper = PAPER.get(method)
        used = "–" if method == "sgld" else f"{100 * r['data_per_test']:.1f}"
        lines.append(
            f"| {METHODS[method]} | {used} | " + (f"{paper:g}" if paper else "–")
            + f" | {r['accept_rate']:.3f} | {r['tv']:.3f} | {r['samples'].mean():.4g} "
            f"| {r['samples'].std():.4g} |"
        )
    lines.append(f"| i.i.d. exact draws (sampling floor) | – | – | – | {iid_tv:.3f} "
                 f"| – | – |")
    table = "\n".join(lines) + "\n"
    print(table)

    args.out.mkdir(parents=True, exist_ok=True)
    fig_path = args.out / "sgld_correction.png"
    _figure(post, results, edges, fig_path, args)
    md_path = args.out / "sgld_correction.md"
    md_path.write_text(table, encoding="utf-8")
    print(f"written: {md_path}, {fig_path}")
    return {
        "posterior": {"mean": mean, "sd": sd, "mode": post.mode,
                      "b_minus_lambda0": post.b - LAMBDA0},
        "methods": {
            m: {"data_per_test": r["data_per_test"], "accept_rate": r["accept_rate"],
                "tv": r["tv"], "mean": float(r["samples"].mean()),
                "sd": float(r["samples"].std()), "seconds": r["seconds"]}
            for m, r in results.items()
        },
        "iid_tv": iid_tv,
        "table": table,
        "files": {"table": str(md_path), "figure": str(fig_path)},
    }


def _figure(post: L1Posterior, results: dict[str, dict], edges: NDArray[np.float64],
            path: Path, args: argparse.Namespace) -> None:
    fig, axes = plt.subplots(2, 4, figsize=(17, 7.4))
    axes = axes.ravel()
    grid = np.linspace(edges[0], edges[-1], 4001)
    grid = np.union1d(grid, [0.0])
    density = np.exp(post.log_density(grid))
    ax = axes[0]
    ax.plot(grid, density, color="k")
    ax.set(title="(a) posterior density", xlabel="θ", ylabel="density")
    ax = axes[1]
    ax.plot(grid, post.grad_log_density(grid), color="k")
    ax.axhline(0.0, color="0.6", lw=0.8)
    ax.set(title="(b) gradient of the log posterior", xlabel="θ")
    for k, (method, r) in enumerate(results.items()):
        ax = axes[2 + k]
        ax.hist(r["samples"], bins=edges, density=True, color=COLORS[method], alpha=0.75)
        ax.plot(grid, density, color="k", lw=1.2, label="exact")
        used = "" if method == "sgld" else f", data {100 * r['data_per_test']:.1f} %"
        ax.set(title=f"{METHODS[method]}\nTV {r['tv']:.3f}{used}", xlabel="θ")
        ax.title.set_fontsize(9.5)
    tested = [m for m in results if m != "sgld"]
    ax = axes[2 + len(results)] if len(results) < 6 else None
    if ax is not None and tested:
        pos = np.arange(len(tested))
        ax.bar(pos - 0.2, [100 * results[m]["data_per_test"] for m in tested], width=0.4,
               color=[COLORS[m] for m in tested], label="this run")
        known = [i for i, m in enumerate(tested) if m in PAPER]
        ax.bar(pos[known] + 0.2, [PAPER[tested[i]] for i in known], width=0.4,
               color="none", edgecolor="k", hatch="//", label="paper")
        ax.set_xticks(pos, [m.replace("austere-", "Austere ε=") for m in tested], fontsize=8)
        ax.set(yscale="log", ylabel="data per test (% of N)", title="Data used per test")
        ax.legend(fontsize=8)
    for ax in axes[3 + len(results):]:
        ax.axis("off")
    fig.suptitle(f"SGLD (α = {args.alpha:g}, n = {args.batch_size} of N = {args.n:,}) "
                 "with and without MH correction: Korattikara et al. (2014), Figure 8")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
