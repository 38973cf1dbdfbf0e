"""Dashboards: up to date with their code, valid against Grafana's schema models, units and variables right."""

from __future__ import annotations

import json
from typing import Any

import pytest
from grafana_foundation_sdk.cog import plugins, runtime
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import units
from grafana_foundation_sdk.models.dashboard import Dashboard, VariableType

from tests.metrics.dashboards import (
    GRAFANA_UNITS,
    ROOT,
    dashboard_queries,
    dashboards,
    expr_unit,
    load_builder,
    panels,
)

plugins.register_default_plugins()
SDK_UNITS = {v for k, v in vars(units).items() if not k.startswith("_") and isinstance(v, str)}
EXPECTED = {"fleet-overview.json", "release-validation.json", "module-drilldown.json", "release-history.json"}


def lost(raw: Any, again: Any, path: str = "") -> list[str]:
    """Paths of ``raw`` missing or different in ``again`` (defaults the schema adds are fine)."""
    if isinstance(raw, dict):
        if not isinstance(again, dict):
            return [path or "/"]
        return [p for k, v in raw.items() if v is not None
                for p in (lost(v, again[k], f"{path}/{k}") if k in again else [f"{path}/{k}"])]
    if isinstance(raw, list):
        if not isinstance(again, list) or len(raw) != len(again):
            return [path]
        return [p for i, (a, b) in enumerate(zip(raw, again, strict=True)) for p in lost(a, b, f"{path}/{i}")]
    return [] if raw == again else [path]


def test_committed_json_is_what_the_code_builds() -> None:
    built = load_builder().build_all()
    assert set(built) == EXPECTED
    for name, text in built.items():
        assert (ROOT / "grafana" / "dashboards" / name).read_text(encoding="utf-8") == text, (
            f"grafana/dashboards/{name} is stale: run .venv/bin/python grafana/build_dashboards.py")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_round_trips_through_grafana_schema_models(name: str) -> None:
    """Decoded by the SDK's models (generated from Grafana's schema) and encoded back, nothing is lost:
    no unknown field anywhere, every panel's options and field config known to its plugin."""
    raw = dashboards()[name]
    model = Dashboard.from_json(raw)
    again = json.loads(json.dumps(model, cls=JSONEncoder))
    assert lost(raw, again) == []
    for p in panels(raw):
        assert runtime.panelcfg_config(p["type"]) is not None, f"{name}: unknown panel type {p['type']!r}"
    assert raw["uid"] and 8 <= len(raw["uid"]) <= 40


def test_every_panel_uses_the_provisioned_datasource_and_a_matching_unit() -> None:
    seen = 0
    for name, title, panel, target in dashboard_queries():
        where = f"{name}: {title!r}"
        assert panel["datasource"] == {"type": "prometheus", "uid": "m1000-prometheus"}, where
        assert target["datasource"] == panel["datasource"], where
        unit = panel["fieldConfig"]["defaults"]["unit"]
        assert unit in SDK_UNITS or unit.startswith("suffix:"), f"{where}: unknown unit {unit!r}"
        expected = GRAFANA_UNITS[expr_unit(target["expr"])]
        assert unit in expected, f"{where}: unit {unit!r}, the query yields {expected}"
        seen += 1
    assert seen >= 40


def test_template_variables() -> None:
    import yaml

    ds = yaml.safe_load((ROOT / "grafana/provisioning/datasources/prometheus.yml").read_text())
    assert ds["datasources"][0]["uid"] == "m1000-prometheus"
    for name, dash in dashboards().items():
        variables = {v["name"]: v for v in dash["templating"]["list"]}
        want = {"module"} if name in ("fleet-overview.json", "module-drilldown.json") else {
            "release", "model_key", "module"}
        assert set(variables) == want, name
        for v in variables.values():
            assert v["type"] == VariableType.QUERY.value
            assert v["query"].startswith("label_values(")
        for _, title, _, t in ((n, ti, p, t) for n, ti, p, t in dashboard_queries() if n == name):
            for var in want:
                if f"${var}" in t["expr"]:
                    assert f'=~"${var}"' in t["expr"], f"{name}: {title}: use =~ for ${var} (All is .*)"
            # every dashboard filters by module where the series has one
        used = " ".join(t["expr"] for n, _, _, t in dashboard_queries() if n == name)
        for var in want:
            assert f"${var}" in used, f"{name}: variable ${var} is never used"


def test_lost_finds_unknown_fields() -> None:
    raw = {"panels": [{"type": "stat", "bogus": 1, "title": "x"}]}
    again = json.loads(json.dumps(Dashboard.from_json(raw), cls=JSONEncoder))
    assert lost(raw, again) == ["/panels/0/bogus"]


def test_expr_unit_inference() -> None:
    assert expr_unit("m1000_result_ttft_seconds") == "seconds"
    assert expr_unit("time() - m1000_run_updated_timestamp_seconds") == "seconds"
    assert expr_unit("m1000_result_ttft_seconds / on (a) m1000_baseline_ttft_seconds") == "ratio"
    with pytest.raises(AssertionError):
        expr_unit("m1000_result_ttft_seconds + m1000_result_decode_tokens_per_second")


def test_annotations_query_catalog_metrics_and_the_fleet_marks_change_points() -> None:
    from tests.metrics.dashboards import UNITS, dashboard_annotations, metric_names

    found = list(dashboard_annotations())
    for name, title, expr in found:
        assert metric_names(expr) and all(n in UNITS for n in metric_names(expr)), (name, title, expr)
    assert ("fleet-overview.json", "Change points in force",
            'sum by (model_key, metric) (m1000_trend_change_points{scope="fleet"}) > 0') in found
