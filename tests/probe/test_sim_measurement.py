"""The probe against a simulated server that caches prefixes and batches (issue 29; real processes, slow).

One ``python -m simulator serve`` process per module at time scale 50 (the demo's; 10 for the cold-TTFT
comparison): two consecutive probe runs measure the same cold TTFT; every chunk is one token (the server's 5 ms
merge made ~6 tokens a chunk at this scale) and a setup without speculative decoding reports no accept length.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import pytest

from agent.probe import ProbeConfig, run_probe
from simulator.ports import free_port
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow
SCALE = 50.0


def _serve(scale: float) -> Iterator[str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("M1000_SIM_")}
    proc = subprocess.Popen([sys.executable, "-m", "simulator", "serve", "qwen3", "--port", str(port),
                             "--time-scale", str(scale)], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    try:
        wait_for(ready, timeout=60, what="simulated qwen3 server")
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    yield from _serve(SCALE)


@pytest.fixture(scope="module")
def server10() -> Iterator[str]:
    """Time scale 10: a TTFT is ~200 ms of wall time. At 50 (~40 ms) a loaded machine's 1 ms of jitter was
    2.5 % of it, and the 3 % comparison failed in two clean runs of make test."""
    yield from _serve(10.0)


def test_two_consecutive_probe_runs_measure_the_same_cold_ttft(server10: str) -> None:
    cfg = ProbeConfig(base_url=server10, profiles=("128:128",), requests=3, warmup=0)
    first, second = run_probe(cfg), run_probe(cfg)
    a, b = first.results[0], second.results[0]
    assert (a.ok, b.ok) == (3, 3)
    assert a.cached_tokens == 0 and b.cached_tokens == 0
    assert a.ttft_ms is not None and b.ttft_ms is not None and b.tpot_ms is not None  # 3 of 3 ok: measured
    # within 3 % of the reference at time scale 10 (1 ms of wall time is 10 ms here)
    assert b.ttft_ms.p50 == pytest.approx(1981.228, rel=0.03) and a.ttft_ms.p50 == pytest.approx(1981.228, rel=0.03)
    assert b.ttft_ms.p50 == pytest.approx(a.ttft_ms.p50, rel=0.03)  # a cache would make the second one faster
    assert b.tpot_ms.p50 == pytest.approx(40.765, rel=0.03)


def test_one_token_per_chunk_and_no_accept_length_without_speculative_decoding(server: str) -> None:
    (r,) = run_probe(ProbeConfig(base_url=server, profiles=("128:128",), requests=2, warmup=0)).results
    assert r.tokens_per_chunk == 1.0
    assert r.accept_length is None
    assert r.itl_ms is not None and r.tpot_ms is not None
    assert r.itl_ms.p50 == pytest.approx(r.tpot_ms.p50, rel=0.05)  # a chunk's gap is one token's time


def test_a_stream_of_exactly_max_tokens_ends_with_length(server: str) -> None:
    body = json.dumps({"model": "m", "prompt": [1000 + i for i in range(16)], "max_tokens": 4, "stream": True,
                       "ignore_eos": True}).encode()
    req = urllib.request.Request(f"{server}/v1/completions", data=body, headers={"Content-Type": "application/json"})
    t = time.monotonic()
    with urllib.request.urlopen(req, timeout=30) as resp:
        events = [json.loads(x[6:]) for x in resp.read().decode().split("\n\n") if x.startswith("data: {")]
    assert time.monotonic() - t < 30
    reasons = [c["finish_reason"] for e in events for c in e["choices"]]
    assert reasons == [None, None, None, "length"]  # four chunks, one token each


def test_slo_sweep_names_a_capacity_and_stops_by_itself_within_its_budget(server: str) -> None:
    from agent.probe.runner import run_sweep
    from agent.probe.sweep import SweepConfig, SweepSLO

    slo = SweepSLO.parse("ttft_p90_ms=8000,tpot_p90_ms=60")
    t = time.monotonic()
    res = run_sweep(ProbeConfig(base_url=server, profiles=("128:128",)), SweepConfig(slo=slo, budget_s=30))
    assert time.monotonic() - t < 30
    assert res.stop in ("slo", "saturated")
    assert res.capacity is not None and res.capacity.met and res.capacity.concurrency >= 1
    assert res.capacity.figures["ttft_p90_ms"] <= 8000 and res.capacity.figures["tpot_p90_ms"] <= 60
    assert any(not lv.met for lv in res.levels) or res.stop == "saturated"
    # batch 1 is the reference document's: the first level's steady window is the seed's qwen3 128:128
    # within 3 % as the tests above (1 ms of a loaded machine's jitter is 2.5 % at this scale)
    assert res.levels[0].figures["ttft_p50_ms"] == pytest.approx(1981.228, rel=0.03)
