"""Number formatting shared by every text form of a report (Markdown, HTML): one rule for each."""

from __future__ import annotations

import math


def pct(x: float | None) -> str:
    """A relative change as a signed percentage with one decimal (``+8.7%``); blank for None / NaN."""
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:+.1%}"


def num(x: float | None) -> str:
    """A figure with four significant digits, whole from 1000 on (``12.35``, ``1476``); blank for None / NaN."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    return f"{x:.4g}" if abs(x) < 1000 else f"{x:.0f}"
