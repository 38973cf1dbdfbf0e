"""Text forms of a report: one verdict line, JSON, Markdown, CSV / Parquet files (write-then-rename)."""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from controller.report.model import FLEET, PRIMARY_METRICS, Outlier, Regression, Report

UNITS = {"prefill_tps": "tok/s", "decode_tps": "tok/s", "ttft_ms": "ms", "tpot_ms": "ms", "vision_fps": "fps",
         "accept_rate": "", "accept_rate_len": "", "correct": ""}


def verdict_line(r: Report) -> str:
    """One line, e.g. ``REGRESSED run-7 (1.4.2 vs baseline:1.4.1:v1): 1 regression(s): fleet: qwen3
    decode_tps -8.0% vs baseline (tpot_ms +8.7%); 1 outlier(s): m03 0.88x``."""
    against = r.baseline_id or ("baseline" if r.reference is not None else "no baseline")
    head = f"{r.verdict.upper()} {r.run_id} ({r.release or '?'} vs {against})"
    parts = []
    if r.regressions:
        first = r.regressions[0].one_line()
        more = f" and {len(r.regressions) - 1} more" if len(r.regressions) > 1 else ""
        parts.append(f"{len(r.regressions)} regression(s): {first}{more}")
    else:
        parts.append("no regression")
    if r.outliers:
        parts.append(f"{len(r.outliers)} outlier(s): " + ", ".join(
            f"{o.module}{'' if o.model_key == FLEET else '[' + o.model_key + ']'} {o.factor:.2f}x" for o in r.outliers))
    if r.disagreements:
        where = sorted({f"{d.module}[{d.model_key}]" for d in r.disagreements})
        parts.append(f"release benchmark disagrees with the probe on {len(r.disagreements)} figure(s): "
                     + ", ".join(where))
    if r.verdict in ("incomplete", "failed") and r.notes:
        parts.append(r.notes[-1])
    return f"{head}: " + "; ".join(parts)


def probe_text(r: Report) -> str:
    """One sentence about the cross-check with the agent's probe (when nothing disagrees)."""
    if r.disagreements:
        return (f"{len(r.disagreements)} figure(s) where the release's benchmark and the agent's probe differ by more "
                f"than {r.thresholds.probe_tolerance:.0%} (change: release / probe - 1).")
    if r.probe_checked:
        return (f"None: {r.probe_checked} release row(s) have a probe row beside them; every figure agrees "
                f"within {r.thresholds.probe_tolerance:.0%}.")
    return "No probe rows in this run."


def _clean(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    return x


def to_dict(r: Report) -> dict[str, Any]:
    return _clean({
        "run_id": r.run_id, "release": r.release, "baseline": r.baseline_id, "previous": list(r.previous_ids),
        "verdict": r.verdict, "verdict_line": verdict_line(r), "modules": list(r.modules),
        "regressions": [x.model_dump(mode="json") for x in r.regressions],
        "outliers": [x.model_dump(mode="json") for x in r.outliers],
        "outlier_telemetry": [x.model_dump(mode="json") for x in r.outlier_telemetry],
        "changes": [x.model_dump(mode="json") for x in r.changes],
        "disagreements": [x.model_dump(mode="json") for x in r.disagreements], "probe_checked": r.probe_checked,
        "notes": list(r.notes), "thresholds": r.thresholds.model_dump(mode="json"),
        "summary": r.summary.to_dict(orient="records") if len(r.summary) else [],
    })


def to_json(r: Report, indent: int | None = 2) -> str:
    return json.dumps(to_dict(r), indent=indent, ensure_ascii=False, allow_nan=False)


def _pct(x: float | None) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:+.1%}"


def _num(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    return f"{x:.4g}" if abs(x) < 1000 else f"{x:.0f}"


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    esc: Callable[[str], str] = lambda c: str(c).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def to_markdown(r: Report) -> str:
    out = [f"# Fleet report {r.run_id}", "", f"**{verdict_line(r)}**", ""]
    out.append(f"Release {r.release or '?'}; baseline {r.baseline_id or 'none'}; previous run(s) "
               f"{', '.join(r.previous_ids) or 'none'}; {len(r.modules)} module(s); tolerance "
               f"{r.thresholds.tolerance:.0%}.")
    out += ["", "## Regressions", ""]
    if r.regressions:
        out.append(_md_table(
            ["module", "model key", "profile", "metric", "baseline", "value", "change", "against", "p", "detail"],
            [[x.module, x.model_key, x.profile, x.metric, _num(x.baseline), _num(x.value), _pct(x.change), x.against,
              "" if x.p_value is None else f"{x.p_value:.2g}",
              x.detail + (f"; with {', '.join(x.related)}" if x.related else "")] for x in r.regressions]))
    else:
        out.append("None.")
    out += ["", "## Outlier modules", ""]
    if r.outliers:
        out.append(_md_table(
            ["module", "model key", "factor", "figures", "beyond 3 MAD", "worst cases", "device telemetry"],
            [[o.module, o.model_key, f"{o.factor:.2f}x", str(o.cells), f"{o.share_out:.0%}",
              "; ".join(f"{w.model_key} {w.profile} {w.metric} {_num(w.value)} vs {_num(w.fleet_median)}"
                        for w in o.worst), _telemetry_cell(r, o)] for o in r.outliers]))
        out += _md_telemetry(r)
    else:
        out.append("None.")
    out += ["", "## Release benchmark vs probe", "", probe_text(r)]
    if r.disagreements:
        out += ["", _md_table(["module", "model key", "profile", "metric", "release", "probe", "change"],
                              [[d.module, d.model_key, d.profile, d.metric, _num(d.release), _num(d.probe),
                                _pct(d.change)] for d in r.disagreements])]
    if r.changes:
        out += ["", "## Every change per model key (fleet median over profiles)", ""]
        rows = [[c.model_key, c.metric, c.against, _num(c.baseline), _num(c.value), _pct(c.change),
                 "" if c.p_value is None else f"{c.p_value:.2g}", c.status]
                for c in r.changes if c.metric in PRIMARY_METRICS or c.status != "within tolerance"]
        out.append(_md_table(["model key", "metric", "against", "reference", "value", "change", "p", "status"], rows))
    if len(r.summary):
        out += ["", "## Fleet summary (decode tok/s and TTFT ms per profile)", ""]
        s = r.summary[r.summary["metric"].isin(["decode_tps", "ttft_ms", "accept_rate", "vision_fps"])]
        rows = [[str(x.model_key), str(x.profile), str(x.metric), _num(x.fleet), f"{x.spread:.1%}"
                 if isinstance(x.spread, float) and not math.isnan(x.spread) else "", str(int(x.count)),
                 _num(getattr(x, "baseline", None)), _pct(getattr(x, "change", None))]
                for x in s.itertuples()]
        out.append(_md_table(["model key", "profile", "metric", "fleet median", "spread", "modules", "baseline",
                              "change"], rows))
    if r.notes:
        out += ["", "## Notes", ""] + [f"- {n}" for n in r.notes]
    return "\n".join(out) + "\n"


def _telemetry_cell(r: Report, o: Outlier) -> str:
    t = r.telemetry_of(o)
    return "" if t is None else t.one_line()


def _md_telemetry(r: Report) -> list[str]:
    """Per outlier with telemetry: every figure compared, next to the fleet's median for the same keys."""
    out: list[str] = []
    for t in r.outlier_telemetry:
        if not t.compared:
            continue
        what = t.module if t.model_key == FLEET else f"{t.module} [{t.model_key}]"
        out += ["", f"### Device telemetry of {what} ({t.status})", ""]
        out.append(_md_table(["figure", "module", "fleet median", "unit", "keys", "unusual"],
                             [[c.what, _num(c.value), _num(c.fleet), c.unit, str(c.keys), "yes" if c.unusual else ""]
                              for c in t.compared]))
    return out


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
                                       "device_telemetry": _telemetry_cell(r, o)} for o in r.outliers]),
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
        from controller.report.html import to_html

        return [write_text(out / "report.html", to_html(r))]
    if fmt == "csv":
        return write_tables(r, out)
    raise ValueError(f"unknown report format {fmt!r} (md, html, csv, json)")
