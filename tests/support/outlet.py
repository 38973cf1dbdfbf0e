"""A simulated module's power outlet, for pdudaemon's local-command driver (``cmd_on``/``cmd_off``), and a running
pdudaemon that drives it.

``python -m tests.support.outlet CONF on|off PORT``: ``off`` is a power loss (SIGKILL to everything of the module:
its agent's process tree and every process its runs started, marked with its work folder, stopped or not); ``on``
starts its agent again as the lab first started it (the same command line, environment and folder, recorded by
:func:`wire`). A hang (:func:`hang`) stops all of it (SIGSTOP), as a kernel that no longer schedules anything.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from agent.procs import MARK
from tests.support.procs import stop_process

ROOT = Path(__file__).resolve().parents[2]
PDUDAEMON = ROOT / ".venv-pdudaemon" / "bin" / "pdudaemon"


def _module_processes(entry: dict[str, str]) -> list[psutil.Process]:
    """The module's processes: its agent's tree and what carries its work folder's mark."""
    found: dict[int, psutil.Process] = {}
    pid = _pid(entry)
    if pid is not None:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(pid)
            found.update((p.pid, p) for p in [root, *root.children(recursive=True)])
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if p.environ().get(MARK) == entry["workdir"]:
                found[p.pid] = p
    return list(found.values())


def _pid(entry: dict[str, str]) -> int | None:
    try:
        pid = int(Path(entry["pidfile"]).read_text())
    except (OSError, ValueError):
        return None
    return pid if psutil.pid_exists(pid) else None


def _ip(*args: str, check: bool = True) -> str:
    p = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and p.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {p.stderr.strip()}")
    return p.stdout


def netns_up(ns: str, bridge: str, ip: str) -> None:
    """The module's network namespace, joined to ``bridge`` by a veth pair, its address ``ip``/24."""
    host_if, ns_if = f"{ns}h"[-15:], f"{ns}n"[-15:]
    _ip("netns", "add", ns)
    _ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
    _ip("link", "set", ns_if, "netns", ns)
    _ip("link", "set", host_if, "master", bridge)
    _ip("link", "set", host_if, "up")
    for args in (("addr", "add", f"{ip}/24", "dev", ns_if), ("link", "set", ns_if, "up"), ("link", "set", "lo", "up")):
        _ip("netns", "exec", ns, "ip", *args)


def netns_down(ns: str) -> None:
    """Everything in the namespace killed, the namespace (and its veth pair) gone."""
    for pid in _ip("netns", "pids", ns, check=False).split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    _ip("netns", "del", ns, check=False)


def off(entry: dict[str, str]) -> None:
    for p in _module_processes(entry):
        with contextlib.suppress(psutil.Error):
            p.kill()
    if entry.get("netns"):
        netns_down(entry["netns"])
    with contextlib.suppress(OSError):
        Path(entry["pidfile"]).unlink()


def on(entry: dict[str, str]) -> None:
    if _pid(entry) is not None:
        return  # on already
    prefix: list[str] = []
    if entry.get("netns"):
        netns_up(entry["netns"], entry["bridge"], entry["ip"])
        prefix = ["ip", "netns", "exec", entry["netns"]]
    with open(entry["log"], "ab") as fh:
        proc = subprocess.Popen([*prefix, *json.loads(entry["argv"])], env=json.loads(entry["env"]), cwd=entry["cwd"],
                                stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    Path(entry["pidfile"]).write_text(str(proc.pid))


def wire(conf: Path, port: str, pid: int, workdir: Path, netns: dict[str, str] | None = None) -> dict[str, str]:
    """Record the running agent ``pid`` as the module behind outlet ``port`` of the outlets file ``conf``;
    ``netns``: the module's network namespace (``netns``, ``bridge``, ``ip``), which "off" removes and "on" makes
    again before the agent starts in it."""
    p = psutil.Process(pid)
    entry = {"argv": json.dumps(p.cmdline()), "env": json.dumps(p.environ()), "cwd": p.cwd(),
             "log": str(workdir.parent / "worker.log"), "pidfile": str(workdir.parent / "outlet.pid"),
             "workdir": str(workdir), **(netns or {})}
    Path(entry["pidfile"]).write_text(str(pid))
    table = json.loads(conf.read_text()) if conf.exists() else {}
    table[port] = entry
    conf.write_text(json.dumps(table))
    return entry


def hang(entry: dict[str, str]) -> None:
    """Everything of the module stops (SIGSTOP): no heartbeat, no progress, nothing ends."""
    for p in _module_processes(entry):
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGSTOP)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def running_pdudaemon(base: Path, outlets: Path, pdu: str = "lab-pdu") -> Iterator[str]:
    """A real pdudaemon (HTTP listener) whose PDU ``pdu`` is :mod:`this module <tests.support.outlet>` over
    ``outlets``, with its local-command driver; yields its URL."""
    if not PDUDAEMON.exists():
        pytest.skip(f"{PDUDAEMON} not installed (make pdudaemon: requirements-pdudaemon.lock)")
    port = free_port()
    cmd = f"{sys.executable} -m tests.support.outlet {outlets}"
    conf = {"daemon": {"hostname": "127.0.0.1", "port": port, "listener": "http", "logging_level": "DEBUG"},
            "pdus": {pdu: {"driver": "localcmdline", "cmd_on": f"{cmd} on %s", "cmd_off": f"{cmd} off %s"}}}
    base.mkdir(parents=True, exist_ok=True)
    (base / "pdudaemon.conf").write_text(json.dumps(conf))
    with (base / "pdudaemon.log").open("ab") as log:
        proc = subprocess.Popen([str(PDUDAEMON), "--conf", str(base / "pdudaemon.conf")], cwd=ROOT, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        end = time.monotonic() + 60  # its imports (every driver of every PDU) take seconds on a loaded machine
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if proc.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"pdudaemon did not start: {(base / 'pdudaemon.log').read_text()[-2000:]}")
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(proc)


def main(argv: list[str]) -> int:
    conf, command, port = argv
    entry = json.loads(Path(conf).read_text())[port]
    {"on": on, "off": off}[command](entry)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
