"""What both real-engine builders do (standard library only): the seed's layout, its scripts, the programs.

Same layout and file names as the seed's release (``<date>_M1000_<version>_sglang/scripts/ci/musa/...``).
The programs come from one source, :mod:`simulator.engine.runtime`: its shared modules and the engine's
own are copied into the tarball as the package ``scripts/ci/musa/<package>`` (so a release runs on a
module without this tree), next to the engine's ``bench_config.json`` (whose ``engine`` the programs
read to find their engine module). The engine's builder (:mod:`simulator.engine.build` for
transformers, :mod:`simulator.engine.llama_release` for llama.cpp) says what differs in an
:class:`EngineRelease`: the package, its modules, the environment, the benchmark's configuration.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract.records import MODEL_KEYS
from simulator.build import DEFAULT_MODEL_ROOT, MUSA, BuildError, BuiltRelease, release_mtime, write_release

RUNTIME_DIR = Path(__file__).resolve().parent / "runtime"
SHARED_MODULES = ("__init__.py", "bench.py", "common.py", "precompile.py", "serve.py", "workflow.py")
# Small by default (CPU); the GPU run passes larger ones.
DEFAULT_PROFILES: dict[str, Any] = {"no_prefix": [16, 64], "shared_prefix": [128], "prefix_new": 32, "output": 16}
EXTRA_VARS = {"start_qwen35_server.sh": "QWEN35_EXTRA_SERVER_ARGS",
              "start_qwen35_fq_server.sh": "QWEN35_FQ_EXTRA_SERVER_ARGS"}


@dataclass(frozen=True)
class EngineRelease:
    """What one engine's release differs in; the rest is the same for both."""

    engine: str  # bench_config.json's "engine" (the programs' key to their engine module)
    package: str  # the programs' package in scripts/ci/musa
    modules: tuple[str, ...]  # the engine's own modules of runtime/, beside SHARED_MODULES
    build: str  # setup_env.sh's first line says "(<build>)"
    exports: str  # setup_env.sh's engine-specific exports (shell lines)
    server: str  # what the start scripts exec, in words
    precompile_what: str  # what precompile_tilelang_kernels.sh does, in words
    precompile_python: str  # the interpreter it runs with (shell words)


_COMMON = """\
# Shared prologue of the release's scripts (sourced by them, not run on its own).
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="${PYTHON:-python3}"
export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"
"""

_SETUP_ENV = """\
# Environment of SGLang-MUSA @VERSION@ (@BUILD@): source it.
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
export SGLANG_MUSA_ENGINE="@ENGINE@"
export TILELANG_WORKFLOW_FILE="$_m1000_here/tilelang_workflow.json"
export TILELANG_CACHE_DIR="${TILELANG_CACHE_DIR:-$_m1000_root/.tilelang_cache}"
@EXPORTS@unset _m1000_here _m1000_root
"""

_GENERATE = """\
#!/usr/bin/env bash
# Generate the workflow (tilelang_workflow.json) from tilelang_workflow_config.json.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
exec "$PY" -S -m @PKG@.workflow --config "$HERE/tilelang_workflow_config.json" \\
    --out "$HERE/tilelang_workflow.json"
"""

_PRECOMPILE = """\
#!/usr/bin/env bash
# Prepare the workflow's models for serving (@WHAT@) into $TILELANG_CACHE_DIR.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
exec @PYTHON@ -m @PKG@.precompile
"""

_BENCH = """\
#!/usr/bin/env bash
# Benchmark the running server: MODEL_KEY=<key> scripts/ci/musa/run_tilelang_benchmark.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
exec "$PY" -S -m @PKG@.bench
"""

_START = """\
#!/usr/bin/env bash
# Start @SERVER@ for @MODEL@ in the foreground on $SERVER_HOST:$SERVER_PORT.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
MODEL="@MODEL@"
EXTRA=()
@READ_EXTRA@
exec "$PY" -S -m @PKG@.serve --workflow-model "$MODEL" --host "${SERVER_HOST:-127.0.0.1}" \\
    --port "${SERVER_PORT:-30000}" --max-total-tokens 16384 -- ${EXTRA[@]+"${EXTRA[@]}"}
"""


def _fill(template: str, **values: str) -> bytes:
    for name, value in values.items():
        template = template.replace(f"@{name}@", value)
    return template.encode()


def scripts(spec: EngineRelease, version: str) -> dict[str, tuple[bytes, int]]:
    """The seed's scripts (relative path -> (content, mode)): each runs the package's program."""
    pkg = spec.package
    files: dict[str, tuple[bytes, int]] = {
        f"{MUSA}/_common.sh": (_COMMON.encode(), 0o644),
        f"{MUSA}/setup_env.sh": (_fill(_SETUP_ENV, VERSION=version, BUILD=spec.build, ENGINE=spec.engine,
                                       EXPORTS=spec.exports), 0o644),
        f"{MUSA}/generate_tilelang_workflow.sh": (_fill(_GENERATE, PKG=pkg), 0o755),
        f"{MUSA}/precompile_tilelang_kernels.sh": (_fill(_PRECOMPILE, PKG=pkg, WHAT=spec.precompile_what,
                                                         PYTHON=spec.precompile_python), 0o755),
        f"{MUSA}/run_tilelang_benchmark.sh": (_fill(_BENCH, PKG=pkg), 0o755),
    }
    for script in sorted({s.start_script for s in MODEL_KEYS.values()}):
        model = next(s.model_dir for s in MODEL_KEYS.values() if s.start_script == script)
        var = EXTRA_VARS.get(script)
        read = f'read -r -a EXTRA <<< "${{{var}:-}}"' if var else ""
        files[f"{MUSA}/{script}"] = (_fill(_START, SERVER=spec.server, MODEL=model, READ_EXTRA=read, PKG=pkg), 0o755)
    return files


def programs(spec: EngineRelease) -> dict[str, tuple[bytes, int]]:
    """The runtime's shared modules and the engine's, copied from this tree into the package."""
    return {f"{MUSA}/{spec.package}/{name}": ((RUNTIME_DIR / name).read_bytes(), 0o644)
            for name in sorted(SHARED_MODULES + spec.modules)}


def release_files(spec: EngineRelease, *, version: str, bench_config: dict[str, Any], model_dirs: list[str],
                  version_text: str) -> dict[str, tuple[bytes, int]]:
    """Relative path inside the top folder -> (content, mode)."""
    files = {**scripts(spec, version), **programs(spec)}
    files[f"{MUSA}/{spec.package}/bench_config.json"] = (
        json.dumps({**bench_config, "engine": spec.engine}, indent=1, ensure_ascii=False).encode(), 0o644)
    wf_config = {"model_paths": [f"{DEFAULT_MODEL_ROOT}/{d}" for d in model_dirs]}
    files[f"{MUSA}/tilelang_workflow_config.json"] = (json.dumps(wf_config, indent=2).encode() + b"\n", 0o644)
    files["VERSION"] = (version_text.encode(), 0o644)
    return files


def write(out_dir: str | Path, version: str, date: str, files: dict[str, tuple[bytes, int]]) -> BuiltRelease:
    """Write ``SGLang-MUSA-M1000-M1000_<version>_sglang.tar.gz`` into ``out_dir``."""
    return write_release(out_dir, version, date, release_mtime(version, date), files)


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
