"""A report's first screen: under the verdict, three lines a release engineer reads at a glance (pure).

- what regressed (each finding in one line, the first few; else how many comparisons stayed within tolerance);
- which modules are out of line (the outliers, in speed and in energy; else that none is);
- what was not measured and why (modules refused at dispatch, module/key pairs without results and, beside them,
  the logs kept of each failed part (kernel log, agent journal, serial console: the command showing them), metrics
  the reference has and the run lacks, keys the curves leave out, no device telemetry, no probe rows, start-up costs
  without a reference).

The sections below the summary give the detail; the start-up costs without a reference are folded there (HTML).
Also here, with no matplotlib: which keys the sweep plots leave out (:func:`not_plotted`), named under them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pandas as pd

from contract.records import STARTUP_METRICS
from controller.report.analysis.verdict import is_missing
from controller.report.model import FLEET, Report
from controller.report.render.text import energy_outlier_text, outlier_line, regression_line

SHOWN = 5  # findings named a line; the rest counted
# what a key's tables are, for the line that names the keys a sweep plot leaves out
TABLE_KINDS = {"mtp": "MTP: measured on GSM8K prompts", "vision": "vision table only"}
# how a start-up line without a reference ends (text.startup_lines)
NO_REFERENCE = ": no reference"
# the verdict's notes that say what was not measured (controller/report/analysis/summary.py, build.py)
_UNMEASURED_NOTE = re.compile(r"^(no results for |no baseline|\S+/\S+: \d+ of \d+ profiles$"
                              r"|\.\.\. \d+ more module/key)")


def not_plotted(summary: pd.DataFrame, metric: str) -> dict[str, tuple[str, ...]]:
    """The model keys with figures of ``metric`` but no context sweep, each with its tables (a sweep plot
    has no place for them)."""
    if not len(summary):
        return {}
    s = summary[summary["metric"] == metric]
    swept = set(s.loc[s["table"] == "sweep", "model_key"].astype(str))
    out: dict[str, tuple[str, ...]] = {}
    for key, tables in s.groupby(s["model_key"].astype(str), sort=True)["table"]:
        if key not in swept:
            out[str(key)] = tuple(sorted(set(map(str, tables))))
    return out


def not_plotted_line(summary: pd.DataFrame, metric: str, changes_below: bool = False) -> str:
    """A line naming the keys a sweep plot leaves out and why ("" when it leaves out none)."""
    missing = not_plotted(summary, metric)
    if not missing:
        return ""
    by_kind: dict[str, list[str]] = {}
    for key, tables in missing.items():
        kind = "; ".join(TABLE_KINDS.get(t, f"table {t}") for t in tables)
        by_kind.setdefault(kind, []).append(key)
    parts = [f"{', '.join(keys)} ({kind})" for kind, keys in by_kind.items()]
    return ("Not plotted, no context sweep: " + "; ".join(parts) + ". Their figures are in the Markdown and JSON "
            "reports" + (", their changes in the table below." if changes_below else "."))


@dataclass(frozen=True)
class Glance:
    # one line each; empty: nothing regressed (``calm`` says what was compared)
    regressed: tuple[str, ...]
    calm: str
    out_of_line: tuple[str, ...]
    not_measured: tuple[str, ...]


def _more(items: list[str], what: str) -> tuple[str, ...]:
    if len(items) <= SHOWN:
        return tuple(items)
    return (*items[:SHOWN], f"and {len(items) - SHOWN} more {what} (below)")


def not_measured(r: Report, startup: list[str]) -> tuple[str, ...]:
    """What the run did not measure, or measured with nothing to compare it with, each with why."""
    out = [f"{m}: refused at dispatch ({why})" for m, why in r.refused]
    # keys, profiles a module did not deliver
    out += [n for n in r.notes if _UNMEASURED_NOTE.match(n)]
    # beside them: each failed part's logs, and the command showing them
    out += [p.line() for p in r.failed_parts]
    for x in r.regressions:
        if is_missing(x):
            where = "" if x.module == FLEET else f" on {x.module}"
            out.append(f"{x.model_key} {x.metric}{where}: missing (the {x.against} has it)")
    left_out = not_plotted(r.summary, "decode_tps") if len(r.summary) else {}
    for key, tables in left_out.items():
        kinds = "; ".join(TABLE_KINDS.get(t, f"table {t}") for t in tables)
        out.append(f"{key}: no context sweep ({kinds}), so no curve; its changes are under 'Every change per "
                   "model key'")
    rows = r.rows
    if "j_per_token" not in rows.columns or not rows["j_per_token"].notna().any():
        out.append("energy per token: no device telemetry in this run")
    if not r.probe_checked and not r.disagreements:
        out.append("release benchmark vs probe: no probe rows in this run")
    bare = [s for s in startup if s.endswith(NO_REFERENCE)]
    if bare:
        have = any(c.metric in STARTUP_METRICS for c in r.changes)
        out.append(f"start-up costs: {len(bare)} figure(s) without a reference "
                   f"({'the reference lacks them' if have else 'the reference has no start-up costs'}; listed below)")
    return tuple(out)


def glance(r: Report, startup: list[str]) -> Glance:
    """The first screen's summary of ``r`` (``startup``: its start-up lines, :func:`text.startup_lines`)."""
    regressed = [regression_line(x) for x in r.regressions if not is_missing(x)]
    n = len(r.changes)
    moved = sum(1 for c in r.changes if c.status != "within tolerance")
    tol = f"{r.thresholds.tolerance * 100:.3g} %"
    if n:
        calm = f"nothing: {n - moved} of {n} comparisons within the {tol} tolerance"
    else:
        calm = "nothing found (no reference to compare with: the modules only against each other)"
    lines = [outlier_line(o) for o in r.outliers] + [energy_outlier_text(o) for o in r.energy_outliers]
    return Glance(regressed=_more(regressed, "regression(s)"), calm=calm,
                  out_of_line=_more(lines, "module(s)"), not_measured=not_measured(r, startup))


ALL_MEASURED = "nothing: every figure the reference has, and energy and probe figures"
CALM_MODULES = "no module: each within the fleet spread"


def glance_markdown(r: Report, startup: list[str]) -> list[str]:
    """The summary as Markdown list items (under the verdict of the Markdown report)."""
    g = glance(r, startup)
    return [f"- **regressed**: {'; '.join(g.regressed) or g.calm}",
            f"- **out of line**: {'; '.join(g.out_of_line) or CALM_MODULES}",
            f"- **not measured**: {'; '.join(g.not_measured) or ALL_MEASURED}"]
