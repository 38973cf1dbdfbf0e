"""Benchmark: the probe's SLO sweep against a simulated module, and why its steady-state window is what it is.

Part 1 (the window): at concurrency C = 4, 8 and 16 on a simulated qwen3 (128:128), 3C requests closed-loop;
TTFT p50 and TPOT p50 of the first C (ramp-up: they arrive together and queue their prefills at once), the
middle C (the steady-state window the sweep uses) and the last C (the drain, sent while the in-flight count
falls); output tok/s three ways: over the whole phase, the window's tokens over the window's span (leaves out
what the other requests produced in that span), and C / the window's mean E2E (Little's law, the sweep's).
Part 2 (the sweep): ``fleet-agent probe --sweep`` as code, with an SLO and a budget: each level, the capacity,
why it stopped, and its wall time against the budget.

``--url URL`` sweeps a server already running instead (the real-engine release's, say), ``--output-len`` and
``--levels`` (part 1's concurrencies) fit it to a slower server.

Usage: .venv/bin/python bench/sweep.py [--time-scale 50] [--slo ttft_p90_ms=8000,tpot_p90_ms=60] [--budget 60]
       [--url URL] [--output-len 100] [--levels 4,8,16] [--prompt ids|text]
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
from agent.probe import ProbeConfig  # noqa: E402
from agent.probe.measure import percentile  # noqa: E402
from agent.probe.prompts import parse_profile  # noqa: E402
from agent.probe.records import LoadShape, PromptKind  # noqa: E402
from agent.probe.runner import _Session, discover, run_sweep, sim_priority  # noqa: E402
from agent.probe.sweep import SweepConfig, SweepSLO, level, requests_for  # noqa: E402
from agent.probe.transport import Transport  # noqa: E402
from bench import record  # noqa: E402 - bench/record.py
from simulator.ports import free_port  # noqa: E402


def _p50(values: list[float]) -> float:
    return percentile(sorted(values), 0.5) if values else float("nan")


async def phases(url: str, c: int, output_len: int, prompt: PromptKind) -> str:
    cfg = ProbeConfig(base_url=url, profiles=("128:128",), output_len=output_len, prompt=prompt)
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
    spanned = sum(r.output_tokens or 0 for r in win) / span
    little = level(reqs, c, SweepSLO.parse("ttft_p90_ms=1e9"), 0.0).output_tps or 0.0
    return f"| {c} | {' | '.join(cells)} | {whole:.1f} | {spanned:.1f} | {little:.1f} |"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-scale", default="50")
    ap.add_argument("--slo", default="ttft_p90_ms=8000,tpot_p90_ms=60")
    ap.add_argument("--budget", type=float, default=60.0)
    ap.add_argument("--url", default="", help="a server already running (default: a simulated qwen3)")
    ap.add_argument("--output-len", type=int, default=100)
    ap.add_argument("--levels", default="4,8,16")
    ap.add_argument("--prompt", default="ids", choices=("ids", "text"), help="text for transformers serve")
    args = ap.parse_args()
    proc = None
    url = args.url.rstrip("/")
    if not url:
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
        what = args.url or f"simulated qwen3 at time scale {args.time_scale}"
        print(f"{what}, 128:128, {args.output_len} output tokens, 3C requests closed-loop; "
              "TTFT p50 / TPOT p50 in the server's ms")
        print("| C | first C (ramp-up) | middle C (window) | last C (drain) | out tok/s: whole phase | "
              "window's tokens / its span | C / window's mean E2E (Little) |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for c in (int(x) for x in args.levels.split(",") if x.strip()):
            print(asyncio.run(phases(url, c, args.output_len, args.prompt)), flush=True)
        slo = SweepSLO.parse(args.slo)
        t = time.monotonic()
        res = run_sweep(ProbeConfig(base_url=url, profiles=("128:128",), output_len=args.output_len,
                                    prompt=args.prompt),
                        SweepConfig(slo=slo, budget_s=args.budget))
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
        if proc is not None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(20)


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
