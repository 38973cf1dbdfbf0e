"""What a module should hold: the agent's config (broker URL, password, TLS files) and its service files.

Pure but for reading the controller's secret and certificate files; the service files are the templates
``scripts/fleet-agent.service`` (a systemd user unit) and ``scripts/run-agent.sh`` (the supervisor where
systemd does not run), every path quoted for its reader.
"""

from __future__ import annotations

import json
import shlex
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote, urlsplit, urlunsplit

from agent import cli as agent_cli
from agent.settings import AgentSettings
from contract.settings import BrokerSettings
from controller.inventory import Module
from controller.remote.deploy.model import DeployError, script


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
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = (f"{parts.username}@" if parts.username else "") + host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment)), unquote(parts.password)


_SHARED = ("run_time_limit", "heartbeat_interval", "offline_after", "max_attempts")


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
    return shlex.quote(word)


def agent_argv(venv: str, config: str, *, worker_command: bool) -> list[str]:
    """How the service runs the agent: ``fleet-agent worker --config FILE`` (or the module form)."""
    if worker_command:
        return [f"{venv}/bin/fleet-agent", "worker", "--config", config]
    return [f"{venv}/bin/python", "-m", "agent.worker"]


# str.format templates (every field a quoted path or word): a systemd user unit, the supervisor script
UNIT = script("fleet-agent.service")
LAUNCHER = script("run-agent.sh")


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


def worker_command_available() -> bool:
    """Whether this source's agent CLI has ``worker`` (else the service runs ``python -m agent.worker``)."""
    commands = agent_cli.app.registered_commands
    return any((c.name or getattr(c.callback, "__name__", "")) == "worker" for c in commands)
