"""Helpers shared by a real-engine release's programs. Standard library only (Python 3.10+).

Each release carries its own copy (its programs import nothing from the fleet's packages).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import sys
from types import ModuleType
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
SETUP_ENV_VARS = ("SGLANG_MUSA_RELEASE_DIR", "TILELANG_WORKFLOW_FILE", "TILELANG_CACHE_DIR")
CONFIG = "bench_config.json"  # written by the builder beside the programs; its "engine" names the engine module
ENGINES = {"transformers": "transformers_serve", "llama.cpp": "llama_server"}
REFUSED = 3  # exit code of what a release cannot do honestly (the agent reports it as refused)


class EngineError(Exception):
    """A release program cannot go on; the message says what and where."""


def release_file(name: str) -> str:
    return os.path.join(HERE, name)


def fail(prog: str, message: str, code: int = 1) -> int:
    print(f"{prog}: error: {message}", file=sys.stderr, flush=True)
    return code


def read_json(path: str, what: str = "") -> Any:
    label = what or path
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError:
        raise EngineError(f"{label}: not found") from None
    except OSError as exc:
        raise EngineError(f"{label}: cannot read: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EngineError(f"{label}: not valid JSON ({exc})") from None


def load_engine(name: str | None = None) -> ModuleType:
    """The engine module of this release: ``name``, else the ``engine`` of its ``bench_config.json``."""
    if name is None:
        cfg = read_json(release_file(CONFIG))
        name = cfg.get("engine") if isinstance(cfg, dict) else None
    if name not in ENGINES:
        raise EngineError(f"{release_file(CONFIG)}: engine {name!r} is not one of {', '.join(ENGINES)}")
    return importlib.import_module(f"{__package__}.{ENGINES[name]}")


def write_atomic(path: str, text: str) -> None:
    """Write-then-rename: readers never see a half-written file."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def require_env(env: Any, names: tuple[str, ...] = SETUP_ENV_VARS) -> None:
    missing = [n for n in names if not env.get(n)]
    if missing:
        raise EngineError(f"{', '.join(missing)} not set: run 'source scripts/ci/musa/setup_env.sh' first")


def load_workflow(env: Any) -> dict[str, Any]:
    require_env(env)
    wf = read_json(env["TILELANG_WORKFLOW_FILE"])
    if not isinstance(wf, dict) or not isinstance(wf.get("models"), list):
        raise EngineError(f"{env['TILELANG_WORKFLOW_FILE']}: not this release's workflow; run "
                          "scripts/ci/musa/generate_tilelang_workflow.sh again")
    return wf


def find_model(env: Any, name: str) -> dict[str, Any]:
    for m in load_workflow(env)["models"]:
        if m.get("name") == name:
            return m
    raise EngineError(f"model {name} is not in the workflow ({env['TILELANG_WORKFLOW_FILE']}): add its folder to "
                      "model_paths in scripts/ci/musa/tilelang_workflow_config.json and run "
                      "generate_tilelang_workflow.sh")


def cache_entry_path(cache_dir: str, engine_dir: str, name: str) -> str:
    """``$TILELANG_CACHE_DIR/<engine_dir>/<model>.json``: what precompile recorded of a model."""
    return os.path.join(cache_dir, engine_dir, f"{name}.json")


def fingerprint(paths: list[str]) -> str:
    """sha256 over each file's name and bytes, in the order given."""
    h = hashlib.sha256()
    for p in paths:
        h.update(os.path.basename(p).encode() + b"\0")
        with open(p, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()
