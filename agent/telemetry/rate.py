"""Pure planner of the sampler's rate while a window is measured, and of the idle power's settle.

**The rate** (docs/adr/0037-energy-at-every-window.md). Outside a measured step the sampler asks
the device tool every ``base_s`` (1 s). While the pipeline's step is one of :data:`FAST_STEPS`
(the key's idle measurement and its benchmark) it samples faster, on a schedule that needs no
guess of the window's length:

    period(elapsed) = min(base_s, max(floor_s, elapsed / target))

so any window at least ``target * floor_s`` long gets at least ``target`` samples (the first
``target * floor_s`` seconds at the floor, then ``target * ln(2)`` more samples for every
doubling of the window, until the period is back at ``base_s``). ``floor_s`` is bounded by the
tool's cost: the median CPU time of the latest samples (the tool's process and the parsing) over
``tool_share`` (sampling takes at most that share of one core), and never under ``min_period_s``.

**The idle power** is read in one defined state before each key's benchmark: the server up and
answering, no request in flight, after a settle. The state is settled when the power samples of
the last ``window_s`` (every device) spread by at most ``tolerance`` of their median (or 1 W);
the idle power is their median, summed over the devices, and their spread is reported with it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

FAST_STEPS = frozenset({"idle", "benchmark"})  # the pipeline's steps sampled on the window schedule
# the schedule aims at this many times the samples a window needs (a stall costs a few)
TARGET_MARGIN = 1.5
MIN_PERIOD_S = 0.04  # never faster than this, whatever the tool costs
# sampling may take at most this share of one core's CPU while a window is sampled fast
TOOL_SHARE = 0.1
# idle is settled when its samples over the idle window spread at most this share of their median, or at most
# IDLE_ABS_W watts (a low, quantised power), with at least IDLE_SAMPLES samples in the window (it is made long enough
# for them)
IDLE_TOLERANCE = 0.05
IDLE_ABS_W = 1.0
IDLE_SAMPLES = 5


@dataclass(frozen=True)
class Schedule:
    """The periods of one fast step (a key's idle measurement or its benchmark), from ``since`` on."""

    since: float  # epoch s: when the step began
    base_s: float
    floor_s: float
    # samples any window of at least target * floor_s seconds gets
    target: int

    def __post_init__(self) -> None:
        if not (0 < self.floor_s <= self.base_s) or self.target < 1:
            raise ValueError(f"sampling schedule: floor {self.floor_s} s, base {self.base_s} s, target "
                             f"{self.target}: need 0 < floor <= base and a target of at least 1")

    def period(self, ts: float) -> float:
        """The period the sampler keeps at ``ts`` (epoch s)."""
        return min(self.base_s, max(self.floor_s, (ts - self.since) / self.target))

    def expected(self, window_s: float) -> float:
        """Samples this schedule takes over the first ``window_s`` seconds of the step (no stall)."""
        knee = self.target * self.floor_s  # the floor until here
        top = self.target * self.base_s  # the base from here on
        if window_s <= knee:
            return window_s / self.floor_s
        grown = self.target * (1 + math.log(min(window_s, top) / knee))
        return grown + max(0.0, window_s - top) / self.base_s


def target_samples(min_samples: int, margin: float = TARGET_MARGIN) -> int:
    """Samples the schedule aims at for windows that need ``min_samples``."""
    return max(1, math.ceil(min_samples * margin))


def tool_floor(cost_s: Sequence[float], *, base_s: float, share: float = TOOL_SHARE,
               min_period_s: float = MIN_PERIOD_S) -> float:
    """The fastest period the tool's cost allows: the median CPU seconds of the latest samples over ``share``, at
    least ``min_period_s``, at most ``base_s`` (nothing measured yet: ``min_period_s``)."""
    if not 0 < share <= 1:
        raise ValueError(f"tool share {share}: must be in (0, 1]")
    cost = statistics.median(cost_s) / share if cost_s else 0.0
    return min(base_s, max(min_period_s, cost))


@dataclass(frozen=True)
class IdleReading:
    """The module's idle power before a key's benchmark: the median of the settled window, and its spread."""

    power_w: float | None
    """The medians of the devices' windows, summed; None without power samples."""
    spread_w: float | None
    """The max - min of each device's window, summed."""
    samples: int
    """Samples in the window, every device."""
    settle_s: float
    """From the idle step's start to the end of the window used."""
    settled: bool
    """False: the settle ran out of time and the last window was taken as it was."""


def idle_window(points: Mapping[int, Sequence[tuple[float, float]]], now: float, *, window_s: float,
                waited_s: float, tolerance: float = IDLE_TOLERANCE, min_samples: int = IDLE_SAMPLES,
                timed_out: bool = False) -> IdleReading | None:
    """The idle reading from each device's power points ``(ts, W)`` of the last ``window_s`` before ``now``, when
    they have settled (every device: at least ``min_samples`` points spanning 75 % of the window, spreading at
    most ``tolerance`` of their median or :data:`IDLE_ABS_W`); None while not settled, unless ``timed_out``
    (then the last window as it is, ``settled`` False; None only when a device has no point at all)."""
    if not points:
        return None
    total, spread, n, settled = 0.0, 0.0, 0, True
    for pts in points.values():
        last = sorted(p for p in pts if now - window_s <= p[0] <= now)
        if not last:
            return None
        watts = [w for _, w in last]
        mid = statistics.median(watts)
        rng = max(watts) - min(watts)
        span = last[-1][0] - last[0][0]
        if len(last) < min_samples or span < 0.75 * window_s or rng > max(tolerance * mid, IDLE_ABS_W):
            settled = False
        total, spread, n = total + mid, spread + rng, n + len(last)
    if not settled and not timed_out:
        return None
    return IdleReading(power_w=round(total, 4), spread_w=round(spread, 4), samples=n, settle_s=round(waited_s, 3),
                       settled=settled)
