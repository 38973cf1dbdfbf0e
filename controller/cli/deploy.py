"""``fleetctl deploy``, ``fleetctl push``, ``fleetctl broker acl`` and ``fleetctl devices check``: module-level verbs
(:func:`controller.cli.app.build_app` adds them) reading the inventory and settings through the invocation's session.

Exit codes: 0 every module fine, 1 at least one module failed (the others were still
done), 2 bad input (one line on stderr).

Lazy imports: the commands import the SSH layer (fabric and paramiko, 155 ms of CPU, ``bench/import_costs.py``;
the controller extras), the inventory and the settings (pydantic) when they run: ``fleetctl --help`` imports this
module with every verb's and costs ~0.14 s of CPU in all (``bench/cli.py``:
bench/results/cli_20261207_0057_defer-plugins.txt).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from contract.files import sha256_file
from controller import service
from controller.cli.golden import golden_check
from controller.cli.invocation import session
from controller.cli.output import Output, deprecation, fail, output_option
from controller.command import fleetctl
from controller.remote import acl

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from contract.settings import BrokerSettings
    from controller.remote import deploy as dep


def _consoles() -> tuple[Console, Console]:
    """stdout and stderr (rich: loaded when a command of this file runs, not for ``fleetctl --help``)."""
    from rich.console import Console

    return Console(), Console(stderr=True)


def _settings_error() -> type[Exception]:
    from contract.settings import SettingsError

    return SettingsError


def _fail(message: str) -> typer.Exit:
    return fail(message)


def _trust(settings: BrokerSettings, known_hosts: Path | None, identity: Path | None) -> tuple[Path, Path | None]:
    kh = known_hosts or getattr(settings, "known_hosts", None) or Path.home() / ".ssh" / "known_hosts"
    key = identity or getattr(settings, "ssh_key", None)
    kh = Path(kh).expanduser()
    if not kh.is_file():
        raise typer.BadParameter(f"{kh}: known_hosts file not found (add the modules' verified host keys)",
                                 param_hint="--known-hosts")
    return kh, Path(key).expanduser() if key else None


def _gib(n: int | None) -> str:
    return "" if n is None else f"{n / 1024**3:.1f} GiB"


def deploy_table(results: dict[str, dep.DeployResult]) -> Table:
    from rich.table import Table

    t = Table("module", "status", "actions", "agent", "heartbeat", "time", "error")
    colour = {"changed": "green", "unchanged": "cyan", "planned": "yellow", "failed": "red"}
    for r in results.values():
        hb = "" if r.heartbeat is None else ("yes" if r.heartbeat else "no")
        t.add_row(r.module, f"[{colour[r.status]}]{r.status}[/]", "\n".join(r.actions) or "nothing to do",
                  r.agent_version or "", hb, f"{r.seconds:.1f} s", r.error or "")
    return t


def deploy(
    ctx: typer.Context,
    devices: str = typer.Option("all", "--devices", "-d", help="'all', names, label=value; comma separated"),
    dry_run: bool = typer.Option(False, "--dry-run", help="probe and show the plan; change nothing"),
    known_hosts: Path | None = typer.Option(None, "--known-hosts", help="host keys of the modules"),
    identity: Path | None = typer.Option(None, "--identity", help="SSH private key"),
    broker_url: str | None = typer.Option(None, "--broker-url", envvar="FLEET_AGENT_BROKER_URL",
                                          help="broker URL as the modules reach it (default: fleet.broker_url)"),
    metrics_host: str = typer.Option("0.0.0.0", "--metrics-host", help="bind address of the agents' /metrics"),
    parallel: int = typer.Option(8, "--parallel", min=1, max=256, help="modules deployed at once"),
    heartbeat_timeout: float = typer.Option(90.0, "--heartbeat-timeout", help="wait for the first beat, s"),
    no_wait: bool = typer.Option(False, "--no-wait", help="do not wait for heartbeats"),
    cache_dir: Path | None = typer.Option(None, "--cache-dir",
                                          help="wheel cache on the controller (default ~/.cache/m1000-fleet)"),
    wheel: Path | None = typer.Option(None, "--wheel", help="deploy this m1000-fleet wheel (default: build one)"),
    force: bool = typer.Option(False, "--force", help="restart busy agents too (their runs are interrupted "
                               "cleanly and resume)"),
    credentials: Path | None = typer.Option(
        None, "--module-credentials",
        help="folder of per-module broker passwords from `fleetctl broker acl` (<module>.password): each "
             "agent connects as its own Redis user"),
) -> None:
    """Install or update the agent on modules (idempotent), then wait for their heartbeats."""
    from controller.inventory import InventoryError
    from controller.remote import deploy as dep

    out, err = _consoles()

    try:
        dep.check_broker_url_option(broker_url)
        settings = session(ctx).settings
        mods = session(ctx).inventory().select(devices)
        kh, key = _trust(settings, known_hosts, identity)
        if credentials is not None and not credentials.is_dir():
            raise ValueError(f"--module-credentials {credentials}: not a folder")
    except (InventoryError, _settings_error(), ValueError, dep.DeployError) as exc:
        raise _fail(str(exc)) from None
    opts = dep.DeployOptions(known_hosts=kh, identity=key, settings=settings, broker_url=broker_url,
                             metrics_host=metrics_host, max_parallel=parallel, dry_run=dry_run,
                             heartbeat_timeout=heartbeat_timeout, cache_dir=cache_dir or dep.DEFAULT_CACHE,
                             project_wheel=wheel, credentials=credentials,
                             passphrase_file=settings.ssh_key_passphrase_file,
                             force=force, busy=None if dry_run else dep.busy_reader(settings))
    wait = None if (no_wait or dry_run) else dep.heartbeat_waiter(settings)
    try:
        with err.status(f"deploying to {len(mods)} module(s)"):
            results = dep.deploy(mods, opts, wait)
    except dep.DeployError as exc:
        raise _fail(str(exc)) from None
    out.print(deploy_table(results))
    failed = [r.module for r in results.values() if not r.ok]
    busy = [r.module for r in results.values() if r.status == "busy"]
    if busy:
        err.print(f"{len(busy)} busy module(s) not restarted: {', '.join(busy)} (--force to restart them)",
                  highlight=False)
    if all(r.status == "unchanged" for r in results.values()):
        out.print("nothing changed: every module already runs this agent and config")
    if failed:
        err.print(f"{len(failed)} of {len(results)} module(s) failed: {', '.join(failed)}", highlight=False)
        raise typer.Exit(1)


def push(
    ctx: typer.Context,
    tarball: Path = typer.Argument(..., help="release tarball"),
    devices: str = typer.Option("all", "--devices", "-d", help="'all', names, label=value; comma separated"),
    sha256: str | None = typer.Option(None, "--sha256", help="expected sha256 (default: computed here)"),
    known_hosts: Path | None = typer.Option(None, "--known-hosts", help="host keys of the modules"),
    identity: Path | None = typer.Option(None, "--identity", help="SSH private key"),
    parallel: int = typer.Option(4, "--parallel", min=1, max=64, help="modules sent to at once"),
) -> None:
    """Put a release into each module's release cache (verified, resumable, skipped when present)."""
    from rich.table import Table

    from controller.history import HistoryError
    from controller.inventory import InventoryError
    from controller.remote.push import PushError, push_release
    from controller.service.releases import KEEP_RELEASES

    out, _ = _consoles()

    try:
        settings = session(ctx).settings
        mods = [m for m in session(ctx).inventory().select(devices) if m.transport == "ssh"]
        kh, key = _trust(settings, known_hosts, identity)
        if not tarball.is_file():
            raise PushError(f"{tarball}: release tarball not found")
        digest = sha256 or sha256_file(tarball)
        with service.Session(settings) as s:  # the releases runs may still read stay on the modules
            keep = service.releases_in_use(s)
        results = push_release(mods, tarball, digest, known_hosts=kh, identity=key, max_parallel=parallel,
                               keep_newest=KEEP_RELEASES, keep=keep)
    except (InventoryError, _settings_error(), PushError, ValueError, HistoryError) as exc:
        raise _fail(str(exc)) from None
    t = Table("module", "result", "bytes sent", "time", "MB/s", "remote path / error")
    for r in results.values():
        what = "failed" if r.error else ("skipped (present)" if r.skipped else "sent")
        t.add_row(r.module, what, str(r.bytes), f"{r.seconds:.1f} s", f"{r.mb_per_s:.0f}" if r.bytes else "",
                  r.error or r.remote_path)
    out.print(t)
    for r in results.values():
        if r.pruned:
            out.print(f"{r.module}: removed {len(r.pruned)} release(s) pushed there before (kept: the "
                      f"{KEEP_RELEASES} pushed last and those of runs not ended): "
                      f"{', '.join(x[:16] for x in r.pruned)}", highlight=False)
    if any(r.error for r in results.values()):
        raise typer.Exit(1)


BROKER_HELP = "The broker's users (Redis ACL)."


def broker_acl(
    ctx: typer.Context,
    out_dir: Path = typer.Option(Path("deploy/redis"), "--out", help="folder for users.acl and passwords/"),
    controller_user: str = typer.Option(acl.CONTROLLER_USER, "--controller-user", help="the controller's user"),
    rotate: bool = typer.Option(False, "--rotate", help="new passwords for every user (else existing kept)"),
) -> None:
    """Write redis-server's ACL file: one user per module (its own queue and records only) and the controller."""
    from controller.inventory import InventoryError

    out, _ = _consoles()
    try:
        names = [m.name for m in session(ctx).inventory().modules]
        files = acl.write_acl(out_dir, names, controller_user=controller_user, rotate=rotate)
    except (InventoryError, _settings_error(), acl.AclError, OSError) as exc:
        raise _fail(str(exc)) from None
    out.print(f"{files.acl}: {len(files.users)} users ({controller_user} + {len(names)} modules); default user off",
              highlight=False)
    out.print(f"passwords (0600): {files.passwords}/<user>.password; new: {', '.join(files.created) or 'none'}",
              highlight=False)
    out.print(f"redis.conf: aclfile {files.acl.name} | controller: broker_url = redis://{controller_user}@<host>"
              f"/0, broker_password_file = {files.passwords}/{controller_user}.password | "
              f"{fleetctl('deploy', '--module-credentials', str(files.passwords))}", markup=False,
              highlight=False)


def devices_check(
    ctx: typer.Context,
    devices: str = typer.Option("all", "--devices", "-d", help="'all', names, label=value; comma separated"),
    known_hosts: Path | None = typer.Option(None, "--known-hosts", help="host keys of the modules"),
    identity: Path | None = typer.Option(None, "--identity", help="SSH private key"),
    golden: str | None = typer.Option(None, "--golden", hidden=True, help="old form of `fleetctl golden REL`"),
    models: str = typer.Option("qwen3", "--models", "-m", hidden=True, help="old form: `fleetctl golden --models`"),
    tolerance: float | None = typer.Option(None, "--tolerance", hidden=True,
                                           help="old form: `fleetctl golden --tolerance`"),
    output: Output = output_option(),
) -> None:
    """SSH reachability, Python version, free disk and agent version of each module (read-only: a golden release's
    health check is `fleetctl golden`)."""
    from rich.table import Table

    if golden is not None:  # the old form, kept hidden for one release (ADR 0057)
        deprecation("fleetctl devices check --golden REL", "fleetctl golden REL")
        raise typer.Exit(golden_check(session(ctx), golden, devices, models, tolerance, output))

    from controller.inventory import InventoryError
    from controller.remote import deploy as dep

    out, _ = _consoles()

    try:
        settings = session(ctx).settings
        mods = [m for m in session(ctx).inventory().select(devices) if m.transport == "ssh"]
        kh, key = _trust(settings, known_hosts, identity)
    except (InventoryError, _settings_error(), ValueError) as exc:
        raise _fail(str(exc)) from None
    results = dep.check(mods, kh, key)
    t = Table("module", "ssh", "python", "arch", "free disk", "agent", "service", "error")
    for r in results.values():
        t.add_row(r.module, "ok" if r.reachable else "[red]unreachable[/]", r.python or "", r.machine or "",
                  _gib(r.free_bytes), r.agent_version or "", r.service or "", r.error or "")
    out.print(t)
    if any(r.error for r in results.values()):
        raise typer.Exit(1)
