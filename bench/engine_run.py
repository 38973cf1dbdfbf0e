"""One validation of the real-engine release, measured: server start-up, tables, the agent's own cost.

Builds the real-engine release, makes a small (~0.5 M parameters, ``tiny``) and a larger
(``--big``, ~0.5 B) random Qwen3-MoE checkpoint, and runs the agent's pipeline
(``agent.pipeline.run_pipeline``, as ``fleet-agent run`` does) in this process over the keys
``qwen3`` (small), ``qwen35`` (large) and ``qwen35_mtp`` (refused by the release: no
speculative decoding in transformers serve). Prints, all from this one run: each key's
table as the release printed it, the server's start-up time (start until /health answered),
each step's duration, and the agent's own overhead: the wall time of the run outside its
child processes' steps and the agent process's own CPU time beside its children's.

Needs torch + transformers[serving] (``.venv-engine/bin/python bench/engine_run.py``); on the
lent H200: ``--device cuda:0`` (``bench/engine_gpu.sh`` carries the missing wheels).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import record

from agent.pipeline import AgentConfig, run_pipeline
from agent.store import RunStore
from contract.records import MODEL_KEYS, RunRequest
from simulator.engine.build import build_engine_release, parse_profiles
from simulator.engine.models import make_engine_model

CHILD_STEPS = ("generate", "environment", "precompile", "server", "benchmark")


def _engine_interpreter() -> int | None:
    """Run under the engine's interpreter (torch + transformers): re-exec with .venv-engine, or skip."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        prefix = Path(__file__).resolve().parent.parent / ".venv-engine"
        venv = prefix / "bin" / "python"
        if venv.exists() and Path(sys.prefix).resolve() != prefix.resolve():
            os.execv(str(venv), [str(venv), *sys.argv])
        print("bench/engine_run.py: skipped: needs torch + transformers[serving] (make engine)")
        return 0
    return None


def main() -> int:
    skipped = _engine_interpreter()
    if skipped is not None:
        return skipped
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--big", default="", help="size of the qwen35 checkpoint (default: 0.5b on a GPU, tiny on cpu)")
    p.add_argument("--profiles", default="16,64;128@32")
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--port", type=int, default=31777)
    p.add_argument("--out", default="")
    args = p.parse_args()
    big = args.big or ("tiny" if args.device == "cpu" else "0.5b")
    root = Path(args.out or tempfile.mkdtemp(prefix="m1000-engine-"))
    t0 = time.monotonic()
    rel = build_engine_release(root / "rel", profiles=parse_profiles(args.profiles, args.output_len))
    make_engine_model(root / "models" / MODEL_KEYS["qwen3"].model_dir, size="tiny", seed=0)
    make_engine_model(root / "models" / MODEL_KEYS["qwen35"].model_dir, size=big, seed=1)
    made = time.monotonic() - t0
    env = {**os.environ, "M1000_ENGINE_PYTHON": sys.executable, "M1000_ENGINE_DEVICE": args.device}
    cfg = AgentConfig(module="engine-bench", workdir=root / "work", server_port=args.port, base_env=env,
                      ready_timeout=600, benchmark_timeout=1200)
    req = RunRequest(run_id="engine-bench", module="engine-bench", tarball=str(rel.path), sha256=rel.sha256,
                     release=rel.version, models=("qwen3", "qwen35", "qwen35_mtp"), model_root=str(root / "models"))
    self0, kids0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    w0 = time.monotonic()
    result = run_pipeline(req, cfg)
    wall = time.monotonic() - w0
    self1, kids1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    store = RunStore(root / "work")
    events = store.events(req.run_id)
    print(f"# real-engine validation on {args.device} (models made in {made:.1f} s, not counted below)")
    for o in result.progress.outcomes:
        print(f"{o.model_key}: {o.status}, {o.rows} rows, {o.duration_s:.1f} s"
              + (f" -- {o.error.one_line()}" if o.error else ""))
    for out in sorted((root / "work" / "runs" / req.run_id / "logs").glob("*benchmark-*.out")):
        print(f"\n## {out.name}\n{out.read_text(encoding='utf-8').strip()}")
    print("\n## steps (s)")
    child = 0.0
    for e in events:
        if e["status"] in ("ok", "failed", "skipped") and e.get("duration_s") is not None:
            print(f"{e['step']:<12} {e.get('model_key') or '':<11} {e['status']:<8} {e['duration_s']:8.2f}  "
                  f"{e.get('message', '')[:90]}")
            if e["step"] in CHILD_STEPS:
                child += e["duration_s"]
    agent_cpu = (self1.ru_utime + self1.ru_stime) - (self0.ru_utime + self0.ru_stime)
    kids_cpu = (kids1.ru_utime + kids1.ru_stime) - (kids0.ru_utime + kids0.ru_stime)
    summary = {"device": args.device, "run_wall_s": round(wall, 2), "child_steps_wall_s": round(child, 2),
               "agent_wall_outside_steps_s": round(wall - child, 2), "agent_cpu_s": round(agent_cpu, 2),
               "children_cpu_s": round(kids_cpu, 2), "agent_cpu_share": round(agent_cpu / max(kids_cpu, 1e-9), 4)}
    print("\n## agent overhead\n" + json.dumps(summary))
    return 0 if all(o.status == "passed" for o in result.progress.outcomes if o.model_key != "qwen35_mtp") else 1


if __name__ == "__main__":
    skipped = _engine_interpreter()  # before recording: it may re-exec
    raise SystemExit(skipped if skipped is not None else record.main(main, __file__))
