"""The sampler thread: tags, refused fields, the -q fallback, missing / hanging / failing tools (fast tier).

Most tests give it a runner that answers from the recorded outputs; the last ones run real
(tiny) tool scripts through :func:`run_tool`, a hanging one included.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest

from agent.telemetry import SAMPLES_FILE, Sampler, TelemetryConfig, ToolResult, read_samples, run_tool
from agent.telemetry.sampler import Runner
from contract.records import DeviceSample

FIX = Path(__file__).resolve().parents[1] / "fixtures"
H200_ROW = (FIX / "h200" / "query.csv").read_text().splitlines()[2]
MT_ROW = (FIX / "mthreads" / "query-unsupported.csv").read_text()
MT_Q = (FIX / "mthreads" / "q.txt").read_text()
INVALID = (FIX / "mthreads" / "invalid-field.txt").read_text()
FAST = TelemetryConfig(period_s=0.02, timeout_s=1.0)


NO_JSON = "mthreads-gmi: unrecognized option '--json'"


class FakeTool:
    """Answers like a device tool: given text for --json (default: refused), the H200's row for a query,
    given text for -q; refuses names."""

    def __init__(self, row: str = H200_ROW, q: str = "", refuse: Sequence[str] = (), json: str | None = None) -> None:
        self.row, self.q, self.refuse, self.json = row, q, set(refuse), json
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], timeout: float, stop: threading.Event) -> ToolResult:
        self.calls.append(list(argv))
        if "--json" in argv:
            return ToolResult("failed", 2, "", NO_JSON) if self.json is None else ToolResult("ok", 0, self.json)
        if argv[1] == "-q":
            return ToolResult("ok", 0, self.q)
        names = argv[1].split("=", 1)[1].split(",")
        for n in names:
            if n in self.refuse:
                return ToolResult("failed", 2, INVALID.replace("clocks_event_reasons.active", n))
        if len(names) != len(self.row.split(",")):  # the recorded row has one more column: trim it
            return ToolResult("ok", 0, ",".join(self.row.split(",")[: len(names)]) + "\n")
        return ToolResult("ok", 0, self.row + "\n")


def sampler(tmp_path: Path, runner: Runner, cfg: TelemetryConfig = FAST, **kw: Any) -> tuple[Sampler, list]:
    events: list[tuple[str, str]] = []
    s = Sampler(cfg, tmp_path / SAMPLES_FILE, run_id="r1", module="m1", attempt=2,
                on_event=lambda st, msg: events.append((st, msg)), runner=runner,
                which=kw.pop("which", lambda name: f"/usr/bin/{name}"), **kw)
    return s, events


def wait_until(pred, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def test_samples_carry_run_step_and_key(tmp_path: Path) -> None:
    tool = FakeTool()
    s, events = sampler(tmp_path, tool)
    s.tell("precompile", None)
    s.start()
    wait_until(lambda: s.samples >= 3)
    s.tell("benchmark", "qwen3")
    n = s.samples
    wait_until(lambda: s.samples >= n + 3)
    s.stop()
    got = list(read_samples(tmp_path / SAMPLES_FILE))
    assert len(got) == s.samples and events == [(
        "info", f"mthreads-gmi does not answer '--query --json' (exit code 2: {NO_JSON}); "
                "reading its --query-gpu CSV and -q")]
    assert tool.calls[0] == ["/usr/bin/mthreads-gmi", "--query", "--json"]  # mthreads-gmi first, JSON first
    assert sum(1 for c in tool.calls if "--json" in c) == 1  # refused once: not asked again
    assert {(x.run_id, x.module, x.attempt, x.gpu) for x in got} == {("r1", "m1", 2, 0)}
    assert got[0].step == "precompile" and got[0].model_key is None
    assert got[-1].step == "benchmark" and got[-1].model_key == "qwen3"
    assert got[-1].sm_clock_mhz == 795 and got[-1].clock_event_reasons == 1 and got[-1].memory_total_mib == 143771
    summary = s.summary()
    assert [k.model_key for k in summary.keys] == ["", "qwen3"] and summary.tool == "mthreads-gmi"
    assert summary.devices[0].name == "NVIDIA H200" and summary.samples == len(got)
    assert summary.keys[1].fields["power_w"].max == 84.27 and summary.keys[1].reasons["gpu_idle"] == 1.0


def test_refused_names_are_respelled_then_dropped_and_q_fills_in(tmp_path: Path) -> None:
    tool = FakeTool(row=MT_ROW.replace(", [Not Supported], N/A", ", N/A").strip(), q=MT_Q,
                    refuse=("clocks_event_reasons.active", "clocks_throttle_reasons.active"))
    s, events = sampler(tmp_path, tool, TelemetryConfig(period_s=0.02, q_every=3))
    s.start()
    wait_until(lambda: s.samples >= 8)
    s.stop()
    last = list(read_samples(tmp_path / SAMPLES_FILE))[-1]
    assert last.clock_event_reasons == 0x8 and last.max_sm_clock_mhz == 1800  # from -q
    assert last.memory_temperature_c is None  # neither the query nor -q has it
    assert last.temperature_c == 47  # from the query
    messages = [m for _, m in events]
    assert any("does not offer clock_event_reasons" in m for m in messages)
    assert any("read from 'mthreads-gmi -q' every 3 samples" in m for m in messages)
    assert len(messages) == len(set(messages)) == 3  # each once (the third: --json refused)
    q_calls = sum(1 for c in tool.calls if c[1] == "-q")
    assert 2 <= q_calls <= s.samples // 3 + 1


def test_no_tool_is_noted_once_and_nothing_runs(tmp_path: Path) -> None:
    tool = FakeTool()
    s, events = sampler(tmp_path, tool, which=lambda name: None)
    s.start()
    s.stop()
    assert events == [("unavailable", "no device tool: mthreads-gmi or nvidia-smi not found; "
                                      "no device telemetry for this run")]
    assert tool.calls == [] and not (tmp_path / SAMPLES_FILE).exists()
    assert s.summary().notes == (events[0][1],) and s.summary().keys == ()


def test_disabled_does_nothing(tmp_path: Path) -> None:
    tool = FakeTool()
    s, events = sampler(tmp_path, tool, TelemetryConfig(enabled=False))
    s.start()
    s.stop()
    assert tool.calls == [] and events == []


def test_timeouts_and_failures_are_noted_once_and_backed_off(tmp_path: Path) -> None:
    answers = iter([ToolResult("timeout"), ToolResult("timeout"), ToolResult("failed", 9, "", "GPU is lost"),
                    ToolResult("failed", 9, "", "GPU is lost")])

    tool = FakeTool()

    def runner(argv: Sequence[str], timeout: float, stop: threading.Event) -> ToolResult:
        return next(answers, None) or tool(argv, timeout, stop)

    s, events = sampler(tmp_path, runner, TelemetryConfig(period_s=0.01))
    s.start()
    wait_until(lambda: s.samples >= 2)
    s.stop()
    # the failures keep --json (a broken tool fails the CSV too); CSV is taken once it answers where JSON did not
    assert [st for st, _ in events] == ["timeout", "failed", "info"]
    assert "did not answer within 5 s (killed)" in events[0][1] and "exited with code 9: GPU is lost" in events[1][1]


def test_back_off_keeps_a_failing_tool_rare(tmp_path: Path) -> None:
    calls = []

    def runner(argv: Sequence[str], timeout: float, stop: threading.Event) -> ToolResult:
        calls.append(time.monotonic())
        return ToolResult("timeout")

    s, _ = sampler(tmp_path, runner, TelemetryConfig(period_s=0.02))
    s.start()
    time.sleep(0.6)  # at 0.02 s a period: 30 calls without back-off; with it 0.04, 0.08, 0.16, 0.32 ...
    s.stop()
    assert 2 <= len(calls) <= 6


def test_a_broken_listener_and_a_crashing_parser_never_escape(tmp_path: Path) -> None:
    def boom(status: str, message: str) -> None:
        raise RuntimeError("listener")

    s = Sampler(FAST, tmp_path / SAMPLES_FILE, run_id="r", module="m", on_event=boom,
                runner=lambda argv, timeout, stop: ToolResult("ok", 0, "garbage"), which=lambda n: "/x/" + n)
    s.start()
    wait_until(lambda: len(s.notes) == 1)
    s.stop()
    assert "without a device row" in s.notes[0]


# -- real processes ---------------------------------------------------------------------------
def script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def test_run_tool_real_process(tmp_path: Path) -> None:
    tool = script(tmp_path / "nvidia-smi", f"echo '{H200_ROW}'\n")
    res = run_tool([str(tool), "--query-gpu=index"], 5.0, threading.Event())
    assert res.outcome == "ok" and res.stdout.strip() == H200_ROW and res.exit_code == 0
    gone = run_tool([str(tmp_path / "absent")], 5.0, threading.Event())
    assert gone.outcome == "missing" and "absent" in gone.stderr
    bad = run_tool([str(script(tmp_path / "bad", "echo oops >&2; exit 3\n"))], 5.0, threading.Event())
    assert (bad.outcome, bad.exit_code, bad.first_line()) == ("failed", 3, "oops")


def test_a_hanging_tool_is_killed_with_its_children(tmp_path: Path) -> None:
    marker = f"m1000-hang-{os.getpid()}"
    tool = script(tmp_path / "mthreads-gmi", f"sleep 60 & sleep 61 # {marker}\nwait\n")
    t0 = time.monotonic()
    res = run_tool([str(tool)], 0.5, threading.Event())
    assert res.outcome == "timeout" and time.monotonic() - t0 < 3
    time.sleep(0.2)
    left = [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]
    assert not left
    assert not [p for p in psutil.process_iter(["cmdline"]) if (p.info["cmdline"] or [])[:2] == ["sleep", "60"]
                and p.ppid() == 1 and p.create_time() > time.time() - 5]


def test_stop_does_not_wait_for_a_hanging_tool(tmp_path: Path) -> None:
    tool = script(tmp_path / "mthreads-gmi", "exec sleep 60\n")
    s = Sampler(TelemetryConfig(period_s=0.05, timeout_s=30.0, tool=str(tool)), tmp_path / SAMPLES_FILE,
                run_id="r", module="m")
    s.start()
    time.sleep(0.3)  # the tool is in flight
    t0 = time.monotonic()
    s.stop()
    assert time.monotonic() - t0 < 2.0
    assert not [p for p in psutil.Process().children(recursive=True) if "sleep" in " ".join(p.cmdline())]


@pytest.mark.parametrize("fault", ["missing", "hang"])
def test_samples_are_valid_records(tmp_path: Path, fault: str) -> None:
    """Whatever the tool does, the samples file holds only whole, valid records."""
    tool = tmp_path / "gmi"
    if fault == "hang":
        script(tool, "exec sleep 60\n")
    s = Sampler(TelemetryConfig(period_s=0.05, timeout_s=0.2, tool=str(tool)), tmp_path / SAMPLES_FILE,
                run_id="r", module="m")
    s.start()
    time.sleep(0.5)
    s.stop()
    assert len(s.notes) == 1
    for line in (tmp_path / SAMPLES_FILE).read_text().splitlines() if (tmp_path / SAMPLES_FILE).exists() else []:
        DeviceSample.model_validate_json(line)


def test_samples_carry_the_energy_counter_and_a_broken_counter_is_noted_once(tmp_path: Path) -> None:
    readings = iter([1000.0, 1500.0, 2250.0])

    def counter() -> dict[int, float]:
        return {0: next(readings)}  # then StopIteration: a counter that cannot be read any more

    s, events = sampler(tmp_path, FakeTool(), counter=counter)
    s.start()
    wait_until(lambda: s.samples >= 5)
    s.stop()
    got = list(read_samples(tmp_path / SAMPLES_FILE))
    assert [x.energy_mj for x in got[:4]] == [1000.0, 1500.0, 2250.0, None]
    assert all(x.energy_mj is None for x in got[3:])
    noted = [e for e in events if e[1].startswith("energy counter")]
    assert noted == [("info", "energy counter not readable (StopIteration: ); energy from the power samples")]


def test_samples_until_waits_for_a_sample_past_the_window(tmp_path: Path) -> None:
    s, _ = sampler(tmp_path, FakeTool())
    s.start()
    wait_until(lambda: s.samples >= 1)
    end = time.time()
    got = s.samples_until(end)
    s.stop()
    assert got and max(x.ts for x in got) >= end and all(x.attempt == 2 for x in got)
    idle, _ = sampler(tmp_path / "off", FakeTool())  # never started: no wait, no samples
    t0 = time.monotonic()
    assert idle.samples_until(time.time() + 60) == [] and time.monotonic() - t0 < 0.5


def test_a_fast_step_samples_at_once_and_faster_and_the_base_period_comes_back_after(tmp_path: Path) -> None:
    cfg = TelemetryConfig(period_s=0.5, timeout_s=1.0, min_samples=10, min_period_s=0.02)
    s, _ = sampler(tmp_path, FakeTool(), cfg)
    s.start()
    wait_until(lambda: s.samples >= 1)
    n0 = s.samples
    t0 = time.time()
    s.tell("benchmark", "qwen3")
    time.sleep(0.3)
    fast = s.samples - n0
    s.tell("probe", "qwen3")
    wait_until(lambda: s.period() == 0.5)  # the thread may be asleep for one fast period still
    n1 = s.samples
    time.sleep(0.45)
    slow = s.samples - n1
    s.stop()
    sched = s.schedule_at(t0 + 0.1)
    assert sched is not None and sched.target == 15 and sched.base_s == 0.5 and 0.02 <= sched.floor_s < 0.05
    assert s.schedule_at(t0 - 1) is None
    assert fast >= 6, fast  # 15 at 0.02 s; a loaded machine stalls some
    assert slow <= 2, slow
    first_fast = min(x.ts for x in read_samples(tmp_path / SAMPLES_FILE) if x.step == "benchmark")
    assert first_fast - t0 < 0.2  # woken, not left asleep for the rest of a 0.5 s period


def test_the_tools_cost_bounds_the_fast_rate(tmp_path: Path) -> None:
    # a real tool process that burns CPU (a shell loop, tens of ms) and then answers like the H200
    busy = tmp_path / "busy-smi"
    from agent.telemetry.fields import FIELDS

    row = ",".join(H200_ROW.split(",")[: len(FIELDS)])
    busy.write_text("#!/bin/sh\ncase $1 in --query-gpu=*) ;; *) exit 2 ;; esac\n"
                    f"i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done\necho '{row}'\n")
    busy.chmod(0o755)
    cfg = TelemetryConfig(period_s=1.0, timeout_s=5.0, tool_share=0.1, min_period_s=0.02)
    s, _ = sampler(tmp_path, run_tool, cfg, which=lambda name: str(busy) if name == "nvidia-smi" else None)
    s.start()
    wait_until(lambda: len(s.sample_cpu_s) >= 2, timeout=10.0)
    s.tell("idle", "qwen3")
    s.stop()
    cost = sorted(s.sample_cpu_s)[len(s.sample_cpu_s) // 2]
    assert cost > 0.005, cost  # the loop's CPU is counted (a reaped child's)
    assert s.schedules[-1].floor_s == pytest.approx(min(1.0, max(0.02, cost / 0.1)), rel=0.5)
    assert s.schedules[-1].floor_s > 0.05


def test_fast_sampling_off_keeps_the_base_period(tmp_path: Path) -> None:
    s, _ = sampler(tmp_path, FakeTool(), TelemetryConfig(period_s=0.5, fast=False))
    s.tell("benchmark", "qwen3")
    assert s.schedules == [] and s.period() == 0.5


def test_an_edge_reads_the_counters_at_once(tmp_path: Path) -> None:
    readings = iter([1000.0, 2500.0])
    s, _ = sampler(tmp_path, FakeTool(), counter=lambda: {0: next(readings)})
    t0 = time.time()
    a, b = s.edge(), s.edge()
    assert a.counters == {0: 1000.0} and b.counters == {0: 2500.0} and t0 <= a.ts <= b.ts <= time.time()
    none, _ = sampler(tmp_path / "n", FakeTool())
    assert none.edge().counters is None


def test_idle_is_measured_fast_until_it_settles(tmp_path: Path) -> None:
    cfg = TelemetryConfig(period_s=1.0, timeout_s=1.0, min_period_s=0.02, idle_window_s=0.2)
    s, _ = sampler(tmp_path, FakeTool(), cfg)
    assert s.measure_idle() is None  # not sampling: nothing to wait for
    s.start()
    wait_until(lambda: s.samples >= 1)
    s.tell("idle", "qwen3")
    t0 = time.monotonic()
    got = s.measure_idle()
    took = time.monotonic() - t0
    s.stop()
    assert got is not None and got.settled and got.power_w == 84.27 and got.spread_w == 0.0 and got.samples >= 5
    assert took < 3.0 and got.settle_s <= took + 0.001


def test_idle_that_does_not_settle_is_given_up_after_idle_max_s(tmp_path: Path) -> None:
    rows = iter([H200_ROW.replace("84.27", f"{80 + 30 * (i % 2)}.00") for i in range(10_000)])

    class Wobbly(FakeTool):
        def __call__(self, argv: Sequence[str], timeout: float, stop: threading.Event) -> ToolResult:
            self.row = next(rows)
            return super().__call__(argv, timeout, stop)

    cfg = TelemetryConfig(period_s=1.0, timeout_s=1.0, min_period_s=0.02, idle_window_s=0.1, idle_max_s=0.4)
    s, _ = sampler(tmp_path, Wobbly(), cfg)
    s.start()
    wait_until(lambda: s.samples >= 1)
    s.tell("idle", "qwen3")
    got = s.measure_idle()
    s.stop()
    assert got is not None and not got.settled and got.spread_w == 30.0 and 0.4 <= got.settle_s < 3.0


def test_idle_is_not_waited_for_when_the_tool_does_not_answer(tmp_path: Path) -> None:
    def hangs(argv: Sequence[str], timeout: float, stop: threading.Event) -> ToolResult:
        stop.wait(timeout)
        return ToolResult("timeout")

    s, _ = sampler(tmp_path, hangs, TelemetryConfig(period_s=0.1, timeout_s=0.2, idle_window_s=1.0))
    s.start()
    s.tell("idle", "qwen3")
    t0 = time.monotonic()
    assert s.measure_idle() is None
    s.stop()
    assert time.monotonic() - t0 < 0.5


def test_the_idle_window_holds_five_samples_of_a_slow_schedule(tmp_path: Path) -> None:
    # a floor of 0.1 s (a costly tool, or a longer min_period_s): a 0.1 s idle window would hold one sample,
    # never "settled"; it is stretched to 5 periods instead of waiting out idle_max_s
    cfg = TelemetryConfig(period_s=1.0, timeout_s=1.0, min_period_s=0.1, idle_window_s=0.1, idle_max_s=5.0)
    s, _ = sampler(tmp_path, FakeTool(), cfg)
    s.start()
    wait_until(lambda: s.samples >= 1)
    s.tell("idle", "qwen3")
    got = s.measure_idle()
    s.stop()
    assert got is not None and got.settled and got.samples >= 5 and 0.4 <= got.settle_s < 3.0, got
