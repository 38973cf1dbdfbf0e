"""A plain streaming client written from sglang ``bench_serving``'s definitions (its ``sglang-oai`` backend).

Independent of the probe (nothing of ``agent/``): one ``aiohttp.ClientSession`` per request, as
``bench_serving``'s request function makes one; ``POST /v1/completions`` with a text prompt, ``stream``,
``ignore_eos``, ``temperature`` 0; the clock is ``time.perf_counter()`` read just before ``session.post``:

- TTFT: until the first chunk whose ``choices[0].text`` is not empty;
- ITL: between consecutive non-empty chunks;
- latency: until the last chunk (``[DONE]`` included);
- TPOT: ``(latency - ttft) / (output_len - 1)``, ``output_len`` the usage's ``completion_tokens``.

No private header, no scheduling priority: what any OpenAI-compatible client does. Wall times are multiplied by
``scale`` (a simulated server's time scale, given by the caller; 1 for a real one).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import aiohttp

TIMEOUT = aiohttp.ClientTimeout(total=6 * 60 * 60)  # bench_serving's AIOHTTP_TIMEOUT


@dataclass(frozen=True)
class Output:
    """One request as ``bench_serving``'s ``RequestFuncOutput`` keeps it (seconds of wall time)."""

    ttft: float
    latency: float
    itl: tuple[float, ...]
    output_len: int
    server_ttft_ms: float | None = None  # a simulated server's own TTFT (its usage chunk's m1000_sim), else None

    @property
    def tpot(self) -> float:
        return (self.latency - self.ttft) / (self.output_len - 1) if self.output_len > 1 else 0.0


def first_model(base_url: str) -> str:
    """The first model ``GET /v1/models`` names (what bench_serving does when no model is given)."""
    import urllib.request

    with urllib.request.urlopen(f"{base_url}/v1/models", timeout=10) as r:
        return str(json.loads(r.read())["data"][0]["id"])


def prompt_text(tag: str, length: int) -> str:
    """``length`` distinct words (one token each for the simulated tokenizer), new to the server's prefix cache
    when ``tag`` is new."""
    return " ".join(f"{tag}w{i}" for i in range(length))


async def request(base_url: str, model: str, prompt: str, output_len: int) -> Output:
    """One streaming completion, timed as ``bench_serving``'s ``async_request_openai_completions``."""
    payload = {"model": model, "prompt": prompt, "temperature": 0.0, "best_of": 1, "max_tokens": output_len,
               "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}}
    itl: list[float] = []
    ttft = 0.0
    n = output_len
    server = None
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        st = time.perf_counter()
        latest = st
        async with session.post(f"{base_url}/v1/completions", json=payload) as response:
            if response.status != 200:
                raise RuntimeError(f"{base_url}: HTTP {response.status}: {(await response.text())[:200]}")
            async for raw in response.content:
                line = raw.strip()
                if not line:
                    continue
                chunk = line.decode("utf-8").removeprefix("data: ")
                latency = time.perf_counter() - st
                if chunk == "[DONE]":
                    continue
                data = json.loads(chunk)
                if data.get("choices") and data["choices"][0].get("text"):
                    now = time.perf_counter()
                    if ttft == 0.0:
                        ttft = now - st
                    else:
                        itl.append(now - latest)
                    latest = now
                n = (data.get("usage") or {}).get("completion_tokens", n)
                server = (data.get("m1000_sim") or {}).get("ttft_ms", server)  # not bench_serving's: read only
    return Output(ttft, latency, tuple(itl), n, server)


async def run(base_url: str, model: str, input_len: int, output_len: int, requests: int, tag: str) -> list[Output]:
    """``requests`` sequential requests (concurrency 1), each with a prompt of its own, after one untimed request
    (``bench_serving``'s "initial single prompt test run": the first request of a fresh client also pays its
    imports, its first connection and its first scheduling on a busy machine; 36.9 ms module time of its own at time
    scale 2 under two hogs, against 1.8-2.3 ms on later rounds, bench/results/ note in the CHANGELOG)."""
    await request(base_url, model, prompt_text(f"{tag}warm", input_len), 2)
    return [await request(base_url, model, prompt_text(f"{tag}r{i}", input_len), output_len)
            for i in range(requests)]


def measure(base_url: str, model: str, input_len: int, output_len: int, requests: int, tag: str,
            scale: float = 1.0) -> list[tuple[float, float, float]]:
    """(TTFT ms, TPOT ms, the server's own TTFT ms or NaN) of each request, the client's times ``scale``."""
    outs = asyncio.run(run(base_url, model, input_len, output_len, requests, tag))
    return [(o.ttft * 1000 * scale, o.tpot * 1000 * scale,
             float("nan") if o.server_ttft_ms is None else o.server_ttft_ms) for o in outs]
