"""Data sets and models of the paper's experiments (generated, never downloaded)."""

from pymc_minibatch_mh.datasets.gaussian_mixture import (
    gaussian_mixture_data,
    gaussian_mixture_model,
    log_posterior_grid,
)

__all__ = ["gaussian_mixture_data", "gaussian_mixture_model", "log_posterior_grid"]
