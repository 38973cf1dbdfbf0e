"""Install and update the agent on modules over SSH, idempotently and in parallel.

One deploy of one module:

1. probe (read only): Python version and platform, workdir, free disk, what is already
   deployed (``<workdir>/agent/state.json``), whether the service runs;
2. plan (pure, ``plan_module``): compare with the desired state (wheelhouse, config,
   service files); nothing to do when everything matches and the service runs;
3. apply: upload missing wheels, create the virtualenv (``--without-pip``; pip runs from
   its wheel), install offline with hashes checked (``--no-index --require-hashes``),
   write the config (0600, password in a 0600 file inside a 0700 folder), write and
   (re)start the service: a systemd user unit where systemd runs, else a supervised
   process (``run-agent.sh`` restarting the agent with back-off);
4. wait for the agent's first heartbeat (a callable, see ``heartbeat_waiter``).

The wheelhouse (the project's wheel, the agent's locked dependencies for the module's
Python and platform, and pip) is built on the controller once and cached per platform.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit, urlunsplit

from agent.settings import AgentSettings
from contract.records import Heartbeat
from contract.settings import BrokerSettings
from controller.errors import FleetctlError
from controller.inventory import Module
from controller.remote import ssh

if TYPE_CHECKING:
    from contract.kv import Beat

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "m1000-fleet" / "wheelhouse"
MIN_PYTHON = (3, 10)
SERVICE = "fleet-agent.service"

Status = Literal["changed", "unchanged", "failed", "planned", "busy"]


class DeployError(FleetctlError):
    """A deploy step failed; the message names the module and the step."""


# --------------------------------------------------------------------------- records
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
    digest: str  # of the project wheel's content, the dependency names and the lock

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
    tls_files: tuple[tuple[str, bytes], ...] = ()  # written to <agent_dir>/tls/ (CA, the module's client cert/key)

    def digests(self) -> dict[str, str]:
        h = hashlib.sha256((self.config_text + "\0" + (self.password or "")).encode())
        for name, data in self.tls_files:
            h.update(b"\0" + name.encode() + b"\0" + data)
        secret = h.hexdigest()
        return {
            "install": self.wheelhouse.digest,
            "config": secret,
            "service": _sha(self.service_mode + "\0" + self.service_text + "\0" + self.launcher_text),
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
    known_hosts: Path
    settings: BrokerSettings
    identity: Path | None = None
    broker_url: str | None = None  # as the modules must see it (default: settings.broker_url)
    metrics_host: str = "0.0.0.0"
    python: str = "python3"
    cache_dir: Path = DEFAULT_CACHE
    source_root: Path = ROOT
    max_parallel: int = 8
    heartbeat_timeout: float = 60.0
    dry_run: bool = False
    connect_timeout: float = 10.0
    wheelhouse: Callable[[ModuleFacts], Wheelhouse] | None = None  # default: WheelhouseBuilder
    project_wheel: Path | None = None  # deploy this wheel instead of building one from source_root
    force: bool = False  # restart an agent that is running a run (it interrupts it cleanly; the run resumes)
    busy: Callable[[str], str | None] | None = None  # module -> the run it is busy with (from its heartbeat)
    credentials: Path | None = None  # per-module broker passwords (`fleetctl broker acl`): <module>.password
    passphrase_file: Path | None = None  # passphrase of ``identity`` (else ssh-agent)


# --------------------------------------------------------------------------- pure parts
def _sha(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


PROBE = r"""
import json, os, platform, subprocess, sys
workdir = os.path.abspath(os.path.expanduser(sys.argv[1]))
agent = os.path.join(workdir, "agent")
def read(p):
    try:
        with open(p, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None
try:
    state = json.loads(read(os.path.join(agent, "state.json")) or "{}")
except ValueError:
    state = {}
d = workdir
while not os.path.isdir(d):
    d = os.path.dirname(d)
st = os.statvfs(d)
uid = os.getuid()
systemd = os.path.isdir("/run/systemd/system") and os.path.exists("/run/user/%d/bus" % uid)
running = False
if state.get("mode") == "systemd":
    if systemd:
        env = dict(os.environ, XDG_RUNTIME_DIR="/run/user/%d" % uid)
        r = subprocess.run(["systemctl", "--user", "is-active", "fleet-agent.service"],
                           capture_output=True, text=True, env=env)
        running = r.stdout.strip() == "active"
else:
    try:
        pid = int(read(os.path.join(agent, "supervisor.pid")) or "")
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            running = os.path.join(agent, "run-agent.sh").encode() in f.read()
    except (ValueError, OSError):
        pass
wd = os.path.join(agent, "wheels")
wheels = {n: os.path.getsize(os.path.join(wd, n)) for n in os.listdir(wd)} if os.path.isdir(wd) else {}
print(json.dumps({
    "python": sys.executable, "version": list(sys.version_info[:3]), "machine": platform.machine(),
    "glibc": platform.libc_ver()[1] or None, "home": os.path.expanduser("~"), "workdir": workdir,
    "free": st.f_bavail * st.f_frsize, "systemd_user": systemd, "running": running,
    "venv_ok": os.access(os.path.join(agent, "venv", "bin", "python"), os.X_OK),
    "wheels": wheels, "state": state if isinstance(state, dict) else {},
}))
"""


def parse_probe(module: str, data: dict[str, Any]) -> ModuleFacts:
    """The probe's JSON answer as facts; one clear error when it is not what we expect."""
    try:
        v = tuple(int(x) for x in data["version"])
        facts = ModuleFacts(
            python=str(data["python"]), version=(v[0], v[1], v[2]), machine=str(data["machine"]),
            glibc=data.get("glibc"), home=str(data["home"]), workdir=str(data["workdir"]),
            free_bytes=int(data["free"]), systemd_user=bool(data["systemd_user"]), running=bool(data["running"]),
            venv_ok=bool(data["venv_ok"]), wheels={str(k): int(s) for k, s in dict(data.get("wheels", {})).items()},
            state={str(k): str(s) for k, s in dict(data.get("state", {})).items()},
        )
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise DeployError(f"{module}: probe answer not understood ({exc!r}): {str(data)[:200]}") from None
    if facts.version[:2] < MIN_PYTHON:
        raise DeployError(f"{module}: {facts.python} is Python {'.'.join(map(str, facts.version))}; "
                          f"the agent needs >= {'.'.join(map(str, MIN_PYTHON))}")
    return facts


def toml_str(value: str) -> str:
    """A TOML basic string for any text (json escapes, minus what TOML lacks)."""
    s = json.dumps(value, ensure_ascii=False)
    return s.replace("\x7f", "\\u007f")


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    return toml_str(str(v))


def split_password(url: str) -> tuple[str, str | None]:
    """``redis://user:pw@host/0`` -> (``redis://user@host/0``, ``pw``); each server of a ``sentinel://`` list."""
    if ";" in url:
        split = [split_password(chunk) for chunk in url.split(";")]
        return ";".join(u for u, _ in split), next((pw for _, pw in split if pw is not None), None)
    parts = urlsplit(url)
    if parts.password is None:
        return url, None
    from urllib.parse import unquote

    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = (f"{parts.username}@" if parts.username else "") + host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment)), unquote(parts.password)


_SHARED = ("run_soft_time_limit", "run_time_limit", "heartbeat_interval", "offline_after", "max_attempts",
           "result_expires")


def check_broker_url_option(broker_url: str | None) -> None:
    """A broker URL given on the command line must carry no password (``ps``, shell history)."""
    if broker_url is not None and urlsplit(broker_url).password is not None:
        raise DeployError("--broker-url carries a password: command lines are visible to every user (ps) and kept "
                          "in shell history; give the URL without it and put the password in broker_password_file "
                          "([fleet] of the config file, mode 0600), or use --module-credentials")


def read_secret(path: Path, what: str) -> str:
    try:
        secret = Path(path).expanduser().read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise DeployError(f"{path}: cannot read the {what}: {exc.strerror or exc}") from None
    if not secret:
        raise DeployError(f"{path}: the {what} file is empty")
    return secret


def module_credential(module: str, credentials: Path) -> str:
    """The broker password of ``module``'s own Redis user, from ``fleetctl broker acl``'s folder."""
    return read_secret(Path(credentials) / f"{module}.password", f"broker password of {module}")


def with_user(url: str, user: str) -> str:
    if ";" in url:  # every server of a sentinel:// list
        return ";".join(with_user(chunk, user) for chunk in url.split(";"))
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{user}@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def agent_broker(module: Module, settings: BrokerSettings, broker_url: str | None,
                 credentials: Path | None) -> tuple[str, str | None]:
    """(URL without password, password) the agent of ``module`` connects with.

    The password comes from a file, never from the command line: the module's own ACL user
    (``credentials/<module>.password``) when ``credentials`` is given, else the controller's
    ``broker_password_file`` (or a password inside the config file's ``broker_url``).
    """
    check_broker_url_option(broker_url)
    bare, password = split_password(broker_url or settings.broker_url)
    if credentials is not None:
        return with_user(bare, module.name), module_credential(module.name, credentials)
    if settings.broker_password_file:
        password = read_secret(settings.broker_password_file, "broker password")
    return bare, password


TLS_SETTINGS = {"ca.crt": "broker_tls_ca_file", "client.crt": "broker_tls_cert_file",
                "client.key": "broker_tls_key_file"}


def agent_tls_files(module: Module, settings: BrokerSettings, credentials: Path | None) -> dict[str, bytes]:
    """TLS files a module's agent needs: the controller's CA file, and the module's own client
    certificate and key (``credentials/<module>.crt`` and ``.key``) when they exist."""
    files: dict[str, bytes] = {}
    if settings.broker_tls_ca_file:
        files["ca.crt"] = Path(settings.broker_tls_ca_file).expanduser().read_bytes()
    if credentials is not None:
        crt, key = Path(credentials) / f"{module.name}.crt", Path(credentials) / f"{module.name}.key"
        if crt.is_file() and key.is_file():
            files["client.crt"], files["client.key"] = crt.read_bytes(), key.read_bytes()
    return files


def render_config(module: Module, workdir: str, settings: BrokerSettings, *, broker_url: str | None = None,
                  metrics_host: str = "0.0.0.0", credentials: Path | None = None,
                  tls_files: Iterable[str] = ()) -> tuple[str, str | None]:
    """The agent's TOML config for ``module`` and the broker password to store beside it (or None)."""
    url = broker_url or settings.broker_url
    if urlsplit(url).scheme not in ("redis", "rediss", "sentinel"):
        raise DeployError(f"broker {urlsplit(url).scheme}:// cannot reach remote modules; use a redis:// broker "
                          "(fleet.broker_url or --broker-url)")
    bare, password = agent_broker(module, settings, broker_url, credentials)
    agent_dir = f"{workdir}/agent"
    fleet: dict[str, Any] = {"broker_url": bare}
    if password is not None:
        fleet["broker_password_file"] = f"{agent_dir}/broker_password"
    for name in tls_files:
        fleet[TLS_SETTINGS[name]] = f"{agent_dir}/tls/{name}"
    fleet["data_dir"] = f"{workdir}/data"
    fleet.update({k: getattr(settings, k) for k in _SHARED})
    if urlsplit(url).scheme == "sentinel" and settings.broker_sentinel_master:
        fleet["broker_sentinel_master"] = settings.broker_sentinel_master
    agent = {"module": module.name, "workdir": workdir, "model_root": module.model_root,
             "metrics_host": metrics_host, "metrics_port": module.metrics_port}
    lines = ["# m1000-fleet agent config, written by `fleetctl deploy` (the next deploy overwrites it)", "[fleet]"]
    lines += [f"{k} = {_toml_value(v)}" for k, v in fleet.items()]
    lines += ["", "[agent]"]
    lines += [f"{k} = {_toml_value(v)}" for k, v in agent.items()]
    return "\n".join(lines) + "\n", password


def check_config(text: str) -> None:
    """The rendered config is read by the agent's own settings code (catches any drift)."""
    import tomllib

    data = tomllib.loads(text)
    unknown = (set(data["fleet"]) - set(BrokerSettings.model_fields)) | (set(data["agent"]) - set(
        AgentSettings.model_fields))
    if unknown:
        raise DeployError(f"rendered config has settings the agent does not know: {sorted(unknown)}")


def systemd_quote(word: str) -> str:
    """One word for a systemd ``ExecStart=``/``Environment=`` line ($ and % escaped)."""
    w = word.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return f'"{w}"'


def systemd_path(path: str) -> str:
    """A path for a systemd setting that takes one unquoted path (``WorkingDirectory=``): % escaped."""
    if any(ord(c) < 32 for c in path) or not path.startswith("/"):
        raise DeployError(f"work folder {path!r}: must be an absolute path without control characters")
    return path.replace("%", "%%")


def sh_quote(word: str) -> str:
    import shlex

    return shlex.quote(word)


def agent_argv(venv: str, config: str, *, worker_command: bool) -> list[str]:
    """How the service runs the agent: ``fleet-agent worker --config FILE`` (or the module form)."""
    if worker_command:
        return [f"{venv}/bin/fleet-agent", "worker", "--config", config]
    return [f"{venv}/bin/python", "-m", "agent.worker"]


UNIT = """\
# m1000-fleet agent, a systemd user service written by `fleetctl deploy`.
[Unit]
Description=m1000-fleet agent (Celery worker of module {module})
After=network-online.target

[Service]
Type=simple
WorkingDirectory={workdir}
Environment={env}
ExecStart={exec}
# Restart: also how a run's hard time limit ends (the kernel's SIGALRM ends the agent; the agent that
# starts again stops what the run left and ends the run as failed).
Restart=always
RestartSec=5
# SIGTERM to the agent alone: it interrupts its run cleanly (the release's servers included) and the
# run resumes when it starts again; whatever is left after TimeoutStopSec is SIGKILLed.
KillMode=mixed
TimeoutStopSec=60
# each run's processes in a cgroup of their own under the unit's (stopped with the run, and after a crash)
Delegate=yes

[Install]
WantedBy=default.target
"""

LAUNCHER = """\
#!/bin/sh
# m1000-fleet agent supervisor, written by `fleetctl deploy`: runs the agent, restarts it
# with back-off when it exits, stops it on SIGTERM.
cd {workdir} || exit 1
echo $$ > {pidfile}
child=
trap 'if [ -n "$child" ]; then kill -TERM "$child" 2>/dev/null; wait "$child"; fi; exit 0' TERM INT
delay=1
while :; do
  start=$(date +%s)
  FLEET_CONFIG={config} {command} >> {log} 2>&1 &
  child=$!
  wait "$child"
  code=$?
  child=
  echo "$(date -u +%FT%TZ) agent exited with $code; restarting in $delay s" >> {log}
  [ $(( $(date +%s) - start )) -gt 60 ] && delay=1
  sleep "$delay"
  [ "$delay" -lt 30 ] && delay=$(( delay * 2 ))
done
"""


def render_service(module: Module, workdir: str, mode: Literal["systemd", "supervise"], *,
                   worker_command: bool) -> tuple[str, str]:
    """(systemd unit text or "", launcher script): every path quoted for its reader."""
    agent_dir = f"{workdir}/agent"
    config = f"{agent_dir}/agent.toml"
    argv = agent_argv(f"{agent_dir}/venv", config, worker_command=worker_command)
    if mode == "systemd":
        unit = UNIT.format(module=module.name, workdir=systemd_path(workdir),
                           env=systemd_quote(f"FLEET_CONFIG={config}"),
                           exec=" ".join(systemd_quote(a) for a in argv))
        return unit, ""
    launcher = LAUNCHER.format(workdir=sh_quote(workdir), pidfile=sh_quote(f"{agent_dir}/supervisor.pid"),
                               config=sh_quote(config), command=" ".join(sh_quote(a) for a in argv),
                               log=sh_quote(f"{agent_dir}/agent.log"))
    return "", launcher


def plan_module(facts: ModuleFacts, desired: Desired) -> tuple[Action, ...]:
    """What must change on a module to reach ``desired`` (empty: nothing)."""
    want = desired.digests()
    have = facts.state
    actions: list[Action] = []
    wh = desired.wheelhouse
    missing = [p.name for p in (*wh.deps, wh.pip) if facts.wheels.get(p.name) != p.stat().st_size]
    version = ".".join(map(str, facts.version))
    new_venv = not facts.venv_ok or have.get("python") != version
    install = new_venv or have.get("install") != want["install"]
    if missing:
        actions.append(Action("upload_wheels", f"{len(missing)} files"))
    if new_venv:
        actions.append(Action("create_venv", f"Python {version}"))
    if install:
        actions.append(Action("install", f"m1000-fleet {wh.project.name.split('-')[1]} + {len(wh.deps)} wheels"))
    if have.get("config") != want["config"]:
        actions.append(Action("write_config"))
    if have.get("service") != want["service"] or have.get("mode") != desired.service_mode:
        actions.append(Action("write_service", desired.service_mode))
    if actions:
        actions.append(Action("restart" if facts.running else "start", desired.service_mode))
    elif not facts.running:
        actions.append(Action("start", desired.service_mode))
    return tuple(actions)


# --------------------------------------------------------------------------- wheelhouse (controller side)
def wheel_content_digest(wheel: Path) -> str:
    """Digest of a wheel's members (names and bytes), independent of zip timestamps."""
    h = hashlib.sha256()
    with zipfile.ZipFile(wheel) as z:
        for name in sorted(z.namelist()):
            h.update(name.encode() + b"\0" + hashlib.sha256(z.read(name)).digest())
    return h.hexdigest()


# What the project wheel carries: the agent needs ``contract`` (records, KV layout, Celery app, broker settings).
PROJECT_PACKAGES = ("agent", "contract", "controller", "simulator")


def build_project_wheel(source_root: Path, out_dir: Path) -> Path:
    """Build the project's wheel from a copy of the source (the work tree stays untouched)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fleet-wheel-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for name in ("pyproject.toml", "README.md"):
            if (source_root / name).exists():
                shutil.copy2(source_root / name, src / name)
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
        for pkg in PROJECT_PACKAGES:
            if (source_root / pkg).is_dir():
                shutil.copytree(source_root / pkg, src / pkg, ignore=ignore)
        dist = Path(tmp) / "dist"
        uv = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
        if Path(uv).exists():
            cmd = [uv, "build", "--wheel", "--quiet", "--out-dir", str(dist), str(src)]
        else:
            cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(src)]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        wheels = list(dist.glob("*.whl"))
        if p.returncode != 0 or len(wheels) != 1:
            raise DeployError(f"building the project wheel failed (exit {p.returncode}): {p.stderr.strip()[-300:]}")
        target = out_dir / wheels[0].name
        shutil.move(str(wheels[0]), target)
        return target


def pip_download_argv(facts: ModuleFacts, lock: Path, dest: Path) -> list[str]:
    """``pip download`` of the locked agent dependencies for the module's Python and platform."""
    major, minor = facts.version[:2]
    plats: list[str] = []
    if facts.glibc:
        gmaj, gmin = (int(x) for x in facts.glibc.split(".")[:2])
        plats += [f"manylinux_{gmaj}_{m}_{facts.machine}" for m in range(gmin, 16, -1)]
        plats += [f"manylinux2014_{facts.machine}"]
    plats += [f"linux_{facts.machine}"]
    argv = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--only-binary=:all:",
            "--python-version", f"{major}.{minor}", "--implementation", "cp", "--abi", f"cp{major}{minor}",
            "--abi", "abi3", "--abi", "none"]
    for p in plats:
        argv += ["--platform", p]
    return argv + ["-d", str(dest), "-r", str(lock)]


_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def _lock_for(key: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(key, threading.Lock())


def download_deps(facts: ModuleFacts, lock: Path, cache_dir: Path) -> tuple[tuple[Path, ...], Path]:
    """(dependency wheels, pip wheel) for the module's platform, from the cache or downloaded once."""
    key = f"{facts.platform_key}-{_sha(lock.read_bytes())[:12]}"
    final = cache_dir / key
    with _lock_for(key):
        if not (final / ".complete").exists():
            cache_dir.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=cache_dir))
            try:
                for argv in (pip_download_argv(facts, lock, tmp / "deps"),
                             [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
                              "--only-binary=:all:", "--no-deps", "-d", str(tmp / "pip"), "pip"]):
                    p = subprocess.run(argv, capture_output=True, text=True, timeout=900)
                    if p.returncode != 0:
                        raise DeployError(f"downloading wheels for {facts.platform_key} failed: "
                                          f"{_last_error(p.stderr)}")
                (tmp / ".complete").write_text(key + "\n")
                shutil.rmtree(final, ignore_errors=True)
                tmp.rename(final)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    deps = tuple(sorted((final / "deps").glob("*.whl")))
    pips = sorted((final / "pip").glob("pip-*.whl"))
    if not deps or not pips:
        raise DeployError(f"wheel cache {final} is incomplete; remove it and deploy again")
    return deps, pips[-1]


def _last_error(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith("WARNING")]
    return (lines[-1] if lines else stderr.strip()[-300:])[:300]


class WheelhouseBuilder:
    """Builds the project wheel once and the per-platform wheelhouses on demand (thread safe)."""

    def __init__(self, source_root: Path = ROOT, cache_dir: Path = DEFAULT_CACHE, lock: Path | None = None,
                 project: Path | None = None) -> None:
        self.source_root = source_root
        self.cache_dir = cache_dir
        self.lock = lock or source_root / "requirements-agent.lock"
        if project is not None and not project.is_file():
            raise DeployError(f"{project}: wheel not found")
        self._project: Path | None = project  # a prebuilt wheel, else built from source_root once
        self._guard = threading.Lock()

    def project_wheel(self) -> Path:
        with self._guard:
            if self._project is None:
                out = Path(tempfile.mkdtemp(prefix="fleet-project-"))
                self._project = build_project_wheel(self.source_root, out)
            return self._project

    def __call__(self, facts: ModuleFacts) -> Wheelhouse:
        if not self.lock.is_file():
            raise DeployError(f"{self.lock}: agent lock file not found")
        deps, pip = download_deps(facts, self.lock, self.cache_dir)
        project = self.project_wheel()
        digest = _sha("\n".join([wheel_content_digest(project), _sha(self.lock.read_bytes()),
                                 *sorted(p.name for p in deps), pip.name]))
        return Wheelhouse(deps=deps, pip=pip, project=project, lock=self.lock, digest=digest)


def worker_command_available() -> bool:
    """Whether this source's agent CLI has ``worker`` (else the service runs ``python -m agent.worker``)."""
    try:
        from agent import cli

        return any((c.name or getattr(c.callback, "__name__", "")) == "worker" for c in cli.app.registered_commands)
    except Exception:  # noqa: BLE001 - any import problem: use the module form
        return False


# --------------------------------------------------------------------------- I/O: one module
SERVICE_CTL = r"""
import os, signal, subprocess, sys, time
action, mode, agent = sys.argv[1:4]
pidfile = os.path.join(agent, "supervisor.pid")
launcher = os.path.join(agent, "run-agent.sh")
def running():
    try:
        pid = int(open(pidfile).read())
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return pid if launcher.encode() in f.read() else None
    except (ValueError, OSError):
        return None
if mode == "systemd":
    env = dict(os.environ, XDG_RUNTIME_DIR="/run/user/%d" % os.getuid())
    for cmd in (["daemon-reload"], ["enable", "fleet-agent.service"], [action, "fleet-agent.service"]):
        subprocess.run(["systemctl", "--user"] + cmd, check=True, env=env)
    sys.exit(0)
pid = running()
if pid and action in ("restart", "stop"):
    pgid = os.getpgid(pid)  # the supervisor's session: it and the agent with its children
    os.kill(pid, signal.SIGTERM)  # the supervisor passes it to the agent alone: a clean interrupt of its run
    deadline = time.time() + 60
    while running() and time.time() < deadline:
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
if action == "stop" or (action == "start" and pid):
    sys.exit(0)
if os.fork():
    sys.exit(0)
os.setsid()
if os.fork():
    os._exit(0)
fd = os.open(os.devnull, os.O_RDWR)
for i in (0, 1, 2):
    os.dup2(fd, i)
os.execv("/bin/sh", ["sh", launcher])
"""


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
        return DeployResult(module.name, "failed", tuple(map(str, actions)), _one_line(module.name, exc), None, None,
                            time.monotonic() - t0)


def _one_line(module: str, exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text if text.startswith(f"{module}:") else f"{module}: {text}"


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


# --------------------------------------------------------------------------- heartbeats
def heartbeat_waiter(settings: BrokerSettings, poll: float = 1.0,
                     read: Callable[[BrokerSettings, list[str]], dict[str, Beat | None]] | None = None
                     ) -> HeartbeatWait:
    """Wait for a module's heartbeat that the broker took after ``since`` (the controller's clock: never the
    module's own, which may be off) through the fleet's result backend."""

    def reader(st: BrokerSettings, names: list[str]) -> dict[str, Beat | None]:
        from controller.fleet import read_beats

        return read_beats(st, names)

    get = read or reader

    def wait(module: str, since: float, timeout: float) -> Heartbeat | None:
        deadline = time.monotonic() + timeout
        while True:
            beat = get(settings, [module]).get(module)
            if beat is not None and beat.at >= since:
                return beat.hb
            if time.monotonic() >= deadline:
                return None
            time.sleep(poll)

    return wait


def busy_reader(settings: BrokerSettings) -> Callable[[str], str | None]:
    """module -> the run its latest live heartbeat says it is busy with (None: idle, silent or unknown)."""

    def busy(module: str) -> str | None:
        from controller.fleet import read_beats

        try:
            beat = read_beats(settings, [module]).get(module)
        except Exception:  # broker away: deploy goes on; a restart interrupts a run cleanly anyway
            return None
        fresh = beat is not None and time.time() - beat.at <= settings.offline_after  # the broker's age of it
        return beat.hb.run_id if fresh and beat is not None else None

    return busy


# --------------------------------------------------------------------------- devices check
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


def check_module(module: Module, known_hosts: Path, identity: Path | None = None, python: str = "python3",
                 connect_timeout: float = 10.0) -> CheckResult:
    target = ssh.SshTarget.of(module, known_hosts, identity, connect_timeout=connect_timeout)
    try:
        with ssh.open_session(target) as s:
            data = s.python(python, PROBE, module.workdir, what="probe", timeout=60)
    except (ssh.SshError, DeployError, OSError) as exc:
        return CheckResult(module.name, False, error=_one_line(module.name, exc))
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
