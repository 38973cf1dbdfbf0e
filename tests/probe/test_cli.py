"""``fleet-agent probe``: bad input in one line, table and JSON output, exit codes."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from agent.cli import app
from tests.probe.fakeserver import FakeServer, in_thread


def _invoke(*args: str):
    return CliRunner().invoke(app, ["probe", *args])


@pytest.mark.parametrize(("extra", "message"), [
    (["--profiles", "128"], "expected prefill_len:input_len"),
    (["--profiles", "300:200"], "prefill_len <= input_len"),
    (["--concurrency", "2", "--rate", "1"], "not both"),
    (["--concurrency", "0"], "at least 1"),
    (["--slo", "ttft=3"], "expected ttft_ms="),
    (["--images", "2"], "--images needs --api chat"),
    (["--requests", "0"], "requests"),
    (["--sweep"], "--sweep needs --slo"),
    (["--sweep", "--slo", "ttft_p90_ms=100", "--concurrency", "2"], "leave out --concurrency and --rate"),
])
def test_bad_input_is_one_line_and_exit_2(extra, message):
    res = _invoke("http://127.0.0.1:9", *extra)
    assert res.exit_code == 2, res.output
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], res.output


def test_a_bad_url_and_no_server_are_one_line():
    res = _invoke("ftp://x")
    assert res.exit_code == 2 and "expected http://host" in res.output
    res = _invoke("http://127.0.0.1:9")
    assert res.exit_code == 2 and "no server answers" in res.output


def test_json_output_against_a_server():
    with in_thread(FakeServer(tokens=5)) as srv:
        res = _invoke(srv.url, "--profiles", "16:16,8:24", "--concurrency", "1,2", "--requests", "4",
                      "--output-len", "5", "--slo", "ttft_ms=10000,tpot_ms=10000", "--format", "json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["model"] == "fake-model" and doc["engine_fields"] is True
    assert [(r["profile"], r["load"]["kind"]) for r in doc["results"]] == [
        ("16:16", "sequential"), ("16:16", "concurrency"), ("8:24", "sequential"), ("8:24", "concurrency")]
    for r in doc["results"]:
        assert r["ok"] == 4 and r["errors"] == {} and r["output_tokens"] == 20
        assert r["goodput_rps"] == pytest.approx(r["request_throughput_rps"])
        assert r["ttft_ms"]["n"] == 4 and r["itl_ms"]["n"] == 16


def test_table_output_and_errors_make_exit_1():
    with in_thread(FakeServer(fail_request=4, reject_engine_fields=True)) as srv:
        res = _invoke(srv.url, "--model", "m", "--api", "chat", "--images", "1", "--requests", "3",
                      "--output-len", "3")
    assert res.exit_code == 1, res.output
    assert "engine-specific fields refused" in res.stdout and "128:128" in res.stdout
    assert "errors: http_status 1" in res.output and "HTTP 500: boom" in res.output


@pytest.mark.parametrize("fmt", ["json", "table"])
def test_a_sweep_names_its_capacity_and_exits_0(fmt):
    with in_thread(FakeServer(tokens=5)) as srv:
        res = _invoke(srv.url, "--profiles", "16:16", "--sweep", "--slo", "ttft_p90_ms=10000,tpot_p90_ms=10000",
                      "--sweep-budget", "5", "--max-concurrency", "2", "--output-len", "5", "--format", fmt)
    assert res.exit_code == 0, res.output
    if fmt == "json":
        doc = json.loads(res.stdout)
        assert doc["profile"] == "16:16" and doc["capacity"]["concurrency"] == 2
    else:
        assert "SLO sweep 16:16" in res.stdout and "capacity at SLO: concurrency 2" in res.stdout
