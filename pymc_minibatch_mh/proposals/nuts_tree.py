r"""PyMC's NUTS tree, compiled: one call builds a whole trajectory on the surrogate.

PyMC's NUTS builds its binary tree in Python (``pymc.step_methods.hmc.nuts._Tree``):
about 40 µs of interpreter work per leapfrog step around a density call of a few
microseconds. On the data-free surrogate posterior π̃ that is most of a transition.
:func:`build_tree` is the same algorithm as one Numba function, calling the Numba-compiled
density and gradient that PyMC's step already holds (its ``ValueGradFunction``'s jitted
graph), so a trajectory is one call:

- the same leapfrog integrator (half momentum step, position step, half momentum step;
  velocity ``M⁻¹p`` from the step's adapted mass matrix, dense or diagonal);
- the same tree: subtrees of ``2^depth`` leaves built from the end in a random direction,
  merged by multinomial sampling inside a subtree and biased sampling at the top, the
  generalised U-turn criterion with PyMC's two additional checks across merged halves,
  and a divergence when the energy change reaches ``Emax``;
- the same random numbers in the same order, drawn from the same generator (Numba shares a
  ``numpy.random.Generator``'s state): a direction per doubling, one uniform per merge.

So from the same start, momentum and step size it returns PyMC's proposal, up to
floating-point rounding (the tests compare the two trajectory by trajectory).

Everything around the tree (momentum draw, step-size jitter and adaptation, mass-matrix
adaptation, stats and warnings) stays PyMC's while NUTS tunes:
:mod:`~pymc_minibatch_mh.proposals.nuts` runs a subclass of PyMC's NUTS whose
``_hamiltonian_step`` calls this function. After tuning that module calls it directly,
with PyMC's momentum draw and averaged step size.

Compilation: :class:`CompiledTree` compiles :func:`build_tree` for the density's types,
with the density as a first-class function of that signature (not as the particular
function). Numba's disk cache then keeps it for every model whose density has the same
argument types: the about 5 s of compiling the tree (4.7 s measured) are paid once per
machine and signature, not per model or process.
"""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np
from numba import types
from numba.core.types.function_type import WrapperAddressProtocol
from numba.experimental.function_type import _get_wrapper_address

from pymc_minibatch_mh.core.arrays import copy_into

__all__ = ["CompiledTree", "build_tree"]

#: The velocity's row in the tree's arrays of a leaf (rows: position, momentum,
#: velocity, gradient).
_V = 2


@numba.njit(cache=True)
def _velocity(mass, dense, p, out):  # pragma: no cover (compiled)
    """``out = M⁻¹ p``: ``mass`` is PyMC's covariance matrix (dense) or its diagonal."""
    d = p.shape[0]
    if dense:
        for i in range(d):
            acc = 0.0
            for j in range(d):
                acc += mass[i, j] * p[j]
            out[i] = acc
    else:
        for i in range(d):
            out[i] = mass[0, i] * p[i]


@numba.njit(cache=True)
def _dot(a, b):  # pragma: no cover (compiled)
    acc = 0.0
    for i in range(a.shape[0]):
        acc += a[i] * b[i]
    return acc


@numba.njit(cache=True)
def _turned(p_sum, v_a, v_b):  # pragma: no cover (compiled)
    """PyMC's U-turn test: ``p_sum · v_a ≤ 0`` or ``p_sum · v_b ≤ 0``."""
    return _dot(p_sum, v_a) <= 0.0 or _dot(p_sum, v_b) <= 0.0


@numba.njit(cache=True)
def _extra_checks(left_sum, right_sum, left_begin_v, left_end_p, left_end_v, right_begin_p,
                  right_begin_v, right_end_v, work):  # pragma: no cover (compiled)
    """PyMC's two additional U-turn checks across two merged halves (left, right).

    Each half has a begin (its left end) and an end; ``left_sum`` and ``right_sum`` are
    their momentum sums. ``work`` is scratch space.
    """
    for i in range(work.shape[0]):
        work[i] = left_sum[i] + right_begin_p[i]
    if _turned(work, left_begin_v, right_begin_v):
        return True
    for i in range(work.shape[0]):
        work[i] = left_end_p[i] + right_sum[i]
    return _turned(work, left_end_v, right_end_v)


@numba.njit(cache=True)
def _take_proposal(prop_q, prop_g, prop_logp, prop_energy, prop_index, to,
                   source):  # pragma: no cover (compiled)
    """Row ``to`` of the proposals' arrays takes row ``source``'s proposal (all its parts)."""
    copy_into(prop_q[to], prop_q[source])
    copy_into(prop_g[to], prop_g[source])
    prop_logp[to] = prop_logp[source]
    prop_energy[to] = prop_energy[source]
    prop_index[to] = prop_index[source]


@numba.njit(cache=True)
def _logaddexp(a, b):  # pragma: no cover (compiled)
    if a == -np.inf:
        return b
    if b == -np.inf:
        return a
    hi = max(a, b)
    return hi + math.log1p(math.exp(-abs(a - b)))


def build_tree(density, cells, rng, q0, p0, v0, grad0, logp0, energy0, step_size, mass, dense,
               max_treedepth, e_max, tuning):  # pragma: no cover (compiled)
    """One NUTS trajectory from ``(q0, p0)``: PyMC's ``NUTS._hamiltonian_step``, compiled.

    Parameters
    ----------
    density : numba dispatcher or first-class function
        The jitted graph of PyMC's value-and-gradient function, which takes its inputs as
        ``*args``: ``density((q,) + cells)`` returns ``(log π̃(q), ∇ log π̃(q))``.
    cells : tuple of numpy.ndarray
        The values of its shared variables.
    rng : numpy.random.Generator
        PyMC's NUTS generator (directions and merges draw from it, as PyMC's tree does).
    q0, p0, v0, grad0 : numpy.ndarray
        The start: position, momentum, velocity ``M⁻¹p0`` and gradient.
    logp0, energy0 : float
        Its log density and energy ``½ p0·v0 − logp0``.
    step_size : float
        The leapfrog step size (already jittered).
    mass : numpy.ndarray
        PyMC's potential: the covariance (``d × d``, ``dense``) or its diagonal (``1 × d``).
    dense : bool
        Which of the two ``mass`` is.
    max_treedepth : int
        The most doublings.
    e_max : float
        The energy change that counts as a divergence (PyMC's ``Emax``).
    tuning : bool
        Whether the step is tuning (then reaching the largest depth is not flagged).

    Returns
    -------
    tuple
        The proposal's ``q``, gradient, log density, energy and index in the trajectory;
        the tree's depth, leaf count, ``log Σ min(1, e^{−ΔH})`` over the leaves, largest
        energy change; whether it diverged, the diverging leaf's energy change, and
        whether it reached ``max_treedepth``.

    """
    d = q0.shape[0]
    levels = max_treedepth + 1
    # The front: the leaf being integrated. Its position, momentum, velocity and gradient
    # are the rows of one array, so that the trajectory's two ends (0 left, 1 right), in
    # the same layout, are copied from and to it whole (their indices in the trajectory
    # apart).
    front = np.empty((4, d))
    q, p, v, g = front[0], front[1], front[2], front[3]
    copy_into(q, q0)
    copy_into(p, p0)
    copy_into(v, v0)
    copy_into(g, grad0)
    ends = np.empty((2, 4, d))
    copy_into(ends[0], front)
    copy_into(ends[1], front)
    end_i = np.zeros(2, dtype=np.int64)
    # The subtree under construction: a stack of completed halves. A half's "first" leaf
    # is the one integrated first (next to the tree), its "last" the farthest. The
    # proposals' arrays have one more row, ``tree``: the whole tree's proposal.
    s_first_p = np.empty((levels, d))
    s_first_v = np.empty((levels, d))
    s_last_p = np.empty((levels, d))
    s_last_v = np.empty((levels, d))
    s_p_sum = np.empty((levels, d))
    s_log_size = np.empty(levels)
    tree = levels
    s_prop_q = np.empty((levels + 1, d))
    s_prop_g = np.empty((levels + 1, d))
    s_prop_logp = np.empty(levels + 1)
    s_prop_energy = np.empty(levels + 1)
    s_prop_index = np.zeros(levels + 1, dtype=np.int64)
    # The tree's proposal (the start), log weight and momentum sum.
    copy_into(s_prop_q[tree], q0)
    copy_into(s_prop_g[tree], grad0)
    s_prop_logp[tree] = logp0
    s_prop_energy[tree] = energy0
    log_size = 0.0
    p_sum = p0.copy()
    # The extended end as it was, scratch space.
    old_p = np.empty(d)
    old_v = np.empty(d)
    old_sum = np.empty(d)
    work = np.empty(d)
    work2 = np.empty(d)
    n_proposals = 0
    log_accept_sum = -np.inf
    max_energy_change = 0.0
    diverging = False
    divergence_energy = 0.0
    depth = 0
    reached_max = False
    for _ in range(max_treedepth):
        direction = 1 if rng.random() < 0.5 else -1
        side = 1 if direction > 0 else 0
        epsilon = step_size * direction
        half = 0.5 * epsilon
        copy_into(front, ends[side])
        copy_into(old_p, p)
        copy_into(old_v, v)
        index = end_i[side]
        top = 0
        failed = False
        for leaf in range(1 << depth):
            # The leapfrog step.
            for i in range(d):
                p[i] += half * g[i]
            _velocity(mass, dense, p, v)
            for i in range(d):
                q[i] += epsilon * v[i]
            out = density((q,) + cells)
            logp = float(out[0][()])
            copy_into(g, out[1])
            for i in range(d):
                p[i] += half * g[i]
            _velocity(mass, dense, p, v)
            energy = 0.5 * _dot(p, v) - logp
            index += direction
            n_proposals += 1
            change = energy - energy0
            if math.isnan(change):
                change = np.inf
            log_accept_sum = _logaddexp(log_accept_sum, -change if change > 0 else 0.0)
            if abs(change) > abs(max_energy_change):
                max_energy_change = change
            if not change < e_max:
                diverging = True
                divergence_energy = change
                failed = True
                break
            # The leaf: a subtree of depth 0.
            copy_into(s_first_p[top], p)
            copy_into(s_first_v[top], v)
            copy_into(s_last_p[top], p)
            copy_into(s_last_v[top], v)
            copy_into(s_p_sum[top], p)
            s_log_size[top] = -change
            copy_into(s_prop_q[top], q)
            copy_into(s_prop_g[top], g)
            s_prop_logp[top] = logp
            s_prop_energy[top] = energy
            s_prop_index[top] = index
            top += 1
            # Merge the halves this leaf completes, in the order of PyMC's recursion.
            count = leaf + 1
            level = 0
            while count % 2 == 0:
                a = top - 2
                b = top - 1
                for i in range(d):
                    work[i] = s_p_sum[a, i] + s_p_sum[b, i]
                turned = _turned(work, s_first_v[a], s_last_v[b])
                if not turned and level > 0:
                    turned = _extra_checks(s_p_sum[a], s_p_sum[b], s_first_v[a], s_last_p[a],
                                           s_last_v[a], s_first_p[b], s_first_v[b],
                                           s_last_v[b], work2)
                merged = _logaddexp(s_log_size[a], s_log_size[b])
                if math.log(rng.random()) < s_log_size[b] - merged:
                    _take_proposal(s_prop_q, s_prop_g, s_prop_logp, s_prop_energy,
                                   s_prop_index, a, b)
                s_log_size[a] = merged
                copy_into(s_p_sum[a], work)
                copy_into(s_last_p[a], s_last_p[b])
                copy_into(s_last_v[a], s_last_v[b])
                top -= 1
                if turned:
                    failed = True
                    break
                count //= 2
                level += 1
            if failed:
                break
        # The end moves even when the extension fails, as PyMC's does (then it is unused).
        copy_into(ends[side], front)
        end_i[side] = index
        depth += 1
        if failed:
            break
        # The subtree (s[0]) joins the tree by biased sampling.
        if math.log(rng.random()) < s_log_size[0] - log_size:
            _take_proposal(s_prop_q, s_prop_g, s_prop_logp, s_prop_energy, s_prop_index,
                           tree, 0)
        log_size = _logaddexp(s_log_size[0], log_size)
        copy_into(old_sum, p_sum)
        for i in range(d):
            p_sum[i] += s_p_sum[0, i]
        if _turned(p_sum, ends[0, _V], ends[1, _V]):
            break
        # PyMC's additional checks: the left half and the right half of the new tree.
        if direction > 0:  # the old tree, then the subtree from its first leaf
            turned = _extra_checks(old_sum, s_p_sum[0], ends[0, _V], old_p, old_v,
                                   s_first_p[0], s_first_v[0], s_last_v[0], work)
        else:  # the subtree from its last leaf, then the old tree
            turned = _extra_checks(s_p_sum[0], old_sum, s_last_v[0], s_first_p[0],
                                   s_first_v[0], old_p, old_v, ends[1, _V], work)
        if turned:
            break
    else:
        reached_max = not tuning
    return (s_prop_q[tree].copy(), s_prop_g[tree].copy(), s_prop_logp[tree],
            s_prop_energy[tree], s_prop_index[tree], depth, n_proposals, log_accept_sum,
            max_energy_change, diverging, divergence_energy, reached_max)


#: The compiled trees, by the density's signature.
_TREES: dict[Any, Any] = {}


class _DensityAddress(WrapperAddressProtocol):
    """A compiled density as a first-class function of its signature.

    Numba's wrapper address protocol: passing it costs the address, not a lookup of the
    dispatcher's compiled code at every call (about 30 µs). Valid in this process only.
    """

    def __init__(self, density: Any, signature: Any) -> None:
        self._density = density  # keeps the compiled code alive
        self._signature = signature
        self._address = _get_wrapper_address(density, signature)
        self._numba_type_ = types.FunctionType(signature)

    def __wrapper_address__(self) -> int:
        return self._address

    def signature(self) -> Any:
        return self._signature


class CompiledTree:
    """:func:`build_tree` compiled for one density ``density((q,) + cells)``.

    The tree is compiled for the density's signature, with the density as a first-class
    function of that signature (not as the particular function): Numba's disk cache keeps
    it for every density with the same argument types, so its about 5 s of compilation
    are paid once per machine and signature, not per model or process. Holds addresses
    of compiled code: build it in the process that calls it (it does not pickle).

    Parameters
    ----------
    density : numba dispatcher
        The density's jitted graph (inputs as ``*args``), compiled for a float64 point and
        ``cells``' types (once called, or called here at ``example``).
    cells : tuple of numpy.ndarray
        Its shared values (their types are part of the tree's signature).
    rng : numpy.random.Generator
        A generator (its type is part of the signature).
    example : numpy.ndarray, optional
        A point at which to call the density if it has not been called in this process.

    Raises
    ------
    TypeError
        When ``density`` has no compiled signature for ``(q,) + cells`` (after the call at
        ``example``).

    """

    __slots__ = ("_function", "_tree")

    def __init__(self, density: Any, cells: tuple[Any, ...], rng: np.random.Generator,
                 example: np.ndarray | None = None) -> None:
        cell_types = tuple(numba.typeof(c) for c in cells)
        point = numba.typeof(np.empty(1))
        # PyTensor's jitted graphs take their inputs as ``*args``: Numba records a
        # signature of one tuple, and the tree calls the density with ``(q,) + cells``.
        packed = types.BaseTuple.from_types((point, *cell_types))
        if (packed,) not in density.signatures and example is not None:
            # not called yet in this process: a writable, C-ordered float64 point
            density(np.array(example, dtype=np.float64), *cells)
        if (packed,) not in density.signatures:
            raise TypeError(
                f"The density has no compiled signature taking {packed} as its arguments "
                f"(it has {density.signatures}); call it once with a float64 point first.")
        returns = density.overloads[(packed,)].signature.return_type
        function = returns(packed)
        self._function = _DensityAddress(density, function)
        key = types.FunctionType(function)  # its signature holds the cells' types
        tree = _TREES.get(key)
        if tree is None:
            vector, matrix, f64 = point, numba.typeof(np.empty((1, 1))), types.float64
            arguments = (key, types.Tuple(cell_types), numba.typeof(rng), vector, vector,
                         vector, vector, f64, f64, f64, matrix, types.boolean, types.int64,
                         f64, types.boolean)
            tree = _TREES[key] = numba.njit(arguments, cache=True)(build_tree)
        self._tree = tree

    def __call__(self, cells: tuple[Any, ...], *args: Any) -> tuple[Any, ...]:
        """:func:`build_tree` with this density: the arguments after ``density``."""
        return self._tree(self._function, cells, *args)
