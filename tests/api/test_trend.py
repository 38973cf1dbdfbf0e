"""``GET /api/v1/trend``: the records of ``fleetctl trend -o json``, with its filters, behind the token."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from controller.errors import FleetctlError
from controller.settings import ControllerSettings
from tests.support.cli import given_app
from tests.support.frames import reference  # noqa: F401 - the fixture, registered by name
from tests.support.http_servers import AUTH, TOKEN, write_tokens
from tests.support.trend import release_history


@pytest.fixture
def trended(tmp_path: Path, reference):  # noqa: F811 - the fixture
    from fastapi.testclient import TestClient

    from controller.serve.api import Tokens, create_app

    settings = ControllerSettings(broker_url="filesystem://", data_dir=tmp_path / "fleet",
                                  history=tmp_path / "history.sqlite")
    h = release_history(settings.history_path, reference, regress={("qwen3", "decode_tps"): 0.10})
    tokens = Tokens.load(write_tokens(tmp_path / "tokens", TOKEN))
    try:
        with TestClient(create_app(settings, tokens)) as c:
            yield c, h
    finally:
        h.close()


def _cli(h, *args: str) -> list[dict]:
    res = CliRunner().invoke(given_app(h), ["trend", *args, "-o", "json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_trend_endpoint_returns_the_records_of_the_cli(trended):
    client, h = trended
    got = client.get("/api/v1/trend", headers=AUTH, params={"metric": "decode_tps", "devices": "none"})
    assert got.status_code == 200, got.text
    assert got.json() == _cli(h, "--metric", "decode_tps", "--devices", "none")
    (r,) = got.json()
    assert (r["release"], r["model_key"], r["scope"], r["in_force"]) == ("1.6.0", "qwen3", "fleet", "yes")


def test_trend_endpoint_filters_as_the_cli_does(trended):
    client, h = trended
    params = {"models": "qwen3", "profile": "1000:1000", "min_magnitude": "0.2", "max_pvalue": "0.01"}
    got = client.get("/api/v1/trend", headers=AUTH, params=params)
    assert got.status_code == 200, got.text
    assert got.json() == _cli(h, "--models", "qwen3", "--profile", "1000:1000", "--min-magnitude", "0.2",
                              "--max-pvalue", "0.01") == []
    unknown = client.get("/api/v1/trend", headers=AUTH, params={"models": "nope"})
    assert unknown.status_code == 400 and "nope" in unknown.json()["detail"]
    # none found: the smallest step it could have found, in a header (the CLI prints it after "no change points")
    reach = json.loads(got.headers["X-Fleet-Reach"])
    assert reach.startswith("the smallest step it could find here: 20.0% in the middle, 20.0% 3 releases from the "
                            "end (noise ") and reach.endswith("none under --min-magnitude 20.0%)")
    found = client.get("/api/v1/trend", headers=AUTH, params={"metric": "decode_tps", "devices": "none"})
    assert "X-Fleet-Reach" not in found.headers


def test_a_profile_without_rows_is_named_not_taken_for_no_change(trended):
    client, h = trended
    said = "profile '1024:1024': no rows of it in the history of qwen3 (profiles: 1000:1000, 128:128, "
    got = client.get("/api/v1/trend", headers=AUTH, params={"models": "qwen3", "profile": "1024:1024"})
    assert got.status_code == 400 and got.json()["detail"].startswith(said)
    res = CliRunner().invoke(given_app(h), ["trend", "--models", "qwen3", "--profile", "1024:1024"])
    # fleetctl's main prints a FleetctlError as "fleetctl: error: ..." and exits 2 (tests/cli: the error root)
    assert isinstance(res.exception, FleetctlError) and str(res.exception).startswith(said)
    assert "no change points" not in res.output


def test_trend_endpoint_bad_input_is_one_line(trended):
    client, _ = trended
    bad = client.get("/api/v1/trend", headers=AUTH, params={"metric": "nope"})
    assert bad.status_code == 400 and bad.json()["detail"].startswith("--metric 'nope': not a metric (")
    assert client.get("/api/v1/trend", headers=AUTH, params={"max_pvalue": "0"}).status_code == 422
    assert client.get("/api/v1/trend").status_code == 401


def test_trend_endpoint_defaults_are_the_detectors():
    from controller.report.analysis.changepoints import DetectorSettings
    from controller.serve.api import DEFAULT_MAX_PVALUE, DEFAULT_MIN_MAGNITUDE

    d = DetectorSettings()
    assert (d.min_magnitude, d.max_pvalue) == (DEFAULT_MIN_MAGNITUDE, DEFAULT_MAX_PVALUE)


def test_trend_endpoint_is_in_the_schema(trended):
    client, _ = trended
    doc = client.get("/api/v1/openapi.json").json()
    params = {p["name"] for p in doc["paths"]["/api/v1/trend"]["get"]["parameters"]}
    assert params == {"models", "profile", "metric", "devices", "min_magnitude", "max_pvalue"}


def test_trend_endpoint_says_how_many_releases_the_history_holds(trended):
    from controller.cli.trend import MIN_RELEASES
    from controller.report import trend

    client, h = trended
    got = client.get("/api/v1/trend", headers=AUTH, params={"metric": "decode_tps"})
    releases = len({r.release for r in h.runs(limit=1000) if r.release})
    assert int(got.headers["X-Fleet-Releases"]) == releases > 1
    assert MIN_RELEASES == trend.MIN_RELEASES  # the CLI's copy (a served trend prints without pandas)
