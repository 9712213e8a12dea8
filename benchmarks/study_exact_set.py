"""Study: which rows of the zoo's crossed model the test can leave to its minibatch.

Summing the rows of the levels with little information exactly (an *exact set*) makes
the test read them once per transition, and the surrogate posterior π̃ contain them, so
that NUTS on π̃ reads them at each of its evaluations. This script measures what an exact
set of a given size costs, and what expanding the set's rows around their level's shift
(what ``estimators/predictor_shift.py`` does) costs instead, with the package's own
residuals:

1. the zero-config step samples the model (one chain, ``--draws`` + ``--draws``) and
   gives θ̂ and each level's information (in average rows, as the step counts it);
2. a second step at the same θ̂, built without an exact set, gives every row's residual
   ``r_i`` for pairs (θ, θ′) of posterior draws (``open`` + ``full_pass``);
3. for each threshold (levels with fewer average rows form the set), the table gives the
   set's rows, the sd of the test's estimate of the other rows' sum at m = 100 rows
   (``(N − |E|) sd(r_i, i ∉ E) / 10``), the rows m that bring that sd to 0.5, and
   ``|Σ_{i∈E} r_i|``: the error in the log ratio of a surrogate that expanded the set's
   rows to second order instead of containing their log-likelihood;
4. a second table does the same with the set's rows expanded around their own level's
   shift instead of θ̂ (in NumPy, for this model's Bernoulli-logit rows): row ``i``'s
   expansion point is ``η̂_i`` moved by the change of the effects of its levels in the
   set, ``η̂_i + Σ_f (σ_f z_f[g_fi] − σ̂_f ẑ_f[g_fi])``. Then no row is summed exactly:
   the sd is that of the test's estimate of all N rows' residual sum at m = 100, and
   ``|Σ_{i∈E} r_i|`` the error of a surrogate that used those expansions for the set. (The
   NumPy residuals with no shift are checked against the package's; the package's own
   expansion keeps θ̂'s curvature for the other coefficients' change, and tabulates.)

Run (seconds to a few minutes)::

    PYTHONPATH=$PWD python benchmarks/study_exact_set.py --n 3e4
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import pymc as pm
import pytensor
from scipy.special import expit

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_model_zoo import crossed_data, family_rng, make_model

from pymc_minibatch_mh import MinibatchBarker
from pymc_minibatch_mh.estimators import predictor_set

THRESHOLDS = (2, 5, 10, 20, 30, 50, 80, 150, 300, 1000)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=float, default=3e4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--draws", type=int, default=500, help="tuning and kept draws, one chain")
    p.add_argument("--pairs", type=int, default=60)
    args = p.parse_args(argv)
    n = int(args.n)
    model = make_model("crossed", n, args.seed)
    groups = crossed_data(n, family_rng("crossed", args.seed))[:2]
    x_data, y_data = crossed_data(n, family_rng("crossed", args.seed))[2:]
    with model:
        step = MinibatchBarker(control_variate="taylor")
        idata = pm.sample(draws=args.draws, tune=args.draws, chains=1, step=step,
                          random_seed=args.seed, progressbar=False,
                          compute_convergence_checks=False)
    cv = step.control_variate
    an, ref, point_map = cv.analysis, cv.reference, step.likelihood.point_map
    information = -np.diag(ref.coef_hessian)
    index = [sl for t, sl in zip(an.terms, an.slices, strict=True) if t.kind == "index"]
    # Each row's least-informed level, in average rows (as _select_exact_set counts them).
    weight = np.full(n, np.inf)
    level_weight = []
    for g, sl in zip(groups, index, strict=True):
        counts = np.bincount(g, minlength=sl.stop - sl.start)
        level_weight.append(predictor_set.average_rows(information[sl], counts, n))
        weight = np.minimum(weight, level_weight[-1][g])
    # The same expansion without an exact set: every row's residual.
    with mock.patch.object(predictor_set, "SHIFTED_LEVEL_ROWS", 0), model:
        bare = MinibatchBarker(control_variate="taylor",
                               reference=point_map.to_point(ref.theta, model.initial_point()))
    cv0 = bare.control_variate
    assert cv0.set_rows == 0
    post = idata.posterior.isel(chain=0)
    to_values = _to_values(model)
    flat = [point_map.to_flat(to_values({name: post[name].values[k] for name in post.data_vars}))
            for k in range(post.sizes["draw"])]
    rng = np.random.default_rng(args.seed)
    residuals, pairs = [], []
    for _ in range(args.pairs):
        i, j = rng.choice(len(flat), 2, replace=False)
        cv0.start_chain(rng, 100)
        cv0.open(flat[i], flat[j], np.array(1.0), 0.0, 100)
        residuals.append(np.array(cv0.full_pass()))
        cv0.close(1)
        pairs.append((i, j))
    r = np.array(residuals)
    draws = [{name: post[name].values[k] for name in post.data_vars}
             for k in range(post.sizes["draw"])]
    hat = _to_constrained(model, point_map.to_point(ref.theta, model.initial_point()))
    shifted = _ShiftedExpansion(hat, groups, x_data, y_data)
    # The NumPy expansion without shifts is the package's: the same residuals.
    check = np.array([shifted.residuals(draws[i], draws[j], [np.zeros(len(w), bool)
                                                              for w in level_weight])
                      for i, j in pairs])
    assert np.allclose(check, r, rtol=1e-6, atol=1e-8 * np.abs(r).max()), "NumPy != package"
    print(f"N = {n:,}; the zero-config step's set: {cv.set_rows:,} rows; "
          f"{args.pairs} pairs of posterior draws\n")
    print("| levels with fewer average rows than | rows in the set | sd at m = 100, "
          "median (90 %) | m for sd 0.5 | abs(sum over the set), median (90 %) |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for thr in THRESHOLDS:
        in_set = weight < thr
        sd = (n - in_set.sum()) * r[:, ~in_set].std(axis=1) / 10.0
        err = np.abs(r[:, in_set].sum(axis=1))
        print(f"| {thr} | {int(in_set.sum()):,} | {np.median(sd):.2f} ({np.quantile(sd, 0.9):.2f})"
              f" | {int(np.median(sd) ** 2 * 100 / 0.25):,} | {np.median(err):.2f} "
              f"({np.quantile(err, 0.9):.2f}) |")
    print("\nThe set's rows expanded around their own level's shift (no row summed exactly):\n")
    print("| levels with fewer average rows than | rows in the set | sd at m = 100, all rows, "
          "median (90 %) | m for sd 0.5 | abs(sum over the set), median (90 %) |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for thr in THRESHOLDS:
        flags = [w < thr for w in level_weight]
        in_set = weight < thr
        r_all = np.array([shifted.residuals(draws[i], draws[j], flags) for i, j in pairs])
        sd = n * r_all.std(axis=1) / 10.0
        err = np.abs(r_all[:, in_set].sum(axis=1))
        print(f"| {thr} | {int(in_set.sum()):,} | {np.median(sd):.2f} ({np.quantile(sd, 0.9):.2f})"
              f" | {int(np.median(sd) ** 2 * 100 / 0.25):,} | {np.median(err):.3f} "
              f"({np.quantile(err, 0.9):.3f}) |")


class _ShiftedExpansion:
    """This model's rows expanded to second order in η around ``η̂`` moved by level shifts."""

    def __init__(self, hat: dict, groups: tuple, x: np.ndarray, y: np.ndarray) -> None:
        self.groups, self.x, self.y = groups, x, y
        self.effects_hat = self._effects(hat)
        self.eta_hat = self._eta(hat)

    def _effects(self, v: dict) -> list[np.ndarray]:
        return [np.asarray(v["sigma_1"]) * np.asarray(v["z_1"]),
                np.asarray(v["sigma_2"]) * np.asarray(v["z_2"])]

    def _eta(self, v: dict) -> np.ndarray:
        e1, e2 = self._effects(v)
        return (float(v["mu"]) + e1[self.groups[0]] + e2[self.groups[1]]
                + self.x @ np.asarray(v["b"]))

    def _residual_at(self, v: dict, flags: list[np.ndarray]) -> np.ndarray:
        """``ℓ_i(θ) − q_i(θ)``, the expansion point shifted by the flagged levels' effects."""
        eta = self._eta(v)
        point = self.eta_hat.copy()
        for g, e, e_hat, f in zip(self.groups, self._effects(v), self.effects_hat, flags,
                                  strict=True):
            point += np.where(f[g], e[g] - e_hat[g], 0.0)
        p = expit(point)
        d = eta - point
        q = _bernoulli_logit(point, self.y) + (self.y - p) * d - 0.5 * p * (1.0 - p) * d * d
        return _bernoulli_logit(eta, self.y) - q

    def residuals(self, cur: dict, prop: dict, flags: list[np.ndarray]) -> np.ndarray:
        """Each row's residual of the log ratio from ``cur`` to ``prop``."""
        return self._residual_at(prop, flags) - self._residual_at(cur, flags)


def _bernoulli_logit(eta: np.ndarray, y: np.ndarray) -> np.ndarray:
    return y * eta - np.logaddexp(0.0, eta)


def _to_constrained(model: pm.Model, point: dict) -> dict:
    """A point of the value variables -> the free variables' constrained values."""
    out = {}
    for rv in model.free_RVs:
        value = model.rvs_to_values[rv]
        transform = model.rvs_to_transforms.get(rv)
        x = np.asarray(point[value.name], dtype=np.float64)
        if transform is not None:
            v = value.type()
            x = np.asarray(pytensor.function([v], transform.backward(v, *rv.owner.inputs),
                                             on_unused_input="ignore")(x))
        out[rv.name] = x
    return out


def _to_values(model: pm.Model):
    """A function: a posterior draw (constrained values) -> the value variables' point."""
    forward = {}
    for rv in model.free_RVs:
        transform = model.rvs_to_transforms.get(rv)
        if transform is not None:
            x = rv.type()
            forward[rv.name] = (model.rvs_to_values[rv].name, pytensor.function(
                [x], transform.forward(x, *rv.owner.inputs), on_unused_input="ignore"))

    def to_values(draw: dict) -> dict:
        point = {}
        for rv in model.free_RVs:
            name, fn = forward.get(rv.name, (rv.name, None))
            value = np.asarray(draw[rv.name], dtype=np.float64)
            point[name] = value if fn is None else np.asarray(fn(value))
        return point

    return to_values


if __name__ == "__main__":
    main()
