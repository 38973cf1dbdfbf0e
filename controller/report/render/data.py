"""Reports as data files: JSON, and CSV / Parquet tables of rows and findings (write-then-rename).

Lazy imports: the HTML renderer (:mod:`.html`) is imported when an HTML report is written: it loads jinja2
(42 ms CPU a fresh process) and matplotlib (pyplot: 542 ms), measured by ``bench/import_costs.py``
(bench/results/import_costs_20261207_0346_lazy-libraries.txt); a report written as text, JSON or CSV needs neither.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from controller.report.model import Regression, Report
from controller.report.render.markdown import to_markdown
from controller.report.render.text import telemetry_cell, verdict_line

UNITS = {"prefill_tps": "tok/s", "decode_tps": "tok/s", "ttft_ms": "ms", "tpot_ms": "ms", "vision_fps": "fps",
         "accept_rate": "", "accept_rate_len": "", "correct": ""}


def _clean(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    return x


def findings(r: Report) -> dict[str, Any]:
    """The report's findings as JSON-able data: ``regressions`` and ``outliers``, each with its 95 % interval
    (``ci_low``, ``ci_high``: of the change, of the outlier's factor; None where there is none)."""
    return _clean({"regressions": [x.model_dump(mode="json") for x in r.regressions],
                   "outliers": [x.model_dump(mode="json") for x in r.outliers]})


def findings_json(r: Report) -> str:
    """:func:`findings` as compact JSON text (what a verdict's webhook event carries)."""
    return json.dumps(findings(r), separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def to_dict(r: Report) -> dict[str, Any]:
    """The report as plain JSON-able data (non-finite floats as None)."""
    return _clean({
        "run_id": r.run_id, "release": r.release, "baseline": r.baseline_id, "previous": list(r.previous_ids),
        "verdict": r.verdict, "verdict_line": verdict_line(r), "modules": list(r.modules),
        **findings(r),
        "energy_outliers": [x.model_dump(mode="json") for x in r.energy_outliers],
        "outlier_telemetry": [x.model_dump(mode="json") for x in r.outlier_telemetry],
        "environment": [x.model_dump(mode="json") for x in r.environment],
        "environment_changes": list(r.environment_changes),
        "jit_compiled": [x.model_dump(mode="json") for x in r.jit_compiled],
        "changes": [x.model_dump(mode="json") for x in r.changes],
        "disagreements": [x.model_dump(mode="json") for x in r.disagreements], "probe_checked": r.probe_checked,
        "capacities": [x.model_dump(mode="json") for x in r.capacities],
        # only where a probe ran in rounds (probe_repeat): a report's keys stay what they were otherwise
        **({"probe_intervals": [x.model_dump(mode="json") for x in r.probe_intervals]} if r.probe_intervals else {}),
        "refused": dict(r.refused), "failed_parts": [x.model_dump(mode="json") for x in r.failed_parts],
        "notes": list(r.notes), "thresholds": r.thresholds.model_dump(mode="json"),
        "summary": r.summary.to_dict(orient="records") if len(r.summary) else [],
    })


def to_json(r: Report, indent: int | None = 2) -> str:
    """The report as JSON text (:func:`to_dict`)."""
    return json.dumps(to_dict(r), indent=indent, ensure_ascii=False, allow_nan=False)


def rows_with_baseline(r: Report) -> pd.DataFrame:
    """Every row of the run with, per metric, the baseline figure and the change against it."""
    rows = r.rows.reset_index(drop=True)
    if r.reference is None or not len(rows):
        return rows
    metrics = [m for m in r.reference.columns if m in UNITS and m != "correct" and m in rows.columns]
    ref = r.reference[metrics].add_prefix("baseline_").reset_index()
    keys = rows[["model_key", "profile"]].astype(str)
    merged = keys.merge(ref, on=["model_key", "profile"], how="left")
    out = rows.copy()
    for m in metrics:
        out[f"baseline_{m}"] = merged[f"baseline_{m}"].to_numpy()
        out[f"change_{m}"] = pd.to_numeric(rows[m], errors="coerce").to_numpy() / out[f"baseline_{m}"].to_numpy() - 1
    return out


def atomic_write(path: Path, write: Callable[[Path], object]) -> Path:
    """Write to a temporary file in the same folder, then rename: never a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text(path: Path, text: str) -> Path:
    """Write ``text`` as UTF-8 to ``path`` (write-then-rename)."""
    return atomic_write(path, lambda p: p.write_text(text, encoding="utf-8"))


def write_tables(r: Report, out: Path, parquet: bool = True) -> list[Path]:
    """rows.csv (+ rows.parquet), summary.csv, regressions.csv, outliers.csv, changes.csv, disagreements.csv."""
    rows = rows_with_baseline(r)
    written = [atomic_write(out / "rows.csv", lambda p: rows.to_csv(p, index=False))]
    if parquet:
        written.append(atomic_write(out / "rows.parquet", lambda p: rows.to_parquet(p, index=False)))
    tables = {
        "summary.csv": r.summary,
        "regressions.csv": pd.DataFrame([x.model_dump(mode="json") for x in r.regressions],
                                        columns=list(Regression.model_fields)),
        "outliers.csv": pd.DataFrame([{**o.model_dump(mode="json", exclude={"worst"}),
                                       "worst": "; ".join(f"{w.model_key} {w.profile} {w.metric} z={w.z:.1f}"
                                                          for w in o.worst),
                                       "device_telemetry": telemetry_cell(r, o)} for o in r.outliers]),
        "changes.csv": pd.DataFrame([c.model_dump(mode="json") for c in r.changes]),
        "disagreements.csv": pd.DataFrame([d.model_dump(mode="json") for d in r.disagreements],
                                          columns=["module", "model_key", "profile", "metric", "release", "probe",
                                                   "change"]),
    }
    for name, df in tables.items():
        written.append(atomic_write(out / name, _csv_writer(df)))
    return written


def _csv_writer(df: pd.DataFrame) -> Callable[[Path], object]:
    return lambda p: df.to_csv(p, index=False)


def write_report(r: Report, fmt: str, out: Path) -> list[Path]:
    """Write the report in ``fmt`` (md, html, csv, json) under ``out``; returns the files written."""
    if fmt == "md":
        return [write_text(out / "report.md", to_markdown(r))]
    if fmt == "json":
        return [write_text(out / "report.json", to_json(r))]
    if fmt == "html":
        from controller.report.render.html import to_html

        return [write_text(out / "report.html", to_html(r))]
    if fmt == "csv":
        return write_tables(r, out)
    raise ValueError(f"unknown report format {fmt!r} (md, html, csv, json)")
