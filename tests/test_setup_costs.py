"""Fixed costs of a step: no per-row op evaluated in Python during the set-up or the steps.

PyTensor's Python backend runs an elementwise op through ``Elemwise.perform`` (NumPy, or
one Python call per element where no ufunc fits). A compiled function (C or Numba) never
calls it. So an ``Elemwise.perform`` over as many elements as the data has rows means that
a pass over the data ran in Python: the tests below record the largest input of every such
call while the step is built and sampled.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest
from pytensor.tensor.elemwise import Elemwise

from pymc_minibatch_mh import MinibatchBarker
from pymc_minibatch_mh.model import likelihood

N = 2_000


def _student_t(n: int) -> pm.Model:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(n, 3))
    y = x @ np.array([0.5, -0.3, 0.2]) + 0.5 * rng.standard_t(5.0, size=n)
    with pm.Model() as model:
        b = pm.Normal("b", 0.0, 2.0, shape=3)
        sigma = pm.HalfNormal("sigma", 2.0)
        nu = pm.Gamma("nu", 2.0, 0.1)
        pm.StudentT("y", nu=nu, mu=pm.math.dot(x, b), sigma=sigma, observed=y)
    return model


def _negative_binomial(n: int) -> pm.Model:
    rng = np.random.default_rng(4)
    x = rng.normal(0.0, 0.5, size=(n, 3))
    mu = np.exp(1.0 + x @ np.array([0.3, -0.2, 0.4]))
    y = rng.negative_binomial(2.0, 2.0 / (2.0 + mu))
    with pm.Model() as model:
        c = pm.Normal("c", 0.0, 2.5)
        b = pm.Normal("b", 0.0, 1.0, shape=3)
        alpha = pm.Exponential("alpha", 1.0)
        pm.NegativeBinomial("y", mu=pm.math.exp(c + pm.math.dot(x, b)), alpha=alpha,
                            observed=y)
    return model


@pytest.fixture
def elemwise_sizes(monkeypatch):
    """The largest input (elements) of each ``Elemwise.perform`` call, by scalar op."""
    sizes: list[tuple[int, str]] = []
    perform = Elemwise.perform

    def recording(self, node, inputs, output_storage):
        sizes.append((max((np.size(i) for i in inputs), default=0), str(self.scalar_op)))
        return perform(self, node, inputs, output_storage)

    monkeypatch.setattr(Elemwise, "perform", recording)
    return sizes


@pytest.mark.parametrize("make_model", [_student_t, _negative_binomial],
                         ids=["student_t_unknown_nu", "negbin_exponential_alpha"])
def test_no_elemwise_over_all_rows_in_python(make_model, elemwise_sizes):
    """Regression: the split's check evaluated the model's terms over all rows in
    PyTensor's Python backend (a product of three factors one row at a time)."""
    model = make_model(N)
    with model:
        step = MinibatchBarker(control_variate="taylor")
        pm.sample(draws=5, tune=5, chains=1, cores=1, step=step, progressbar=False,
                  compute_convergence_checks=False, random_seed=1)
    assert elemwise_sizes, "the recorder saw no Python-backend call: it is not in place"
    large = sorted({op for size, op in elemwise_sizes if size >= N})
    assert not large, (f"elementwise ops ran over {N} elements in Python during the set-up "
                       f"or the steps: {large}")


def test_validation_mode_by_rows():
    """The model's own terms of the split's check are compiled from
    VALIDATION_PYTHON_ROWS rows on, for C from VALIDATION_C_ROWS on."""
    assert likelihood.validation_mode(likelihood.VALIDATION_PYTHON_ROWS - 1) == "FAST_COMPILE"
    assert likelihood.validation_mode(likelihood.VALIDATION_PYTHON_ROWS) == \
        likelihood.default_mode()
    assert likelihood.validation_mode(likelihood.VALIDATION_C_ROWS) == likelihood.C_MODE
    assert likelihood.VALIDATION_PYTHON_ROWS < N
