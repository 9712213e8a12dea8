r"""The settings every step method shares, and their documentation.

Each public step method lists every keyword it takes on its own ``__init__``, with a type
and a default. What several of them share is gathered here once:

- :class:`StepSettings`: what every step method takes (the data, the model, the
  generator, the compilation), read by
  :class:`~pymc_minibatch_mh.transition.step_base.MinibatchStepBase`;
- :class:`MoveSettings`: what the Metropolis-Hastings steps add (the proposal, its tuning,
  the control variates, the audit), read by
  :class:`~pymc_minibatch_mh.transition.step.MinibatchStep`;
- :data:`SHARED_PARAMETERS`: the docstring entry of each shared keyword, which
  :func:`document_parameters` puts into a step method's docstring for every keyword of
  its signature that the docstring does not document itself.

A step method builds both objects with :meth:`KeywordSettings.take` from its own
``locals()``, so a keyword reaches the code that reads it under its own name, with no
``**kwargs`` in between.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, TypeVar

__all__ = [
    "SHARED_PARAMETERS",
    "KeywordSettings",
    "MoveSettings",
    "StepSettings",
    "document_parameters",
    "documented_parameters",
    "signature_parameters",
]

_Settings = TypeVar("_Settings", bound="KeywordSettings")


class KeywordSettings:
    """The base of the settings dataclasses: they pick their fields out of a step's keywords."""

    @classmethod
    def take(cls: type[_Settings], values: Mapping[str, Any]) -> _Settings:
        """The settings named in ``values`` (a step's ``locals()``); others keep defaults."""
        return cls(**{f.name: values[f.name] for f in fields(cls) if f.name in values})


@dataclass(frozen=True)
class StepSettings(KeywordSettings):
    """What every step method takes besides its test's own settings."""

    batch_size: int = 100
    temperature: Any = 1.0
    model: Any = None
    rng: Any = None
    initial_point: Mapping[str, Any] | None = None
    mode: Any = None
    check_start: bool = True
    prefetch: int | str = "auto"
    blocked: bool = True
    data: Mapping[str, Any] | None = None
    shuffled_copy: bool = False


@dataclass(frozen=True)
class MoveSettings(KeywordSettings):
    """What the Metropolis-Hastings step methods add: the proposal and the estimator."""

    S: Any = None
    scaling: float = 1.0
    tune: bool = True
    target_accept: float | None = None
    control_variate: str | None = None
    reference: Mapping[str, Any] | None = None
    recenter: float | None = None
    proposal: Any = None
    audit_every: int | None = None
    steps_per_draw: int | str = "auto"


#: The docstring entry (numpydoc: the type line, then the indented description) of each
#: keyword that several step methods share.
SHARED_PARAMETERS: dict[str, str] = {
    "temperature": """\
temperature : float or TemperatureSchedule, default 1.0
    K > 0: the likelihood is raised to ``1/K`` (the prior is not). Since ``s²`` scales as
    ``1/K²``, high temperatures allow small minibatches. A
    :class:`~pymc_minibatch_mh.TemperatureSchedule` changes K (and multiplies the proposal
    scale) at given iterations of each chain, e.g. tempered exploration followed by
    sampling at K = 1.""",
    "S": """\
S : array_like or "laplace", optional
    Proposal standard deviations (vector) or covariance matrix on the flattened,
    transformed space, as in ``pm.Metropolis``. Default: ones. ``"laplace"`` (with
    ``control_variate``): the Laplace covariance at θ̂ at the initial temperature; use it
    with ``scaling`` about ``2.38/√d``.""",
    "scaling": """\
scaling : float, default 1.0
    Multiplies the proposal. With ``tune=True`` it is adapted during PyMC's tuning phase
    towards ``target_accept`` (:class:`~pymc_minibatch_mh.proposals.tuning.ScalingTuner`),
    then fixed.""",
    "tune": """\
tune : bool, default True
    Whether to tune ``scaling`` during the tuning phase.""",
    "target_accept": """\
target_accept : float, optional
    Target acceptance probability of the tuning. Default: 0.4 with a surrogate proposal,
    else 0.25, times the share of a perfect proposal the test accepts against Barker's 1/2
    (the penalty test's is higher).""",
    "control_variate": """\
control_variate : {None, "auto", "taylor", "taylor_theta", "taylor_predictor"}, default None
    How Δ is estimated. None: the plain minibatch estimate (the papers' tests).
    ``"taylor"``: second-order Taylor control variates around a reference point θ̂ (the
    closed-form full-data sum of the expansions plus a minibatch estimate of the
    residuals), in the per-row quantities where the rows see θ through a non-linear
    function of it (hierarchical models), else in θ;
    :class:`~pymc_minibatch_mh.estimators.taylor.TaylorEstimator` and the guide's "Control
    variates" page. ``"taylor_theta"`` and ``"taylor_predictor"`` force one of the two
    expansions. ``"auto"``: ``"taylor"`` where control variates apply, else None with a
    warning at temperature 1
    (:func:`~pymc_minibatch_mh.estimators.registry.make_estimator`).""",
    "reference": """\
reference : dict, optional
    θ̂ as a point dict (e.g. from ``pm.find_MAP()``); default: the MAP, found when the step
    is built. Only with ``control_variate``.""",
    "recenter": """\
recenter : float, optional
    Re-centre θ̂ at the current state during tuning when the chain is farther than this
    from θ̂ (Laplace metric, per dimension; about 1 for a posterior draw). Only with
    ``control_variate``; default: never.""",
    "proposal": """\
proposal : str, Proposal or callable, optional
    ``"auto"`` (the default when None): with control variates, ``"crank_nicolson"`` around
    their Laplace fit when the per-row quantities are affine in θ (GLMs) and the
    surrogate posterior is close to that fit, and ``"surrogate_nuts"`` (one iteration of
    NUTS on the data-free surrogate posterior) when not (hierarchical models); without
    them, ``"random_walk"``. Also ``"mala"``,
    ``"hmc"``, ``"surrogate_transition"``, a
    :class:`~pymc_minibatch_mh.proposals.base.Proposal` or a callable ``step -> Proposal``
    (:mod:`~pymc_minibatch_mh.proposals.registry`). With a surrogate proposal and tuning,
    each chain starts at θ̂, where the set-up's pass read every row.""",
    "audit_every": """\
audit_every : int, optional
    Every this many steps, also decide the proposal on the full data, coupled to the
    minibatch decision (:mod:`~pymc_minibatch_mh.transition.audit`; the pass is counted in
    ``extra_evaluations``; the chain's draws are the same). Default: never.""",
    "steps_per_draw": """\
steps_per_draw : int or "auto", default "auto"
    Transitions per draw (:mod:`~pymc_minibatch_mh.transition.inner_steps`, which says how
    a draw's stats combine them). ``"auto"``: 4 with NUTS on the surrogate, 3 with another
    surrogate proposal, else 1.""",
    "model": """\
model : pymc.Model, optional
    Default: the model in context.""",
    "rng": """\
rng : int or numpy.random.Generator, optional
    Seed or generator; ``pm.sample`` replaces it per chain with one spawned from
    ``random_seed``.""",
    "initial_point": """\
initial_point : dict, optional
    Point used for shapes and checks (default ``model.initial_point()``).""",
    "mode": """\
mode : str, optional
    PyTensor compilation mode of the per-step functions.""",
    "check_start": """\
check_start : bool, default True
    Check the log-probability at each chain's start point and raise a clear error if it is
    not finite: one O(N) pass per chain, except at the control variates' reference θ̂,
    where tuned chains start and the set-up's pass already read every row.""",
    "prefetch": """\
prefetch : int or "auto", default "auto"
    Rounds of rows evaluated per compiled call (:mod:`~pymc_minibatch_mh.estimators.ratio`);
    changes the cost and which random rows are drawn, not their law.""",
    "blocked": """\
blocked : bool, default True
    Ignored (the variables are always one block); PyMC passes it.""",
    "data": """\
data : dict, optional
    Per-row data larger than memory, ``{name: array}`` with names of the model's
    ``pm.Data`` (or observed) variables and arrays that are ``.npy`` paths or memmaps, Zarr
    arrays, :class:`~pymc_minibatch_mh.store.sources.ParquetColumn` or Dask arrays. The
    model is built on a small in-memory slice of the rows (for shapes and dtypes); every
    per-row array must be given. See the guide's "Data bigger than memory" page.""",
    "shuffled_copy": """\
shuffled_copy : bool, default False
    With ``data=``: read a step's rows in blocks of a shuffled local copy, written at set-up
    (:mod:`~pymc_minibatch_mh.store.shuffled`; pays off on long runs).""",
}

#: The line of a docstring's Parameters section where :func:`document_parameters` puts
#: the shared entries.
_MARKER = "{shared_parameters}"
_Class = TypeVar("_Class", bound=type)


def documented_parameters(doc: str) -> set[str]:
    """The names a numpydoc docstring documents in its Parameters section.

    An entry is a line at the section's indentation, ``name : type`` or a comma-separated
    group of names (``sigma, tolerance``), up to the next section's underline.
    """
    lines = doc.expandtabs().splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Parameters")
    except StopIteration:
        return set()
    indent = len(lines[start]) - len(lines[start].lstrip())
    names: set[str] = set()
    for i in range(start + 2, len(lines)):
        line = lines[i]
        if i + 1 < len(lines) and re.fullmatch(r"\s*-{3,}\s*", lines[i + 1]):
            break  # the next section's title
        if line.strip() and len(line) - len(line.lstrip()) == indent:
            head = line.strip().split(" : ")[0]
            names.update(name.strip() for name in head.split(","))
    return names


def document_parameters(cls: _Class) -> _Class:
    """Complete a step class's docstring with the shared entries of its signature.

    Every keyword of ``cls.__init__`` that the class's docstring does not document gets
    its entry of :data:`SHARED_PARAMETERS`, in signature order, where the docstring has
    the line ``{shared_parameters}``.

    Raises
    ------
    TypeError
        If the signature takes ``**kwargs``, a keyword has no type or default, or a
        keyword is documented neither by the class nor in :data:`SHARED_PARAMETERS`:
        every keyword is explicit and documented.

    """
    doc = inspect.cleandoc(cls.__doc__ or "")
    own = documented_parameters(doc)
    missing: list[str] = []
    for name, parameter in signature_parameters(cls).items():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            raise TypeError(f"{cls.__name__}.__init__ takes **{name}: list each keyword.")
        if parameter.default is inspect.Parameter.empty or (
                parameter.annotation is inspect.Parameter.empty):
            raise TypeError(f"{cls.__name__}.__init__: {name!r} needs a type and a default.")
        if name not in own:
            if name not in SHARED_PARAMETERS:
                raise TypeError(f"{cls.__name__}'s docstring does not document {name!r}.")
            missing.append(name)
    block = "\n".join(SHARED_PARAMETERS[name] for name in missing)
    if _MARKER not in doc:
        if missing:
            raise TypeError(f"{cls.__name__}'s docstring has no line {_MARKER}.")
        return cls
    lines = doc.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip() == _MARKER)
    lines[at:at + 1] = block.splitlines() if block else []
    cls.__doc__ = "\n".join(lines) + "\n"
    return cls


def signature_parameters(cls: type) -> dict[str, inspect.Parameter]:
    """The keywords of ``cls.__init__`` (without ``self``), in order."""
    parameters = inspect.signature(cls.__init__).parameters
    return {name: p for name, p in parameters.items() if name != "self"}

