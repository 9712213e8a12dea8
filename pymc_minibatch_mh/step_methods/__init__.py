"""The PyMC step methods, one module each, named after its class.

Thin classes on :class:`~pymc_minibatch_mh.transition.step.MinibatchStep` (and
:class:`~pymc_minibatch_mh.transition.step_base.MinibatchStepBase` for ``MinibatchGibbs``):
each lists its keywords and supplies its acceptance test (from :mod:`pymc_minibatch_mh.core`)
and its stats. :mod:`~pymc_minibatch_mh.step_methods.auto_choices` holds what
``MinibatchBarker`` chooses itself, :mod:`~pymc_minibatch_mh.step_methods.barker_checks`
the checks of its settings.
"""

from pymc_minibatch_mh.step_methods.austere_mh import AustereMH
from pymc_minibatch_mh.step_methods.exact_mh import ExactMH
from pymc_minibatch_mh.step_methods.mhsublhd import MHSubLhd
from pymc_minibatch_mh.step_methods.minibatch_barker import MinibatchBarker
from pymc_minibatch_mh.step_methods.minibatch_gibbs import MinibatchGibbs

__all__ = ["AustereMH", "ExactMH", "MHSubLhd", "MinibatchBarker", "MinibatchGibbs"]
