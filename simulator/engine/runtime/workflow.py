"""``generate_tilelang_workflow.sh``: which model folders this release can serve, and how.

``generate`` reads ``model_paths`` from tilelang_workflow_config.json and records, for each folder,
what the engine's ``describe`` finds there (its name, path, whether this release serves it and why
not). A folder the release does not serve is listed with the reason; its start script refuses it.
Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from types import ModuleType
from typing import Any

from .common import EngineError, fail, load_engine, read_json, write_atomic

PROG = "generate_tilelang_workflow.sh"


def check_folder(path: Any, where: str) -> str:
    """``path`` if it names a folder, else a clear error naming ``where``."""
    if not isinstance(path, str) or not path.strip():
        raise EngineError(f"{where}: must be a folder path (a non-empty string), got {path!r}")
    if not os.path.isdir(path):
        raise EngineError(f"{where}: model path {path} is not a folder")
    return path


def generate(config_path: str, out_path: str, engine: ModuleType) -> dict[str, Any]:
    cfg = read_json(config_path)
    paths = cfg.get("model_paths") if isinstance(cfg, dict) else None
    if not isinstance(paths, list) or not paths:
        raise EngineError(f"{config_path}: 'model_paths' must be a non-empty list of model folders")
    models = [engine.describe(check_folder(p, f"{config_path}: model_paths[{i}]"), f"{config_path}: model_paths[{i}]")
              for i, p in enumerate(paths)]
    wf = {"schema": 1, "engine": engine.NAME, "config": os.path.abspath(config_path), "models": models}
    write_atomic(out_path, json.dumps(wf, indent=2) + "\n")
    return wf


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG)
    p.add_argument("--config", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    try:
        engine = load_engine()
        wf = generate(args.config, args.out, engine)
    except EngineError as exc:
        return fail(PROG, str(exc))
    for m in wf["models"]:
        print(engine.summary(m))
    print(f"generated {args.out} for {len(wf['models'])} model(s), engine {engine.LABEL}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
