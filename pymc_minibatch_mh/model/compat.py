"""Everything that differs between the PyMC 5.x and PyMC 6.x lines, in one place.

- PyMC 5 hands a chain its generator through ``BlockedStep.set_rng(rng)``; PyMC 6 through
  ``BlockedStep.setup_chain(rng, tune, draws)``. :class:`ChainSetupMixin` implements both
  and forwards to one ``_start_chain(rng)`` hook.
- PyMC 5 returns ``arviz.InferenceData`` (ArviZ 0.x); PyMC 6 returns an
  ``xarray.DataTree`` (ArviZ 1.x). :func:`sample_stats` and :func:`posterior` read a group
  from either.
- PyTensor 2.x (with PyMC 5) compiles with the C backend by default; PyTensor 3.x (with
  PyMC 6) with Numba. :func:`default_mode` names the backend the per-step functions are
  compiled with on both lines (Numba, measured faster in ``benchmarks/bench_backends.py``).
- PyTensor 2.x indexes a vector by an integer vector with ``AdvancedSubtensor1`` (or
  ``AdvancedSubtensor``); PyTensor 3.x has ``AdvancedSubtensor`` only:
  :data:`ADVANCED_INDEX_OPS`.
- PyTensor 3.x registers a scalar op's Numba implementation through
  ``register_scalar_funcify`` (which keeps the op's output dtypes); PyTensor 2.x through
  ``register_funcify_and_cache_key``: :func:`register_numba_scalar`.
"""

from __future__ import annotations

from typing import Any

import pymc as pm
import pytensor
import xarray as xr
from pymc.util import get_random_generator
from pytensor.tensor.subtensor import AdvancedSubtensor

__all__ = [
    "ADVANCED_INDEX_OPS",
    "PYMC_MAJOR",
    "PYTENSOR_MAJOR",
    "ChainSetupMixin",
    "default_mode",
    "start_inner_chain",
    "jvp",
    "group",
    "posterior",
    "sample_stats",
    "register_numba_scalar",
]

PYMC_MAJOR: int = int(pm.__version__.split(".")[0])
PYTENSOR_MAJOR: int = int(pytensor.__version__.split(".")[0])
_DATATREE: tuple[type, ...] = (xr.DataTree,) if hasattr(xr, "DataTree") else ()

try:  # PyTensor 2.x; PyTensor 3 has AdvancedSubtensor only
    from pytensor.tensor.subtensor import AdvancedSubtensor1

    #: The op classes of ``v[idx]`` with an integer index vector ``idx``.
    ADVANCED_INDEX_OPS: tuple[type, ...] = (AdvancedSubtensor, AdvancedSubtensor1)
except ImportError:  # pragma: no cover - depends on the installed line
    ADVANCED_INDEX_OPS = (AdvancedSubtensor,)


class ChainSetupMixin:
    """Per-chain set-up hooks of both PyMC lines, forwarded to ``_start_chain``."""

    rng: Any

    def _start_chain(self, rng: Any) -> None:  # pragma: no cover - overridden
        self.rng = get_random_generator(rng, copy=False)

    # PyMC 5.x
    def set_rng(self, rng: Any) -> None:
        """Receive the chain's generator (PyMC 5.x hook)."""
        self._start_chain(get_random_generator(rng, copy=False))

    # PyMC 6.x
    def setup_chain(self, rng: Any, tune: int, draws: int) -> None:
        """Prepare for one chain (PyMC 6.x hook)."""
        self._start_chain(get_random_generator(rng, copy=False))


def start_inner_chain(step: Any, rng: Any) -> None:
    """Give a PyMC step method used inside another step a chain's generator."""
    if PYMC_MAJOR >= 6:
        step.setup_chain(rng, 0, 0)
    else:
        step.set_rng(rng)


def default_mode() -> str:
    """Compilation mode for the per-step functions and the full-data passes.

    Returns
    -------
    str
        ``"NUMBA"`` when numba is importable (a dependency of this package), else
        ``"FAST_RUN"`` (the C backend). ``benchmarks/bench_backends.py`` measured Numba
        1.2–2.4 × faster than C for the minibatch evaluation at b ≤ 200 on PyTensor 2.38 and
        up to 1.5 × faster on PyTensor 3.3 (equal at b = 1000), so Numba is the default on
        both lines; pip-installed PyTensor 2.x also often cannot link BLAS for C.

    """
    try:
        import numba  # noqa: F401
    except ImportError:  # pragma: no cover - numba is a dependency
        return "FAST_RUN"
    return "NUMBA"


def call_cost_rows(mode: Any) -> float:
    """Fixed cost of one call of the per-step function, in rows of work (measured).

    With Numba a call of a step's per-row function costs about 6–7 µs (the row draw, the
    gather, the jitted call and the test's compiled rounds) against 0.05–0.13 µs per row
    on the Gaussian mixture (``benchmarks/bench_gaussian_mixture.py``); PyTensor 2's C
    virtual machine about 28 µs against 0.17 µs per row. Used to choose how many rows
    to evaluate with a step's data-free part
    (:class:`~pymc_minibatch_mh.estimators.ratio.PrefetchPolicy`).
    """
    return 140.0 if str(mode).upper() == "NUMBA" else 165.0


def jvp(f: Any, wrt: Any, tangent: Any) -> Any:
    """Forward-mode derivative of ``f`` at ``wrt`` in the direction ``tangent``.

    PyTensor 3 calls it ``pytensor.gradient.pushforward`` (``Rop`` is deprecated there);
    PyTensor 2 has ``Rop`` only.
    """
    import pytensor.gradient as gradient

    if hasattr(gradient, "pushforward"):
        return gradient.pushforward(f, wrt, tangent)
    return gradient.Rop(f, wrt, tangent)


def group(result: Any, name: str) -> Any:
    """Return a group (``posterior``, ``sample_stats``, ...) of a sampling result.

    Parameters
    ----------
    result : arviz.InferenceData or xarray.DataTree
        What ``pm.sample`` returned.
    name : str
        Group name.

    Returns
    -------
    xarray.Dataset
        The group as a Dataset on either PyMC line.

    """
    obj = result[name]
    return obj.to_dataset() if isinstance(obj, _DATATREE) else obj


def sample_stats(result: Any) -> Any:
    """The ``sample_stats`` group of a sampling result, as an ``xarray.Dataset``."""
    return group(result, "sample_stats")


def posterior(result: Any) -> Any:
    """The ``posterior`` group of a sampling result, as an ``xarray.Dataset``."""
    return group(result, "posterior")


def mcse(draws: Any, method: str = "mean") -> float:
    """Monte Carlo standard error of the mean or sd of one scalar quantity.

    Parameters
    ----------
    draws : array_like
        Draws with shape ``(chain, draw)``, or ``(draw,)`` for one chain.
    method : {"mean", "sd"}
        Which estimate.

    Returns
    -------
    float
        ArviZ's MCSE. ArviZ 0.23's ``mcse(method="sd")`` fails under NumPy ≥ 2.4, so there
        the sd's MCSE is computed as ArviZ 1.x does: by the delta method from ArviZ's
        ESS of the squared deviations.

    """
    import arviz as az
    import numpy as np

    arr = np.asarray(draws, dtype=float)
    if arr.ndim == 1:
        arr = arr[None, :]
    if method == "mean":
        return float(np.asarray(az.mcse(arr, method="mean")).squeeze())
    if method != "sd":
        raise ValueError(f"method must be 'mean' or 'sd', got {method!r}")
    try:
        return float(np.asarray(az.mcse(arr, method="sd")).squeeze())
    except TypeError:
        sq = (arr - arr.mean()) ** 2
        ess = float(np.asarray(az.ess(sq, method="mean")).squeeze())
        var = sq.mean()
        return float(np.sqrt(sq.var() / ess) / (2.0 * np.sqrt(var)))


def register_numba_scalar(op_type: type, funcify: Any) -> None:
    """Register the Numba implementation of the PyTensor scalar op class ``op_type``.

    ``funcify(op, node, **kwargs) -> (numba function, cache key)`` implements it in
    elementwise graphs.
    """
    try:
        from pytensor.link.numba.dispatch.scalar import register_scalar_funcify as register
    except ImportError:  # PyTensor 2.x
        from pytensor.link.numba.dispatch.basic import register_funcify_and_cache_key as register
    register(op_type)(funcify)
