"""Every endpoint of the HTTP API over a real run history and the embedded broker (no worker:
the inventory's module is offline), auth refused without and with a wrong token, the tokens
file's checks, and the OpenAPI schema under schemathesis (a few examples per operation)."""

from __future__ import annotations

import io
import json
import re

import pytest

from tests.support.cli import TARBALL
from tests.support.http_servers import AUTH, TOKEN, write_tokens

ENDPOINTS = [("get", "/api/v1/runs"), ("get", "/api/v1/runs/run-b"), ("get", "/api/v1/runs/run-b/report"),
             ("post", "/api/v1/runs/run-b/cancel"), ("get", "/api/v1/devices"), ("post", "/api/v1/runs")]


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
def test_no_token_no_access(client, method, path):
    for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"}, {"Authorization": f"Basic {TOKEN}"},
                    {"Authorization": f"Bearer {TOKEN}x"}):
        r = client.request(method, path, headers=headers, json={"release": TARBALL} if method == "post" else None)
        assert r.status_code == 401, (headers, r.text)
        assert r.headers["www-authenticate"] == "Bearer" and r.json() == {"detail": "missing or wrong bearer token"}


def test_schema_is_served(client):
    doc = client.get("/api/v1/openapi.json").json()
    assert {"/api/v1/runs", "/api/v1/runs/{run_id}", "/api/v1/runs/{run_id}/report", "/api/v1/runs/{run_id}/cancel",
            "/api/v1/devices"} <= set(doc["paths"])
    assert doc["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"


def test_each_query_parameter_is_described_on_its_own(client):
    """The OpenAPI page shows each parameter's description alone: none leans on another's ("the same, of ...")."""
    doc = client.get("/api/v1/openapi.json").json()
    params = [(path, p) for path, ops in doc["paths"].items() for op in ops.values()
              for p in op.get("parameters", []) if p["in"] == "query"]
    leaning = [f"{path} {p['name']}: {p.get('description')!r}" for path, p in params
               if not p.get("description") or re.match(r"(the )?same\b|as above|likewise", p["description"], re.I)]
    assert params and not leaning, leaning
    report = {p["name"]: p["description"] for path, p in params if path.endswith("/report")}
    for name, of in (("tolerance", "every metric"), ("energy_tolerance", "energy per token"),
                     ("startup_tolerance", "start-up cost")):
        assert of in report[name] and "counts as a regression" in report[name], (name, report[name])


def test_runs_and_one_run(client):
    r = client.get("/api/v1/runs", headers=AUTH)
    assert r.status_code == 200
    assert [x["run_id"] for x in r.json()] == ["run-b", "run-a"]
    one = client.get("/api/v1/runs/run-b", headers=AUTH).json()
    assert one["state"] == "done" and one["rows"] == 6 * 92 and one["release"] == "1.4.1"
    assert set(one["module_states"]) == {f"m{i:02d}" for i in range(6)}
    assert one["module_states"]["m00"]["state"] == "done"
    assert client.get("/api/v1/runs?limit=1", headers=AUTH).json()[0]["run_id"] == "run-b"
    assert client.get("/api/v1/runs/run-", headers=AUTH).status_code == 404  # ambiguous prefix: not one run
    r = client.get("/api/v1/runs/nope", headers=AUTH)
    assert r.status_code == 404 and "no run 'nope'" in r.json()["detail"]


def test_a_run_carries_its_recorded_verdict_line(client, controller):
    from controller.history import History

    assert client.get("/api/v1/runs/run-a", headers=AUTH).json()["verdict_line"] is None  # not judged yet
    h = History(controller.history_path)
    h.set_run_state("run-a", "done", verdict="pass", line="PASS run-a (1.4.1 vs baseline:1.4.1:v1)")
    h.close()
    one = client.get("/api/v1/runs/run-a", headers=AUTH).json()
    assert (one["verdict"], one["verdict_line"]) == ("pass", "PASS run-a (1.4.1 vs baseline:1.4.1:v1)")


@pytest.mark.slow  # HTML reports drawn by matplotlib: over the fast tier's 2 s budget
def test_report_in_every_format(client):
    j = client.get("/api/v1/runs/run-b/report", headers=AUTH)
    assert j.status_code == 200 and j.headers["content-type"] == "application/json"
    assert j.json()["verdict"] == "regressed" and j.json()["verdict_line"].startswith("REGRESSED run-b")
    md = client.get("/api/v1/runs/run-b/report?format=md", headers=AUTH)
    assert md.text.startswith("# Fleet report run-b") and md.headers["content-type"].startswith("text/markdown")
    html = client.get("/api/v1/runs/run-b/report?format=html", headers=AUTH)
    assert html.headers["content-type"].startswith("text/html") and html.text.count("<svg") == 3
    csv = client.get("/api/v1/runs/run-b/report?format=csv", headers=AUTH)
    import pandas as pd

    rows = pd.read_csv(io.StringIO(csv.text))
    assert len(rows) == 6 * 92 and "change_decode_tps" in rows.columns
    assert client.get("/api/v1/runs/run-a/report", headers=AUTH).json()["verdict"] == "pass"
    r = client.get("/api/v1/runs/run-b/report?baseline=9.9", headers=AUTH)
    assert r.status_code == 400 and "no baseline '9.9'" in r.json()["detail"]
    assert client.get("/api/v1/runs/run-b/report?format=pdf", headers=AUTH).status_code == 422


@pytest.mark.slow  # HTML reports drawn by matplotlib: over the fast tier's 2 s budget
def test_report_headers_say_what_fleetctl_report_prints_besides_the_body(client):
    j = client.get("/api/v1/runs/run-b/report", headers=AUTH)
    for fmt in ("json", "md", "html", "csv"):
        r = client.get(f"/api/v1/runs/latest/report?format={fmt}", headers=AUTH)
        assert (r.headers["X-Fleet-Verdict"], json.loads(r.headers["X-Fleet-Run"])) == ("regressed", "run-b")
        assert json.loads(r.headers["X-Fleet-Verdict-Line"]) == j.json()["verdict_line"]
        assert json.loads(r.headers["X-Fleet-Warnings"]) == []
    lenient = client.get("/api/v1/runs/run-b/report?tolerance=0.5&energy_tolerance=0.5&startup_tolerance=0.5",
                         headers=AUTH)
    assert lenient.headers["X-Fleet-Verdict"] == lenient.json()["verdict"] == "pass"
    for bad in ("energy_tolerance=1.5", "startup_tolerance=0", "tolerance=1"):
        r = client.get(f"/api/v1/runs/run-b/report?{bad}", headers=AUTH)
        assert r.status_code == 422 and bad.split("=")[0] in r.json()["detail"]


def test_create_run_errors_and_dispatch(client, controller):
    post = lambda **body: client.post("/api/v1/runs", headers=AUTH, json=body)  # noqa: E731
    r = post(release="/nope/" + TARBALL)
    assert r.status_code == 400 and "no such release tarball" in r.json()["detail"]
    rel = str(controller.inventory.parent / TARBALL)
    assert post(release=rel, models="qwen9").status_code == 400
    assert post(release=rel, devices="m7").status_code == 400
    assert post(release=rel, baseline="9.9").status_code == 400
    r = post(release=rel, run_id="run-a")
    assert r.status_code == 409 and "already exists" in r.json()["detail"]
    assert post(release=rel, run_id="../escape").status_code == 400
    assert post(release=rel, colour="blue").status_code == 422
    r = post(release=rel, models=["qwen3"], run_id="ci-1")
    assert r.status_code == 201, r.text
    got = r.json()
    assert got["run_id"] == "ci-1" and got["queued"] == 0 and got["release"] == "1.4.1"
    assert got["modules"]["m1"].startswith("module offline")  # no agent in this test: failed at once
    one = client.get("/api/v1/runs/ci-1", headers=AUTH).json()
    assert one["module_states"]["m1"]["state"] == "failed" and one["state"] == "failed"


def test_cancel_and_devices(client):
    r = client.post("/api/v1/runs/run-b/cancel", headers=AUTH)
    assert r.status_code == 202 and r.json() == {"run_id": "run-b", "modules": [f"m{i:02d}" for i in range(6)]}
    assert client.post("/api/v1/runs/nope/cancel", headers=AUTH).status_code == 404
    d = client.get("/api/v1/devices", headers=AUTH).json()
    assert [(x["module"], x["state"], x["reason"]) for x in d] == [("m1", "offline", "no heartbeat ever")]
    assert client.get("/api/v1/devices?devices=m9", headers=AUTH).status_code == 400


def test_broker_down_is_503(tmp_path, controller, monkeypatch):
    from fastapi.testclient import TestClient

    from controller.serve.api import Identity, Role, Tokens, create_app
    from tests.support.cli import closed_port

    down = controller.model_copy(update={"broker_url": f"redis://127.0.0.1:{closed_port()}/0"})
    with TestClient(create_app(down, Tokens.of((TOKEN, Identity("ci", Role.admin))))) as c:
        r = c.get("/api/v1/devices", headers=AUTH)
        assert r.status_code == 503 and "unreachable" in r.json()["detail"]


def test_tokens_file_checks(tmp_path):
    from controller.serve.tokens import TokenError, Tokens

    p = write_tokens(tmp_path / "t", TOKEN)
    assert Tokens.load(p).check(TOKEN) and not Tokens.load(p).check(TOKEN[:-1])
    assert TOKEN not in repr(Tokens.load(p))
    p.chmod(0o644)
    with pytest.raises(TokenError, match="readable by others"):
        Tokens.load(p)
    with pytest.raises(TokenError, match="at least 16"):
        Tokens.load(write_tokens(tmp_path / "s", "short"))
    with pytest.raises(TokenError, match="holds none"):
        Tokens.load(write_tokens(tmp_path / "e"))


def test_webhook_signed_and_retried(receiver):
    from controller.service.webhooks import SIGNATURE_HEADER, Webhooks, verify

    secret = b"s3cret-shared-with-the-receiver"
    receiver.fail_first = 2  # the receiver is briefly down: retried with backoff
    hooks = Webhooks([receiver.url], secret, backoff=0.05, max_backoff=0.2)
    try:
        (fut,) = hooks.notify("run.verdict", {"run_id": "r1", "verdict": "pass"})
        assert fut.result(timeout=10) is True
    finally:
        hooks.close()
    (headers, body), = receiver.got
    assert verify(secret, body, headers[SIGNATURE_HEADER.lower()])
    assert not verify(b"another-secret-of-16-bytes", body, headers[SIGNATURE_HEADER.lower()])
    doc = json.loads(body)
    assert doc["event"] == "run.verdict" and doc["run_id"] == "r1" and doc["sent_at"] > 0


def test_webhook_gives_up_without_blocking(tmp_path):
    import time

    from controller.service.webhooks import Webhooks
    from tests.support.cli import closed_port

    hooks = Webhooks([f"http://127.0.0.1:{closed_port()}/x"], b"0123456789abcdef", attempts=3, backoff=0.01)
    t0 = time.monotonic()
    (fut,) = hooks.notify("run.verdict", {"run_id": "r"})
    assert time.monotonic() - t0 < 0.1  # notify returns at once
    assert fut.result(timeout=10) is False
    hooks.close()


@pytest.mark.slow  # every operation of the schema, 8 examples each: ~4 s, over the fast tier's budget
def test_schemathesis(controller, tmp_path):
    """Every operation against its schema: no server error, documented status codes and bodies.
    (Not "schema-valid data accepted": a release path that does not exist is schema-valid and a 400.)"""
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from schemathesis.core.result import Ok
    from schemathesis.specs.openapi.checks import positive_data_acceptance

    from controller.serve.api import Identity, Role, Tokens, create_app

    app = create_app(controller, Tokens.of((TOKEN, Identity("ci", Role.admin))))
    schema = schemathesis.openapi.from_asgi("/api/v1/openapi.json", app)
    for op in schema.get_all_operations():
        assert isinstance(op, Ok), op.err()  # the schema names this operation in a form schemathesis reads
        operation = op.ok()
        strategy = operation.as_strategy()

        @settings(max_examples=8, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(case=strategy)
        def check(case) -> None:
            case.call_and_validate(headers=AUTH, excluded_checks=[positive_data_acceptance])

        check()


def test_fields_are_bounded_and_never_said_back_whole(client):
    post = lambda body, headers=AUTH: client.post("/api/v1/runs", headers=headers, json=body)  # noqa: E731
    r = post({"release": "R" * 5000})
    assert (r.status_code, r.json()) == (422, {"detail": "release: String should have at most 4096 characters"})
    r = post({"release": "/tmp/" + "C" * 3000 + ".tar.gz"})  # a name too long for the file system: not a 500
    assert r.status_code == 400 and r.json()["detail"].endswith(": no such release tarball"), r.text
    assert len(r.json()["detail"]) < 260 and "C" * 201 not in r.text
    r = post({"release": TARBALL, "devices": "m" * 1000})
    assert r.status_code == 400 and len(r.json()["detail"]) < 500 and "m" * 201 not in r.text, r.text
    assert post({"release": TARBALL, "models": ["qwen3"] * 65}).json()["detail"].startswith("models: ")
    assert post({"release": TARBALL, "run_id": "r" * 129}).json()["detail"].startswith("run_id: ")
    r = client.get("/api/v1/runs/" + "x" * 129, headers=AUTH)
    assert (r.status_code, r.json()["detail"].startswith("run_id: ")) == (422, True), r.text
    r = client.post("/api/v1/runs", headers={**AUTH, "Content-Type": "application/json"}, content=b"{not json")
    assert r.status_code == 422 and isinstance(r.json()["detail"], str), r.text
    big = {"release": TARBALL, "baseline": "b" * 70_000}
    r = post(big)
    assert (r.status_code, r.json()) == (413, {"detail": "request body larger than the limit of 65536 bytes"})
    r = post(big, headers={"Authorization": "Bearer wrong-token-0123456789"})
    assert r.status_code == 401 and r.headers["connection"] == "close"  # the body is not read: the connection ends


def test_the_server_log_clips_every_line():
    import logging

    from controller.serve.guard import MAX_LOG_LINE, ClippedFormatter

    try:
        open("/tmp/" + "N" * 300_000)  # noqa: SIM115 - raises
    except OSError:
        import sys

        record = logging.LogRecord("uvicorn.error", logging.ERROR, __file__, 1, "Exception in ASGI application",
                                   None, sys.exc_info())
    text = ClippedFormatter("%(levelprefix)s %(message)s", use_colors=False).format(record)
    assert "File name too long" in text and "N" * 300 not in text
    assert max(len(line) for line in text.splitlines()) <= MAX_LOG_LINE + 30


def test_the_reports_of_runs_that_just_ended_are_prepared_in_a_thread(controller):
    from controller.history import FrameCache
    from controller.serve.daemon import ReportPreparer
    from controller.service import Session, report

    frames = FrameCache(1 << 30)
    with Session(controller, frames=frames) as s:
        assert s.history().frame_key(["run-b"]) is None  # no column file yet: the rows table only
        preparer = ReportPreparer(s)
        preparer.add(["no-such-run", "run-b"])  # one that cannot be made: left for when it is asked for
        assert preparer.wait(timeout=60) and s.history().frame_key(["run-b"]) is not None
        recalled = frames.recalled
        assert report(s, "run-b").verdict == "regressed" and frames.recalled == recalled + 1
        thread = preparer.thread
        preparer.add(["run-a"])  # the same thread, one run at a time
        assert preparer.wait(timeout=60) and preparer.thread is thread and thread is not None and thread.daemon
    idle = ReportPreparer(Session(controller))  # no frames kept: nothing to prepare, no thread
    idle.add(["run-b"])
    assert idle.thread is None and idle.wait(timeout=0)
