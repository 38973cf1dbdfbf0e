"""Dashboards as code: builds grafana/dashboards/*.json with the grafana-foundation-sdk builders.

    .venv/bin/python grafana/build_dashboards.py          # write the JSON files
    .venv/bin/python grafana/build_dashboards.py --check  # exit 1 if a file is out of date

Every query uses the provisioned Prometheus datasource (uid ``m1000-prometheus``) and the
template variables ``$release``, ``$model_key`` and ``$module`` as regex matchers, so
"All" (``.*``) works. Units follow the metric's base unit: seconds -> ``s``, bytes ->
``bytes``, ratios -> ``percentunit``, tokens per second -> ``suffix: tok/s``, frames per
second -> ``suffix: fps``, Celsius -> ``celsius``, watts -> ``watt``, hertz -> ``hertz``,
counts -> ``none``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import bargauge, stat, table, timeseries
from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus as prom
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import LegendDisplayMode, LegendPlacement
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh, VariableSort

HERE = Path(__file__).resolve().parent
OUT = HERE / "dashboards"
DS_UID = "m1000-prometheus"
DS = DataSourceRef(type_val="prometheus", uid=DS_UID)
LAST = cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False)
TOK_S = "suffix: tok/s"
FPS = "suffix: fps"

M = 'module=~"$module"'
R = 'release=~"$release"'
K = 'model_key=~"$model_key"'
RKM = f"{R}, {K}, {M}"


def q(expr: str, legend: str = "", instant: bool = False, ref: str = "A") -> prom.Dataquery:
    d = prom.Dataquery().expr(expr).ref_id(ref).datasource(DS)
    if legend:
        d = d.legend_format(legend)
    if instant:
        d = d.instant().format("table")  # type: ignore[arg-type]
    return d


def ts(title: str, unit: str, *queries: prom.Dataquery, w: int = 12, h: int = 8, desc: str = "") -> Any:
    p = timeseries.Panel().title(title).unit(unit).datasource(DS).span(w).height(h).legend(
        cb.VizLegendOptions().show_legend(True).display_mode(LegendDisplayMode.LIST).placement(LegendPlacement.BOTTOM))
    if desc:
        p = p.description(desc)
    for x in queries:
        p = p.with_target(x)
    return p


def st(title: str, unit: str, *queries: prom.Dataquery, w: int = 6, h: int = 5, desc: str = "") -> Any:
    p = stat.Panel().title(title).unit(unit).datasource(DS).span(w).height(h).reduce_options(LAST)
    if desc:
        p = p.description(desc)
    for x in queries:
        p = p.with_target(x)
    return p


def tb(title: str, unit: str, *queries: prom.Dataquery, w: int = 12, h: int = 8, desc: str = "") -> Any:
    p = table.Panel().title(title).unit(unit).datasource(DS).span(w).height(h).show_header(True)
    if desc:
        p = p.description(desc)
    for x in queries:
        p = p.with_target(x)
    return p


def bg(title: str, unit: str, *queries: prom.Dataquery, w: int = 12, h: int = 8, desc: str = "",
       lo: float | None = None, hi: float | None = None) -> Any:
    p = bargauge.Panel().title(title).unit(unit).datasource(DS).span(w).height(h).reduce_options(LAST)
    if desc:
        p = p.description(desc)
    if lo is not None:
        p = p.min(lo)
    if hi is not None:
        p = p.max(hi)
    for x in queries:
        p = p.with_target(x)
    return p


def var(name: str, label: str, query: str, *, multi: bool = True) -> db.QueryVariable:
    v = (db.QueryVariable(name).label(label).query(query).datasource(DS)
         .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).sort(VariableSort.ALPHABETICAL_ASC))
    if multi:
        v = v.multi(True).include_all(True).all_value(".*")
    return v


VAR_RELEASE = ("release", "Release", "label_values(m1000_result_rows, release)")
VAR_KEY = ("model_key", "Model key", 'label_values(m1000_result_rows{release=~"$release"}, model_key)')
VAR_MODULE = ("module", "Module", 'label_values(up{job="m1000-agent"}, module)')


def base(uid: str, title: str, tags: list[str], variables: list[db.QueryVariable]) -> db.Dashboard:
    d = (db.Dashboard(title).uid(uid).tags(["m1000", *tags]).time("now-6h", "now").refresh("30s")
         .timezone("browser").editable())
    for v in variables:
        d = d.with_variable(v)
    return d


# a region while a change point across the release history is in force (fleet series; fleetctl trend names it)
CHANGE_POINTS_EXPR = 'sum by (model_key, metric) (m1000_trend_change_points{scope="fleet"}) > 0'


def fleet_overview() -> db.Dashboard:
    d = base("m1000-fleet-overview", "M1000 fleet overview", ["fleet"], [var(*VAR_MODULE)])
    d = d.annotation(db.AnnotationQuery().name("Change points in force").datasource(DS).enable(True)
                     .icon_color("rgba(207, 34, 46, 1)").expr(CHANGE_POINTS_EXPR))
    d = d.with_row(db.Row("Fleet"))
    d = d.with_panel(st("Modules per state", "none", q("m1000_fleet_modules", "{{state}}", instant=True)))
    d = d.with_panel(st("Agents up", "none", q(f'sum(up{{job="m1000-agent", {M}}})', "up", instant=True)))
    d = d.with_panel(st("Runs by verdict", "none", q("m1000_fleet_runs", "{{verdict}}", instant=True)))
    d = d.with_panel(st("Active runs", "none", q(f"sum(m1000_run_active{{{M}}})", "active", instant=True)))
    d = d.with_panel(tb("State per module", "none",
                        q(f"max by (module, state) (m1000_fleet_module_state{{{M}}}) == 1", instant=True),
                        desc="idle, busy, unreachable (run goes on), offline or bad, as the controller sees each "
                             "module"))
    d = d.with_panel(ts("Power cycles", "none",
                        q(f"sum by (module, result) (m1000_fleet_power_cycles{{{M}}})", "{{module}} {{result}}"),
                        desc="hung modules power-cycled through their PDU (done) or whose PDU did not answer (failed), "
                             "counted from the history: a step is a cycle (docs/howto/recover-hung-modules.md)"))
    d = d.with_row(db.Row("Queue"))
    d = d.with_panel(ts("Runs waiting by priority", "none",
                        q("sum by (priority) (m1000_fleet_queue_length)", "{{priority}}"),
                        desc="runs waiting on the modules' queues; a module that frees up starts the highest first"))
    d = d.with_panel(ts("Queue lengths", "none", q("sum by (queue) (m1000_fleet_queue_length)", "{{queue}}")))
    d = d.with_panel(ts("Wait from dispatch to start (p50, p90)", "s",
                        q("histogram_quantile(0.5, sum by (le, priority) (m1000_fleet_run_wait_seconds_bucket))",
                          "p50 {{priority}}"),
                        q("histogram_quantile(0.9, sum by (le, priority) (m1000_fleet_run_wait_seconds_bucket))",
                          "p90 {{priority}}", ref="B"),
                        desc="every module's part of a run in the history, by the priority it was dispatched at"))
    d = d.with_panel(tb("Reserved modules", "none",
                        q(f"max by (module, user) (m1000_fleet_module_reserved{{{M}}}) == 1", instant=True),
                        desc="modules a user reserved (fleetctl reserve): other users' work waits or goes elsewhere"))
    d = d.with_row(db.Row("Current run"))
    d = d.with_panel(bg("Run progress per module", "percentunit",
                        q(f"m1000_run_progress_ratio{{{M}}}", "{{module}}", instant=True), lo=0, hi=1))
    d = d.with_panel(tb("Step per module", "none",
                        q(f"m1000_run_step_info{{{M}}}", instant=True),
                        desc="release, step and model key of the current or last run"))
    d = d.with_panel(ts("Model keys by outcome", "none",
                        q(f"sum by (status) (m1000_run_model_key_outcomes{{{M}}})", "{{status}}")))
    d = d.with_panel(ts("Heartbeat age", "s",
                        q(f"m1000_agent_heartbeat_age_seconds{{{M}}}", "{{module}}")))
    return d


def release_validation() -> db.Dashboard:
    d = base("m1000-release-validation", "M1000 release validation", ["release"],
             [var(*VAR_RELEASE), var(*VAR_KEY), var(*VAR_MODULE)])
    leg = "{{module}} {{model_key}} {{profile}}"
    d = d.with_row(db.Row("Against the baseline"))
    d = d.with_panel(bg("Performance vs baseline per module (1 = on par)", "percentunit",
                        q(f"m1000_fleet_baseline_ratio{{{RKM}}}", "{{module}} {{model_key}} {{metric}}",
                          instant=True),
                        desc="geometric mean over profiles; below 100 % is worse than the baseline"))
    d = d.with_panel(st("Cells worse than the baseline", "none",
                        q(f"sum by (module) (m1000_fleet_baseline_regressions{{{R}, {M}}})", "{{module}}",
                          instant=True)))
    for metric, title in (("decode_tokens_per_second", "Decode tok/s / baseline"),
                          ("prefill_tokens_per_second", "Prefill tok/s / baseline")):
        d = d.with_panel(ts(title, "percentunit", q(
            f"m1000_result_{metric}{{{RKM}}} / on (model_key, profile) group_left ()"
            f" max by (model_key, profile) (m1000_baseline_{metric})", leg)))
    for metric, title in (("ttft_seconds", "TTFT / baseline (lower is better)"),
                          ("tpot_seconds", "TPOT / baseline (lower is better)")):
        d = d.with_panel(ts(title, "percentunit", q(
            f"m1000_result_{metric}{{{RKM}}} / on (model_key, profile) group_left ()"
            f" max by (model_key, profile) (m1000_baseline_{metric})", leg)))
    d = d.with_row(db.Row("Figures per model key and profile"))
    d = d.with_panel(ts("TTFT", "s", q(f"m1000_result_ttft_seconds{{{RKM}}}", leg),
                        q(f"max by (model_key, profile) (m1000_baseline_ttft_seconds{{{K}}})",
                          "baseline {{model_key}} {{profile}}", ref="B")))
    d = d.with_panel(ts("TPOT", "s", q(f"m1000_result_tpot_seconds{{{RKM}}}", leg),
                        q(f"max by (model_key, profile) (m1000_baseline_tpot_seconds{{{K}}})",
                          "baseline {{model_key}} {{profile}}", ref="B")))
    d = d.with_panel(ts("Prefill throughput", TOK_S, q(f"m1000_result_prefill_tokens_per_second{{{RKM}}}", leg)))
    d = d.with_panel(ts("Decode throughput", TOK_S, q(f"m1000_result_decode_tokens_per_second{{{RKM}}}", leg)))
    d = d.with_panel(ts("Vision frames per second", FPS,
                        q(f"m1000_result_vision_frames_per_second{{{RKM}}}", leg)))
    d = d.with_panel(ts("Energy per output token", "joule",
                        q(f"max by (module, model_key) (m1000_result_energy_per_token_joules{{{RKM}}})",
                          "{{module}} {{model_key}}"),
                        desc="joules over each key's benchmark window per output token of its rows (the device's "
                             "energy counter, else its power samples integrated); lower is better"))
    d = d.with_panel(ts("Average power during the benchmark, idle before it", "watt",
                        q(f"max by (module, model_key) (m1000_result_average_power_watts{{{RKM}}})",
                          "{{module}} {{model_key}}"),
                        q(f"max by (module, model_key) (m1000_result_idle_power_watts{{{RKM}}})",
                          "idle {{module}} {{model_key}}", ref="B")))
    d = d.with_panel(ts("Start-up: server ready, first request, precompile", "s",
                        q(f"max by (module, model_key) (m1000_result_server_ready_seconds{{{RKM}}})",
                          "ready {{module}} {{model_key}}"),
                        q(f"max by (module, model_key) (m1000_result_first_request_seconds{{{RKM}}})",
                          "first request {{module}} {{model_key}}", ref="B"),
                        q(f"max by (module) (m1000_result_precompile_seconds{{{R}, {M}}})",
                          "precompile {{module}}", ref="C"),
                        q(f"max by (module) (m1000_result_precompile_fetch_seconds{{{R}, {M}}})",
                          "precompile fetched {{module}}", ref="D"),
                        desc="the release's start-up costs: each key's server start until /health answered 200, "
                             "its first request once ready (warm-up), the module's precompile (compiled, or a "
                             "shared cache fetched; none when cached); lower is better, judged with the start-up "
                             "tolerance"))
    d = d.with_panel(ts("MTP accept rate (acclen-1)/3", "percentunit",
                        q(f"m1000_result_mtp_accept_ratio{{{RKM}}}", leg)))
    d = d.with_panel(st("GSM8K accuracy", "percentunit",
                        q(f"m1000_result_gsm8k_accuracy_ratio{{{RKM}}}", "{{module}} {{model_key}}", instant=True),
                        w=12))
    return d


def module_drilldown() -> db.Dashboard:
    mod = db.QueryVariable(VAR_MODULE[0]).label(VAR_MODULE[1]).query(VAR_MODULE[2]).datasource(DS) \
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).sort(VariableSort.ALPHABETICAL_ASC)
    d = base("m1000-module", "M1000 module drill-down", ["module"], [mod])
    d = d.with_row(db.Row("Run"))
    d = d.with_panel(st("Run state", "none", q(f"m1000_run_state{{{M}}} == 1", "{{state}}", instant=True)))
    d = d.with_panel(st("Run progress", "percentunit", q(f"m1000_run_progress_ratio{{{M}}}", "progress",
                                                          instant=True)))
    d = d.with_panel(st("Model keys done", "none", q(f"m1000_run_model_keys_done{{{M}}}", "done", instant=True),
                        q(f"m1000_run_model_keys{{{M}}}", "planned", instant=True, ref="B")))
    d = d.with_panel(st("Last progress update", "s",
                        q(f"time() - m1000_run_updated_timestamp_seconds{{{M}}}", "age", instant=True)))
    d = d.with_panel(bg("Mean step duration (runs kept on the module)", "s", q(
        f"sum by (step) (m1000_step_duration_seconds_sum{{{M}}})"
        f" / sum by (step) (m1000_step_duration_seconds_count{{{M}}})", "{{step}}", instant=True)))
    d = d.with_panel(ts("Step duration p90", "s", q(
        f"histogram_quantile(0.9, sum by (le, step) (m1000_step_duration_seconds_bucket{{{M}}}))", "{{step}}")))
    d = d.with_panel(ts("Failed steps", "none", q(f"m1000_step_failures_total{{{M}}}", "{{step}}")))
    d = d.with_panel(ts("Exporter read errors", "none", q(f"m1000_exporter_read_errors_total{{{M}}}", "{{file}}")))
    d = d.with_row(db.Row("Module"))
    d = d.with_panel(ts("Load average", "none", q(f"m1000_module_load_average{{{M}}}", "{{window}}")))
    d = d.with_panel(ts("Memory", "bytes", q(f"m1000_module_memory_available_bytes{{{M}}}", "available"),
                        q(f"m1000_module_memory_total_bytes{{{M}}}", "total", ref="B")))
    d = d.with_panel(ts("Work folder free", "bytes", q(f"m1000_module_workdir_free_bytes{{{M}}}", "free")))
    d = d.with_panel(ts("GPU utilisation", "percentunit", q(f"m1000_module_gpu_utilization_ratio{{{M}}}",
                                                            "{{gpu}}"),
                        desc="absent where the platform exposes no readable GPU counters"))
    d = d.with_panel(ts("GPU temperature", "celsius", q(f"m1000_module_gpu_temperature_celsius{{{M}}}", "{{gpu}}")))
    d = d.with_panel(ts("Agent CPU", "percentunit", q(
        f'rate(process_cpu_seconds_total{{job="m1000-agent", {M}}}[$__rate_interval])', "{{instance}}"),
        desc="CPU of the process serving /metrics (the worker), in cores"))
    d = d.with_panel(ts("Agent resident memory", "bytes",
                        q(f'process_resident_memory_bytes{{job="m1000-agent", {M}}}', "{{instance}}")))
    d = d.with_panel(ts("Heartbeat age", "s",
                        q(f"m1000_agent_heartbeat_age_seconds{{{M}}}", "heartbeat")))
    return device_panels(d)


def device_panels(d: db.Dashboard) -> db.Dashboard:
    """The module's accelerators over its runs (device tool samples), the run's steps and keys as annotations."""
    d = d.annotation(db.AnnotationQuery().name("Run step and model key").datasource(DS).enable(True)
                     .icon_color("rgba(0, 211, 255, 1)").expr(f"m1000_run_step_info{{{M}}}"))
    leg = "gpu {{gpu}} {{model_key}}"
    note = "sampled by the device tool (mthreads-gmi / nvidia-smi) while a run is in progress"
    d = d.with_row(db.Row("Devices during runs"))
    d = d.with_panel(ts("Device temperature", "celsius", q(f"m1000_device_temperature_celsius{{{M}}}", leg),
                        q(f"m1000_device_memory_temperature_celsius{{{M}}}", "memory " + leg, ref="B"), desc=note))
    d = d.with_panel(ts("Device power", "watt", q(f"m1000_device_power_watts{{{M}}}", leg),
                        q(f"m1000_device_power_limit_watts{{{M}}}", "limit " + leg, ref="B"), desc=note))
    d = d.with_panel(ts("Device clocks", "hertz", q(f"m1000_device_sm_clock_hertz{{{M}}}", "SM " + leg),
                        q(f"m1000_device_sm_clock_max_hertz{{{M}}}", "SM max " + leg, ref="B"),
                        q(f"m1000_device_memory_clock_hertz{{{M}}}", "memory " + leg, ref="C"),
                        desc="an SM clock below its maximum under load: see the clock-event reasons"))
    d = d.with_panel(ts("Device clock-event (throttle) reasons", "none",
                        q(f"max by (gpu, reason) (m1000_device_clock_event_active{{{M}}})", "gpu {{gpu}} {{reason}}"),
                        desc="1 while a reason holds the clock down (gpu_idle is the normal idle state)"))
    d = d.with_panel(ts("Device utilisation", "percentunit", q(f"m1000_device_utilization_ratio{{{M}}}", leg),
                        q(f"m1000_device_memory_utilization_ratio{{{M}}}", "memory " + leg, ref="B")))
    d = d.with_panel(ts("Device memory", "bytes", q(f"m1000_device_memory_used_bytes{{{M}}}", "used " + leg),
                        q(f"m1000_device_memory_total_bytes{{{M}}}", "total " + leg, ref="B")))
    d = d.with_panel(ts("Uncorrected ECC errors", "none",
                        q(f"m1000_device_ecc_uncorrected_errors_total{{{M}}}", leg)))
    d = d.with_panel(st("Last device sample", "s",
                        q(f"time() - max(m1000_device_sample_timestamp_seconds{{{M}}})", "age", instant=True)))
    return d


def release_history() -> db.Dashboard:
    d = base("m1000-release-history", "M1000 release history", ["release", "history"],
             [var(*VAR_RELEASE), var(*VAR_KEY), var(*VAR_MODULE)])
    leg = "{{release}} {{model_key}}"
    for metric, title, unit in (("decode_tokens_per_second", "Decode throughput, fleet mean", TOK_S),
                                ("prefill_tokens_per_second", "Prefill throughput, fleet mean", TOK_S),
                                ("ttft_seconds", "TTFT, fleet mean", "s"),
                                ("tpot_seconds", "TPOT, fleet mean", "s")):
        d = d.with_panel(ts(title, unit, q(f"avg by (release, model_key) (m1000_result_{metric}{{{RKM}}})", leg)))
    d = d.with_panel(bg("Latest figures per release and model key: decode", TOK_S, q(
        f"avg by (release, model_key) (m1000_result_decode_tokens_per_second{{{RKM}}})", leg, instant=True)))
    d = d.with_panel(ts("Performance vs baseline by release", "percentunit", q(
        f"avg by (release, metric) (m1000_fleet_baseline_ratio{{{RKM}}})", "{{release}} {{metric}}")))
    d = d.with_panel(ts("GSM8K accuracy by release", "percentunit", q(
        f"avg by (release, model_key) (m1000_result_gsm8k_accuracy_ratio{{{RKM}}})", leg)))
    d = d.with_panel(tb("Age of the latest figures", "s", q(
        f"time() - max by (release, model_key) (m1000_result_timestamp_seconds{{{RKM}}})", instant=True)))
    return d


DASHBOARDS = {
    "fleet-overview": fleet_overview,
    "release-validation": release_validation,
    "module-drilldown": module_drilldown,
    "release-history": release_history,
}


def render(builder: db.Dashboard) -> str:
    return json.dumps(builder.build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def build_all() -> dict[str, str]:
    return {f"{name}.json": render(fn()) for name, fn in DASHBOARDS.items()}


def main(argv: list[str]) -> int:
    files = build_all()
    if "--check" in argv:
        stale = [n for n, text in files.items()
                 if not (OUT / n).exists() or (OUT / n).read_text(encoding="utf-8") != text]
        for n in stale:
            print(f"grafana/dashboards/{n}: out of date (run grafana/build_dashboards.py)", file=sys.stderr)
        return 1 if stale else 0
    OUT.mkdir(exist_ok=True)
    for n, text in files.items():
        (OUT / n).write_text(text, encoding="utf-8")
        print(f"wrote grafana/dashboards/{n}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
