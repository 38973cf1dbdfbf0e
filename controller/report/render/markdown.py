"""The whole report as one Markdown document (``fleetctl report -o md``, the API's ``text/markdown``): the report's
one-line forms (:mod:`controller.report.render.text`) and its first-screen summary
(:mod:`controller.report.render.glance`) put together."""

from __future__ import annotations

import math
from collections.abc import Callable

from controller.report.analysis.stats import MIN_WINDOWS_FOR_INTERVAL
from controller.report.model import PRIMARY_METRICS, Report, profile_key
from controller.report.render.glance import glance_markdown
from controller.report.render.numbers import in_profile_order, num, pct
from controller.report.render.text import (
    energy_text,
    factor_ci,
    md_table,
    md_telemetry,
    no_interval,
    probe_text,
    startup_lines,
    telemetry_cell,
    verdict_line,
)


def to_markdown(r: Report) -> str:
    """The whole report as one Markdown document: its sections (:data:`SECTIONS`) in order."""
    return "\n".join(line for section in SECTIONS for line in section(r)) + "\n"


def header_section(r: Report) -> list[str]:
    """The title, the verdict line, what was compared, and the first-screen summary."""
    return [f"# Fleet report {r.run_id}", "", f"**{verdict_line(r)}**", "",
            f"Release {r.release or '?'}; baseline {r.baseline_id or 'none'}; previous run(s) "
            f"{', '.join(r.previous_ids) or 'none'}; {len(r.modules)} module(s); tolerance "
            f"{r.thresholds.tolerance:.0%}.", "", *glance_markdown(r, startup_lines(r))]


def regressions_section(r: Report) -> list[str]:
    if not r.regressions:
        return ["", "## Regressions", "", "None."]
    return ["", "## Regressions", "", md_table(
        ["module", "model key", "profile", "metric", "baseline", "value", "change", "95% interval", "against", "p",
         "detail"],
        [[x.module, x.model_key, x.profile, x.metric, num(x.baseline), num(x.value), pct(x.change),
          "" if x.change is None else no_interval(x) if x.ci_low is None or x.ci_high is None else
          f"{pct(x.ci_low)} to {pct(x.ci_high)}",
          x.against,
          "" if x.p_value is None else f"{x.p_value:.2g}",
          x.detail + (f"; with {', '.join(x.related)}" if x.related else "")]
         for x in in_profile_order(r.regressions)])]


def outliers_section(r: Report) -> list[str]:
    if not r.outliers:
        return ["", "## Outlier modules", "", "None."]
    return ["", "## Outlier modules", "", md_table(
        ["module", "model key", "factor", "95% interval", "figures", "beyond 3 MAD", "worst cases",
         "device telemetry"],
        [[o.module, o.model_key, f"{o.factor:.2f}x", factor_ci(o), str(o.cells), f"{o.share_out:.0%}",
          "; ".join(f"{w.model_key} {w.profile} {w.metric} {num(w.value)} vs {num(w.fleet_median)}"
                    for w in o.worst), telemetry_cell(r, o)] for o in r.outliers]), *md_telemetry(r)]


def energy_section(r: Report) -> list[str]:
    out = ["", "## Energy", "", energy_text(r)]
    if r.energy_outliers:
        out += ["", md_table(
            ["module", "model key", "J/token vs fleet", "95% interval", "figures", "worst cases"],
            [[o.module, o.model_key, f"{1 / o.factor:.2f}x", factor_ci(o), str(o.cells),
              "; ".join(f"{w.model_key} {w.profile} {num(w.value)} vs {num(w.fleet_median)} J/token"
                        for w in o.worst)] for o in r.energy_outliers])]
    return out


def startup_section(r: Report) -> list[str]:
    start = [f"- {x}" for x in startup_lines(r)] or ["No start-up figures in this run."]
    return ["", "## Start-up costs", "", *start,
            "", f"Start-up tolerance {r.thresholds.startup_tolerance:.0%}; a change under "
                f"{r.thresholds.startup_floor_s:g} s never counts; tested over the modules' starts (an interval from "
                f"{MIN_WINDOWS_FOR_INTERVAL} starts)."]


def probe_section(r: Report) -> list[str]:
    """The release's figures against the agent's probe, and the probe's repeated rounds."""
    out = ["", "## Release benchmark vs probe", "", probe_text(r)]
    if r.disagreements:
        out += ["", md_table(["module", "model key", "profile", "metric", "release", "probe", "change"],
                              [[d.module, d.model_key, d.profile, d.metric, num(d.release), num(d.probe),
                                pct(d.change)] for d in r.disagreements])]
    if r.probe_intervals:
        out += ["", "## Probe intervals", "", "The per-key probe repeated over rounds (probe_repeat): each figure's "
                "mean over the rounds and its 95 % t interval.", "",
                md_table(["module", "model key", "profile", "figure", "mean", "95% interval", "rounds"],
                          [[x.module, x.model_key, x.profile, x.figure, num((x.low + x.high) / 2),
                            f"{num(x.low)} to {num(x.high)}", str(x.repeats)] for x in r.probe_intervals])]
    return out


def capacity_section(r: Report) -> list[str]:
    if not r.capacities:
        return []
    return ["", "## Capacity at SLO", "", "The highest concurrency at which each module's probe met the SLO "
            "(figures of that level's steady-state window; levels tried: met or broken).", "",
            md_table(["module", "model key", "profile", "SLO", "concurrency", "output tok/s", "req/s",
                      "TTFT p90", "TPOT p90", "stopped", "levels"],
                     [[c.module, c.model_key, c.profile, c.slo, "none" if c.concurrency is None else
                       str(c.concurrency), num(c.output_tps), num(c.request_rps), num(c.ttft_p90_ms),
                       num(c.tpot_p90_ms), c.stop, c.levels] for c in r.capacities])]


def changes_section(r: Report) -> list[str]:
    if not r.changes:
        return []
    rows = [[c.model_key, c.metric, c.against, num(c.baseline), num(c.value), pct(c.change),
             "" if c.p_value is None else f"{c.p_value:.2g}", c.status]
            for c in r.changes if c.metric in PRIMARY_METRICS or c.status != "within tolerance"]
    return ["", "## Every change per model key (centre over profiles of the fleet trimmed mean)", "",
            md_table(["model key", "metric", "against", "reference", "value", "change", "p", "status"], rows)]


def summary_section(r: Report) -> list[str]:
    if not len(r.summary):
        return []
    s = r.summary[r.summary["metric"].isin(["decode_tps", "ttft_ms", "accept_rate", "vision_fps"])]
    metrics = {m: i for i, m in enumerate(dict.fromkeys(s["metric"]))}  # in the summary's order
    rows = [[str(x.model_key), str(x.profile), str(x.metric), num(x.fleet), f"{x.spread:.1%}"
             if isinstance(x.spread, float) and not math.isnan(x.spread) else "", str(int(x.count)),
             num(getattr(x, "baseline", None)), pct(getattr(x, "change", None))]
            for x in sorted(s.itertuples(), key=lambda x: (metrics[x.metric], str(x.model_key),
                                                            profile_key(str(x.profile))))]
    return ["", "## Fleet summary (decode tok/s and TTFT ms per profile)", "",
            md_table(["model key", "profile", "metric", "fleet median", "spread", "modules", "baseline", "change"],
                     rows)]


def notes_section(r: Report) -> list[str]:
    return ["", "## Notes", "", *(f"- {n}" for n in r.notes)] if r.notes else []


# the document's sections, in order: each a function of the report to its lines (none: no lines)
SECTIONS: tuple[Callable[[Report], list[str]], ...] = (
    header_section, regressions_section, outliers_section, energy_section, startup_section, probe_section,
    capacity_section, changes_section, summary_section, notes_section)
