"""Barker's acceptance function ``g(Δ) = 1 / (1 + e^{−Δ})``, the standard logistic CDF.

The one implementation of ``g`` in the package: the exact Barker test, the minibatch
test's statistics and error estimates, the audit and the correction solvers (whose
target, the logistic CDF ``S``, is the same function) all call :func:`barker_probability`,
compiled with Numba so that compiled code calls it too, or its elementwise form
:func:`barker_probabilities` (the same compiled function applied to each element).
:func:`barker_accepts` is Barker's exact decision given Δ, accepting with probability
``g(Δ)``.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["barker_accepts", "barker_probabilities", "barker_probability"]


@numba.njit(cache=True, nogil=True)
def barker_probability(delta: float) -> float:
    """Barker's acceptance probability ``g(Δ) = 1 / (1 + exp(-Δ))``, overflow-safe.

    Parameters
    ----------
    delta : float
        Log acceptance ratio.

    Returns
    -------
    float
        The probability (NaN for NaN).

    Examples
    --------
    >>> barker_probability(0.0)
    0.5
    >>> barker_probability(-1000.0)
    0.0

    """
    if delta >= 0:
        return 1.0 / (1.0 + math.exp(-delta))
    e = math.exp(delta)
    return e / (1.0 + e)


@numba.njit(cache=True, nogil=True)
def _barker_probabilities(delta: NDArray[np.float64]) -> NDArray[np.float64]:  # pragma: no cover
    out = np.empty_like(delta)
    for i in range(delta.shape[0]):
        out[i] = barker_probability(delta[i])
    return out


def barker_probabilities(delta: ArrayLike) -> NDArray[np.float64]:
    """:func:`barker_probability` of each element of an array.

    Parameters
    ----------
    delta : array_like
        Log acceptance ratios, any shape.

    Returns
    -------
    numpy.ndarray
        ``g`` of each element, float64, of the same shape.

    Examples
    --------
    >>> barker_probabilities([[0.0, -1000.0]])
    array([[0.5, 0. ]])

    """
    values = np.asarray(delta, dtype=np.float64)
    flat = np.ascontiguousarray(values.reshape(-1))
    return _barker_probabilities(flat).reshape(values.shape)


def barker_accepts(rng: np.random.Generator, delta: float) -> bool:
    """Barker's exact decision given Δ: accept iff ``Δ + X_log > 0``, ``X_log`` standard logistic.

    It accepts with probability ``g(Δ)`` (:func:`barker_probability`).

    Parameters
    ----------
    rng : numpy.random.Generator
        Source of ``X_log`` (one ``logistic()`` draw).
    delta : float
        Δ (or Δ* when the test decides given its estimate).

    Returns
    -------
    bool
        The decision.

    Examples
    --------
    >>> barker_accepts(np.random.default_rng(0), 50.0)
    True

    """
    return bool(delta + rng.logistic() > 0.0)
