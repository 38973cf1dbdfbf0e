"""Apply a plan on modules over SSH: probe, upload, install, write config and service, (re)start, wait.

One SSH session per module (``deploy_module``), modules in parallel (``deploy``). The service is
started and restarted on the module by ``scripts/service_ctl.py``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal

from controller.inventory import Module
from controller.remote import ssh
from controller.remote.deploy.model import (
    SERVICE,
    Action,
    DeployError,
    DeployOptions,
    DeployResult,
    Desired,
    HeartbeatWait,
    ModuleFacts,
    Status,
    Wheelhouse,
    one_line,
    script,
)
from controller.remote.deploy.plan import PROBE, parse_probe, plan_module
from controller.remote.deploy.render import (
    agent_tls_files,
    check_config,
    render_config,
    render_service,
    worker_command_available,
)
from controller.remote.deploy.wheelhouse import WheelhouseBuilder

SERVICE_CTL = script("service_ctl.py")


def _ensure_dirs(s: ssh.Session, facts: ModuleFacts) -> None:
    a = facts.agent_dir
    s.run(["mkdir", "-p", "--", f"{a}/wheels", f"{facts.workdir}/data"], what="mkdir")
    s.run(["chmod", "700", "--", a], what="chmod agent folder")


def _apply(s: ssh.Session, module: Module, facts: ModuleFacts, desired: Desired,
           actions: Sequence[Action], python: str) -> None:
    a = facts.agent_dir
    wh = desired.wheelhouse
    venv = f"{a}/venv"
    pip = [f"{venv}/bin/python", f"{a}/wheels/{wh.pip.name}/pip", "install", "-q", "--disable-pip-version-check",
           "--no-cache-dir", "--no-index", "--only-binary=:all:"]
    _ensure_dirs(s, facts)
    for act in actions:
        if act.kind == "upload_wheels":
            for p in (*wh.deps, wh.pip):
                if facts.wheels.get(p.name) != p.stat().st_size:
                    s.put_file(p, f"{a}/wheels/{p.name}")
        elif act.kind == "create_venv":
            s.run([python, "-m", "venv", "--without-pip", "--clear", venv], what="create virtualenv", timeout=300)
        elif act.kind == "install":
            proj_dir = f"{a}/project/{wh.project_digest}"
            s.run(["mkdir", "-p", "--", proj_dir], what="mkdir")
            s.put_file(wh.project, f"{proj_dir}/{wh.project.name}")
            s.write_file(f"{a}/requirements-agent.lock", wh.lock.read_bytes())
            s.run([*pip, "--require-hashes", "--find-links", f"{a}/wheels", "-r", f"{a}/requirements-agent.lock"],
                  what="install agent dependencies", timeout=900)
            s.run([*pip, "--no-deps", "--force-reinstall", f"{proj_dir}/{wh.project.name}"],
                  what="install m1000-fleet", timeout=300)
            s.run([f"{venv}/bin/python", "-c", "import agent.worker, agent.settings, contract.celery_app"],
                  what="import check")
        elif act.kind == "write_config":
            if desired.password is not None:
                s.write_file(f"{a}/broker_password", desired.password.encode(), mode=0o600)
            if desired.tls_files:
                s.run(["mkdir", "-p", "-m", "700", "--", f"{a}/tls"], what="mkdir")
                for name, data in desired.tls_files:
                    s.write_file(f"{a}/tls/{name}", data, mode=0o600)
            s.write_file(f"{a}/agent.toml", desired.config_text.encode(), mode=0o600)
        elif act.kind == "write_service":
            if desired.service_mode == "systemd":
                unit_dir = f"{facts.home}/.config/systemd/user"
                s.run(["mkdir", "-p", "--", unit_dir], what="mkdir")
                s.write_file(f"{unit_dir}/{SERVICE}", desired.service_text.encode())
            else:
                s.write_file(f"{a}/run-agent.sh", desired.launcher_text.encode(), mode=0o700)
        elif act.kind in ("start", "restart"):
            s.run([python, "-c", SERVICE_CTL, act.kind, desired.service_mode, a], what=f"{act.kind} service",
                  timeout=120)


def _write_state(s: ssh.Session, facts: ModuleFacts, desired: Desired, version: str) -> None:
    state = {**desired.digests(), "mode": desired.service_mode, "python": ".".join(map(str, facts.version)),
             "agent_version": version, "deployed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    s.write_file(f"{facts.agent_dir}/state.json", json.dumps(state, indent=1).encode(), mode=0o600)


def probe(s: ssh.Session, module: Module, python: str) -> ModuleFacts:
    data = s.python(python, PROBE, module.workdir, what="probe", timeout=60)
    return parse_probe(module.name, data)


def _project_version(wheel: Path) -> str:
    return wheel.name.split("-")[1]


def deploy_module(module: Module, opts: DeployOptions, wait: HeartbeatWait | None,
                  wheelhouse: Callable[[ModuleFacts], Wheelhouse], worker_command: bool) -> DeployResult:
    t0 = time.monotonic()
    target = ssh.SshTarget.of(module, opts.known_hosts, opts.identity, connect_timeout=opts.connect_timeout,
                              passphrase_file=opts.passphrase_file)
    actions: tuple[Action, ...] = ()
    try:
        with ssh.open_session(target) as s:
            facts = probe(s, module, opts.python)
            wh = wheelhouse(facts)
            tls = agent_tls_files(module, opts.settings, opts.credentials)
            config_text, password = render_config(module, facts.workdir, opts.settings, broker_url=opts.broker_url,
                                                  metrics_host=opts.metrics_host, credentials=opts.credentials,
                                                  tls_files=sorted(tls))
            check_config(config_text)
            mode: Literal["systemd", "supervise"] = "systemd" if facts.systemd_user else "supervise"
            unit, launcher = render_service(module, facts.workdir, mode, worker_command=worker_command)
            desired = Desired(wh, config_text, password, mode, unit, launcher, tuple(sorted(tls.items())))
            actions = plan_module(facts, desired)
            version = _project_version(wh.project)
            if opts.dry_run:
                return DeployResult(module.name, "planned", tuple(map(str, actions)), None, facts.agent_version,
                                    None, time.monotonic() - t0)
            started = time.time()
            run = opts.busy(module.name) if (opts.busy and facts.running and actions and not opts.force) else None
            if run:
                return DeployResult(module.name, "busy", tuple(map(str, actions)),
                                    f"{module.name}: busy with run {run}: not restarted (--force interrupts it "
                                    "cleanly; it resumes from its passed keys)", facts.agent_version, None,
                                    time.monotonic() - t0)
            if actions:
                _apply(s, module, facts, desired, actions, facts.python)
                _write_state(s, facts, desired, version)
            else:
                version = facts.agent_version or version
        beat: bool | None = None
        if wait is not None:
            # Unchanged and running: any recent beat will do; after a (re)start: a beat from the new agent.
            since = started - 2.0 if actions else time.time() - opts.settings.offline_after
            hb = wait(module.name, since, opts.heartbeat_timeout)
            beat = hb is not None
            if hb is None:
                return DeployResult(module.name, "failed", tuple(map(str, actions)),
                                    f"{module.name}: no heartbeat within {opts.heartbeat_timeout:.0f}s "
                                    f"(see {facts.agent_dir}/agent.log on the module)", version, False,
                                    time.monotonic() - t0)
            version = hb.agent_version
        status: Status = "changed" if actions else "unchanged"
        return DeployResult(module.name, status, tuple(map(str, actions)), None, version, beat, time.monotonic() - t0)
    except (ssh.SshError, DeployError, OSError) as exc:
        return DeployResult(module.name, "failed", tuple(map(str, actions)), one_line(module.name, exc), None, None,
                            time.monotonic() - t0)


def deploy(modules: Iterable[Module], opts: DeployOptions, wait: HeartbeatWait | None = None,
           on_done: Callable[[DeployResult], None] | None = None) -> dict[str, DeployResult]:
    """Deploy every module (bounded parallelism); one result per module, failures included."""
    mods = list(modules)
    builder = opts.wheelhouse or WheelhouseBuilder(opts.source_root, opts.cache_dir, project=opts.project_wheel)
    worker_command = worker_command_available()

    def one(m: Module) -> DeployResult:
        r = deploy_module(m, opts, wait, builder, worker_command)
        if on_done is not None:
            on_done(r)
        return r

    with ThreadPoolExecutor(max_workers=max(1, min(opts.max_parallel, len(mods) or 1))) as pool:
        futures = {m.name: pool.submit(one, m) for m in mods}
        return {name: f.result() for name, f in futures.items()}

