"""Temperature schedules: tempered exploration, then sampling at another temperature.

Seita et al. (2017, Figure 3 right) run logistic regression at temperature 100 for 400
samples, then switch to temperature 1 with a smaller proposal step. A
:class:`TemperatureSchedule` gives the step method that plan: from a given iteration of
the chain on (counting from the chain's first step, tuning included), a temperature and a
factor that multiplies the proposal scale.

Draws made before the last change sample a different (tempered) target: treat them as
exploration, e.g. discard them with ``tune=`` covering them or by slicing the trace.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable

__all__ = ["TemperatureSchedule"]


class TemperatureSchedule:
    """Piecewise-constant temperature (and proposal-scale factor) by chain iteration.

    Parameters
    ----------
    phases : iterable of tuple
        ``(start_iteration, temperature)`` or ``(start_iteration, temperature,
        step_factor)``; the first phase must start at iteration 0. ``step_factor``
        (default 1) multiplies the proposal's scale during the phase.

    Examples
    --------
    >>> schedule = TemperatureSchedule([(0, 100.0), (400, 1.0, 0.1)])
    >>> schedule(0), schedule(399), schedule(400)
    ((100.0, 1.0), (100.0, 1.0), (1.0, 0.1))
    """

    def __init__(self, phases: Iterable[tuple[float, ...]]) -> None:
        rows = []
        for phase in phases:
            if len(phase) not in (2, 3):
                raise ValueError(
                    "each phase is (start_iteration, temperature[, step_factor]), "
                    f"got {phase!r}"
                )
            start, temperature = int(phase[0]), float(phase[1])
            factor = float(phase[2]) if len(phase) == 3 else 1.0
            if not (math.isfinite(temperature) and temperature > 0):
                raise ValueError(f"temperatures must be positive and finite, got {temperature}")
            if not (math.isfinite(factor) and factor > 0):
                raise ValueError(f"step factors must be positive and finite, got {factor}")
            rows.append((start, temperature, factor))
        rows.sort()
        if not rows or rows[0][0] != 0:
            raise ValueError("the first phase of a TemperatureSchedule must start at iteration 0")
        if len({r[0] for r in rows}) != len(rows):
            raise ValueError("two phases start at the same iteration")
        self.starts = tuple(r[0] for r in rows)
        self.temperatures = tuple(r[1] for r in rows)
        self.factors = tuple(r[2] for r in rows)

    def __call__(self, iteration: int) -> tuple[float, float]:
        """``(temperature, step_factor)`` at a chain iteration."""
        k = bisect.bisect_right(self.starts, iteration) - 1
        return self.temperatures[k], self.factors[k]

    def next_change(self, iteration: int) -> int | None:
        """The first iteration after ``iteration`` where the phase changes, or None."""
        k = bisect.bisect_right(self.starts, iteration)
        return self.starts[k] if k < len(self.starts) else None

    def __repr__(self) -> str:
        phases = ", ".join(
            f"({s}, {t:g}, {f:g})"
            for s, t, f in zip(self.starts, self.temperatures, self.factors, strict=True)
        )
        return f"TemperatureSchedule([{phases}])"
