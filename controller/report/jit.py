"""Kernels compiled while measuring, in reports (pure): the model keys whose figures include compile time.

The agent stamps a key's release rows with the TileLang kernel libraries that appeared in the release's cache
during its benchmark (``ResultRow.jit_kernels`` / ``jit_kernel_names``: :mod:`agent.jit_watch`). A report names
each such key, how many kernels were compiled (summed over its modules) and where, in one note ("kernels compiled
while measuring: qwen35 — 3 (sim-1), the figures include compile time") and in its JSON (``jit_compiled``).
Rows from before the field (or a frame without the column) compiled nothing.
"""

from __future__ import annotations

import dataclasses

import pandas as pd

from controller.report.model import JitCompiled, Report


def jit_compiled(rows: pd.DataFrame | None) -> tuple[JitCompiled, ...]:
    """Model keys with kernels compiled during their benchmark, in key order (release rows only)."""
    if rows is None or not len(rows) or "jit_kernels" not in rows.columns:
        return ()
    counts = pd.to_numeric(rows["jit_kernels"], errors="coerce").fillna(0)
    hit = counts.to_numpy() > 0
    if "source" in rows.columns:
        # a categorical compared on its codes: no text made of every row
        src = rows["source"]
        hit &= ((src == "release") if isinstance(src.dtype, pd.CategoricalDtype) else
                (src.astype(str) == "release")).to_numpy(dtype=bool)
    if not hit.any():
        return ()
    cols = ["model_key", "module", "jit_kernel_names"] if "jit_kernel_names" in rows.columns else [
        "model_key", "module"]
    frame = rows.loc[hit, cols].astype(str).assign(kernels=counts[hit].astype(int))
    out = []
    for key, g in frame.groupby("model_key", sort=True, observed=True):
        per_module = g.groupby("module", sort=True, observed=True)["kernels"].max()
        names = sorted({n for text in g.get("jit_kernel_names", pd.Series(dtype=str)) for n in text.split("; ") if n})
        out.append(JitCompiled(model_key=str(key), kernels=int(per_module.sum()),
                               modules=tuple(str(m) for m in per_module.index), names=tuple(names)))
    return tuple(out)


def jit_note(found: tuple[JitCompiled, ...]) -> str:
    """The report's note ('' when nothing was compiled while measuring)."""
    if not found:
        return ""
    keys = ", ".join(f"{j.model_key} — {j.kernels} ({', '.join(j.modules)})" for j in found)
    return f"kernels compiled while measuring: {keys}, the figures include compile time"


def with_jit(report: Report) -> Report:
    """The report with its keys that compiled kernels while measuring (a note, and ``jit_compiled``)."""
    found = jit_compiled(report.rows)
    if not found:
        return report
    # first: the verdict line of an incomplete run quotes the last note (its completeness reason)
    return dataclasses.replace(report, jit_compiled=found, notes=(jit_note(found), *report.notes))
