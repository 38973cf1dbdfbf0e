"""Helpers shared by the llama.cpp release's programs. Standard library only (Python 3.10+).

Each release carries its own copy (its programs import nothing from the fleet's packages).
"""

from __future__ import annotations

import json
import os
import struct
import sys
from typing import Any, BinaryIO

HERE = os.path.dirname(os.path.abspath(__file__))
SETUP_ENV_VARS = ("SGLANG_MUSA_RELEASE_DIR", "TILELANG_WORKFLOW_FILE", "TILELANG_CACHE_DIR")
MODEL_FILE = "model.gguf"
MMPROJ_FILE = "mmproj.gguf"


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


def cache_entry_path(cache_dir: str, name: str) -> str:
    return os.path.join(cache_dir, "llama.cpp", f"{name}.json")


# ----- GGUF metadata (the key/value header of a .gguf file) ---------------------------------------------

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
FILE_TYPES = {0: "f32", 1: "f16", 7: "q8_0", 32: "bf16"}


def _read(fh: BinaryIO, n: int) -> bytes:
    data = fh.read(n)
    if len(data) != n:
        raise EngineError("truncated GGUF header")
    return data


def _value(fh: BinaryIO, kind: int, keep: bool) -> Any:
    if kind in _SCALARS:
        fmt = _SCALARS[kind]
        return struct.unpack(fmt, _read(fh, struct.calcsize(fmt)))[0]
    if kind == 8:
        (n,) = struct.unpack("<Q", _read(fh, 8))
        raw = _read(fh, n)
        return raw.decode("utf-8", "replace") if keep else None
    if kind == 9:
        sub, n = struct.unpack("<IQ", _read(fh, 12))
        if sub in _SCALARS and not keep:
            fh.seek(n * struct.calcsize(_SCALARS[sub]), os.SEEK_CUR)
            return n
        items = [_value(fh, sub, keep) for _ in range(n)]
        return items if keep else n
    raise EngineError(f"unknown GGUF value type {kind}")


def gguf_metadata(path: str) -> dict[str, Any]:
    """The scalar keys of a GGUF file's header (arrays by their length only): architecture, file type,
    block count, MTP (``nextn_predict_layers``) ..."""
    try:
        with open(path, "rb") as fh:
            if _read(fh, 4) != b"GGUF":
                raise EngineError(f"{path}: not a GGUF file (no GGUF magic)")
            version, _tensors, n_kv = struct.unpack("<IQQ", _read(fh, 20))
            if version < 2:
                raise EngineError(f"{path}: GGUF version {version} is too old")
            out: dict[str, Any] = {}
            for _ in range(n_kv):
                (klen,) = struct.unpack("<Q", _read(fh, 8))
                key = _read(fh, klen).decode("utf-8", "replace")
                (kind,) = struct.unpack("<I", _read(fh, 4))
                out[key] = _value(fh, kind, keep=kind != 9)
            return out
    except EngineError as exc:
        if str(exc).startswith(path):
            raise
        raise EngineError(f"{path}: {exc}") from None
    except OSError as exc:
        raise EngineError(f"{path}: cannot read: {exc.strerror or exc}") from None
