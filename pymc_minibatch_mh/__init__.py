"""Minibatch Metropolis-Hastings acceptance tests as PyMC step methods.

The main entry point is :class:`MinibatchBarker`, the minibatch Barker test of Seita et al.
(UAI 2017). The acceptance tests themselves, the correction distribution, row sampling
and error bounds live in :mod:`pymc_minibatch_mh.core` (NumPy/SciPy only); the PyMC
adapter in :mod:`pymc_minibatch_mh.adapter`.
"""

from pymc_minibatch_mh.adapter.likelihood import ModelNotSupportedError
from pymc_minibatch_mh.core.correction import CorrectionDistribution, get_correction
from pymc_minibatch_mh.step_methods.barker import MinibatchBarker

__version__ = "0.1.0"

__all__ = [
    "CorrectionDistribution",
    "MinibatchBarker",
    "ModelNotSupportedError",
    "__version__",
    "get_correction",
]
