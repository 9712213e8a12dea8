"""Never fail to mix silently: a chain whose tuning draws barely move says so.

A minibatch step can be right in law and still useless in practice: a random walk without
control variates at temperature 1, or moves around a Laplace fit that is far from the
posterior (the joint mode of a hierarchical model, where a group scale sits at its
boundary), leave the chain where it started for thousands of draws. PyMC's R-hat check
sees this only after the run and only with several chains.

:class:`MixingWatch` keeps the flat state of the chain's last :data:`WINDOW` tuning draws
and, at the end of tuning, estimates each coordinate's bulk effective sample size over
them (ArviZ's ``ess``, one chain). When the smallest is below :data:`MIN_ESS`, the step
warns with what it measured: the draws that follow are unlikely to represent the
posterior within PyMC's default number of draws.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

__all__ = ["MIN_ESS", "MIN_WINDOW", "WINDOW", "MixingWatch", "mixing_message"]

#: Tuning draws kept: the last ones, after the chain has had time to leave its start.
WINDOW = 400
#: Fewer kept draws than this (short tuning) and nothing is measured.
MIN_WINDOW = 100
#: The smallest bulk ESS over the window below which the chain counts as not mixing.
MIN_ESS = 10.0
#: Coordinates measured at most (all below this; else a fixed subset and every scalar).
MAX_COORDINATES = 400


class MixingWatch:
    """The last tuning draws of one chain and their effective sample sizes."""

    def __init__(self, dim: int, window: int = WINDOW) -> None:
        self.window = int(window)
        self._draws = np.empty((self.window, dim))
        self._count = 0
        #: The smallest bulk ESS over the kept draws at the end of tuning (NaN before).
        self.min_ess = float("nan")
        #: The coordinate where it was measured (-1 before).
        self.worst = -1
        #: How many measured coordinates were below :data:`MIN_ESS`.
        self.below = 0
        #: How many coordinates were measured.
        self.measured = 0

    def record(self, flat: NDArray[np.float64]) -> None:
        """Keep one tuning draw (the flat state)."""
        self._draws[self._count % self.window] = flat
        self._count += 1

    def kept(self) -> int:
        """The number of draws kept."""
        return min(self._count, self.window)

    def measure(self, scalar_coordinates: Sequence[int] = ()) -> bool:
        """Estimate the ESS over the kept draws; whether the chain mixes too slowly.

        Nothing is measured (False) with fewer than :data:`MIN_WINDOW` draws kept.
        """
        import arviz as az
        import xarray as xr

        n = self.kept()
        if n < MIN_WINDOW:
            return False
        order = np.arange(self._count - n, self._count) % self.window
        draws = self._draws[order]
        columns = _coordinates(draws.shape[1], scalar_coordinates)
        data = draws[:, columns]
        moving = np.ptp(data, axis=0) > 0.0
        ess = np.zeros(columns.size)
        if moving.any():
            dataset = xr.Dataset({"x": (("chain", "draw", "coordinate"),
                                        data[None, :, moving])})
            ess[moving] = np.asarray(az.ess(dataset)["x"].values, dtype=float)
        ess = np.nan_to_num(ess, nan=0.0)
        worst = int(np.argmin(ess))
        self.min_ess = float(ess[worst])
        self.worst = int(columns[worst])
        self.below = int(np.sum(ess < MIN_ESS))
        self.measured = int(columns.size)
        return self.min_ess < MIN_ESS


def _coordinates(dim: int, scalar_coordinates: Sequence[int]) -> NDArray[np.int64]:
    """Which coordinates to measure: all, or every scalar one and a fixed subset."""
    if dim <= MAX_COORDINATES:
        return np.arange(dim)
    rng = np.random.default_rng(0)
    scalars = np.asarray(sorted(set(scalar_coordinates)), dtype=np.int64)[:MAX_COORDINATES]
    rest = np.setdiff1d(np.arange(dim), scalars)
    pick = rng.choice(rest, size=MAX_COORDINATES - scalars.size, replace=False)
    return np.sort(np.concatenate([scalars, pick])).astype(np.int64)


def mixing_message(step_name: str, watch: MixingWatch, coordinate: str, proposal: str,
                   control_variate: bool) -> str:
    """The warning of a chain that does not mix: what was measured and what to try."""
    if proposal == "random_walk":
        advice = (
            "A random walk's steps must stay small for the minibatch test at temperature 1, "
            "and small steps need many draws, more so in many dimensions. "
            + ("Use the default proposal='auto' (moves around the control variates' fit), "
               if control_variate else
               "Use control_variate='auto' (the default) and proposal='auto', ")
            + "or NUTS (pm.sample() without step=)."
        )
    else:
        advice = (
            "The proposal moves around the control variates' fit at the mode; where the "
            "posterior is far from it (group scales near zero, a funnel) the moves are "
            "rejected. Try "
            + ("" if proposal == "surrogate_nuts" else "proposal='surrogate_nuts', ")
            + "a centred or non-centred parameterisation of the groups, or NUTS "
            "(pm.sample() without step=)."
        )
    return (
        f"{step_name}: the chain does not mix. Over its last {watch.kept()} tuning draws "
        f"the bulk effective sample size of {coordinate} is {watch.min_ess:.1f} "
        f"({watch.below} of {watch.measured} coordinates measured are below "
        f"{MIN_ESS:.0f}) with proposal {proposal!r}: the draws that follow are unlikely to "
        f"represent the posterior. {advice} Check R-hat over several chains."
    )
