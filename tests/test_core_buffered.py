"""BufferedGenerator: the same distributions as numpy's Generator, reproducibly."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from scipy import stats

from pymc_minibatch_mh.core.buffered import BufferedGenerator

N_DRAWS = 20_000  # > several blocks, so refills are covered


def draws(rng: BufferedGenerator, method: str) -> np.ndarray:
    return np.array([getattr(rng, method)() for _ in range(N_DRAWS)])


@pytest.mark.parametrize(
    ("method", "law"),
    [("standard_normal", stats.norm), ("random", stats.uniform), ("logistic", stats.logistic)],
)
def test_scalar_draws_follow_the_law(method: str, law: stats.rv_continuous) -> None:
    values = draws(BufferedGenerator(np.random.default_rng(11)), method)
    assert all(type(v) is float for v in values[:5].tolist())
    # KS at the 0.1 % level: fails for a wrong law (a shift of 0.05 sd gives p ≈ 1e-11).
    assert stats.kstest(values, law.cdf).pvalue > 1e-3


def test_vector_draws_follow_the_law_and_stay_fixed() -> None:
    rng = BufferedGenerator(np.random.default_rng(12), block=128)
    vectors = [rng.standard_normal(3) for _ in range(N_DRAWS // 3)]
    kept = [v.copy() for v in vectors]
    for v in vectors[::7]:
        v *= 100.0  # callers may modify their draws in place ...
    for _ in range(500):
        rng.standard_normal(3)
    # ... without changing any other draw, earlier or later.
    untouched = [i for i in range(len(vectors)) if i % 7]
    assert all(np.array_equal(vectors[i], kept[i]) for i in untouched)
    values = np.concatenate(kept)
    assert stats.kstest(values, stats.norm.cdf).pvalue > 1e-3
    # Consecutive vectors are independent: lag-one correlation within N(0, 1/√n).
    first = np.array([k[0] for k in kept])
    r = np.corrcoef(first[:-1], first[1:])[0, 1]
    assert abs(r) < 4.0 / np.sqrt(first.size)


def test_same_seed_same_values_and_shared_state() -> None:
    def run(seed: int) -> list[float]:
        rng = BufferedGenerator(np.random.default_rng(seed))
        out = []
        for _ in range(3000):
            out += [rng.standard_normal(), rng.random(), rng.logistic(), *rng.standard_normal(2)]
            out.append(float(rng.integers(0, 10)))  # not buffered: the shared state
        return out

    assert run(5) == run(5)
    assert run(5) != run(6)
    base = np.random.default_rng(7)
    rng = BufferedGenerator(base)
    assert rng.bit_generator is base.bit_generator
    before = base.bit_generator.state["state"]["state"]
    rng.random()  # draws a whole block from the shared state
    assert base.bit_generator.state["state"]["state"] != before


def test_other_sizes_and_arguments_go_to_generator() -> None:
    rng = BufferedGenerator(np.random.default_rng(8))
    assert rng.standard_normal(1000).shape == (1000,)
    assert rng.random((2, 3)).shape == (2, 3)
    assert rng.standard_normal(2, dtype=np.float32).dtype == np.float32
    assert rng.logistic(0.0, 1.0, size=4).shape == (4,)
    loc_scale = np.array([rng.logistic(3.0, 2.0) for _ in range(N_DRAWS)])
    assert stats.kstest(loc_scale, stats.logistic(3.0, 2.0).cdf).pvalue > 1e-3


def test_pickles_as_a_plain_generator() -> None:
    rng = BufferedGenerator(np.random.default_rng(9))
    rng.random()
    copy = pickle.loads(pickle.dumps(rng))
    assert type(copy) is np.random.Generator
    assert copy.bit_generator.state == rng.bit_generator.state
    with pytest.raises(ValueError, match="block must be at least"):
        BufferedGenerator(np.random.default_rng(0), block=8)
