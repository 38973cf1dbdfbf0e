"""Slow tier (redis): one Redis ACL user per module, from `fleetctl broker acl`, tried for real.

Module sim-01's credential is used against module sim-02's queue, records, cancel flags and
server-wide commands: every attempt must be refused by Redis itself (NOPERM). Then a fleet
runs end to end with each agent connected as its own user and the controller as its own,
and Redis's ACL log shows that no legitimate step was refused.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest
import redis
from celery import Celery

from contract.kv import cancel_key, preempt_key
from contract.records import RunState
from controller.remote import acl
from tests.support.secure import ADMIN, fleetctl_path, make_secure_lab, pw, start_acl_redis, task_body, task_envelope

pytestmark = [pytest.mark.slow, pytest.mark.redis]

def test_acl_file_shape(tmp_path):
    files = acl.write_acl(tmp_path / "b", ["sim-01", "sim-02"])
    text = files.acl.read_text()
    assert files.acl.stat().st_mode & 0o777 == 0o600 and files.passwords.stat().st_mode & 0o777 == 0o700
    assert all((files.passwords / f"{u}.password").stat().st_mode & 0o777 == 0o600 for u in files.users)
    for u in files.users:
        assert pw(files, u) not in text  # hashed only
    assert "user default off" in text
    first = pw(files, "sim-01")
    again = acl.write_acl(tmp_path / "b", ["sim-01", "sim-02", "sim-03"])
    assert again.created == ("sim-03",) and pw(again, "sim-01") == first
    rotated = acl.write_acl(tmp_path / "b", ["sim-01"], rotate=True)
    assert pw(rotated, "sim-01") != first
    with pytest.raises(acl.AclError):
        acl.write_acl(tmp_path / "c", ["bad:name"])


def test_fleetctl_broker_acl(tmp_path):
    from controller.cli.demo import inventory_toml

    (tmp_path / "inventory.toml").write_text(inventory_toml(["sim-01", "sim-02"], tmp_path, None))
    r = subprocess.run([fleetctl_path(), "-i", str(tmp_path / "inventory.toml"), "broker", "acl", "--out",
                        str(tmp_path / "redis")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    said = " ".join(r.stdout.split())  # rich wraps long paths at the terminal's width
    assert "3 users" in said and "--module-credentials" in said
    assert {p.name for p in (tmp_path / "redis" / "passwords").iterdir()} == {
        "fleet-controller.password", "sim-01.password", "sim-02.password"}


@pytest.fixture(scope="module")
def acl_server(tmp_path_factory):
    # x.sim-01: a name that ends in another module's name (the results pattern was *.M before)
    server, files = start_acl_redis(tmp_path_factory.mktemp("acl"), ["sim-01", "sim-02", "x.sim-01"])
    try:
        yield server, files
    finally:
        server.stop()


def refused(fn, *args):
    with pytest.raises(redis.exceptions.NoPermissionError) as exc:
        fn(*args)
    assert "NOPERM" in str(exc.value) or "no permissions" in str(exc.value)


def test_module_a_cannot_touch_module_b(acl_server):
    server, files = acl_server
    ctl = server.client(acl.CONTROLLER_USER, pw(files, acl.CONTROLLER_USER), db=1)
    a = server.client("sim-01", pw(files, "sim-01"), db=1)
    b_queue = "module.sim-02"
    ctl.lpush(b_queue, b"run for B")
    ctl.lpush(b_queue + "\x06\x163", b"priority run for B")
    ctl.set("m1000-fleet:progress:r1:sim-02", "{}")
    ctl.set("m1000-fleet:rows:r1:sim-02", "[]")
    ctl.set("m1000-fleet:hb:sim-02", "{}")
    ctl.set(cancel_key("r1", "sim-02"), json.dumps({"reason": "x"}))
    ctl.set("m1000-fleet:cancel:r1:sim-02", json.dumps({"reason": "x"}))  # the layout before
    ctl.hset("unacked:module.sim-02", "tag", "payload")
    ctl.set("celery-task-meta-sim-02:r1", "{}")

    # B's queue: read, pop, push, priority lists too
    refused(a.llen, b_queue)
    refused(a.lrange, b_queue, 0, -1)
    refused(a.rpop, b_queue)
    refused(a.brpop, [b_queue], 1)
    refused(a.brpop, [b_queue + "\x06\x163"], 1)
    refused(a.lpush, b_queue, task_envelope("sim-02", task_body({"run_id": "x"})))
    refused(a.lpush, b_queue + "\x06\x163", b"x")
    # stealing B's runs through a binding, reading or dropping B's unacked messages
    refused(a.sadd, "_kombu.binding.module.sim-02", "module.sim-02\x06\x16\x06\x16module.sim-01")
    refused(a.hgetall, "unacked:module.sim-02")
    refused(a.hget, "unacked:module.sim-02", "tag")
    refused(a.hdel, "unacked:module.sim-02", "tag")
    # B's progress, rows, heartbeat, results
    for key in ("m1000-fleet:progress:r1:sim-02", "m1000-fleet:rows:r1:sim-02", "m1000-fleet:hb:sim-02",
                "celery-task-meta-sim-02:r1"):
        refused(a.get, key)
        refused(a.set, key, "forged")
        refused(a.delete, key)
    refused(a.mget, ["m1000-fleet:progress:r1:sim-01", "m1000-fleet:progress:r1:sim-02"])
    refused(a.publish, "m1000-fleet:progress:r1:sim-02", "forged")
    refused(a.execute_command, "SUBSCRIBE", "celery-task-meta-sim-02:r1")
    # a module whose name ends in A's: its results are its own (task ids <module>:<run>)
    ctl.set("celery-task-meta-x.sim-01:r1", "{}")
    refused(a.get, "celery-task-meta-x.sim-01:r1")
    refused(a.publish, "celery-task-meta-x.sim-01:r1", "forged")
    a.set("celery-task-meta-sim-01:r1", "{}")  # its own: allowed
    refused(a.execute_command, "PSUBSCRIBE", "*")
    # cancel flags: B's is not even readable (m1000-fleet:cancel:<module>:<run>), nor a key of the layout
    # before; none is written by a module (B's, the run's, its own)
    refused(a.get, cancel_key("r1", "sim-02"))
    refused(a.mget, [cancel_key("r1"), cancel_key("r1", "sim-02")])
    refused(a.get, "m1000-fleet:cancel:r1:sim-02")
    refused(a.set, cancel_key("r1", "sim-02"), "{}")
    refused(a.set, cancel_key("r1"), "{}")
    refused(a.set, cancel_key("r1", "sim-01"), "{}")
    refused(a.delete, cancel_key("r1", "sim-02"))
    # server-wide commands
    refused(a.flushall)
    refused(a.flushdb)
    refused(a.config_get, "*")
    refused(a.config_set, "dir", "/tmp")
    refused(a.keys, "*")
    refused(a.scan)
    refused(a.execute_command, "ACL", "LIST")
    refused(a.execute_command, "MONITOR")
    refused(a.execute_command, "CLIENT", "KILL", "TYPE", "normal")
    refused(a.execute_command, "SHUTDOWN")
    # INFO (read-only) is allowed: the agent and the controller read maxmemory-policy when they start
    assert a.info("memory")["maxmemory_policy"] == ctl.info("memory")["maxmemory_policy"] == "noeviction"
    # nothing of B's changed
    assert ctl.llen(b_queue) == 1 and ctl.get("m1000-fleet:progress:r1:sim-02") == b"{}"
    assert ctl.hget("unacked:module.sim-02", "tag") == b"payload"
    assert ctl.smembers("_kombu.binding.module.sim-02") == set()
    # what A may do with its own
    assert a.llen("module.sim-01") == 0
    a.execute_command("SETEX", "m1000-fleet:progress:r1:sim-01", 60, "{}")
    a.publish("m1000-fleet:progress:r1:sim-01", "{}")
    assert a.execute_command("WAIT", 0, 10) == 0  # a final state waits for the replicas (none here)
    assert a.mget([cancel_key("r1"), cancel_key("r1", "sim-01")]) == [None, None]
    ctl.set(cancel_key("r2"), json.dumps({"reason": "run-wide"}))
    ctl.set(cancel_key("r3", "sim-01"), json.dumps({"reason": "A's part"}))
    assert a.mget([cancel_key("r2"), cancel_key("r3", "sim-01")]) == [b'{"reason": "run-wide"}',
                                                                       b'{"reason": "A\'s part"}']
    # the same through the agent's own read path (contract.kv), connected as sim-01
    from contract.celery_app import make_app
    from contract.kv import KV
    from contract.settings import BrokerSettings

    app = make_app(BrokerSettings(broker_url=server.url("sim-01", db=1),
                                  broker_password_file=files.passwords / "sim-01.password"), module="sim-01")
    try:
        kv = KV(app)
        assert [kv.cancelled("r2", "sim-01"), kv.cancelled("r3", "sim-01"), kv.cancelled("r9", "sim-01")] == [
            "run-wide", "A's part", None]
        refused(kv.cancelled, "r1", "sim-02")  # asking for B's flag as A: refused by Redis, not answered
        # what a running run reads every second: its cancel flags and its preemption, in one MGET
        ctl.set(preempt_key("r3", "sim-01"), json.dumps({"by": "u1"}))
        ctl.set(preempt_key("r3", "sim-02"), json.dumps({"by": "u1"}))
        assert kv.stop_flags("r3", "sim-01")[1] == "u1" and kv.stop_flags("r9", "sim-01") == (None, None)
        refused(kv.preempted_by, "r3", "sim-02")  # B's preemption: not A's to read
        refused(a.set, preempt_key("r3", "sim-01"), "{}")  # nor to write, its own either
        # the agent's start-up check reads the policy as sim-01 (INFO memory; CONFIG stays refused)
        from contract.eviction import broker_eviction_problem

        assert broker_eviction_problem(app) is None
        admin = server.client(*ADMIN)
        admin.config_set("maxmemory-policy", "allkeys-lru")
        admin.config_set("maxmemory", "1gb")
        try:
            assert "maxmemory-policy allkeys-lru evicts keys" in (broker_eviction_problem(app) or "")
        finally:
            admin.config_set("maxmemory", "0")
            admin.config_set("maxmemory-policy", "noeviction")
    finally:
        app.close()
    # no password, or the wrong one: nothing at all
    with pytest.raises(redis.exceptions.AuthenticationError):
        server.client(None, None).ping()
    with pytest.raises(redis.exceptions.AuthenticationError):
        server.client("sim-01", pw(files, "sim-02")).ping()


def test_final_state_acknowledgements_are_the_modules_own_and_read_only(acl_server, tmp_path):
    """The controller's acknowledgement of a final state (m1000-fleet:ack:<module>:<run>): a module reads its own,
    never another module's, and writes none; the agent's whole final path (rows, telemetry, state, then the
    acknowledgement read by its heartbeat) runs as its own Redis user."""
    from agent.outbox import Publisher, resend_unacked, unacked_path
    from agent.store import RunStore
    from contract.celery_app import make_app
    from contract.kv import KV, ack_key
    from contract.records import ResultRow, RunProgress, TelemetrySummary
    from contract.settings import BrokerSettings

    server, files = acl_server
    ctl = server.client(acl.CONTROLLER_USER, pw(files, acl.CONTROLLER_USER), db=2)
    a = server.client("sim-01", pw(files, "sim-01"), db=2)
    ctl.set(ack_key("r1", "sim-02"), "{}")
    refused(a.get, ack_key("r1", "sim-02"))
    refused(a.mget, [ack_key("r1", "sim-01"), ack_key("r1", "sim-02")])
    for key in (ack_key("r1", "sim-01"), ack_key("r1", "sim-02")):
        refused(a.set, key, "{}")
        refused(a.delete, key)
    refused(a.get, ack_key("r1", "x.sim-01"))  # a module whose name ends in A's: not A's
    assert a.get(ack_key("r1", "sim-01")) is None  # its own: readable

    def kv_as(user: str) -> tuple[Celery, KV]:
        app = make_app(BrokerSettings(broker_url=server.url(user, db=2),
                                      broker_password_file=files.passwords / f"{user}.password"), module=user)
        return app, KV(app)

    mod_app, mod = kv_as("sim-01")
    ctl_app, ctl_kv = kv_as(acl.CONTROLLER_USER)
    try:
        work = tmp_path / "work"
        rows = [ResultRow(run_id="r5", module="sim-01", model_key="qwen3", table="sweep", profile=f"128:{i}",
                          model="Qwen3", ttft_ms=float(i)) for i in range(3)]
        RunStore(work).put_rows("r5", "qwen3", rows)
        now = time.time()
        done = RunProgress(run_id="r5", module="sim-01", state=RunState.DONE, updated_at=now, finished_at=now,
                           rows=3, telemetry=TelemetrySummary(run_id="r5", module="sim-01", samples=1))
        Publisher(mod, work, "r5", "sim-01").final(done)
        sent = ctl_kv.progress("r5", ["sim-01"])["sim-01"]
        assert sent is not None and sent.stored_rows == 3 and ctl_kv.telemetry("r5", "sim-01") is not None
        assert resend_unacked(mod, work, interval=1.0, keep_for=3600.0, now=now + 2) == 1  # sent again as sim-01
        ctl_kv.put_ack(sent)
        assert resend_unacked(mod, work, interval=1.0, keep_for=3600.0, now=now + 4) == 0
        assert not unacked_path(work, "r5").exists()  # the acknowledgement was read as sim-01
    finally:
        mod_app.close()
        ctl_app.close()


def test_fleet_end_to_end_with_acls(acl_server, tmp_path):
    from simulator import build_release

    server, files = acl_server
    admin = server.client(*ADMIN)
    lab = make_secure_lab(tmp_path / "lab", server, 2, controller_user=acl.CONTROLLER_USER,
                          controller_password_file=files.passwords / f"{acl.CONTROLLER_USER}.password",
                          module_password_files={m: files.passwords / f"{m}.password" for m in ("sim-01", "sim-02")},
                          per_module_users=True)
    admin.execute_command("ACL", "LOG", "RESET")
    lab.start()
    try:
        who = {c["user"] for c in admin.client_list()}
        assert {"sim-01", "sim-02", acl.CONTROLLER_USER} <= who, who
        rel = build_release(tmp_path / "release", time_scale=1000.0, noise=0.0, seed=3)
        r = subprocess.run([fleetctl_path(), "validate", str(rel.path), "--models", "qwen3,qwen35_mtp"],
                           env=lab.env(), capture_output=True, text=True, timeout=240)
        assert r.returncode in (0, 1), r.stderr
        from controller.history import History

        h = History(lab.settings.history_path)
        run = h.runs()[0]
        assert run.state == "done", r.stderr
        assert {m: sum(x.module == m for x in h.rows(run.run_id)) for m in lab.names} == {"sim-01": 26,
                                                                                          "sim-02": 26}
        # a cancel still reaches a module (it reads the flags), through the controller's user
        r = subprocess.run([fleetctl_path(), "cancel", run.run_id], env=lab.env(), capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, r.stderr
        # a message with another module's task id: its result cannot be stored, the worker goes on
        ctl = server.client(acl.CONTROLLER_USER, pw(files, acl.CONTROLLER_USER))
        ctl.lpush("module.sim-01", task_envelope("sim-01", task_body({"run_id": "h1", "module": "sim-01"}),
                                                 task_id="sim-02:h1"))
        time.sleep(3)
        assert lab.workers["sim-01"].proc.poll() is None
        time.sleep(2 * lab.settings.heartbeat_interval)
        from controller.fleet import read_beats

        # the beats' ages by the broker's clock: each agent's heartbeat key carries the fixed expiry (its SET EX),
        # and the controller's user reads what is left of it (PTTL)
        beats = read_beats(lab.settings, lab.names)
        assert all(b is not None and b.measured and time.time() - b.at < 5 for b in beats.values()), beats
        log = admin.execute_command("ACL", "LOG", "128")
        entries = [dict(zip(e[::2], e[1::2], strict=True)) if isinstance(e, list) else e for e in log]
        denied = [(e.get(b"username") or e.get("username"), e.get(b"object") or e.get("object")) for e in entries]
        legit = [d for d in denied if b"sim-02:h1" not in (d[1] or b"") and "sim-02:h1" not in str(d[1])]
        assert legit == [], f"legitimate steps refused by the ACL: {legit}"
        assert len(denied) > len(legit), denied  # the forged task id's result was refused (and logged)
        p = lab.state().fleet().kv.progress(run.run_id, lab.names)
        assert all(v is not None and v.state == RunState.DONE for v in p.values())
    finally:
        lab.stop()
