"""The Gaussian mixture of Seita et al. (2017, section 6.1), after Welling and Teh (2011).

θ = (θ1, θ2) with θ ~ N(0, diag(10, 1)) (variances) and
x_i ~ 0.5 N(θ1, 2) + 0.5 N(θ1 + θ2, 2) (variance 2), generated at θ = (0, 1). The paper
uses N = 10⁶ observations and temperature K = 10,000, which gives back the shape of the
original 100-observation posterior: two modes, near (0, 1) and (1, −1).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray
from scipy.special import logsumexp
from scipy.stats import norm

if TYPE_CHECKING:
    import pymc as pm

__all__ = [
    "PRIOR_VARIANCES",
    "TRUE_THETA",
    "X_VARIANCE",
    "gaussian_mixture_data",
    "gaussian_mixture_model",
    "log_posterior_grid",
]

PRIOR_VARIANCES = (10.0, 1.0)
X_VARIANCE = 2.0
TRUE_THETA = (0.0, 1.0)


def gaussian_mixture_data(n: int = 1_000_000, seed: int = 0) -> NDArray[np.float64]:
    """Draw the data set: ``n`` observations at θ = (0, 1).

    Parameters
    ----------
    n : int
        Number of observations (the paper: 10⁶).
    seed : int
        Seed of the generator.

    Returns
    -------
    numpy.ndarray
        The observations.

    """
    rng = np.random.default_rng(seed)
    loc = np.where(rng.random(n) < 0.5, TRUE_THETA[0], TRUE_THETA[0] + TRUE_THETA[1])
    return loc + math.sqrt(X_VARIANCE) * rng.standard_normal(n)


def gaussian_mixture_model(x: NDArray[np.float64]) -> pm.Model:
    """The PyMC model of section 6.1 (the temperature is a setting of the step method).

    Parameters
    ----------
    x : numpy.ndarray
        Observations.

    Returns
    -------
    pymc.Model
        A model with free variable ``theta`` (shape 2) and observed ``x``.

    """
    import pymc as pm
    import pytensor.tensor as pt

    with pm.Model() as model:
        theta = pm.Normal("theta", 0.0, sigma=np.sqrt(PRIOR_VARIANCES), shape=2)
        pm.NormalMixture(
            "x",
            w=np.array([0.5, 0.5]),
            mu=pt.stack([theta[0], theta[0] + theta[1]]),
            sigma=math.sqrt(X_VARIANCE),
            observed=x,
        )
    return model


def log_posterior_grid(
    x: NDArray[np.float64],
    temperature: float,
    theta1: NDArray[np.float64],
    theta2: NDArray[np.float64],
    bins: int = 4000,
) -> NDArray[np.float64]:
    """Tempered log posterior (unnormalised) on a grid, from binned data.

    The data are summarised by a histogram of ``bins`` equal bins (the likelihood of each
    bin's observations is evaluated at the bin centre), which makes the cost independent
    of N; with 4,000 bins over the data's range the effect on the tempered posterior is
    far below the Monte Carlo error of any sampler run.

    Parameters
    ----------
    x : numpy.ndarray
        Observations.
    temperature : float
        K; the likelihood is raised to 1/K.
    theta1, theta2 : numpy.ndarray
        Grid coordinates (1-d).
    bins : int
        Number of histogram bins summarising the data.

    Returns
    -------
    numpy.ndarray
        Array of shape ``(len(theta2), len(theta1))``: log prior + (1/K) log likelihood.

    """
    counts, edges = np.histogram(x, bins=bins)
    centres = 0.5 * (edges[1:] + edges[:-1])
    keep = counts > 0
    counts, centres = counts[keep], centres[keep]
    t1, t2 = np.meshgrid(theta1, theta2)
    sd = math.sqrt(X_VARIANCE)
    out = np.empty(t1.shape)
    for i in range(t1.shape[0]):
        a = norm.logpdf(centres[None, :], t1[i][:, None], sd)
        b = norm.logpdf(centres[None, :], (t1[i] + t2[i])[:, None], sd)
        loglik = logsumexp(np.stack([a, b]), axis=0) + math.log(0.5)
        out[i] = loglik @ counts / temperature
    out += norm.logpdf(t1, 0, math.sqrt(PRIOR_VARIANCES[0]))
    out += norm.logpdf(t2, 0, math.sqrt(PRIOR_VARIANCES[1]))
    return out
