"""``POST /api/v1/runs`` with a release URL: the controller downloads it from a real local HTTP
server (stdlib, in a thread) into ``<data_dir>/releases/<sha256>/``, then dispatches as for a
path. Every failure is one line and 422, and leaves nothing half-downloaded behind."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.service.release_url import NOT_SERVED
from controller.settings import ControllerSettings
from tests.support.cli import TARBALL, closed_port
from tests.support.http_servers import AUTH, TOKEN, ReleaseServer, write_tokens


@pytest.fixture
def served(controller: ControllerSettings) -> Iterator[ReleaseServer]:
    s = ReleaseServer(controller.inventory.parent)  # holds TARBALL (a few bytes: no agent unpacks it here)
    yield s
    s.close()


LOCAL = ("127.0.0.1",)  # the test release server is on loopback: listed in release_url_hosts, as a lab would


def api(settings: ControllerSettings, tmp_path: Path, hosts: tuple[str, ...] | None = LOCAL):
    from fastapi.testclient import TestClient

    from controller.serve.api import Tokens, create_app

    if hosts is not None:
        settings = settings.model_copy(update={"release_url_hosts": hosts})
    return TestClient(create_app(settings, Tokens.load(write_tokens(tmp_path / "tokens", TOKEN))))


def leftovers(settings: ControllerSettings) -> list[str]:
    root = settings.data_dir / "releases"
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def test_a_release_url_is_downloaded_checked_and_dispatched(controller, served, tmp_path, caplog):
    data = (controller.inventory.parent / TARBALL).read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    caplog.set_level(logging.INFO)
    with api(controller, tmp_path) as c:
        r = c.post("/api/v1/runs", headers=AUTH, json={"release": f"{served.url}/{TARBALL}?sig=s3cr3t-token",
                                                        "sha256": sha.upper(), "models": ["qwen3"], "run_id": "u-1"})
        assert r.status_code == 201, r.text
        assert r.json()["sha256"] == sha and r.json()["release"] == "1.4.1"
        kept = controller.data_dir / "releases" / sha / TARBALL
        assert kept.read_bytes() == data and leftovers(controller) == [sha, f"{sha}/{TARBALL}"]
        assert c.get("/api/v1/runs/u-1", headers=AUTH).json()["tarball"] == str(kept.resolve())
        # without a Content-Length (the body ends with the connection), and without a sha256
        r = c.post("/api/v1/runs", headers=AUTH, json={"release": f"{served.url}/stream/{TARBALL}",
                                                        "models": ["qwen3"]})
        assert r.status_code == 201 and r.json()["sha256"] == sha
    assert "s3cr3t-token" not in caplog.text  # the query string (a signed URL's token) is never logged
    assert f"release downloaded from {served.url}/{TARBALL}:" in caplog.text


def test_unusable_release_urls_are_422_in_one_line_and_leave_nothing(controller, served, tmp_path, caplog,
                                                                     monkeypatch):
    monkeypatch.setattr("controller.service.releases.RELEASE_DOWNLOAD_MAX_BYTES", 5)
    with api(controller, tmp_path) as c:
        def post(release: str, **kw: object) -> tuple[int, str]:
            r = c.post("/api/v1/runs", headers=AUTH, json={"release": release, "models": ["qwen3"], **kw})
            detail = r.json()["detail"]
            assert isinstance(detail, str) and "\n" not in detail, detail
            return r.status_code, detail

        ok = f"{served.url}/{TARBALL}"
        # refused before a byte is asked for
        for url, said in [(f"http://ci:hunter2-pw@127.0.0.1:1/{TARBALL}", "credentials in the URL are refused"),
                          (f"ftp://127.0.0.1/{TARBALL}", "scheme 'ftp' is not supported"),
                          (f"{served.url}/release.tar.gz", "must end in a release tarball name"),
                          ("https:///" + TARBALL, "no host")]:
            code, detail = post(url)
            assert (code, said in detail) == (422, True), detail
            assert "hunter2" not in detail
        assert post(ok, models=["qwen9"])[0] == 400  # the other checks come before the download
        bad_sha = c.post("/api/v1/runs", headers=AUTH, json={"release": ok, "sha256": "xyz"})
        assert bad_sha.status_code == 422  # not 64 hex digits: refused by the schema
        assert served.paths == []
        # asked for, and refused
        code, detail = post(f"{served.url}/stream/{TARBALL}")
        assert code == 422 and "more than the limit of 5 bytes" in detail, detail
        code, detail = post(ok)
        assert code == 422 and f"{len((controller.inventory.parent / TARBALL).read_bytes())} bytes, more than" \
            in detail, detail
    monkeypatch.undo()  # the default limit again
    with api(controller, tmp_path) as c:
        post_ok = lambda **b: c.post("/api/v1/runs", headers=AUTH, json={"models": ["qwen3"], **b})  # noqa: E731
        r = post_ok(release=f"{served.url}/{TARBALL}", sha256="0" * 64)
        assert r.status_code == 422 and "does not match the expected 000000000000" in r.json()["detail"]
        r = post_ok(release=f"{served.url}/missing/SGLang-MUSA-M1000-M1000_9.9.9_sglang.tar.gz")
        assert r.status_code == 422 and r.json()["detail"].endswith("HTTP 404 Not Found"), r.text
        r = post_ok(release=f"http://127.0.0.1:{closed_port()}/{TARBALL}")
        assert r.status_code == 422 and r.json()["detail"].endswith(NOT_SERVED), r.text
        r = post_ok(release=f"{served.url}/redirect-file/{TARBALL}")
        assert r.status_code == 422 and "redirected to an unusable URL" in r.json()["detail"], r.text
        # a path with a sha256 is checked too
        r = post_ok(release=str(controller.inventory.parent / TARBALL), sha256="f" * 64)
        assert r.status_code == 422 and "does not match" in r.json()["detail"]
    assert leftovers(controller) == []  # nothing half-downloaded, no checksum-failed file kept
    assert "hunter2" not in caplog.text


def test_release_urls_go_only_where_the_policy_allows(controller, served, tmp_path, caplog):
    """Loopback only when release_url_hosts lists it; link-local and metadata never, by name, by
    redirect or as an IPv4-mapped IPv6 address; each refused as a closed port is, the reason logged."""
    caplog.set_level(logging.INFO)
    port = served.url.rsplit(":", 1)[1]
    cases = [(None, f"{served.url}/{TARBALL}"),  # loopback, no allow-list
             (("releases.example.org",), f"{served.url}/{TARBALL}"),  # an allow-list without it
             (LOCAL, f"http://[::ffff:169.254.169.254]/{TARBALL}"),
             (("169.254.0.0/16",), f"http://169.254.169.254/{TARBALL}"),  # link-local: not even when listed
             (LOCAL, f"{served.url}/redirect-metadata/{TARBALL}"),
             (("localhost",), f"http://localhost:{closed_port()}/{TARBALL}")]
    for hosts, url in cases:
        with api(controller, tmp_path, hosts) as c:
            r = c.post("/api/v1/runs", headers=AUTH, json={"release": url, "models": ["qwen3"]})
            assert r.status_code == 422 and r.json()["detail"].endswith(f": {NOT_SERVED}"), (hosts, url, r.text)
    assert served.paths == [f"/redirect-metadata/{TARBALL}"]  # asked once: by the allowed request that redirected
    assert "127.0.0.1 is loopback (list it in release_url_hosts to allow it)" in caplog.text
    assert "localhost (127.0.0.1) is not in release_url_hosts" not in caplog.text  # listed by name: allowed
    assert "169.254.169.254 is a link-local or cloud metadata address" in caplog.text
    with api(controller, tmp_path, ("LOCALHOST",)) as c:  # a name in the list: what it resolves to is allowed
        r = c.post("/api/v1/runs", headers=AUTH, json={"release": f"http://localhost:{port}/{TARBALL}",
                                                        "models": ["qwen3"]})
        assert r.status_code == 201, r.text


def test_the_policy_refuses_by_address_and_port():
    import ipaddress

    from controller.service.release_url import UrlPolicy, parse_allow_list, refusal

    ip = ipaddress.ip_address
    broker = UrlPolicy(local_ports=frozenset({6379, 8080}), endpoints=frozenset({(ip("10.0.0.5"), 6379)}),
                       own=frozenset({ip("192.168.1.10")}))
    assert refusal("h", ip("10.0.0.5"), 6379, broker) == "10.0.0.5:6379 is the broker's or this controller's own port"
    assert refusal("h", ip("10.0.0.5"), 80, broker) is None  # the broker's host serving releases on another port
    assert "own port" in (refusal("h", ip("127.0.0.2"), 8080, broker) or "")
    assert "an address of this controller" in (refusal("h", ip("192.168.1.10"), 80, broker) or "")
    assert "link-local" in (refusal("h", ip("fe80::1"), 80, broker) or "")
    assert "metadata" in (refusal("h", ip("fd00:ec2::254"), 80, broker) or "")
    assert "not a unicast" in (refusal("h", ip("0.0.0.0"), 80, broker) or "")
    allow, nets = parse_allow_list(["Releases.Lab.", "127.0.0.1", "[::1]", "10.1.0.0/16"])
    lab = UrlPolicy(allow=allow, networks=nets, local_ports=frozenset({6379}))
    assert allow == {"releases.lab"} and len(nets) == 3
    assert refusal("releases.lab", ip("127.0.0.1"), 80, lab) is None
    assert refusal("x", ip("::1"), 80, lab) is None and refusal("x", ip("10.1.2.3"), 80, lab) is None
    assert refusal("x", ip("10.2.0.1"), 80, lab) == "x (10.2.0.1) is not in release_url_hosts"
    assert "own port" in (refusal("releases.lab", ip("127.0.0.1"), 6379, lab) or "")  # listed, but the broker's
