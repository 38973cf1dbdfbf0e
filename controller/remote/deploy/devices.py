"""``fleetctl devices check``: what each module looks like over SSH (the read-only probe, nothing changed)."""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from controller.inventory import Module
from controller.remote import ssh
from controller.remote.deploy.model import CheckResult, DeployError, one_line
from controller.remote.deploy.plan import PROBE, parse_probe


def check_module(module: Module, known_hosts: Path, identity: Path | None = None, python: str = "python3",
                 connect_timeout: float = 10.0) -> CheckResult:
    target = ssh.SshTarget.of(module, known_hosts, identity, connect_timeout=connect_timeout)
    try:
        with ssh.open_session(target) as s:
            data = s.python(python, PROBE, module.workdir, what="probe", timeout=60)
    except (ssh.SshError, DeployError, OSError) as exc:
        return CheckResult(module.name, False, error=one_line(module.name, exc))
    try:
        facts = parse_probe(module.name, data)
        err = None
    except DeployError as exc:
        return CheckResult(module.name, True, python=".".join(map(str, data.get("version", []))), error=str(exc))
    service = "not deployed" if not facts.state else ("running" if facts.running else "stopped")
    return CheckResult(module.name, True, ".".join(map(str, facts.version)), facts.machine, facts.free_bytes,
                       facts.agent_version, service, err)


def check(modules: Iterable[Module], known_hosts: Path, identity: Path | None = None, max_parallel: int = 8,
          python: str = "python3", connect_timeout: float = 10.0) -> dict[str, CheckResult]:
    mods = list(modules)
    with ThreadPoolExecutor(max_workers=max(1, min(max_parallel, len(mods) or 1))) as pool:
        futures = {m.name: pool.submit(check_module, m, known_hosts, identity, python, connect_timeout) for m in mods}
        return {n: f.result() for n, f in futures.items()}
