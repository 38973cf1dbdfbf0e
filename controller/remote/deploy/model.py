"""The deploy's records and constants: what a probe found, what a module should have, what a deploy did.

Also the one loader of the remote programs and templates kept as files under ``scripts/``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Literal

from contract.records import Heartbeat
from contract.settings import BrokerSettings
from controller.errors import FleetctlError

# the source tree, three folders above this file
ROOT = Path(__file__).resolve().parents[3]
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "m1000-fleet" / "wheelhouse"
MIN_PYTHON = (3, 10)
SERVICE = "fleet-agent.service"

Status = Literal["changed", "unchanged", "failed", "planned", "busy"]


class DeployError(FleetctlError):
    """A deploy step failed; the message names the module and the step."""


def script(name: str) -> str:
    """The text of ``scripts/<name>``: a program run on the module, or a template of a file written there."""
    return (files(__package__) / "scripts" / name).read_text(encoding="utf-8")


def sha(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def one_line(module: str, exc: BaseException) -> str:
    """An error as one line that starts with the module's name."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text if text.startswith(f"{module}:") else f"{module}: {text}"


@dataclass(frozen=True)
class ModuleFacts:
    """What the probe found on a module."""

    python: str
    version: tuple[int, int, int]
    machine: str
    glibc: str | None
    home: str
    workdir: str  # absolute
    free_bytes: int
    systemd_user: bool
    running: bool
    venv_ok: bool
    wheels: dict[str, int] = field(default_factory=dict)  # name -> size in <agent>/wheels
    state: dict[str, str] = field(default_factory=dict)  # what the last deploy recorded

    @property
    def agent_dir(self) -> str:
        return f"{self.workdir}/agent"

    @property
    def agent_version(self) -> str | None:
        return self.state.get("agent_version")

    @property
    def platform_key(self) -> str:
        return f"cp{self.version[0]}{self.version[1]}-{self.machine}-glibc{self.glibc or 'none'}"


@dataclass(frozen=True)
class Wheelhouse:
    """Files a module installs from: dependency wheels (+pip), the project wheel, the lock."""

    deps: tuple[Path, ...]
    pip: Path
    project: Path
    lock: Path
    # of the project wheel's content, the dependency names and the lock
    digest: str

    @property
    def project_digest(self) -> str:
        return self.digest[:16]


@dataclass(frozen=True)
class Desired:
    wheelhouse: Wheelhouse
    config_text: str
    password: str | None
    service_mode: Literal["systemd", "supervise"]
    service_text: str
    launcher_text: str
    # written to <agent_dir>/tls/ (CA, the module's client cert/key)
    tls_files: tuple[tuple[str, bytes], ...] = ()

    def digests(self) -> dict[str, str]:
        h = hashlib.sha256((self.config_text + "\0" + (self.password or "")).encode())
        for name, data in self.tls_files:
            h.update(b"\0" + name.encode() + b"\0" + data)
        secret = h.hexdigest()
        return {
            "install": self.wheelhouse.digest,
            "config": secret,
            "service": sha(self.service_mode + "\0" + self.service_text + "\0" + self.launcher_text),
        }


@dataclass(frozen=True)
class Action:
    kind: Literal["upload_wheels", "create_venv", "install", "write_config", "write_service", "start", "restart"]
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.kind}" + (f" ({self.detail})" if self.detail else "")


@dataclass(frozen=True)
class DeployResult:
    module: str
    status: Status
    actions: tuple[str, ...] = ()
    error: str | None = None
    agent_version: str | None = None
    heartbeat: bool | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status != "failed"


HeartbeatWait = Callable[[str, float, float], "Heartbeat | None"]  # (module, since ts, timeout) -> beat


@dataclass(frozen=True)
class DeployOptions:
    """How a deploy runs. ``broker_url``: as the modules must see it (default: ``settings.broker_url``);
    ``wheelhouse``: default ``WheelhouseBuilder``; ``project_wheel``: deploy this wheel instead of building one
    from ``source_root``; ``force``: restart an agent that is running a run (it interrupts it cleanly; the run
    resumes); ``busy``: module -> the run it is busy with (from its heartbeat); ``credentials``: per-module broker
    passwords (``fleetctl broker acl``), ``<module>.password``; ``passphrase_file``: passphrase of ``identity``
    (else ssh-agent)."""

    known_hosts: Path
    settings: BrokerSettings
    identity: Path | None = None
    broker_url: str | None = None
    metrics_host: str = "0.0.0.0"
    python: str = "python3"
    cache_dir: Path = DEFAULT_CACHE
    source_root: Path = ROOT
    max_parallel: int = 8
    heartbeat_timeout: float = 60.0
    dry_run: bool = False
    connect_timeout: float = 10.0
    wheelhouse: Callable[[ModuleFacts], Wheelhouse] | None = None
    project_wheel: Path | None = None
    force: bool = False
    busy: Callable[[str], str | None] | None = None
    credentials: Path | None = None
    passphrase_file: Path | None = None


@dataclass(frozen=True)
class CheckResult:
    module: str
    reachable: bool
    python: str | None = None
    machine: str | None = None
    free_bytes: int | None = None
    agent_version: str | None = None
    service: str | None = None  # "running", "stopped", "not deployed"
    error: str | None = None
