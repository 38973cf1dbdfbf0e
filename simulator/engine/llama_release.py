"""Build the llama.cpp release tarball (standard library only): all seven keys on ``llama-server``.

The seed's layout (:mod:`simulator.engine.release`, the steps both builders share); its programs are
the runtime's shared modules and its llama.cpp modules (:mod:`simulator.engine.runtime.llama_server`,
``llama_bench``, ``gguf``), copied as the package ``scripts/ci/musa/m1000_llama``, next to
``bench_config.json`` (the seed's table titles and columns, the GSM8K prompt indices and ground truths,
small profiles). The start scripts exec ``llama-server`` (``$M1000_LLAMA_SERVER``) on the model folder's
``model.gguf`` with each key's settings (:mod:`simulator.engine.runtime.llama_server` says how the
seed's variables map).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from contract.records import MODEL_KEYS
from simulator.build import BuildError, BuiltRelease
from simulator.engine.release import DEFAULT_PROFILES, EngineRelease, release_files, write
from simulator.fit import fitted

ENGINE = EngineRelease(
    engine="llama.cpp", package="m1000_llama", modules=("gguf.py", "llama_bench.py", "llama_server.py"),
    build="llama.cpp build: llama-server",
    exports=('export M1000_LLAMA_SERVER="${M1000_LLAMA_SERVER:-llama-server}"\n'
             'export M1000_LLAMA_DEVICE="${M1000_LLAMA_DEVICE:-cpu}"\n'),
    server="llama-server", precompile_what="llama-server's version, models fingerprinted",
    precompile_python='"$PY" -S')
DEFAULT_MTP: dict[str, Any] = {"prompts": 2, "input": 48, "output": 16}  # input 0: the seed's prompt lengths
DEFAULT_VISION: dict[str, Any] = {"inputs": [32, 128], "output": 8, "image": 224}


def bench_config(profiles: dict[str, Any], mtp: dict[str, Any], vision: dict[str, Any]) -> dict[str, Any]:
    """The benchmark's configuration: the seed's tables (titles, columns, names), the GSM8K prompt set, sizes."""
    _, seed = fitted()
    return {"schema": 1, "engine": ENGINE.engine, "keys": seed["keys"], "gsm8k": seed["gsm8k"], "profiles": profiles,
            "mtp": mtp, "vision": vision, "repeats": 2, "ctx_k": 16,
            "random_weights_note": "random-weight models: MTP acceptance and answers are measured and meaningless"}


def build_llama_release(out_dir: str | Path, *, version: str = "1.4.1-llama", date: str = "20260803",
                        profiles: dict[str, Any] | None = None, mtp: dict[str, Any] | None = None,
                        vision: dict[str, Any] | None = None) -> BuiltRelease:
    """Write ``SGLang-MUSA-M1000-M1000_<version>_sglang.tar.gz`` (llama.cpp) into ``out_dir``."""
    cfg = bench_config(dict(profiles or DEFAULT_PROFILES), dict(mtp or DEFAULT_MTP), dict(vision or DEFAULT_VISION))
    files = release_files(ENGINE, version=version, bench_config=cfg,
                          model_dirs=list(dict.fromkeys(s.model_dir for s in MODEL_KEYS.values())),
                          version_text=f"SGLang-MUSA M1000 {version} ({date}) llama.cpp release: llama-server "
                          "(random-weight GGUF models; SGLANG_USE_TL_MOE_GROUPED_GEMM recorded, no effect; MTP "
                          "acceptance with random weights is meaningless)\n")
    return write(out_dir, version, date, files)


def parse_sizes(spec: str, default: dict[str, Any], what: str) -> dict[str, Any]:
    """``"prompts=2,input=48,output=16"`` over ``default`` (integers; ``inputs`` takes ``a/b/c``)."""
    out = dict(default)
    for item in (x.strip() for x in spec.split(",") if x.strip()):
        name, eq, value = item.partition("=")
        if not eq or name not in default:
            raise BuildError(f"--{what} {spec!r}: expected NAME=VALUE with NAME in {', '.join(default)}")
        try:
            out[name] = [int(v) for v in value.split("/")] if isinstance(default[name], list) else int(value)
        except ValueError:
            raise BuildError(f"--{what} {spec!r}: {name} must be an integer") from None
    return out
