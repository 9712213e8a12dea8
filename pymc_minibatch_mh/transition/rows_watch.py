"""Never grind silently: a step that reads most of the data at every transition says so.

A minibatch test pays only while its minibatches stay small next to N. When the test
needs a large share of the rows at every step for long (control variates that no longer
fit where the chain moves, proposals too wide for the test's precision), the chain still
samples the right posterior, only as slowly as a full-data sampler or slower, and a user
should learn it within seconds rather than after the run.

:class:`RowsWatch` sums the rows of the chain's transitions in consecutive blocks of
:data:`WINDOW`. When a block's mean exceeds :data:`SHARE` of N, the step warns once per
chain with what it measured and what to try, and the ``grinding`` sample stat is True for
each draw until a later block's mean is back under the share. (Blocks rather than a
sliding window: two additions per transition, which the Gaussian-mixture benchmark's step
of about 45 µs can afford.)
"""

from __future__ import annotations

__all__ = ["SHARE", "WINDOW", "RowsWatch", "grinding_message"]

#: Transitions per block over which the rows per transition are averaged.
WINDOW = 100
#: Share of N above which the window's mean rows per transition counts as grinding.
SHARE = 0.25


class RowsWatch:
    """Mean rows per transition of one chain, in consecutive blocks of ``window``."""

    __slots__ = ("window", "share", "_total", "_count", "over", "mean", "warned")

    def __init__(self, window: int = WINDOW, share: float = SHARE) -> None:
        self.window = int(window)
        self.share = float(share)
        self._total = 0
        self._count = 0
        #: Whether the last complete block was over the share.
        self.over = False
        #: Mean rows per transition of the last complete block (NaN before the first).
        self.mean = float("nan")
        #: Whether the chain has crossed the share once (the step warns then).
        self.warned = False

    def update(self, rows: int, n_rows: int) -> bool:
        """Count one transition of ``rows`` rows; whether the last complete block is over."""
        self._total += rows
        self._count += 1
        if self._count == self.window:
            self.mean = self._total / self.window
            self.over = self._total > self.share * n_rows * self.window
            self._total = self._count = 0
        return self.over


def grinding_message(step_name: str, mean_rows: float, n_rows: int, window: int,
                     tuning: bool, control_variate: bool) -> str:
    """The warning of a grinding chain: what was measured and what to try."""
    advice = (
        "Control variates are on, but they no longer fit where the chain moves (for example "
        "along group scales and small groups of a hierarchical model): try a centred or "
        "non-centred parameterisation of the groups, fewer free scales, or sample this "
        "model with NUTS (pm.sample() without step=)."
        if control_variate else
        "At temperature 1 with proposals as wide as the posterior the test needs most of "
        "the data: use control_variate='auto' (the default), smaller steps (scaling, S), "
        "or NUTS (pm.sample() without step=)."
    )
    phase = "tuning" if tuning else "sampling"
    return (
        f"{step_name}: the acceptance test read {mean_rows:,.0f} of the N = {n_rows:,} rows "
        f"({100.0 * mean_rows / n_rows:.0f} %) per transition on average over "
        f"{window} transitions ({phase}): the minibatches save little here, and each "
        f"transition costs a sizeable share of a full-data one. {advice} The 'grinding' "
        "sample stat marks the draws concerned (this warning is shown once per chain)."
    )
