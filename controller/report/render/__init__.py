"""How a report reads: text for people (:mod:`.text`), data files (:mod:`.data`), one HTML page (:mod:`.html`).

The text and data forms are re-exported here; the HTML form is imported from
:mod:`controller.report.render.html` (it loads matplotlib and jinja2), or written through
:func:`write_report`.
"""

from __future__ import annotations

from controller.report.render.data import (
    UNITS,
    atomic_write,
    findings,
    findings_json,
    rows_with_baseline,
    to_dict,
    to_json,
    write_report,
    write_tables,
    write_text,
)
from controller.report.render.markdown import to_markdown
from controller.report.render.numbers import num, pct
from controller.report.render.text import (
    outlier_line,
    probe_text,
    regression_line,
    telemetry_cell,
    telemetry_line,
    verdict_line,
)

__all__ = ["UNITS", "atomic_write", "findings", "findings_json", "num", "outlier_line", "pct", "probe_text",
           "regression_line", "rows_with_baseline", "telemetry_cell", "telemetry_line", "to_dict", "to_json",
           "to_markdown", "verdict_line", "write_report", "write_tables", "write_text"]
