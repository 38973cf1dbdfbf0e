"""``precompile_tilelang_kernels.sh``: prepare every served model of the workflow for serving.

For each served model it fingerprints the model's files (:func:`common.fingerprint` of the engine's
``model_files``), and unless ``$TILELANG_CACHE_DIR/<engine>/<model>.json`` already holds that
fingerprint for this device (and the engine's own identity: llama.cpp's server version), has the
engine prepare it (transformers: load and warm up on the device; llama.cpp: nothing to compile) and
writes the entry. The start scripts refuse a model with no entry, as a real release refuses kernels
that were never compiled.
"""

from __future__ import annotations

import json
import os
import sys
import time
from types import ModuleType
from typing import Any

from .common import EngineError, cache_entry_path, fail, fingerprint, load_engine, load_workflow, write_atomic

PROG = "precompile_tilelang_kernels.sh"


def cached(entry: str, want: dict[str, Any]) -> bool:
    """Whether the entry at ``entry`` records every field of ``want`` (an unreadable entry does not)."""
    if not os.path.exists(entry):
        return False
    try:
        with open(entry, encoding="utf-8") as fh:
            old = json.load(fh)
    except (OSError, ValueError):
        return False
    return isinstance(old, dict) and all(old.get(k) == v for k, v in want.items())


def precompile(env: Any, engine: ModuleType) -> str:
    """Prepare the workflow's served models; the cache folder written."""
    wf = load_workflow(env)
    cache = env["TILELANG_CACHE_DIR"]
    device = env.get(engine.DEVICE_VAR) or "cpu"
    ident = engine.identity(env, device)
    os.makedirs(os.path.join(cache, engine.CACHE), exist_ok=True)
    done = 0
    for m in wf["models"]:
        if not m["supported"]:
            print(f"[precompile] {m['name']}: skipped ({m['why']})", flush=True)
            continue
        entry = cache_entry_path(cache, engine.CACHE, m["name"])
        t0 = time.monotonic()
        files = engine.model_files(m)
        fp = fingerprint(files)
        if cached(entry, {"fingerprint": fp, "device": device, **ident, "path": m["path"]}):
            print(f"[precompile] {m['name']}: cached ({entry})", flush=True)
            done += 1
            continue
        info, said = engine.prepare(m, files, device, t0)
        write_atomic(entry, json.dumps({"name": m["name"], "path": m["path"], "fingerprint": fp, "device": device,
                                        **ident, **info}, indent=2) + "\n")
        print(f"[precompile] {m['name']}: {said}", flush=True)
        done += 1
    print(f"[precompile] done: {done} model(s) in {cache}/{engine.CACHE}", flush=True)
    return os.path.join(cache, engine.CACHE)


def main() -> int:
    try:
        precompile(os.environ, load_engine())
    except EngineError as exc:
        return fail(PROG, str(exc))
    except (ImportError, OSError, RuntimeError, ValueError) as exc:
        return fail(PROG, f"{type(exc).__name__}: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
