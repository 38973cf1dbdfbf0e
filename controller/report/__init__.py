"""Reports: baselines, regression and outlier verdicts (pandas), Markdown / HTML / CSV / JSON.

Public API: :func:`build_report` (history + run id -> :class:`Report`), :func:`compare_runs`,
:func:`analyse` (frames -> Report, pure), :class:`Thresholds`.
"""

from __future__ import annotations

from controller.report.analysis import analyse
from controller.report.load import build_report, compare_runs
from controller.report.model import Change, Outlier, Regression, Report, ReportError, Thresholds

__all__ = ["Change", "Outlier", "Regression", "Report", "ReportError", "Thresholds", "analyse", "build_report",
           "compare_runs"]
