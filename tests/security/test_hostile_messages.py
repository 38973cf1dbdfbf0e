"""Slow tier (redis): hostile messages written straight onto a real module queue.

The attacker has broker access only: it LPUSHes raw messages onto ``module.sim-01`` the way
kombu's redis transport stores them. Each one must be refused with a logged reason, run
nothing (no run folder, no event, no release script, no unpacked release), and the worker
must then serve the next good run.
"""

from __future__ import annotations

import json
import os
import pickle
import time
from pathlib import Path

import pytest

from agent.validate import MAX_PAYLOAD_BYTES, stage_local_release
from contract.version import SCHEMA_VERSION
from controller.fleet import Fleet
from controller.history import History
from tests.support.secure import SecureRedis, make_secure_lab, task_body, task_envelope

pytestmark = [pytest.mark.slow, pytest.mark.redis]

SCALE = 1000.0


class Pwn:
    """Unpickling this runs a shell command: what a pickle body would do if it were accepted."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def wait_for(cond, timeout: float, what: str):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.fixture(scope="module")
def hostile_lab(tmp_path_factory):
    server = SecureRedis(tmp_path_factory.mktemp("redis"))
    server.start()
    lab = make_secure_lab(tmp_path_factory.mktemp("lab"), server, 1)
    lab.start()
    try:
        yield lab, server
    finally:
        lab.stop()
        server.stop()


def test_hostile_messages_are_refused_and_the_worker_keeps_serving(hostile_lab, tmp_path) -> None:
    from simulator import build_release

    lab, server = hostile_lab
    rel = build_release(tmp_path / "release", time_scale=SCALE, noise=0.0, seed=3)
    staged = str(stage_local_release(rel.path, rel.sha256, lab.settings.data_dir))
    work = lab.base / "modules" / "sim-01" / "work"
    models = str(lab.base / "modules" / "sim-01" / "models")
    outside_link = Path(staged).parent / "link.tar.gz"
    outside_link.symlink_to(rel.path)  # inside a root, pointing outside it

    def good(run_id: str, **kw: object) -> dict:
        p = {"schema_version": 1, "run_id": run_id, "module": "sim-01", "tarball": staged, "sha256": rel.sha256,
             "release": "1.4.1", "models": ["qwen3"], "model_root": models, "model_paths": {}, "key_env": {},
             "max_attempts": 2}
        p.update(kw)
        return p

    # (name, raw message, what the worker's log must say, run id whose progress must say failed/refused or None)
    marker = tmp_path / "pwned"
    bashfunc = tmp_path / "pwned-by-a-bash-function"  # not a fixed /tmp path: a checkout may live there
    hostile: list[tuple[str, bytes, str, str | None]] = [
        ("pickle", task_envelope("sim-01", pickle.dumps(((Pwn(marker),), {}, {})),
                                 content_type="application/x-python-serialize"),
         "Refusing to deserialize untrusted content of type pickle", None),
        ("non-json body", task_envelope("sim-01", b"{not json at all"), "decode", None),
        ("not a task", task_envelope("sim-01", task_body(good("h-task")), task="fleet.evil"),
         "unregistered task", None),
        ("huge body", task_envelope("sim-01", task_body(good("h-huge", release="x" * (8 * MAX_PAYLOAD_BYTES)))),
         "refused request: payload:", "h-huge"),
        ("schema version", task_envelope("sim-01", task_body(good("h-schema", schema_version=SCHEMA_VERSION + 1))),
         "refused request: schema_version:", "h-schema"),
        ("run id", task_envelope("sim-01", task_body(good("../../../tmp/x"))), "refused request: run_id:", None),
        ("model key", task_envelope("sim-01", task_body(good("h-model", models=["qwen3", "../x"]))),
         "refused request: models:", "h-model"),
        ("LD_PRELOAD", task_envelope("sim-01", task_body(good("h-ld", key_env={"qwen3": {"LD_PRELOAD": "/x.so"}}))),
         "refused request: key_env.qwen3: variable LD_PRELOAD", "h-ld"),
        ("bash function", task_envelope("sim-01", task_body(
            good("h-bashfunc", key_env={"qwen3": {"BASH_FUNC_python3%%": f"() {{ touch {bashfunc}; }}"}}))),
         "refused request: key_env.qwen3: variable name", "h-bashfunc"),
        ("PYTHONPATH", task_envelope("sim-01", task_body(good("h-pypath", key_env={"qwen3": {"PYTHONPATH": "/x"}}))),
         "refused request: key_env.qwen3: variable PYTHONPATH", "h-pypath"),
        ("env value", task_envelope("sim-01", task_body(good("h-envval", key_env={"qwen3": {"A": "x" * 10000}}))),
         "refused request: key_env.qwen3.A:", "h-envval"),
        ("tarball outside", task_envelope("sim-01", task_body(good("h-tar", tarball=str(rel.path)))),
         "refused request: tarball:", "h-tar"),
        ("tarball symlink", task_envelope("sim-01", task_body(good("h-tarlink", tarball=str(outside_link)))),
         "refused request: tarball:", "h-tarlink"),
        ("model root", task_envelope("sim-01", task_body(good("h-root", model_root="models"))),
         "refused request: model_root:", "h-root"),
        ("unknown field", task_envelope("sim-01", task_body(good("h-extra", command="id"))),
         "refused request: command:", "h-extra"),
        ("other module", task_envelope("sim-01", task_body(good("h-other", module="sim-02"))),
         "refused request: module: run for module 'sim-02' reached 'sim-01'", None),
    ]
    r = server.client()
    for _name, msg, _why, _rid in hostile:
        r.lpush("module.sim-01", msg)
    # then a good run, through the controller as usual
    fleet = Fleet(lab.settings, History(lab.settings.history_path))
    mods = [m for m in lab.state().inventory().modules if m.name == "sim-01"]
    fleet.dispatch(run_id="good-1", modules=mods, tarballs={"sim-01": staged}, sha256=rel.sha256, release="1.4.1",
                   models=("qwen3",))
    view = wait_for(lambda: (v := fleet.sync("good-1")).finished and v, 120, "the good run after the hostile ones")
    assert view.state() == "done" and view.progress["sim-01"].state.value == "done"

    log = lab.workers["sim-01"].log.read_text(errors="replace")
    for name, _msg, why, _rid in hostile:
        assert why.lower() in log.lower(), f"{name}: {why!r} not in the worker's log"
    kv = fleet.kv
    for name, _msg, why, rid in hostile:
        if rid is None:
            continue
        p = kv.progress(rid, ["sim-01"])["sim-01"]
        assert p is not None and p.state.value == "failed", name
        assert p.error is not None and p.error.message.startswith("refused request: "), name
        assert why.split(":", 1)[0] in p.error.message, name
    assert kv.progress("h-other", ["sim-02"])["sim-02"] is None  # nothing published for the other module
    # nothing ran: only the good run has a folder, events and a release
    assert sorted(p.name for p in (work / "runs").iterdir()) == ["good-1"]
    assert [p.name for p in (work / "releases").iterdir()] == [rel.sha256[:16]]
    events = [json.loads(x) for x in (work / "runs" / "good-1" / "events.jsonl").read_text().splitlines()]
    assert events and all(e["status"] in ("started", "done", "ok", "passed", "skipped") or e for e in events)
    assert not marker.exists() and not bashfunc.exists()
    assert lab.workers["sim-01"].proc.poll() is None  # the worker is alive and healthy
    hb = fleet.heartbeats(["sim-01"])["sim-01"]
    assert hb is not None and hb.healthy
    assert r.llen("module.sim-01") == 0


def test_garbage_on_the_queue_does_not_stop_the_worker(hostile_lab, tmp_path):
    """Bytes that are not even a kombu message: dropped or logged, and the next run still runs."""
    from simulator import build_release

    lab, server = hostile_lab
    rel = build_release(tmp_path / "release", time_scale=SCALE, noise=0.0, seed=4)
    staged = str(stage_local_release(rel.path, rel.sha256, lab.settings.data_dir))
    r = server.client()
    for junk in (b"\x80\x04garbage that is no JSON", b'{"body": 1}', b"[]", b'{"properties": {}}',
                 b'{"body": "!!", "properties": {"delivery_tag": "t", "body_encoding": "base64"}}',
                 b'{"body": "", "properties": {"delivery_tag": "t", "body_encoding": "rot13"}}', b"9" * 5000):
        r.lpush("module.sim-01", junk)
    fleet = Fleet(lab.settings, History(lab.settings.history_path))
    mods = [m for m in lab.state().inventory().modules if m.name == "sim-01"]
    fleet.dispatch(run_id="good-2", modules=mods, tarballs={"sim-01": staged}, sha256=rel.sha256, release="1.4.1",
                   models=("qwen3",))
    view = wait_for(lambda: (v := fleet.sync("good-2")).finished and v, 120, "a good run after garbage")
    assert view.state() == "done"
    assert lab.workers["sim-01"].proc.poll() is None
    log = lab.workers["sim-01"].log.read_text(errors="replace")
    assert "Unrecoverable error" not in log
    assert log.count("dropped a") >= 6
