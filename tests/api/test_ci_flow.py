"""A CI system's view: ``fleetctl serve --api-port`` on a simulated fleet (embedded broker, one
module, one model key, time scale 1000); a stdlib-only script triggers a run over HTTP, giving
the release as a URL (a local HTTP server serves the built tarball) with its sha256, and polls
it to a verdict; the webhook reaches a test HTTP server with a valid signature; the HTML report
opens in headless Chromium from a signed link the CI asked for (no header), without errors; neither
tokens nor link signatures are in the service's output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.cli.demo import reference_rows
from controller.service import Session
from simulator.ports import free_port
from tests.browser import chromium_page
from tests.support.http_servers import TOKEN, Receiver, ReleaseServer, wait_port, write_tokens
from tests.support.lab import make_lab
from tests.support.procs import stop_group

pytestmark = pytest.mark.slow

CI_SCRIPT = r"""
import json, os, sys, time, urllib.request
api, token = os.environ["API"], os.environ["TOKEN"]
def call(method, path, body=None):
    req = urllib.request.Request(api + path, method=method, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())
run = call("POST", "/runs", {"release": os.environ["RELEASE"], "sha256": os.environ["SHA256"], "models": ["qwen3"],
                             "devices": "all"})
print("run", run["run_id"], "queued", run["queued"], flush=True)
end = time.time() + 150
while time.time() < end:
    r = call("GET", "/runs/" + run["run_id"])
    if r["verdict"] is not None:
        break
    time.sleep(0.5)
else:
    sys.exit("no verdict in time")
rep = call("GET", "/runs/" + run["run_id"] + "/report?format=json")
print("verdict", r["verdict"], rep["verdict_line"])
sys.exit(0 if r["verdict"] == "pass" else 1)
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    from simulator import build_release

    base = tmp_path_factory.mktemp("ci")
    links: list[str] = []  # signed links handed out: their signatures must never reach the service's output
    release = build_release(base / "release", time_scale=1000.0, noise=0.0, seed=3)
    lab = make_lab(base / "lab", ("filesystem://", None), 1)
    with Session(lab.settings) as s:
        s.history().add_baseline(release.version, reference_rows(), "simulator reference tables")
    lab.start()
    receiver = Receiver(fail_first=1)  # the first delivery meets a 503: the webhook is retried
    releases = ReleaseServer(release.path.parent)
    secret = base / "webhook.key"
    secret.write_text("a-shared-webhook-secret-0123456789\n")
    secret.chmod(0o600)
    port = free_port()
    exe = Path(sys.executable).parent / "fleetctl"
    env = {**lab.env(), "FLEET_CONTROLLER_METRICS_PORT": "0",
           "FLEET_RELEASE_URL_HOSTS": '["127.0.0.1"]'}  # the test release server is on loopback
    proc = subprocess.Popen([str(exe), "serve", "--interval", "0.3", "--api-port", str(port), "--tokens",
                             str(write_tokens(base / "tokens", TOKEN)), "--webhook", receiver.url,
                             "--webhook-secret-file", str(secret)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_port(port, proc)
        yield {"api": f"http://127.0.0.1:{port}/api/v1", "release": release, "receiver": receiver, "lab": lab,
               "secret": secret.read_bytes().strip(), "proc": proc, "releases": releases, "links": links}
    finally:
        stop_group(proc)
        receiver.close()
        releases.close()
        lab.stop()
        out, err = proc.communicate(timeout=10)
        assert TOKEN not in out + err  # tokens are never logged, nor link signatures
        assert [u for u in links if u.rsplit("sig=", 1)[1] in out + err] == []


@pytest.fixture(scope="module")
def ci_run(served) -> tuple[subprocess.CompletedProcess, float]:
    """The CI script's validation over HTTP, once per module: (the script's result, its wall seconds).
    The browser test reads this run's report, so it holds on its own (also run alone)."""
    rel = served["release"]
    env = {**os.environ, "API": served["api"], "TOKEN": TOKEN, "RELEASE": f"{served['releases'].url}/{rel.path.name}",
           "SHA256": rel.sha256}
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", CI_SCRIPT], env=env, capture_output=True, text=True, timeout=200)
    return r, time.monotonic() - t0


def test_ci_script_runs_a_validation_over_http(served, ci_run):
    rel = served["release"]
    r, took = ci_run
    # the script's exit code is the verdict's (0 pass, 1 regressed: time scale 1000 bends the timings)
    assert r.returncode in (0, 1), r.stdout + r.stderr
    assert "queued 1" in r.stdout and " PASS " in r.stdout or " REGRESSED " in r.stdout, r.stdout
    assert took < 150
    run_id = r.stdout.split()[1]
    assert served["releases"].paths == [f"/{rel.path.name}"]  # fetched once, by the controller
    # the webhook: retried after the 503, signed with the shared secret
    from controller.service.webhooks import SIGNATURE_HEADER, verify

    rec = served["receiver"]
    assert rec.arrived.wait(30), "no webhook delivery"
    headers, body = rec.got[0]
    assert verify(served["secret"], body, headers[SIGNATURE_HEADER.lower()])
    doc = rec.json()
    verdict = r.stdout.split("verdict ", 1)[1].split()[0]
    assert doc["event"] == "run.verdict" and doc["run_id"] == run_id and doc["verdict"] == verdict
    assert doc["verdict_line"].startswith(f"{verdict.upper()} {run_id}")
    assert doc["module_states"]["sim-01"]["state"] == "done" and doc["rows"] == 11


@pytest.mark.browser
def test_html_report_from_a_signed_link_in_chromium(served, ci_run, tmp_path):
    run_id = ci_run[0].stdout.split()[1]
    plain = served["api"] + f"/runs/{run_id}/report?format=html"
    req = urllib.request.Request(served["api"] + f"/runs/{run_id}/report/link", method="POST",
                                 headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        url = json.loads(r.read())["url"]
    served["links"].append(url)
    with chromium_page() as (page, seen):
        denied = page.goto(plain)
        assert denied is not None and denied.status == 401  # the API's route wants the bearer header
        seen.errors.clear()
        resp = page.goto(url, wait_until="load")
        assert resp is not None and resp.status == 200
        assert page.title() == f"Fleet report {run_id}"
        assert "PASS" in page.inner_text("p.verdict") or "REGRESSED" in page.inner_text("p.verdict")
        assert page.locator("svg").count() == 3
        page.screenshot(path=str(tmp_path / "api-report.png"), full_page=True)
        altered = page.goto(url.replace("sig=", "sig=0"))
        assert altered is not None and altered.status == 403
    assert seen.errors == ["Failed to load resource: the server responded with a status of 403 (Forbidden)"]
    assert {u for u in seen.requested if not u.endswith("/favicon.ico")} == {plain, url, url.replace("sig=", "sig=0")}
    assert (tmp_path / "api-report.png").stat().st_size > 20_000
