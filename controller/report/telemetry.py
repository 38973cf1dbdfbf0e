"""Device telemetry in reports (pure): the modules' summaries as a table, and why an outlier is slow.

For each module the report names as an outlier, its device figures per model key are set
next to the median of the other modules (outliers left out) for the same keys: SM clock
under load, highest allowed SM clock, peak temperature, power limit and draw, slowdown
(clock-event) reasons, memory. What is out of line is said in words ("SM clock -18 %
(1476 vs 1800 MHz), 92 °C (fleet 60 °C), clock-event reason HW slowdown in 88 % of
samples"); when nothing is, the report says so, and it says when a module sent no telemetry.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from contract.records import KeyTelemetry, TelemetrySummary
from contract.vocab import REASON_LABELS, SLOWDOWN_REASONS
from controller.report.model import FLEET, Comparison, Outlier, OutlierTelemetry, Report


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TelemetryThresholds(_Frozen):
    """What counts as unusual next to the fleet's median for the same model keys."""

    # SM clock (or its allowed maximum) this much lower
    clock_drop: float = Field(default=0.05, gt=0, lt=1)
    power_limit_drop: float = Field(default=0.05, gt=0, lt=1)
    # this many degrees above the fleet, or at least ``hot_c`` while the fleet is not
    hotter_c: float = Field(default=10.0, gt=0)
    hot_c: float = Field(default=85.0, gt=0)
    # a slowdown reason active in this share of samples more
    reason_share: float = Field(default=0.10, gt=0, le=1)
    # device memory at least this full
    memory_full: float = Field(default=0.95, gt=0, le=1)
    # in use before the servers start, beyond the fleet's
    memory_before_mib: float = Field(default=1024.0, gt=0)


def with_telemetry(report: Report, summaries: Mapping[str, TelemetrySummary],
                   th: TelemetryThresholds | None = None) -> Report:
    """The report with its outliers' device telemetry (unchanged when it names no outlier)."""
    if not report.outliers:
        return report
    return dataclasses.replace(report, outlier_telemetry=explain_outliers(report.outliers, summaries, th))


# -- per-key figures -----------------------------------------------------------------------------
def _stat(k: KeyTelemetry, field: str, stat: str) -> float | None:
    st = k.fields.get(field)
    return None if st is None else float(getattr(st, stat))


def key_figures(k: KeyTelemetry) -> dict[str, float]:
    """The figures compared between modules, from one device during one model key."""
    out: dict[str, float | None] = {
        # the clock while busy (idle moments do not count)
        "sm_clock": _stat(k, "sm_clock_mhz", "p95"),
        "max_sm_clock": _stat(k, "max_sm_clock_mhz", "min"),
        "temperature": _stat(k, "temperature_c", "max"),
        "power_limit": _stat(k, "power_limit_w", "min"),
        "power": _stat(k, "power_w", "p95"),
        "utilization": _stat(k, "utilization_pct", "mean"),
        "memory_used": _stat(k, "memory_used_mib", "max"),
        "memory_total": _stat(k, "memory_total_mib", "max"),
        "memory_before": _stat(k, "memory_used_mib", "min"),
        "ecc": _stat(k, "ecc_uncorrected", "max"),
    }
    for reason in SLOWDOWN_REASONS:
        if reason in k.reasons:
            out[f"reason:{reason}"] = k.reasons[reason]
    return {name: v for name, v in out.items() if v is not None}


def module_figures(s: TelemetrySummary) -> dict[str, dict[str, float]]:
    """model key ("" = release-wide steps) -> figures, devices of the module averaged."""
    per: dict[str, list[dict[str, float]]] = {}
    for k in s.keys:
        per.setdefault(k.model_key, []).append(key_figures(k))
    out: dict[str, dict[str, float]] = {}
    for key, devs in per.items():
        names = {n for d in devs for n in d}
        out[key] = {n: statistics.fmean(d[n] for d in devs if n in d) for n in names}
    return out


# -- explanations ------------------------------------------------------------------------------
def _median(values: Iterable[float]) -> float | None:
    vs = list(values)
    return statistics.median(vs) if vs else None


def _pct(change: float) -> str:
    return f"{change * 100:+.0f} %".replace("-", "\u2212")


def explain_outliers(outliers: Iterable[Outlier], summaries: Mapping[str, TelemetrySummary],
                     th: TelemetryThresholds | None = None) -> tuple[OutlierTelemetry, ...]:
    """For each outlier, its device figures against the other modules' median for the same keys."""
    th = th or TelemetryThresholds()
    outs = list(outliers)
    out_modules = {o.module for o in outs if o.model_key == FLEET}
    figures = {m: module_figures(s) for m, s in summaries.items()}
    result = []
    for o in outs:
        s = summaries.get(o.module)
        mine = figures.get(o.module, {})
        keys = [k for k in mine if k and (o.model_key == FLEET or k == o.model_key)]
        if s is None or not keys:
            why = "; ".join(s.notes) if s is not None and s.notes else "no summary reached the controller"
            result.append(OutlierTelemetry(module=o.module, model_key=o.model_key, status="no telemetry",
                                           note=f"no device telemetry from {o.module} ({why})"))
            continue
        peers = {m: f for m, f in figures.items() if m != o.module and m not in out_modules}
        compared = _compare(mine, keys, peers, th)
        findings = _findings(compared)
        if findings:
            result.append(OutlierTelemetry(module=o.module, model_key=o.model_key, status="explained",
                                           findings=findings, compared=compared))
        else:
            shown = ", ".join(dict.fromkeys(_LABELS[c.what.split(":")[0]] for c in compared))
            note = (f"device telemetry shows nothing unusual ({shown} in line with the fleet)" if peers else
                    "device telemetry shows nothing unusual on its own (no other module to compare with)")
            result.append(OutlierTelemetry(module=o.module, model_key=o.model_key, status="nothing unusual",
                                           compared=compared, note=note))
    return tuple(result)


def _findings(compared: tuple[Comparison, ...]) -> tuple[str, ...]:
    """What is unusual, in words; the slowdown reasons in one phrase."""
    out = [c.text for c in compared if c.unusual and not c.what.startswith("reason:")]
    reasons = [c for c in compared if c.unusual and c.what.startswith("reason:")]
    if len(reasons) == 1:
        out.append(reasons[0].text)
    elif reasons:
        fleet = max(c.fleet or 0.0 for c in reasons)
        out.append("clock-event reasons " + ", ".join(
            f"{REASON_LABELS[c.what.split(':', 1)[1]]} {c.value * 100:.0f} %" for c in reasons)
            + f" of samples (fleet at most {fleet * 100:.0f} %)")
    return tuple(out)


_LABELS = {"sm_clock": "SM clock", "max_sm_clock": "highest SM clock", "temperature": "temperature",
           "power_limit": "power limit", "power": "power", "utilization": "utilisation", "memory_used": "memory",
           "memory_before": "memory before the servers", "reason": "clock-event reasons", "ecc": "ECC errors"}
_UNITS = {"sm_clock": "MHz", "max_sm_clock": "MHz", "temperature": "°C", "power_limit": "W", "power": "W",
          "utilization": "%", "memory_used": "MiB", "memory_before": "MiB", "reason": "share", "ecc": "errors"}
_ORDER = ("sm_clock", "max_sm_clock", "temperature", "reason", "power_limit", "power", "memory_used",
          "memory_before", "utilization", "ecc")


def _compare(mine: dict[str, dict[str, float]], keys: list[str], peers: dict[str, dict[str, dict[str, float]]],
             th: TelemetryThresholds) -> tuple[Comparison, ...]:
    names = sorted({n for k in keys for n in mine[k] if n != "memory_total"},
                   key=lambda n: (_ORDER.index(n.split(":")[0]), n))
    out: list[Comparison] = []
    for name in names:
        if name == "memory_before":
            vals = [mine[""][name]] if name in mine.get("", {}) else []
            fleet_vals = [f[""][name] for f in peers.values() if name in f.get("", {})]
            n_keys = 1 if vals else 0
        else:
            vals = [mine[k][name] for k in keys if name in mine[k]]
            # the fleet's median per key, then the median over keys: each key weighs the same
            per_key = [_median(f[k][name] for f in peers.values() if name in f.get(k, {})) for k in keys]
            fleet_vals = [v for v in per_key if v is not None]
            n_keys = len(vals)
        value, fleet = _median(vals), _median(fleet_vals)
        if value is None:
            continue
        total = _median(mine[k]["memory_total"] for k in keys if "memory_total" in mine[k])
        out.append(_judge(name, value, fleet, n_keys, total, th))
    return tuple(sorted(out, key=lambda c: not c.unusual))


def _judge(name: str, value: float, fleet: float | None, n: int, total: float | None,
           th: TelemetryThresholds) -> Comparison:
    kind = name.split(":")[0]
    unit = _UNITS[kind]
    unusual = False
    if kind == "reason":
        reason = name.split(":", 1)[1]
        base = fleet or 0.0
        unusual = value >= th.reason_share and value - base >= th.reason_share
        text = (f"clock-event reason {REASON_LABELS[reason]} in {value * 100:.0f} % of samples"
                + (f" (fleet {base * 100:.0f} %)" if fleet is not None else ""))
        return Comparison(what=name, value=value, fleet=fleet, unit=unit, keys=n, unusual=unusual, text=text)
    label = _LABELS[kind]
    if kind == "temperature":
        hot = value >= th.hot_c and (fleet is None or fleet < th.hot_c)
        unusual = hot or (fleet is not None and value - fleet >= th.hotter_c)
        text = f"{value:.0f} °C" + (f" (fleet {fleet:.0f} °C)" if fleet is not None else "")
    elif kind == "memory_used":
        full = total is not None and total > 0 and value / total >= th.memory_full
        unusual = full
        text = (f"memory {value / total:.0%} full ({value:.0f} of {total:.0f} MiB)" if full and total else
                f"memory {value:.0f} MiB" + (f" (fleet {fleet:.0f} MiB)" if fleet is not None else ""))
    elif kind == "memory_before":
        unusual = fleet is not None and value - fleet >= th.memory_before_mib
        text = (f"{value:.0f} MiB of device memory in use before the servers started (fleet {fleet:.0f} MiB): "
                "another process on the device?" if unusual else
                f"memory before the servers {value:.0f} MiB" + (f" (fleet {fleet:.0f} MiB)" if fleet is not None
                                                                 else ""))
    elif kind == "ecc":
        unusual = value > (fleet or 0.0)
        text = f"{value:.0f} uncorrected ECC errors" + (f" (fleet {fleet:.0f})" if fleet is not None else "")
    else:
        change = value / fleet - 1 if fleet else None
        drop = {"sm_clock": th.clock_drop, "max_sm_clock": th.clock_drop, "power_limit": th.power_limit_drop}
        unusual = kind in drop and change is not None and change <= -drop[kind]
        text = (f"{label} {_pct(change)} ({value:.0f} vs {fleet:.0f} {unit})" if change is not None else
                f"{label} {value:.0f} {unit}")
    return Comparison(what=name, value=value, fleet=fleet, unit=unit, keys=n, unusual=unusual, text=text)


# -- the summaries as a table (fleetctl results --telemetry) -----------------------------------------
def telemetry_rows(summaries: Mapping[str, TelemetrySummary]) -> list[dict[str, Any]]:
    """One flat record per module, model key and device: the figures people read first."""
    rows: list[dict[str, Any]] = []
    for module, s in sorted(summaries.items()):
        if not s.keys:
            rows.append({"module": module, "model_key": "", "gpu": None, "samples": 0, "tool": s.tool,
                         "notes": "; ".join(s.notes)})
        for k in s.keys:
            f = key_figures(k)
            slow = ", ".join(f"{REASON_LABELS[r]} {share * 100:.0f} %" for r, share in sorted(k.reasons.items())
                             if r in SLOWDOWN_REASONS and share > 0)
            rows.append({
                "module": module, "model_key": k.model_key, "gpu": k.gpu, "samples": k.samples, "tool": s.tool,
                "sm_clock_p95_mhz": f.get("sm_clock"), "sm_clock_max_mhz": f.get("max_sm_clock"),
                "temperature_max_c": f.get("temperature"), "power_p95_w": f.get("power"),
                "power_limit_w": f.get("power_limit"), "utilization_mean_pct": f.get("utilization"),
                "memory_used_max_mib": f.get("memory_used"), "memory_total_mib": f.get("memory_total"),
                "slowdown": slow, "notes": "; ".join(s.notes)})
    return rows
