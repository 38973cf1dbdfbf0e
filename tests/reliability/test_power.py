"""Hung modules power-cycled through a real pdudaemon (its local-command driver: the outlet of
tests/support/outlet.py, whose "off" kills everything of the module and whose "on" starts its agent again): the
run resumes from its passed keys and ends done, each key benchmarked to success once; a PDU that does not answer
marks the module in one line and the run ends within lost_after. Real agent, real broker, real pdudaemon."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.records import RunState
from controller.fleet.kernel_logs import KernelLogs
from controller.fleet.power import cycle_lines
from tests.support import outlet
from tests.support.locks import machine_lock
from tests.support.redis_server import REDIS, RedisServer
from tests.support.reliability import KEYS
from tests.support.serial_console import ser2net_console

pytestmark = [pytest.mark.slow, pytest.mark.redis]

NS, BRIDGE = f"f9p{os.getpid() % 10000}", f"f9b{os.getpid() % 10000}"
HOST_IP, NS_IP = "10.231.9.1", "10.231.9.2"
HUNG = "[  412.734123] watchdog: BUG: soft lockup - CPU#2 stuck for 22s! [sglang:4242]"


@pytest.fixture
def outlets(tmp_path: Path) -> Iterator[Path]:
    """The outlets file of the test's PDU; every outlet in it is turned off at the end (nothing of a module left)."""
    path = tmp_path / "outlets.json"
    yield path
    if path.exists():
        for entry in json.loads(path.read_text()).values():
            outlet.off(entry)


@pytest.fixture
def lab_link(tmp_path: Path) -> Iterator[tuple[RedisServer, dict[str, str]]]:
    """A bridge on this host with a redis-server on it, and sim-01's network namespace joined to it: the outlet's
    "off" takes the namespace away with everything in it, "on" makes it again and starts the agent there."""
    if os.geteuid() != 0 or shutil.which("ip") is None or not REDIS:
        pytest.skip("network namespaces need root, ip (iproute2) and redis-server")
    with machine_lock("power-netns"):  # this test's fixed names and subnet: one on the machine at a time
        outlet.netns_down(NS)
        subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)
        for args in (("link", "add", BRIDGE, "type", "bridge"), ("addr", "add", f"{HOST_IP}/24", "dev", BRIDGE),
                     ("link", "set", BRIDGE, "up")):
            subprocess.run(["ip", *args], capture_output=True, check=True)
        try:
            outlet.netns_up(NS, BRIDGE, NS_IP)
            server = RedisServer(tmp_path / "redis", bind=("127.0.0.1", HOST_IP))
            server.start()
            try:
                yield server, {"netns": NS, "bridge": BRIDGE, "ip": NS_IP}
            finally:
                server.stop()
        finally:
            outlet.netns_down(NS)
            subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)


def powered(b, pdudaemon: str, outlets: Path, name: str = "sim-01", port: str = "1",
            netns: dict[str, str] | None = None, console: str | None = None) -> dict[str, str]:
    """``name`` on outlet ``port`` of the PDU (and its serial console at ``console``): in the inventory, on the
    outlets file, in the bench's fleet."""
    inv = b.lab.base / "inventory.toml"
    text = inv.read_text().replace(f'name = "{name}"\n',
                                   f'name = "{name}"\npower = {{ pdudaemon = "{pdudaemon}", pdu = "lab-pdu", '
                                   f'port = "{port}" }}\n' + (f'console = "{console}"\n' if console else ""))
    inv.write_text(text)
    b.fleet.pass_hooks = b.lab.state().pass_hooks()  # the recovery policy and the kernel logs, as fleetctl's
    return outlet.wire(outlets, port, b.lab.workers[name].proc.pid, b.workdir(name), netns)


def unplug(b, name: str) -> None:
    """The module's agent is the outlet's now (its "on" starts it again); the lab's process of it is reaped when
    it dies (a zombie would hold the module's name on this host as a live agent)."""
    w = b.lab.workers.pop(name)
    threading.Thread(target=w.proc.wait, daemon=True).start()


@pytest.mark.netns
def test_hung_module_power_cycled_and_its_run_resumes(bench_factory, lab_link, release, outlets, tmp_path):
    """sim-01's agent in a network namespace of its own, reaching the broker over a veth pair: the power cycle takes
    the namespace away and makes it again."""
    server, netns = lab_link
    b = bench_factory((f"redis://127.0.0.1:{server.port}/0", server), offline_after=2.0, power_cycle_after=5.0,
                      lost_after=60.0)
    db = b.lab.settings.broker_url.rsplit("/", 1)[1]
    b.lab.start(sim_env={"sim-01": {"FLEET_BROKER_URL": f"redis://{HOST_IP}:{server.port}/{db}"}},
                argv_prefix=("ip", "netns", "exec", NS))
    with outlet.running_pdudaemon(tmp_path / "pdu", outlets) as url:
        entry = powered(b, url, outlets, netns=netns)
        run_id = b.validate(release)
        b.on_key(run_id, "sim-01", KEYS[1])
        outlet.hang(entry)  # a kernel hang: nothing of the module runs, nothing of it ends
        unplug(b, "sim-01")
        view = b.check_run(run_id, 150)
        agent = Path(entry["pidfile"]).read_text().strip()  # the agent the outlet started, in the namespace it made
        assert agent in subprocess.run(["ip", "netns", "pids", NS], capture_output=True, text=True).stdout.split()
    assert view.progress["sim-01"].state == RunState.DONE and view.state() == "done"
    assert view.progress["sim-01"].attempt == 2  # resumed by the agent started again (one delivery more)
    assert b.benchmark_starts("sim-01", run_id) == {KEYS[0]: 1, KEYS[1]: 2}  # the hung key again, the passed not
    lines = cycle_lines(b.history.events(run_id))
    assert len(lines) == 1 and lines[0].startswith("sim-01 power-cycled at "), lines
    assert lines[0].endswith("; resumed from 1/2 keys"), lines
    assert "PDU lab-pdu port 1" in (t := " ".join(e[2] for e in b.history.events(run_id))) and "asked by" in t
    status = b.lab.fleetctl("status", run_id)
    assert lines[0] in status.stdout, status.stdout
    report = b.lab.fleetctl("report", run_id)
    assert lines[0] in report.stdout, report.stdout + report.stderr
    kept = f"sim-01 (its agent started again mid-run): kernel log and agent journal kept: fleetctl logs {run_id} " \
           "--module sim-01 --kernel"
    assert kept in report.stdout, report.stdout  # beside the failure: the summary's "not measured"


def test_pdu_down_marks_the_module_once_and_the_run_ends_in_its_bound(bench_factory, redis_broker, release, outlets,
                                                                    tmp_path):
    """sim-01's serial console is a real ser2net's: the simulated kernel prints to it, the hang's last words are
    printed just before it, the controller keeps what it read beside the kernel log."""
    b = bench_factory(redis_broker, offline_after=2.0, power_cycle_after=4.0, lost_after=14.0)
    with contextlib.ExitStack() as stack:
        con = stack.enter_context(ser2net_console(tmp_path / "console"))
        b.lab.start(sim_env={"sim-01": {"M1000_SIM_CONSOLE": str(con.line)}})
        entry = powered(b, f"http://127.0.0.1:{outlet.free_port()}", outlets,  # nothing listens there
                        console=con.address)
        def close_consoles() -> None:
            for h in b.fleet.pass_hooks:
                if isinstance(h, KernelLogs):
                    h.close()

        stack.callback(close_consoles)
        run_id = b.validate(release)
        b.on_key(run_id, "sim-01", KEYS[1])
        con.print(HUNG)
        outlet.hang(entry)
        unplug(b, "sim-01")
        t0 = time.monotonic()
        view = b.finished(run_id, 14.0 + 30)
    console = (b.lab.settings.data_dir / "module-logs" / run_id / "sim-01" / "console.log").read_text()
    lines = console.splitlines()
    assert lines[0].startswith(f"# serial console {con.address} (ser2net raw TCP), read by the controller"), lines
    assert f"{KEYS[0]}: model loaded" in console and f"{KEYS[1]}: loading" in console, console  # the simulator's
    assert lines[-1] == HUNG, lines
    assert time.monotonic() - t0 < 14.0 + 30
    assert view.progress["sim-01"].state == RunState.LOST
    events = [e[2] for e in b.history.events(run_id)]
    failed = [e for e in events if e.startswith("power-cycle failed")]
    assert len(failed) == 1 and "pdudaemon did not answer" in failed[0], events  # once, never a loop
    assert not any(e.startswith("power-cycled") for e in events)
    devices = b.lab.fleetctl("devices", "--output", "json")
    (dev,) = [d for d in json.loads(devices.stdout) if d["module"] == "sim-01"]
    assert dev["reason"].startswith("needs attention: no heartbeat for "), dev
    assert "\n" not in dev["reason"]
    assert any(e.startswith("kernel log kept (lost): ") for e in events), events  # the lost module's kernel log
    logs = b.lab.fleetctl("logs", run_id, "--module", "sim-01", "--kernel")
    assert logs.returncode == 0 and "==> kernel.log <==" in logs.stdout and "==> agent.log <==" in logs.stdout, logs
    assert "==> console.log <==" in logs.stdout and HUNG in logs.stdout, logs.stdout
    report = b.lab.fleetctl("report", run_id)
    glance = next(ln for ln in report.stdout.splitlines() if ln.startswith("- **not measured**"))
    assert f"no results for 1 module/key pair(s): sim-01/{KEYS[1]}; sim-01 (lost): serial console kept; kernel log " \
           f"and agent journal kept: fleetctl logs {run_id} --module sim-01 --kernel" in glance, glance
    kernel = logs.stdout.split("==> kernel.log <==")[1].split("==>")[0]
    assert kernel.strip() and len(kernel.strip().splitlines()) <= 200  # dmesg's tail, or why it cannot be read
    with contextlib.suppress(Exception):
        outlet.off(entry)


def test_two_modules_on_one_pdu_cycled_one_at_a_time_one_not_back(bench_factory, redis_broker, release, outlets,
                                                                  tmp_path):
    """Both hang at once: pdudaemon cycles them one after the other; sim-01 comes back and its run part ends done,
    sim-02 does not (its outlet's "on" starts nothing) and is given up at lost_after, saying so."""
    b = bench_factory(redis_broker, n=2, offline_after=2.0, power_cycle_after=4.0, lost_after=45.0)
    b.lab.start()
    with outlet.running_pdudaemon(tmp_path / "pdu", outlets) as url:
        one = powered(b, url, outlets, "sim-01", "1")
        two = powered(b, url, outlets, "sim-02", "2")
        table = json.loads(outlets.read_text())
        table["2"]["argv"] = json.dumps(["true"])  # a module that does not boot again
        outlets.write_text(json.dumps(table))
        run_id = b.validate(release, "sim-01,sim-02")
        b.on_key(run_id, "sim-01", KEYS[1])
        b.on_key(run_id, "sim-02", KEYS[1])
        for name, entry in (("sim-01", one), ("sim-02", two)):
            outlet.hang(entry)
            unplug(b, name)
        view = b.finished(run_id, 120)
    assert view.progress["sim-01"].state == RunState.DONE and view.progress["sim-02"].state == RunState.LOST
    assert b.benchmark_starts("sim-01", run_id) == {KEYS[0]: 1, KEYS[1]: 2}
    events = b.history.events(run_id)
    cycled = {m: ts for m, ts, msg in events if msg.startswith("power-cycled")}
    assert set(cycled) == {"sim-01", "sim-02"}
    assert abs(cycled["sim-02"] - cycled["sim-01"]) >= 5.0  # one at a time: pdudaemon's cycle takes its 5 s each
    lines = sorted(cycle_lines(events))
    assert lines[0].endswith("; resumed from 1/2 keys"), lines
    assert lines[1].startswith("sim-02 power-cycled at ") and "; did not come back (marked lost: agent lost: no " \
        "heartbeat for " in lines[1], lines
