"""Signed, expiring links to a run's HTML report (a browser opens them without a bearer header), and
Swagger UI at /docs from the packaged files: over the app under a TestClient, with a real run history.
(The same in headless Chromium: tests/api/test_browser.py.)"""

from __future__ import annotations

import stat
import time
from urllib.parse import parse_qs, urlsplit

import pytest

from controller.serve import links
from tests.support.http_servers import AUTH

SECRET = b"0123456789abcdef" * 4


def mint(client, run: str = "run-b", **query) -> dict:
    r = client.post(f"/api/v1/runs/{run}/report/link", headers=AUTH, params=query)
    assert r.status_code == 201, r.text
    return r.json()


@pytest.mark.slow  # over the fast tier's 2 s CPU budget with a neighbour on the other core
def test_a_minted_link_opens_the_report_without_a_header(client):
    t0 = int(time.time())
    got = mint(client, "latest")
    assert got["run_id"] == "run-b"  # 'latest' is resolved when the link is made: the link stays on that run
    assert t0 + links.DEFAULT_TTL <= got["expires_at"] <= int(time.time()) + links.DEFAULT_TTL
    url = urlsplit(got["url"])
    assert (url.scheme, url.netloc, url.path) == ("http", "testserver", "/links/runs/run-b/report.html")
    assert set(parse_qs(url.query)) == {"expires", "sig"}
    r = client.get(f"{url.path}?{url.query}")
    assert r.status_code == 200 and r.headers["content-type"] == "text/html; charset=utf-8"
    assert r.text.count("<svg") == 3 and "<title>Fleet report run-b" in r.text
    assert (r.headers["cache-control"], r.headers["referrer-policy"]) == ("private, no-store", "no-referrer")


def test_minting_needs_a_token_and_a_known_run_and_a_bounded_ttl(client):
    assert client.post("/api/v1/runs/run-b/report/link").status_code == 401
    r = client.post("/api/v1/runs/nope/report/link", headers=AUTH)
    assert r.status_code == 404 and "no run 'nope'" in r.json()["detail"]
    assert mint(client, ttl=60)["expires_at"] <= int(time.time()) + 60
    for ttl in (59, links.MAX_TTL + 1):
        r = client.post("/api/v1/runs/run-b/report/link", headers=AUTH, params={"ttl": ttl})
        assert r.status_code == 422 and r.json()["detail"].startswith("ttl: Input should be")


def test_an_altered_or_expired_link_is_refused(client, controller):
    url = urlsplit(mint(client)["url"])
    q = {k: v[0] for k, v in parse_qs(url.query).items()}
    path = url.path
    other_sig = q["sig"][:-1] + ("0" if q["sig"][-1] != "0" else "1")
    bad_sig = "this link is not valid: its signature does not match (altered, or another server's)"
    cases = [
        (f"{path}?expires={q['expires']}&sig={other_sig}", bad_sig),
        (f"{path}?expires={int(q['expires']) + 1}&sig={q['sig']}", bad_sig),  # a later expiry, same signature
        (f"/links/runs/run-a/report.html?expires={q['expires']}&sig={q['sig']}", bad_sig),  # another run
        (f"{path}?expires={q['expires']}&sig=", bad_sig),
    ]
    secret = links.load_secret(controller.data_dir)
    past = int(time.time()) - 1
    cases.append((f"{path}?expires={past}&sig={links.signature(secret, path, past)}",
                  "this link has expired: ask for a new one"))
    far = int(time.time()) + links.MAX_TTL + 3600  # signed with the secret, but beyond the bound
    cases.append((f"{path}?expires={far}&sig={links.signature(secret, path, far)}",
                  f"this link expires more than {links.MAX_TTL} seconds from now: refused"))
    for target, detail in cases:
        r = client.get(target)
        assert (r.status_code, r.json()) == (403, {"detail": detail}), target
        assert q["sig"] not in r.text
    assert client.get(f"{path}?sig={q['sig']}").status_code == 422  # no expiry
    r = client.get(f"{path}?expires=soon&sig={q['sig']}")
    assert r.status_code == 422 and q["sig"] not in r.text


def test_a_link_opens_no_other_route(client):
    url = urlsplit(mint(client)["url"])
    for path in ("/api/v1/runs/run-b/report", "/api/v1/runs", "/api/v1/runs/run-b", "/api/v1/devices"):
        r = client.get(f"{path}?{url.query}&format=html")
        assert r.status_code == 401, path
    r = client.post(f"/api/v1/runs/run-b/cancel?{url.query}")
    assert r.status_code == 401
    assert client.get(f"/links/runs/run-b/report.json?{url.query}").status_code == 404


def test_the_secret_is_made_once_0600_and_refused_when_readable_by_others(tmp_path):
    first = links.load_secret(tmp_path / "data")
    key = tmp_path / "data" / links.SECRET_FILE
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and len(first) == 64
    assert links.load_secret(tmp_path / "data") == first
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == [links.SECRET_FILE]  # no temp file left
    key.chmod(0o640)
    with pytest.raises(links.LinkSecretError) as exc:
        links.load_secret(tmp_path / "data")
    assert str(exc.value) == f"{key}: the link secret is readable by others (chmod 600 {key})"
    key.chmod(0o600)
    key.write_text("short\n")
    with pytest.raises(links.LinkSecretError, match="shorter than 64 characters"):
        links.load_secret(tmp_path / "data")


def test_signing_is_hmac_sha256_over_path_and_expiry():
    import hashlib
    import hmac

    link = links.make_link(SECRET, "run-x", now=1000.5, ttl=3600)
    assert link == links.Link(
        "/links/runs/run-x/report.html?expires=4600&sig="
        + hmac.new(SECRET, b"/links/runs/run-x/report.html\n4600", hashlib.sha256).hexdigest(), 4600)
    links.check_link(SECRET, "/links/runs/run-x/report.html", 4600, link.path.rsplit("=", 1)[1], now=4599)
    with pytest.raises(links.LinkError, match="expired"):
        links.check_link(SECRET, "/links/runs/run-x/report.html", 4600, link.path.rsplit("=", 1)[1], now=4600)
    with pytest.raises(links.LinkError, match="ttl must be 60..604800 seconds"):
        links.make_link(SECRET, "run-x", now=0, ttl=links.MAX_TTL + 1)


def test_swagger_ui_is_served_from_the_package_without_a_token(client):
    page = client.get("/docs")
    assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
    assert "http" not in page.text.replace("http-equiv", "")  # no absolute URL: nothing from a CDN
    for asset in ("/docs/static/swagger-ui-bundle.js", "/docs/static/swagger-ui.css", "/docs/static/favicon.png"):
        assert f'"{asset}"' in page.text
        r = client.get(asset)
        assert r.status_code == 200 and len(r.content) > 500, asset
    assert "url: '/api/v1/openapi.json'" in page.text
