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
- hierarchical logistic regression, N = 10⁵, 20 groups, NUTS on the surrogate: ESS 278
  and R-hat 1.011 (k = 1), 697 and 1.004 (k = 3), sampling 3.2 and 7.4 s;
- the same at N = 10⁶ (one run each, 2017 seed): smallest bulk / tail ESS 324 / 120 and
  R-hat 1.022 (k = 3), 1,018 / 808 and 1.006 (k = 9); sampling time grows with k, ESS
  faster (one surrogate NUTS iteration moves less along the ridge, narrower at larger N).

``"auto"`` makes the transitions per draw that the proposal declares
(:attr:`~pymc_minibatch_mh.proposals.base.Proposal.transitions_per_draw`): 9 with NUTS on
the surrogate, 3 with the other surrogate proposals, and one with the random walk, whose
steps are small and whose draws are correlated anyway.

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

__all__ = ["merge_stats", "resolve_steps_per_draw"]

_SUMMED = ("batch_size", "growth_rounds", "extra_evaluations")
_ANY = ("full_data", "nonfinite", "recentered", "grinding")
_MEAN = ("accepted", "accept")


def resolve_steps_per_draw(value: Any, proposal: Proposal) -> int:
    """``steps_per_draw`` as a positive int; ``"auto"``: what the proposal declares.

    (:attr:`~pymc_minibatch_mh.proposals.base.Proposal.transitions_per_draw`: 9 for NUTS
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
