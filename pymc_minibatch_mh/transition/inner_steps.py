r"""Several transitions per draw: ``steps_per_draw`` and the stats of a draw.

A minibatch step method makes ``steps_per_draw`` transitions (propose, estimate, test)
for each draw it returns to PyMC. Each transition leaves the posterior invariant, so
their composition does too; the draw is the state after the last one. This pays when a
transition is cheap next to PyMC's work per draw and rejects often: with a proposal that
moves a whole posterior width (Crank–Nicolson near the independence sampler, NUTS on the
surrogate), Barker's test accepts at most about half of the moves, so one transition
leaves the state unchanged about half the time. Measured with PyMC's defaults (1000 + 1000
draws, 2 chains, by thinning k-times longer runs):

- logistic regression, N = 10⁵, d = 50, Crank–Nicolson: smallest bulk ESS 504 (k = 1),
  960 (2), 1,147 (3), 1,404 (4) for 0.43, 0.66, 0.63, 0.83 s of sampling; R-hat 1.015 at
  k = 1, below 1.006 from k = 3 on;
- NUTS on the surrogate, which samples the group effects that the data fix centred
  (one run each, warm caches, ``real_zoo.py`` subsets of 3·10⁴ rows; k = 1, 2, 3, 4, 9):
  bambi's ``(prestige|year)`` smallest bulk ESS 742, 1,278, 1,310, 1,585, 1,546 in 5.1,
  6.4, 8.3, 10.2, 21.3 s of sampling, R-hat 1.014 at k = 1, at most 1.006 from k = 2;
  ``(1|state)`` on a Bernoulli ESS 878, 1,230, 1,213, 1,603, 1,522 in 3.4, 5.5, 8.0,
  10.5, 32.4 s, R-hat 1.020, 1.007, 1.008, 1.007, 1.004; ``(1|sch)`` (k = 3, 4, 9) ESS
  1,032, 1,242, 1,502 in 8.2, 10.5, 39.6 s, R-hat 1.011, 1.007, 1.004; births by state
  on all 372,864 rows (k = 2, 3, 9) ESS 1,162, 1,700, 1,628 in 0.9, 1.3, 3.4 s; the
  generated non-centred hierarchical logistic regression (``bench_tall_glm.py``
  ``hier:1e6:20``, k = 3, 4, 9) ESS 1,425, 1,689, 1,423 in 5.0, 6.9, 33.2 s, R-hat at
  most 1.004.

``"auto"`` makes the transitions per draw that the proposal declares
(:attr:`~pymc_minibatch_mh.proposals.base.Proposal.transitions_per_draw`): 4 with NUTS on
the surrogate, 3 with the other surrogate proposals, and one with the random walk, whose
steps are small and whose draws are correlated anyway. A step whose test accepts a
near-perfect proposal more often than Barker's may make fewer: ``MinibatchBarker`` with
the penalty test and Crank–Nicolson makes the number :func:`cost_per_effective_sample`
prefers, one at σ ≤ 0.25 and the proposal's 3 at σ = 0.5.

**The cost model** (:func:`cost_per_effective_sample`) that chooses between settings: a
perfect independence proposal accepted with probability α leaves the state unchanged with
probability 1 − α at each transition, so ``k`` transitions give draws with lag-one
autocorrelation ``r = (1 − α)^k`` and ``(1 − r)/(1 + r)`` effective samples per draw (a
proposal that keeps ρ of the state's deviation from the mean, Crank–Nicolson's
autoregression, gives ``r = (1 − α(1 − ρ))^k``: below zero with over-relaxed moves); a
draw costs ``k`` transitions, each its fixed work plus its rows (:data:`ROW_COST`) and
growth rounds (:data:`ROUND_COST`), and its work besides them (:data:`DRAW_COST`).
Measured on logistic regressions with Crank–Nicolson (PyMC 5, 2 × 2000 draws):

- at N = 3·10⁴, d = 10, 0.24, 0.37 and 0.49 s of sampling for 1, 2 and 3 transitions per
  draw (about 30 µs per draw and per transition), and 118 ns per row read by the test
  (m = 2, 1000 and 3000 rows per round); 165 ns at N = 10⁶, where the rows no longer fit
  in the cache, 218 ns at N = 10⁵, d = 100 (with 0.007 instead of :data:`ROW_COST`'s
  0.004 the model makes the same choices at the logistic grid's measured rows);
- with PyMC's fixed number of draws the set-up is part of a draw's cost: at N = 10⁶,
  d = 100 (set-up 2 s) the penalty test at σ = 0.5 gave 985 effective samples in 0.44 s
  of sampling at one transition per draw and 1,655 in 0.89 s at three, 404 against 570
  per second with the set-up. With :data:`DRAW_COST` at 5 the model makes one transition
  per draw where a test accepts at least 0.9 of perfect proposals (the penalty test at
  σ ≤ 0.25), and 3 with the penalty test at σ = 0.5 and with Barker's;
- a growing minibatch pays for each round: at N = 10⁵, d = 100 the penalty test at
  σ = 0.1 grew to 807 rows in about 8 rounds of 100 and took 355 µs a transition, about
  150 µs more than its fixed work and rows; σ = 0.25 (170 rows, about 2 rounds) gave the
  most effective samples per second there, 880 against 468 with the set-up.

The stats of a draw with several transitions (:func:`merge_stats`): the rows and rounds
are summed over its transitions (``batch_size`` is the rows the draw cost), ``accepted``
and ``accept`` are the fraction of transitions accepted and the mean acceptance
probability, ``full_data``, ``nonfinite``, ``recentered`` and ``grinding`` say whether any
transition had them, and every other stat (the test's own stats, the error estimate, the tuned
parameters, the audit's) is that of one transition: the last audited one, else the last.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pymc_minibatch_mh.proposals.base import Proposal

__all__ = [
    "DRAW_COST",
    "ROUND_COST",
    "ROW_COST",
    "cost_per_effective_sample",
    "merge_stats",
    "resolve_steps_per_draw",
    "transition_cost",
]

#: A draw's work besides its transitions, in units of a transition's fixed work: PyMC's
#: recording of the draw and its stats (about one transition's, measured) plus the set-up's
#: share per draw, which PyMC's fixed number of draws makes part of the cost of an
#: effective sample (a set-up of 0.2–2 s over 2 × 2000 draws: 2–16 transitions a draw).
DRAW_COST: float = 5.0
#: One row read by the test, in units of a transition's fixed work (measured: 118 ns
#: against 30 µs; a transition costs as much as about 250 rows in memory).
ROW_COST: float = 0.004
#: Each growth round after a transition's first, in units of a transition's fixed work
#: (measured: about 20 µs, the rows aside; see the module docstring).
ROUND_COST: float = 0.7

_SUMMED = ("batch_size", "growth_rounds", "extra_evaluations")
_ANY = ("full_data", "nonfinite", "recentered", "grinding")
_MEAN = ("accepted", "accept")


def resolve_steps_per_draw(value: Any, proposal: Proposal) -> int:
    """``steps_per_draw`` as a positive int; ``"auto"``: what the proposal declares.

    (:attr:`~pymc_minibatch_mh.proposals.base.Proposal.transitions_per_draw`: 4 for NUTS
    on the surrogate, 3 for the other surrogate proposals, 1 for the random walk.)

    Raises
    ------
    ValueError
        Unless ``value`` is ``"auto"`` or a positive integer.

    """
    if isinstance(value, str) and value == "auto":
        return int(proposal.transitions_per_draw)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"steps_per_draw must be a positive integer or 'auto', got {value!r}. It is "
            "the number of transitions (propose, estimate, test) per draw."
        )
    return int(value)


def cost_per_effective_sample(accept: float, rows: float, steps: int,
                              rounds: float = 1.0, rho: float = 0.0) -> float:
    """Predicted work per effective sample, in transitions (the module docstring's model).

    Parameters
    ----------
    accept : float
        The test's acceptance probability of a perfect proposal (1/2 for Barker's test,
        ``h_σ(0)`` for the penalty test), in (0, 1].
    rows : float
        Predicted rows per transition.
    steps : int
        Transitions per draw.
    rounds : float, optional
        Predicted rounds per transition (the first included).
    rho : float, optional
        The proposal's autoregression coefficient in the surrogate's whitened coordinates
        (0: the independence sampler; below 0, Crank–Nicolson's over-relaxed moves): an
        accepted move keeps ρ of the state's deviation from θ̂, a rejected one all of it.

    Returns
    -------
    float
        ``(DRAW_COST + steps · transition_cost(rows, rounds)) / ((1 − r)/(1 + r))``
        with ``r = (1 − accept·(1 − ρ))^steps``, the lag-one autocorrelation of a draw's
        linear functions.

    Examples
    --------
    >>> round(cost_per_effective_sample(0.5, 2.0, 3), 2)  # Barker's test, 3 per draw
    10.32
    >>> round(cost_per_effective_sample(0.96, 2.0, 1), 2)  # the penalty test at σ = 0.1
    6.51
    >>> round(cost_per_effective_sample(0.96, 2.0, 1, rho=-0.5), 2)  # ... over-relaxed
    2.34

    """
    r = (1.0 - accept * (1.0 - rho)) ** steps
    return (DRAW_COST + steps * transition_cost(rows, rounds)) * (1.0 + r) / (1.0 - r)


def transition_cost(rows: float, rounds: float = 1.0) -> float:
    """Predicted work of one transition, in transitions' fixed work (the module's model).

    ``1 + ROW_COST · rows + ROUND_COST · (rounds − 1)``: its fixed work, the rows its test
    reads and the growth rounds after the first.

    Examples
    --------
    >>> transition_cost(250.0)  # a transition costs as much as about 250 rows in memory
    2.0

    """
    return 1.0 + ROW_COST * rows + ROUND_COST * max(rounds - 1.0, 0.0)


def merge_stats(transitions: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The stats of one draw from those of its transitions (see the module docstring)."""
    if len(transitions) == 1:
        return transitions[0]
    kept = next((s for s in reversed(transitions) if s.get("audited")), transitions[-1])
    merged = dict(kept)
    for key in _SUMMED:
        if key in kept:
            merged[key] = sum(s[key] for s in transitions)
    for key in _ANY:
        if key in kept:
            merged[key] = any(s[key] for s in transitions)
    for key in _MEAN:
        if key in kept:
            merged[key] = sum(s[key] for s in transitions) / len(transitions)
    return merged
