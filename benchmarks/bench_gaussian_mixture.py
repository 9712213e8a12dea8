"""Benchmark: MinibatchBarker on the Gaussian mixture of Seita et al. (2017, section 6.1).

Settings of the paper: N = 10⁶, temperature 10,000, random-walk proposal with standard
deviation 0.15 per coordinate, initial minibatch 50, σ = 1, 3000 samples.

Measured in the same run, so that the table reads as ratios on whatever machine runs it:

- MinibatchBarker inside ``pm.sample``: average batch size and time per step;
- one minibatch evaluation at the average batch size b: b random rows of the data as
  stored, gathered (``lik.store.rows``, one ``np.take`` per data array) and passed to
  PyTensor's ``Function`` (``lik._delta_fn``), for the C and the Numba backends of
  PyTensor (the faster one is the package's default on this line). The gather is timed
  inside the evaluation: a plain implementation that indexes the data inside its
  compiled graph pays it inside the call. Also the same rows through the direct call of
  the jitted graph (``lik.delta_fast``), the way the step calls it;
- a no-op step method inside ``pm.sample`` (PyMC's own per-step overhead);
- ``pm.Metropolis`` on the same model (one full-data evaluation per draw: full-data MH).

Times per step are steady-state: ``pm.sample`` calls a callback after every draw, and a
step's time is the mean over a block of 100 consecutive draws, so that a chain's one-off
start (reading the data into the row store, the row sampler's order, the full-data check
of the start point) is not spread over the steps; the start is reported separately. The
callback's own cost (measured) is subtracted from the step and from the no-op step alike.

On a shared machine the speed can drift by a factor of up to 2 from one block to the
next (other virtual machines on the host), so the evaluation is timed *between* the blocks of
steps, by the same callback (outside the timed blocks): 100 calls after every block of
100 steps, and after every block of 1000 no-op steps. The target is judged on paired
ratios: each block of steps against the mean of the evaluation blocks just before and
after it, plus a no-op step expressed as a share of an evaluation (the median over the
no-op chains' own pairs); the table gives the median of these ratios and their quartiles.
Drift then affects both sides of a ratio alike. Times are medians over blocks, with the
10th percentile beside them.

Targets: average batch size ≤ 205 (paper: 182.3 ± 11.4 with
σ = 0.9); time per step ≤ 2 × (one minibatch evaluation + one no-op PyMC step); at least
1000 × faster per step than full-data MH.

Run: ``python benchmarks/bench_gaussian_mixture.py [--draws 3000] [--trials 5]`` (from a
checkout that is not the installed one, set ``PYTHONPATH`` to it: a script's own folder,
not the working directory, is first on ``sys.path``).
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import numpy as np
import pymc as pm
from pymc.step_methods.compound import BlockedStep

from pymc_minibatch_mh import MinibatchBarker
from pymc_minibatch_mh.datasets import gaussian_mixture_data, gaussian_mixture_model
from pymc_minibatch_mh.model.compat import default_mode, sample_stats
from pymc_minibatch_mh.model.likelihood import MinibatchLikelihood

warnings.filterwarnings("ignore")
START = {"theta": np.array([0.0, 1.0])}


class NoOpStep(BlockedStep):
    """A step method that returns the point unchanged (PyMC's per-step floor)."""

    name = "noop"
    stats_dtypes_shapes = {"accepted": (np.float64, [])}

    def __init__(self, vars=None, model=None, rng=None, blocked=True):
        model = pm.modelcontext(model)
        self.vars = vars or model.value_vars
        self.rng = rng

    def step(self, point):
        return point, [{"accepted": 1.0}]


BLOCK = 100  # draws (or calls) per timed block


def run_seconds(model, step, draws, seed):
    with model:
        idata = pm.sample(draws=draws, tune=0, step=step, chains=1, cores=1, random_seed=seed,
                          initvals=START, progressbar=False, compute_convergence_checks=False)
    ss = sample_stats(idata)
    return float(ss.attrs["sampling_time"]), ss


class BlockClock:
    """A ``pm.sample`` callback that times blocks of ``every`` draws.

    ``blocks`` gets the seconds per draw of each block after the first (the first holds
    the chain's start). After every block, ``between()`` runs, outside the timed blocks,
    and its results go to ``results``: the evaluation is timed there, next to the steps
    it is compared with, so that the machine's drift affects both alike.
    """

    def __init__(self, every, between=None):
        self.every = every
        self.between = between
        self.count = 0
        self.blocks = []
        self.results = []
        self.mark = None  # the clock at the start of the current block
        self.first = self.last = None
        self.outside = 0.0  # seconds spent in between()

    def __call__(self, trace, draw):
        self.count += 1
        if self.count < self.every:
            return
        now = time.perf_counter()
        if self.mark is None:
            self.first = now
        else:
            self.blocks.append((now - self.mark) / self.every)
        self.last = now
        if self.between is not None:
            self.results.append(self.between())
        self.count = 0
        self.mark = time.perf_counter()
        self.outside += self.mark - now


def draw_blocks(model, step, draws, seed, every=BLOCK, between=None):
    """Run one chain; its :class:`BlockClock`, the chain's one-off start, and the stats."""
    clock = BlockClock(every, between)
    with model:
        idata = pm.sample(draws=draws, tune=0, step=step, chains=1, cores=1, random_seed=seed,
                          initvals=START, progressbar=False, compute_convergence_checks=False,
                          callback=clock)
    ss = sample_stats(idata)
    timed = draws - every  # draws between the first and the last mark
    steady = (clock.last - clock.first - clock.outside) / timed
    start = float(ss.attrs["sampling_time"]) - clock.outside - steady * draws
    return clock, max(0.0, start), ss


def callback_seconds():
    """The cost per draw of the timing callback (PyMC builds a ``Draw`` record for it)."""
    from collections import namedtuple

    draw_type = namedtuple("Draw", ["chain", "is_last", "draw_idx", "tuning", "stats", "point"])
    callback = BlockClock(10**9)
    stats, point = [{"accepted": 1.0}], dict(START)

    def one():
        callback(trace=None, draw=draw_type(0, False, 1, False, stats, point))

    return min(time_call(one, iter(lambda: (), None), repeats=20, number=5000) for _ in range(3))


def paired(blocks, results):
    """Each block with the mean of the evaluation blocks just before and just after it."""
    ev = np.asarray(results)
    return np.asarray(blocks), 0.5 * (ev[:-1] + ev[1:])[: len(blocks)]


def time_call(fn, args_iter, repeats=7, number=2000):
    """Median over ``repeats`` blocks of the mean time of ``number`` calls."""
    return statistics.median(time_blocks(fn, args_iter, repeats, number))


def time_blocks(fn, args_iter, repeats, number):
    """Mean time of ``number`` calls, for each of ``repeats`` blocks."""
    blocks = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            fn(*next(args_iter))
        blocks.append((time.perf_counter() - start) / number)
    return blocks


def make_eval(model, mode, batch, n, direct=False, blocks=30):
    """A timer of one minibatch evaluation at ``batch`` random rows of the data.

    Each call gathers ``batch`` random rows (a window of a fixed random permutation of the
    row indices, so rows without replacement) from the data as stored, with
    ``lik.store.rows`` (one ``np.take`` per data array), and evaluates them:
    ``direct=False`` through PyTensor's ``Function`` (``lik._delta_fn``), the plain way;
    ``direct=True`` through the direct call of the jitted graph (``lik.delta_fast``), the
    way the step calls it. The gather is inside the timed call in both cases. Returns a
    function of no arguments that returns the seconds per call of ``blocks`` blocks of
    ``BLOCK`` calls (a list), or of one block (a float) when ``blocks`` is None.
    """
    lik = MinibatchLikelihood(model, model.value_vars, mode=mode)
    rng = np.random.default_rng(0)
    order = rng.permutation(n).astype(np.int64)
    fn = lik.delta_fast if direct else lik._delta_fn
    gather = lik.store.rows
    x0 = np.array([0.0, 1.0])
    x1 = np.array([0.1, 0.9])
    inv_t = np.array(1e-4)

    def evaluate(idx):
        return fn(x0, x1, inv_t, *gather(idx))

    def args():
        while True:
            start = int(rng.integers(0, n - batch))
            yield (order[start : start + batch],)

    it = args()
    for _ in range(200):  # warm-up (Numba compiles on the first call)
        evaluate(*next(it))
    if blocks is None:
        return lambda: time_blocks(evaluate, it, 1, BLOCK)[0]
    return lambda: time_blocks(evaluate, it, blocks, BLOCK)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--draws", type=int, default=3000)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--metropolis-draws", type=int, default=15)
    args = parser.parse_args(argv)

    x = gaussian_mixture_data(args.n, seed=0)
    model = gaussian_mixture_model(x)
    with model:
        step = MinibatchBarker(control_variate=None,
                               batch_size=50, sigma=1.0, temperature=1e4, S=[0.15, 0.15],
                               tune=False)
    noop_step = NoOpStep(model=model)
    callback = callback_seconds()
    # A first chain (not counted) warms everything up and gives the batch size at which
    # the evaluation is timed.
    warm = draw_blocks(model, step, args.draws, seed=10**6)[2]
    batch = int(round(float(np.asarray(warm["batch_size"]).mean())))
    eval_block = make_eval(model, default_mode(), batch, args.n, blocks=None)
    sizes, starts = [], []
    step_blocks, step_evals, noop_blocks, noop_evals = [], [], [], []
    for trial in range(args.trials):
        clock, start, ss = draw_blocks(model, step, args.draws, seed=trial, between=eval_block)
        sizes.append(float(np.asarray(ss["batch_size"]).mean()))
        starts.append(start)
        blocks, evals = paired(np.asarray(clock.blocks) - callback, clock.results)
        step_blocks.extend(blocks)
        step_evals.extend(evals)
        clock = draw_blocks(model, noop_step, 10 * args.draws, seed=trial, every=10 * BLOCK,
                            between=eval_block)[0]
        blocks, evals = paired(np.asarray(clock.blocks) - callback, clock.results)
        noop_blocks.extend(blocks)
        noop_evals.extend(evals)
    avg_batch = statistics.mean(sizes)
    step_blocks, step_evals = np.asarray(step_blocks), np.asarray(step_evals)
    noop_blocks, noop_evals = np.asarray(noop_blocks), np.asarray(noop_evals)

    # The target, judged per block: each block of steps against the evaluations timed just
    # before and after it, plus a no-op step (as a share of an evaluation, from the no-op
    # chains' own pairs). The machine's drift cancels within each pair.
    noop_share = float(np.median(noop_blocks / noop_evals))
    ratios = step_blocks / (step_evals * (1.0 + noop_share))
    ratio = float(np.median(ratios))
    ratio_lo, ratio_hi = (float(q) for q in np.quantile(ratios, [0.25, 0.75]))

    def summary(blocks):
        return float(np.quantile(blocks, 0.1)), float(np.median(blocks))

    (t_step_lo, t_step), (t_eval_lo, t_eval), (noop_lo, noop) = (
        summary(step_blocks), summary(step_evals), summary(noop_blocks))
    ratio_unpaired = t_step / (t_eval + noop)

    other = "FAST_RUN" if default_mode() == "NUMBA" else "NUMBA"
    t_other = summary(make_eval(model, other, batch, args.n)())[1]
    t_eval_direct = summary(make_eval(model, default_mode(), batch, args.n, direct=True)())[1]
    t_eval_again = summary(make_eval(model, default_mode(), batch, args.n)())[1]
    with model:
        metro = pm.Metropolis(S=np.array([0.15, 0.15]), tune=False)
    t_metro = run_seconds(model, metro, args.metropolis_draws, seed=0)[0] / args.metropolis_draws

    us = 1e6
    print(f"# MinibatchBarker on the Gaussian mixture (N = {args.n:,}, K = 10^4, sd 0.15, m = 50)")
    print()
    print(f"pymc {pm.__version__}; default backend {default_mode()}; "
          f"{args.trials} trials × {args.draws} draws; times are medians over blocks of "
          f"{BLOCK} calls (10th percentile in brackets)")
    print()
    print("| quantity | value | target |")
    print("| --- | --- | --- |")
    print(f"| average batch size (mean ± sd over trials) | {avg_batch:.1f} ± "
          f"{statistics.pstdev(sizes):.1f} | ≤ 205 (paper 182.3 ± 11.4) |")
    print(f"| time per step (MinibatchBarker in pm.sample, steady state) | {t_step * us:.1f} µs "
          f"({t_step_lo * us:.1f}) | ≤ 2 × (evaluation + no-op step) |")
    print(f"| one-off start of a chain (row store, row sampler, start-point check) | "
          f"{statistics.median(starts) * 1e3:.0f} ms | |")
    print(f"| one minibatch evaluation at b = {batch}: gather of random rows + PyTensor "
          f"Function, {default_mode()} (default), between the step blocks | "
          f"{t_eval * us:.1f} µs ({t_eval_lo * us:.1f}) | |")
    print(f"| no-op PyMC step | {noop * us:.1f} µs ({noop_lo * us:.1f}); "
          f"{noop_share:.2f} × an evaluation | |")
    print(f"| timing callback, subtracted from both steps | {callback * us:.2f} µs | |")
    print(f"| **step / (evaluation + no-op step)**, median of the blocks' paired ratios "
          f"(quartiles) | **{ratio:.2f}** ({ratio_lo:.2f}–{ratio_hi:.2f}) | ≤ 2 |")
    print(f"| the same from the medians above (unpaired) | {ratio_unpaired:.2f} | |")
    print(f"| after the trials: the evaluation again / with the {other} backend / by the "
          f"direct call of the jitted graph (as the step calls it), gather included | "
          f"{t_eval_again * us:.1f} / {t_other * us:.1f} / {t_eval_direct * us:.1f} µs | |")
    print(f"| pm.Metropolis (full-data MH) per draw | {t_metro * 1e3:.1f} ms | |")
    print(f"| speed-up over full-data MH (median step) | {t_metro / t_step:,.0f} × "
          "| ≥ 1000 × |")
    ok = avg_batch <= 205 and ratio <= 2 and t_metro / t_step >= 1000
    print()
    print("all targets met" if ok else "TARGETS NOT MET")
    return ok


if __name__ == "__main__":
    main()
