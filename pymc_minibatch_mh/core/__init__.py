"""The acceptance tests and their tools, with NumPy, SciPy and Numba only (no PyMC import).

- :mod:`~pymc_minibatch_mh.core.barker`: the minibatch Barker test (Seita et al. 2017),
  its rows per round sized by an error budget in :mod:`~pymc_minibatch_mh.core.batch_budget`;
- :mod:`~pymc_minibatch_mh.core.austere`: AustereMH's sequential t-test (Korattikara et
  al. 2014), with its error analysis in :mod:`~pymc_minibatch_mh.core.austere_error` and
  :mod:`~pymc_minibatch_mh.core.austere_step_error`, its designs in
  :mod:`~pymc_minibatch_mh.core.austere_design`;
- :mod:`~pymc_minibatch_mh.core.subsampling`: MHSubLhd's adaptive subsampling test
  (Bardenet et al. 2014);
- :mod:`~pymc_minibatch_mh.core.exact`: the exact full-data Metropolis and Barker tests;
- :mod:`~pymc_minibatch_mh.core.common`: what the threshold tests share;
- :mod:`~pymc_minibatch_mh.core.correction`: the correction distribution ``C_σ``, built by
  the solvers of :mod:`~pymc_minibatch_mh.core.correction_solvers`;
- :mod:`~pymc_minibatch_mh.core.moments`: running moments, the finite-population variance
  ``s²`` of Δ* and the (estimated) error ε;
- :mod:`~pymc_minibatch_mh.core.logistic`: Barker's function ``g`` (the logistic CDF);
- :mod:`~pymc_minibatch_mh.core.penalty`: the penalty test's acceptance function ``h_σ``
  (Ceperley and Dewing 1999) and its exact correction, run by the Barker test's rounds;
- :mod:`~pymc_minibatch_mh.core.acceptance_error`: the Barker test's acceptance
  probability given its minibatch and the per-step error estimates;
- :mod:`~pymc_minibatch_mh.core.rows`: rows without replacement at the cost of a slice;
- :mod:`~pymc_minibatch_mh.core.buffered`: a ``Generator`` with scalar draws in blocks;
- :mod:`~pymc_minibatch_mh.core.source`: the minibatch source protocol;
- :mod:`~pymc_minibatch_mh.core.arrays`: the array copy of the compiled kernels.
"""

from pymc_minibatch_mh.core.austere import (
    AustereDesign,
    AustereOutcome,
    austere_nc_test,
    austere_test,
    conservative_design,
    design_table,
    sequential_test_error,
    worst_case_error,
)
from pymc_minibatch_mh.core.barker import (
    BarkerOutcome,
    TestOutcome,
    barker_decision,
    barker_probability,
    barker_test,
)
from pymc_minibatch_mh.core.buffered import BufferedGenerator
from pymc_minibatch_mh.core.correction import CorrectionDistribution, get_correction
from pymc_minibatch_mh.core.exact import ExactOutcome, exact_test
from pymc_minibatch_mh.core.moments import RunningMoments, clt_error_bound
from pymc_minibatch_mh.core.rows import PartialShuffleRows
from pymc_minibatch_mh.core.source import ArraySource, MinibatchSource
from pymc_minibatch_mh.core.subsampling import MHSubLhdOutcome, mhsublhd_test

__all__ = [
    "ArraySource",
    "AustereDesign",
    "AustereOutcome",
    "BarkerOutcome",
    "BufferedGenerator",
    "CorrectionDistribution",
    "ExactOutcome",
    "MHSubLhdOutcome",
    "MinibatchSource",
    "RunningMoments",
    "PartialShuffleRows",
    "TestOutcome",
    "austere_nc_test",
    "austere_test",
    "barker_decision",
    "barker_probability",
    "barker_test",
    "clt_error_bound",
    "conservative_design",
    "design_table",
    "exact_test",
    "get_correction",
    "mhsublhd_test",
    "sequential_test_error",
    "worst_case_error",
]
