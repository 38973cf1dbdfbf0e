"""Number formatting shared by every text form of a report (Markdown, HTML): one rule for each; and the numeric
order of profiles."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TypeVar

from controller.report.model import profile_key

T = TypeVar("T")


def pct(x: float | None) -> str:
    """A relative change as a signed percentage with one decimal (``+8.7%``); blank for None / NaN."""
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:+.1%}"


def num(x: float | None) -> str:
    """A figure with four significant digits, whole from 1000 on (``12.35``, ``1476``); blank for None / NaN."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    return f"{x:.4g}" if abs(x) < 1000 else f"{x:.0f}"


def in_profile_order(items: Iterable[T]) -> list[T]:
    """Findings (anything with ``module``, ``model_key`` and ``profile``) with the profiles of each module's key in
    numeric order; the modules and keys stay in the order they come."""
    items = list(items)
    first: dict[tuple[str, str], int] = {}
    for x in items:
        first.setdefault((x.module, x.model_key), len(first))  # type: ignore[attr-defined]
    return sorted(items, key=lambda x: (first[(x.module, x.model_key)], profile_key(x.profile)))  # type: ignore[attr-defined]
