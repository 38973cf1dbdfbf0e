"""Build the real-engine release tarball (standard library only).

Same layout and file names as the seed's release (``<date>_M1000_<version>_sglang/scripts/ci/musa/...``);
its programs are :mod:`simulator.engine.runtime`, copied as the package
``scripts/ci/musa/m1000_engine``, next to ``bench_config.json`` (the seed's table titles
and columns, with small profiles). The start scripts exec ``transformers serve`` with
``$M1000_ENGINE_PYTHON`` on ``$M1000_ENGINE_DEVICE`` (default ``python3`` on ``cpu``).
"""

from __future__ import annotations

import json
from pathlib import Path

from contract.records import MODEL_KEYS
from simulator.build import (
    DEFAULT_MODEL_ROOT,
    MUSA,
    BuildError,
    BuiltRelease,
    release_mtime,
    write_release,
)
from simulator.fit import fitted

RUNTIME_DIR = Path(__file__).resolve().parent / "runtime"
RUNTIME_PKG = f"{MUSA}/m1000_engine"
SUPPORTED_KEYS = ("qwen3", "qwen35", "qwen35_fq", "qwen36_fq")  # MTP keys and qwen3vl are refused, and say why
# Small by default (CPU); the GPU run passes larger ones.
DEFAULT_PROFILES = {"no_prefix": [16, 64], "shared_prefix": [128], "prefix_new": 32, "output": 16}

_COMMON = """\
# Shared prologue of the release's scripts (sourced by them, not run on its own).
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="${PYTHON:-python3}"
export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"
"""

_SETUP_ENV = """\
# Environment of SGLang-MUSA @VERSION@ (real-engine build: transformers serve): source it.
_m1000_here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
_m1000_root="$(cd "$_m1000_here/../../.." && pwd)"
if [ ! -f "$_m1000_here/tilelang_workflow.json" ]; then
    echo "setup_env.sh: error: $_m1000_here/tilelang_workflow.json not found:" \
        "run scripts/ci/musa/generate_tilelang_workflow.sh first" >&2
    unset _m1000_here _m1000_root
    return 1 2>/dev/null || exit 1
fi
export SGLANG_MUSA_RELEASE_DIR="$_m1000_root"
export SGLANG_MUSA_VERSION="@VERSION@"
export SGLANG_MUSA_ENGINE="transformers"
export TILELANG_WORKFLOW_FILE="$_m1000_here/tilelang_workflow.json"
export TILELANG_CACHE_DIR="${TILELANG_CACHE_DIR:-$_m1000_root/.tilelang_cache}"
export M1000_ENGINE_PYTHON="${M1000_ENGINE_PYTHON:-python3}"
export M1000_ENGINE_DEVICE="${M1000_ENGINE_DEVICE:-cpu}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
unset _m1000_here _m1000_root
"""

_GENERATE = """\
#!/usr/bin/env bash
# Generate the workflow (tilelang_workflow.json) from tilelang_workflow_config.json.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
exec "$PY" -S -m m1000_engine.workflow --config "$HERE/tilelang_workflow_config.json" \\
    --out "$HERE/tilelang_workflow.json"
"""

_PRECOMPILE = """\
#!/usr/bin/env bash
# Prepare the workflow's models for serving (load, warm-up, fingerprint) into $TILELANG_CACHE_DIR.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
exec "${M1000_ENGINE_PYTHON:-python3}" -m m1000_engine.precompile
"""

_BENCH = """\
#!/usr/bin/env bash
# Benchmark the running server: MODEL_KEY=<key> scripts/ci/musa/run_tilelang_benchmark.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
exec "$PY" -S -m m1000_engine.bench
"""

_START = """\
#!/usr/bin/env bash
# Start transformers serve for @MODEL@ in the foreground on $SERVER_HOST:$SERVER_PORT.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
MODEL="@MODEL@"
EXTRA=()
@READ_EXTRA@
exec "$PY" -S -m m1000_engine.serve --workflow-model "$MODEL" --host "${SERVER_HOST:-127.0.0.1}" \\
    --port "${SERVER_PORT:-30000}" --max-total-tokens 16384 -- ${EXTRA[@]+"${EXTRA[@]}"}
"""

_EXTRA_VARS = {"start_qwen35_server.sh": "QWEN35_EXTRA_SERVER_ARGS",
               "start_qwen35_fq_server.sh": "QWEN35_FQ_EXTRA_SERVER_ARGS"}


def release_files(*, version: str, date: str, profiles: dict[str, object]) -> dict[str, tuple[bytes, int]]:
    """Relative path inside the top folder -> (content, mode)."""
    _, bench = fitted()
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
        text = _START.replace("@MODEL@", model).replace("@READ_EXTRA@", read)
        files[f"{MUSA}/{script}"] = (text.encode(), 0o755)
    for src in sorted(RUNTIME_DIR.glob("*.py")):
        files[f"{RUNTIME_PKG}/{src.name}"] = (src.read_bytes(), 0o644)
    config = {**bench, "profiles": profiles, "repeats": 2, "engine": "transformers",
              "supported_keys": list(SUPPORTED_KEYS)}
    config.pop("gsm8k", None)
    files[f"{RUNTIME_PKG}/bench_config.json"] = (json.dumps(config, indent=1, ensure_ascii=False).encode(), 0o644)
    dirs = sorted({MODEL_KEYS[k].model_dir for k in SUPPORTED_KEYS})
    wf_config = {"model_paths": [f"{DEFAULT_MODEL_ROOT}/{d}" for d in dirs]}
    files[f"{MUSA}/tilelang_workflow_config.json"] = (json.dumps(wf_config, indent=2).encode() + b"\n", 0o644)
    files["VERSION"] = (f"SGLang-MUSA M1000 {version} ({date}) real-engine release: transformers serve\n".encode(),
                        0o644)
    return files


def build_engine_release(out_dir: str | Path, *, version: str = "1.4.1-engine", date: str = "20260803",
                         profiles: dict[str, object] | None = None) -> BuiltRelease:
    """Write ``SGLang-MUSA-M1000-M1000_<version>_sglang.tar.gz`` (real engine) into ``out_dir``."""
    mtime = release_mtime(version, date)
    chosen = dict(DEFAULT_PROFILES if profiles is None else profiles)
    return write_release(out_dir, version, date, mtime, release_files(version=version, date=date, profiles=chosen))


def parse_profiles(spec: str, output: int) -> dict[str, object]:
    """``"16,64;128@32"`` (no-prefix inputs; shared-prefix inputs @ new tokens) -> the config's profiles."""
    plain, _, shared = spec.partition(";")
    new_part = "32"
    if "@" in shared:
        shared, _, new_part = shared.partition("@")
    try:
        no_prefix = [int(x) for x in plain.split(",") if x.strip()]
        shared_in = [int(x) for x in shared.split(",") if x.strip()]
        prefix_new = int(new_part)
    except ValueError:
        raise BuildError(f"--profiles {spec!r}: expected 'IN,IN;IN,IN@NEW' (integers)") from None
    if not no_prefix and not shared_in:
        raise BuildError(f"--profiles {spec!r}: no profile")
    if any(x < 1 for x in no_prefix + shared_in) or any(x <= prefix_new for x in shared_in) or output < 2:
        raise BuildError(f"--profiles {spec!r}: inputs must be positive, shared-prefix inputs above NEW, output >= 2")
    return {"no_prefix": no_prefix, "shared_prefix": shared_in, "prefix_new": prefix_new, "output": output}
