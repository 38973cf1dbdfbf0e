"""``start_<x>_server.sh``: check the request, then exec ``transformers serve`` on the model.

Standard library only up to the ``exec``. Refuses, with one clear line and exit code 3,
what this release cannot do honestly: speculative decoding (``--speculative-*`` in the
key's extra server arguments: transformers serve has no NEXTN/EAGLE drafting, and running
without it would report figures that are not MTP figures), a model whose architecture it
does not serve (Qwen3-VL), and a model that precompile has not prepared.
"""

from __future__ import annotations

import argparse
import os
import sys

from .common import EngineError, cache_entry_path, fail, read_json, require_env
from .workflow import find_model

REFUSED = 3


def plan(env: dict[str, str], model: str, host: str, port: str, extra: list[str]) -> list[str]:
    """The engine's argv for ``model`` (pure apart from reading the workflow and cache files)."""
    spec = [a for a in extra if a.startswith("--speculative")]
    if spec:
        raise EngineError(f"speculative decoding ({spec[0]} ...) is not supported by transformers serve: refused, "
                          "no MTP figures (running without it would report plain decoding as MTP)")
    if extra:
        raise EngineError(f"{model}: unsupported extra server arguments {' '.join(extra)}")
    require_env(env)
    m = find_model(env, model)
    if not m["supported"]:
        raise EngineError(f"{model}: {m['why']}")
    entry = cache_entry_path(env["TILELANG_CACHE_DIR"], model)
    if not os.path.exists(entry):
        raise EngineError(f"{model}: not prepared in {env['TILELANG_CACHE_DIR']}: run "
                          "scripts/ci/musa/precompile_tilelang_kernels.sh first")
    prepared = read_json(entry)
    if prepared.get("path") != m["path"]:
        raise EngineError(f"{model}: the precompile cache is for {prepared.get('path')}, not {m['path']}: "
                          "run precompile_tilelang_kernels.sh again")
    py = env.get("M1000_ENGINE_PYTHON") or "python3"
    device = env.get("M1000_ENGINE_DEVICE") or "cpu"
    return [py, "-m", "transformers.cli.transformers", "serve", "--device", device, "--host", host, "--port", port,
            "--log-level", "info", m["path"]]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="start server")
    p.add_argument("--workflow-model", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", default="30000")
    p.add_argument("--max-total-tokens", default="16384")
    p.add_argument("extra", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    prog = f"start server {args.workflow_model}"
    extra = [a for a in args.extra if a != "--"]
    try:
        argv_ = plan(dict(os.environ), args.workflow_model, args.host, args.port, extra)
    except EngineError as exc:
        return fail(prog, str(exc), REFUSED)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    print(f"[engine] exec {' '.join(argv_)}", file=sys.stderr, flush=True)
    try:
        os.execvpe(argv_[0], argv_, env)
    except OSError as exc:
        return fail(prog, f"cannot start the engine {argv_[0]}: {exc.strerror or exc} (set M1000_ENGINE_PYTHON "
                    "to an interpreter with torch and transformers[serving])", 127)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
