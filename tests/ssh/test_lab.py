"""Slow tier: deploy and push against real OpenSSH hosts in network namespaces.

The lab (tests/ssh/netns.py) has three modules, each its own namespace, address, unix user
and sshd; deploy installs the real agent from this source tree (offline wheelhouse) and
waits for real heartbeats through a real redis-server on the lab's bridge.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import stat
import threading
import time
import tomllib
from pathlib import Path
from typing import Any

import psutil
import pytest
import typer
from typer.testing import CliRunner

from contract.files import sha256_file
from controller.inventory import Inventory, Module
from controller.remote import deploy as dep
from controller.remote.push import PushResult, push_release
from controller.settings import ControllerSettings
from tests.ssh.netns import Lab
from tests.support.cli import given_app
from tests.support.ssh import REDIS_PASSWORD, CachedWheelhouse, lab_modules

pytestmark = [pytest.mark.slow, pytest.mark.netns]

NASTY = "/data/models; $(touch /tmp/f7-pwned) `touch /tmp/f7-pwned2` 'q\" & |x"


def cli(mods: list[Module], settings: ControllerSettings) -> typer.Typer:
    return given_app(inventory=Inventory(modules=tuple(mods)), settings=settings)


def trust(lab: Lab) -> list[str]:
    return ["--known-hosts", str(lab.known_hosts), "--identity", str(lab.client_key)]


def random_file(path: Path, size: int) -> Path:
    with path.open("wb") as f:
        left = size
        while left:
            n = min(left, 1 << 20)
            f.write(os.urandom(n))
            left -= n
    return path


# ------------------------------------------------------------------------------------- deploy
@pytest.mark.redis
def test_deploy_redeploy_check_and_a_module_down(lab: Lab, lab_redis: str, wheelhouse: CachedWheelhouse) -> None:
    settings = ControllerSettings(broker_url=lab_redis, heartbeat_interval=1.0, offline_after=5.0)
    mods = lab_modules(lab, model_root=NASTY)
    opts = dep.DeployOptions(known_hosts=lab.known_hosts, identity=lab.client_key, settings=settings,
                             wheelhouse=wheelhouse, heartbeat_timeout=120)
    first = dep.deploy(mods, opts, dep.heartbeat_waiter(settings, poll=0.5))
    for r in first.values():
        assert r.status == "changed" and r.error is None, r
        assert r.heartbeat is True and r.agent_version == "0.1.0"
        assert r.actions[-1] == "start (supervise)"

    for h in lab.hosts:
        agent = h.home / "m1000-fleet" / "agent"
        assert stat.S_IMODE(agent.stat().st_mode) == 0o700
        for secret in ("agent.toml", "broker_password"):
            assert stat.S_IMODE((agent / secret).stat().st_mode) == 0o600
        cfg = tomllib.loads((agent / "agent.toml").read_text())
        assert cfg["agent"]["model_root"] == NASTY and cfg["agent"]["module"] == h.name
        assert REDIS_PASSWORD not in (agent / "agent.toml").read_text()
        assert REDIS_PASSWORD not in (agent / "agent.log").read_text()
    assert not Path("/tmp/f7-pwned").exists() and not Path("/tmp/f7-pwned2").exists()
    # the broker password is in no process's arguments or environment on the modules
    users = {h.user for h in lab.hosts}
    seen = 0
    for p in psutil.process_iter(["username", "cmdline", "environ"]):
        if p.info["username"] in users:
            seen += 1
            assert REDIS_PASSWORD not in " ".join(p.info["cmdline"] or [])
            assert REDIS_PASSWORD not in " ".join((p.info["environ"] or {}).values())
    assert seen >= 6  # a supervisor and an agent per module at least
    pids = {h.name: (h.home / "m1000-fleet" / "agent" / "supervisor.pid").read_text() for h in lab.hosts}

    app = cli(mods, settings)
    runner = CliRunner()
    wheel = ["--wheel", str(wheelhouse.builder.project_wheel())]  # the same build (the tree may change meanwhile)
    again = runner.invoke(app, ["deploy", *trust(lab), *wheel, "--heartbeat-timeout", "30"])
    assert again.exit_code == 0, again.output
    assert "nothing changed" in again.output and again.output.count("unchanged") == 3
    assert pids == {h.name: (h.home / "m1000-fleet" / "agent" / "supervisor.pid").read_text() for h in lab.hosts}

    # a change that needs a restart is not applied to an agent busy with a run, unless forced
    mod_a = [m for m in mods if m.name == "mod-a"]
    busy_opts = dataclasses.replace(opts, metrics_host="127.0.0.2", busy=lambda m: "r-busy" if m == "mod-a" else None,
                                    project_wheel=wheelhouse.builder.project_wheel())
    held = dep.deploy(mod_a, busy_opts, None)["mod-a"]
    assert held.status == "busy" and "busy with run r-busy" in (held.error or ""), held
    assert (lab.host("mod-a").home / "m1000-fleet" / "agent" / "supervisor.pid").read_text() == pids["mod-a"]
    assert "127.0.0.2" not in (lab.host("mod-a").home / "m1000-fleet" / "agent" / "agent.toml").read_text()

    checked = runner.invoke(app, ["devices", "check", *trust(lab)])
    assert checked.exit_code == 0, checked.output
    assert checked.output.count("running") == 3 and "3." in checked.output

    down = lab.host("mod-c")
    down.stop()
    try:
        t0 = time.monotonic()
        res = runner.invoke(app, ["deploy", *trust(lab), *wheel, "--heartbeat-timeout", "30"])
        assert res.exit_code == 1, res.output
        assert "1 of 3 module(s) failed: mod-c" in res.output
        assert res.output.count("unchanged") == 2 and "unreachable" in res.output
        assert time.monotonic() - t0 < 60
    finally:
        down.start()


def test_deploy_dry_run_changes_nothing_and_refuses_a_changed_host_key(lab: Lab) -> None:
    settings = ControllerSettings(broker_url="redis://10.231.7.1:1/0")
    m = lab_modules(lab, workdir="~/dry run $(x)")[:2]

    stub = dep.Wheelhouse((), Path(dep.__file__), Path(dep.__file__).with_name("m1000_fleet-0.1.0-py3.whl"),
                          Path(dep.__file__), "0" * 64)
    opts = dep.DeployOptions(known_hosts=lab.known_hosts, identity=lab.client_key, settings=settings,
                             wheelhouse=lambda f: stub, dry_run=True)
    res = dep.deploy(m, opts)
    for r in res.values():
        assert r.status == "planned" and r.actions[0] == "upload_wheels (1 files)", r
        assert [a.split(" ")[0] for a in r.actions[1:]] == ["create_venv", "install", "write_config",
                                                           "write_service", "start"]
    for h in lab.hosts[:2]:
        assert not (h.home / "dry run $(x)").exists()

    changed = lab.host("mod-b")
    changed.regenerate_host_key()
    try:
        res = dep.deploy(m, opts)
        assert res["mod-a"].status == "planned"
        assert res["mod-b"].status == "failed" and "host key of 10.231.7.12:22 CHANGED" in str(res["mod-b"].error)
    finally:
        lab.write_known_hosts()  # the operator verified the new key


# ------------------------------------------------------------------------------------- push
def test_push_skip_refusals_and_cli(lab: Lab, tmp_path: Path) -> None:
    tar = random_file(tmp_path / "SGLang-MUSA-M1000 1.4.1;$(id).tar.gz", 6 << 20)
    digest = sha256_file(tar)
    mods = lab_modules(lab)
    kw: dict[str, Any] = dict(known_hosts=lab.known_hosts, identity=lab.client_key)
    first = push_release(mods, tar, digest, **kw)
    for h in lab.hosts:
        r = first[h.name]
        assert r.error is None and not r.skipped and r.bytes == tar.stat().st_size
        assert 0 <= r.sync_seconds < r.seconds  # the module's fsync after the last byte, inside the push's time
        assert r.remote_path == str(h.home / "m1000-fleet" / "incoming" / digest / tar.name)
        assert sha256_file(Path(r.remote_path)) == digest
    second = push_release(mods, tar, digest, **kw)
    assert all(r.skipped and r.bytes == 0 and r.error is None for r in second.values())

    res = CliRunner().invoke(cli(mods, ControllerSettings()), ["push", str(tar), "--devices", "mod-a", *trust(lab)])
    assert res.exit_code == 0 and "skipped (present)" in res.output, res.output

    changed, down = lab.host("mod-b"), lab.host("mod-c")
    changed.regenerate_host_key()
    down.stop()
    try:
        third = push_release(mods, tar, digest, retries=0, **kw)
        assert third["mod-a"].skipped
        assert "CHANGED" in str(third["mod-b"].error) and "refusing" in str(third["mod-b"].error)
        assert "unreachable" in str(third["mod-c"].error)
        res = CliRunner().invoke(cli(mods, ControllerSettings()), ["push", str(tar), *trust(lab)])
        assert res.exit_code == 1
    finally:
        down.start()
        lab.write_known_hosts()


def test_push_resumes_after_the_link_is_cut(lab: Lab, tmp_path: Path) -> None:
    size = 24 << 20
    tar = random_file(tmp_path / "release.tar.gz", size)
    digest = sha256_file(tar)
    h = lab.host("mod-a")
    m = [Module(name=h.name, host=h.address, ssh_user=h.user)]
    part = h.home / "m1000-fleet" / "incoming" / digest / ".release.tar.gz.part"
    out: dict[str, PushResult] = {}
    h.shape(40)  # ~5 MB/s: the cut lands mid-transfer
    try:
        th = threading.Thread(target=lambda: out.update(push_release(
            m, tar, digest, known_hosts=lab.known_hosts, identity=lab.client_key, retries=0,
            alive_interval=1, alive_count=2)))
        th.start()
        deadline = time.monotonic() + 30
        while not (part.exists() and part.stat().st_size >= 3 << 20):
            assert time.monotonic() < deadline and th.is_alive(), "transfer did not start"
            time.sleep(0.05)
        h.link(up=False)
        th.join(60)
        assert not th.is_alive()
    finally:
        h.link(up=True)
        h.shape(None)
    cut = out[h.name]
    assert cut.error is not None and cut.error.startswith("mod-a: "), cut
    assert 0 < part.stat().st_size < size
    resumed = push_release(m, tar, digest, known_hosts=lab.known_hosts, identity=lab.client_key)[h.name]
    assert resumed.error is None, resumed
    assert resumed.resumed_from >= 3 << 20 and resumed.bytes == size - resumed.resumed_from
    final = Path(resumed.remote_path)
    assert hashlib.sha256(final.read_bytes()).hexdigest() == digest and not part.exists()


def test_push_removes_the_releases_pushed_before_but_not_kept_or_arriving_ones(lab: Lab, tmp_path: Path) -> None:
    """keep_newest=1: the last pushed stays, a release of a run not ended (``keep``) stays, one still
    arriving (its partial file locked by the receiver writing it) stays, a folder not named by a
    sha256 stays; the other pushed release goes, before the new one is sent."""
    import fcntl
    import pwd

    h = lab.host("mod-a")
    m = [Module(name=h.name, host=h.address, ssh_user=h.user)]
    kw: dict[str, Any] = dict(known_hosts=lab.known_hosts, identity=lab.client_key)
    tars = [random_file(tmp_path / f"rel{i}.tar.gz", 64 << 10) for i in range(4)]
    d = [sha256_file(t) for t in tars]
    incoming = h.home / "m1000-fleet" / "incoming"
    for t, digest in zip(tars[:3], d[:3], strict=True):
        assert push_release(m, t, digest, **kw)[h.name].error is None
    user = pwd.getpwnam(h.user)
    arriving, other = incoming / ("f" * 64), incoming / "notes"
    for folder in (arriving, other):
        folder.mkdir()
        os.chown(folder, user.pw_uid, user.pw_gid)
    part = arriving / ".rel.tar.gz.part"
    part.write_bytes(b"x")
    os.chown(part, user.pw_uid, user.pw_gid)
    now = time.time()
    for folder in incoming.iterdir():  # releases the lab's other tests pushed here: older than these
        os.utime(folder, (now - 100, now - 100))
    for age, folder in ((40, incoming / d[0]), (30, incoming / d[1]), (20, arriving), (10, incoming / d[2])):
        os.utime(folder, (now - age, now - age))
    fd = os.open(part, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as a receiver writing it holds it
    try:
        r = push_release(m, tars[3], d[3], keep_newest=1, keep=[d[0]], **kw)[h.name]
    finally:
        os.close(fd)
    assert r.error is None and not r.skipped, r
    assert d[1] in r.pruned and not {d[0], d[2], d[3], arriving.name} & set(r.pruned), r.pruned
    assert not (incoming / d[1]).exists()
    assert all((incoming / x).is_dir() for x in (d[0], d[2], d[3], arriving.name, other.name))
    assert sha256_file(incoming / d[3] / tars[3].name) == d[3]
    again = push_release(m, tars[3], d[3], **kw)[h.name]
    assert again.skipped and again.pruned == ()  # keep_newest 0 (the default): nothing removed


# ------------------------------------------------------------------------------------- the lab itself


def test_stopping_a_host_leaves_no_sshd_behind(lab: Lab) -> None:
    """A connection still in pre-auth has a privileged sshd and its unprivileged "[net]" child."""
    import socket
    import subprocess

    def pids() -> list[str]:  # the namespace's sshd processes (a deployed agent may live there too)
        out = subprocess.run(["ip", "netns", "pids", h.ns], capture_output=True, text=True).stdout.split()
        return [p for p in out if _is_sshd(int(p))]

    h = lab.host("mod-c")
    with socket.create_connection((h.address, 22), timeout=5) as conn:
        assert conn.recv(64).startswith(b"SSH-2.0-")  # sshd forked for this connection
        conn.sendall(b"SSH-2.0-probe\r\n")  # and now forks its unprivileged child
        deadline = time.monotonic() + 10
        while len(pids()) < 3:  # listener, the connection's sshd, its [net] child
            assert time.monotonic() < deadline, pids()
            time.sleep(0.05)
        h.stop()
        left = pids()
    h.start()
    assert left == [], left


def _is_sshd(pid: int) -> bool:
    try:
        return psutil.Process(pid).name() == "sshd"
    except psutil.Error:
        return False
