"""A module's serial console as a lab has one: a real ser2net (Debian's, 4.x) serving a serial line on a raw TCP
port, the line a pty pair of socat's (``line``: the module's end, which the simulated kernel prints to; ser2net
opens the other end as its serial device)."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.outlet import free_port
from tests.support.procs import stop_process


@dataclass(frozen=True)
class SerialConsole:
    line: Path  # the module's end of the serial line (M1000_SIM_CONSOLE)
    address: str  # ser2net's raw TCP port, as the inventory names it: 127.0.0.1:PORT

    def print(self, *lines: str) -> None:
        """Lines printed on the module's console (as its kernel would)."""
        with self.line.open("w") as fh:
            fh.write("".join(f"{ln}\r\n" for ln in lines))


@contextlib.contextmanager
def ser2net_console(base: Path, accepter: str = "tcp") -> Iterator[SerialConsole]:
    """A serial line and the ser2net serving it on a free 127.0.0.1 port (``max-connections: 2``: the controller's
    capture and a person's ``telnet``, as the how-to sets it); ``accepter``: ``tcp`` (raw), ``telnet,tcp`` or
    ``telnet(rfc2217),tcp`` (as labgrid's exporter serves a port); skips, saying so, without ser2net or socat."""
    missing = [p for p in ("ser2net", "socat") if shutil.which(p) is None]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not installed (tests/system-deps.sh installs Debian's)")
    base.mkdir(parents=True, exist_ok=True)
    line, device = base / "module-tty", base / "ser2net-tty"
    pair = subprocess.Popen(["socat", f"pty,link={line},raw,echo=0", f"pty,link={device},raw,echo=0"],
                            stdout=subprocess.DEVNULL, stderr=(base / "socat.log").open("ab"), start_new_session=True)
    procs = [pair]
    try:
        end = time.monotonic() + 10
        while not (line.exists() and device.exists()):
            if pair.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"socat made no pty pair: {(base / 'socat.log').read_text()[-500:]}")
            time.sleep(0.02)
        port = free_port()
        (base / "ser2net.yaml").write_text(
            "%YAML 1.1\n---\nconnection: &module\n"
            f"    accepter: {accepter},127.0.0.1,{port}\n    enable: on\n"
            "    options:\n      max-connections: 2\n"
            f"    connector: serialdev,{device},115200n81,local\n")
        s2n = subprocess.Popen(["ser2net", "-n", "-c", str(base / "ser2net.yaml"), "-P", str(base / "ser2net.pid")],
                               stdout=subprocess.DEVNULL, stderr=(base / "ser2net.log").open("ab"),
                               start_new_session=True)
        procs.append(s2n)
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if s2n.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"ser2net did not start: {(base / 'ser2net.log').read_text()[-500:]}")
            time.sleep(0.05)
        yield SerialConsole(line, f"{'telnet://' if accepter.startswith('telnet') else ''}127.0.0.1:{port}")
    finally:
        for p in reversed(procs):
            stop_process(p, grace=5)
