"""A GGUF file's key/value header (llama.cpp's model format), read with the standard library only.

Carried by the llama.cpp release (``m1000_llama``): its workflow reads each model's architecture, weight
type, MTP head (``<arch>.nextn_predict_layers``) and vocabulary from here.
"""

from __future__ import annotations

import os
import struct
from typing import Any, BinaryIO

from .common import EngineError

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
