"""One validation of the llama.cpp release on all seven keys, measured: ready time, tables, the agent's own cost.

Builds the llama.cpp release (``--profiles``, ``--mtp``, ``--vision`` sizes), makes the random GGUF
models (``--size``: ``tiny`` on a CPU, ``gpu`` on the lent H200) with the converter of the pinned
llama.cpp source, and runs the agent's pipeline (``agent.pipeline.run_pipeline``, as ``fleet-agent run``
does) in this process over all seven keys with ``M1000_LLAMA_SERVER`` / ``M1000_LLAMA_DEVICE``. Prints,
all from this one run: each key's tables as the release printed them, each key's server ready time
(start until ``/health`` answered 200), each step's duration, TTFT / TPOT per profile, and the agent's
own CPU time beside its children's. ``--streams FILE`` then records real streams of the same servers
(a completion, an MTP completion with its draft counts, a chat with an image, a model that fails to load)
in the ``== section`` format of ``tests/fixtures/engine/``.

Needs torch + transformers + sentencepiece (the converter; ``.venv-engine/bin/python``) and a built
llama-server (``make engine``; on the GPU ``bench/engine_llama_gpu.sh`` builds it with CUDA).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from agent.pipeline import AgentConfig
from bench import record
from bench.engine_report import print_outcomes, print_steps_and_overhead, run_measured
from contract.records import MODEL_KEYS, RunRequest
from simulator.engine.llama_models import make_llama_models
from simulator.engine.llama_release import DEFAULT_MTP, DEFAULT_VISION, build_llama_release, parse_sizes
from simulator.engine.llamacpp import installed, unpacked
from simulator.engine.release import parse_profiles
from simulator.engine.runtime.llama_bench import png


def _post_raw(url: str, body: dict[str, object]) -> bytes:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return resp.read()


def _wait_health(port: int, proc: subprocess.Popen[bytes], timeout: float = 120) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            return -1.0
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return time.monotonic() - t0
        except OSError:
            pass
        time.sleep(0.05)
    return -1.0


def record_streams(server: str, models: Path, device: str, port: int, dest: Path) -> None:
    """Real llama-server streams (raw SSE bytes) and a load failure's stderr, in the fixtures' format."""
    import base64

    ngl = ["-ngl", "999"] if device == "cuda" else []
    image = "data:image/png;base64," + base64.b64encode(png(224, 224)).decode()
    cases = [
        ("completions", MODEL_KEYS["qwen3"].model_dir, [], "/v1/completions",
         {"prompt": "w1 w2 w3 w4 w5 w6 w7 w8", "max_tokens": 8, "stream": True, "temperature": 0,
          "ignore_eos": True, "cache_prompt": False, "stream_options": {"include_usage": True}}),
        ("completions-mtp", MODEL_KEYS["qwen35_mtp"].model_dir, ["--spec-type", "draft-mtp", "--spec-draft-n-max",
                                                                 "3"], "/v1/completions",
         {"prompt": "w1 w2 w3 w4 w5 w6 w7 w8", "max_tokens": 12, "stream": True, "temperature": 0,
          "ignore_eos": True, "cache_prompt": False, "stream_options": {"include_usage": True}}),
        ("chat-image", MODEL_KEYS["qwen3vl"].model_dir, [], "/v1/chat/completions",
         {"messages": [{"role": "user", "content": [{"type": "text", "text": "w1 w2 w3 w4"},
                                                     {"type": "image_url", "image_url": {"url": image}}]}],
          "max_tokens": 6, "stream": True, "temperature": 0, "ignore_eos": True,
          "stream_options": {"include_usage": True}}),
    ]
    out: list[bytes] = []
    for name, folder, extra, path, body in cases:
        mdir = models / folder
        argv = [server, "-m", str(mdir / "model.gguf"), "--port", str(port), "-c", "4096", "-np", "1",
                "--cache-ram", "0", *ngl, *extra]
        if (mdir / "mmproj.gguf").exists():
            argv += ["--mmproj", str(mdir / "mmproj.gguf")]
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            ready = _wait_health(port, proc)
            for prefix in (b"", b"again "):  # the same request twice: a cached prompt shows in timings.cache_n
                raw = _post_raw(f"http://127.0.0.1:{port}{path}", {**body, "cache_prompt": bool(prefix)})
                out.append(f"== {prefix.decode()}{name}\n".encode() + raw.rstrip(b"\n") + b"\n")
            print(f"recorded {name}: ready in {ready:.2f} s")
        finally:
            proc.terminate()
            proc.wait(30)
    broken = Path(tempfile.mkdtemp(prefix="m1000-broken-")) / "model.gguf"
    broken.write_bytes((models / MODEL_KEYS["qwen3"].model_dir / "model.gguf").read_bytes()[:4096])
    res = subprocess.run([server, "-m", str(broken), "--port", str(port), *ngl], capture_output=True, timeout=120)
    tail = b"\n".join(res.stderr.strip().splitlines()[-12:])
    out.append(f"== load-failure (exit {res.returncode})\n".encode() + tail + b"\n")
    dest.write_bytes(b"".join(out))
    print(f"streams written to {dest}")


class NvmlCounter:
    """NVML's cumulative energy counter of GPU 0 read every 0.1 s in a thread (pynvml), when there is one."""

    def __init__(self) -> None:
        self.readings: list[tuple[float, float]] = []  # (epoch s, joules)
        self.why = ""
        self._stop = threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        except Exception as exc:  # no pynvml, no driver, no GPU, no counter: said once, the run goes on
            self.why = f"{type(exc).__name__}: {exc}"
            self._thread: threading.Thread | None = None
            return

        def loop() -> None:
            while not self._stop.is_set():
                self.readings.append((time.time(), pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000))
                self._stop.wait(0.1)

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def joules(self, start: float, end: float) -> float | None:
        """The counter's energy over [start, end], linear between the readings around each edge."""
        def at(t: float) -> float | None:
            for (t0, j0), (t1, j1) in zip(self.readings, self.readings[1:], strict=False):
                if t0 <= t <= t1:
                    return j0 + (j1 - j0) * (t - t0) / (t1 - t0) if t1 > t0 else j0
            return None

        a, b = at(start), at(end)
        return None if a is None or b is None else b - a


def energy_lines(rows: list[Any], nvml: NvmlCounter) -> list[str]:
    """Each key's energy as the agent measured it beside NVML's counter over the same window."""
    out = ["\n## energy per key: the agent's figure against NVML's counter over its benchmark window"]
    if nvml.why:
        return [*out, f"NVML's counter: not read ({nvml.why})"]
    seen: set[str] = set()
    for r in rows:
        if r.source != "release" or r.model_key in seen:
            continue
        seen.add(r.model_key)
        w = r.energy
        if w is None or r.energy_j is None:
            out.append(f"{r.model_key:<14} agent: none ({w.note if w is not None else 'no window'})")
            continue
        ref = nvml.joules(w.start, w.end)
        ratio = f"{r.energy_j / ref:.4f}" if ref else "n/a"
        out.append(f"{r.model_key:<14} window {w.window_s:.2f} s, agent {r.energy_j:.2f} J ({w.source}), NVML "
                   f"counter {ref if ref is None else round(ref, 2)} J, agent/counter {ratio}")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--size", default="", help="model size: tiny (default on cpu) or gpu (default on cuda)")
    p.add_argument("--profiles", default="16,64;128@32")
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--mtp", default="", help="e.g. prompts=15,input=0,output=256")
    p.add_argument("--vision", default="", help="e.g. inputs=250/1000/2000,output=50,image=448")
    p.add_argument("--server", default="", help="llama-server (default: the one make engine built)")
    p.add_argument("--port", type=int, default=31788)
    p.add_argument("--out", default="")
    p.add_argument("--streams", default="", help="also record real streams into this file")
    p.add_argument("--probe-profiles", default="", help="the agent's probe_profiles (default: its own, 128:128)")
    p.add_argument("--probe-repeat", type=int, default=1, help="the agent's probe_repeat")
    p.add_argument("--telemetry-period", type=float, default=None, help="the agent's telemetry period, s")
    args = p.parse_args()
    size = args.size or ("tiny" if args.device == "cpu" else "gpu")
    built = installed()
    server = args.server or (str(built.server) if built else "")
    src = unpacked()
    if not server or src is None:
        print("llama-server or the llama.cpp source is missing: make engine (or --server)", file=sys.stderr)
        return 2
    root = Path(args.out or tempfile.mkdtemp(prefix="m1000-llama-"))
    t0 = time.monotonic()
    rel = build_llama_release(root / "rel", profiles=parse_profiles(args.profiles, args.output_len),
                              mtp=parse_sizes(args.mtp, DEFAULT_MTP, "mtp"),
                              vision=parse_sizes(args.vision, DEFAULT_VISION, "vision"))
    make_llama_models(root / "models", src.src, size=size)
    made = time.monotonic() - t0
    env = {**os.environ, "M1000_LLAMA_SERVER": server, "M1000_LLAMA_DEVICE": args.device}
    probe: dict[str, Any] = {"probe_repeat": args.probe_repeat}
    if args.probe_profiles:
        probe["probe_profiles"] = tuple(x.strip() for x in args.probe_profiles.split(",") if x.strip())
    if args.telemetry_period is not None:
        from agent.telemetry import TelemetryConfig

        probe["telemetry"] = TelemetryConfig(enabled=args.telemetry_period > 0, period_s=args.telemetry_period or 1.0)
    cfg = AgentConfig(module="llama-bench", workdir=root / "work", server_port=args.port, base_env=env,
                      ready_timeout=600, benchmark_timeout=1800, **probe)
    nvml = NvmlCounter()
    req = RunRequest(run_id="llama-bench", module="llama-bench", tarball=str(rel.path), sha256=rel.sha256,
                     release=rel.version, models=tuple(MODEL_KEYS), model_root=str(root / "models"))
    m = run_measured(req, cfg, after=nvml.stop)
    result, events = m.result, m.events
    print(f"# llama.cpp release on {args.device}: {server} (models {size}, made in {made:.1f} s, not counted below)")
    print_outcomes(m)
    print("\n## server ready (start until /health 200), s")
    for e in events:
        if e["step"] == "server" and e["status"] == "ok":
            print(f"{e.get('model_key'):<14} {e['duration_s']:.3f}")
    print("\n## TTFT / TPOT per profile (release rows)")
    for r in result.rows:
        if r.source == "release":
            print(f"{r.model_key:<14} {r.profile:<14} TTFT {r.ttft_ms} ms  TPOT {r.tpot_ms} ms  "
                  f"accept {r.accept_rate}  vision_fps {r.vision_fps}")
    print("\n## the agent's probe beside the release (from each key's benchmark log)")
    for log in sorted(m.logs.glob("*benchmark-*.log")):
        for line in log.read_text(encoding="utf-8").splitlines():
            if "[agent] probe" in line or "[agent] release" in line or re.search(r"\[agent\] \d+:\d+: ", line):
                print(f"{log.name.split('benchmark-')[1].removesuffix('.log'):<14} {line.split('[agent] ', 1)[1]}")
    print("\n".join(energy_lines(list(result.rows), nvml)))
    flagged = [r for r in result.rows if r.source == "release" and "release_benchmark_disagrees" in r.flags]
    print(f"\nrelease rows flagged release_benchmark_disagrees: {len(flagged)}"
          + "".join(f"\n  {r.model_key} {r.profile}" for r in flagged))
    print_steps_and_overhead(m, args.device)
    print("\nnote: random-weight models: the MTP acceptance and the GSM8K answers above are meaningless")
    if args.streams:
        record_streams(server, root / "models", args.device, args.port + 1, Path(args.streams))
    return 0 if all(o.status == "passed" for o in result.progress.outcomes) else 1


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
