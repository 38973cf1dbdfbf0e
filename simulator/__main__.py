"""``python -m simulator build-release|make-models|serve``: the simulator's command line."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from simulator.build import build_release, make_models
from simulator.runtime.core import FAULT_NAMES, SimError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m simulator", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build-release", help="write SGLang-MUSA-M1000-M1000_<version>_sglang.tar.gz")
    b.add_argument("out_dir")
    b.add_argument("--version", default="1.4.1")
    b.add_argument("--noise", default="0.0", help="relative (lognormal) noise per request, e.g. 0.02")
    b.add_argument("--speed", default="1.0", 
                   help="'0.9' or '[KEY:]METRIC=FACTOR,...' (prefill/decode/accept/vision/all)")
    b.add_argument("--time-scale", default="50", help="server runs N times faster than module time")
    b.add_argument("--seed", default="0")
    b.add_argument("--fault", default="", help=f"comma list of NAME[:KEY], NAME in {', '.join(FAULT_NAMES)}")
    b.add_argument("--date", default="20260803", help="YYYYMMDD of the top folder")
    b.add_argument("--engine", choices=("sim", "transformers", "llama.cpp"), default="sim",
                   help="sim: the simulated server (default); transformers: a real server (transformers serve); "
                        "llama.cpp: a real server (llama-server), all seven keys")
    b.add_argument("--profiles", default="16,64;128@32",
                   help="engine only: no-prefix inputs;shared-prefix inputs@new tokens")
    b.add_argument("--output-len", default="16", help="engine only: output tokens per request")
    b.add_argument("--mtp", default="", help="llama.cpp only: MTP table sizes, e.g. prompts=2,input=48,output=16 "
                   "(input=0: the reference document's prompt lengths)")
    b.add_argument("--vision", default="", help="llama.cpp only: vision table sizes, e.g. inputs=32/128,output=8,"
                   "image=224")
    r = sub.add_parser("build-series", help="write a series of nightly releases with a regression planted at one")
    r.add_argument("out_dir")
    r.add_argument("--count", type=int, default=16)
    r.add_argument("--regress-at", type=int, required=True, help="the first regressed release (0 = the oldest)")
    r.add_argument("--regress", default="qwen3:decode_tps:0.08", help="MODEL_KEY:METRIC:FRACTION")
    r.add_argument("--base", default="1.5.0", help="versions are BASE.devYYYYMMDD")
    r.add_argument("--start", default="20261101", help="YYYYMMDD of the oldest release")
    r.add_argument("--broken", default="", help="comma list of indices whose servers fail to start")
    r.add_argument("--noise", default="0.0")
    r.add_argument("--time-scale", default="50")
    r.add_argument("--seed", type=int, default=0)
    m = sub.add_parser("make-models", help="create stand-in model folders under ROOT")
    m.add_argument("root")
    m.add_argument("--keys", default="", help="comma list of model keys (default: all)")
    m.add_argument("--engine", choices=("sim", "transformers", "llama.cpp"), default="sim",
                   help="transformers: random-weight checkpoints (needs torch + transformers); llama.cpp: "
                        "random-weight GGUF models converted by llama.cpp's converter (needs make engine)")
    m.add_argument("--size", default="tiny", help="engine only: tiny (CPU tests), 0.5b (transformers) or gpu "
                   "(llama.cpp)")
    s = sub.add_parser("serve", help="debug: build a release in a temp dir and run one key's server there")
    s.add_argument("key")
    s.add_argument("--port", default="30000")
    s.add_argument("--time-scale", default="50")
    return p


def _serve(key: str, port: str, scale: str) -> int:
    from contract.records import MODEL_KEYS

    if key not in MODEL_KEYS:
        raise SimError(f"unknown model key {key!r} (known: {', '.join(MODEL_KEYS)})")
    spec = MODEL_KEYS[key]
    with tempfile.TemporaryDirectory(prefix="m1000-sim-") as tmp:
        rel = build_release(tmp, time_scale=scale)
        with tarfile.open(rel.path) as tar:
            tar.extractall(tmp, filter="data")
        top = Path(tmp) / rel.top
        paths = make_models(Path(tmp) / "models", [key])
        (top / "scripts/ci/musa/tilelang_workflow_config.json").write_text(
            json.dumps({"model_paths": [str(paths[key])]}) + "\n")
        env = {**os.environ, **spec.env, "SERVER_PORT": port}
        script = (f"cd {shlex.quote(str(top))} && scripts/ci/musa/generate_tilelang_workflow.sh"
                  " && source scripts/ci/musa/setup_env.sh && scripts/ci/musa/precompile_tilelang_kernels.sh"
                  f" && exec scripts/ci/musa/{spec.start_script}")
        print(f"release in {top}; benchmark with: cd {top} && source scripts/ci/musa/setup_env.sh && "
              f"SERVER_PORT={port} MODEL_KEY={key} scripts/ci/musa/run_tilelang_benchmark.sh", file=sys.stderr)
        proc = subprocess.Popen(["bash", "-c", script], env=env, start_new_session=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        try:
            return proc.wait()
        except KeyboardInterrupt:
            return 130
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(10)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.cmd == "build-release" and args.engine == "llama.cpp":
            from simulator.engine.llama_release import DEFAULT_MTP, DEFAULT_VISION, build_llama_release, parse_sizes
            from simulator.engine.release import parse_profiles

            version = args.version if args.version != "1.4.1" else "1.4.1-llama"
            rel = build_llama_release(args.out_dir, version=version, date=args.date,
                                      profiles=parse_profiles(args.profiles, int(args.output_len)),
                                      mtp=parse_sizes(args.mtp, DEFAULT_MTP, "mtp"),
                                      vision=parse_sizes(args.vision, DEFAULT_VISION, "vision"))
            print(f"{rel.sha256}  {rel.path}")
        elif args.cmd == "build-release" and args.engine == "transformers":
            from simulator.engine.build import build_engine_release
            from simulator.engine.release import parse_profiles

            version = args.version if args.version != "1.4.1" else "1.4.1-engine"
            rel = build_engine_release(args.out_dir, version=version, date=args.date,
                                       profiles=parse_profiles(args.profiles, int(args.output_len)))
            print(f"{rel.sha256}  {rel.path}")
        elif args.cmd == "build-release":
            rel = build_release(args.out_dir, version=args.version, noise=args.noise, speed=args.speed,
                                time_scale=args.time_scale, seed=args.seed, faults=args.fault, date=args.date)
            print(f"{rel.sha256}  {rel.path}")
        elif args.cmd == "build-series":
            from simulator.series import build_series

            broken = [int(x) for x in args.broken.split(",") if x.strip()]
            for rel in build_series(args.out_dir, count=args.count, regress_at=args.regress_at, regress=args.regress,
                                    base=args.base, start=args.start, noise=args.noise, time_scale=args.time_scale,
                                    seed=args.seed, broken=broken):
                print(f"{rel.sha256}  {rel.path}")
        elif args.cmd == "make-models" and args.engine == "llama.cpp":
            from simulator.engine.llama_models import make_llama_models
            from simulator.engine.llamacpp import unpacked

            built = unpacked()
            if built is None:
                raise SimError("the llama.cpp source is not unpacked here: run make engine (it unpacks the converter)")
            keys = [k.strip() for k in args.keys.split(",") if k.strip()] or None
            for key, path in make_llama_models(args.root, built.src, keys, size=args.size).items():
                print(f"{key}\t{path}")
        elif args.cmd == "make-models" and args.engine == "transformers":
            from simulator.engine.models import make_engine_models

            keys = [k.strip() for k in args.keys.split(",") if k.strip()] or None
            for key, path in make_engine_models(args.root, keys, size=args.size).items():
                print(f"{key}\t{path}")
        elif args.cmd == "make-models":
            keys = [k.strip() for k in args.keys.split(",") if k.strip()] or None
            for key, path in make_models(args.root, keys).items():
                print(f"{key}\t{path}")
        else:
            return _serve(args.key, args.port, args.time_scale)
    except (SimError, OSError, ValueError) as exc:
        print(f"simulator: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
