"""``POST /api/v1/runs`` with a release URL: the controller downloads it from a real local HTTP
server (stdlib, in a thread) into ``<data_dir>/releases/<sha256>/``, then dispatches as for a
path. Every failure is one line and 422, and leaves nothing half-downloaded behind."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.settings import ControllerSettings
from tests.api.conftest import AUTH, TOKEN, ReleaseServer, write_tokens
from tests.cli.conftest import TARBALL, closed_port


@pytest.fixture
def served(controller: ControllerSettings) -> Iterator[ReleaseServer]:
    s = ReleaseServer(controller.inventory.parent)  # holds TARBALL (a few bytes: no agent unpacks it here)
    yield s
    s.close()


def api(settings: ControllerSettings, tmp_path: Path):
    from fastapi.testclient import TestClient

    from controller.api import Tokens, create_app

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


def test_unusable_release_urls_are_422_in_one_line_and_leave_nothing(controller, served, tmp_path, caplog):
    small = controller.model_copy(update={"release_download_max_bytes": 5})
    with api(small, tmp_path) as c:
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
    with api(controller, tmp_path) as c:
        post_ok = lambda **b: c.post("/api/v1/runs", headers=AUTH, json={"models": ["qwen3"], **b})  # noqa: E731
        r = post_ok(release=f"{served.url}/{TARBALL}", sha256="0" * 64)
        assert r.status_code == 422 and "does not match the expected 000000000000" in r.json()["detail"]
        r = post_ok(release=f"{served.url}/missing/SGLang-MUSA-M1000-M1000_9.9.9_sglang.tar.gz")
        assert r.status_code == 422 and r.json()["detail"].endswith("HTTP 404 Not Found"), r.text
        r = post_ok(release=f"http://127.0.0.1:{closed_port()}/{TARBALL}")
        assert r.status_code == 422 and "unreachable (Connection refused)" in r.json()["detail"], r.text
        r = post_ok(release=f"{served.url}/redirect-file/{TARBALL}")
        assert r.status_code == 422 and "redirected to an unusable URL" in r.json()["detail"], r.text
        # a path with a sha256 is checked too
        r = post_ok(release=str(controller.inventory.parent / TARBALL), sha256="f" * 64)
        assert r.status_code == 422 and "does not match" in r.json()["detail"]
    assert leftovers(controller) == []  # nothing half-downloaded, no checksum-failed file kept
    assert "hunter2" not in caplog.text
