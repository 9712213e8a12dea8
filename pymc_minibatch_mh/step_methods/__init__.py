"""The PyMC step methods.

Thin classes on :class:`~pymc_minibatch_mh.transition.step.MinibatchStep`.
"""

from pymc_minibatch_mh.step_methods.austere import AustereMH
from pymc_minibatch_mh.step_methods.barker import MinibatchBarker
from pymc_minibatch_mh.step_methods.exact import ExactMH
from pymc_minibatch_mh.step_methods.gibbs import MinibatchGibbs
from pymc_minibatch_mh.step_methods.subsampling import MHSubLhd

__all__ = ["AustereMH", "ExactMH", "MHSubLhd", "MinibatchBarker", "MinibatchGibbs"]
