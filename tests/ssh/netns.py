"""A lab of real OpenSSH hosts, each in its own network namespace.

``Lab`` builds a bridge ``f7br`` (10.231.7.1/24) in the root namespace and, per module,
a namespace ``f7ns<i>`` joined to it by a veth pair, a unix user ``f7u<i>`` with its own
home, and ``/usr/sbin/sshd -D`` listening on 10.231.7.(11+i):22 with its own host key.
Everything is removed by ``close()`` (namespaces, links, users, processes, files), and a
crashed earlier lab is swept first. A file lock serialises labs on one machine, since
they share the subnet and names.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

SUBNET = "10.231.7"
BRIDGE = "f7br"
PREFIX = "f7"
LOCK = Path(tempfile.gettempdir()) / "m1000-fleet-netns.lock"


class LabUnavailable(RuntimeError):
    """This machine cannot build the lab (not root, no ip/sshd, no namespaces)."""


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {p.returncode}: {p.stderr.strip()}")
    return p


def capability_problem() -> str | None:
    """Why the lab cannot be built here, or None."""
    if os.geteuid() != 0:
        return "network namespaces and sshd need root"
    for tool in ("ip", "ssh-keygen", "useradd", "userdel"):
        if shutil.which(tool) is None:
            return f"{tool} not installed"
    if not os.access("/usr/sbin/sshd", os.X_OK):
        return "/usr/sbin/sshd not installed (openssh-server)"
    probe = f"{PREFIX}probe{os.getpid()}"[:15]
    p = _run("ip", "netns", "add", probe, check=False)
    if p.returncode != 0:
        return f"cannot create a network namespace: {p.stderr.strip()}"
    _run("ip", "netns", "del", probe, check=False)
    return None


@dataclass
class Host:
    index: int
    name: str
    base: Path
    ns: str = ""
    veth: str = ""
    user: str = ""
    home: Path = field(default_factory=Path)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"{SUBNET}.{11 + self.index}"

    @property
    def hostkey(self) -> Path:
        return self.base / f"hostkey{self.index}"

    @property
    def sshd_config(self) -> Path:
        return self.base / f"sshd{self.index}.conf"

    @property
    def log(self) -> Path:
        return self.base / f"sshd{self.index}.log"

    def public_key_line(self) -> str:
        kind, blob = (self.hostkey.with_suffix(".pub").read_text().split()[:2])
        return f"{self.address} {kind} {blob}"

    # --- sshd lifecycle -------------------------------------------------
    def start(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, "/usr/sbin/sshd", "-D", "-f", str(self.sshd_config), "-E", str(self.log)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd of {self.name} exited {self.proc.returncode}: {self.log.read_text()[-500:]}")
            with contextlib.suppress(OSError), socket.create_connection((self.address, 22), timeout=0.5):
                return
            time.sleep(0.05)
        raise RuntimeError(f"sshd of {self.name} did not listen on {self.address}:22")

    def kill_sessions(self) -> int:
        """Kill the per-connection sshd processes (the listener stays): a cut session."""
        if self.proc is None:
            return 0
        try:  # recursive: a connection's privileged sshd has an unprivileged "[net]" child of its own
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return 0
        for c in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                c.kill()
        # SIGKILL returns before the process is gone: wait until the listener has reaped each one
        _, alive = psutil.wait_procs(children, timeout=5)
        if alive:
            raise RuntimeError(f"sshd of {self.name}: sessions {[c.pid for c in alive]} outlived SIGKILL by 5 s")
        return len(children)

    def stop(self) -> None:
        if self.proc is None:
            return
        self.kill_sessions()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None
        # A session orphaned before the listener stopped (not its child any more) is no less an sshd of this host
        orphans = []
        for pid in _run("ip", "netns", "pids", self.ns, check=False).stdout.split():
            with contextlib.suppress(psutil.Error, ValueError):
                if (p := psutil.Process(int(pid))).name() == "sshd":
                    p.kill()
                    orphans.append(p)
        psutil.wait_procs(orphans, timeout=5)

    def regenerate_host_key(self) -> None:
        """A new host key (as after a reinstall): restarts sshd with it."""
        self.stop()
        for p in (self.hostkey, self.hostkey.with_suffix(".pub")):
            p.unlink(missing_ok=True)
        _keygen(self.hostkey)
        self.start()

    def link(self, up: bool) -> None:
        _run("ip", "link", "set", self.veth, "up" if up else "down")

    def shape(self, rate_mbit: int | None) -> None:
        """Limit the link towards this host (tc tbf) or remove the limit."""
        _run("tc", "qdisc", "del", "dev", self.veth, "root", check=False)
        if rate_mbit:
            _run("tc", "qdisc", "add", "dev", self.veth, "root", "tbf", "rate", f"{rate_mbit}mbit",
                 "burst", "64kb", "latency", "400ms")


def _keygen(path: Path) -> None:
    _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path))


SSHD_CONFIG = """\
Port 22
ListenAddress {address}
HostKey {hostkey}
PidFile none
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin no
AllowUsers {user}
StrictModes yes
X11Forwarding no
AllowTcpForwarding no
LogLevel VERBOSE
ClientAliveInterval 5
Subsystem sftp internal-sftp
"""


class Lab:
    def __init__(self, names: tuple[str, ...] = ("mod-a", "mod-b", "mod-c")) -> None:
        self.names = names
        self.hosts: list[Host] = []
        self._lock_fd: int | None = None
        self.base = Path()

    @property
    def gateway(self) -> str:
        return f"{SUBNET}.1"

    @property
    def known_hosts(self) -> Path:
        return self.base / "known_hosts"

    @property
    def client_key(self) -> Path:
        return self.base / "id_ed25519"

    def __enter__(self) -> Lab:
        self._lock_fd = os.open(LOCK, os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            self._sweep()
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- building ---------------------------------------------------------
    def _build(self) -> None:
        # Homes must be reachable by the unprivileged users (pytest's tmp is 0700 root).
        self.base = Path(tempfile.mkdtemp(prefix="f7lab-", dir="/tmp"))
        self.base.chmod(0o755)
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
        _keygen(self.client_key)
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
        _run("ip", "addr", "add", f"{self.gateway}/24", "dev", BRIDGE)
        _run("ip", "link", "set", BRIDGE, "up")
        for i, name in enumerate(self.names):
            h = Host(index=i, name=name, base=self.base, ns=f"{PREFIX}ns{i}", veth=f"{PREFIX}v{i}",
                     user=f"{PREFIX}u{i}", home=self.base / f"home{i}")
            self.hosts.append(h)
            peer = f"{PREFIX}p{i}"
            _run("ip", "netns", "add", h.ns)
            _run("ip", "link", "add", h.veth, "type", "veth", "peer", "name", peer)
            _run("ip", "link", "set", peer, "netns", h.ns)
            _run("ip", "link", "set", h.veth, "master", BRIDGE)
            _run("ip", "link", "set", h.veth, "up")
            nsx = ("ip", "netns", "exec", h.ns)
            _run(*nsx, "ip", "addr", "add", f"{h.address}/24", "dev", peer)
            _run(*nsx, "ip", "link", "set", peer, "up")
            _run(*nsx, "ip", "link", "set", "lo", "up")
            _run(*nsx, "ip", "route", "add", "default", "via", self.gateway)
            _run("useradd", "-M", "-d", str(h.home), "-s", "/bin/sh", "-p", "*", h.user)
            ssh_dir = h.home / ".ssh"
            ssh_dir.mkdir(parents=True, mode=0o700)
            (ssh_dir / "authorized_keys").write_text(self.client_key.with_suffix(".pub").read_text())
            (ssh_dir / "authorized_keys").chmod(0o600)
            h.home.chmod(0o755)
            _run("chown", "-R", f"{h.user}:{h.user}", str(h.home))
            _keygen(h.hostkey)
            h.sshd_config.write_text(SSHD_CONFIG.format(address=h.address, hostkey=h.hostkey, user=h.user))
        self.write_known_hosts()
        for h in self.hosts:
            h.start()

    def write_known_hosts(self) -> None:
        self.known_hosts.write_text("".join(h.public_key_line() + "\n" for h in self.hosts))

    def host(self, name: str) -> Host:
        return next(h for h in self.hosts if h.name == name)

    # --- teardown ---------------------------------------------------------
    def _sweep(self) -> None:
        """Remove what a crashed earlier lab left behind (only our own names)."""
        for ns in _run("ip", "netns", "list", check=False).stdout.split("\n"):
            n = ns.split(" ")[0]
            if n.startswith(f"{PREFIX}ns"):
                self._kill_namespace(n)
                _run("ip", "netns", "del", n, check=False)
        _run("ip", "link", "del", BRIDGE, check=False)
        for i in range(8):
            _run("ip", "link", "del", f"{PREFIX}v{i}", check=False)
            user = f"{PREFIX}u{i}"
            if _run("id", user, check=False).returncode == 0:
                self._kill_user(user)
                _run("userdel", user, check=False)

    @staticmethod
    def _kill_namespace(ns: str) -> None:
        """SIGKILL every process still inside network namespace ``ns``."""
        for pid in _run("ip", "netns", "pids", ns, check=False).stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), 9)

    @staticmethod
    def _kill_user(user: str) -> None:
        for p in psutil.process_iter(["username"]):
            if p.info["username"] == user:
                with contextlib.suppress(psutil.Error):
                    p.kill()

    def close(self) -> None:
        try:
            for h in self.hosts:
                with contextlib.suppress(Exception):
                    h.stop()
            for h in self.hosts:
                # Whatever the tests started as the module's user (agents, supervisors).
                self._kill_user(h.user)
                self._kill_namespace(h.ns)
                _run("ip", "netns", "del", h.ns, check=False)
                _run("ip", "link", "del", h.veth, check=False)
                _run("userdel", h.user, check=False)
            _run("ip", "link", "del", BRIDGE, check=False)
            if self.base != Path() and self.base.exists():
                shutil.rmtree(self.base, ignore_errors=True)
        finally:
            self.hosts = []
            if self._lock_fd is not None:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
                os.close(self._lock_fd)
                self._lock_fd = None
