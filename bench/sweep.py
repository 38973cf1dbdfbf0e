"""Benchmark: the probe's SLO sweep against a simulated module, and why its steady-state window is what it is.

Part 1 (the window): at concurrency C = 4, 8 and 16 on a simulated qwen3 (128:128), 3C requests closed-loop;
TTFT p50 and TPOT p50 of the first C (ramp-up: they arrive together and queue their prefills at once), the
middle C (the steady-state window the sweep uses) and the last C (the drain, sent while the in-flight count
falls), and output tok/s over the whole phase against the window's span.
Part 2 (the sweep): ``fleet-agent probe --sweep`` as code, with an SLO and a budget: each level, the capacity,
why it stopped, and its wall time against the budget.

Usage: .venv/bin/python bench/sweep.py [--time-scale 50] [--slo ttft_p90_ms=8000,tpot_p90_ms=60] [--budget 60]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT / "bench"))  # after the project: bench/agent.py is not the agent package
sys.path.insert(0, str(ROOT))
import record  # noqa: E402 - bench/record.py

from agent.probe import ProbeConfig  # noqa: E402
from agent.probe.measure import percentile  # noqa: E402
from agent.probe.prompts import parse_profile  # noqa: E402
from agent.probe.records import LoadShape  # noqa: E402
from agent.probe.runner import _Session, discover, run_sweep, sim_priority  # noqa: E402
from agent.probe.sweep import SweepConfig, SweepSLO, requests_for  # noqa: E402
from agent.probe.transport import Transport  # noqa: E402
from simulator.ports import free_port  # noqa: E402


def _p50(values: list[float]) -> float:
    return percentile(sorted(values), 0.5) if values else float("nan")


async def phases(url: str, c: int) -> str:
    cfg = ProbeConfig(base_url=url, profiles=("128:128",))
    t = Transport(url, max_idle=64)
    server = await discover(t, None, None)
    undo = sim_priority()
    try:
        s = _Session(cfg, t, server, None, None, None)
        reqs, duration = await s.measure(parse_profile("128:128"), LoadShape(kind="concurrency", value=c), c,
                                         requests_for(c, c))
    finally:
        undo()
        await t.aclose()
    reqs.sort(key=lambda r: r.index)
    parts = {"ramp-up": reqs[:c], "window": reqs[c:-c], "drain": reqs[-c:]}
    cells = []
    for rs in parts.values():
        cells.append(f"{_p50([r.ttft_ms or 0 for r in rs]):.0f} / {_p50([r.tpot_ms or 0 for r in rs]):.1f}")
    win = parts["window"]
    span = max(r.start_s + (r.e2e_ms or 0) / 1000 for r in win) - min(r.start_s for r in win)
    whole = sum(r.output_tokens or 0 for r in reqs) / duration
    window = sum(r.output_tokens or 0 for r in win) / span
    return f"| {c} | {' | '.join(cells)} | {whole:.1f} | {window:.1f} |"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-scale", default="50")
    ap.add_argument("--slo", default="ttft_p90_ms=8000,tpot_p90_ms=60")
    ap.add_argument("--budget", type=float, default=60.0)
    args = ap.parse_args()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("M1000_SIM_")}
    proc = subprocess.Popen([sys.executable, "-m", "simulator", "serve", "qwen3", "--port", str(port),
                             "--time-scale", args.time_scale], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        print(f"simulated qwen3 at time scale {args.time_scale}, 128:128, 3C requests closed-loop; "
              "TTFT p50 / TPOT p50 in module ms")
        print("| C | first C (ramp-up) | middle C (window) | last C (drain) | out tok/s, whole phase | "
              "out tok/s, window |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: |")
        for c in (4, 8, 16):
            print(asyncio.run(phases(url, c)), flush=True)
        slo = SweepSLO.parse(args.slo)
        t = time.monotonic()
        res = run_sweep(ProbeConfig(base_url=url, profiles=("128:128",)), SweepConfig(slo=slo, budget_s=args.budget))
        wall = time.monotonic() - t
        print(f"\nSLO sweep, SLO {slo}, budget {args.budget:g} s:")
        print("| concurrency | window | TTFT p90 | TPOT p90 | out tok/s | SLO | wall s |")
        print("| ---: | ---: | ---: | ---: | ---: | --- | ---: |")
        for lv in res.levels:
            print(f"| {lv.concurrency} | {lv.ok}/{lv.window} | {lv.figures.get('ttft_p90_ms', 0):.0f} | "
                  f"{lv.figures.get('tpot_p90_ms', 0):.1f} | {lv.output_tps or 0:.1f} | "
                  f"{'met' if lv.met else 'broken'} | {lv.wall_s:.1f} |")
        cap = res.capacity
        print(f"capacity at SLO: {'none' if cap is None else f'concurrency {cap.concurrency}'}; stopped: {res.stop}; "
              f"wall {wall:.1f} s of a {args.budget:g} s budget")
        ok = cap is not None and res.stop in ("slo", "saturated") and wall <= args.budget
        print(f"goal (a named capacity, stopped by itself within its budget): {'met' if ok else 'NOT met'}")
        return 0 if ok else 1
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
