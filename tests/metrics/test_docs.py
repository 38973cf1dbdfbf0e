"""The exporters' metric names follow Prometheus conventions. That docs/reference/metrics.md lists every series of
the catalogs is tests/unit/test_reference_docs.py's (the page is generated from them by ``make reference``)."""

from __future__ import annotations

from agent.metrics import CATALOG as AGENT_CATALOG
from controller.serve.metrics import CATALOG as CONTROLLER_CATALOG


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
        if s.unit in ("joules", "watts"):
            assert s.name.endswith(f"_{s.unit}"), s.name
        assert not {"run_id", "path", "message", "instance"} & set(s.labels), s.name


def test_names_are_unique_across_agent_and_controller() -> None:
    names = [s.name for s in (*AGENT_CATALOG, *CONTROLLER_CATALOG)]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []
