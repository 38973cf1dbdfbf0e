"""``precompile_tilelang_kernels.sh``: prepare every supported model of the workflow for serving.

Runs with the engine's interpreter (``$M1000_ENGINE_PYTHON``: torch + transformers). For each
model it fingerprints the checkpoint (sha256 of config.json and the weights), and unless
``$TILELANG_CACHE_DIR/engine/<model>.json`` already holds that fingerprint for this device,
loads the model, runs a warm-up generation (which exercises every layer's kernels on the
device) and writes the entry: fingerprint, device, dtype, parameter count, load and warm-up
times. The start scripts refuse a model with no entry, as a real release refuses kernels
that were never compiled.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from typing import Any

from .common import EngineError, cache_entry_path, fail, load_workflow, write_atomic

PROG = "precompile_tilelang_kernels.sh"


def fingerprint(path: str) -> str:
    h = hashlib.sha256()
    for name in sorted(os.listdir(path)):
        if name == "config.json" or name.endswith(".safetensors"):
            h.update(name.encode() + b"\0")
            with open(os.path.join(path, name), "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
    return h.hexdigest()


def prepare(model: dict[str, Any], device: str) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.monotonic()
    tok = AutoTokenizer.from_pretrained(model["path"])
    lm = AutoModelForCausalLM.from_pretrained(model["path"], dtype="auto").to(device)
    loaded = time.monotonic() - t0
    ids = tok("w1 w2 w3 w4 w5 w6 w7 w8", return_tensors="pt").input_ids.to(device)
    t1 = time.monotonic()
    with torch.inference_mode():
        lm.generate(ids, max_new_tokens=4, do_sample=False)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return {"load_s": round(loaded, 3), "warmup_s": round(time.monotonic() - t1, 3),
            "dtype": str(next(lm.parameters()).dtype).removeprefix("torch."),
            "parameters": sum(p.numel() for p in lm.parameters()),
            "torch": torch.__version__}


def main() -> int:
    env = os.environ
    try:
        wf = load_workflow(env)
        cache = env["TILELANG_CACHE_DIR"]
        device = env.get("M1000_ENGINE_DEVICE") or "cpu"
        os.makedirs(os.path.join(cache, "engine"), exist_ok=True)
        done = 0
        for m in wf["models"]:
            if not m["supported"]:
                print(f"[precompile] {m['name']}: skipped ({m['why']})", flush=True)
                continue
            entry = cache_entry_path(cache, m["name"])
            fp = fingerprint(m["path"])
            if os.path.exists(entry):
                try:
                    with open(entry, encoding="utf-8") as fh:
                        old = json.load(fh)
                except (OSError, ValueError):
                    old = {}
                if old.get("fingerprint") == fp and old.get("device") == device and old.get("path") == m["path"]:
                    print(f"[precompile] {m['name']}: cached ({entry})", flush=True)
                    done += 1
                    continue
            info = prepare(m, device)
            write_atomic(entry, json.dumps({"name": m["name"], "path": m["path"], "fingerprint": fp,
                                            "device": device, **info}, indent=2) + "\n")
            print(f"[precompile] {m['name']}: {info['parameters']} parameters ({info['dtype']}) on {device}: "
                  f"loaded in {info['load_s']:.2f} s, warm-up {info['warmup_s']:.2f} s", flush=True)
            done += 1
    except EngineError as exc:
        return fail(PROG, str(exc))
    except (ImportError, OSError, RuntimeError, ValueError) as exc:
        return fail(PROG, f"{type(exc).__name__}: {exc}")
    print(f"[precompile] done: {done} model(s) in {cache}/engine", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
