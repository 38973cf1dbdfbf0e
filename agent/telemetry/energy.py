"""Energy over a benchmark window, from the device's samples (pure: samples and a window in, figures out).

Two sources, the counter preferred (docs/adr/0022-energy-per-token.md, 0037-energy-at-every-window.md):

- **counter**: a cumulative energy counter (NVML's total energy, mJ), read at the window's two edges
  (:class:`Edge`, as vLLM's ``energy.py`` does: the energy is end minus start, nothing in between is
  needed); without edge readings, the sampled ``DeviceSample.energy_mj`` interpolated at each edge;
- **samples**: the power samples (W) integrated by the trapezoid rule, clipped to the window
  (the power at an edge is interpolated between the samples around it).

Nothing is guessed: the samples must reach across the whole window (a sample at or before its
start and one at or after its end), no two neighbouring samples over it may lie further apart
than ``gap_factor`` periods (the period in force there: the fast schedule's while the window is
sampled fast, :class:`agent.telemetry.rate.Schedule`) and 5 % of the window, a window needs ``MIN_SAMPLES`` samples
inside it, and a counter that goes back (a reset, a driver reload; NVML's 64-bit millijoule
counter does not wrap in practice, so a wrap reads as one) drops the figure. A dropped figure
keeps its window and coverage, and says why in ``EnergyWindow.note``, in one line.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from agent.telemetry.rate import IdleReading, Schedule
from contract.energy import EnergyWindow
from contract.records import DeviceSample, ResultRow

Point = tuple[float, float]  # (ts, value)


@dataclass(frozen=True)
class Edge:
    """The devices' cumulative energy counters (mJ per device index) read at one edge of a window, and when
    (``counters`` None: the module offers none)."""

    ts: float
    counters: dict[int, float] | None = None

GAP_FACTOR = 2.5  # two samples further apart than this many periods: a gap
GAP_SHARE = 0.05  # ... unless no further apart than this share of the window
# idle power: the median of the latest this many idle samples before the key
IDLE_SAMPLES = 5
# %: a sample at or below this utilisation (or without one) counts as idle
IDLE_UTILIZATION = 5.0
# a window needs at least this many samples (readings) inside it: the power of a benchmark steps between
# prefill, decode and idle many times a window, and a figure from a handful of samples is mostly which phase
# each one hit (a simulated window of 8 samples at 1 s moved J/token by 23 % between two runs of one release)
MIN_SAMPLES = 20


@dataclass(frozen=True)
class Integral:
    """What one series of points says about a window: the energy (None: dropped), and its evidence."""

    joules: float | None
    # the length of the window between the first and the last point around it; the points inside it (edges included);
    # their median interval; the longest interval between two neighbouring points over the window
    covered_s: float
    points: int
    period_s: float | None
    max_gap_s: float | None
    note: str = ""


def _around(points: Sequence[Point], start: float, end: float) -> list[Point]:
    """The points over [start, end]: the last one at or before ``start``, those inside, the first one at
    or after ``end`` (sorted by time; equal times keep the later point)."""
    pts = sorted(points, key=lambda p: p[0])
    before = [p for p in pts if p[0] <= start]
    inside = [p for p in pts if start < p[0] < end]
    after = [p for p in pts if p[0] >= end]
    return ([before[-1]] if before else []) + inside + ([after[0]] if after else [])


def _evidence(used: list[Point], start: float, end: float) -> tuple[float, int, float | None, float | None]:
    """(covered seconds, points inside, median interval, longest interval) of the points over a window."""
    if not used:
        return 0.0, 0, None, None
    covered = max(0.0, min(end, used[-1][0]) - max(start, used[0][0]))
    inside = sum(1 for t, _ in used if start <= t <= end)
    steps = [b[0] - a[0] for a, b in zip(used, used[1:], strict=False)]
    return covered, inside, (statistics.median(steps) if steps else None), (max(steps) if steps else None)


def _at(a: Point, b: Point, t: float) -> float:
    """The value at ``t`` on the line from ``a`` to ``b``."""
    if b[0] == a[0]:
        return b[1]
    return a[1] + (b[1] - a[1]) * (t - a[0]) / (b[0] - a[0])


def _period_at(ts: float, period_s: float, schedule: Schedule | None) -> float:
    """The period the sampler kept at ``ts``: the fast schedule's from its start on, else ``period_s``."""
    return schedule.period(ts) if schedule is not None and ts >= schedule.since else period_s


def _check(used: list[Point], start: float, end: float, period_s: float, gap_factor: float,
           what: str, schedule: Schedule | None = None) -> tuple[tuple[float, int, float | None, float | None], str]:
    ev = covered, _, _, _ = _evidence(used, start, end)
    window = end - start
    if not used or covered < window * (1 - 1e-9) or used[0][0] > start or used[-1][0] < end:
        share = covered / window if window > 0 else 0.0
        return ev, f"{what} cover {share:.0%} of the window: figure dropped"
    # a hole of up to GAP_SHARE of the window is bridged whatever the period (its line moves the figure by at
    # most ~2 % where the power swings by its mean, ADR 0037): a loaded machine's stall of a tenth of a second in
    # a fast-sampled window of seconds is not a gap; never more than gap_factor base periods
    bridged = min(GAP_SHARE * window, gap_factor * period_s)
    for a, b in zip(used, used[1:], strict=False):
        allowed = max(_period_at(a[0], period_s, schedule), _period_at(b[0], period_s, schedule))
        if b[0] - a[0] > max(gap_factor * allowed, bridged):
            return ev, (f"a gap of {b[0] - a[0]:.3g} s in the {what} (at {a[0]:.3f}; more than {gap_factor:g} x "
                        f"the {allowed:.3g} s period and {GAP_SHARE:.0%} of the window): figure dropped")
    return ev, ""


def integrate_power(points: Sequence[Point], start: float, end: float, *, period_s: float,
                    gap_factor: float = GAP_FACTOR, schedule: Schedule | None = None) -> Integral:
    """Joules over [start, end] from power samples ``(ts, W)``: trapezoids between neighbouring samples,
    clipped to the window (the power at an edge interpolated between the samples around it)."""
    if not end > start:
        raise ValueError(f"energy window [{start}, {end}] is empty")
    used = _around(points, start, end)
    (covered, inside, period, longest), note = _check(used, start, end, period_s, gap_factor, "power samples",
                                                      schedule)
    if note:
        return Integral(None, covered, inside, period, longest, note)
    joules = 0.0
    for a, b in zip(used, used[1:], strict=False):
        lo, hi = max(a[0], start), min(b[0], end)
        if hi > lo:
            joules += (_at(a, b, lo) + _at(a, b, hi)) / 2 * (hi - lo)
    return Integral(joules, covered, inside, period, longest)


def counter_energy(points: Sequence[Point], start: float, end: float, *, period_s: float,
                   gap_factor: float = GAP_FACTOR, schedule: Schedule | None = None) -> Integral:
    """Joules over [start, end] from a cumulative counter's readings ``(ts, mJ)``: its value interpolated
    at each edge, the difference. A reading lower than the one before (a reset) drops the figure."""
    if not end > start:
        raise ValueError(f"energy window [{start}, {end}] is empty")
    used = _around(points, start, end)
    for a, b in zip(used, used[1:], strict=False):
        if b[1] < a[1]:
            covered, inside, period, longest = _evidence(used, start, end)
            return Integral(None, covered, inside, period, longest,
                            f"the energy counter went back from {a[1]:.0f} to {b[1]:.0f} mJ at {b[0]:.3f} "
                            "(a reset): figure dropped")
    (covered, inside, period, longest), note = _check(used, start, end, period_s, gap_factor,
                                                      "energy counter readings", schedule)
    if note:
        return Integral(None, covered, inside, period, longest, note)
    lo = next(i for i in range(len(used) - 1) if used[i + 1][0] >= start)  # the pair around start
    hi = next(i for i in range(len(used) - 1) if used[i + 1][0] >= end)
    millijoules = _at(used[hi], used[hi + 1], end) - _at(used[lo], used[lo + 1], start)
    return Integral(millijoules / 1000.0, covered, inside, period, longest)


def edge_energy(opened: Edge, closed: Edge) -> tuple[dict[int, float] | None, str]:
    """Joules per device between two edge readings of the counters (end minus start); (None, why) when a device
    is missing at an edge or its counter went back (a reset, or a wrap), in one line."""
    if not opened.counters or not closed.counters:
        return None, "no energy counter read at both edges of the window"
    if set(opened.counters) != set(closed.counters):
        return None, (f"the energy counters of devices {sorted(opened.counters)} at the window's start but "
                      f"{sorted(closed.counters)} at its end: figure dropped")
    out: dict[int, float] = {}
    for gpu, a in sorted(opened.counters.items()):
        b = closed.counters[gpu]
        if b < a:
            return None, (f"the energy counter of device {gpu} went back from {a:.0f} to {b:.0f} mJ over the window "
                          "(a reset or a wrap): figure dropped")
        out[gpu] = (b - a) / 1000.0
    return out, ""


def idle_power(samples: Iterable[DeviceSample], before: float, *, count: int = IDLE_SAMPLES,
               utilization: float = IDLE_UTILIZATION) -> tuple[float | None, int]:
    """The module's idle power before ``before``: per device the median power of its latest ``count`` idle
    samples (utilisation at most ``utilization`` %, or unknown), summed over the devices; (None, 0) when a
    device has none."""
    per_gpu: dict[int, list[DeviceSample]] = {}
    for s in samples:
        if s.ts < before and s.power_w is not None and (s.utilization_pct is None or s.utilization_pct <= utilization):
            per_gpu.setdefault(s.gpu, []).append(s)
    if not per_gpu:
        return None, 0
    total, n = 0.0, 0
    for found in per_gpu.values():
        latest = sorted(found, key=lambda s: s.ts)[-count:]
        total += statistics.median(s.power_w for s in latest if s.power_w is not None)
        n += len(latest)
    return total, n


@dataclass(frozen=True)
class Energy:
    """The figures of one window (every energy figure None when dropped; ``window`` says why)."""

    window: EnergyWindow
    energy_j: float | None = None
    j_per_token: float | None = None
    tokens_per_j: float | None = None
    avg_power_w: float | None = None
    idle_power_w: float | None = None
    energy_above_idle_j: float | None = None

    def row_fields(self) -> dict[str, object]:
        """What a :class:`~contract.records.ResultRow` takes of it."""
        return {"energy_j": self.energy_j, "j_per_token": self.j_per_token, "tokens_per_j": self.tokens_per_j,
                "avg_power_w": self.avg_power_w, "idle_power_w": self.idle_power_w,
                "energy_above_idle_j": self.energy_above_idle_j, "energy": self.window}


def _round(v: float | None, digits: int = 6) -> float | None:
    return None if v is None else float(f"{v:.{digits}g}")


def _idle(idle: IdleReading | None, samples: list[DeviceSample], before: float) -> tuple[float | None, int]:
    """The idle power and its samples: the measured reading where there is one, else the samples before."""
    return (idle.power_w, idle.samples) if idle is not None else idle_power(samples, before)


def _idle_fields(idle: IdleReading | None) -> dict[str, object]:
    if idle is None:
        return {}
    return {"idle_spread_w": _round(idle.spread_w), "idle_settle_s": idle.settle_s,
            "idle_settled": idle.settled}


def window_energy(samples: Iterable[DeviceSample], start: float, end: float, *, period_s: float,
                  output_tokens: int | None, idle_before: float | None = None,
                  gap_factor: float = GAP_FACTOR, min_samples: int = MIN_SAMPLES,
                  edges: tuple[Edge, Edge] | None = None, schedule: Schedule | None = None,
                  idle: IdleReading | None = None) -> Energy:
    """Energy of the module (every device summed) over [start, end] from a run's samples, per output token.

    With ``edges`` (the counters read at the window's start and end) the energy is their difference, exact;
    else per device the sampled counter when every reading around the window has one, else the power samples
    (gaps judged against ``schedule``'s period where the window was sampled fast); one device's figure dropped
    drops the module's. ``idle``: the idle power measured before the benchmark (server up and idle, settled);
    without it, idle power comes from the samples before ``idle_before`` (default: ``start``)."""
    all_samples = list(samples)
    by_gpu: dict[int, list[DeviceSample]] = {}
    for s in all_samples:
        by_gpu.setdefault(s.gpu, []).append(s)
    window = end - start
    base = {"start": start, "end": end, "window_s": round(window, 6), "output_tokens": output_tokens}
    if edges is not None and edges[0].counters and edges[1].counters:
        per_gpu, why = edge_energy(*edges)
        idle_w, idle_n = _idle(idle, all_samples, start if idle_before is None else idle_before)
        ew = EnergyWindow(**base, source="counter", samples=2, coverage=1.0 if per_gpu is not None else 0.0,  # type: ignore[arg-type]
                          idle_samples=idle_n, note=why, **_idle_fields(idle))  # type: ignore[arg-type]
        if per_gpu is None:
            return Energy(ew, idle_power_w=_round(idle_w))
        return _figures(ew, sum(per_gpu.values()), window, output_tokens, idle_w)
    if not by_gpu:
        return Energy(EnergyWindow(**base, note="no device samples: no energy figure"))  # type: ignore[arg-type]
    total = 0.0
    sources: set[str] = set()
    worst: Integral | None = None
    note = ""
    for gpu in sorted(by_gpu):
        mine = by_gpu[gpu]
        counter = [(s.ts, s.energy_mj) for s in mine if s.energy_mj is not None]
        power = [(s.ts, s.power_w) for s in mine if s.power_w is not None]
        around = _around([(s.ts, 0.0) for s in mine], start, end)
        use_counter = bool(counter) and len(_around(counter, start, end)) == len(around)
        got = (counter_energy(counter, start, end, period_s=period_s, gap_factor=gap_factor, schedule=schedule)
               if use_counter else
               integrate_power(power, start, end, period_s=period_s, gap_factor=gap_factor, schedule=schedule))
        sources.add("counter" if use_counter else "samples")
        if worst is None or got.covered_s < worst.covered_s or (got.note and not worst.note):
            worst = got
        if got.joules is not None and got.points < min_samples:
            got = Integral(None, got.covered_s, got.points, got.period_s, got.max_gap_s,
                           f"{got.points} samples inside the {window:.3g} s window, fewer than {min_samples}: "
                           "figure dropped (sample faster, or a longer window)")
            worst = got
        if got.joules is None:
            note = got.note + (f" (device {gpu})" if len(by_gpu) > 1 else "")
            break
        total += got.joules
    assert worst is not None
    idle_w, idle_n = _idle(idle, all_samples, start if idle_before is None else idle_before)
    src = "counter" if sources == {"counter"} else "samples"
    ew = EnergyWindow(**base, source=src, samples=worst.points, period_s=_round(worst.period_s),  # type: ignore[arg-type]
                      coverage=round(min(1.0, worst.covered_s / window), 6), max_gap_s=_round(worst.max_gap_s),
                      idle_samples=idle_n, note=note, **_idle_fields(idle))  # type: ignore[arg-type]
    if note:
        return Energy(ew, idle_power_w=_round(idle_w))
    return _figures(ew, total, window, output_tokens, idle_w)


def _figures(ew: EnergyWindow, total: float, window: float, output_tokens: int | None,
             idle: float | None) -> Energy:
    """The figures of a window whose energy stands."""
    per_token = bool(output_tokens) and total > 0
    if not per_token:
        ew = ew.model_copy(update={"note": "no output tokens in the window (or no energy): no energy per token"})
    return Energy(ew, energy_j=_round(total),
                  j_per_token=_round(total / output_tokens) if per_token and output_tokens else None,
                  tokens_per_j=_round(output_tokens / total) if per_token and output_tokens else None,
                  avg_power_w=_round(total / window), idle_power_w=_round(idle),
                  energy_above_idle_j=None if idle is None else _round(total - idle * window))


def output_tokens(rows: Iterable[ResultRow]) -> int:
    """Output tokens the release's rows of one key report (what its benchmark window generated, warm-ups and
    repeated first tokens aside): per row the measured output where printed, else the output length."""
    return sum((r.measured_output if r.measured_output is not None else r.output_tokens) or 0
               for r in rows if r.source == "release")


def with_energy(rows: Sequence[ResultRow], energy: Energy) -> list[ResultRow]:
    """The rows with the window's energy figures on every release row (probe rows unchanged)."""
    fields = energy.row_fields()
    return [r.model_copy(update=fields) if r.source == "release" else r for r in rows]


def describe(energy: Energy) -> str:
    """One line for the benchmark's log."""
    w = energy.window
    if energy.energy_j is None:
        return f"energy over the benchmark window ({w.window_s:.1f} s): {w.note}"
    per = f", {energy.j_per_token:.4g} J/token" if energy.j_per_token is not None else ""
    idle = f", idle {energy.idle_power_w:.4g} W" if energy.idle_power_w is not None else ""
    if idle and w.idle_spread_w is not None:
        idle += (f" (spread {w.idle_spread_w:.3g} W over {w.idle_samples} samples, "
                 + (f"settled after {w.idle_settle_s:.3g} s)" if w.idle_settled else
                    f"not settled after {w.idle_settle_s:.3g} s)"))
    return (f"energy over the benchmark window: {energy.energy_j:.6g} J in {w.window_s:.1f} s from the {w.source} "
            f"(coverage {w.coverage:.0%}, period {w.period_s or 0:g} s){per}, average {energy.avg_power_w:.4g} W"
            f"{idle}")
