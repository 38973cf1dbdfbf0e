"""The run browser's pages (issue 52) over a filled run history, through the app's TestClient: login by token,
every page route walked with each role (403 naming both where the role is short, like the API's walk), a
``read`` user sees no retry or cancel and is refused when it posts one, filters, the live JSON, a form from
another site refused. Headless Chromium over a real ``fleetctl serve``: tests/api/test_pages_browser.py."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.history import History
from controller.serve.api import Role, Tokens, create_app
from controller.serve.pages.auth import COOKIE, PAGES, PUBLIC_PAGES, page_roles
from controller.settings import ControllerSettings
from tests.support.http_servers import write_user_tokens

USERS = {Role.read: "rita", Role.trigger: "tom", Role.admin: "ada"}
TOKENS = {role: f"{role.value}-token-0123456789abcdef" for role in Role}
OWNED, OTHERS = "run-a", "run-b"
PATH_VALUES = {"run_id": "run-a", "module": "m1", "name": "m1", "release": "1.4.1"}


@pytest.fixture
def pages(controller: ControllerSettings, tmp_path: Path) -> Iterator:
    from fastapi.testclient import TestClient

    path = write_user_tokens(tmp_path / "tokens", ((USERS[r], r.value, TOKENS[r]) for r in Role))
    h = History(controller.history_path)
    try:
        h.set_started_by(OWNED, USERS[Role.trigger])
        h.set_started_by(OTHERS, "someone")
        h.set_run_state(OTHERS, "done", verdict="regressed")
    finally:
        h.close()
    app = create_app(controller, Tokens.load(path))
    with TestClient(app, base_url="http://lab.test") as c:
        yield app, c


def as_(client, role: Role):
    client.cookies.set(COOKIE, TOKENS[role], domain="lab.test", path=PAGES)
    return client


def test_a_page_without_a_token_goes_to_the_login_page_and_a_token_opens_it(pages):
    _, c = pages
    r = c.get(f"{PAGES}/runs?verdict=pass", follow_redirects=False)
    assert (r.status_code, r.headers["location"]) == (303, f"{PAGES}/login?next=/ui/runs%3Fverdict%3Dpass")
    bad = c.post(f"{PAGES}/login", data={"token": "not-a-token-at-all", "next": "/ui/runs"})
    assert bad.status_code == 401 and "not in this controller" in bad.text
    r = c.post(f"{PAGES}/login", data={"token": TOKENS[Role.read], "next": "https://evil.example/x"},
               follow_redirects=False)
    assert (r.status_code, r.headers["location"]) == (303, f"{PAGES}/runs")  # never another site
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/ui" in cookie
    page = c.get(f"{PAGES}/runs")
    assert page.status_code == 200 and "run-a" in page.text and "rita (read)" in page.text
    assert TOKENS[Role.read] not in page.text
    assert "nonce-" in page.headers["content-security-policy"]
    # the API knows nothing of the cookie
    assert c.get("/api/v1/runs").status_code == 401


def test_every_page_route_answers_each_role_as_declared(pages):
    app, c = pages
    from controller.serve.access import api_routes

    seen = 0
    for route in api_routes(app.routes):  # its included routers' routes, as included
        assert route.path is not None, route  # an API route has one
        if not route.path.startswith(PAGES) or route.path in PUBLIC_PAGES:
            continue
        (check,) = {x.role: x for x in page_roles(route)}.values()
        for method in route.methods or ():
            url = route.path.format(**PATH_VALUES)
            for role in Role:
                r = as_(c, role).request(method, url, follow_redirects=False)
                if role.allows(check.role):
                    assert r.status_code not in (401, 403), (method, url, role, r.status_code, r.text[:300])
                else:
                    assert r.status_code == 403, (method, url, role)
                    assert f"needs role {check.role.value}; user {USERS[role]} has role {role.value}" in r.text
            seen += 1
    assert seen == 12


def test_a_read_user_sees_no_retry_or_cancel_and_is_refused_when_it_posts_one(pages):
    _, c = pages
    page = as_(c, Role.read).get(f"{PAGES}/runs/{OWNED}")
    assert page.status_code == 200 and "<button>Retry</button>" not in page.text and "Cancel" not in page.text
    r = c.post(f"{PAGES}/runs/{OWNED}/cancel", follow_redirects=False)
    assert r.status_code == 403 and "needs role trigger; user rita has role read" in r.text
    # tom may act on his own run only; ada on anyone's
    assert "<button>Retry</button>" in as_(c, Role.trigger).get(f"{PAGES}/runs/{OWNED}").text
    other = c.get(f"{PAGES}/runs/{OTHERS}")
    assert "<button>Retry</button>" not in other.text and "need role admin" in other.text
    r = c.post(f"{PAGES}/runs/{OTHERS}/cancel", follow_redirects=False)
    assert r.status_code == 403 and "cancelling run run-b (started by user someone) needs role admin" in r.text
    assert "<button>Retry</button>" in as_(c, Role.admin).get(f"{PAGES}/runs/{OTHERS}").text
    r = c.post(f"{PAGES}/runs/{OTHERS}/cancel", follow_redirects=False)
    assert (r.status_code, r.headers["location"]) == (303, f"{PAGES}/runs/{OTHERS}")
    # a form posted from another site's page: refused whatever the role
    r = c.post(f"{PAGES}/runs/{OTHERS}/cancel", headers={"Origin": "https://evil.example"}, follow_redirects=False)
    assert r.status_code == 403 and "another site" in r.text


def test_the_runs_filters(pages):
    _, c = pages
    as_(c, Role.read)

    def listed(query: str) -> list[str]:
        r = c.get(f"{PAGES}/runs?{query}")
        assert r.status_code == 200, r.text
        return re.findall(r'<th scope="row"><a href="/ui/runs/([^"]+)"', r.text)

    assert listed("") == ["run-b", "run-a"]
    assert listed("verdict=regressed") == ["run-b"]
    assert listed("user=tom") == ["run-a"]
    assert listed("release=1.4.1&module=m03") == ["run-b", "run-a"]
    assert listed("module=m9") == [] and listed("since=2000-01-01&until=2000-01-02") == []
    assert listed("limit=1") == ["run-b"] and "Older runs" in c.get(f"{PAGES}/runs?limit=1").text
    r = c.get(f"{PAGES}/runs?since=yesterday")
    assert r.status_code == 400 and "since: &#39;yesterday&#39; is not a date" in r.text


def test_the_pages_show_the_services_data(pages):
    _, c = pages
    as_(c, Role.read)
    run = c.get(f"{PAGES}/runs/{OTHERS}")
    assert 'id="run-verdict" class="regressed"' in run.text and "/links/runs/run-b/report.html?expires=" in run.text
    assert c.get(f"{PAGES}/runs/nope").status_code == 404
    live = c.get(f"{PAGES}/runs/{OTHERS}/live").json()
    assert live["cells"]["run-verdict"] == {"text": "regressed", "cls": "regressed"} and live["done"] is True
    mods = c.get(f"{PAGES}/modules")
    assert mods.status_code == 200 and "<th scope=\"row\"><a href=\"/ui/modules/m1\">m1</a></th>" in mods.text
    assert "never" in mods.text  # no golden check yet
    assert "offline" in c.get(f"{PAGES}/modules/m1").text  # no heartbeat ever
    nope = c.get(f"{PAGES}/modules/nope")
    assert nope.status_code == 404 and "no module &#39;nope&#39;" in nope.text
    rel = c.get(f"{PAGES}/releases")
    assert rel.status_code == 200 and '<a href="/ui/releases/1.4.1">1.4.1</a>' in rel.text
    one = c.get(f"{PAGES}/releases/1.4.1")
    assert one.status_code == 200 and "run-a" in one.text and "Trend per key" in one.text
    assert c.get(f"{PAGES}/queue").status_code == 200


def test_a_page_route_without_a_role_is_refused_at_start():
    from fastapi import FastAPI

    from controller.serve.pages.auth import undeclared_pages

    app = FastAPI()

    @app.get(f"{PAGES}/forgotten")
    def forgotten() -> dict[str, str]:
        return {}

    assert undeclared_pages(app.routes) == [f"GET {PAGES}/forgotten"]


def test_webhooks_and_validate_name_the_runs_page_when_serve_url_is_set(controller):
    from controller.serve.api import summary_of
    from controller.serve.wire import run_page
    from controller.service import Judgement, Session

    assert run_page(None, "run-a") is None and run_page("http://lab:8080/", "a b") == "http://lab:8080/ui/runs/a%20b"
    with Session(controller) as s:
        assert "page_url" not in summary_of(s, Judgement("run-a", "pass", "PASS run-a", "done"))
    with Session(controller.model_copy(update={"serve_url": "http://lab:8080"})) as s:
        got = summary_of(s, Judgement("run-a", "pass", "PASS run-a", "done"))
    assert got["page_url"] == "http://lab:8080/ui/runs/run-a"
    with pytest.raises(ValueError, match="serve_url"):
        ControllerSettings(serve_url="lab:8080")


def test_the_releases_read_the_kept_change_points_computed_off_the_page(pages):
    """No findings kept: the page says they are being computed, a thread computes and keeps them; the next view
    reads them (kept, current: no note)."""
    from controller.serve.pages import data

    _, c = pages
    as_(c, Role.read)
    first = c.get(f"{PAGES}/releases/1.4.1")
    assert "being computed" in first.text
    assert data.KEPT.thread is not None
    data.KEPT.thread.join(timeout=60)
    again = c.get(f"{PAGES}/releases/1.4.1")
    assert "being computed" not in again.text and "No change points across the 1 release(s)" in again.text


def test_every_page_is_plain_html_in_reading_order(pages):
    """For a screen reader: a language, a skip link first, the navigation before the one <h1> in <main>, every table
    with a caption and every header cell scoped; no script or style from elsewhere (the CSP allows none)."""
    from html.parser import HTMLParser

    class Seen(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.tags: list[tuple[str, dict[str, str | None]]] = []

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            self.tags.append((tag, dict(attrs)))

    _, c = pages
    as_(c, Role.admin)
    for path in ("runs", "runs/run-b", "modules", "modules/m1", "releases", "releases/1.4.1", "queue"):
        r = c.get(f"{PAGES}/{path}")
        assert r.status_code == 200, path
        seen = Seen()
        seen.feed(r.text)
        names = [t for t, _ in seen.tags]
        assert seen.tags[0] == ("html", {"lang": "en"}), path
        first_link = next(a for t, a in seen.tags if t == "a")
        assert first_link == {"class": "skip", "href": "#main"}, path
        assert names.index("nav") < names.index("main") < names.index("h1") and names.count("h1") == 1, path
        assert names.count("table") == names.count("caption"), path
        assert all(a.get("scope") in ("col", "row") for t, a in seen.tags if t == "th"), path
        assert all("src" not in a for t, a in seen.tags if t in ("script", "img")), path
        assert "default-src 'none'" in r.headers["content-security-policy"], path


def test_a_modules_golden_check_and_its_drift_make_it_need_attention(pages, controller):
    from controller.history.records import GOLDEN_DRIFT_EVENT
    from controller.serve.pages.data import health_of

    h = History(controller.history_path)
    try:
        h.create_run("gold-1", release="1.4.1", models=("qwen3",), modules=("m1",), note="golden check 1.4.1",
                     state="done")
        h.add_module_event("m1", f"{GOLDEN_DRIFT_EVENT}: decode_tps 6.1 % below its golden history")
    finally:
        h.close()
    _, c = pages
    as_(c, Role.read)
    row = c.get(f"{PAGES}/modules").text.split('href="/ui/modules/m1"', 1)[1].split("</tr>", 1)[0]
    assert 'href="/ui/runs/gold-1"' in row and "drift" in row
    assert "needs attention" in row  # no heartbeat (offline) comes first; the drift is said in its own column
    page = c.get(f"{PAGES}/modules/m1").text
    assert "gold-1" in page and "drift decode_tps 6.1 % below its golden history" in page
    assert health_of("idle", "", "decode_tps 6.1 % below") == ("needs attention",
                                                              "golden check: decode_tps 6.1 % below")
    assert health_of("bad", "3 failed runs in a row", None) == ("bad", "3 failed runs in a row")
    assert health_of("idle", "", None) == ("ok", "")
