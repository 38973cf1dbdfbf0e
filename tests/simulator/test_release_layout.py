"""Fast tier: the release tarball's layout, determinism, baked knobs; stand-in models; CLI."""

from __future__ import annotations

import ast
import hashlib
import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from contract.records import MODEL_KEYS
from simulator import BuildError, SpecError, build_release, make_models
from simulator.build import RUNTIME_DIR, TEMPLATE_DIR

SCRIPTS = ("generate_tilelang_workflow.sh", "setup_env.sh", "precompile_tilelang_kernels.sh",
           "start_qwen3_server.sh", "start_qwen35_server.sh", "start_qwen35_fq_server.sh",
           "start_qwen36_fq_server.sh", "start_qwen3vl_server.sh", "run_tilelang_benchmark.sh",
           "tilelang_workflow_config.json")


def test_tarball_name_top_folder_and_seed_layout(tmp_path: Path) -> None:
    rel = build_release(tmp_path, version="1.4.1")
    assert rel.path.name == "SGLang-MUSA-M1000-M1000_1.4.1_sglang.tar.gz"
    assert rel.top == "20260803_M1000_1.4.1_sglang"
    assert rel.sha256 == hashlib.sha256(rel.path.read_bytes()).hexdigest()
    with tarfile.open(rel.path) as tar:
        members = {m.name: m for m in tar.getmembers()}
        for name in SCRIPTS:
            m = members[f"{rel.top}/scripts/ci/musa/{name}"]
            executable = name.endswith(".sh") and name != "setup_env.sh"
            assert bool(m.mode & 0o111) == executable, name
        for m in members.values():
            assert m.name.startswith(rel.top) and ".." not in m.name.split("/")
            assert m.isfile() or m.isdir()
            assert m.uid == 0 and m.gid == 0
        config, setup_env = (tar.extractfile(f"{rel.top}/scripts/ci/musa/{name}")
                             for name in ("tilelang_workflow_config.json", "setup_env.sh"))
        assert config is not None and setup_env is not None  # regular files
        cfg = json.load(config)
        assert isinstance(cfg["model_paths"], list) and len(cfg["model_paths"]) == 5
        env = setup_env.read().decode()
        assert 'TILELANG_CACHE_DIR="${TILELANG_CACHE_DIR:-' in env and "1.4.1" in env


def test_build_is_deterministic_and_knobs_are_baked(tmp_path: Path) -> None:
    a = build_release(tmp_path / "a")
    b = build_release(tmp_path / "b")
    assert a.sha256 == b.sha256
    c = build_release(tmp_path / "c", version="1.4.2", speed="qwen3:decode=0.9", noise=0.02, seed=5,
                      time_scale=100, faults="crash:qwen35", date="20260901")
    assert c.top == "20260901_M1000_1.4.2_sglang" and c.sha256 != a.sha256
    with tarfile.open(c.path) as tar:
        member = tar.extractfile(f"{c.top}/scripts/ci/musa/m1000_sim/knobs.json")
        assert member is not None  # a regular file
        knobs = json.load(member)
    assert knobs == {"speed": "qwen3:decode=0.9", "noise": 0.02, "seed": 5, "time_scale": 100.0,
                     "faults": "crash:qwen35"}


@pytest.mark.parametrize(("kw", "needle"), [
    ({"version": "1.4/../x"}, "version"),
    ({"date": "2026-08-03"}, "YYYYMMDD"),
    ({"date": "20261341"}, "calendar"),
    ({"speed": "qwen3:decode=x"}, "--speed"),
    ({"faults": "melt"}, "--fault"),
    ({"time_scale": 0}, "--time-scale"),
    ({"noise": -0.1}, "--noise"),
])
def test_build_rejects_bad_knobs(tmp_path: Path, kw: dict, needle: str) -> None:
    with pytest.raises((BuildError, SpecError), match=needle):
        build_release(tmp_path, **kw)
    assert not list(tmp_path.glob("*.tar.gz*"))  # nothing half-written left behind


def test_release_programs_use_only_the_standard_library() -> None:
    allowed = set(sys.stdlib_module_names) | {"__future__"}
    for path in RUNTIME_DIR.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: inside the release's own package
                    continue
                names = [(node.module or "").split(".")[0]]
            else:
                continue
            for n in names:
                assert n in allowed, f"{path.name} imports {n}"


# what each interpreter the release starts may skip: generate and precompile run at the start of every module's
# run (100 cheap modules start at once on 2 cores), the server once per key; each of these is 1-13 ms of CPU.
# json and typing: m1000_sim.jsonc (json's C scanner and encoder) and m1000_sim.record (typing.NamedTuple's syntax)
SLOW_TO_IMPORT = {"argparse", "uuid", "random", "hashlib", "_hashlib", "http", "json", "re", "typing", "runpy",
                  "platform", "dataclasses", "inspect", "statistics", "contextlib"}
SKIPPED_IMPORTS = {
    "workflow": SLOW_TO_IMPORT | {"socket", "threading", "socketserver", "selectors", "enum", "functools", "signal",
                                  "collections", "array", "bisect", "zlib"},  # m1000_sim.record: no collections
    # m1000_sim.net: _socket and _thread
    "server": SLOW_TO_IMPORT | {"socket", "socketserver", "selectors", "enum", "signal", "threading", "functools",
                                "collections", "array"},
    "bench": SLOW_TO_IMPORT | {"socket", "socketserver", "selectors", "enum", "threading", "signal", "collections",
                               "array", "functools", "bisect", "zlib"},
}


@pytest.mark.parametrize("entry", sorted(SKIPPED_IMPORTS))
def test_release_interpreters_load_only_the_standard_library_they_need(tmp_path: Path, entry: str) -> None:
    """What an interpreter of the release's scripts has loaded once its entry module is imported, as the scripts
    start it (``python3 -S -m m1000_sim.<entry>``): standard library only, without the modules above."""
    rel = build_release(tmp_path, version="9.9.9")
    with tarfile.open(rel.path) as tar:
        tar.extractall(tmp_path / "x", filter="data")
    musa = tmp_path / "x" / rel.top / "scripts" / "ci" / "musa"
    code = f"import sys, m1000_sim.{entry}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-S", "-c", code], cwd=musa, env={"PYTHONPATH": str(musa)},
                         capture_output=True, text=True, timeout=60, check=True).stdout.split()
    tops = {m.split(".")[0] for m in out}
    allowed = set(sys.stdlib_module_names) | {"m1000_sim", "__main__"}
    assert tops <= allowed, f"{entry} loads {sorted(tops - allowed)}"
    assert not tops & SKIPPED_IMPORTS[entry], f"{entry} loads {sorted(tops & SKIPPED_IMPORTS[entry])}"


def test_scripts_start_programs_without_runpy() -> None:
    """``python3 -m`` imports runpy and importlib.util (~3 ms per start): the scripts call the program's main."""
    musa = TEMPLATE_DIR / "scripts" / "ci" / "musa"
    starts = 0
    for script in sorted(musa.glob("*.sh")):
        text = script.read_text()
        assert " -m " not in text, f"{script.name} starts a program with python -m"
        starts += len(re.findall(r"^run_program \w+", text, re.MULTILINE))
    assert starts == 8  # generate, precompile, 5 servers, benchmark


def test_make_models_creates_identified_folders(tmp_path: Path) -> None:
    paths = make_models(tmp_path)
    assert set(paths) == set(MODEL_KEYS)
    for key, p in paths.items():
        assert p.name == MODEL_KEYS[key].model_dir
        cfg = json.loads((p / "config.json").read_text())
        assert cfg["_name_or_path"] == p.name
    assert make_models(tmp_path, ["qwen3"]) == {"qwen3": paths["qwen3"]}  # idempotent
    with pytest.raises(BuildError, match="unknown model key"):
        make_models(tmp_path, ["qwen9"])


def test_cli_build_release_and_make_models(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "simulator", "build-release", str(tmp_path), "--version", "1.5.0",
                          "--speed", "0.9", "--fault", "no-table:qwen3"], capture_output=True, text=True, check=True)
    digest, path = out.stdout.split()
    assert Path(path).name == "SGLang-MUSA-M1000-M1000_1.5.0_sglang.tar.gz"
    assert hashlib.sha256(Path(path).read_bytes()).hexdigest() == digest
    bad = subprocess.run([sys.executable, "-m", "simulator", "build-release", str(tmp_path), "--fault", "melt"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "unknown fault 'melt'" in bad.stderr
    mm = subprocess.run([sys.executable, "-m", "simulator", "make-models", str(tmp_path / "m"), "--keys", "qwen3vl"],
                        capture_output=True, text=True, check=True)
    assert mm.stdout.strip() == f"qwen3vl\t{tmp_path / 'm' / 'Qwen3-VL-8B'}"
