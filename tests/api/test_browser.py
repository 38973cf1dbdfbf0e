"""The API in a browser: the HTTP API served by uvicorn in a thread of this process (as ``fleetctl
serve`` does), over a real run history, opened in headless Chromium: a signed link opens the report
without any header, an altered or expired one does not, nor does it open another route; Swagger UI
at /docs renders every operation from the packaged files, asks for nothing outside the server, and
its Authorize button carries the token to "Try it out"."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from controller.serve import links
from controller.service import Session
from controller.settings import ControllerSettings
from simulator.ports import free_port
from tests.browser import chromium_page
from tests.support.http_servers import TOKEN, write_tokens

pytestmark = [pytest.mark.slow, pytest.mark.browser]


@pytest.fixture
def api(controller: ControllerSettings, tmp_path: Path) -> Iterator[str]:
    from controller.serve.daemon import start_api

    settings = controller.model_copy(update={"api_port": free_port(),
                                             "api_tokens_file": write_tokens(tmp_path / "tokens", TOKEN)})
    with Session(settings) as s:
        server = start_api(s)
        assert server is not None
        try:
            yield f"http://127.0.0.1:{settings.api_port}"
        finally:
            server.stop()


def mint(api: str, run: str, ttl: int = links.DEFAULT_TTL) -> str:
    req = urllib.request.Request(f"{api}/api/v1/runs/{run}/report/link?ttl={ttl}", method="POST",
                                 headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return str(json.loads(r.read())["url"])


def test_a_signed_link_opens_the_report_in_chromium_without_a_header(api):
    url = mint(api, "run-b")
    with chromium_page() as (page, seen):
        resp = page.goto(url, wait_until="load")
        assert resp is not None and resp.status == 200
        assert "authorization" not in resp.request.all_headers()
        assert page.title() == "Fleet report run-b"
        assert page.inner_text("p.verdict").startswith("REGRESSED run-b")
        assert page.locator("svg").count() == 3
    assert seen.errors == []
    assert {u for u in seen.requested if not u.endswith("/favicon.ico")} == {url}


def test_an_altered_or_expired_link_or_another_route_is_refused_in_chromium(api, controller):
    url = urlsplit(mint(api, "run-b"))
    q = {k: v[0] for k, v in parse_qs(url.query).items()}
    flipped = q["sig"][:-1] + ("0" if q["sig"][-1] != "0" else "1")
    secret = links.load_secret(controller.data_dir)
    past = int(time.time()) - 5
    path = url.path
    refused = {
        f"{api}{path}?expires={q['expires']}&sig={flipped}": 403,  # altered signature
        f"{api}{path}?expires={int(q['expires']) + 60}&sig={q['sig']}": 403,  # altered expiry
        f"{api}/links/runs/run-a/report.html?{url.query}": 403,  # the same signature on another run
        f"{api}{path}?expires={past}&sig={links.signature(secret, path, past)}": 403,  # expired
        f"{api}/api/v1/runs/run-b/report?format=html&{url.query}": 401,  # the API's own routes want the bearer
        f"{api}/api/v1/runs?{url.query}": 401,
    }
    with chromium_page() as (page, _):
        for target, status in refused.items():
            resp = page.goto(target)
            assert resp is not None and resp.status == status, target
            assert q["sig"] not in page.content()


def test_swagger_ui_renders_every_operation_from_the_server_alone(api):
    with urllib.request.urlopen(f"{api}/api/v1/openapi.json", timeout=30) as r:
        schema = json.loads(r.read())
    operations = sorted((m.upper(), p) for p, item in schema["paths"].items() for m in item)
    assert len(operations) == 12  # with GET /api/v1/trend, the three reservation routes and the power route
    with chromium_page() as (page, seen):
        resp = page.goto(f"{api}/docs", wait_until="networkidle")
        assert resp is not None and resp.status == 200
        page.wait_for_selector(".opblock", timeout=20_000)
        shown = sorted(zip(page.locator(".opblock-summary-method").all_inner_texts(),
                           (p.replace("\u200b", "") for p in page.locator(".opblock-summary-path").all_inner_texts()),
                           strict=True))
        assert shown == operations
        assert page.locator(".info .title").inner_text().startswith("m1000-fleet controller")
        # Authorize with the token, then "Try it out" on GET /api/v1/runs: the call carries it
        page.click("button.authorize")
        page.fill(".modal-ux input", TOKEN)
        page.click(".modal-ux button.authorize")
        page.click(".modal-ux button.btn-done")
        block = page.locator(".opblock-get", has=page.locator('[data-path="/api/v1/runs"]'))
        block.locator(".opblock-summary").click()
        block.locator("button.try-out__btn").click()
        block.locator("button.execute").click()
        status = block.locator(".live-responses-table .response .response-col_status")
        status.wait_for(timeout=20_000)
        assert status.inner_text().strip() == "200"
        body = block.locator(".live-responses-table .response .response-col_description").inner_text()
        assert '"run_id": "run-b"' in body
    assert seen.errors == [] and seen.failed == []
    assert seen.requested and all(u.startswith(api + "/") for u in seen.requested), seen.requested
    assert f"{api}/api/v1/runs?limit=20" in seen.requested
