"""Issue 52's acceptance: ``fleetctl serve`` over a simulated lab (two modules, embedded broker), a validation
started with ``fleetctl validate --detach`` (which prints the run's page: ``serve_url`` is set), and in headless
Chromium: log in, runs -> run -> module -> release, the run's page going from running to its verdict without a
reload; a ``read`` user sees no cancel button and its posted cancel is refused; every page readable at a
phone's width (390 px: nothing wider than the window), no request outside the server, no console error.

Screenshots of each page go to the test's tmp dir, and with ``FLEET_DOCS_SCREENSHOTS=1`` to ``docs/img/browse-*.png``
(what docs/howto/browse-runs.md shows)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.cli.demo import reference_rows
from controller.service import Session
from simulator.ports import free_port
from tests.browser import chromium_page
from tests.support.http_servers import wait_port, write_user_tokens
from tests.support.lab import make_lab
from tests.support.procs import stop_group

pytestmark = [pytest.mark.slow, pytest.mark.browser]

ROOT = Path(__file__).resolve().parents[2]
TOKENS = {"read": "rita-read-token-0123456789", "trigger": "tom-trigger-token-0123456789"}
USERS = {"read": "rita", "trigger": "tom"}
DONE = ("pass", "regressed", "incomplete", "failed")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    from simulator import build_release

    base = tmp_path_factory.mktemp("pages")
    release = build_release(base / "release", time_scale=60.0, noise=0.0, seed=5)
    lab = make_lab(base / "lab", ("filesystem://", None), 2)
    with Session(lab.settings) as s:
        s.history().add_baseline(release.version, reference_rows(), "simulator reference tables")
        past_releases(s.history(), lab.names)
    lab.start()
    tokens = write_user_tokens(base / "tokens", ((USERS[r], r, t) for r, t in TOKENS.items()))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**lab.env(), "FLEET_SERVE_URL": url}
    proc = subprocess.Popen([str(Path(sys.executable).parent / "fleetctl"), "serve", "--interval", "0.3",
                             "--api-port", str(port), "--tokens", str(tokens)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_port(port, proc)
        yield {"url": url, "lab": lab, "release": release, "env": env}
    finally:
        stop_group(proc)
        lab.stop()
        out, err = proc.communicate(timeout=10)
        assert not any(t in out + err for t in TOKENS.values())  # tokens are never logged


PAST = [f"1.3.{i}" for i in range(12)]  # earlier releases, one run each: qwen3's decode 10 % slower from 1.3.6 on
STEP = PAST[6]


def past_releases(h, modules: list[str]) -> None:
    """A run of each of :data:`PAST` on the lab's modules (qwen3 rows of the simulator's reference), judged: the
    release page's change point, and a runs page with a history."""
    from controller.report.synth import fleet, rows_frame
    from tests.support.cli import finished_run
    from tests.support.frames import frame_to_rows

    ref = rows_frame([r for r in reference_rows() if r.model_key == "qwen3"])
    for i, rel in enumerate(PAST):
        rid = f"past-{i:02d}"
        df = fleet(ref, modules=modules, seed=i, run_id=rid, release=rel, noise=0.01,
                   regress={("qwen3", "decode_tps"): 0.10} if i >= 6 else None)
        finished_run(h, rid, modules=modules, state="running", release=rel, models=("qwen3",))
        h.upsert_rows(frame_to_rows(df))
        h.set_started_by(rid, "ci")
        h.set_run_state(rid, "done", verdict="regressed" if i == 6 else "pass")


def shoot(page, name: str, tmp: Path) -> None:
    page.screenshot(path=str(tmp / f"{name}.png"), full_page=True)
    if os.environ.get("FLEET_DOCS_SCREENSHOTS") == "1":
        page.screenshot(path=str(ROOT / "docs" / "img" / f"{name}.png"), full_page=True)


def login(page, url: str, role: str) -> None:
    page.goto(f"{url}/ui/runs")
    assert "/ui/login" in page.url  # no cookie yet: the login page, which comes back here after
    page.fill("#token", TOKENS[role])
    page.click("main form button")
    page.wait_for_url(f"{url}/ui/runs")


def fits_a_phone(page, shot: tuple[str, Path] | None = None) -> bool:
    """Nothing on the page wider than a 390 px window (wide tables scroll in their own region); ``shot``: (name,
    tmp dir) of a screenshot at that width."""
    page.set_viewport_size({"width": 390, "height": 800})
    try:
        if shot is not None:
            shoot(page, *shot)
        return bool(page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"))
    finally:
        page.set_viewport_size({"width": 1300, "height": 900})


def test_runs_run_module_release_and_a_run_reaching_its_verdict_live(served, tmp_path):
    url, lab = served["url"], served["lab"]
    r = subprocess.run([str(Path(sys.executable).parent / "fleetctl"), "validate", str(served["release"].path),
                        "--models", "qwen3", "--detach"], env={**served["env"], "FLEET_USER": "tom"},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    run_id = r.stdout.strip().splitlines()[-1]
    assert f"page: {url}/ui/runs/{run_id}" in r.stderr  # validate names the run's page
    narrow = []
    with chromium_page() as (page, seen):
        login(page, url, "trigger")
        assert page.locator(f"#st-{run_id}").inner_text() in ("running", "done")
        narrow.append(fits_a_phone(page))
        shoot(page, "browse-runs", tmp_path)
        page.click(f"a[href='/ui/runs/{run_id}']")
        page.wait_for_url(f"{url}/ui/runs/{run_id}")
        assert page.locator("#run-state").count() == 1, page.content()[:3000]
        assert page.locator("#run-state").inner_text() == "running"  # the page opened while it runs
        assert page.locator("#cancel-form button").is_visible()  # tom's own run: he may cancel it
        page.evaluate("window.notReloaded = true")
        shoot(page, "browse-run-running", tmp_path)
        end = time.monotonic() + 150  # the page's own poll (the CSP refuses the eval of wait_for_function)
        while page.locator("#run-verdict").inner_text() not in DONE and time.monotonic() < end:
            page.wait_for_timeout(500)
        assert page.evaluate("window.notReloaded") is True  # the same page: changed in place, not reloaded
        verdict = page.locator("#run-verdict").inner_text()
        assert page.locator("#run-state").inner_text() in ("done", "failed")
        assert page.locator("#report").is_visible() and not page.locator("#cancel-form").is_visible()
        assert re.match(rf"{verdict.upper()} {run_id}", page.locator("#run-line").inner_text())
        for m in lab.names:
            assert page.locator(f"#m-{m}-state").inner_text() == "done"
            assert page.locator(f"#k-{m}-qwen3-status").inner_text() == "passed"  # each key's outcome, live too
        narrow.append(fits_a_phone(page, ("browse-run-phone", tmp_path)))
        shoot(page, "browse-run", tmp_path)
        page.click(f"a[href='/ui/runs/{run_id}/logs/{lab.names[0]}?key=qwen3']")  # a key's log, read from the module
        assert page.locator("main pre").count() >= 1 and "-benchmark-qwen3.log" in page.inner_text("main")
        page.go_back()
        page.click(f"a[href='/ui/modules/{lab.names[0]}']")
        page.wait_for_url(f"{url}/ui/modules/{lab.names[0]}")
        assert run_id in page.inner_text("main") and "idle" in page.inner_text("main")
        narrow.append(fits_a_phone(page))
        shoot(page, "browse-module", tmp_path)
        page.click(f"main a[href='/ui/releases/{served['release'].version}']")
        page.wait_for_url(f"{url}/ui/releases/{served['release'].version}")
        assert run_id in page.inner_text("main") and "Trend per key" in page.inner_text("main")
        narrow.append(fits_a_phone(page))
        end = time.monotonic() + 90  # the change points: computed and kept off the page's path, then shown
        while "being computed" in page.goto(f"{url}/ui/releases/{STEP}").text() and time.monotonic() < end:
            page.wait_for_timeout(1000)
        main = page.inner_text("main")
        assert "qwen3" in main and "decode_tps" in main and page.locator("svg.spark").count() >= 1, main
        narrow.append(fits_a_phone(page))
        shoot(page, "browse-release", tmp_path)
        got = lab.fleetctl("reserve", "--devices", lab.names[1], "--for", "2h", "--reason", "flashing firmware",
                           user="ana")
        assert got.returncode == 0, got.stderr
        try:
            for path, name in (("/ui/modules", "browse-modules"), ("/ui/releases", "browse-releases"),
                               ("/ui/queue", "browse-queue")):
                assert page.goto(url + path).status == 200
                if name != "browse-releases":  # who holds it, on the modules and the queue pages
                    assert f"{lab.names[1]}" in page.inner_text("main") and "ana" in page.inner_text("main")
                narrow.append(fits_a_phone(page))
                shoot(page, name, tmp_path)
        finally:
            lab.fleetctl("unreserve", "--devices", lab.names[1], user="ana")
        # the report the run's page links to opens (a signed link: no token)
        page.goto(url + f"/ui/runs/{run_id}")
        page.click("#report")
        page.wait_for_load_state()
        assert page.title() == f"Fleet report {run_id}"
        assert page.locator("p.page a").get_attribute("href") == f"/ui/runs/{run_id}"  # and back to the page
    assert narrow == [True] * 8
    assert seen.errors == []
    assert {u for u in seen.requested if not u.startswith(url)} == set()  # offline: nothing from elsewhere


def test_a_read_user_sees_no_cancel_and_its_posted_cancel_is_refused_and_the_owner_cancels(served):
    url = served["url"]
    r = subprocess.run([str(Path(sys.executable).parent / "fleetctl"), "validate", str(served["release"].path),
                        "--models", "qwen3,qwen35,qwen3vl", "--detach"], env={**served["env"], "FLEET_USER": "tom"},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    run_id = r.stdout.strip().splitlines()[-1]
    with chromium_page() as (page, _):
        login(page, url, "read")
        page.goto(f"{url}/ui/runs/{run_id}")
        assert page.locator("button", has_text="Cancel").count() == 0
        assert page.locator("button", has_text="Retry").count() == 0
        status = page.evaluate(f"fetch('/ui/runs/{run_id}/cancel', {{method: 'POST'}}).then(r => r.status)")
        assert status == 403
    with chromium_page() as (page, seen):  # tom, who started it, cancels it with the page's own form
        login(page, url, "trigger")
        page.goto(f"{url}/ui/runs/{run_id}")
        assert page.locator("#run-state").inner_text() == "running"  # three keys: tens of seconds
        page.click("#cancel-form button")
        page.wait_for_url(f"{url}/ui/runs/{run_id}")
        end = time.monotonic() + 60
        while page.locator("#run-state").inner_text() == "running" and time.monotonic() < end:
            page.wait_for_timeout(500)
        assert page.locator("#run-state").inner_text() in ("cancelled", "done", "failed")
        events = page.inner_text("main")
        assert "cancel requested by tom" in events, events
        assert seen.errors == []
