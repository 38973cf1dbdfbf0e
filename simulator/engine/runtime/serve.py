"""``start_<x>_server.sh``: check the request, then exec the engine's server on the model.

Standard library only up to the ``exec``. Refuses, with one clear line and exit code 3, what this
release cannot do honestly: extra server arguments its engine cannot map (:func:`plan` asks the
engine's ``extra_options``: transformers serve has no speculative decoding; llama.cpp drafts with a
model's own MTP head only), a model the workflow lists as not served, and a model that precompile has
not prepared.
"""

from __future__ import annotations

import argparse
import os
import sys
from types import ModuleType

from .common import REFUSED, EngineError, cache_entry_path, fail, find_model, load_engine, read_json, require_env


def plan(env: dict[str, str], model: str, host: str, port: str, extra: list[str], engine: ModuleType,
         ctx: str = "16384") -> list[str]:
    """The engine's argv for ``model`` (pure apart from reading the workflow and cache files)."""
    options = engine.extra_options(extra)
    require_env(env)
    m = find_model(env, model)
    if not m["supported"]:
        raise EngineError(f"{model}: {m['why']}")
    entry = cache_entry_path(env["TILELANG_CACHE_DIR"], engine.CACHE, model)
    if not os.path.exists(entry):
        raise EngineError(f"{model}: not prepared in {env['TILELANG_CACHE_DIR']}: run "
                          "scripts/ci/musa/precompile_tilelang_kernels.sh first")
    prepared = read_json(entry)
    if prepared.get("path") != m["path"]:
        raise EngineError(f"{model}: the precompile cache is for {prepared.get('path')}, not {m['path']}: "
                          "run precompile_tilelang_kernels.sh again")
    return engine.server_argv(env, m, host, port, ctx, options)


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
    env = dict(os.environ)
    try:
        engine = load_engine()
    except EngineError as exc:
        return fail(prog, str(exc))
    try:
        argv_ = plan(env, args.workflow_model, args.host, args.port, extra, engine, args.max_total_tokens)
    except EngineError as exc:
        return fail(prog, str(exc), REFUSED)
    run_env = engine.exec_env(env, args.workflow_model)
    print(f"[engine] exec {' '.join(argv_)}", file=sys.stderr, flush=True)
    try:
        os.execvpe(argv_[0], argv_, run_env)
    except OSError as exc:
        return fail(prog, f"cannot start the engine {argv_[0]}: {exc.strerror or exc} ({engine.START_HINT})", 127)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
