"""Minibatch Metropolis-Hastings acceptance tests as PyMC step methods.

The main entry point is :class:`MinibatchBarker`, the minibatch Barker test of Seita et al.
(UAI 2017). The baselines from the same literature share its interface and stats:
:class:`AustereMH` (Korattikara et al. 2014), :class:`MHSubLhd` (Bardenet et al. 2014) and
:class:`ExactMH` (full-data Metropolis or Barker tests). :class:`MinibatchGibbs` updates
Bernoulli and Categorical variables with the same tests (Korattikara et al. 2014, App. F).

The acceptance tests themselves, the correction distribution, row sampling and error
bounds live in :mod:`pymc_minibatch_mh.core` (NumPy/SciPy only). The PyMC side is four
parts above it: the row store (:mod:`pymc_minibatch_mh.store`), the model's compiled
likelihood (:mod:`pymc_minibatch_mh.model`), the Δ* estimators
(:mod:`pymc_minibatch_mh.estimators`) and the proposals
(:mod:`pymc_minibatch_mh.proposals`); :mod:`pymc_minibatch_mh.transition` composes them into
the shared base of the step methods (:mod:`pymc_minibatch_mh.step_methods`).

:func:`posterior` and :func:`sample_stats` read a group of what ``pm.sample`` returned as
an ``xarray.Dataset`` on both PyMC lines (``arviz.InferenceData`` from PyMC 5, an
``xarray.DataTree`` from PyMC 6); :func:`mcse` is ArviZ's Monte Carlo standard error of
one scalar quantity's mean or sd.
"""

import logging as _logging

from pymc_minibatch_mh.core.correction import CorrectionDistribution, get_correction
from pymc_minibatch_mh.diagnostics import audit_summary
from pymc_minibatch_mh.errors import ModelNotSupportedError
from pymc_minibatch_mh.model.compat import mcse, posterior, sample_stats
from pymc_minibatch_mh.step_methods.austere_mh import AustereMH
from pymc_minibatch_mh.step_methods.exact_mh import ExactMH
from pymc_minibatch_mh.step_methods.mhsublhd import MHSubLhd
from pymc_minibatch_mh.step_methods.minibatch_barker import MinibatchBarker
from pymc_minibatch_mh.step_methods.minibatch_gibbs import MinibatchGibbs
from pymc_minibatch_mh.store.sources import ParquetColumn
from pymc_minibatch_mh.transition.schedule import TemperatureSchedule

__version__ = "0.1.0"

# Shown as PyMC shows its "Sequential sampling ..." lines: unless the program configures
# logging, the package's INFO lines (a long set-up's phases, the choices it makes) go to
# standard error, on a terminal or not.
_log = _logging.getLogger("pymc_minibatch_mh")
if not _logging.root.handlers:
    _log.setLevel(_logging.INFO)
    if not _log.handlers:
        _log.addHandler(_logging.StreamHandler())

__all__ = [
    "AustereMH",
    "CorrectionDistribution",
    "ExactMH",
    "MHSubLhd",
    "MinibatchBarker",
    "MinibatchGibbs",
    "ModelNotSupportedError",
    "ParquetColumn",
    "TemperatureSchedule",
    "__version__",
    "audit_summary",
    "get_correction",
    "mcse",
    "posterior",
    "sample_stats",
]
