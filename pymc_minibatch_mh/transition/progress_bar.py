"""The columns a minibatch step adds to PyMC's progress bar (PyMC's hooks).

Each column shows a number the step used: the running mean batch size, the acceptance
rate, and the proposal's tuned parameter (its scale where it has one, else the step size
it adapted itself).

The ``epsilon`` stat is deliberately not a column. It is the paper's worst-case bound on
the distance between the law of Δ* and the normal law (Novak's inequality), never below
6.4/√b and about 11.8/√b even for exactly normal ratios, so it is above 1 at the usual
batch sizes while the step's error is small: shown live, it would alarm for nothing. The
error to read is the ``error_estimate`` stat (the estimated error of each step's
acceptance probability) and, to measure it, the audit (``audit_every=``,
:func:`~pymc_minibatch_mh.audit_summary`); see the guide pages "Sample
stats" and "How wrong can it be?".
"""

from __future__ import annotations

from typing import Any

__all__ = ["progressbar_config", "progressbar_update_functions"]


_TUNED_LABELS = {"scaling": "Scaling", "step_size": "Step size"}


def progressbar_config(
    n_chains: int = 1, tuned: str | None = "scaling"
) -> tuple[list[Any], dict[str, list[Any]]]:
    """The columns a minibatch step adds to PyMC's progress bar, and their initial values.

    Parameters
    ----------
    n_chains : int
        Number of chains.
    tuned : {"scaling", "step_size", None}
        The stat of the third column: the scale the proposal used, or the step size a
        proposal adapted itself; None for no third column.

    Returns
    -------
    tuple
        ``(columns, stats)``: ``rich`` columns for the running mean batch size, acceptance
        rate and tuned parameter, and one initial value per chain for each.

    """
    from rich.progress import TextColumn
    from rich.table import Column

    columns = [
        TextColumn("{task.fields[mean_batch_size]:0.1f}",
                   table_column=Column("Mean batch", ratio=1)),
        TextColumn("{task.fields[accept_rate]:0.2f}", table_column=Column("Accept", ratio=1)),
    ]
    stats = {"mean_batch_size": [0.0] * n_chains, "accept_rate": [0.0] * n_chains}
    if tuned is not None:
        columns.append(TextColumn(f"{{task.fields[{tuned}]:0.3g}}",
                                  table_column=Column(_TUNED_LABELS[tuned], ratio=1)))
        stats[tuned] = [0.0] * n_chains
    return columns, stats


def progressbar_update_functions(tuned: str | None = "scaling") -> tuple[Any, ...]:
    """The function that maps a step's stats to the progress bar's fields (PyMC's hook).

    Parameters
    ----------
    tuned : {"scaling", "step_size", None}
        As for :func:`progressbar_config`.

    Returns
    -------
    tuple
        One function, ``stats -> fields``.

    """

    def update_stats(step_stats: dict[str, Any]) -> dict[str, Any]:
        fields = {
            "mean_batch_size": step_stats["mean_batch_size"],
            "accept_rate": step_stats["accept_rate"],
            "failing": bool(step_stats["nonfinite"]),
        }
        if tuned is not None:
            fields[tuned] = step_stats[tuned]
        return fields

    return (update_stats,)
