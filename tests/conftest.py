from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

# Keep test output readable: ArviZ 0.x announces its refactor on import.
warnings.filterwarnings("ignore", category=FutureWarning, module="arviz")
os.environ.setdefault("PYTENSOR_FLAGS", "")


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
