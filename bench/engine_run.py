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
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from agent.pipeline import AgentConfig
from bench import record
from bench.engine_report import print_outcomes, print_steps_and_overhead, run_measured
from contract.records import MODEL_KEYS, RunRequest
from simulator.engine.build import build_engine_release
from simulator.engine.models import make_engine_model
from simulator.engine.release import parse_profiles


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
    m = run_measured(req, cfg)
    result = m.result
    print(f"# real-engine validation on {args.device} (models made in {made:.1f} s, not counted below)")
    print_outcomes(m)
    print_steps_and_overhead(m, args.device, key_width=11)
    return 0 if all(o.status == "passed" for o in result.progress.outcomes if o.model_key != "qwen35_mtp") else 1


if __name__ == "__main__":
    skipped = _engine_interpreter()  # before recording: it may re-exec
    raise SystemExit(skipped if skipped is not None else record.main(main, __file__))
