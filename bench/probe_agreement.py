"""Benchmark: the probe, the release's benchmark and an independent client on one llama-server, interleaved.

Issue 45: does the agent's probe measure what a client measures, and does its cross-check flag a correct release?
For each key (``--keys``; default qwen3 and qwen35, a plain and a hybrid model) one llama-server is started as
the llama.cpp release starts it (``-np 1 --cache-ram 0 --metrics``, ``-ngl 999`` on cuda), and for each input
length (``--inputs``, no shared prefix) ``--rounds`` rounds run, each client once a round, in an order rotated
from round to round:

- **release**: the llama.cpp release's own measurement code (``simulator.engine.runtime.bench``:
  ``Client.stream``, reconnecting as the llama.cpp release does, its ``w<i>`` word prompts,
  ``cache_prompt: false``) and protocol: one request of the shape first (4 tokens, not reported), then
  ``--release-requests`` (2, as the release) whose medians are its figures; its first request after that
  warm-up is reported apart;
- **probe text** / **probe ids**: ``agent.probe.run_probe`` as the pipeline runs it (no warm-up, ``--requests``
  each), prompts as text (the default: the server's ``/detokenize`` of its ids) and as token ids;
- **peer**: ``bench/plain_client.py``, written from sglang ``bench_serving``'s definitions (its own prompts of
  ``w<i>`` words, no private header, no priority), ``--requests`` each.

Prints, per key and input length: each client's median TTFT and TPOT over the rounds (of its per-round
medians), the spread of those round medians (max / min), each ratio to the release, the release's first
request after its warm-up against its others, and how many rounds the agent's cross-check
(``agent.probe.compare.judge``, one probe round against one release round, as the pipeline judges with
``probe_repeat`` 1) flags. Goal (issue 45's acceptance, on the GPU): no round flagged at 500 and 2000 tokens.

    .venv/bin/python bench/probe_agreement.py --models DIR [--server PATH] [--device cpu|cuda] \\
        [--keys qwen3,qwen35] [--inputs 128,500,2000] [--rounds 5] [--requests 5] [--output-len 64]

``--models``: the folders ``python -m simulator make-models --engine llama.cpp DIR`` makes (``--size gpu`` on the
GPU). On this CPU: ``--inputs 32,128 --rounds 2 --requests 3 --output-len 8`` (tiny models) in about a minute.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from agent.probe import ProbeConfig, run_probe  # noqa: E402
from agent.probe.compare import FLAG, judge  # noqa: E402
from agent.probe.records import ProfileResult  # noqa: E402
from bench import record  # noqa: E402 - bench/record.py
from contract.records import MODEL_KEYS, ResultRow  # noqa: E402
from simulator.engine.runtime.bench import Client, Measurement, words  # noqa: E402
from simulator.ports import free_port  # noqa: E402

CLIENTS = ("release", "probe text", "probe ids", "peer")
VOCAB = 30_000  # the release's own bound on its word ids (runtime.llama_server.model_sizes: min(vocab - 40, 30000))


def start_server(server: str, model: Path, port: int, device: str, threads: int | None,
                 extra: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
    argv = [server, "-m", str(model / "model.gguf"), "--host", "127.0.0.1", "--port", str(port), "-c", "4096",
            "-np", "1", "--cache-ram", "0", "--metrics", "-ngl", "999" if device == "cuda" else "0"]
    if threads:
        argv += ["-t", str(threads)]
    argv += extra
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    end = time.monotonic() + 600
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"llama-server exited ({proc.returncode}) loading {model}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"llama-server not ready in 600 s ({model})")


def body(model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    """The llama.cpp release's request (``Bench.completion`` of a no-prefix profile)."""
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True, "cache_prompt": False}


def release_round(port: int, model: str, n: int, out: int, requests: int, tag: int) -> list[Measurement]:
    client = Client("127.0.0.1", port, reconnect=True)
    try:
        client.stream("/v1/completions", body(model, words(tag, n, VOCAB), 4))  # the shape's warm-up, not reported
        return [client.stream("/v1/completions", body(model, words(tag + 1 + r, n, VOCAB), out))
                for r in range(requests)]
    finally:
        client.close()


def peer_round(url: str, model: str, n: int, out: int, requests: int, tag: int) -> list[tuple[float, float]]:
    from bench import plain_client  # bench/plain_client.py: bench_serving's definitions

    outs = [asyncio.run(plain_client.request(url, model, words(tag + r, n, VOCAB), out)) for r in range(requests)]
    return [(o.ttft * 1000, o.tpot * 1000) for o in outs]


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", required=True, help="folder of the llama.cpp release's model folders")
    ap.add_argument("--server", default="", help="llama-server (default: the one make llama built)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--keys", default="qwen3,qwen35")
    ap.add_argument("--inputs", default="128,500,2000")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=5, help="per round, probe and peer")
    ap.add_argument("--release-requests", type=int, default=2)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0, help="llama-server -t (0: its default)")
    ap.add_argument("--server-args", default="", help="more llama-server arguments, e.g. '-lv 4 --log-file F' "
                    "(the release's vision server logs at trace level: does it slow decoding? issue 45 item 4)")
    args = ap.parse_args()
    server = args.server
    if not server:
        from simulator.engine.llamacpp import installed

        built = installed()
        server = str(built.server) if built else ""
    if not server:
        print("no llama-server: make llama, or --server", file=sys.stderr)
        return 2
    try:
        from bench import plain_client  # noqa: F401
        peer = True
    except ImportError:
        peer = False
        print("note: bench/plain_client.py is not here: no peer client", file=sys.stderr)
    inputs = [int(x) for x in args.inputs.split(",")]
    print(f"# probe vs release vs peer on llama-server ({args.device}): {server}; rounds {args.rounds}, "
          f"requests {args.requests} (release {args.release_requests} after a warm-up of the shape), output "
          f"{args.output_len} tokens; times in ms")
    worst_flags = 0
    raw: dict[str, Any] = {}
    for key in args.keys.split(","):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        proc = start_server(server, Path(args.models) / MODEL_KEYS[key].model_dir, port, args.device, args.threads,
                            tuple(shlex.split(args.server_args)))
        try:
            with urllib.request.urlopen(f"{url}/v1/models", timeout=10) as r:
                model = str(json.loads(r.read())["data"][0]["id"])
            for n in inputs:
                rounds: dict[str, list[tuple[float, float]]] = {c: [] for c in CLIENTS}
                each: dict[str, list[list[float]]] = {c: [] for c in CLIENTS}
                firsts: list[float] = []
                flagged = 0
                flag_lines: list[str] = []
                mode = ""
                for rnd in range(args.rounds):
                    order = CLIENTS[rnd % len(CLIENTS):] + CLIENTS[:rnd % len(CLIENTS)]
                    got: dict[str, ProfileResult] = {}
                    for c in order:
                        tag = 1000 * (rnd + 1) + 100 * inputs.index(n)
                        if c == "release":
                            ms = release_round(port, model, n, args.output_len, args.release_requests, tag)
                            t, p = [m.ttft_ms for m in ms], [m.tpot_ms for m in ms]
                            if len(t) >= 2:
                                firsts.append(t[0] / med(t[1:]))
                        elif c == "peer":
                            if not peer:
                                continue
                            pairs = peer_round(url, model, n, args.output_len, args.requests, tag + 50_000)
                            t, p = [a for a, _ in pairs], [b for _, b in pairs]
                        else:
                            cfg = ProbeConfig(base_url=url, model=model, profiles=(f"{n}:{n}",),
                                              requests=args.requests, warmup=0, output_len=args.output_len,
                                              prompt="ids" if c == "probe ids" else "text")
                            res = run_probe(cfg).results[0]
                            got[c] = res
                            mode = mode or (res.prompt if c == "probe text" else "")
                            t = [x.ttft_ms for x in res.samples if x.ttft_ms is not None]
                            p = [x.tpot_ms for x in res.samples if x.tpot_ms is not None]
                        rounds[c].append((med(t), med(p)))
                        each[c].append(t)
                    rel_t, rel_p = rounds["release"][-1]
                    row = ResultRow(run_id="b", module="b", release="b", model_key=key, model=key, table="sweep",
                                    profile=f"{n}:{n}", prefill_len=n, input_tokens=n, output_tokens=args.output_len,
                                    ttft_ms=rel_t, tpot_ms=rel_p, prefill_tps=n / rel_t * 1000,
                                    decode_tps=1000 / rel_p if rel_p else None)
                    found, _ = judge(row, got["probe text"])
                    if found:
                        flagged += 1
                        flag_lines.append(f"  round {rnd + 1} flagged ({FLAG}): {found[0].one_line()}")
                raw[f"{key}:{n}"] = {"rounds": rounds, "each_ttft": each, "first_after_warmup": firsts}
                print(f"\n## {key} {n}:{n} (probe text went as {mode})")
                print(f"{'client':<11} {'TTFT':>9} {'spread':>7} {'/release':>9} {'TPOT':>8} {'spread':>7} "
                      f"{'/release':>9}")
                rt = med([a for a, _ in rounds["release"]])
                rp = med([b for _, b in rounds["release"]])
                for c in CLIENTS:
                    if not rounds[c]:
                        continue
                    ts, ps = [a for a, _ in rounds[c]], [b for _, b in rounds[c]]
                    print(f"{c:<11} {med(ts):9.3f} {max(ts) / min(ts):6.2f}x {med(ts) / rt:9.3f} {med(ps):8.3f} "
                          f"{max(ps) / min(ps) if min(ps) > 0 else float('nan'):6.2f}x "
                          f"{med(ps) / rp if rp else float('nan'):9.3f}")
                tt, ti = med([a for a, _ in rounds["probe text"]]), med([a for a, _ in rounds["probe ids"]])
                print(f"probe text - ids: TTFT {tt - ti:+.3f} ms ({tt / ti:.3f}x)")
                if firsts:
                    print(f"release's first request after its warm-up / its others: median {med(firsts):.2f}x "
                          f"(rounds: {', '.join(f'{x:.2f}' for x in firsts)})")
                print(f"cross-check (one probe round against one release round): {flagged} of {args.rounds} "
                      "rounds flagged")
                for line in flag_lines:
                    print(line)
                if n >= 500:
                    worst_flags += flagged
        finally:
            proc.terminate()
            proc.wait(30)
    print("\n## raw\n" + json.dumps(raw))
    print(f"\nrounds flagged at 500 tokens and more: {worst_flags} (goal 0)")
    return 0 if worst_flags == 0 else 1


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
