"""The one release runtime (``simulator/engine/runtime/``), as each engine's release carries it.

Parametrised over the two engines: every module of the runtime is shared or one engine's own; each
engine module answers every hook the shared programs call; each tarball carries the shared programs
byte for byte and its engine's, nothing else; and a release, unpacked away from this tree, runs its own
programs with ``python -S`` (no site-packages, no repository on the path): the workflow, the start
script's refusal of an unprepared model, the benchmark's refusal of what it cannot measure.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from contract.records import MODEL_KEYS
from simulator.engine import build, llama_release
from simulator.engine.release import RUNTIME_DIR, SHARED_MODULES, EngineRelease
from simulator.engine.runtime.common import ENGINES, load_engine

RELEASES: dict[str, tuple[Any, EngineRelease]] = {
    "transformers": (build.build_engine_release, build.ENGINE),
    "llama.cpp": (llama_release.build_llama_release, llama_release.ENGINE),
}
HOOKS = ("describe", "summary", "identity", "model_files", "prepare", "extra_options", "server_argv", "exec_env",
         "refusal", "model_sizes", "request_fields", "run_table")
SETTINGS = ("NAME", "LABEL", "CACHE", "DEVICE_VAR", "START_HINT", "RECONNECT", "WARM_EACH_SHAPE", "CHECK_SERVED_ID",
            "BENCH_NOTE")
QWEN3 = MODEL_KEYS["qwen3"].model_dir
VL = MODEL_KEYS["qwen3vl"].model_dir


def test_every_runtime_module_is_shared_or_one_engines_own():
    own = [set(spec.modules) for _, spec in RELEASES.values()]
    assert {p.name for p in RUNTIME_DIR.glob("*.py")} == set(SHARED_MODULES) | own[0] | own[1]
    assert not own[0] & own[1] and not (own[0] | own[1]) & set(SHARED_MODULES)
    assert set(RELEASES) == set(ENGINES)


@pytest.mark.parametrize("engine", RELEASES)
def test_the_engine_module_answers_every_hook_of_the_shared_programs(engine):
    mod = load_engine(engine)
    missing = [h for h in HOOKS if not callable(getattr(mod, h, None))] + [s for s in SETTINGS if not hasattr(mod, s)]
    assert not missing, f"{mod.__name__} lacks {missing}"
    assert engine == mod.NAME and f"{mod.__name__.rsplit('.', 1)[1]}.py" in RELEASES[engine][1].modules


def _gguf(arch: str) -> bytes:
    """A GGUF header naming the architecture and f16 weights (what the workflow reads)."""
    def kv(key: str, kind: int, value: bytes) -> bytes:
        return struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", kind) + value

    return (b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + kv("general.architecture", 8, struct.pack("<Q", len(arch))
            + arch.encode()) + kv("general.file_type", 4, struct.pack("<I", 1)))


def _models(engine: str, root: Path) -> list[Path]:
    """qwen3's folder, served by the engine, and Qwen3-VL's, which it does not serve."""
    served, other = root / QWEN3, root / VL
    for d in (served, other):
        d.mkdir(parents=True)
    if engine == "transformers":
        (served / "config.json").write_text(json.dumps({"model_type": "qwen3_moe", "vocab_size": 2048}))
        (served / "model.safetensors").write_bytes(b"")
        (other / "config.json").write_text(json.dumps({"model_type": "qwen3_vl"}))
    else:
        (served / "model.gguf").write_bytes(_gguf("qwen3moe"))
    return [served, other]


@pytest.fixture(params=list(RELEASES))
def unpacked(request, tmp_path) -> tuple[str, Path, EngineRelease]:
    """A release of the engine, unpacked: (engine, its scripts/ci/musa folder, its spec)."""
    builder, spec = RELEASES[request.param]
    built = builder(tmp_path / "dist")
    with tarfile.open(built.path) as tar:
        tar.extractall(tmp_path / "rel", filter="data")
    return request.param, tmp_path / "rel" / built.top / "scripts" / "ci" / "musa", spec


def test_the_tarball_carries_the_shared_programs_and_its_engines_only(unpacked):
    engine, musa, spec = unpacked
    pkg = musa / spec.package
    assert sorted(p.name for p in pkg.iterdir()) == sorted([*SHARED_MODULES, *spec.modules, "bench_config.json"])
    for name in (*SHARED_MODULES, *spec.modules):
        assert (pkg / name).read_bytes() == (RUNTIME_DIR / name).read_bytes(), name
    assert json.loads((pkg / "bench_config.json").read_text())["engine"] == engine
    assert f"-m {spec.package}.serve" in (musa / "start_qwen3_server.sh").read_text()


def _sh(musa: Path, script: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    line = f'source "{musa}/setup_env.sh" && "{musa}/{script}"' if script != "generate_tilelang_workflow.sh" \
        else f'"{musa}/{script}"'
    return subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=60, cwd=cwd, env=env)


def test_a_release_runs_its_own_programs_away_from_this_tree(unpacked, tmp_path):
    engine, musa, _ = unpacked
    served, other = _models(engine, tmp_path / "models")
    (musa / "tilelang_workflow_config.json").write_text(json.dumps({"model_paths": [str(served), str(other)]}))
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python3").symlink_to(sys.executable)  # the scripts' python3; -S: no site-packages, no simulator
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "HOME": str(tmp_path)}
    gen = _sh(musa, "generate_tilelang_workflow.sh", env, tmp_path)
    assert gen.returncode == 0, gen.stderr
    assert f"{QWEN3} (" in gen.stdout and ": supported" in gen.stdout and f"{VL}" in gen.stdout
    assert "NOT supported" in gen.stdout and f"model(s), engine {load_engine(engine).LABEL}" in gen.stdout
    start = _sh(musa, "start_qwen3_server.sh", env, tmp_path)
    assert start.returncode == 3 and f"start server {QWEN3}: error: {QWEN3}: not prepared" in start.stderr, start
    bench = _sh(musa, "run_tilelang_benchmark.sh", {**env, "MODEL_KEY": "nope"}, tmp_path)
    assert bench.returncode == 2 and "unknown MODEL_KEY 'nope'" in bench.stderr, bench.stderr
    mtp = _sh(musa, "run_tilelang_benchmark.sh", {**env, "MODEL_KEY": "qwen35_mtp"}, tmp_path)
    if engine == "transformers":  # no speculative decoding: refused before anything is measured
        assert mtp.returncode == 3 and "speculative decoding (MTP) is not supported" in mtp.stderr, mtp.stderr
    else:  # served, and its model is not in this workflow
        assert mtp.returncode == 1 and "is not in the workflow" in mtp.stderr, mtp.stderr
    assert not any("Traceback" in r.stderr for r in (gen, start, bench, mtp))
    assert os.path.exists(musa / "tilelang_workflow.json")
