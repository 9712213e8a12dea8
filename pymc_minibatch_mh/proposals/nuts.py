r"""Surrogate NUTS: one iteration of PyMC's NUTS on the data-free surrogate posterior.

The surrogate transition (:mod:`~pymc_minibatch_mh.proposals.surrogate_transition`)
makes any kernel that is reversible with respect to the surrogate posterior ``π̃`` a
proposal with the exact ratio ``q(θ | θ′)/q(θ′ | θ) = π̃(θ)/π̃(θ′)``. Its fixed HMC
trajectories preconditioned by the Laplace fit fail where the posterior is curved: on a
hierarchical model's ridge in (μ, log τ, z) the right step size and trajectory length
change along the ridge. NUTS chooses the trajectory's length at every iteration, and
PyMC's NUTS adapts its step size and mass matrix while tuning (dense up to
:data:`DENSE_MASS_MAX_DIM` dimensions; above, diagonal in coordinates whitened by the
Laplace fit's covariance): :class:`SurrogateNUTSProposal` runs one iteration of
``pymc.NUTS`` on a model whose only term is ``log π̃`` (the prior, with Jacobians, plus
the closed-form full-data sum of the control variates' expansions, as a PyTensor graph).
It touches no data: a leapfrog step costs the gradient of the closed form, O(k²) for k
coefficients, against O(N) for NUTS on the model itself.

Correctness: after tuning, NUTS with a fixed step size (randomly jittered, independently
of the state) and mass matrix is reversible with respect to its target, so the log-q ratio
``log π̃(θ) − log π̃(θ′)`` is exact and the minibatch test decides on the residuals alone.
While tuning, the kernel adapts and is not reversible; tuning draws are discarded, as for
every tuned proposal. The inner sampler's randomness comes from a generator spawned from
the chain's generator at the chain start (:meth:`SurrogateNUTSProposal.start_chain`),
which also restarts its adaptation.

Trajectories: PyMC's NUTS does everything around a trajectory (the momentum draw, the
step-size jitter and adaptation, the mass matrix's adaptation); the trajectory itself is
PyMC's tree compiled with Numba (:mod:`~pymc_minibatch_mh.proposals.nuts_tree`), one call
per iteration that evaluates π̃ at its leapfrog steps through the same compiled density
(the same proposals as PyMC's tree, to rounding; about 0.23 ms per transition all in on
the zoo's random intercepts, against 0.36–0.49 ms with PyMC's tree). The step is a
subclass of ``pymc.NUTS`` whose ``_hamiltonian_step`` (the method PyMC's ``BaseHMC``
leaves to its subclasses, the same on PyMC 5 and 6) makes that call. After tuning, NUTS
no longer adapts, and the proposal makes its iteration itself around the compiled tree:
the momentum draw, the start's energy and the averaged step size through the step's own
objects (:func:`~pymc_minibatch_mh.model.internals.tuned_nuts_start`), so the same draws
as PyMC's ``astep``, without its raveled points, start state, adaptation calls and stats
(the kernel's transition on the zoo's random intercepts: 94 µs on PyMC 5 and 79 µs on
PyMC 6, against 114 and 93 µs through ``astep``). Where π̃'s density could not be
compiled with Numba (an operation without a Numba implementation), PyMC's tree in Python
builds the trajectories, and the step says so with a warning at construction. A dense
mass matrix's momenta are drawn through LAPACK directly
(:func:`~pymc_minibatch_mh.model.internals.fast_momentum`: the same draws, about 10 µs
less each).

Evaluations: π̃ is evaluated at NUTS's leapfrog steps only. PyMC's NUTS asks for the
density and gradient at its start point, which the state carries from the transition that
produced it (with NUTS's coordinates of the point, so the next iteration starts from the
same bits); its end is one of its leapfrog points, whose density gives ``log π̃`` of the
new state (less the centring's log-Jacobian). Each real evaluation and each leapfrog step
of the compiled tree counts in ``density_evaluations``. On the zoo's crossed model this
spares 2 of the about 13 evaluations per transition that PyMC's calls and the end's
density had cost.

Coordinates: when the surrogate posterior carries a
:class:`~pymc_minibatch_mh.proposals.surrogate.Centring` (group effects that the data fix
well, in a model written non-centred), NUTS runs on π̃ in those coordinates, with its
Jacobian, and its end is carried back; the ratio stays ``log π̃(θ) − log π̃(θ′)`` in the
model's coordinates (see ``Centring``). On the zoo's crossed random intercepts
(N = 3·10⁴, d = 222) this, with a diagonal mass matrix, took the chain from R-hat 1.86
to 1.00, but not robustly: the same seed with other floating-point rounding gave R-hat
1.06 (``mu``, whose sum with the large groups' effects is what the data fix; a diagonal
mass matrix does not follow that correlation). Whitened by the Laplace fit (above
:data:`DENSE_MASS_MAX_DIM`), that chain gives R-hat 1.003 and min bulk ESS 1,441, and
1,496 / 1,566 at N = 3·10⁵ / 10⁶ (``benchmarks/bench_model_zoo.py``).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
import scipy.linalg
from numpy.typing import NDArray
from pytensor.graph.replace import graph_replace

from pymc_minibatch_mh.model.compat import default_mode, start_inner_chain
from pymc_minibatch_mh.model.compilation import compile_function
from pymc_minibatch_mh.model.graph import clone_replace
from pymc_minibatch_mh.model.internals import (
    DirectCall,
    GivenNutsDensity,
    adaptation_window,
    diag_adapt_potential,
    direct_call,
    fast_momentum,
    full_adapt_potential,
    hamiltonian_step_data,
    nuts_iteration,
    nuts_mass,
    nuts_tree_settings,
    raise_wrapped_interrupt,
    raveled_point_info,
    set_adaptation_window,
    set_step_tuning,
    tuned_nuts_end,
    tuned_nuts_start,
)
from pymc_minibatch_mh.proposals.base import Proposal, ProposalInfo, ProposalState
from pymc_minibatch_mh.proposals.nuts_tree import CompiledTree
from pymc_minibatch_mh.proposals.surrogate import SurrogatePosterior

__all__ = ["DENSE_MASS_MAX_DIM", "SurrogateNUTSProposal", "density_function"]

#: Largest dimension with a dense adapted mass matrix. PyMC estimates the dense matrix
#: from the draws of its adaptation windows, the first of 101 draws: with more dimensions
#: than about half of that, the estimate is nearly singular, directions it misses get a
#: tiny mass-matrix variance, so the next windows' draws do not move along them either,
#: and the kernel freezes there (measured on the crossed random intercepts, d = 222:
#: within-chain sds of the slopes 0.002 against 0.014). Above it, NUTS runs in the
#: coordinates whitened by the Laplace fit (ψ = L⁻¹(u − mean), L L' its covariance) with
#: an adapted diagonal mass matrix: the fit's correlations are used without an estimate.
#: On that model's π̃ alone this gave min bulk ESS 1,001 of 2,000 draws in 31 s, against
#: 139 in 70 s with a diagonal mass matrix in the unwhitened coordinates.
DENSE_MASS_MAX_DIM = 50

_Vec = NDArray[np.float64]


class _TreeNUTS(pm.NUTS):
    """PyMC's NUTS whose trajectories ``trajectory`` builds when it is set.

    PyMC's NUTS builds a trajectory in ``_hamiltonian_step(start, p0, step_size)`` (the
    same method on PyMC 5 and 6), the method PyMC's ``BaseHMC`` leaves to its subclasses;
    everything around it (momentum, step-size jitter and adaptation, the mass matrix's
    adaptation, stats) stays PyMC's.
    """

    #: ``(start, p0, step_size) -> HMCStepData``, called with ``_hamiltonian_step``'s
    #: arguments (PyMC's start ``State``, the momentum, the jittered step size) and
    #: returning what it returns
    #: (:func:`~pymc_minibatch_mh.model.internals.hamiltonian_step_data`); None: PyMC's
    #: tree in Python.
    trajectory: Callable[[Any, _Vec, float], Any] | None = None

    def _hamiltonian_step(self, start: Any, p0: _Vec, step_size: float) -> Any:
        if self.trajectory is None:
            return super()._hamiltonian_step(start, p0, step_size)
        return self.trajectory(start, p0, step_size)


def density_function(model: pm.Model) -> Callable[[_Vec], tuple[Any, _Vec]]:
    """``q -> (log density, gradient)`` of a model of one vector variable, called directly.

    What PyMC's NUTS on ``model`` evaluates at its raveled point ``q`` (a model of one
    vector variable: ``q`` is its value), compiled through
    :func:`~pymc_minibatch_mh.model.compilation.compile_function`, so
    through the package's function cache, not by PyMC. PyTensor's rewrites do not always
    order a graph the same way from one process to the next, and Numba's cache is keyed
    by the rewritten graph: a density that PyMC compiles anew is compiled by Numba anew
    (50 s for the surrogate of a bambi model with 51 state intercepts). The function
    cache keeps the rewritten graph, and the surrogate's values that depend on the data
    are shared variables: the same model in another process, on the same or other data,
    loads it and Numba's compiled code with it. A Numba function is returned through
    :func:`~pymc_minibatch_mh.model.internals.direct_call`.
    """
    (value,) = model.value_vars
    logp = model.logp()
    fn, _ = compile_function([value], [logp, pytensor.grad(logp, value)], default_mode())
    return direct_call(fn)


class SurrogateNUTSProposal(Proposal):
    """One NUTS iteration on the surrogate posterior ``π̃``; exact log-q ratio.

    Parameters
    ----------
    posterior : SurrogatePosterior
        The surrogate posterior (its PyTensor graph is NUTS's target): NUTS's dense mass
        matrix starts from its Laplace fit's covariance (above :data:`DENSE_MASS_MAX_DIM`
        dimensions, NUTS runs in coordinates whitened by it), and chains start at its
        mean θ̂.
    n_inner : int
        NUTS iterations per proposal (their composition is reversible too).
    target_accept : float
        NUTS's target acceptance (its step-size adaptation), PyMC's default 0.8.
    max_treedepth : int
        NUTS's largest tree depth.

    Notes
    -----
    ``scale`` is not used (``uses_scale`` is False): NUTS adapts its own step size and
    mass matrix while tuning. ``log π̃`` at the current point travels in the state.

    """

    name: ClassVar[str] = "surrogate_nuts"
    uses_scale: ClassVar[bool] = False
    #: Measured with PyMC's default draws (:mod:`~pymc_minibatch_mh.transition.inner_steps`):
    #: with the group effects that the data fix centred, 4 transitions per draw kept the
    #: effective samples of 9 within 20 % at under half the sampling time on real and
    #: generated hierarchical models; 3 left R-hat at 1.011 on one of them.
    transitions_per_draw: ClassVar[int] = 4

    def __init__(self, posterior: SurrogatePosterior, *, n_inner: int = 1,
                 target_accept: float = 0.8, max_treedepth: int = 10) -> None:
        if int(n_inner) != n_inner or n_inner < 1:
            raise ValueError(f"n_inner must be an integer ≥ 1, got {n_inner}.")
        self.surrogate = surrogate = posterior.laplace
        self.n_inner = int(n_inner)
        self.centring = centring = posterior.centring
        dim = surrogate.dim
        # NUTS runs on π̃ in the posterior's sampling coordinates: the model's own, or
        # with the group effects that the data fix centred (π̃_φ with its Jacobian).
        if centring is None:
            inner, graph = posterior.flat, posterior.graph
            mean, cov = surrogate.theta_hat, surrogate.cov.copy()
        else:
            inner = centring.phi
            graph = centring.log_density_graph(posterior.graph, posterior.flat)
            mean = centring.to_phi(surrogate.theta_hat)
            cov = centring.covariance(surrogate.theta_hat, surrogate.cov)
        # Up to DENSE_MASS_MAX_DIM: a dense mass matrix, adapted while tuning from the
        # Laplace covariance (on a hierarchical ridge it measured 3 × the effective
        # samples of a diagonal one). Above, PyMC's dense estimate freezes (see
        # DENSE_MASS_MAX_DIM), so NUTS runs in whitened coordinates ψ = L⁻¹(u − mean),
        # L L' the Laplace covariance of the sampling coordinates u, with a diagonal mass
        # matrix adapted there: the Laplace fit's correlations need no estimate.
        self._whiten: tuple[_Vec, _Vec] | None = None
        if dim > DENSE_MASS_MAX_DIM:
            self._whiten = (mean, np.linalg.cholesky(cov))
            # L⁻¹ once: a product per transition instead of a triangular solve (about 90
            # µs through SciPy's wrapper at d = 222, a tenth of that as a product).
            self._chol_inv = scipy.linalg.solve_triangular(self._whiten[1], np.eye(dim),
                                                           lower=True)
        # NUTS's start: θ̂ in NUTS's coordinates (whitened: the origin)
        start = mean if self._whiten is None else np.zeros(dim)
        with pm.Model(model=None) as self.model:  # a model of its own, never a submodel
            x = pm.Flat("x", shape=(dim,), initval=start)
            if self._whiten is None:
                pm.Potential("surrogate", clone_replace(graph, {inner: x}))
            else:
                # graph_replace, not clone_replace: the latter would clone x's own node
                # (a second Flat variable, outside the model). The whitening's mean and
                # factor are shared variables, not constants: PyTensor's Numba cache keys
                # a function by its constants, so the same model on other data (or
                # another fit) finds this density compiled.
                u = (pytensor.shared(mean, name="whitening_mean")
                     + pt.dot(pytensor.shared(self._whiten[1], name="whitening_factor"), x))
                pm.Potential("surrogate", graph_replace(graph, {inner: u}, strict=False))
        potential = (full_adapt_potential(dim, mean, cov, 10) if self._whiten is None
                     else diag_adapt_potential(dim, np.zeros(dim), np.ones(dim), 10))
        # π̃'s density (in NUTS's coordinates), compiled once, in the package's mode (Numba
        # unless an op would run in object mode: 1.5 × faster per call than PyMC's C
        # default on the zoo's crossed model) and through its function cache. PyMC's NUTS
        # is given it through _logp_dlogp, which remembers one transition's evaluations by
        # their point's bytes, so that NUTS's start and the proposal's end are not
        # evaluated again (see propose); PyMC compiles no density of its own.
        self._evaluate = self._density = density_function(self.model)
        self._evaluated: dict[bytes, tuple[float, _Vec]] = {}
        self.nuts = _TreeNUTS(vars=[x], model=self.model, target_accept=target_accept,
                              max_treedepth=max_treedepth, potential=potential,
                              logp_dlogp_func=GivenNutsDensity(self._logp_dlogp),
                              initial_point={"x": start})
        self._adaptation_window = adaptation_window(potential)
        self._point_info = raveled_point_info("x", dim)
        fast_momentum(self.nuts.potential)
        set_step_tuning(self.nuts, False)
        # The trajectory: PyMC's tree compiled with the density (nuts_tree), when the
        # density is a Numba function; PyMC's own tree in Python otherwise, said once.
        self.compiled_tree = (isinstance(self._density, DirectCall)
                              and nuts_mass(self.nuts.potential) is not None)
        self._tree: CompiledTree | None = None
        if self.compiled_tree:
            self.nuts.trajectory = self._trajectory
        else:
            warnings.warn(
                "The surrogate NUTS builds its trajectories with PyMC's tree in Python "
                "(about 40 µs per leapfrog step): the surrogate posterior's density was "
                "compiled with PyTensor's C backend (an operation in it has no Numba "
                "implementation), and the compiled tree calls Numba functions only.",
                UserWarning, stacklevel=2)

    def _logp_dlogp(self, q: _Vec, info: object = None) -> tuple[float, _Vec]:
        """``log π̃`` and its gradient in NUTS's coordinates, each point evaluated once.

        Every real evaluation counts in ``density_evaluations``; the transition's
        evaluations are kept (copies) until the next transition.
        """
        key = q.tobytes()
        kept = self._evaluated.get(key)
        if kept is None:
            self.density_evaluations += 1
            logp, grad = self._evaluate(q)
            kept = self._evaluated[key] = (float(logp), np.array(grad, dtype=np.float64))
        return kept[0], kept[1].copy()

    def _trajectory(self, start: object, p0: _Vec, step_size: float) -> object:
        """One NUTS trajectory as one compiled call (the NUTS step's ``trajectory``).

        The call is :func:`~pymc_minibatch_mh.proposals.nuts_tree.build_tree`.
        """
        out = self._run_tree(start.q.data, start.p, start.v, start.q_grad,
                             float(start.model_logp), float(start.energy), step_size,
                             bool(self.nuts.tune))
        (q, grad, logp, energy, index, depth, size, log_accept_sum, max_change, diverging,
         divergence_change, reached_max) = out
        self._evaluated[q.tobytes()] = (logp, grad)
        accept = float(np.exp(log_accept_sum) / size)
        stats = {"depth": depth, "mean_tree_accept": accept,
                 "energy_error": energy - float(start.energy), "energy": energy,
                 "tree_size": size, "max_energy_error": max_change, "model_logp": logp,
                 "index_in_trajectory": index, "reached_max_treedepth": reached_max}
        message = (f"Energy change in leapfrog step is too large: {divergence_change}."
                   if diverging else None)
        return hamiltonian_step_data(start, q, grad, logp, energy, accept, message, stats)

    def _run_tree(self, q0: _Vec, p0: _Vec, v0: _Vec, grad0: _Vec, logp0: float,
                  energy0: float, step_size: float, tuning: bool) -> tuple[object, ...]:
        """:func:`~pymc_minibatch_mh.proposals.nuts_tree.build_tree` from this start.

        With the step's mass matrix, depth limit and generator; its leapfrog evaluations
        are counted in ``density_evaluations``.
        """
        max_depth, e_max, rng = nuts_tree_settings(self.nuts)
        mass, dense = nuts_mass(self.nuts.potential)
        cells = self._density.shared_values()
        if not q0.flags.writeable:  # the tree is compiled for writable arrays
            q0 = q0.copy()
        args = (rng, q0, p0, v0, grad0, logp0, energy0, float(step_size), mass, dense,
                max_depth, e_max, tuning)
        if self._tree is None:  # built in the process that samples (it does not pickle)
            self._tree = CompiledTree(self._density.jit, cells, rng, q0)
        try:
            out = self._tree(cells, *args)
        except TypeError:  # a shared value of π̃ changed its type (layout): compile again
            self._tree = CompiledTree(self._density.jit, cells, rng, q0)
            out = self._tree(cells, *args)
        except SystemError as err:  # a Ctrl-C inside the compiled tree: PyMC keeps the draws
            raise_wrapped_interrupt(err)
            raise
        self.density_evaluations += out[6]
        return out

    def _tuned_iteration(self, v: _Vec, logp: float, grad: _Vec) -> tuple[_Vec, float, _Vec]:
        """One NUTS iteration after tuning, without PyMC's ``astep`` around the tree.

        Once NUTS no longer adapts, its iteration is a momentum draw, the start's energy,
        the averaged step size and one trajectory; PyMC's ``astep`` around them (its
        raveled points, start state, adaptation calls, stats and warnings) cost about a
        fifth of a transition on the zoo's random intercepts. The same draws from the same
        generators (:func:`~pymc_minibatch_mh.model.internals.tuned_nuts_start`), so the
        same chain as through PyMC's step (the tests compare them). A start whose energy
        is not finite goes through PyMC's step, which refuses it with its diagnosis.
        Returns the end ``v`` and ``log π̃`` (NUTS's coordinates) and its gradient there.
        """
        p0, velocity, kinetic, step_size = tuned_nuts_start(self.nuts)
        energy = kinetic - logp
        if not math.isfinite(energy):
            self._evaluated = {v.tobytes(): (logp, grad)}
            end = nuts_iteration(self.nuts, v, self._point_info)
            return end, *self._logp_dlogp(end)
        q, q_grad, q_logp, *_, diverging, _, _ = self._run_tree(
            v, p0, velocity, grad, logp, energy, step_size, False)
        tuned_nuts_end(self.nuts, diverging)
        return q, q_logp, q_grad

    def __getstate__(self) -> dict[str, object]:
        state = self.__dict__.copy()
        state["_tree"] = None  # addresses of this process's compiled code
        return state

    def _to_inner(self, x: _Vec) -> _Vec:
        """NUTS's coordinates of a point in the model's: centred, then whitened."""
        u = x if self.centring is None else self.centring.to_phi(x)
        if self._whiten is None:
            return u
        return self._chol_inv @ (u - self._whiten[0])

    def _unwhiten(self, v: _Vec) -> _Vec:
        """The centred coordinates ``u`` of NUTS's ``v``.

        :meth:`_to_inner` inverted, up to the centring; ``v`` itself unwhitened.
        """
        return v if self._whiten is None else self._whiten[0] + self._whiten[1] @ v

    def _from_centred(self, u: _Vec) -> tuple[_Vec, float]:
        """The model's coordinates of the centred ``u`` and ``log |det ∂θ/∂φ|`` there.

        ``u`` itself and 0 without centring.

        NUTS's density at ``v`` is ``log π̃(θ) +`` that term (the whitening is linear: its
        Jacobian is a constant, left out).
        """
        return (u, 0.0) if self.centring is None else self.centring.from_phi(u)

    def _state(self, v: _Vec, x: _Vec | None = None,
               density: tuple[float, _Vec] | None = None) -> ProposalState:
        """The state at NUTS's ``v`` (the model's ``x``, computed unless given).

        ``log π̃(x)`` comes from NUTS's own density (and gradient) at ``v``, evaluated
        unless given as ``density``.

        ``carry`` keeps ``v`` and NUTS's density and gradient there, so the next
        transition starts from the same ``v`` without evaluating π̃ again.
        """
        logp, grad = self._logp_dlogp(v) if density is None else density
        x_of_v, log_jacobian = self._from_centred(self._unwhiten(v))
        return ProposalState(x_of_v if x is None else x, log_density=logp - log_jacobian,
                             carry=(v, logp, grad))

    def start_chain(self, rng: np.random.Generator) -> None:
        """A new chain: NUTS's adaptation restarts, its draws from a spawned generator."""
        start_inner_chain(self.nuts, rng.spawn(1)[0])
        # PyMC's reset leaves the mass matrix's adaptation window as the last chain
        # doubled it; restored, the chains in one process (cores=1) adapt as in fresh
        # processes (cores>1), so both give the same draws.
        set_adaptation_window(self.nuts.potential, self._adaptation_window)
        self.nuts.reset_tuning()

    def set_tuning(self, tuning: bool) -> None:
        """Whether NUTS adapts its step size and mass matrix."""
        set_step_tuning(self.nuts, tuning)

    @property
    def step_size(self) -> float:
        """NUTS's (adapted) leapfrog step size."""
        return float(self.nuts.step_size)

    def init(self, x: _Vec) -> ProposalState:
        """The state at ``x`` with ``log π̃(x)`` (π̃ may have changed: nothing is kept)."""
        x = np.asarray(x, dtype=np.float64)
        self._evaluated = {}
        return self._state(self._to_inner(x), x)

    def propose(
        self, rng: np.random.Generator, state: ProposalState, scale: float
    ) -> tuple[ProposalState, ProposalInfo]:
        """One NUTS iteration from ``state.x``; its end and ``log π̃(x) − log π̃(x′)``.

        NUTS starts from the state's ``v`` with its density and gradient (kept: PyMC
        asks for them again); its end is one of the points its tree evaluated, so the
        end's ``log π̃`` is that evaluation less the centring's log-Jacobian. π̃ is
        evaluated at the leapfrog steps only.
        """
        if state.carry is None:
            state = self.init(state.x)
        v, logp, grad = state.carry
        if self.compiled_tree and not self.nuts.tune:
            for _ in range(self.n_inner):
                v, logp, grad = self._tuned_iteration(v, logp, grad)
            new_state = self._state(v, density=(logp, grad))
        else:
            self._evaluated = {v.tobytes(): (logp, grad)}
            for _ in range(self.n_inner):
                v = nuts_iteration(self.nuts, v, self._point_info)
            new_state = self._state(np.array(v, dtype=np.float64))
        return (new_state,
                ProposalInfo(state.log_density - new_state.log_density,
                             step_size=self.step_size))
