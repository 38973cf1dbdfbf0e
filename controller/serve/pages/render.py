"""The templates' filters (pure): times, durations, path parts, a run's telemetry in a line, a series as a
sparkline (inline SVG: no script, no file from elsewhere)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from markupsafe import Markup, escape

from controller.history.waits import shown_duration


def when(ts: float | None) -> str:
    """``YYYY-MM-DD HH:MM`` UTC."""
    return "–" if ts is None else time.strftime("%Y-%m-%d %H:%M", time.gmtime(ts))


def path_part(text: str) -> str:
    return quote(str(text), safe="")


def duration(seconds: float | None) -> str:
    return shown_duration(seconds) or "–"


def telemetry(p: dict[str, Any]) -> str:
    """A module's telemetry of a run in a line: samples and the peak power and temperature it saw, or '–'."""
    t = p.get("telemetry") or {}
    if not t or not t.get("samples"):
        return "–"
    peaks: dict[str, float] = {}
    for k in t.get("keys") or ():
        for name, stat in (k.get("fields") or {}).items():
            if isinstance(stat, dict) and stat.get("max") is not None:
                peaks[name] = max(peaks.get(name, float("-inf")), float(stat["max"]))
    shown = ", ".join(f"{n} max {v:g}" for n, v in sorted(peaks.items())[:3])
    return f"{t['samples']} samples" + (f"; {shown}" if shown else "")


def spark(rec: dict[str, Any], width: int = 120, height: int = 24) -> Markup:
    """A change point's series (one value per release, ``values``) as a small line, the new level's start marked;
    labelled for a screen reader with the first and last value."""
    vals = [float(v) for v in rec.get("values") or () if v == v]
    if len(vals) < 2:
        return Markup("–")
    lo, hi = min(vals), max(vals)
    span = (hi - lo) or 1.0
    step = width / (len(vals) - 1)
    pts = " ".join(f"{i * step:.1f},{height - 2 - (v - lo) / span * (height - 4):.1f}" for i, v in enumerate(vals))
    at = int(rec.get("index", -1))
    mark = f'<line x1="{at * step:.1f}" y1="0" x2="{at * step:.1f}" y2="{height}" stroke="#b42318"/>' \
        if 0 <= at < len(vals) else ""
    label = escape(f"{rec.get('metric', '')} over {len(vals)} releases: {vals[0]:.4g} to {vals[-1]:.4g}")
    return Markup(f'<svg class="spark" width="{width}" height="{height}" role="img" aria-label="{label}">{mark}'
                  f'<polyline fill="none" stroke="#0550ae" stroke-width="1.5" points="{pts}"/></svg>')


def filters() -> dict[str, Callable[..., Any]]:
    return {"when": when, "u": path_part, "dur": duration, "telemetry": telemetry, "spark": spark}
