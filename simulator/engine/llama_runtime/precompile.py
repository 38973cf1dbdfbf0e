"""``precompile_tilelang_kernels.sh`` of the llama.cpp release: prepare every served model of the workflow.

llama.cpp compiles no kernels ahead of a run (the CPU build is native code; the CUDA build ships its
kernels), so "prepared" means: ``llama-server`` (``$M1000_LLAMA_SERVER``) runs and says its version,
and each model's files are fingerprinted (sha256 of ``model.gguf`` and ``mmproj.gguf``) into
``$TILELANG_CACHE_DIR/llama.cpp/<model>.json`` with that version and the device. An entry with the same
fingerprint, server and device is reused. The start scripts refuse a model with no entry.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from typing import Any

from .common import EngineError, cache_entry_path, fail, load_workflow, write_atomic

PROG = "precompile_tilelang_kernels.sh"


def fingerprint(paths: list[str]) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(os.path.basename(p).encode() + b"\0")
        with open(p, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def server_version(server: str) -> str:
    try:
        res = subprocess.run([server, "--version"], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise EngineError(f"llama-server not found: {server} (set M1000_LLAMA_SERVER to the binary `make engine` "
                          "built)") from None
    except OSError as exc:
        raise EngineError(f"cannot run {server}: {exc.strerror or exc}") from None
    text = (res.stdout + res.stderr).strip()
    if res.returncode != 0:
        raise EngineError(f"{server} --version exited {res.returncode}: {text[-200:]}")
    return next((ln.strip() for ln in text.splitlines() if ln.startswith("version:")), text[:120])


def main() -> int:
    env = os.environ
    try:
        wf = load_workflow(env)
        cache = env["TILELANG_CACHE_DIR"]
        device = env.get("M1000_LLAMA_DEVICE") or "cpu"
        server = env.get("M1000_LLAMA_SERVER") or "llama-server"
        version = server_version(server)
        print(f"[precompile] {server}: {version} ({device})", flush=True)
        os.makedirs(os.path.join(cache, "llama.cpp"), exist_ok=True)
        done = 0
        for m in wf["models"]:
            if not m["supported"]:
                print(f"[precompile] {m['name']}: skipped ({m['why']})", flush=True)
                continue
            entry = cache_entry_path(cache, m["name"])
            t0 = time.monotonic()
            files = [m["model"]] + ([m["mmproj"]] if m["mmproj"] else [])
            fp = fingerprint(files)
            old: dict[str, Any] = {}
            if os.path.exists(entry):
                try:
                    with open(entry, encoding="utf-8") as fh:
                        old = json.load(fh)
                except (OSError, ValueError):
                    old = {}
            if (old.get("fingerprint"), old.get("device"), old.get("server"), old.get("path")) == \
                    (fp, device, version, m["path"]):
                print(f"[precompile] {m['name']}: cached ({entry})", flush=True)
                done += 1
                continue
            write_atomic(entry, json.dumps({"name": m["name"], "path": m["path"], "fingerprint": fp, "device": device,
                                            "server": version, "architecture": m["architecture"],
                                            "bytes": sum(os.path.getsize(f) for f in files)}, indent=2) + "\n")
            print(f"[precompile] {m['name']}: {m['architecture']} ({m['dtype']}), fingerprinted in "
                  f"{time.monotonic() - t0:.2f} s", flush=True)
            done += 1
    except EngineError as exc:
        return fail(PROG, str(exc))
    except (OSError, ValueError) as exc:
        return fail(PROG, f"{type(exc).__name__}: {exc}")
    print(f"[precompile] done: {done} model(s) in {cache}/llama.cpp", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
