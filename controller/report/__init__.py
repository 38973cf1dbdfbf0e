"""Reports: baselines, regression and outlier verdicts (pandas), Markdown / HTML / CSV / JSON.

Public API: :func:`build_report` (history + run id -> :class:`Report`), :func:`compare_runs`,
:func:`analyse` (frames -> Report, pure), :class:`Thresholds`; a report reads as text through
:func:`verdict_line`, :func:`to_markdown`, :func:`to_json` (HTML: ``controller.report.render.html.to_html``).
Layout: ``model`` (records), ``load`` (history -> frames), ``analysis/`` (frames -> Report),
``telemetry`` (why an outlier is slow), ``render/`` (text, data files, HTML), ``synth`` (test fleets).
"""

from __future__ import annotations

from controller.report.analysis import analyse
from controller.report.load import build_report, compare_runs
from controller.report.model import Change, Outlier, Regression, Report, ReportError, Thresholds
from controller.report.render import to_json, to_markdown, verdict_line

__all__ = ["Change", "Outlier", "Regression", "Report", "ReportError", "Thresholds", "analyse", "build_report",
           "compare_runs", "to_json", "to_markdown", "verdict_line"]
