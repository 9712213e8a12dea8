"""A PyMC model's per-observation log-likelihood, compiled once as functions of row batches.

:func:`~pymc_minibatch_mh.model.split.split_model` rewrites the model's likelihood so
that the per-row data are inputs; this module compiles the functions a step calls and
owns the model's :class:`~pymc_minibatch_mh.store.row_store.RowStore`:

``delta(x_cur, x_prop, inv_temperature, *rows) -> (l, c)`` with
``l_i = (1/K) [log p(x_i | θ') − log p(x_i | θ)]`` on the given rows, and the data-free
part ``c = log p0(θ') − log p0(θ)`` (priors, Jacobians, Potentials) in the same call.

No O(N) work is done per step and ``pm.set_data`` is never called; data replaced with
``pm.set_data`` between runs (at any size, with a new N too) is read by the row store at
the next chain start.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pymc as pm
import pytensor
import pytensor.gradient
from numpy.typing import NDArray
from pymc.util import get_value_vars_from_user_vars
from pytensor.graph.basic import Variable

from pymc_minibatch_mh.errors import ModelNotSupportedError, StartPointError
from pymc_minibatch_mh.model.checks import validate_split
from pymc_minibatch_mh.model.compat import default_mode
from pymc_minibatch_mh.model.compilation import C_MODE, compile_derived, compile_function
from pymc_minibatch_mh.model.graph import checks_as_ninf, observed_source
from pymc_minibatch_mh.model.internals import direct_call
from pymc_minibatch_mh.model.split import split_model
from pymc_minibatch_mh.store.registry import make_store, resolve_data
from pymc_minibatch_mh.store.row_store import RowStore

__all__ = ["VALIDATION_C_ROWS", "VALIDATION_PYTHON_ROWS", "MinibatchLikelihood", "NonFiniteRows",
           "validation_mode"]


#: From this many rows on, the model's own log-likelihood that checks the split (three
#: evaluations over all rows, :func:`~pymc_minibatch_mh.model.checks.validate_split`) is
#: compiled for PyTensor's C backend (see :func:`validation_mode`).
VALIDATION_C_ROWS: int = 100_000

#: Below this many rows the model's own log-likelihood of the split's check runs in
#: PyTensor's Python backend (``"FAST_COMPILE"``), whose cost per row is then below a
#: compilation's (see :func:`validation_mode`).
VALIDATION_PYTHON_ROWS: int = 1_000

#: The PyTensor mode of the split's per-row function in the check: it is evaluated on
#: subsets of at most 64 rows, where the Python backend costs less than a compilation.
_SUBSET_MODE = "FAST_COMPILE"


def validation_mode(n_rows: int) -> str:
    """The PyTensor mode of the split's reference: the model's own terms on all rows.

    No op runs over all rows in Python: ``"FAST_COMPILE"`` (PyTensor's Python backend,
    0.1 s to compile) evaluates each elementwise op in ``Elemwise.perform``, and an op
    without a NumPy ufunc of its arity (a product of three factors, which PyTensor 2's
    rewrites make) one row at a time in Python. Measured on a Student-t regression with
    unknown ν at N = 3·10⁴: 0.2 s per evaluation on PyTensor 2.38 (90,000 Python calls
    over the check's three), against 0.02 s compiled. So the reference is compiled for
    the per-step functions' backend
    (:func:`~pymc_minibatch_mh.model.compat.default_mode`, Numba: 0.2–1 s to compile,
    2.6–3.7 s for its first call with Numba's cache empty, against 10–12 s for C with
    PyTensor's), where :func:`~pymc_minibatch_mh.model.compilation.compile_function` sends
    a graph with an op that Numba lacks to C. From :data:`VALIDATION_C_ROWS` rows on it
    goes to C (:data:`~pymc_minibatch_mh.model.compilation.C_MODE`) at once on both
    PyTensor lines, where the graph's products of a float32 design run as
    :class:`~pymc_minibatch_mh.model.graph.UpcastDot` (see
    :func:`~pymc_minibatch_mh.model.graph.reference_graph`), which Numba lacks. Below
    :data:`VALIDATION_PYTHON_ROWS` rows the Python backend stays: a few milliseconds per
    evaluation there, against a compilation's second.
    """
    if n_rows >= VALIDATION_C_ROWS:
        return C_MODE
    return default_mode() if n_rows >= VALIDATION_PYTHON_ROWS else "FAST_COMPILE"


class MinibatchLikelihood:
    """Compiled per-observation log-likelihood of a PyMC model, evaluated on row batches.

    Parameters
    ----------
    model : pymc.Model
        The model; its observed variables must share a leading observation dimension of
        length N.
    vars : sequence of Variable
        The variables the step samples (random or value variables).
    initial_point : dict, optional
        Point used for shapes and for the checks; ``model.initial_point()`` by default.
    mode : str or pytensor.compile.Mode, optional
        Compilation mode of the per-step functions (default:
        :func:`~pymc_minibatch_mh.model.compat.default_mode`).
    step_name : str
        Used in error messages.
    allow_discrete : bool
        Accept discrete sampled variables (only the discrete step methods set it; the
        continuous ones refuse them, see
        :func:`~pymc_minibatch_mh.model.checks.check_variables`).
    data : dict, optional
        Per-row data read instead of the model's (``{name: array}``; the model then holds
        a slice of the rows, for shapes), see :mod:`~pymc_minibatch_mh.store.sources`.
    shuffled_copy : bool
        Read the ``data=`` arrays from a shuffled local copy, in blocks of rows
        (:mod:`~pymc_minibatch_mh.store.shuffled`).

    Raises
    ------
    ModelNotSupportedError
        With a message saying what is wrong and what to do (see
        :mod:`~pymc_minibatch_mh.model.checks`).

    """

    def __init__(
        self,
        model: pm.Model,
        vars: Sequence[Variable],
        *,
        initial_point: Mapping[str, Any] | None = None,
        mode: Any = None,
        step_name: str = "MinibatchBarker",
        allow_discrete: bool = False,
        data: Mapping[str, Any] | None = None,
        shuffled_copy: bool = False,
    ) -> None:
        self.model = model
        self.step_name = step_name
        self.mode = mode if mode is not None else default_mode()
        self.object_mode_ops: list[str] = []
        point = dict(initial_point) if initial_point is not None else model.initial_point()
        #: The point used for shapes and checks (and as the start of searches).
        self.initial_point: dict[str, Any] = point
        self.value_vars: list[Variable] = get_value_vars_from_user_vars(vars, model)
        split = split_model(
            model, self.value_vars, point, step_name, allow_discrete=allow_discrete
        )
        #: The symbolic graphs, for estimators that build other per-step functions on the
        #: same per-row likelihood (e.g. control variates).
        self.graphs = split.graphs
        self.point_map = split.point_map
        self.other_shared = split.other_shared
        self.observed_names = split.observed_names
        aliases = {rv.name: observed_source(model.rvs_to_values[rv])
                   for rv in model.observed_RVs}
        #: The only owner of the per-row data (see :mod:`~pymc_minibatch_mh.store.row_store`).
        self.store = make_store(split.row_vars, resolve_data(split.row_vars, data, aliases),
                                shuffled_copy=shuffled_copy)
        # The split is validated on the model's own data (with data=: its slice).
        model_rows = RowStore(split.row_vars) if data else self.store
        self.n_rows_initial = self.store.n_rows

        g = self.graphs
        # The per-step functions are compiled on first use, so a path that does not use
        # one never compiles it.
        self._prior_grad_fn: Any = None
        # The split's per-row log-likelihood against the model's own terms on all rows
        # (not split), neither kept after the check: what is checked is the graph, and a
        # step's own compiled per-row function (``_rows_fn``) is loaded only by a path that
        # evaluates rows with it. The first runs on subsets of a few rows (Python
        # backend), the second over all rows (compiled: validation_mode).
        rows_fn = self.compile([g.flat, *g.data], g.row_loglik, mode=_SUBSET_MODE)
        model_fn = self.compile([g.flat], g.full_loglik, mode=validation_mode(split.n_rows))
        validate_split(
            model, point, n_rows=split.n_rows, set_point=self._set_point,
            full_loglik=model_fn,
            rows_loglik=lambda x, rows: rows_fn(x, *model_rows.rows(rows)),
            data_lengths=model_rows.lengths,
        )
        self._structure = self._model_structure()

    @functools.cached_property
    def _rows_fn(self) -> Any:
        g = self.graphs
        return self.compile([g.flat, *g.data], g.row_loglik)

    @functools.cached_property
    def _delta_fn(self) -> Any:
        g = self.graphs
        return self.compile(
            [g.x_cur, g.x_prop, g.inv_temperature, *g.data], [g.ratios, g.prior_delta]
        )

    @functools.cached_property
    def delta_fast(self) -> Any:
        """:meth:`delta` without PyTensor's per-call wrapper; compiled on first use.

        See :func:`~pymc_minibatch_mh.model.internals.direct_call`.
        """
        return direct_call(self._delta_fn)

    @functools.cached_property
    def _prior_direct(self) -> Any:
        g = self.graphs
        return direct_call(self.compile([g.flat], g.prior))

    def compile(self, inputs: list[Variable], outputs: Any, mode: Any = None, *,
                recipe: str = "",
                derive: Callable[[], tuple[list[Variable], Any]] | None = None) -> Any:
        """A compiled function of ``inputs`` (PyMC's checks turned into ``-inf``).

        Inputs must be given in their exact types (``trust_input``). With ``derive``, the
        function is that of the inputs and outputs ``derive()`` returns, derived from the
        graph of ``inputs`` and ``outputs`` by the derivation ``recipe`` names; it is
        derived only when it is not in the cache (see
        :func:`~pymc_minibatch_mh.model.compilation.compile_derived`).
        """
        def as_ninf(outs: Any) -> Any:
            if isinstance(outs, Variable):
                return checks_as_ninf([outs])[0]
            return checks_as_ninf(outs)

        if derive is None:
            fn, object_mode_ops = compile_function(inputs, as_ninf(outputs), mode or self.mode)
        else:
            def derived() -> tuple[list[Variable], Any]:
                fn_inputs, fn_outputs = derive()
                return fn_inputs, as_ninf(fn_outputs)

            fn, object_mode_ops, _ = compile_derived(inputs, outputs, recipe, derived,
                                                     mode or self.mode)
        #: Ops without a Numba implementation met while compiling; the functions that
        #: contain them run on PyTensor's C backend (never in Numba's object mode).
        self.object_mode_ops = sorted({*self.object_mode_ops, *object_mode_ops})
        fn.trust_input = True
        return fn

    # ------------------------------------------------------------------ checks
    def data_lengths(self) -> dict[str, int | None]:
        """Leading lengths of the observed data and every length-N covariate, by name."""
        return self.store.lengths()

    def _model_structure(self) -> dict[str, list[str]]:
        model = self.model
        return {
            "observed variables": [rv.name for rv in model.observed_RVs],
            "Potentials": [pot.name for pot in model.potentials],
        }

    def check_model_unchanged(self) -> None:
        """Refuse a model that gained observed variables or Potentials after compilation.

        The likelihood and the data-free part are compiled once, when the step is built; a
        term added to the model afterwards would be silently left out of every step.
        """
        now = self._model_structure()
        changed = {k: (v, now[k]) for k, v in self._structure.items() if now[k] != v}
        if changed:
            detail = "; ".join(
                f"{k}: {old} when built, {new} now" for k, (old, new) in changed.items()
            )
            raise ModelNotSupportedError(
                f"The model changed after this {self.step_name} was built ({detail}). The "
                "step compiles the model's terms once and would leave the new ones out: "
                f"create the {self.step_name} after the model is complete (build it again "
                "after adding variables)."
            )

    def n_rows(self) -> int:
        """Read the current data (after ``pm.set_data``) into the row store and return N.

        Called at each chain start; also checks that the model has not gained observed
        variables or Potentials since the step was built (:meth:`check_model_unchanged`).
        """
        self.check_model_unchanged()
        return self.store.refresh()

    # --------------------------------------------------------------- per step
    def set_others(self, point: Mapping[str, Any]) -> None:
        """Set the free variables not sampled by this step from ``point``."""
        for name, shared in self.other_shared.items():
            shared.set_value(point[name], borrow=True)

    def _set_point(self, point: Mapping[str, Any]) -> NDArray[np.float64]:
        self.set_others(point)
        return self.point_map.to_flat(point)

    def delta(
        self,
        x_cur: NDArray[np.float64],
        x_prop: NDArray[np.float64],
        rows: NDArray[np.int64],
        inv_temperature: NDArray[np.float64],
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Tempered ratios ``l_i`` of the given rows (row indices), and the data-free part.

        Returns
        -------
        tuple of numpy.ndarray
            ``(l, log p0(θ') − log p0(θ))``, the second a 0-d array.

        """
        return self._delta_fn(x_cur, x_prop, inv_temperature, *self.store.rows(rows))

    def prior_delta(self, x_cur: NDArray[np.float64], x_prop: NDArray[np.float64]) -> float:
        """``log p0(θ') − log p0(θ)`` (priors, Jacobians and Potentials), as a step computes it."""
        no_rows = np.empty(0, dtype=np.int64)
        return float(self.delta(x_cur, x_prop, no_rows, np.array(1.0))[1])

    def prior_gradient(self, x: NDArray[np.float64]) -> NDArray[np.float64]:
        """Gradient of the log prior (with Jacobians and Potentials) at ``x``.

        Compiled on first use (the surrogate-guided proposals need it; nothing else does).
        """
        if self._prior_grad_fn is None:
            g = self.graphs
            self._prior_grad_fn = direct_call(
                self.compile([g.flat], pytensor.gradient.grad(g.prior, g.flat))
            )
        return self._prior_grad_fn(x)

    def prior(self, x: NDArray[np.float64]) -> float:
        """Log prior with Jacobians and Potentials at ``x``."""
        return float(self._prior_direct(x))

    def row_loglik(self, x: NDArray[np.float64], rows: NDArray[np.int64]) -> NDArray[np.float64]:
        """Per-row log-likelihood at one state, on the given rows (row indices)."""
        return self._rows_fn(x, *self.store.rows(rows))

    def full_loglik(self, x: NDArray[np.float64]) -> NDArray[np.float64]:
        """Per-row log-likelihood at one state over all rows, in bounded-memory chunks."""
        return np.concatenate([self._rows_fn(x, *chunk) for chunk in self.store.chunks()])

    def check_point(self, point: Mapping[str, Any], rows: bool = True,
                    prior: float | None = None, fix: str = "initvals=...") -> None:
        """Raise a clear error if the log-probability at ``point`` is not finite.

        ``rows=True``: every row's log-likelihood is evaluated (one O(N) pass);
        ``rows=False``: the values and the prior only, for a point where a pass the caller
        made on the same data found every row finite. ``prior``: the log prior at the
        point, where the caller has it (the set-up's, at θ̂), instead of evaluating it
        (which compiles the prior's function on first use); None or NaN: not known.
        ``fix``: where the user gives other initial values (a chain's start:
        ``pm.sample``'s ``initvals=``).

        Raises
        ------
        StartPointError
            If a value, the prior or a row's log-likelihood is not finite at ``point``.
        """
        missing = [name for name in self.other_shared if name not in point]
        if missing:
            raise ModelNotSupportedError(
                f"The point has no values for {missing}, which the model of this "
                f"{self.step_name} has: the step was built for another model. Create the "
                "step inside `with model:` of the model you sample."
            )
        self.set_others(point)
        x = self.point_map.to_flat(point)
        if prior is None or math.isnan(prior):  # not known: evaluated
            prior = self.prior(x)
        bad_vars = [k for k, v in point.items() if not np.all(np.isfinite(np.asarray(v, float)))]
        if bad_vars:
            raise StartPointError(
                f"The start point has non-finite values for {bad_vars}. Give finite initial "
                f"values ({fix}) or let PyMC choose them."
            )
        if not math.isfinite(prior):
            raise StartPointError(
                f"The prior log-probability (with Jacobians and Potentials) is {prior} at the "
                f"start point {dict(point)}. Choose initial values inside the support "
                f"({fix})."
            )
        if not rows:
            return
        n_bad, first, start = 0, None, 0
        # Streamed (bounded memory at any N); on the cluster for a Dask store.
        for rows, bad, position, value in self.store.reduce(NonFiniteRows(self._rows_fn), x):
            if bad and first is None:
                first = (start + position, value)
            n_bad += bad
            start += rows
        if first is not None:
            raise StartPointError(
                f"The log-likelihood is not finite at the start point for {n_bad} of "
                f"{start} observations (first at row {first[0]}: {first[1]}). "
                "Choose initial values under which every observation has positive "
                f"likelihood ({fix}), or check the data for invalid values."
            )


class NonFiniteRows:
    """Counts the rows of a chunk whose log-likelihood is not finite (picklable).

    ``NonFiniteRows(rows_fn)(x, *rows)`` is ``(rows, bad, first, value)``: the chunk's
    rows, how many are not finite, the first one's position in the chunk and its value
    (-1 and NaN when none). A Dask row store runs it on the workers
    (:meth:`~pymc_minibatch_mh.store.row_store.RowStore.reduce`).
    """

    def __init__(self, rows_fn: Any) -> None:
        self.rows_fn = rows_fn

    def __call__(self, x: NDArray[np.float64], *rows: NDArray[Any]) -> tuple[int, int, int,
                                                                            float]:
        """``(rows, bad, first, value)`` of the chunk at ``x``."""
        loglik = self.rows_fn(x, *rows)
        bad = np.flatnonzero(~np.isfinite(loglik))
        if not bad.size:
            return loglik.shape[0], 0, -1, math.nan
        return loglik.shape[0], int(bad.size), int(bad[0]), float(loglik[bad[0]])
