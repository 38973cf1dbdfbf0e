"""Helpers over the dashboard JSON and the rules: every PromQL expression, and the unit it yields."""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from agent.metrics import CATALOG as AGENT_CATALOG
from controller.serve.metrics import CATALOG as CONTROLLER_CATALOG

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "grafana" / "dashboards"
RULES = ROOT / "deploy" / "prometheus" / "rules" / "m1000.rules.yml"

# metric -> unit token of the catalog (process_* and up are the client library's / Prometheus's own)
UNITS: dict[str, str] = {s.name: s.unit for s in (*AGENT_CATALOG, *CONTROLLER_CATALOG)}
UNITS.update({"up": "count", "process_cpu_seconds_total": "seconds", "process_resident_memory_bytes": "bytes"})
# unit token -> Grafana units that show it right
GRAFANA_UNITS: dict[str, set[str]] = {
    "seconds": {"s", "dtdurations"},
    "bytes": {"bytes", "decbytes"},
    "ratio": {"percentunit"},
    "tokens_per_second": {"suffix: tok/s"},
    "frames_per_second": {"suffix: fps"},
    "celsius": {"celsius"},
    "watts": {"watt"},
    "joules": {"joule"},
    "hertz": {"hertz"},
    "count": {"none", "short"},
}
_NAME = re.compile(r"\b((?:m1000|process)_[a-z0-9_]+|up)\b(?!\s*\()")


def load_builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("m1000_build_dashboards", ROOT / "grafana" / "build_dashboards.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text(encoding="utf-8")) for p in sorted(DASHBOARDS.glob("*.json"))}


def panels(dash: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for p in dash.get("panels", []):
        if p.get("type") == "row":
            yield from p.get("panels", [])
        else:
            yield p


def metric_names(expr: str) -> list[str]:
    out = []
    for name in _NAME.findall(expr):
        if name in ("by", "on", "le"):
            continue
        base = re.sub(r"_(bucket|sum|count)$", "", name) if name not in UNITS else name
        out.append(base)
    return out


def expr_unit(expr: str) -> str:
    """The unit an expression yields, inferred from the catalog units of the metrics in it."""
    names = metric_names(expr)
    assert names, f"no metric in {expr!r}"
    units = [UNITS[n] for n in names]
    if expr.startswith("time() -"):
        assert units == ["timestamp_seconds"], expr
        return "seconds"
    if expr.startswith("rate(") and units == ["seconds"]:
        return "ratio"  # CPU seconds per second
    if " / " in expr:
        assert len(set(units)) == 1, f"{expr!r} divides {units}"
        # mean durations: sum / count of the same histogram keep the unit
        return units[0] if "_sum" in expr and "_count" in expr else "ratio"
    assert len(set(units)) == 1, f"{expr!r} mixes units {units}"
    return units[0]


def dashboard_queries() -> Iterator[tuple[str, str, dict[str, Any], dict[str, Any]]]:
    """(dashboard file, panel title, panel, target) for every query of every panel."""
    for name, dash in dashboards().items():
        for p in panels(dash):
            for t in p.get("targets", []):
                yield name, p.get("title", ""), p, t


def dashboard_annotations() -> Iterator[tuple[str, str, str]]:
    """(dashboard file, annotation name, expression) for every Prometheus annotation of every dashboard."""
    for name, dash in dashboards().items():
        for a in dash.get("annotations", {}).get("list", []):
            if a.get("expr"):
                yield name, a.get("name", ""), a["expr"]


def rule_exprs() -> dict[str, str]:
    doc = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return {r["alert"]: r["expr"] for g in doc["groups"] for r in g["rules"]}


def substitute(expr: str) -> str:
    """Grafana's variables as Grafana would send them with "All" chosen."""
    return (expr.replace("$__rate_interval", "1m").replace("$__range", "1h")
            .replace("$release", ".*").replace("$model_key", ".*").replace("$module", ".*"))
