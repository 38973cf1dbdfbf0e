"""Helpers shared by the real-engine release's programs. Standard library only (Python 3.10+)."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
SETUP_ENV_VARS = ("SGLANG_MUSA_RELEASE_DIR", "TILELANG_WORKFLOW_FILE", "TILELANG_CACHE_DIR")
SUPPORTED_TYPES = ("qwen3_moe",)  # what transformers serve runs in this release (text generation)
MARKER = "m1000_engine.json"  # written beside a checkpoint by `python -m simulator make-models --engine`


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


def write_atomic(path: str, text: str) -> None:
    """Write-then-rename: readers never see a half-written file (as ``simulator/runtime/common.py``'s: each
    release carries its own copy, its programs import nothing from the fleet's packages)."""
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


def cache_entry_path(cache_dir: str, name: str) -> str:
    return os.path.join(cache_dir, "engine", f"{name}.json")
