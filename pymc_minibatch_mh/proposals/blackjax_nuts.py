r"""Compiled surrogate NUTS: one iteration of blackjax's NUTS on π̃, one JAX call.

:class:`~pymc_minibatch_mh.proposals.nuts.SurrogateNUTSProposal` runs PyMC's NUTS, whose
tree is built in Python: about 40 µs of overhead per leapfrog step, about 0.41 ms per
transition everything included on a 20-group random-intercept model. The surrogate posterior
``π̃`` touches
no data, so its whole trajectory can be compiled: :class:`BlackjaxNUTSProposal` turns
``log π̃`` (its PyTensor graph) into a JAX function with PyMC's own JAX translation and runs
blackjax's NUTS (multinomial, iterative doubling) on it, one jitted call per transition.
It needs the ``jax`` extra: ``pip install "pymc-minibatch-mh[jax]"``.

Adaptation. At each chain start, blackjax's window adaptation (Stan's windows, a dense
mass matrix) runs ``warmup`` iterations on ``π̃`` itself, from θ̂ — data-free, a fraction
of a second once compiled — with a key drawn from the chain's generator. The step size
and mass matrix are then fixed for the whole chain, tuning included, so the kernel is
reversible with respect to ``π̃`` from the first transition and the log-q ratio
``log π̃(θ) − log π̃(θ′)`` is exact throughout. ``set_tuning`` changes nothing.

Everything the graph reads besides θ (the control variates' coefficients, moved by a
re-centring; the variables that other steps of a compound step sample) is an argument of
the compiled call, read at each call, never a constant frozen at compilation. ``log π̃``
is offset by its value at θ̂ at the chain start, so the energies stay of order d and
keep their precision; offsets cancel in the ratio.

Costs and trade-offs. The JAX function and the two compiled programs (adaptation and
kernel) are built on first use in each process (a step pickled to PyMC's worker
processes rebuilds them there): a few seconds of XLA compilation. Against PyMC's NUTS
on the surrogate this does not pay on the zoo's random intercepts (N = 3·10⁴,
PyMC's default draws, one run each: sampling 20.3 s against 14.8 s, and this kernel,
without the centring and whitening of the other, did not converge there: R-hat 1.61). JAX runs in
double precision (``jax_enable_x64``, set globally, as PyMC's JAX samplers do).

Processes. JAX is multithreaded and cannot run in a process forked after it started: on
Linux, PyMC forks its worker processes (``cores > 1``), which is fine as long as this
process has not run the proposal yet (the workers then start JAX themselves). After a run
with ``cores=1`` in the same process, the workers would deadlock; the proposal raises a
clear error in them instead, and ``pm.sample(..., mp_ctx="spawn")`` is the fix.
"""

from __future__ import annotations

import math
import os
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from pymc_minibatch_mh.proposals.base import Proposal, ProposalInfo, ProposalState
from pymc_minibatch_mh.proposals.surrogate import SurrogatePosterior

__all__ = ["JAX_INSTALL", "BlackjaxNUTSProposal", "jax_available"]

_Vec = NDArray[np.float64]

#: How to install what this proposal needs.
JAX_INSTALL = 'pip install "pymc-minibatch-mh[jax]"'


#: The process in which this module started JAX (a forked child inherits it).
_jax_pid: int | None = None


def _check_not_forked() -> None:
    """Refuse to run JAX in a process forked after this module started JAX in its parent."""
    if _jax_pid is not None and _jax_pid != os.getpid():
        raise RuntimeError(
            "proposal='blackjax_nuts' cannot run in a process forked after JAX started in "
            "its parent (JAX is multithreaded; the process would deadlock). PyMC forks its "
            "worker processes on Linux: pass mp_ctx='spawn' (or 'forkserver') to "
            "pm.sample, or sample with cores=1."
        )


def jax_available() -> bool:
    """Whether JAX and blackjax can be imported (the ``jax`` extra)."""
    try:
        import blackjax  # noqa: F401
        import jax  # noqa: F401
    except ImportError:
        return False
    return True


class _Compiled:
    """The JAX side of one proposal in one process: ``log π̃``, the adaptation, the kernel."""

    def __init__(self, posterior: SurrogatePosterior, warmup: int, target_accept: float,
                 max_treedepth: int) -> None:
        import blackjax
        import jax
        from pymc.sampling.jax import get_jaxified_graph
        from pytensor.compile.sharedvalue import SharedVariable
        from pytensor.graph.traversal import ancestors

        from pymc_minibatch_mh.model.graph import clone_replace

        jax.config.update("jax_enable_x64", True)
        graph = posterior.graph
        #: The shared variables ``log π̃`` reads (their values are passed at each call).
        self.shared = [v for v in ancestors([graph]) if isinstance(v, SharedVariable)]
        inputs = [v.type() for v in self.shared]
        graph = clone_replace(graph, dict(zip(self.shared, inputs, strict=True)))
        log_density = get_jaxified_graph(inputs=[posterior.flat, *inputs], outputs=[graph])

        def shifted(offset: Any, values: tuple[Any, ...]) -> Any:
            return lambda x: log_density(x, *values)[0] - offset

        kernel = blackjax.nuts.build_kernel()

        def adapt(seed: Any, x0: Any, cov: Any, offset: Any,
                  *values: Any) -> tuple[Any, Any, Any]:
            adaptation = blackjax.window_adaptation(
                blackjax.nuts, shifted(offset, values), is_mass_matrix_diagonal=False,
                initial_inverse_mass_matrix=cov, target_acceptance_rate=target_accept,
                max_num_doublings=max_treedepth,
            )
            (_, parameters), info = adaptation.run(jax.random.key(seed), x0,
                                                   num_steps=warmup)
            return (parameters["step_size"], parameters["inverse_mass_matrix"],
                    info.info.num_integration_steps.sum())

        def step(seed: Any, x: Any, logdensity: Any, grad: Any, step_size: Any,
                 inverse_mass: Any, offset: Any, *values: Any) -> tuple[Any, ...]:
            state = blackjax.mcmc.hmc.HMCState(x, logdensity, grad)
            new, info = kernel(jax.random.key(seed), state, shifted(offset, values),
                               step_size, inverse_mass, max_treedepth)
            return (new.position, new.logdensity, new.logdensity_grad,
                    info.num_integration_steps)

        def value_and_grad(x: Any, offset: Any, *values: Any) -> tuple[Any, Any]:
            return jax.value_and_grad(shifted(offset, values))(x)

        self.device_get = jax.device_get
        self.log_density = jax.jit(lambda x, *values: log_density(x, *values)[0])
        self.adapt = jax.jit(adapt)
        self.step = jax.jit(step)
        self.value_and_grad = jax.jit(value_and_grad)

    def values(self) -> tuple[NDArray[Any], ...]:
        """The shared variables' values now."""
        return tuple(np.asarray(v.get_value(borrow=True)) for v in self.shared)


class BlackjaxNUTSProposal(Proposal):
    """One iteration of blackjax's NUTS on the surrogate posterior ``π̃``; exact log-q ratio.

    Parameters
    ----------
    posterior : SurrogatePosterior
        The surrogate posterior (its PyTensor graph, translated to JAX, is NUTS's target);
        chains start at its Laplace fit's mean θ̂.
    warmup : int
        Iterations of blackjax's window adaptation on ``π̃`` at each chain start.
    target_accept : float
        The adaptation's target acceptance (PyMC's default 0.8).
    max_treedepth : int
        NUTS's largest number of trajectory doublings.

    Raises
    ------
    ImportError
        Without JAX or blackjax; the message says how to install them.

    Notes
    -----
    ``scale`` is not used (``uses_scale`` is False). The state carries ``log π̃`` and its
    gradient at the point (offset by ``log π̃(θ̂)``) as JAX arrays, so a transition is one
    compiled call.

    """

    name: ClassVar[str] = "blackjax_nuts"
    uses_scale: ClassVar[bool] = False
    transitions_per_draw: ClassVar[int] = 9

    def __init__(self, posterior: SurrogatePosterior, *, warmup: int = 1000,
                 target_accept: float = 0.8, max_treedepth: int = 10) -> None:
        if not jax_available():
            raise ImportError(
                "proposal='blackjax_nuts' runs NUTS compiled with JAX: install JAX and "
                f"blackjax with `{JAX_INSTALL}`, or use proposal='surrogate_nuts' (PyMC's "
                "NUTS in Python, about 10 × slower per transition)."
            )
        if int(warmup) != warmup or warmup < 10:
            raise ValueError(f"warmup must be an integer ≥ 10, got {warmup}.")
        if not 0.0 < target_accept < 1.0:
            raise ValueError(f"target_accept must be in (0, 1), got {target_accept}.")
        if int(max_treedepth) != max_treedepth or max_treedepth < 1:
            raise ValueError(f"max_treedepth must be an integer ≥ 1, got {max_treedepth}.")
        self.posterior = posterior
        self.surrogate = posterior.laplace
        self.warmup = int(warmup)
        self.target_accept = float(target_accept)
        self.max_treedepth = int(max_treedepth)
        self._compiled: _Compiled | None = None
        self._rng: np.random.Generator | None = None
        self._parameters: tuple[Any, Any] | None = None
        self._offset = 0.0
        #: The adapted step size (NaN before the first chain's adaptation).
        self.step_size = math.nan
        #: Leapfrog steps of the last transition.
        self.n_steps = 0

    def __getstate__(self) -> dict[str, Any]:
        # Compiled JAX programs do not pickle: each process (PyMC's workers) builds its own.
        state = self.__dict__.copy()
        state["_compiled"] = None
        state["_parameters"] = None
        return state

    @property
    def compiled(self) -> _Compiled:
        """The JAX function and programs of this process (built on first use)."""
        global _jax_pid
        _check_not_forked()
        if self._compiled is None:
            self._compiled = _Compiled(self.posterior, self.warmup, self.target_accept,
                                       self.max_treedepth)
            _jax_pid = os.getpid()
        return self._compiled

    def start_chain(self, rng: np.random.Generator) -> None:
        """A new chain: a spawned generator; the adaptation runs again at its first state."""
        self._rng = rng.spawn(1)[0]
        self._parameters = None

    def _seed(self) -> np.uint32:
        if self._rng is None:  # used outside a sampler (no chain start)
            self._rng = np.random.default_rng()
        return np.uint32(self._rng.integers(2**32, dtype=np.uint64))

    def _adapt(self) -> tuple[Any, Any]:
        """Window adaptation on ``π̃`` from θ̂ (once per chain)."""
        if self._parameters is None:
            c = self.compiled
            values = c.values()
            theta_hat = self.surrogate.theta_hat
            self._offset = float(c.log_density(theta_hat, *values))
            step_size, inverse_mass, n_steps = c.adapt(self._seed(), theta_hat,
                                                       self.surrogate.cov, self._offset, *values)
            # The offset's evaluation, and the adaptation's start and leapfrog steps.
            self.density_evaluations += 2 + int(n_steps)
            self.step_size = float(step_size)
            if not (self.step_size > 0.0 and math.isfinite(self.step_size)):
                raise RuntimeError(
                    f"blackjax's window adaptation on the surrogate posterior ended with step "
                    f"size {self.step_size}: π̃ is not finite around θ̂. Use "
                    "proposal='surrogate_nuts'."
                )
            self._parameters = (step_size, inverse_mass)
        return self._parameters

    def init(self, x: _Vec) -> ProposalState:
        """The state at ``x``: ``log π̃(x)`` (offset) and its gradient, as JAX arrays."""
        self._adapt()
        x = np.asarray(x, dtype=np.float64)
        c = self.compiled
        logdensity, grad = c.value_and_grad(x, self._offset, *c.values())
        self.density_evaluations += 1
        return ProposalState(x, log_density=float(logdensity), carry=(x, logdensity, grad))

    def propose(
        self, rng: np.random.Generator, state: ProposalState, scale: float
    ) -> tuple[ProposalState, ProposalInfo]:
        """One NUTS iteration from ``state.x``; its end and ``log π̃(x) − log π̃(x′)``."""
        step_size, inverse_mass = self._adapt()
        if state.carry is None:
            state = self.init(state.x)
        c = self.compiled
        x, logdensity, grad = state.carry
        x_new, ld_new, grad_new, n_steps = c.step(
            self._seed(), x, logdensity, grad, step_size, inverse_mass, self._offset,
            *c.values(),
        )
        # One transfer to the host for what the test reads; the gradient stays in JAX.
        x_out, lp_new, n_steps = c.device_get((x_new, ld_new, n_steps))
        self.n_steps = int(n_steps)
        self.density_evaluations += self.n_steps
        lp_new = float(lp_new)
        x_out = np.array(x_out, dtype=np.float64)
        return (ProposalState(x_out, log_density=lp_new, carry=(x_new, ld_new, grad_new)),
                ProposalInfo(state.log_density - lp_new, step_size=self.step_size))
