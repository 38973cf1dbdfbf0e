"""``fleet-agent``: the agent's command line (one function per command, no side effects at import).

``fleet-agent run TARBALL --models qwen3,qwen35_mtp --model-root DIR`` validates a release on
this module without any broker: live progress on stderr, summary and results on stdout,
exit 0 when everything passed, 1 when a step or key failed (or the run was cancelled),
2 for bad input (one clear line).

Lazy imports: ``worker`` and ``exporter`` import their work when they run: :mod:`agent.worker` loads
Celery's app (123 ms CPU, 14.7 MiB) and :mod:`agent.metrics` prometheus_client (59 ms, 7.0 MiB), which
``run`` and ``probe`` never use (``bench/import_costs.py``, raw
bench/results/import_costs_20261207_0346_lazy-libraries.txt).
"""

from __future__ import annotations

import csv
import io
import json
import re
import secrets
import signal
import sys
import threading
import time
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

# rich is imported by the commands that print: `fleet-agent worker` runs without it
if TYPE_CHECKING:
    from collections.abc import Sequence

    from rich.console import Console
    from rich.table import Table

from agent import pipeline
from agent.errors import BadInput
from agent.executor import EventCancelToken
from agent.probe import SLO, ProbeConfig, ProbeError, load_shapes, run_probe
from agent.probe.prompts import parse_profiles
from agent.probe.runner import run_sweep
from agent.probe.sweep import SweepConfig, SweepSLO
from agent.probe.transport import Transport
from agent.procs import hold_orphans
from agent.settings import AgentSettings
from agent.unpack import tarball_sha256
from contract.oneline import error_line
from contract.records import ResultRow, RunProgress, RunRequest, UnknownModelKey, parse_model_keys, release_version_of
from contract.settings import load_settings

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="m1000-fleet agent on one module.")


@app.callback()
def _root() -> None:
    """m1000-fleet agent: validate SGLang-MUSA releases on this module."""


class OutputFormat(str, Enum):
    table = "table"
    csv = "csv"
    json = "json"


def _bad_input(message: str) -> typer.Exit:
    _console(stderr=True).print(_styled("error:", "red", message), highlight=False, soft_wrap=True)
    return typer.Exit(2)


def _parse_key_env(items: list[str]) -> dict[str, dict[str, str]]:
    """``KEY:VAR=VALUE`` items -> {key: {var: value}}."""
    out: dict[str, dict[str, str]] = {}
    for item in items:
        key, sep, assign = item.partition(":")
        var, eq, value = assign.partition("=")
        if not sep or not eq or not key or not var:
            raise BadInput(f"--key-env {item!r}: expected KEY:VAR=VALUE")
        out.setdefault(key, {})[var] = value
    return out


@app.command()
def run(
    tarball: Path = typer.Argument(..., help="release tarball (SGLang-MUSA-...tar.gz)"),
    models: str = typer.Option("all", "--models", "-m", help="comma-separated model keys, or 'all'"),
    model_root: Path = typer.Option(..., "--model-root", help="folder holding this module's model folders"),
    workdir: Path | None = typer.Option(None, "--workdir", help="releases, runs, caches (default: settings)"),
    run_id: str | None = typer.Option(None, "--run-id", help="run id (re-running one resumes it)"),
    module: str | None = typer.Option(None, "--module", help="this module's name (default: settings)"),
    server_port: int | None = typer.Option(None, "--server-port", help="port of the release's server"),
    sha256: str | None = typer.Option(None, "--sha256", help="expected sha256 (default: computed)"),
    fmt: OutputFormat = typer.Option(OutputFormat.table, "--format", help="results on stdout as table, csv or json"),
    key_env: list[str] = typer.Option([], "--key-env", help="extra variable for a key: KEY:VAR=VALUE (repeatable)"),
    ready_timeout: float | None = typer.Option(None, "--ready-timeout", help="server ready timeout, s"),
    benchmark_timeout: float | None = typer.Option(None, "--benchmark-timeout", help="per key, s"),
    config: Path | None = typer.Option(None, "--config", help="TOML config file (else FLEET_CONFIG)"),
) -> None:
    """Validate a release on this module (no broker needed)."""
    try:
        keys = parse_model_keys(models)
        settings = load_settings(AgentSettings, config, module=module, workdir=workdir.resolve() if workdir else None,
                                 server_port=server_port)
        cfg = pipeline.AgentConfig.from_settings(settings, ready_timeout=ready_timeout,
                                                 benchmark_timeout=benchmark_timeout,
                                                 key_env=_parse_key_env(key_env) or None)
        if not tarball.is_file():
            raise BadInput(f"{tarball}: tarball not found")
        if not model_root.is_dir():
            raise BadInput(f"--model-root {model_root}: not a folder")
        if sha256 is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", sha256.strip()):
            raise BadInput(f"--sha256 {sha256!r}: not 64 hex digits")
        digest = (sha256 or tarball_sha256(tarball)).strip().lower()
        request = RunRequest(
            run_id=run_id or local_run_id(), module=cfg.module, tarball=str(tarball.resolve()),
            sha256=digest, release=release_version_of(tarball.name) or tarball.name, models=keys,
            model_root=str(model_root.resolve()),
        )
    except (BadInput, UnknownModelKey, ValueError) as exc:
        raise _bad_input(error_line(exc)) from None

    # what the run starts stays this process's descendant, daemonized or not
    why = hold_orphans()
    err = _console(stderr=True)
    if why:
        err.print(_styled("warning:", "yellow", why), highlight=False, soft_wrap=True)
    token = EventCancelToken()
    previous = signal.signal(signal.SIGINT, lambda *_: token.cancel())
    try:
        with err.status("starting", spinner="dots") as status:
            result = pipeline.run_pipeline(request, cfg, on_progress=lambda p: status.update(_status_line(p)),
                                           cancel=token)
    except BadInput as exc:
        raise _bad_input(str(exc)) from None
    finally:
        signal.signal(signal.SIGINT, previous)
    _print(result.progress, list(result.rows), fmt, err)
    raise typer.Exit(0 if result.ok else 1)


def local_run_id() -> str:
    """``local-YYYYMMDD-HHMMSS-<6 hex>``: random bits, so two runs started in one second never share an id."""
    return time.strftime("local-%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


def _status_line(p: RunProgress) -> str:
    where = f"{p.step}[{p.model_key}]" if p.model_key else p.step
    return f"{p.run_id} {p.state.value} {where} keys {p.keys_done}/{p.keys_total} rows {p.rows} ({p.progress:.0%})"


def _console(**kwargs: Any) -> Console:
    """A console that prints text as it is: no rich markup, so ``[agent]`` in a message or a table cell stays."""
    from rich.console import Console

    return Console(markup=False, **kwargs)


def _styled(label: str, style: str, message: str) -> Any:
    """``label`` in ``style``, then ``message`` verbatim (brackets and all)."""
    from rich.text import Text

    return Text.assemble((label, style), " ", message)


def _table(*columns: str, **kwargs: Any) -> Table:
    from rich.table import Table

    return Table(*columns, **kwargs)


def _stdout() -> Console:
    out = _console()
    return out if out.is_terminal else _console(width=200)  # piped: do not cut columns at 80


def _print(progress: RunProgress, rows: list[ResultRow], fmt: OutputFormat, err: Console) -> None:
    _summary(progress, err if fmt != OutputFormat.table else _stdout())
    if fmt == OutputFormat.json:
        data = {"progress": progress.model_dump(mode="json"), "rows": [r.model_dump(mode="json") for r in rows]}
        sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    elif fmt == OutputFormat.csv:
        sys.stdout.write(rows_csv(rows))
    else:
        _stdout().print(_rows_table(rows))


def _summary(p: RunProgress, out: Console) -> None:
    cached = {True: "cached (skipped)", False: "ran", None: "-"}[p.precompile_cached]
    if p.kernel_cache is not None and p.kernel_cache.action == "fetched":
        cached = f"fetched {p.kernel_cache.archive[:12]} (fleet kernel cache)"
    out.print(f"run {p.run_id} on {p.module}: {p.state.value}, {p.rows} rows, precompile {cached}", highlight=False)
    if p.error is not None:
        out.print(f"  error: {p.error.one_line()}", highlight=False)
    table = _table("model key", "status", "rows", "flagged", "time (s)", "error")
    for o in p.outcomes:
        table.add_row(o.model_key, o.status, str(o.rows), str(o.flagged_rows), f"{o.duration_s:.1f}",
                      o.error.one_line() if o.error else "")
    out.print(table)


_TABLE_COLUMNS = ("model_key", "profile", "source", "prefill_tps", "ttft_ms", "decode_tps", "tpot_ms", "accept_rate",
                  "vision_fps", "flags")


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.3f}"
    if isinstance(v, (tuple, list)):
        return ",".join(str(x) for x in v)
    return str(v)


def _rows_table(rows: list[ResultRow]) -> Table:
    table = _table(*_TABLE_COLUMNS, title="results")
    for r in rows:
        table.add_row(*(_cell(getattr(r, c)) for c in _TABLE_COLUMNS))
    return table


def rows_csv(rows: list[ResultRow]) -> str:
    """Every field of every row as CSV (extra columns as JSON, flags ';'-joined)."""
    buf = io.StringIO()
    names = list(ResultRow.model_fields)
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(names)
    for r in rows:
        d = r.model_dump(mode="json")
        d["extra"] = json.dumps(d["extra"], ensure_ascii=False) if d["extra"] else ""
        d["flags"] = ";".join(d["flags"])
        w.writerow(["" if d[n] is None else d[n] for n in names])
    return buf.getvalue()


class ProbeFormat(str, Enum):
    table = "table"
    json = "json"


class ProbeApi(str, Enum):
    completions = "completions"
    chat = "chat"


class PromptKind(str, Enum):
    text = "text"
    ids = "ids"


class CacheMode(str, Enum):
    cold = "cold"
    warm = "warm"


def _tokenizer(spec: str | None) -> Any:
    """``words`` (one token per whitespace-separated word) or a ``tokenizer.json`` (needs ``tokenizers``)."""
    if spec is None:
        return None
    if spec == "words":
        return lambda text: len(text.split())
    try:
        from tokenizers import Tokenizer  # optional: only for servers that send no usage
    except ImportError:
        raise BadInput(f"--tokenizer {spec}: needs the 'tokenizers' package (or use --tokenizer words)") from None
    try:
        tok = Tokenizer.from_file(spec)
    except Exception as exc:  # any reason the file is not a tokenizer: one line
        raise BadInput(f"--tokenizer {spec}: {exc}") from None
    return lambda text: len(tok.encode(text, add_special_tokens=False).ids)


@app.command()
def probe(
    url: str = typer.Argument(..., help="the server, e.g. http://127.0.0.1:30000 (OpenAI-compatible)"),
    model: str | None = typer.Option(None, "--model", "-m", help="model name (default: the server's first model)"),
    profiles: str = typer.Option("128:128", "--profiles", "-p", help="prefill_len:input_len,... (shared prefix: "
                                 "input_len - prefill_len tokens, warmed first)"),
    concurrency: str | None = typer.Option(None, "--concurrency", "-c", help="fixed concurrency, e.g. 1,4,16 "
                                           "(default: sequential)"),
    rate: float | None = typer.Option(None, "--rate", help="Poisson arrivals, requests per second"),
    requests: int = typer.Option(10, "--requests", "-n", help="measured requests per profile and load"),
    repeat: int = typer.Option(1, "--repeat", help="measure each profile and load this many times: figures pooled, "
                               "each with its 95 % t interval over the repeats"),
    warmup: int = typer.Option(1, "--warmup", help="requests before the measured ones, not counted"),
    output_len: int = typer.Option(100, "--output-len", help="max_tokens (ignore_eos where the server takes it)"),
    api: ProbeApi = typer.Option(ProbeApi.completions, "--api", help="/v1/completions or /v1/chat/completions"),
    images: int = typer.Option(0, "--images", help="image_url parts per chat request"),
    prompt: PromptKind = typer.Option(PromptKind.text, "--prompt", help="completions prompts: text (the server "
                                      "tokenizes, as bench_serving's clients do) or token ids"),
    slo: str | None = typer.Option(None, "--slo", help="goodput objectives: ttft_ms=..,tpot_ms=..,e2e_ms=.."),
    fmt: ProbeFormat = typer.Option(ProbeFormat.table, "--format", help="table or json on stdout"),
    timeout: float = typer.Option(600.0, "--timeout", help="one request, send to end, s"),
    time_scale: float | None = typer.Option(None, "--time-scale", help="multiply times by this (default: the "
                                            "simulated server's own scale, else 1)"),
    engine_fields: bool = typer.Option(True, "--engine-fields/--no-engine-fields",
                                       help="send ignore_eos and stream_options (dropped after a 422)"),
    tokenizer: str | None = typer.Option(None, "--tokenizer", help="count output tokens when the server sends "
                                         "no usage: 'words' or a tokenizer.json"),
    seed: int = typer.Option(0, "--seed", help="prompts and Poisson arrivals"),
    cache: CacheMode = typer.Option(CacheMode.cold, "--cache", help="cold: prompts salted per run (nothing of them "
                                    "cached); warm: each prompt sent once before it is measured"),
    sweep: bool = typer.Option(False, "--sweep", help="raise the concurrency until the SLO breaks or throughput "
                               "stops rising; name the highest load that met the SLO (--slo: ttft_p90_ms=..,"
                               "tpot_p90_ms=..; the first profile)"),
    sweep_budget: float = typer.Option(300.0, "--sweep-budget", help="the sweep's wall seconds, at most"),
    max_concurrency: int = typer.Option(256, "--max-concurrency", help="the sweep's largest concurrency"),
) -> None:
    """Measure an OpenAI-compatible server with the agent's own streaming client (progress on stderr)."""
    try:
        cfg, plan = _probe_plan(url, model, profiles, concurrency, rate, requests, repeat, warmup, output_len, api,
                                images, prompt, slo, timeout, time_scale, engine_fields, seed, cache, sweep,
                                sweep_budget, max_concurrency)
        count = _tokenizer(tokenizer)
    except (BadInput, ValueError) as exc:
        raise _bad_input(error_line(exc)) from None
    err = _console(stderr=True)
    outcome, stopped = _measure(cfg, plan, count, err)
    raise typer.Exit(_show_probe(outcome, sweeping=plan is not None, fmt=fmt, stopped=stopped, err=err))


def _probe_plan(url: str, model: str | None, profiles: str, concurrency: str | None, rate: float | None,
                requests: int, repeat: int, warmup: int, output_len: int, api: ProbeApi, images: int,
                prompt: PromptKind, slo: str | None, timeout: float, time_scale: float | None, engine_fields: bool,
                seed: int, cache: CacheMode, sweep: bool, sweep_budget: float, max_concurrency: int
                ) -> tuple[Any, Any]:
    """``probe``'s options as the probe's configuration and, with ``--sweep``, the sweep's; :class:`BadInput`
    (or ValueError) naming the option that is wrong."""
    if images and api != ProbeApi.chat:
        raise BadInput("--images needs --api chat")
    kinds: dict[str, Any] = {"api": api.value, "prompt": prompt.value, "cache": cache.value}
    plan = None
    if sweep:
        if not slo:
            raise BadInput("--sweep needs --slo, e.g. ttft_p90_ms=4000,tpot_p90_ms=60")
        if concurrency or rate is not None:
            raise BadInput("--sweep chooses the concurrency itself: leave out --concurrency and --rate")
        plan = SweepConfig(slo=SweepSLO.parse(slo), budget_s=sweep_budget, max_concurrency=max_concurrency)
    cfg = ProbeConfig(base_url=url, model=model, profiles=tuple(p.name for p in parse_profiles(profiles)),
                      loads=load_shapes(concurrency, rate), requests=requests, warmup=warmup, repeat=repeat,
                      output_len=output_len, images=images, slo=SLO.parse(slo) if slo and not sweep else None,
                      timeout_s=timeout, time_scale=time_scale, engine_fields=engine_fields, seed=seed, **kinds)
    # the URL's form, checked before anything runs
    Transport(url)
    return cfg, plan


def _measure(cfg: Any, plan: Any, count: Any, err: Console) -> tuple[Any, bool]:
    """The probe's report (or, with a sweep ``plan``, the sweep's result), progress on ``err``; and whether ^C
    stopped it early (the first ^C stops after the request in flight)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    stopping = {"yes": False}
    outcome: Any = None
    previous = signal.signal(signal.SIGINT, lambda *_: stopping.update(yes=True))
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=err, transient=True) as bar:
            task = bar.add_task("probe", total=None)

            def tick(what: str, done: int, planned: int) -> None:
                bar.update(task, description=what, completed=done, total=planned)

            if plan is not None:
                outcome = run_sweep(cfg, plan, tokenizer=count, progress=tick, stop=lambda: stopping["yes"])
            else:
                outcome = run_probe(cfg, tokenizer=count, progress=tick, stop=lambda: stopping["yes"])
    except ProbeError as exc:
        raise _bad_input(str(exc)) from None
    finally:
        signal.signal(signal.SIGINT, previous)
    return outcome, stopping["yes"]


def _show_probe(outcome: Any, *, sweeping: bool, fmt: ProbeFormat, stopped: bool, err: Console) -> int:
    """Print the probe's report or the sweep's result on stdout (json or a table); the exit code: 1 where a
    request failed, the sweep found no capacity, or ^C stopped it."""
    if fmt == ProbeFormat.json:
        sys.stdout.write(outcome.model_dump_json(indent=2) + "\n")
    elif sweeping:
        _sweep_table(outcome, _stdout())
    else:
        _probe_table(outcome, _stdout(), err)
    if sweeping:
        return 0 if outcome.capacity is not None and not stopped else 1
    return 1 if outcome.errors or stopped else 0


def _sweep_table(result: Any, out: Console) -> None:
    title = (f"SLO sweep {result.profile}, SLO {result.slo}: steady-state window of each level (times in ms); "
             f"stopped: {result.stop}")
    names = [n for n, _ in result.slo.limits]
    table = _table("concurrency", "window ok/n", *names, "TTFT p50", "TPOT p50", "out tok/s", "req/s", "SLO",
                  title=title)
    for lv in result.levels:
        table.add_row(str(lv.concurrency), f"{lv.ok}/{lv.window}", *(_cell(lv.figures.get(n)) for n in names),
                      _cell(lv.figures.get("ttft_p50_ms")), _cell(lv.figures.get("tpot_p50_ms")),
                      _cell(lv.output_tps), _cell(lv.request_rps), "met" if lv.met else "broken")
    out.print(table)
    cap = result.capacity
    out.print(f"capacity at SLO: concurrency {cap.concurrency}, {cap.output_tps:.2f} output tok/s, "
              f"{cap.request_rps:.3f} req/s" if cap is not None and cap.output_tps and cap.request_rps else
              "capacity at SLO: none (concurrency 1 breaks it)" if cap is None else
              f"capacity at SLO: concurrency {cap.concurrency}", highlight=False)


def _ms(stat: Any, q: str = "p50") -> str:
    return "" if stat is None else f"{getattr(stat, q):.2f}"


def _probe_table(report: Any, out: Console, err: Console) -> None:
    scale = f", time scale {report.time_scale:g}" if report.time_scale != 1 else ""
    fields = "" if report.engine_fields else ", engine-specific fields refused by the server"
    title = (f"probe {report.base_url} {report.model} ({report.api}, prompts as {report.prompt}{scale}, cache "
             f"{report.cache}{fields}); times in ms")
    table = _table("profile", "load", "ok/sent", "TTFT p50", "p90", "p99", "TPOT p50", "p90", "p99", "ITL p50",
                  "p99", "E2E p50", "p99", "out tok/s", "req/s", "goodput/s", "tok/chunk", "accept", title=title)
    for r in report.results:
        table.add_row(r.profile, r.load.label, f"{r.ok}/{r.requests}", _ms(r.ttft_ms), _ms(r.ttft_ms, "p90"),
                      _ms(r.ttft_ms, "p99"), _ms(r.tpot_ms), _ms(r.tpot_ms, "p90"), _ms(r.tpot_ms, "p99"),
                      _ms(r.itl_ms), _ms(r.itl_ms, "p99"), _ms(r.e2e_ms), _ms(r.e2e_ms, "p99"),
                      _cell(r.output_throughput_tps), _cell(r.request_throughput_rps), _cell(r.goodput_rps),
                      _cell(r.tokens_per_chunk), _cell(r.accept_length))
    out.print(table)
    for r in report.results:
        if r.intervals:
            spans = ", ".join(f"{k} {iv.mean:.2f} [{iv.low:.2f}, {iv.high:.2f}]" for k, iv in r.intervals.items())
            out.print(f"{r.profile} {r.load.label}: 95 % t intervals over {r.repeats} repeats: {spans}",
                      highlight=False, soft_wrap=True)
    for r in report.results:
        if r.errors:
            kinds = ", ".join(f"{k} {v}" for k, v in sorted(r.errors.items()))
            err.print(f"{r.profile} {r.load.label}: errors: {kinds}", highlight=False)
            for d in r.error_details:
                err.print(f"  {d}", highlight=False, soft_wrap=True)


@app.command()
def worker(
    config: Path | None = typer.Option(None, "--config", "-c", envvar="FLEET_CONFIG",
                                       help="TOML config ([fleet], [agent]); FLEET_* variables override it"),
    loglevel: str = typer.Option("INFO", "--loglevel", help="log level (DEBUG, INFO, WARNING, ERROR)"),
) -> None:
    """Serve this module's Celery queue (one run at a time), heartbeat, and /metrics."""
    from agent.worker import main as worker_main

    worker_main(str(config) if config is not None else None, loglevel=loglevel)


@app.command()
def exporter(
    config: Path | None = typer.Option(None, "--config", "-c", envvar="FLEET_CONFIG",
                                       help="TOML config ([fleet], [agent]); FLEET_* variables override it"),
    workdir: Path | None = typer.Option(None, "--workdir", help="the module's workdir (default: settings)"),
    host: str | None = typer.Option(None, "--host", help="bind address (default: settings metrics_host, loopback)"),
    port: int | None = typer.Option(None, "--port", help="port (default: settings metrics_port)"),
    push_interval: float = typer.Option(15.0, "--push-interval", help="s between pushes when pushgateway_url is set"),
) -> None:
    """Serve /metrics of this module's workdir (and push to a Pushgateway if configured) until stopped."""
    from agent import metrics

    try:
        s = load_settings(AgentSettings, config, workdir=workdir, metrics_host=host, metrics_port=port)
    except ValueError as exc:
        # SettingsError, pydantic's ValidationError: the config file or a FLEET_* variable
        raise _bad_input(f"settings: {error_line(exc)}") from None
    wd = s.workdir.expanduser()
    reg = metrics.build_registry(wd, s.module)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server = metrics.start_exporter(wd, s.module, host=s.metrics_host, port=s.metrics_port, registry=reg) \
        if s.metrics_port else None
    pusher = metrics.Pusher(reg, s.pushgateway_url, s.module, interval=push_interval).start() \
        if s.pushgateway_url else None
    if server is None and pusher is None:
        raise _bad_input("exporter: metrics_port is 0 and no pushgateway_url: nothing to do")
    stop.wait()
    if pusher is not None:
        pusher.stop()
    if server is not None:
        server[0].shutdown()
        server[0].server_close()


def main(argv: Sequence[str] | None = None) -> None:
    """``fleet-agent ARGV`` (None: the process's own command line)."""
    app(args=None if argv is None else list(argv), prog_name="fleet-agent")


if __name__ == "__main__":  # pragma: no cover
    main()
