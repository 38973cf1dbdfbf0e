"""Benchmark: the probe and an independent client (AIPerf, from PyPI) side by side against the simulated module.

Anyone can repeat the cross-check of issue 29: one simulated qwen3 server (``python -m simulator serve``), then
for each profile (no shared prefix: 128, 500, 2000 input tokens, 100 output, concurrency 1) the probe and
AIPerf in interleaved rounds (probe, AIPerf, AIPerf, probe, ...), each ``--requests`` requests after one
warm-up; the medians of their TTFT and TPOT next to the reference document's figure.

AIPerf runs offline in its own venv, made here on first use (``--venv``, default
``~/.cache/m1000-fleet/aiperf-0.13.0``: ``pip install aiperf==0.13.0``, ~1.2 GB, a few minutes), with a local
tokenizer the bench writes: word level (one token per whitespace-separated word, the simulated server's own
rule), its vocabulary the words of AIPerf's own prompt corpus, so its synthetic prompts have the lengths it asks
for. The tokenizer is read from its absolute path: nothing is fetched at run time (the bench ran on a machine
without network). One dataset entry per request: AIPerf's default reuses its entries, so the warm-up's prompt
came again and found itself in the simulated server's prefix cache (-40 % TTFT at 2000 tokens). AIPerf measures
wall time; its figures are multiplied by the server's time scale (the probe does the same itself). The simulated
server starts every request's clock when it reaches its kernel (docs/adr/0038), so both clients' TTFT include
their own time before the send and after the first chunk, times the scale. Why AIPerf:
docs/adr/0015-measurement-choices.md.

Usage: .venv/bin/python bench/crosscheck.py [--time-scale 10] [--requests 5] [--rounds 2] [--venv DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from agent.probe import ProbeConfig, run_probe  # noqa: E402
from agent.tables import parse_seed  # noqa: E402
from bench import record  # noqa: E402 - bench/record.py
from simulator.ports import free_port  # noqa: E402

AIPERF = "aiperf==0.13.0"
PROFILES = (128, 500, 2000)
OUTPUT = 100
GOAL = 0.01  # each client within 1 % of the reference, and of each other

TOKENIZER = r'''
import json, sys
from pathlib import Path
import aiperf
from tokenizers import Tokenizer, models, pre_tokenizers
corpus = Path(aiperf.__file__).parent / "dataset/generator/assets/shakespeare.txt"
words = sorted(set(corpus.read_text(encoding="utf-8").split()))
vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}
tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
tok.save(str(out / "tokenizer.json"))
(out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
    "unk_token": "[UNK]", "model_max_length": 1000000, "clean_up_tokenization_spaces": False}))
print(len(vocab))
'''


def ensure_venv(venv: Path) -> Path:
    """AIPerf's own venv (made once); returns its ``aiperf`` program."""
    prog = venv / "bin" / "aiperf"
    if not prog.exists():
        print(f"making {venv} ({AIPERF}, a few minutes)", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", AIPERF], check=True)
    tok = venv / "m1000-word-tokenizer"
    if not (tok / "tokenizer.json").exists():
        subprocess.run([str(venv / "bin" / "python"), "-c", TOKENIZER, str(tok)], check=True, capture_output=True)
    return prog


def aiperf_round(prog: Path, url: str, model: str, isl: int, requests: int, scale: float) -> tuple[float, float]:
    """AIPerf's TTFT and TPOT medians (server ms) over ``requests`` streamed completions of ``isl`` tokens."""
    tok = prog.parent.parent / "m1000-word-tokenizer"
    with tempfile.TemporaryDirectory(prefix="aiperf-") as out:
        # a local tokenizer folder by its absolute path: transformers reads it without the hub (AIPerf 0.13's
        # HF_HUB_OFFLINE path only looks in the hub's cache, so it is not set; no network is needed or reached)
        env = {**os.environ, "HF_HUB_DISABLE_TELEMETRY": "1"}
        cmd = [str(prog), "profile", "--model", model, "--url", url, "--endpoint-type", "completions", "--streaming",
               "--tokenizer", str(tok), "--isl", str(isl), "--isl-stddev", "0", "--osl", str(OUTPUT),
               "--osl-stddev", "0", "--extra-inputs", "ignore_eos:true", "--concurrency", "1", "--request-count",
               str(requests), "--warmup-request-count", "1", "--num-dataset-entries", str(requests + 1),
               "--artifact-dir", out, "--ui-type", "none",
               "--no-server-metrics", "--random-seed", str(int(time.time()) % 100_000)]
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
        found = sorted(Path(out).rglob("profile_export_aiperf.json"))
        if res.returncode != 0 or not found:
            raise SystemExit(f"aiperf failed (exit {res.returncode}):\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
        data = json.loads(found[0].read_text())
    metrics = data.get("records", data)

    def p50(name: str) -> float:
        m = metrics[name]
        return float(m.get("p50", m.get("avg"))) * scale

    return p50("time_to_first_token"), p50("inter_token_latency")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-scale", default="10")
    ap.add_argument("--requests", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--venv", default=str(Path.home() / ".cache" / "m1000-fleet" / "aiperf-0.13.0"))
    args = ap.parse_args()
    prog = ensure_venv(Path(args.venv))
    version = subprocess.run([str(prog.parent / "pip"), "show", "aiperf"], capture_output=True, text=True).stdout
    print(f"AIPerf {next((x.split()[-1] for x in version.splitlines() if x.startswith('Version')), '?')} "
          f"in {args.venv}; simulated qwen3 at time scale {args.time_scale}; {args.rounds} interleaved rounds of "
          f"{args.requests} requests per client and profile; medians in module ms")
    seed = parse_seed((ROOT / "simulator/data/reference_tables.txt").read_text(encoding="utf-8"))
    ref = {r.input_tokens: r for r in seed["qwen3"] if r.table == "sweep" and not r.prefix_tokens}
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("M1000_SIM_")}
    proc = subprocess.Popen([sys.executable, "-m", "simulator", "serve", "qwen3", "--port", str(port),
                             "--time-scale", args.time_scale], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    worst = 0.0
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(f"{url}/v1/models", timeout=1) as r:
                    model = json.loads(r.read())["data"][0]["id"]
                with urllib.request.urlopen(f"{url}/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        scale = float(args.time_scale)
        print("| input | client | TTFT p50 | vs reference | TPOT p50 | vs reference | rounds |")
        print("| ---: | --- | ---: | ---: | ---: | ---: | --- |")
        for isl in PROFILES:
            got: dict[str, list[tuple[float, float]]] = {"probe": [], "aiperf": []}
            for k in range(args.rounds):
                order = ("probe", "aiperf") if k % 2 == 0 else ("aiperf", "probe")
                for who in order:
                    if who == "probe":
                        (r,) = run_probe(ProbeConfig(base_url=url, profiles=(f"{isl}:{isl}",), requests=args.requests,
                                                     warmup=1, output_len=OUTPUT)).results
                        assert r.ttft_ms is not None and r.tpot_ms is not None, f"{isl}: {r.error_details}"
                        got[who].append((r.ttft_ms.p50, r.tpot_ms.p50))
                    else:
                        got[who].append(aiperf_round(prog, url, model, isl, args.requests, scale))
            want = ref[isl]
            assert want.ttft_ms is not None and want.tpot_ms is not None, f"{isl}: no TTFT/TPOT in the reference"
            meds = {}
            for who, vals in got.items():
                ttft, tpot = statistics.median(v[0] for v in vals), statistics.median(v[1] for v in vals)
                meds[who] = (ttft, tpot)
                dt, dp = ttft / want.ttft_ms - 1, tpot / want.tpot_ms - 1
                worst = max(worst, abs(dt), abs(dp))
                rounds = ", ".join(f"{a:.0f}/{b:.2f}" for a, b in vals)
                print(f"| {isl} | {who} | {ttft:.1f} | {dt:+.2%} | {tpot:.2f} | {dp:+.2%} | {rounds} |", flush=True)
            (pt, pp), (at, ap_) = meds["probe"], meds["aiperf"]
            print(f"| {isl} | reference | {want.ttft_ms} | AIPerf / probe {at / pt - 1:+.2%} | {want.tpot_ms} | "
                  f"AIPerf / probe {ap_ / pp - 1:+.2%} | |", flush=True)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)
    ok = worst <= GOAL
    print(f"worst |change| against the reference {worst:.2%}; goal within {GOAL:.0%}: {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
