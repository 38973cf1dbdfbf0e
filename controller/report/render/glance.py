"""A report's first screen: under the verdict, three lines a release engineer reads at a glance (pure).

- what regressed (each finding in one line, the first few; else how many comparisons stayed within tolerance);
- which modules are out of line (the outliers, in speed and in energy; else that none is);
- what was not measured and why (modules refused at dispatch, metrics the reference has and the run lacks, keys the
  curves leave out, no device telemetry, no probe rows, start-up costs without a reference).

The sections below the summary give the detail; the start-up costs without a reference are folded there.
"""

from __future__ import annotations

from dataclasses import dataclass

from contract.records import STARTUP_METRICS
from controller.report.analysis.verdict import is_missing
from controller.report.model import FLEET, Report
from controller.report.render.plots import TABLE_KINDS, not_plotted
from controller.report.render.text import energy_outlier_text, outlier_line, regression_line

SHOWN = 5  # findings named a line; the rest counted
NO_REFERENCE = ": no reference"  # how a start-up line without a reference ends (text.startup_lines)


@dataclass(frozen=True)
class Glance:
    regressed: tuple[str, ...]  # one line each; empty: nothing regressed (``calm`` says what was compared)
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
    for x in r.regressions:
        if is_missing(x):
            where = "" if x.module == FLEET else f" on {x.module}"
            out.append(f"{x.model_key} {x.metric}{where}: missing (the {x.against} has it)")
    left_out = not_plotted(r.summary, "decode_tps") if len(r.summary) else {}
    for key, tables in left_out.items():
        kinds = "; ".join(TABLE_KINDS.get(t, f"table {t}") for t in tables)
        out.append(f"{key}: no context sweep ({kinds}): not in the curves, its changes in the table below")
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
