"""``generate_tilelang_workflow.sh`` of the llama.cpp release: which model folders it can serve, and how.

For each folder of ``model_paths`` it reads ``model.gguf``'s header (standard library only): the
architecture, the weights' type, whether the model carries an MTP head (``<arch>.nextn_predict_layers``,
what ``--spec-type draft-mtp`` drafts with) and whether a vision projector ``mmproj.gguf`` lies beside it.
A folder without ``model.gguf`` is listed as not served, with the reason; its start script refuses it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from .common import (
    FILE_TYPES,
    MMPROJ_FILE,
    MODEL_FILE,
    EngineError,
    fail,
    gguf_metadata,
    load_workflow,
    read_json,
    write_atomic,
)


def describe(path: Any, where: str) -> dict[str, Any]:
    if not isinstance(path, str) or not path.strip():
        raise EngineError(f"{where}: must be a folder path (a non-empty string), got {path!r}")
    if not os.path.isdir(path):
        raise EngineError(f"{where}: model path {path} is not a folder")
    name = os.path.basename(os.path.normpath(path))
    out: dict[str, Any] = {"name": name, "path": os.path.abspath(path), "supported": False, "why": "",
                           "architecture": "", "mtp_layers": 0, "mmproj": "", "dtype": ""}
    cfg_path = os.path.join(path, "config.json")
    if os.path.exists(cfg_path):
        cfg = read_json(cfg_path, f"{where}: {cfg_path}")
        out["model_type"] = str(cfg.get("model_type") or "") if isinstance(cfg, dict) else ""
    gguf = os.path.join(path, MODEL_FILE)
    if not os.path.exists(gguf):
        out["why"] = f"no {MODEL_FILE} in {path} (this release serves GGUF models with llama-server)"
        return out
    meta = gguf_metadata(gguf)
    arch = str(meta.get("general.architecture") or "")
    out.update(architecture=arch, supported=True, model=os.path.abspath(gguf),
               mtp_layers=int(meta.get(f"{arch}.nextn_predict_layers") or 0),
               dtype=FILE_TYPES.get(int(meta.get("general.file_type", -1)), str(meta.get("general.file_type", "?"))),
               context=int(meta.get(f"{arch}.context_length") or 0), vocab=int(meta.get("tokenizer.ggml.tokens") or 0))
    proj = os.path.join(path, MMPROJ_FILE)
    if os.path.exists(proj):
        gguf_metadata(proj)  # a broken projector is refused here, not when the server loads it
        out["mmproj"] = os.path.abspath(proj)
    return out


def generate(config_path: str, out_path: str) -> dict[str, Any]:
    cfg = read_json(config_path)
    paths = cfg.get("model_paths") if isinstance(cfg, dict) else None
    if not isinstance(paths, list) or not paths:
        raise EngineError(f"{config_path}: 'model_paths' must be a non-empty list of model folders")
    models = [describe(p, f"{config_path}: model_paths[{i}]") for i, p in enumerate(paths)]
    wf = {"schema": 1, "engine": "llama.cpp", "config": os.path.abspath(config_path), "models": models}
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
        if m["supported"]:
            extra = (", MTP head" if m["mtp_layers"] else "") + (", vision projector" if m["mmproj"] else "")
            print(f"{m['name']} ({m['architecture']}, {m['dtype']}{extra}): supported")
        else:
            print(f"{m['name']}: NOT supported: {m['why']}")
    print(f"generated {args.out} for {len(wf['models'])} model(s), engine llama.cpp (llama-server)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
