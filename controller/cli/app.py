"""``fleetctl``: the controller's command line. It parses and prints; :mod:`controller.service` does the work.

Exit codes, everywhere: 0 pass (or done), 1 a module failed or the release regressed, 2 an
error (bad input, unknown run, broker unreachable, missing extras), reported as one line
``fleetctl: error: ...`` on stderr. 130 when interrupted.

Only typer and click are imported to build the command tree: every verb imports what it uses
(the service, rich, pandas, paramiko) when it runs, so ``fleetctl --help`` stays light and works
without the controller extras.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from contract.oneline import error_line
from controller.cli.output import EXIT_ERROR, Output, emit, error, new_app, output_option, stderr, stdout

if TYPE_CHECKING:
    from controller.service import Session

RUN_ARG = "run id, unique prefix or 'latest'"


@dataclass
class Invocation:
    """What the root options name; the service session is opened on first use and closed with the command."""

    config: Path | None = None
    inventory: Path | None = None
    history: Path | None = None
    _session: Session | None = field(default=None, repr=False)

    def session(self) -> Session:
        if self._session is None:
            from controller.service import Session

            self._session = Session.load(self.config, inventory=self.inventory, history=self.history)
        return self._session

    def close(self) -> None:
        if self._session is not None:
            self._session.close()


def session(ctx: typer.Context) -> Session:
    """The service session of the command being run (the invocation is every context's object)."""
    inv = ctx.obj
    assert isinstance(inv, Invocation)
    return inv.session()


def _root(
    ctx: typer.Context,
    config: Path | None = typer.Option(None, "--config", "-c", envvar="FLEET_CONFIG",
                                       help="TOML config file (sections [fleet] and [controller])"),
    inventory: Path | None = typer.Option(None, "--inventory", "-i", help="inventory TOML (default from config)"),
    history: Path | None = typer.Option(None, "--history", help="run history SQLite file"),
) -> None:
    """Validate SGLang-MUSA releases on a fleet of M1000 modules."""
    inv = ctx.obj
    assert isinstance(inv, Invocation)
    inv.config, inv.inventory, inv.history = config, inventory, history


# --------------------------------------------------------------------------- run verbs
def validate(
    ctx: typer.Context,
    release: str = typer.Argument(..., help="SGLang-MUSA-M1000-M1000_<version>_sglang.tar.gz: a path, or an "
                                  "http/https URL the controller downloads"),
    models: str = typer.Option("all", "--models", "-m", help="model keys, comma separated, or 'all'"),
    devices: str = typer.Option("all", "--devices", "-d", help="'all', names, label=value; comma separated"),
    detach: bool = typer.Option(False, "--detach", help="return at once; follow with status/watch"),
    baseline: str | None = typer.Option(None, "--baseline", "-b", help="baseline: release, release@vN or run id"),
    run_id: str | None = typer.Option(None, "--run-id", help="run id (default: generated)"),
    resume: bool = typer.Option(False, "--resume", help="--run-id names an existing run: resume it"),
    sha256: str | None = typer.Option(None, "--sha256", help="what the release must hash to (checked first)"),
) -> int:
    """Validate a release on the chosen modules; ends with a verdict."""
    from contract.records import parse_model_keys
    from controller import service
    from controller.cli.live import follow_and_judge, print_launched

    s = session(ctx)
    req = service.release_request(release, sha256=sha256, models=parse_model_keys(models), devices=devices,
                                  baseline=baseline, run_id=run_id, resume=resume)
    launched = service.validate(s, req)
    print_launched(launched, stderr(), len(launched.modules))
    if detach:
        stdout().print(launched.run_id)
        return 0
    return follow_and_judge(s, launched.run_id, baseline, stdout(), stderr())


def status(ctx: typer.Context,
           run_id: str = typer.Argument("latest", help="run id, unique prefix or 'latest'"),
           output: Output = output_option()) -> int:
    """One look at a run (pulls its latest progress and rows into the history); the verdict once it ended
    (the one recorded when it was judged, e.g. by `validate --baseline`; judged now if none was)."""
    from controller import service
    from controller.cli.live import render

    s = session(ctx)
    info = service.find_run(s, run_id)
    view = service.sync(s, info.run_id)
    j = None
    if view.finished:  # the verdict recorded when it ended (against the baseline it was judged with), else judged now
        info = service.find_run(s, info.run_id)  # as the sync left it
        j = service.recorded_judgement(info)
        if j is None:
            j = service.judge(s, info.run_id)
            info = service.find_run(s, info.run_id)  # with the verdict just recorded
    if output != Output.table:
        doc = service.run_summary(info, view, judgement=j)
        recs = [{"module": m, **st} for m, st in doc["module_states"].items()]
        emit(recs, ["module", "state", "step", "model_key", "keys_done", "keys_total", "rows"], output, document=doc)
    else:
        out = stdout()
        out.print(render(view, title=f"run {info.run_id} ({info.release}, {view.state()})"))
        if j is not None:
            out.print(f"verdict: [bold]{j.verdict}[/] - {j.line}", highlight=False)
    return service.exit_code(j.verdict) if j is not None else 0


def watch(ctx: typer.Context, run_id: str = typer.Argument("latest", help="run id, unique prefix or 'latest'"),
          baseline: str | None = typer.Option(None, "--baseline", "-b")) -> int:
    """Follow a run live until it ends (pulling its results into the history), then give its verdict."""
    from controller import service
    from controller.cli.live import follow_and_judge

    s = session(ctx)
    info = service.find_run(s, run_id)
    if baseline:
        service.check_baseline(s, baseline)
    return follow_and_judge(s, info.run_id, baseline, stdout(), stderr())


def cancel(ctx: typer.Context, run_id: str = typer.Argument(..., help="run id or unique prefix"),
           devices: str | None = typer.Option(None, "--devices", "-d", help="only these modules")) -> None:
    """Cancel a run (durable: modules check it between and within steps)."""
    from controller import service

    rid, names = service.cancel(session(ctx), run_id, devices)
    stderr().print(f"cancel requested for run {rid}" + (f" on {', '.join(names)}" if devices else ""),
                   highlight=False)


# --------------------------------------------------------------------------- listing verbs
def runs(ctx: typer.Context,
         limit: int = typer.Option(20, "--limit", "-n", min=1, help="at most this many, newest first"),
         output: Output = output_option()) -> None:
    """Recent runs."""
    import time

    from controller import service

    items = service.runs(session(ctx), limit)
    recs = [{**r.model_dump(mode="json"), "created": time.strftime("%Y-%m-%d %H:%M", time.localtime(r.created_at))}
            for r in items]
    emit(recs, ["run_id", "created", "release", "modules", "models", "state", "verdict"], output)


ROW_COLUMNS = ("module", "model_key", "profile", "prefill_tps", "ttft_ms", "decode_tps", "tpot_ms", "extra")


def results(ctx: typer.Context, run_id: str = typer.Argument("latest", help="run id, unique prefix or 'latest'"),
            output: Output = output_option(),
            fmt: Output | None = typer.Option(None, "--format", hidden=True, help="old name of --output"),
            pull: bool = typer.Option(False, "--sync", help="pull the newest rows from the broker first (writes)"),
            telemetry: bool = typer.Option(False, "--telemetry", help="device telemetry per module and model key "
                                                                      "instead of the result rows"),
            ) -> None:
    """Result rows of a run (or its device telemetry), from the run history."""
    import json

    from controller import service
    from controller.history import ROW_FIELDS

    output = fmt or output
    info, rows = service.results(session(ctx), run_id, pull=pull)
    if telemetry:
        _emit_telemetry(session(ctx).history().telemetry(info.run_id), output)
        return
    if output == Output.table:
        recs = []
        for r in rows:
            extra = ""
            if r.table == "mtp":
                extra = f"accept {r.accept_rate:.3f} {'ok' if r.correct else 'WRONG'}" if r.accept_rate else ""
            elif r.table == "vision":
                extra = f"vision {r.vision_fps:.2f} fps" if r.vision_fps else ""
            if r.flags:
                extra += " flags: " + ",".join(r.flags)
            recs.append({**r.model_dump(), "extra": extra})
        emit(recs, ROW_COLUMNS, output)
        return
    docs = [r.model_dump(mode="json") for r in rows]
    if output == Output.csv:
        for d in docs:
            d.update(extra=json.dumps(d["extra"]), flags=json.dumps(d["flags"]))
    emit(docs, ROW_FIELDS, output)


TELEMETRY_TABLE = ("module", "model key", "gpu", "samples", "SM clock p95 / max MHz", "max °C",
                   "power p95 / limit W", "memory max MiB", "slowdown", "notes")


def _emit_telemetry(summaries: dict[str, Any], output: Output) -> None:
    import json

    from controller.report.telemetry import telemetry_rows

    if output == Output.json:
        stdout().print_json(json.dumps({m: s.model_dump(mode="json") for m, s in summaries.items()}))
        return
    rows = telemetry_rows(summaries)
    if output == Output.csv:
        emit(rows, tuple(rows[0]) if rows else ("module",), output)
        return

    def n(v: float | None) -> str:
        return "" if v is None else f"{v:.0f}"

    recs = [{"module": r["module"], "model key": "" if r["gpu"] is None else (r["model_key"] or "(release steps)"),
             "gpu": "" if r["gpu"] is None else str(r["gpu"]), "samples": str(r["samples"]),
             "SM clock p95 / max MHz": f"{n(r.get('sm_clock_p95_mhz'))} / {n(r.get('sm_clock_max_mhz'))}",
             "max °C": n(r.get("temperature_max_c")),
             "power p95 / limit W": f"{n(r.get('power_p95_w'))} / {n(r.get('power_limit_w'))}",
             "memory max MiB": n(r.get("memory_used_max_mib")), "slowdown": r.get("slowdown", ""),
             "notes": r["notes"]} for r in rows]
    emit(recs, TELEMETRY_TABLE, output)


DEVICE_COLUMNS = ("module", "host", "labels", "state", "reason", "agent_version", "last_beat", "clock_skew",
                  "free_disk")


def devices(ctx: typer.Context,
            select_: str = typer.Option("all", "--devices", "-d", help="'all', names, label=value; comma separated"),
            output: Output = output_option()) -> None:
    """Modules and their state, from their heartbeats."""
    if ctx.invoked_subcommand is not None:
        return
    from controller import service

    recs = []
    for d in service.devices(session(ctx), select_):
        rec = service.device_dict(d)
        age, free = rec["heartbeat_age_s"], rec["free_disk_bytes"]
        rec["last_beat"] = f"{age:.0f} s ago" if age is not None else "never"
        skew = rec["clock_skew_s"]  # the module's clock minus the controller's (ages are the broker's)
        rec["clock_skew"] = f"{skew:+.0f} s" if skew is not None else ""
        rec["free_disk"] = f"{free / 1024**3:.1f} GiB" if free is not None else ""
        recs.append(rec)
    emit(recs, DEVICE_COLUMNS, output)


def devices_reset(ctx: typer.Context, module: str = typer.Argument(..., help="module name")) -> None:
    """Clear a module's failed runs in a row: a module bad by failed runs takes work again now (recorded in
    the history). Without it, it does once failures_cooldown has passed since the last one, on trial."""
    from controller import service

    s = session(ctx)
    n = service.reset_module(s, module)
    stdout().print(f"{module}: {n} failed run(s) in a row cleared (recorded in {s.history_path})",
                   highlight=False, markup=False)


def retry(
    ctx: typer.Context,
    run_id: str = typer.Argument("latest", help=RUN_ARG),
    failed_only: bool = typer.Option(False, "--failed-only",
                                     help="only the modules that failed, with the model keys that did not pass"),
    detach: bool = typer.Option(False, "--detach", help="return at once; follow with status/watch"),
    baseline: str | None = typer.Option(None, "--baseline", "-b", help="baseline: release, release@vN or run id"),
) -> int:
    """A new run (new id) of a run's release and model keys on its modules.

    To continue the same run instead, keeping what passed: fleetctl validate TARBALL --run-id RUN --resume.
    """
    from controller import service
    from controller.cli.live import follow_and_judge, print_launched

    s = session(ctx)
    if baseline:
        service.check_baseline(s, baseline)
    launched = service.retry(s, run_id, failed_only=failed_only)
    print_launched(launched, stderr(), len(launched.modules))
    if detach:
        stdout().print(launched.run_id)
        return 0
    return follow_and_judge(s, launched.run_id, baseline, stdout(), stderr())


def logs(
    ctx: typer.Context,
    run_id: str = typer.Argument("latest", help=RUN_ARG),
    module: str | None = typer.Option(None, "--module", help="only this module"),
    step: str | None = typer.Option(None, "--step", help="only this step (unpack, precompile, server, benchmark...)"),
    key: str | None = typer.Option(None, "--key", "-k", help="only this model key"),
    follow: bool = typer.Option(False, "--follow", "-f", help="keep printing what is appended until the run ends"),
) -> None:
    """Step logs of a run, read from each module's workdir (local modules) or over SSH."""
    import time

    from controller import service

    s = session(ctx)
    info = service.find_run(s, run_id)
    shown: dict[tuple[str, str], int] = {}
    several = module is None and len(info.modules) > 1

    def show() -> None:
        for f in service.logs(s, info.run_id, module=module, step=step, key=key):
            done = shown.get((f.module, f.name))
            if done is None:
                sys.stdout.write(f"==> {f.module} {f.name} <==\n" if several else f"==> {f.name} <==\n")
                done = 0
            sys.stdout.write(f.text[done:])
            sys.stdout.flush()
            shown[(f.module, f.name)] = len(f.text)

    show()
    while follow and not service.view(s, info.run_id, live=True).finished:
        time.sleep(1.0)
        show()
    if not shown:
        stderr().print(f"no step logs of run {info.run_id} (yet)" + (f" on {module}" if module else ""))


def describe_run(ctx: typer.Context, run_id: str = typer.Argument("latest", help=RUN_ARG),
                 output: Output = output_option()) -> None:
    """A run: release, models, modules, state and step of each module, errors, rows, verdict (read-only)."""
    import time

    from controller import service

    s = session(ctx)
    d = service.describe_run(s, run_id)
    doc = {**service.run_summary(d.info, d.view, rows=d.rows), "errors": service.errors_of(d.view)}
    recs = []
    for m, st in doc["module_states"].items():
        failed = [o["model_key"] for o in st.get("outcomes", []) if o["status"] == "failed"]
        recs.append({"module": m, "state": st["state"], "step": st["step"],
                     "keys": f"{st.get('keys_done', 0)}/{st.get('keys_total', len(d.info.models))}",
                     "rows": st.get("rows", 0), "failed keys": failed,
                     "error": "; ".join(doc["errors"].get(m, []))})
    if output == Output.table:
        out = stdout()
        when = lambda t: time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else ""  # noqa: E731
        for k, v in (("run", d.info.run_id), ("release", f"{d.info.release} (sha256 {d.info.sha256[:12]})"),
                     ("tarball", d.info.tarball), ("models", ", ".join(d.info.models)), ("state", doc["state"]),
                     ("verdict", d.info.verdict or ""), ("created", when(d.info.created_at)),
                     ("finished", when(d.info.finished_at)), ("rows", d.rows)):
            out.print(f"{k + ':':10} {v}", highlight=False)
    emit(recs, ["module", "state", "step", "keys", "rows", "failed keys", "error"], output, document=doc)


def describe_module(ctx: typer.Context, name: str = typer.Argument(..., help="module name"),
                    output: Output = output_option()) -> None:
    """A module: inventory entry, state from its heartbeat, its recent runs (read-only)."""
    import time

    from controller import service

    s = session(ctx)
    d = service.describe_module(s, name)
    dev = service.device_dict(service.Device(d.module, d.status))
    recent = [{"run_id": info.run_id, "release": info.release,
               "created": time.strftime("%Y-%m-%d %H:%M", time.localtime(info.created_at)),
               "state": p.state.value if p else "queued", "rows": p.rows if p else 0,
               "error": p.error.one_line() if p and p.error else ""} for info, p in d.recent]
    doc = {**dev, "inventory": d.module.model_dump(mode="json"), "recent_runs": recent}
    if output == Output.table:
        out = stdout()
        for k in ("module", "host", "transport", "labels", "state", "reason", "agent_version", "run_id"):
            v = dev[k]
            out.print(f"{k + ':':15} {','.join(f'{a}={b}' for a, b in v.items()) if isinstance(v, dict) else v or ''}",
                      highlight=False)
        out.print(f"{'workdir:':15} {d.module.workdir}", highlight=False)
    emit(recent, ["run_id", "release", "created", "state", "rows", "error"], output, document=doc,
         title="recent runs")


def version(output: Output = output_option()) -> None:
    """Version of fleetctl, of the records it exchanges with agents, and of Python."""
    from controller import service

    v = service.version()
    if output == Output.table:
        print(f"fleetctl {v['fleetctl']} (records schema {v['record_schema']}, Python {v['python']})")
        return
    emit([v], list(v), output, document=v)


# --------------------------------------------------------------------------- services
def serve(
    ctx: typer.Context,
    interval: float = typer.Option(1.0, "--interval", help="seconds between syncs"),
    once: bool = typer.Option(False, "--once", help="sync every running run once and exit"),
    api_port: int | None = typer.Option(None, "--api-port", help="serve the HTTP API on this port (api_port)"),
    api_host: str | None = typer.Option(None, "--api-host", help="bind address of the HTTP API (api_host)"),
    tokens: Path | None = typer.Option(None, "--tokens", help="bearer tokens of the API, one a line, mode 0600"),
    webhook: list[str] = typer.Option([], "--webhook", help="POST each verdict to this URL (repeatable)"),
    webhook_secret: Path | None = typer.Option(None, "--webhook-secret-file", help="HMAC key of the webhooks"),
    new_token: bool = typer.Option(False, "--new-token", help="print a fresh random token for the tokens file"),
) -> None:
    """Controller service: history kept in step with the broker, verdicts, /metrics, HTTP API, webhooks."""
    if new_token:
        import secrets

        print(secrets.token_hex(24))
        return
    from controller.serve.daemon import serve_forever

    s = session(ctx)
    overrides: dict[str, object] = {k: v for k, v in (("api_port", api_port), ("api_host", api_host),
                                                       ("api_tokens_file", tokens),
                                                       ("webhook_secret_file", webhook_secret)) if v is not None}
    if webhook:
        overrides["webhook_urls"] = tuple(webhook)
    if overrides:
        s.settings = type(s.settings).model_validate({**s.settings.model_dump(), **overrides})
    serve_forever(s, interval=interval, once=once, console=stderr())


def demo(
    devices: int = typer.Option(4, "--modules", "--devices", min=1, max=64,
                                help="how many simulated modules (--devices: the old name)"),
    models: str = typer.Option("all", "--models", "-m"),
    noise: float = typer.Option(0.01, "--noise", min=0.0, max=0.5, help="relative noise of the simulated modules"),
    slow: float | None = typer.Option(None, "--slow", help="one module runs this factor slower (e.g. 1.12)"),
    throttle: bool = typer.Option(False, "--throttle", help="the slow module is slow because its device throttles"),
    regress: list[str] = typer.Option([], "--regress", help="MODEL_KEY:METRIC:FRACTION, release worse by that"),
    seed: int = typer.Option(1, "--seed"),
    time_scale: float = typer.Option(50.0, "--time-scale", min=1.0, help="simulated modules run N x real time"),
    out_dir: Path = typer.Option(Path("demo-out"), "--out", help="folder where the demo keeps everything"),
    real: int = typer.Option(0, "--real", min=0, max=8,
                             help="also N real-engine modules (transformers serve on this CPU; needs make engine)"),
) -> int:
    """Simulated fleet on this machine validates a freshly built simulated release (embedded broker)."""
    from contract.records import parse_model_keys
    from controller.cli.demo import DemoOptions, run_demo

    opts = DemoOptions(devices=devices, models=parse_model_keys(models), noise=noise, slow=slow, throttle=throttle,
                       regress=tuple(regress), seed=seed, time_scale=time_scale, out_dir=out_dir,
                       real=real)
    return run_demo(opts, stdout(), stderr())


def build_app(inv: Invocation) -> typer.Typer:
    """The command tree of one invocation: the verbs here and those of the other parts of the
    controller, which get the invocation's session through the functions handed to them."""
    from controller.cli import deploy as deploy_cli
    from controller.cli import report as report_cli
    from controller.cli import targets as metrics_cli

    app = new_app(no_args_is_help=True, add_completion=True)
    app.callback()(_root)
    for verb in (validate, status, watch, cancel, retry, runs, results, logs, serve, demo, version):
        app.command()(verb)
    devices_app = new_app(add_completion=False, invoke_without_command=True,
                          help="Modules of the inventory and their state (idle, busy, unreachable, offline, bad).")
    devices_app.callback()(devices)
    devices_app.command("reset")(devices_reset)
    app.add_typer(devices_app, name="devices")
    describe_app = new_app(add_completion=False, no_args_is_help=True,
                           help="Everything about one run or one module (read-only).")
    describe_app.command("run")(describe_run)
    describe_app.command("module")(describe_module)
    app.add_typer(describe_app, name="describe")
    report_cli.register(app, lambda: inv.session().read_history(), lambda: inv.session().history())
    deploy_cli.register(app, devices_app, lambda: inv.session().inventory(), lambda: inv.session().settings)
    metrics_cli.register(app, lambda: inv.session().inventory())
    return app


# --------------------------------------------------------------------------- errors and exit codes
CONTROLLER_EXTRA = frozenset({"pandas", "numpy", "scipy", "pyarrow", "matplotlib", "jinja2", "fabric", "paramiko",
                              "invoke", "fastapi", "uvicorn", "starlette"})


def user_error_types() -> tuple[type[BaseException], ...]:
    """Errors that are the user's to fix (one line, exit 2). The errors of parts this invocation did
    not load cannot have been raised: their modules (and pandas, paramiko) were not imported for it."""
    from pydantic import ValidationError

    from contract.records import UnknownModelKey
    from contract.settings import SettingsError
    from controller.fleet import FleetError
    from controller.history import HistoryError
    from controller.inventory import InventoryError
    from controller.service import ServiceError

    types: list[type[BaseException]] = [ServiceError, FleetError, InventoryError, HistoryError, SettingsError,
                                        UnknownModelKey, ValidationError, OSError]
    if "controller.report.model" in sys.modules:
        from controller.report.model import ReportError

        types.append(ReportError)
    if "controller.remote.push" in sys.modules:
        from controller.remote.push import PushError

        types.append(PushError)
    if "controller.remote.deploy" in sys.modules:
        from controller.remote.deploy import DeployError

        types.append(DeployError)
    return tuple(types)


def run(argv: list[str] | None = None) -> int:
    """Run ``fleetctl ARGV``; the exit code (every error handled here, once)."""
    inv = Invocation()
    try:
        rv = build_app(inv)(args=argv, prog_name="fleetctl", standalone_mode=False, obj=inv)
        return rv if isinstance(rv, int) else 0
    except typer.Exit as e:
        return int(e.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        return 130
    except typer.TyperException as e:  # click's usage errors (typer's own copy of click)
        show = getattr(e, "show", None)
        if show is not None:
            show()
        else:
            error(str(e))
        return EXIT_ERROR
    except ModuleNotFoundError as e:
        if (e.name or "").partition(".")[0] not in CONTROLLER_EXTRA:
            raise
        error(f"this command needs the controller extras (no module {e.name!r}): install m1000-fleet[controller]")
        return EXIT_ERROR
    except Exception as e:
        from controller.fleet import broker_errors

        if isinstance(e, user_error_types()):
            error(error_line(e))
        elif isinstance(e, broker_errors()):
            error(f"broker unreachable: {error_line(e)}")
        else:  # a bug: keep the traceback, still exit "error"
            import traceback

            traceback.print_exc()
        return EXIT_ERROR
    finally:
        inv.close()


def main(argv: list[str] | None = None) -> Any:
    sys.exit(run(argv))
