"""The SLO sweep (pure): which load to try next, what of a level's requests counts, and when to stop.

``fleet-agent probe URL --sweep --slo ttft_p90_ms=4000,tpot_p90_ms=60`` raises the concurrency (closed loop:
C requests in flight) until the SLO breaks or the server saturates, and names the highest load that met the
SLO (the **capacity**) with its figures. The runner (:mod:`agent.probe.runner`) sends the requests; this
module decides (docs/adr/0015-measurement-choices.md says why each rule is what it is):

- **levels**: 1, 2, 4, 8, ... (doubling) up to ``max_concurrency``; once a level breaks the SLO, the
  concurrencies between it and the last level that met it are bisected (while they differ by more than
  ``resolution`` of the lower one and the budget lasts);
- **a level's requests**: ``ramp`` (= C) first, then at least ``window`` measured, then C more; the
  **steady-state window** is the requests sent after the first C (they start together and queue their
  prefills at once: the ramp-up) and before the last C (sent while the in-flight count falls: the drain).
  Figures are of the window's requests only; throughput is C / their mean E2E (Little's law: C requests are
  always in the system), times their mean output tokens. (Their tokens over their span would leave out what
  the ramp-up and drain requests produced in that span: half the throughput when the window has C requests);
- **stop**: the SLO broke (and the bisection is done), throughput stopped rising (the window's output tok/s
  less than ``1 + min_gain`` times the best so far: saturated), the next level would not fit in the time
  budget (its expected wall time from the last level's, scaled by its requests), or the largest level was
  reached.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from agent.probe.measure import percentile
from agent.probe.records import RequestResult
from contract.records import Frozen

FIGURES = ("ttft", "tpot", "e2e", "itl")
QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
StopReason = Literal["slo", "saturated", "budget", "max_load", "stopped"]


class SweepSLO(Frozen):
    """Percentile objectives: ``ttft_p90_ms=4000,tpot_p90_ms=60`` (figure ttft/tpot/e2e/itl, p50/p90/p99)."""

    limits: tuple[tuple[str, float], ...]

    @classmethod
    def parse(cls, text: str) -> SweepSLO:
        out: list[tuple[str, float]] = []
        for item in text.split(","):
            item = item.strip()
            if not item:
                continue
            name, eq, raw = (x.strip() for x in item.partition("="))
            parts = name.split("_")
            if not eq or len(parts) != 3 or parts[0] not in FIGURES or parts[1] not in QUANTILES or parts[2] != "ms":
                raise ValueError(f"SLO {item!r}: expected FIGURE_pQ_ms=LIMIT, FIGURE one of {', '.join(FIGURES)}, "
                                 f"pQ one of {', '.join(QUANTILES)} (e.g. ttft_p90_ms=4000)")
            try:
                limit = float(raw)
            except ValueError:
                raise ValueError(f"SLO {item!r}: {raw!r} is not a number") from None
            if not limit > 0:
                raise ValueError(f"SLO {item!r}: the limit must be positive")
            out.append((name, limit))
        if not out:
            raise ValueError("SLO: give at least one objective, e.g. ttft_p90_ms=4000,tpot_p90_ms=60")
        return cls(limits=tuple(out))

    def __str__(self) -> str:
        return ",".join(f"{k}={v:g}" for k, v in self.limits)


class SweepConfig(Frozen):
    slo: SweepSLO
    budget_s: float = Field(default=300.0, gt=0, description="wall seconds for the whole sweep")
    max_concurrency: int = Field(default=256, ge=1)
    window: int = Field(default=8, ge=2, description="measured requests of a level, at least")
    min_gain: float = Field(default=0.05, ge=0, description="less throughput gain than this: saturated")
    resolution: float = Field(default=0.25, gt=0, description="bisect until levels differ by at most this")


class Level(Frozen):
    """One load of the sweep, from its steady-state window."""

    concurrency: int
    # requests sent at this level (ramp-up and drain included), those in the steady-state window, the successful ones
    # of them; figures, e.g. ttft_p90_ms -> value (the server's ms)
    sent: int
    window: int
    ok: int
    figures: dict[str, float] = Field(default_factory=dict)
    # C / the window's mean E2E x its mean output tokens (Little's law)
    output_tps: float | None = None
    request_rps: float | None = None
    wall_s: float = 0.0
    met: bool = False  # every objective met and every window request succeeded


class SweepResult(Frozen):
    profile: str
    slo: SweepSLO
    levels: tuple[Level, ...] = ()
    capacity: Level | None = None
    stop: StopReason = "max_load"
    wall_s: float = 0.0


def requests_for(concurrency: int, window: int) -> int:
    """A level's requests: ramp-up C, at least ``window`` (and C) measured, drain C."""
    return 2 * concurrency + max(window, concurrency)


def steady_window(results: Sequence[RequestResult], concurrency: int) -> list[RequestResult]:
    """The requests sent after the first C and before the last C (``index`` is the send order)."""
    ordered = sorted(results, key=lambda r: r.index)
    return ordered[concurrency:len(ordered) - concurrency]


def level(results: Sequence[RequestResult], concurrency: int, slo: SweepSLO, wall_s: float) -> Level:
    """A level's figures from its steady-state window, and whether it met the SLO."""
    win = steady_window(results, concurrency)
    good = [r for r in win if r.ok]
    values: dict[str, list[float]] = {
        "ttft": sorted(r.ttft_ms for r in good if r.ttft_ms is not None),
        "tpot": sorted(r.tpot_ms for r in good if r.tpot_ms is not None),
        "e2e": sorted(r.e2e_ms for r in good if r.e2e_ms is not None),
        "itl": sorted(g for r in good for g in r.itl_ms),
    }
    figures: dict[str, float] = {}
    for fig, vals in values.items():
        if vals:
            for q, at in QUANTILES.items():
                figures[f"{fig}_{q}_ms"] = percentile(vals, at)
    out_tps = rps = None
    e2e_s = sum((r.e2e_ms or 0.0) for r in good) / 1000 / len(good) if good else 0.0
    # closed loop: C requests always in the system, so (Little's law) C / mean E2E of them per s
    if e2e_s > 0:
        rps = concurrency / e2e_s
        out_tps = rps * sum(r.output_tokens or 0 for r in good) / len(good)
    met = bool(win) and len(good) == len(win) and all(
        name in figures and figures[name] <= limit for name, limit in slo.limits)
    return Level(concurrency=concurrency, sent=len(results), window=len(win), ok=len(good), figures=figures,
                 output_tps=out_tps, request_rps=rps, wall_s=wall_s, met=met)


def next_level(levels: Sequence[Level], cfg: SweepConfig, spent_s: float) -> int | StopReason:
    """The next concurrency to try, or why the sweep stops."""
    if not levels:
        return 1
    tried = {lv.concurrency for lv in levels}
    met = [lv for lv in levels if lv.met]
    broke = [lv for lv in levels if not lv.met]
    best_met = max((lv.concurrency for lv in met), default=0)
    low_broke = min((lv.concurrency for lv in broke if lv.concurrency > best_met), default=None)
    last = levels[-1]
    if low_broke is not None:
        if best_met == 0 or low_broke - best_met <= max(1, int(cfg.resolution * best_met)):
            return "slo"
        nxt = (best_met + low_broke) // 2
        if nxt in tried:
            return "slo"
    else:
        earlier = [lv.output_tps for lv in levels[:-1] if lv.output_tps]
        if earlier and last.output_tps is not None and last.output_tps < (1 + cfg.min_gain) * max(earlier):
            return "saturated"
        if last.concurrency >= cfg.max_concurrency:
            return "max_load"
        nxt = min(last.concurrency * 2, cfg.max_concurrency)
    expected = last.wall_s * requests_for(nxt, cfg.window) / max(last.sent, 1)
    if spent_s + expected > cfg.budget_s:
        return "budget"
    return nxt


def capacity(levels: Sequence[Level]) -> Level | None:
    """The highest concurrency that met the SLO."""
    met = [lv for lv in levels if lv.met]
    return max(met, key=lambda lv: lv.concurrency) if met else None
