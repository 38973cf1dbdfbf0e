"""``python -m m1000_engine.workflow generate|model-path``: the workflow of the real-engine release.

``generate`` reads ``model_paths`` from tilelang_workflow_config.json and records, for each
folder, its name, its architecture (``model_type`` of its config.json) and whether this
release can serve it (Qwen3-MoE text models; anything else is listed as unsupported, and
its start script refuses it). Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from .common import SUPPORTED_TYPES, EngineError, fail, load_workflow, read_json, write_atomic


def describe(path: Any, where: str) -> dict[str, Any]:
    if not isinstance(path, str) or not path.strip():
        raise EngineError(f"{where}: must be a folder path (a non-empty string), got {path!r}")
    if not os.path.isdir(path):
        raise EngineError(f"{where}: model path {path} is not a folder")
    cfg = read_json(os.path.join(path, "config.json"), f"{where}: {path}/config.json")
    if not isinstance(cfg, dict):
        raise EngineError(f"{where}: {path}/config.json is not a JSON object")
    mtype = str(cfg.get("model_type") or "")
    has_weights = any(n.endswith(".safetensors") for n in os.listdir(path))
    ok = mtype in SUPPORTED_TYPES and has_weights
    why = ""
    if mtype not in SUPPORTED_TYPES:
        why = f"architecture {mtype or '?'} is not served by this release (supported: {', '.join(SUPPORTED_TYPES)})"
    elif not has_weights:
        why = "no *.safetensors weights"
    return {"name": os.path.basename(os.path.normpath(path)), "path": os.path.abspath(path), "model_type": mtype,
            "supported": ok, "why": why}


def generate(config_path: str, out_path: str) -> dict[str, Any]:
    cfg = read_json(config_path)
    paths = cfg.get("model_paths") if isinstance(cfg, dict) else None
    if not isinstance(paths, list) or not paths:
        raise EngineError(f"{config_path}: 'model_paths' must be a non-empty list of model folders")
    models = [describe(p, f"{config_path}: model_paths[{i}]") for i, p in enumerate(paths)]
    wf = {"schema": 1, "engine": "transformers", "config": os.path.abspath(config_path), "models": models}
    write_atomic(out_path, json.dumps(wf, indent=2) + "\n")
    return wf


def find_model(env: Any, name: str) -> dict[str, Any]:
    for m in load_workflow(env)["models"]:
        if m.get("name") == name:
            return m  # type: ignore[no-any-return]
    raise EngineError(f"model {name} is not in the workflow ({env['TILELANG_WORKFLOW_FILE']}): add its folder to "
                      "model_paths in scripts/ci/musa/tilelang_workflow_config.json and run "
                      "generate_tilelang_workflow.sh")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="generate_tilelang_workflow.sh")
    p.add_argument("--config", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    try:
        wf = generate(args.config, args.out)
    except EngineError as exc:
        return fail("generate_tilelang_workflow.sh", str(exc))
    for m in wf["models"]:
        state = "supported" if m["supported"] else f"NOT supported: {m['why']}"
        print(f"{m['name']} ({m['model_type']}): {state}")
    print(f"generated {args.out} for {len(wf['models'])} model(s), engine transformers serve")
    return 0


if __name__ == "__main__":
    sys.exit(main())
