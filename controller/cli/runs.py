"""``fleetctl`` verbs about runs: validate, status, watch, cancel, retry, runs, results, logs, describe run.

Each verb parses and prints; :mod:`controller.service` does the work, imported (with rich, pandas)
when the verb runs, so building the command tree stays light.

Lazy imports: the service's modules, the live view and the run history load pydantic and rich, the telemetry
table pandas: ``fleetctl --help`` imports this module with every verb's and costs ~0.14 s of CPU in all,
``fleetctl runs`` of ended runs ~0.31 s (``bench/cli.py``: bench/results/cli_20261207_0057_defer-plugins.txt).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import typer

from controller import service
from controller.cli.invocation import session
from controller.cli.output import Output, emit, output_option, stderr, stdout
from controller.command import fleetctl
from controller.serve.wire import run_page

if TYPE_CHECKING:
    from contract.records import ResultRow

RUN_ARG = "run id, unique prefix or 'latest'"


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
    priority: str = typer.Option("normal", "--priority", "-p", help="urgent, high, normal or low: a module that "
                                 "frees up starts the highest waiting run first (a run waiting long is raised)"),
    preempt: bool = typer.Option(False, "--preempt", help="with --priority urgent: the modules' running runs stop "
                                 "for it at once and resume from their passed keys after it"),
    on_reserved: str = typer.Option(
        "skip", "--on-reserved", help="a selected module another user reserved: skip it (the run waits there only "
        "when every selected module is reserved) or wait there until the reservation ends"),
) -> int:
    """Validate a release on the chosen modules; ends with a verdict."""
    from contract.records import parse_model_keys
    from controller.cli.live import follow_and_judge, print_launched

    s = session(ctx)
    req = service.release_request(release, sha256=sha256, models=parse_model_keys(models), devices=devices,
                                  baseline=baseline, run_id=run_id, resume=resume, priority=priority,
                                  preempt=preempt, on_reserved=on_reserved)  # type: ignore[arg-type]  # checked by the service
    launched = service.validate(s, req)
    print_launched(launched, stderr(), len(launched.modules), run_page(s.settings.serve_url, launched.run_id))
    if detach:
        stdout().print(launched.run_id)
        return 0
    return follow_and_judge(s, launched.run_id, baseline, stdout(), stderr())


def status(ctx: typer.Context,
           run_id: str = typer.Argument("latest", help="run id, unique prefix or 'latest'"),
           output: Output = output_option()) -> int:
    """One look at a run (pulls its latest progress and rows into the history); the verdict once it ended
    (the one recorded when it was judged, e.g. by `validate --baseline`; judged now if none was)."""
    from controller.cli.live import render

    s = session(ctx)
    info = service.find_run(s, run_id)
    j = service.recorded_judgement(info)
    # a judged run the broker can no longer change is shown from the history: no broker, no Celery
    settled = service.settled_view(s, info) if j is not None else None
    if settled is not None:
        view = settled
    else:
        view = service.sync(s, info.run_id)
        j = None
        # the verdict recorded when it ended (against the baseline it was judged with), else judged now; the run
        # read again as the sync, then the verdict, left it
        if view.finished:
            info = service.find_run(s, info.run_id)
            j = service.recorded_judgement(info)
            if j is None:
                j = service.judge(s, info.run_id)
                info = service.find_run(s, info.run_id)
    from controller.fleet.power import cycle_lines
    from controller.history.waits import run_waits
    from controller.service.queue import reservation_waits

    held = {} if view.finished else reservation_waits(s, info, view)
    if output != Output.table:
        doc = service.run_summary(info, view, judgement=j)
        doc["waits"] = {w.module: {"waited_s": w.waited_s, "behind": w.behind, "priority": w.priority}
                        for w in run_waits(s.history(), info.run_id)}
        doc["reserved"] = held
        doc["power_cycles"] = cycle_lines(s.history().events(info.run_id))
        recs = [{"module": m, **st} for m, st in doc["module_states"].items()]
        emit(recs, ["module", "state", "step", "model_key", "keys_done", "keys_total", "rows"], output, document=doc)
    else:
        from rich.markup import escape

        out = stdout()
        out.print(render(view, title=f"run {info.run_id} ({info.release}, {view.state()})"))
        from controller.history.waits import run_waits_line
        from controller.service.queue import reservation_waits_line

        for line in (run_waits_line(run_waits(s.history(), info.run_id)), reservation_waits_line(held),
                     *cycle_lines(s.history().events(info.run_id))):
            if line:
                out.print(line, markup=False, highlight=False, soft_wrap=True)
        if j is not None:
            out.print(f"verdict: [bold]{j.verdict}[/] - {escape(j.line)}", highlight=False, soft_wrap=True)
    return service.exit_code(j.verdict) if j is not None else 0


def watch(ctx: typer.Context, run_id: str = typer.Argument("latest", help="run id, unique prefix or 'latest'"),
          baseline: str | None = typer.Option(None, "--baseline", "-b",
                                              help="baseline: release, release@vN or run id")) -> int:
    """Follow a run live until it ends (pulling its results into the history), then give its verdict."""
    from controller.cli.live import follow_and_judge

    s = session(ctx)
    info = service.find_run(s, run_id)
    if baseline:
        service.check_baseline(s, baseline)
    return follow_and_judge(s, info.run_id, baseline, stdout(), stderr())


def cancel(ctx: typer.Context, run_id: str = typer.Argument(..., help="run id or unique prefix"),
           devices: str | None = typer.Option(None, "--devices", "-d", help="only these modules")) -> None:
    """Cancel a run (durable: modules check it between and within steps)."""
    rid, names = service.cancel(session(ctx), run_id, devices)
    stderr().print(f"cancel requested for run {rid}" + (f" on {', '.join(names)}" if devices else ""),
                   highlight=False)


def retry(
    ctx: typer.Context,
    run_id: str = typer.Argument("latest", help=RUN_ARG),
    failed_only: bool = typer.Option(False, "--failed-only", help="only the modules that failed, each with the "
                                                                   "model keys that did not pass there"),
    detach: bool = typer.Option(False, "--detach", help="return at once; follow with status/watch"),
    baseline: str | None = typer.Option(None, "--baseline", "-b", help="baseline: release, release@vN or run id"),
) -> int:
    """A new run (new id) of a run's release and model keys on its modules.

    To continue the same run instead, keeping what passed: fleetctl validate TARBALL --run-id RUN --resume.
    """
    from controller.cli.live import follow_and_judge, print_launched

    s = session(ctx)
    if baseline:
        service.check_baseline(s, baseline)
    launched = service.retry(s, run_id, failed_only=failed_only)
    print_launched(launched, stderr(), len(launched.modules), run_page(s.settings.serve_url, launched.run_id))
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
    kernel: bool = typer.Option(False, "--kernel", help="instead: the kernel log and agent journal tails (and "
                                                        "the serial console's, where the inventory names one) the "
                                                        "controller kept of a module lost, restarted or with a "
                                                        "failed key"),
) -> None:
    """Step logs of a run, read from each module's workdir (local modules) or over SSH."""
    s = session(ctx)
    info = service.find_run(s, run_id)
    shown: dict[tuple[str, str], int] = {}
    several = module is None and len(info.modules) > 1

    def show() -> None:
        for f in service.logs(s, info.run_id, module=module, step=step, key=key, kernel=kernel):
            done = shown.get((f.module, f.name))
            if done is None:
                sys.stdout.write(f"==> {f.module} {f.name} <==\n" if several else f"==> {f.name} <==\n")
                done = 0
            sys.stdout.write(f.text[done:])
            sys.stdout.flush()
            shown[(f.module, f.name)] = len(f.text)

    show()
    while follow and not kernel and not service.view(s, info.run_id, live=True).finished:
        time.sleep(1.0)
        show()
    if not shown:
        what = "kernel logs kept" if kernel else "step logs"
        stderr().print(f"no {what} of run {info.run_id} (yet)" + (f" on {module}" if module else ""))


def runs(ctx: typer.Context,
         limit: int = typer.Option(20, "--limit", "-n", min=1, help="at most this many, newest first"),
         output: Output = output_option()) -> None:
    """Recent runs. A run the history holds as running shows the state its modules' records on the broker give
    (read, not written: `fleetctl status RUN` records it)."""
    s = session(ctx)
    # service.runs(live=False) without its imports: the broker, and Celery, are read only for a running run
    items = s.history().runs(limit=limit) if s.has_history() else []
    note = None
    if any(i.state == "running" for i in items):
        items, note = service.with_broker_states(s, items)
    if note:
        stderr().print(f"note: {note}", highlight=False)
    recs = [{**r.model_dump(mode="json"), "created": time.strftime("%Y-%m-%d %H:%M", time.localtime(r.created_at))}
            for r in items]
    emit(recs, ["run_id", "created", "release", "modules", "models", "state", "verdict"], output)
    if not items:  # on stderr: stdout stays the (empty) list a script reads
        why = (f"no runs in {s.history_path} yet: run a validation (`{fleetctl('validate', 'TARBALL')}`)"
               if s.has_history() else s.no_history())
        sys.stderr.write(why + "\n")


ROW_COLUMNS = ("module", "model_key", "profile", "prefill_tps", "ttft_ms", "decode_tps", "tpot_ms", "extra")


def results(ctx: typer.Context, run_id: str = typer.Argument("latest", help="run id, unique prefix or 'latest'"),
            output: Output = output_option(),
            fmt: Output | None = typer.Option(None, "--format", hidden=True, help="old name of --output"),
            pull: bool = typer.Option(False, "--sync", help="pull the newest rows from the broker first (writes)"),
            telemetry: bool = typer.Option(False, "--telemetry", help="device telemetry per module and model key "
                                                                      "instead of the result rows"),
            energy: bool = typer.Option(False, "--energy", help="energy per module and model key (J/token, "
                                                                "tokens/J, power, idle) instead of the result rows"),
            ) -> None:
    """Result rows of a run (or its device telemetry, or its energy), from the run history."""
    from controller.history import ROW_FIELDS

    output = fmt or output
    info, rows = service.results(session(ctx), run_id, pull=pull)
    if telemetry:
        _emit_telemetry(session(ctx).history().telemetry(info.run_id), output)
        return
    if energy:
        recs = energy_records(rows)
        # 4 significant digits: a GPU's J/token is a few mJ, an M1000's a few J
        if output != Output.json:
            recs = [{k: f"{v:.4g}" if isinstance(v, float) else v for k, v in r.items()} for r in recs]
        emit(recs, ENERGY_COLUMNS, output, title=f"energy of {info.run_id} (one benchmark window per module and "
                                                 "model key)")
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
            d.update(extra=json.dumps(d["extra"]), flags=json.dumps(d["flags"]),
                     energy=json.dumps(d["energy"]) if d["energy"] else "")
    emit(docs, ROW_FIELDS, output)


ENERGY_COLUMNS = ("module", "model_key", "rows", "j_per_token", "tokens_per_j", "avg_power_w", "idle_power_w",
                  "energy_j", "energy_above_idle_j", "window_s", "source", "coverage", "note")


def energy_records(rows: Sequence[ResultRow]) -> list[dict[str, Any]]:
    """One record per (module, model key): the energy of its benchmark window (every release row of a key
    carries the same figures), in the rows' order; a key without energy says why where it can."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        if r.source != "release":
            continue
        rec = out.get((r.module, r.model_key))
        if rec is not None:
            rec["rows"] += 1
            continue
        w = r.energy
        out[r.module, r.model_key] = {
            "module": r.module, "model_key": r.model_key, "rows": 1, "j_per_token": r.j_per_token,
            "tokens_per_j": r.tokens_per_j, "avg_power_w": r.avg_power_w, "idle_power_w": r.idle_power_w,
            "energy_j": r.energy_j, "energy_above_idle_j": r.energy_above_idle_j,
            "window_s": w.window_s if w else None, "source": w.source if w else "",
            "coverage": w.coverage if w else None,
            "note": w.note if w else "not measured (no device telemetry, or rows from before energy)"}
    return list(out.values())


TELEMETRY_TABLE = ("module", "model key", "gpu", "samples", "SM clock p95 / max MHz", "max °C",
                   "power p95 / limit W", "memory max MiB", "slowdown", "notes")


def _emit_telemetry(summaries: dict[str, Any], output: Output) -> None:
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


def describe_run(ctx: typer.Context, run_id: str = typer.Argument("latest", help=RUN_ARG),
                 output: Output = output_option()) -> None:
    """A run: release, models, modules, state and step of each module, errors, rows, verdict (read-only)."""
    s = session(ctx)
    d = service.describe_run(s, run_id)
    doc = {**service.run_summary(d.info, d.view, rows=d.rows), "errors": service.errors_of(d.view)}
    recs = []
    for m, st in doc["module_states"].items():
        failed = [o["model_key"] for o in st.get("outcomes", []) if o["status"] == "failed"]
        recs.append({"module": m, "state": st["state"], "step": st["step"],
                     "keys": f"{st.get('keys_done', 0)}/{st.get('keys_total', len(d.info.models_of(m)))}",
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
