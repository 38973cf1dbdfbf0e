"""docs/howto/monitoring.md's metric list is the one the exporters serve (their catalogs)."""

from __future__ import annotations

import re

from agent.metrics import CATALOG as AGENT_CATALOG
from controller.serve.metrics import CATALOG as CONTROLLER_CATALOG
from tests.metrics.dashboards import ROOT


def documented() -> dict[str, tuple[str, tuple[str, ...], str]]:
    text = (ROOT / "docs" / "howto" / "monitoring.md").read_text(encoding="utf-8")
    block = text.split("<!-- metrics-table:start -->")[1].split("<!-- metrics-table:end -->")[0]
    out = {}
    for line in block.splitlines():
        m = re.match(r"\|\s*`([a-z0-9_]+)`\s*\|\s*(\w+)\s*\|\s*([^|]*)\|\s*(\w+)\s*\|", line)
        if m:
            labels = tuple(x.strip() for x in m.group(3).split(",") if x.strip() not in ("", "-"))
            out[m.group(1)] = (m.group(2), labels, m.group(4))
    return out


def test_metric_list_matches_the_catalogs() -> None:
    doc = documented()
    code = {s.name: (s.type, s.labels, s.unit) for s in (*AGENT_CATALOG, *CONTROLLER_CATALOG)}
    assert set(doc) == set(code), f"missing in docs: {set(code) - set(doc)}; stale in docs: {set(doc) - set(code)}"
    for name, spec in code.items():
        assert doc[name] == spec, name


def test_names_follow_prometheus_conventions() -> None:
    for s in (*AGENT_CATALOG, *CONTROLLER_CATALOG):
        assert s.name.startswith("m1000_")
        assert (s.type == "counter") == s.name.endswith("_total"), s.name
        assert (s.type == "info") == s.name.endswith("_info"), s.name
        if s.unit in ("seconds", "timestamp_seconds"):
            assert s.name.endswith("_seconds"), s.name
        if s.unit == "bytes":
            assert s.name.endswith("_bytes"), s.name
        if s.unit == "ratio":
            assert s.name.endswith("_ratio"), s.name
        assert not {"run_id", "path", "message", "instance"} & set(s.labels), s.name
