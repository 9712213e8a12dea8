"""The PyMC step methods: thin classes on :class:`~pymc_minibatch_mh.adapter.base.MinibatchStep`."""

from pymc_minibatch_mh.step_methods.barker import MinibatchBarker

__all__ = ["MinibatchBarker"]
