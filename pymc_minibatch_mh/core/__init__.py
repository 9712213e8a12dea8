"""The acceptance tests and their tools, with NumPy and SciPy only (no PyMC import).

- :mod:`~pymc_minibatch_mh.core.barker`: the minibatch Barker test;
- :mod:`~pymc_minibatch_mh.core.correction`: the correction distribution ``C_σ``;
- :mod:`~pymc_minibatch_mh.core.moments`: running moments and the error bound ε;
- :mod:`~pymc_minibatch_mh.core.rows`: rows without replacement at the cost of a slice;
- :mod:`~pymc_minibatch_mh.core.source`: the minibatch source protocol.
"""

from pymc_minibatch_mh.core.barker import BarkerOutcome, TestOutcome, barker_probability, barker_test
from pymc_minibatch_mh.core.moments import RunningMoments, clt_error_bound
from pymc_minibatch_mh.core.rows import ShuffledRows
from pymc_minibatch_mh.core.source import ArraySource, MinibatchSource

__all__ = [
    "ArraySource",
    "BarkerOutcome",
    "MinibatchSource",
    "RunningMoments",
    "ShuffledRows",
    "TestOutcome",
    "barker_probability",
    "barker_test",
    "clt_error_bound",
]
