"""``fleetctl``: the controller's command line.

Exit codes: 0 pass, 1 a module failed or the release regressed, 2 an error (bad input,
broker unreachable, ...), reported as one line on stderr.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import typer
from rich.console import Console
from rich.table import Table

from agent.records import UnknownModelKey, parse_model_keys
from agent.settings import SettingsError, load_settings
from controller.fleet import (
    BadRelease,
    Fleet,
    FleetError,
    RunView,
    new_run_id,
    release_version,
    sha256_file,
)
from controller.history import History, HistoryError
from controller.inventory import Inventory, InventoryError, Module, load_inventory
from controller.live import follow, render
from controller.settings import ControllerSettings

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Validate SGLang-MUSA releases on a fleet of M1000 modules.")
devices_app = typer.Typer(add_completion=False, invoke_without_command=True,
                          help="Modules of the inventory and their state (idle, busy, offline, bad).")
app.add_typer(devices_app, name="devices")

out = Console(width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, soft_wrap=True)


@dataclass
class State:
    """Lazily opened resources of one invocation (no global configuration)."""

    config: Path | None = None
    inventory_path: Path | None = None
    history_path: Path | None = None
    _settings: ControllerSettings | None = None
    _history: History | None = None
    _inventory: Inventory | None = None
    _fleet: Fleet | None = None
    closers: list[Callable[[], None]] = field(default_factory=list)

    @classmethod
    def for_settings(cls, settings: ControllerSettings) -> State:
        """State of a caller that already holds its settings (demo, tests, benches)."""
        st = cls()
        st._settings = settings
        return st

    def settings(self) -> ControllerSettings:
        if self._settings is None:
            self._settings = load_settings(ControllerSettings, self.config, inventory=self.inventory_path,
                                           history=self.history_path)
        return self._settings

    def history(self) -> History:
        if self._history is None:
            self._history = History(self.settings().history_path)
            self.closers.append(self._history.close)
        return self._history

    def inventory(self) -> Inventory:
        if self._inventory is None:
            self._inventory = load_inventory(self.settings().inventory)
        return self._inventory

    def fleet(self) -> Fleet:
        if self._fleet is None:
            s = self.settings()
            self._fleet = Fleet(s, self.history(), failures_for_bad=s.failures_for_bad)
            self.closers.append(self._fleet.close)
        return self._fleet

    def close(self) -> None:
        for c in reversed(self.closers):
            c()
        self.closers.clear()


STATE = State()


@app.callback()
def _main(
    config: Path | None = typer.Option(None, "--config", "-c", envvar="FLEET_CONFIG",
                                       help="TOML config file ([fleet], [controller])"),
    inventory: Path | None = typer.Option(None, "--inventory", "-i", help="inventory TOML (default from config)"),
    history: Path | None = typer.Option(None, "--history", help="run history SQLite file"),
) -> None:
    STATE.config, STATE.inventory_path, STATE.history_path = config, inventory, history


# --------------------------------------------------------------------------- helpers
def judge(st: State, run_id: str, baseline: str | None) -> tuple[str, str, Any]:
    """(verdict, one-line text, report or None) for a finished run."""
    h = st.history()
    info = h.find_run(run_id)
    view = st.fleet().view(info.run_id)
    failed = view.state() in ("failed", "cancelled")
    report = None
    if importlib.util.find_spec("controller.report") is not None:
        from controller.report import build_report

        report = build_report(h, info.run_id, baseline=baseline)
        verdict = str(report.verdict)
        text = getattr(report, "one_line", None)
        line = text() if callable(text) else str(text or verdict)
    else:
        verdict, line = ("failed", "some modules failed") if failed else ("pass", "all modules passed")
    if failed and verdict == "pass":
        verdict, line = "failed", "some modules failed; " + line
    h.set_run_state(info.run_id, view.state() if view.finished else "running", verdict=verdict)
    return verdict, line, report


def _exit_for(verdict: str) -> int:
    return 0 if verdict in ("pass", "passed", "ok") else 1


def _print_failures(view: RunView) -> None:
    for m, p in view.progress.items():
        if p is None:
            continue
        errs = [o.error for o in p.outcomes if o.error] or ([p.error] if p.error else [])
        for e in errs:
            err.print(f"[red]{m}[/]: {e.one_line()}", highlight=False)


def _distribute(st: State, modules: list[Module], tarball: Path, sha: str) -> tuple[dict[str, str], dict[str, str]]:
    """Make the release available on each module: (module -> path there, module -> error)."""
    paths: dict[str, str] = {}
    errors: dict[str, str] = {}
    remote = [m for m in modules if m.transport == "ssh"]
    local = [m for m in modules if m.transport == "local"]
    if local:  # agents read only from their release roots: <data_dir>/releases by default
        from agent.validate import stage_local_release

        staged = str(stage_local_release(tarball, sha, st.settings().data_dir))
        for m in local:
            paths[m.name] = staged
    if remote:
        if importlib.util.find_spec("controller.push") is None:
            for m in remote:
                errors[m.name] = "release distribution over SSH is not available in this build"
        else:
            from controller.push import push_release

            s = st.settings()
            results = push_release(remote, tarball, sha, known_hosts=s.known_hosts, identity=s.ssh_key)
            for name, r in results.items():
                if getattr(r, "error", None):
                    errors[name] = f"push failed: {r.error}"
                else:
                    paths[name] = str(r.remote_path)
    return paths, errors


# --------------------------------------------------------------------------- commands
@app.command()
def validate(
    tarball: Path = typer.Argument(..., help="SGLang-MUSA-M1000-M1000_<version>_sglang.tar.gz"),
    models: str = typer.Option("all", "--models", "-m", help="model keys, comma separated, or 'all'"),
    devices: str = typer.Option("all", "--devices", "-d", help="'all', names, label=value; comma separated"),
    detach: bool = typer.Option(False, "--detach", help="return at once; follow with status/watch"),
    baseline: str | None = typer.Option(None, "--baseline", help="baseline: release, release@vN or run id"),
    run_id: str | None = typer.Option(None, "--run-id", help="run id (default: generated)"),
) -> int:
    """Validate a release on the chosen modules; ends with a verdict."""
    return run_validation(STATE, tarball, parse_model_keys(models), devices, detach=detach, baseline=baseline,
                          run_id=run_id)


def run_validation(st: State, tarball: Path, keys: tuple[str, ...], devices: str, *, detach: bool = False,
                   baseline: str | None = None, run_id: str | None = None) -> int:
    if not tarball.is_file():
        raise BadRelease(f"{tarball}: no such release tarball")
    version = release_version(tarball)
    mods = st.inventory().select(devices)
    fleet = st.fleet()
    rid = run_id or new_run_id()
    fleet.check_new_run_id(rid)
    fleet.check_broker()
    sha = sha256_file(tarball)
    statuses = fleet.statuses(mods)
    usable = [m for m in mods if statuses[m.name].state not in ("offline", "unreachable", "bad")]
    paths, errors = _distribute(st, usable, tarball, sha)
    result = fleet.dispatch(run_id=rid, modules=mods, tarballs=paths, sha256=sha, release=version, models=keys,
                            tarball_label=str(tarball.resolve()), statuses=statuses)
    for name, e in errors.items():
        result[name] = e
    err.print(f"run [bold]{rid}[/]: release {version} ({sha[:12]}), {len(keys)} model keys, "
              f"{sum(v == 'queued' for v in result.values())}/{len(mods)} modules queued", highlight=False)
    for name, why in result.items():
        if why != "queued":
            err.print(f"  [red]{name}[/]: {why}", highlight=False)
    if detach:
        out.print(rid)
        return 0
    return follow_and_judge(st, rid, baseline)


def follow_and_judge(st: State, run_id: str, baseline: str | None) -> int:
    fleet = st.fleet()
    try:
        view = follow(lambda: fleet.sync(run_id), err, title=f"run {run_id}")
    except KeyboardInterrupt:
        err.print(f"detached; the run goes on: fleetctl watch {run_id}")
        return 130
    _print_failures(view)
    verdict, line, report = judge(st, run_id, baseline)
    n = st.history().row_count(run_id)
    out.print(f"verdict: [bold]{verdict}[/] - {line}", highlight=False)
    out.print(f"{n} result rows in {st.settings().history_path} (fleetctl results {run_id}; "
              f"fleetctl report {run_id})", highlight=False)
    return _exit_for(verdict)


@app.command()
def status(run_id: str = typer.Argument("latest")) -> int:
    """One look at a run (and pull its latest results into the history)."""
    info = STATE.history().find_run(run_id)
    view = STATE.fleet().sync(info.run_id)
    out.print(render(view, title=f"run {info.run_id} ({info.release}, {view.state()})"))
    if view.finished:
        verdict, line, _ = judge(STATE, info.run_id, None)
        out.print(f"verdict: [bold]{verdict}[/] - {line}", highlight=False)
        return _exit_for(verdict)
    return 0


@app.command()
def watch(run_id: str = typer.Argument("latest"), baseline: str | None = typer.Option(None, "--baseline")) -> int:
    """Follow a run live until it ends, then give its verdict."""
    info = STATE.history().find_run(run_id)
    return follow_and_judge(STATE, info.run_id, baseline)


@app.command()
def runs(limit: int = typer.Option(20, "--limit", "-n")) -> None:
    """Recent runs."""
    t = Table("run", "created", "release", "modules", "models", "state", "verdict")
    for r in STATE.history().runs(limit=limit):
        t.add_row(r.run_id, time.strftime("%Y-%m-%d %H:%M", time.localtime(r.created_at)), r.release,
                  str(len(r.modules)), ",".join(r.models), r.state, r.verdict or "")
    out.print(t)


@app.command()
def cancel(run_id: str = typer.Argument(...),
           devices: str | None = typer.Option(None, "--devices", "-d", help="only these modules")) -> None:
    """Cancel a run (durable: modules check it between and within steps)."""
    info = STATE.history().find_run(run_id)
    names = None
    if devices:
        from controller.inventory import select

        mods = [m for m in STATE.inventory().modules if m.name in info.modules]
        names = [m.name for m in select(mods, devices)]
    STATE.fleet().cancel(info.run_id, names)
    err.print(f"cancel requested for run {info.run_id}" + (f" on {', '.join(names)}" if names else ""))


@app.command()
def results(run_id: str = typer.Argument("latest"),
            fmt: str = typer.Option("table", "--format", "-f", help="table, csv or json")) -> None:
    """Result rows of a run."""
    h = STATE.history()
    info = h.find_run(run_id)
    if info.kind == "run":
        STATE.fleet().sync(info.run_id)
    rows = h.rows(info.run_id)
    if fmt == "json":
        out.print_json(json.dumps([r.model_dump(mode="json") for r in rows]))
    elif fmt == "csv":
        import csv

        from controller.history import ROW_FIELDS

        w = csv.writer(sys.stdout, lineterminator="\n")
        w.writerow(ROW_FIELDS)
        for r in rows:
            d = r.model_dump(mode="json")
            w.writerow([json.dumps(d[f]) if f in ("extra", "flags") else ("" if d[f] is None else d[f])
                        for f in ROW_FIELDS])
    elif fmt == "table":
        t = Table("module", "model key", "profile", "prefill tok/s", "TTFT ms", "decode tok/s", "TPOT ms", "extra")
        for r in rows:
            extra = ""
            if r.table == "mtp":
                extra = f"accept {r.accept_rate:.3f} {'ok' if r.correct else 'WRONG'}" if r.accept_rate else ""
            elif r.table == "vision":
                extra = f"vision {r.vision_fps:.2f} fps" if r.vision_fps else ""
            if r.flags:
                extra += " flags: " + ",".join(r.flags)
            t.add_row(r.module, r.model_key, r.profile, _num(r.prefill_tps), _num(r.ttft_ms), _num(r.decode_tps),
                      _num(r.tpot_ms), extra)
        out.print(t)
    else:
        raise typer.BadParameter(f"unknown format {fmt!r} (table, csv, json)", param_hint="--format")


def _num(v: float | None) -> str:
    return "" if v is None else f"{v:.2f}"


@devices_app.callback()
def devices(ctx: typer.Context,
            select_: str = typer.Option("all", "--devices", "-d", help="selector")) -> None:
    """Modules and their state, from their heartbeats."""
    if ctx.invoked_subcommand is not None:
        return
    mods = STATE.inventory().select(select_)
    st = STATE.fleet().statuses(mods)
    t = Table("module", "host", "labels", "state", "detail", "agent", "last beat", "free disk")
    for m in mods:
        s = st[m.name]
        hb = s.heartbeat
        t.add_row(m.name, m.host, ",".join(f"{k}={v}" for k, v in m.labels.items()),
                  s.state, s.reason, hb.agent_version if hb else "",
                  f"{s.age:.0f} s ago" if s.age is not None else "never",
                  f"{hb.free_disk_bytes / 1024**3:.1f} GiB" if hb and hb.free_disk_bytes is not None else "")
    out.print(t)


@app.command()
def serve(interval: float = typer.Option(1.0, "--interval", help="seconds between syncs"),
          once: bool = typer.Option(False, "--once", help="sync every running run once and exit")) -> None:
    """Controller service: keep the run history in step with the broker, serve controller /metrics."""
    from controller.serve import serve_forever

    serve_forever(STATE, interval=interval, once=once, console=err)


@app.command()
def demo(
    devices: int = typer.Option(4, "--devices", "-n", min=1, max=64, help="simulated modules"),
    models: str = typer.Option("all", "--models", "-m"),
    noise: float = typer.Option(0.01, "--noise", min=0.0, max=0.5, help="relative noise of the simulated modules"),
    slow: float | None = typer.Option(None, "--slow", help="one module runs this factor slower (e.g. 1.12)"),
    regress: list[str] = typer.Option([], "--regress", help="MODEL_KEY:METRIC:FRACTION, release worse by that"),
    seed: int = typer.Option(1, "--seed"),
    time_scale: float = typer.Option(50.0, "--time-scale", min=1.0, help="simulated modules run N x real time"),
    out_dir: Path = typer.Option(Path("demo-out"), "--out", help="where the demo keeps everything"),
    real: int = typer.Option(0, "--real", min=0, max=8,
                             help="also N real-engine modules (transformers serve on this CPU; needs make engine)"),
) -> int:
    """Simulated fleet on this machine validates a freshly built simulated release (embedded broker)."""
    from controller.demo import DemoOptions, run_demo

    opts = DemoOptions(devices=devices, models=parse_model_keys(models), noise=noise, slow=slow,
                       regress=tuple(regress), seed=seed, time_scale=time_scale, out_dir=out_dir, real=real)
    return run_demo(opts, out, err)


def _register_plugins() -> None:
    """Commands of the other parts of the controller, where present in this build."""
    if importlib.util.find_spec("controller.report_cli") is not None:
        from controller import report_cli

        report_cli.register(app, lambda: STATE.history())
    if importlib.util.find_spec("controller.deploy_cli") is not None:
        from controller import deploy_cli

        deploy_cli.register(app, devices_app, lambda: STATE.inventory(), lambda: STATE.settings())
    if importlib.util.find_spec("controller.metrics_cli") is not None:
        from controller import metrics_cli

        metrics_cli.register(app, lambda: STATE.inventory())


_register_plugins()

USER_ERRORS: tuple[type[BaseException], ...] = (FleetError, InventoryError, HistoryError, SettingsError,
                                                UnknownModelKey, OSError)


def main(argv: list[str] | None = None) -> None:
    code = 0
    STATE.__init__()  # type: ignore[misc]  # a fresh invocation state (tests call main repeatedly)
    try:
        rv = app(args=argv, prog_name="fleetctl", standalone_mode=False)
        code = rv if isinstance(rv, int) else 0
    except click.exceptions.Exit as e:
        code = e.exit_code
    except click.exceptions.Abort:
        code = 130
    except click.ClickException as e:
        e.show()
        code = 2
    except USER_ERRORS as e:
        print(f"fleetctl: error: {e}", file=sys.stderr)
        code = 2
    except Exception:  # a bug: keep the traceback, still exit "error"
        import traceback

        traceback.print_exc()
        code = 2
    finally:
        STATE.close()
    sys.exit(code)
