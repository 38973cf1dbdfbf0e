"""Benchmark: the probe against the simulated module, next to the reference document (issue 29's acceptance).

For each time scale (default 1 and 10): one simulated qwen3 server (``python -m simulator serve``), then the
probe's TTFT and TPOT (p50 of ``--requests`` sequential cold requests) for 128:128, 500:500 and 2000:2000,
twice in a row (the second run must not find the first's prompts cached), and a one-token prefix hit (each
prompt shares its first token with one sent before: TTFT and TPOT within 1 %); each against the reference
figure. Goal: every figure within 1 %. Exits 1 otherwise.

Usage: .venv/bin/python bench/probe_fidelity.py [--scales 1,10] [--requests 3]
"""

from __future__ import annotations

import argparse
import json
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
from agent.probe import ProbeConfig, run_probe  # noqa: E402
from agent.tables import parse_seed  # noqa: E402
from bench import record  # noqa: E402 - bench/record.py
from simulator.ports import free_port  # noqa: E402

PROFILES = ("128:128", "500:500", "2000:2000")
GOAL = 0.01


def wait_ready(url: str, timeout: float = 120) -> None:
    """Until the simulated server at ``url`` answers /health 200 (else exit, naming it)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise SystemExit(f"no simulated server at {url}")


def _one_token_hit(url: str, n: int, k: int) -> tuple[float, float, int]:
    """TTFT and TPOT (server ms) of a prompt of n ids whose first id was sent before, alone."""
    import asyncio

    from agent.probe.measure import interpret
    from agent.probe.runner import discover, sim_priority
    from agent.probe.transport import Transport

    async def go() -> tuple[float, float, int]:
        t = Transport(url)
        server = await discover(t, None, None)
        undo = sim_priority()  # as the probe measures a simulated server
        first = 1000 + 7 * k
        for prompt, max_tokens in (([first, 29999 - k], 1), ([first] + [2000 + (i * 31 + k) % 20000
                                                                          for i in range(n - 1)], 100)):
            body = json.dumps({"model": server.model, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
                               "ignore_eos": True, "stream_options": {"include_usage": True}}).encode()
            ex = await t.request("POST", "/v1/completions", body, headers={"Content-Type": "application/json"},
                                 timeout=600)
        undo()
        await t.aclose()
        r = interpret(ex, scale=server.scale)
        return r.ttft_ms or 0.0, r.tpot_ms or 0.0, r.cached_tokens or 0

    return asyncio.run(go())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scales", default="1,10")
    ap.add_argument("--requests", type=int, default=3)
    args = ap.parse_args()
    seed = parse_seed((ROOT / "simulator/data/reference_tables.txt").read_text(encoding="utf-8"))
    ref = {r.profile: r for r in seed["qwen3"] if r.table == "sweep"}
    worst = 0.0
    print("| time scale | profile | run | TTFT ms (reference) | change | TPOT ms (reference) | change | cached |")
    print("| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for scale in args.scales.split(","):
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("M1000_SIM_")}
        proc = subprocess.Popen([sys.executable, "-m", "simulator", "serve", "qwen3", "--port", str(port),
                                 "--time-scale", scale], env=env, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(url)
            cfg = ProbeConfig(base_url=url, profiles=PROFILES, requests=args.requests, warmup=0)
            for run in ("first", "second"):
                for r in run_probe(cfg).results:
                    want = ref[r.profile]
                    assert r.ttft_ms is not None and r.tpot_ms is not None, f"{r.profile}: {r.error_details}"
                    assert want.ttft_ms is not None and want.tpot_ms is not None, f"{r.profile}: not in the reference"
                    dt, dp = r.ttft_ms.p50 / want.ttft_ms - 1, r.tpot_ms.p50 / want.tpot_ms - 1
                    worst = max(worst, abs(dt), abs(dp))
                    print(f"| {scale} | {r.profile} | {run} | {r.ttft_ms.p50:.1f} ({want.ttft_ms}) | {dt:+.2%} | "
                          f"{r.tpot_ms.p50:.2f} ({want.tpot_ms}) | {dp:+.2%} | {r.cached_tokens:g} |", flush=True)
            for k, profile in enumerate(PROFILES):
                want = ref[profile]
                assert want.ttft_ms is not None and want.tpot_ms is not None, f"{profile}: not in the reference"
                ttft, tpot, cached = _one_token_hit(url, int(want.input_tokens or 0), k)
                dt, dp = ttft / want.ttft_ms - 1, tpot / want.tpot_ms - 1
                worst = max(worst, abs(dt), abs(dp))
                print(f"| {scale} | {profile} | 1-token hit | {ttft:.1f} ({want.ttft_ms}) | {dt:+.2%} | "
                      f"{tpot:.2f} ({want.tpot_ms}) | {dp:+.2%} | {cached} |", flush=True)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(20)
    ok = worst <= GOAL
    print(f"worst |change| {worst:.2%}; goal every figure within {GOAL:.0%}: {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
