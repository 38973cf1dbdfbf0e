"""Build the llama.cpp release tarball (standard library only): all seven keys on ``llama-server``.

Same layout and file names as the seed's release; its programs are :mod:`simulator.engine.llama_runtime`,
copied as the package ``scripts/ci/musa/m1000_llama``, next to ``bench_config.json`` (the seed's table
titles and columns, the GSM8K prompt indices and ground truths, small profiles). The start scripts exec
``llama-server`` (``$M1000_LLAMA_SERVER``) on the model folder's ``model.gguf`` with each key's settings
(:mod:`simulator.engine.llama_runtime.serve` says how the seed's variables map).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from contract.records import MODEL_KEYS
from simulator.build import DEFAULT_MODEL_ROOT, MUSA, BuildError, BuiltRelease, release_mtime, write_release
from simulator.engine.build import _EXTRA_VARS
from simulator.fit import fitted

RUNTIME_DIR = Path(__file__).resolve().parent / "llama_runtime"
RUNTIME_PKG = f"{MUSA}/m1000_llama"
ENGINE = "llama.cpp"
# Small by default (CPU tests); the GPU run passes larger ones.
DEFAULT_PROFILES: dict[str, Any] = {"no_prefix": [16, 64], "shared_prefix": [128], "prefix_new": 32, "output": 16}
DEFAULT_MTP: dict[str, Any] = {"prompts": 2, "input": 48, "output": 16}  # input 0: the seed's prompt lengths
DEFAULT_VISION: dict[str, Any] = {"inputs": [32, 128], "output": 8, "image": 224}

_COMMON = """\
# Shared prologue of the release's scripts (sourced by them, not run on its own).
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="${PYTHON:-python3}"
export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"
"""

_SETUP_ENV = """\
# Environment of SGLang-MUSA @VERSION@ (llama.cpp build: llama-server): source it.
_m1000_here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
_m1000_root="$(cd "$_m1000_here/../../.." && pwd)"
if [ ! -f "$_m1000_here/tilelang_workflow.json" ]; then
    echo "setup_env.sh: error: $_m1000_here/tilelang_workflow.json not found:" \\
        "run scripts/ci/musa/generate_tilelang_workflow.sh first" >&2
    unset _m1000_here _m1000_root
    return 1 2>/dev/null || exit 1
fi
export SGLANG_MUSA_RELEASE_DIR="$_m1000_root"
export SGLANG_MUSA_VERSION="@VERSION@"
export SGLANG_MUSA_ENGINE="llama.cpp"
export TILELANG_WORKFLOW_FILE="$_m1000_here/tilelang_workflow.json"
export TILELANG_CACHE_DIR="${TILELANG_CACHE_DIR:-$_m1000_root/.tilelang_cache}"
export M1000_LLAMA_SERVER="${M1000_LLAMA_SERVER:-llama-server}"
export M1000_LLAMA_DEVICE="${M1000_LLAMA_DEVICE:-cpu}"
unset _m1000_here _m1000_root
"""

_GENERATE = """\
#!/usr/bin/env bash
# Generate the workflow (tilelang_workflow.json) from tilelang_workflow_config.json.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
exec "$PY" -S -m m1000_llama.workflow --config "$HERE/tilelang_workflow_config.json" \\
    --out "$HERE/tilelang_workflow.json"
"""

_PRECOMPILE = """\
#!/usr/bin/env bash
# Prepare the workflow's models for serving (llama-server's version, models fingerprinted) into $TILELANG_CACHE_DIR.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
exec "$PY" -S -m m1000_llama.precompile
"""

_BENCH = """\
#!/usr/bin/env bash
# Benchmark the running server: MODEL_KEY=<key> scripts/ci/musa/run_tilelang_benchmark.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
exec "$PY" -S -m m1000_llama.bench
"""

_START = """\
#!/usr/bin/env bash
# Start llama-server for @MODEL@ in the foreground on $SERVER_HOST:$SERVER_PORT.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
MODEL="@MODEL@"
EXTRA=()
@READ_EXTRA@
exec "$PY" -S -m m1000_llama.serve --workflow-model "$MODEL" --host "${SERVER_HOST:-127.0.0.1}" \\
    --port "${SERVER_PORT:-30000}" --max-total-tokens 16384 -- ${EXTRA[@]+"${EXTRA[@]}"}
"""


def bench_config(profiles: dict[str, Any], mtp: dict[str, Any], vision: dict[str, Any]) -> dict[str, Any]:
    """The benchmark's configuration: the seed's tables (titles, columns, names), the GSM8K prompt set, sizes."""
    _, seed = fitted()
    return {"schema": 1, "engine": ENGINE, "keys": seed["keys"], "gsm8k": seed["gsm8k"], "profiles": profiles,
            "mtp": mtp, "vision": vision, "repeats": 2, "ctx_k": 16,
            "random_weights_note": "random-weight models: MTP acceptance and answers are measured and meaningless"}


def release_files(*, version: str, date: str, profiles: dict[str, Any], mtp: dict[str, Any],
                  vision: dict[str, Any]) -> dict[str, tuple[bytes, int]]:
    """Relative path inside the top folder -> (content, mode)."""
    files: dict[str, tuple[bytes, int]] = {
        f"{MUSA}/_common.sh": (_COMMON.encode(), 0o644),
        f"{MUSA}/setup_env.sh": (_SETUP_ENV.replace("@VERSION@", version).encode(), 0o644),
        f"{MUSA}/generate_tilelang_workflow.sh": (_GENERATE.encode(), 0o755),
        f"{MUSA}/precompile_tilelang_kernels.sh": (_PRECOMPILE.encode(), 0o755),
        f"{MUSA}/run_tilelang_benchmark.sh": (_BENCH.encode(), 0o755),
    }
    for script in sorted({s.start_script for s in MODEL_KEYS.values()}):
        model = next(s.model_dir for s in MODEL_KEYS.values() if s.start_script == script)
        var = _EXTRA_VARS.get(script)
        read = f'read -r -a EXTRA <<< "${{{var}:-}}"' if var else ""
        files[f"{MUSA}/{script}"] = (_START.replace("@MODEL@", model).replace("@READ_EXTRA@", read).encode(), 0o755)
    for src in sorted(RUNTIME_DIR.glob("*.py")):
        files[f"{RUNTIME_PKG}/{src.name}"] = (src.read_bytes(), 0o644)
    cfg = bench_config(profiles, mtp, vision)
    files[f"{RUNTIME_PKG}/bench_config.json"] = (json.dumps(cfg, indent=1, ensure_ascii=False).encode(), 0o644)
    dirs = list(dict.fromkeys(s.model_dir for s in MODEL_KEYS.values()))
    wf_config = {"model_paths": [f"{DEFAULT_MODEL_ROOT}/{d}" for d in dirs]}
    files[f"{MUSA}/tilelang_workflow_config.json"] = (json.dumps(wf_config, indent=2).encode() + b"\n", 0o644)
    files["VERSION"] = (f"SGLang-MUSA M1000 {version} ({date}) llama.cpp release: llama-server (random-weight GGUF "
                        "models; SGLANG_USE_TL_MOE_GROUPED_GEMM recorded, no effect; MTP acceptance with random "
                        "weights is meaningless)\n".encode(), 0o644)
    return files


def build_llama_release(out_dir: str | Path, *, version: str = "1.4.1-llama", date: str = "20260803",
                        profiles: dict[str, Any] | None = None, mtp: dict[str, Any] | None = None,
                        vision: dict[str, Any] | None = None) -> BuiltRelease:
    """Write ``SGLang-MUSA-M1000-M1000_<version>_sglang.tar.gz`` (llama.cpp) into ``out_dir``."""
    mtime = release_mtime(version, date)
    files = release_files(version=version, date=date, profiles=dict(profiles or DEFAULT_PROFILES),
                          mtp=dict(mtp or DEFAULT_MTP), vision=dict(vision or DEFAULT_VISION))
    return write_release(out_dir, version, date, mtime, files)


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
