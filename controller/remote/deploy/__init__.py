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

The package by job: ``model`` (records, constants), ``plan`` (probe answer, actions), ``render``
(config and service files), ``wheelhouse``, ``apply`` (SSH, one module and many), ``wait``
(heartbeats), ``devices`` (``fleetctl devices check``); the programs run on modules and the
templates of the files written there are plain files under ``scripts/``.
"""

from __future__ import annotations

from controller.remote.deploy.apply import SERVICE_CTL, deploy, deploy_module, probe
from controller.remote.deploy.devices import check, check_module
from controller.remote.deploy.model import (
    DEFAULT_CACHE,
    MIN_PYTHON,
    ROOT,
    SERVICE,
    Action,
    CheckResult,
    DeployError,
    DeployOptions,
    DeployResult,
    Desired,
    HeartbeatWait,
    ModuleFacts,
    Status,
    Wheelhouse,
)
from controller.remote.deploy.plan import PROBE, parse_probe, plan_module
from controller.remote.deploy.render import (
    LAUNCHER,
    TLS_SETTINGS,
    UNIT,
    agent_argv,
    agent_broker,
    agent_tls_files,
    check_broker_url_option,
    check_config,
    module_credential,
    read_secret,
    render_config,
    render_service,
    sh_quote,
    split_password,
    systemd_path,
    systemd_quote,
    toml_str,
    with_user,
    worker_command_available,
)
from controller.remote.deploy.wait import busy_reader, heartbeat_waiter
from controller.remote.deploy.wheelhouse import (
    PROJECT_PACKAGES,
    WheelhouseBuilder,
    build_project_wheel,
    download_deps,
    pip_download_argv,
    wheel_content_digest,
)

__all__ = [
    "DEFAULT_CACHE", "LAUNCHER", "MIN_PYTHON", "PROBE", "PROJECT_PACKAGES", "ROOT", "SERVICE", "SERVICE_CTL",
    "TLS_SETTINGS", "UNIT", "Action", "CheckResult", "DeployError", "DeployOptions", "DeployResult", "Desired",
    "HeartbeatWait", "ModuleFacts", "Status", "Wheelhouse", "WheelhouseBuilder", "agent_argv", "agent_broker",
    "agent_tls_files", "build_project_wheel", "busy_reader", "check", "check_broker_url_option", "check_config",
    "check_module", "deploy", "deploy_module", "download_deps", "heartbeat_waiter", "module_credential",
    "parse_probe", "pip_download_argv", "plan_module", "probe", "read_secret", "render_config", "render_service",
    "sh_quote", "split_password", "systemd_path", "systemd_quote", "toml_str", "wheel_content_digest", "with_user",
    "worker_command_available",
]
