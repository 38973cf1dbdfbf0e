"""Cost of the device telemetry sampler, measured side by side in one run.

1. CPU per hour of sampling at the default 1 s period: the sampler's own thread (spawning
   the tool, parsing, writing a line), next to a bare thread that only wakes every period,
   in the same process and the same seconds; and the tool's processes themselves (their
   CPU, reaped children). Goal: the sampler <= 0.2 % of one core.
2. Wall time of a whole validation (simulated release, all 7 model keys) with the sampler
   on and off, interleaved. Goal: no measurable difference.
3. ``--windows 1.4,7,14.6``: a benchmark window sampled on the fast schedule (agent.telemetry.rate) against the
   base period, side by side, each window length in turn: the samples inside the window, the schedule's floor (from
   the measured CPU a sample: the tool's process and the parsing), the sampler thread's CPU and the tool's
   (share of one core over the window). Goal: every window gets the samples an energy figure needs
   (``min_samples``, 20), at a stated cost.

    .venv/bin/python bench/telemetry.py [--seconds 30] [--tool PATH] [--runs 2] [--no-validation]
                                        [--windows 1.4,7,14.6] [--no-cpu]

``--tool`` defaults to the simulated module's ``mthreads-gmi`` (``simulator/device/``); on a
machine with a GPU pass ``--tool nvidia-smi``.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from agent.telemetry import SAMPLES_FILE, Sampler, TelemetryConfig  # noqa: E402
from bench import record  # noqa: E402 - bench/record.py, this script's folder

SIM_TOOL = ROOT / "simulator" / "device" / "mthreads-gmi"


def thread_cpu(t: threading.Thread) -> float:
    assert t.ident is not None
    return time.clock_gettime(time.pthread_getcpuclockid(t.ident))


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def cpu_per_hour(seconds: float, tool: str, period: float) -> dict[str, float]:
    stop = threading.Event()

    def idle() -> None:
        while not stop.wait(period):
            pass

    bare = threading.Thread(target=idle, daemon=True)
    with tempfile.TemporaryDirectory() as tmp:
        s = Sampler(TelemetryConfig(period_s=period, tool=tool), Path(tmp) / SAMPLES_FILE, run_id="bench",
                    module="m-bench")
        s.tell("benchmark", "qwen3")
        c0 = children_cpu()
        t0 = time.monotonic()
        bare.start()
        s.start()
        assert s.thread is not None, s.notes
        b0, s0 = thread_cpu(bare), thread_cpu(s.thread)
        time.sleep(seconds)
        b1, s1 = thread_cpu(bare), thread_cpu(s.thread)
        elapsed = time.monotonic() - t0
        stop.set()
        s.stop()
        c1 = children_cpu()
        lines = (Path(tmp) / SAMPLES_FILE).read_text().count("\n")
    per_hour = 3600.0 / elapsed
    return {"elapsed": elapsed, "samples": s.samples, "calls": s.calls, "lines": lines,
            "bare": (b1 - b0) * per_hour, "sampler": (s1 - s0) * per_hour, "tool": (c1 - c0) * per_hour,
            "notes": len(s.notes)}


def window_cost(window: float, tool: str, fast: bool) -> dict[str, float]:
    """One benchmark window of ``window`` s, after 2 s at the base period (the tool's cost measured meanwhile)."""
    with tempfile.TemporaryDirectory() as tmp:
        s = Sampler(TelemetryConfig(tool=tool, fast=fast), Path(tmp) / SAMPLES_FILE, run_id="bench", module="m-bench")
        s.tell("server", "qwen3")
        s.start()
        assert s.thread is not None, s.notes
        time.sleep(2.0)
        c0, s0 = children_cpu(), thread_cpu(s.thread)
        s.tell("benchmark", "qwen3")  # as the pipeline does, just before the window opens
        start = time.time()
        time.sleep(window)
        end = time.time()
        c1, s1 = children_cpu(), thread_cpu(s.thread)
        s.tell("probe", "qwen3")
        got = s.samples_until(end)
        s.stop()
    inside = sum(1 for x in got if start <= x.ts <= end)
    sched = s.schedule_at(start)
    return {"inside": inside, "floor": sched.floor_s if sched else s.cfg.period_s,
            "expected": sched.expected(window) if sched else window / s.cfg.period_s,
            "sample_ms": statistics.median(s.sample_cpu_s) * 1e3 if s.sample_cpu_s else 0.0,
            "sampler": (s1 - s0) / window, "tool": (c1 - c0) / window}


def validation_wall(runs: int, tool: str) -> dict[str, list[float]]:
    import simulator
    from agent.pipeline import AgentConfig, run_pipeline
    from contract.records import MODEL_KEYS, RunRequest
    from simulator.ports import free_port

    out: dict[str, list[float]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        rel = simulator.build_release(base / "dist", time_scale=50.0)
        simulator.make_models(base / "models")
        for i in range(runs):
            for mode in ("off", "on"):
                cfg = AgentConfig(module="m-bench", workdir=base / "work", server_port=free_port(),
                                  telemetry=TelemetryConfig(enabled=mode == "on", tool=tool))
                req = RunRequest(run_id=f"{mode}-{i}", module="m-bench", tarball=str(rel.path), sha256=rel.sha256,
                                 release=rel.version, models=tuple(MODEL_KEYS), model_root=str(base / "models"))
                t0 = time.monotonic()
                result = run_pipeline(req, cfg)
                out[mode].append(time.monotonic() - t0)
                assert result.ok, result.progress.error
                if mode == "on":
                    assert (base / "work" / "runs" / req.run_id / SAMPLES_FILE).exists()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--period", type=float, default=1.0)
    ap.add_argument("--tool", default=str(SIM_TOOL))
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--no-validation", action="store_true")
    ap.add_argument("--no-cpu", action="store_true", help="skip part 1")
    ap.add_argument("--windows", default="", help="part 3: benchmark window lengths, s, comma separated")
    a = ap.parse_args()
    tool = a.tool if "/" in a.tool else (shutil.which(a.tool) or a.tool)
    if a.windows:
        print(f"== benchmark windows sampled on the fast schedule against the base 1 s period, tool {tool}; "
              "CPU as a share of one core over the window")
        print("| window s | sampling | samples inside | schedule's expected | floor s | CPU a sample ms "
              "(tool + parsing) | sampler thread CPU | tool CPU | energy figure (>= 20) |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for w in (float(x) for x in a.windows.split(",")):
            for fast in (False, True):
                r = window_cost(w, tool, fast)
                print(f"| {w:g} | {'fast' if fast else 'base'} | {r['inside']:.0f} | {r['expected']:.1f} | "
                      f"{r['floor']:.3g} | {r['sample_ms']:.1f} | {r['sampler'] * 100:.2f} % | "
                      f"{r['tool'] * 100:.2f} % | "
                      f"{'yes' if r['inside'] >= 20 else 'no'} |")
    if a.no_cpu:
        return 0
    print(f"== sampler CPU, {a.seconds:g} s at a {a.period:g} s period, tool {tool}")
    r = cpu_per_hour(a.seconds, tool, a.period)
    print(f"   {r['samples']:.0f} samples ({r['calls']:.0f} tool calls, {r['lines']:.0f} lines) in "
          f"{r['elapsed']:.1f} s; {r['notes']:.0f} notes")
    for what in ("bare", "sampler", "tool"):
        label = {"bare": "bare thread waking every period", "sampler": "sampler thread (the agent's cost)",
                 "tool": "tool processes"}[what]
        print(f"   {label:36s} {r[what]:7.2f} CPU s per hour = {r[what] / 36:6.3f} % of one core")
    per_call = r["sampler"] / 3600 * r["elapsed"] / max(1.0, r["calls"]) * 1000
    print(f"   sampler per tool call: {per_call:.2f} ms CPU; goal <= 0.2 % of one core: "
          f"{'met' if r['sampler'] / 36 <= 0.2 else 'NOT met'}")
    if not a.no_validation:
        print(f"== wall time of a 7-key validation (simulated release, time scale 50), {a.runs} runs each")
        walls = validation_wall(a.runs, tool)
        for mode in ("off", "on"):
            print(f"   telemetry {mode:3s}: " + ", ".join(f"{x:.1f}" for x in walls[mode]) +
                  f" s (median {statistics.median(walls[mode]):.1f} s)")
        d = statistics.median(walls["on"]) - statistics.median(walls["off"])
        spread = max(max(walls["off"]) - min(walls["off"]), max(walls["on"]) - min(walls["on"]))
        print(f"   difference of medians {d:+.1f} s; run-to-run spread {spread:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
