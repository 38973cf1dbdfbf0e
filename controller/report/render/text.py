"""Reports as text for people: one verdict line, the one-line forms of findings, Markdown."""

from __future__ import annotations

from collections.abc import Callable

from contract.records import STARTUP_METRICS, WINDOW_METRICS
from controller.fleet.runs import REFUSED_NOTE
from controller.report.analysis.stats import MIN_WINDOWS_FOR_INTERVAL
from controller.report.analysis.verdict import is_missing
from controller.report.environment import environment_text
from controller.report.model import (
    FLEET,
    Change,
    Outlier,
    OutlierTelemetry,
    Regression,
    Report,
)
from controller.report.render.numbers import num

# fewer than 6 modules, profiles or figures: no 95 % interval of a median
NO_INTERVAL = "no interval (n < 6)"


def no_interval(x: Regression | Change) -> str:
    """Why a change has no interval: :data:`NO_INTERVAL`, or of a start-up or energy figure (one per module's start
    or window) how many there were (``2 starts, too few for an interval``)."""
    if x.metric not in WINDOW_METRICS:
        return NO_INTERVAL
    what = "starts" if x.metric in STARTUP_METRICS else "windows"
    n = x.n or 0
    if n < MIN_WINDOWS_FOR_INTERVAL:
        return f"{n} {what}, too few for an interval"
    return f"{n} {what}, none apart: no interval"


def change_interval(x: Regression) -> str:
    """A regression's 95 % interval, e.g. ``[-8.7%, -7.8%]`` (:func:`no_interval` where there is none)."""
    if x.ci_low is None or x.ci_high is None:
        return f"[{no_interval(x)}]"
    return f"[{x.ci_low:+.1%}, {x.ci_high:+.1%}]"


def factor_interval(o: Outlier) -> str:
    """An outlier's factor with its 95 % interval, e.g. ``0.87x [0.86, 0.88]``."""
    ci = f"[{NO_INTERVAL}]" if o.ci_low is None or o.ci_high is None else f"[{o.ci_low:.2f}, {o.ci_high:.2f}]"
    return f"{o.factor:.2f}x {ci}"


def regression_line(x: Regression) -> str:
    """One regression in one line, with the change's 95 % interval, e.g. ``fleet: qwen3 decode_tps -8.0%
    [-8.7%, -7.8%] vs baseline (tpot_ms +8.7%)``."""
    where = x.model_key if x.profile == FLEET else f"{x.model_key} {x.profile}"
    who = "fleet" if x.module == FLEET else x.module
    if x.metric == "correct":
        return f"{who}: {where}: answer now wrong (was right in {x.against})"
    if is_missing(x):
        return f"{who}: {where} {x.metric} missing (the {x.against} has it)"
    ch = f"{x.change:+.1%} {change_interval(x)}" if x.change is not None else "?"
    rel = f" ({', '.join(x.related)})" if x.related else ""
    return f"{who}: {where} {x.metric} {ch} vs {x.against}{rel}"


def outlier_line(o: Outlier) -> str:
    """One outlier in one line, e.g. ``m03: typically 0.88x [0.87, 0.89] the fleet median (96 figures)``."""
    what = o.module if o.model_key == FLEET else f"{o.module} [{o.model_key}]"
    return f"{what}: typically {factor_interval(o)} the fleet median ({o.cells} figures)"


def telemetry_line(t: OutlierTelemetry) -> str:
    """An outlier's device telemetry in one line: its findings, or why there are none."""
    if t.status == "explained":
        return "; ".join(t.findings)
    return t.note


def verdict_line(r: Report) -> str:
    """One line, each named finding with its 95 % interval, e.g. ``REGRESSED run-7 (1.4.2 vs baseline:1.4.1:v1):
    1 regression(s): fleet: qwen3 decode_tps -8.0% [-8.7%, -7.8%] vs baseline (tpot_ms +8.7%); 1 outlier(s):
    m03 0.88x [0.87, 0.89]``."""
    against = r.baseline_id or ("baseline" if r.reference is not None else "no baseline")
    head = f"{r.verdict.upper()} {r.run_id} ({r.release or '?'} vs {against})"
    parts = []
    if r.regressions:
        first = regression_line(r.regressions[0])
        more = f" and {len(r.regressions) - 1} more" if len(r.regressions) > 1 else ""
        parts.append(f"{len(r.regressions)} regression(s): {first}{more}")
    else:
        parts.append("no regression")
    named = r.regressions[0] if r.regressions and is_missing(r.regressions[0]) else None
    gone = sorted({f"{x.model_key} {x.metric}" for x in r.regressions if is_missing(x) and x is not named})
    # named whichever finding comes first: a key without a figure it had never goes unnoticed
    if gone:
        parts.append(f"{'also ' if named else ''}missing metric(s): {', '.join(gone)}")
    if r.outliers:
        parts.append(f"{len(r.outliers)} outlier(s): " + ", ".join(
            f"{o.module}{'' if o.model_key == FLEET else '[' + o.model_key + ']'} {factor_interval(o)}"
            for o in r.outliers))
    if r.energy_outliers:
        parts.append(f"{len(r.energy_outliers)} energy outlier(s): " + ", ".join(energy_outlier_text(o)
                                                                              for o in r.energy_outliers))
    if r.disagreements:
        where = sorted({f"{d.module}[{d.model_key}]" for d in r.disagreements})
        parts.append(f"release benchmark disagrees with the probe on {len(r.disagreements)} figure(s): "
                     + ", ".join(where))
    refused = next((n for n in r.notes if n.startswith(REFUSED_NOTE)), None)
    # the modules the run was not judged on, each with why, whatever the verdict
    if refused:
        parts.append(refused)
    if r.verdict in ("incomplete", "failed") and r.notes and r.notes[-1] != refused:
        parts.append(r.notes[-1])
    return f"{head}: " + "; ".join(parts)


def energy_outlier_text(o: Outlier) -> str:
    """``m02 J/token 1.13x the fleet's`` (an energy outlier's factor is the fleet's J/token over its own)."""
    where = "" if o.model_key == FLEET else f"[{o.model_key}]"
    return f"{o.module}{where} J/token {1 / o.factor:.2f}x the fleet's"


def energy_text(r: Report) -> str:
    """One sentence about the run's energy figures: how many rows carry them, the energy outliers."""
    rows = r.rows
    n = int(rows["j_per_token"].notna().sum()) if "j_per_token" in rows.columns else 0
    if not n:
        return "No energy figures in this run (no device telemetry, or every window dropped)."
    said = (f"{n} row(s) carry energy per token (over each key's benchmark window); energy tolerance "
            f"{r.thresholds.energy_tolerance:.0%}.")
    if r.energy_outliers:
        return said + " Energy outliers (more joules per output token than the fleet): " + ", ".join(
            energy_outlier_text(o) for o in r.energy_outliers) + "."
    return said + " No module is out of line."


# the start-up costs as the report names them; the precompile's are the module's, the same on every key's rows
STARTUP_NAMES: dict[str, str] = {"server_ready_s": "server ready", "warmup_s": "first request",
                                 "precompile_s": "precompile (compiled)", "precompile_fetch_s": "precompile (fetched)"}
_PRECOMPILE = ("precompile_s", "precompile_fetch_s")


def startup_line(c: Change) -> str:
    """One start-up cost against a reference, e.g. ``qwen35 server ready 212 s, +38 % vs baseline: regressed``
    (a precompile's without its key: it is the module's, once a run)."""
    who = "" if c.metric in _PRECOMPILE else f"{c.model_key} "
    value = "?" if c.value is None else f"{c.value:.3g} s"
    change = "" if c.change is None else f", {c.change * 100:+.0f} %"
    ci = ("" if c.change is None else f" [{no_interval(c)}]" if c.ci_low is None or c.ci_high is None else
          f" [{c.ci_low * 100:+.0f} %, {c.ci_high * 100:+.0f} %]")
    return f"{who}{STARTUP_NAMES[c.metric]} {value}{change}{ci} vs {c.against}: {c.status}"


def startup_lines(r: Report) -> list[str]:
    """The run's start-up costs: each against its references (:func:`startup_line`), else the fleet's median with
    no reference; a precompile's once (its figure is on every key's rows)."""
    lines: list[str] = []
    judged: set[tuple[str, str]] = set()
    said: set[tuple[str, str]] = set()
    for c in r.changes:
        if c.metric not in STARTUP_METRICS or (c.metric in _PRECOMPILE and (c.metric, c.against) in said):
            continue
        said.add((c.metric, c.against))
        judged.add((c.model_key, c.metric))
        lines.append(startup_line(c))
    rows = r.rows
    for m in STARTUP_METRICS:
        if m not in rows.columns:
            continue
        has = rows[rows[m].notna()]
        for key, v in has.groupby("model_key", observed=True)[m].median().items():
            if (str(key), m) in judged or (m in _PRECOMPILE and any(j[1] == m for j in judged)):
                continue
            judged.add((str(key), m))
            who = "" if m in _PRECOMPILE else f"{key} "
            lines.append(f"{who}{STARTUP_NAMES[m]} {float(v):.3g} s (fleet median): no reference")
    return lines


def probe_text(r: Report) -> str:
    """One sentence about the cross-check with the agent's probe (when nothing disagrees)."""
    within = (f"the noise band the agent measured beside each (rows without one: {r.thresholds.probe_tolerance:.0%})"
              if r.probe_checked else "")
    if r.disagreements:
        return (f"{len(r.disagreements)} figure(s) where the release's benchmark and the agent's probe differ beyond "
                f"{within} (change: release / probe - 1).")
    if r.probe_checked:
        return (f"They agree: {r.probe_checked} release row(s) have a probe row beside them, and every figure agrees "
                f"within {within}.")
    return "No probe rows in this run."


def md_table(header: list[str], rows: list[list[str]]) -> str:
    esc: Callable[[str], str] = lambda c: str(c).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def factor_ci(o: Outlier) -> str:
    return NO_INTERVAL if o.ci_low is None or o.ci_high is None else f"{o.ci_low:.2f}x to {o.ci_high:.2f}x"


def telemetry_cell(r: Report, o: Outlier) -> str:
    """The outlier's device telemetry in one line (blank: none attached), and its environment where it is not the
    fleet's."""
    t = r.telemetry_of(o)
    return "; ".join(x for x in ("" if t is None else telemetry_line(t), environment_text(r, o.module)) if x)


def md_telemetry(r: Report) -> list[str]:
    """Per outlier with telemetry: every figure compared, next to the fleet's median for the same keys."""
    out: list[str] = []
    for t in r.outlier_telemetry:
        if not t.compared:
            continue
        what = t.module if t.model_key == FLEET else f"{t.module} [{t.model_key}]"
        out += ["", f"### Device telemetry of {what} ({t.status})", ""]
        out.append(md_table(["figure", "module", "fleet median", "unit", "keys", "unusual"],
                             [[c.what, num(c.value), num(c.fleet), c.unit, str(c.keys), "yes" if c.unusual else ""]
                              for c in t.compared]))
    return out


