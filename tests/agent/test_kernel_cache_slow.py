"""The fleet's kernel cache with real processes: ``fleet-agent run`` of five simulated modules sharing one store.

Two modules compile and publish identical archives; the third fetches, verifies and runs its servers on them
without compiling; a module with another driver compiles itself; an archive corrupted in the store is refused and
the module compiles (and its publication puts the right bytes back).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import simulator
from agent.store import RunStore
from contract.kernel_store import read_fetches, read_publications
from simulator.cheap import cheap_module_env
from simulator.ports import free_port
from tests.support.procs import nothing_left_under

pytestmark = pytest.mark.slow
ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    with nothing_left_under(tmp_path_factory.mktemp("kcache")) as base:
        built = simulator.build_release(base / "dist", noise=0.0, time_scale=50.0)
        simulator.make_models(base / "models")
        yield built, base


def _run(fleet, module: str, *, driver: str = "3.0.0-sim", summary: list[str] | None = None) -> dict:
    built, base = fleet
    env = {**os.environ, **cheap_module_env(time_scale=50.0, telemetry_period=1.0), "FLEET_PROBE": "false",
           "FLEET_KERNEL_CACHE": "true", "FLEET_KERNEL_CACHE_DIR": str(base / "store"),
           "PATH": f"{simulator.DEVICE_TOOL_DIR}{os.pathsep}{os.environ['PATH']}", simulator.ENV_DRIVER: driver}
    cmd = [sys.executable, "-m", "agent.cli", "run", str(built.path), "--models", "qwen3", "--model-root",
           str(base / "models"), "--workdir", str(base / module), "--run-id", "r1", "--module", module,
           "--server-port", str(free_port()), "--format", "json"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    if summary is not None:
        summary.append(res.stderr)
    return json.loads(res.stdout)["progress"]


def _precompile(base: Path, module: str) -> list[tuple[str, str]]:
    return [(e["status"], e["message"]) for e in RunStore(base / module).events("r1") if e["step"] == "precompile"
            and e["status"] != "start"]


def _compiled(base: Path, module: str) -> bool:
    """The release's precompile script compiled kernels in this module's run."""
    logs = RunStore(base / module).logs_dir("r1")
    return any("compiling 8 TileLang kernels" in p.read_text() for p in logs.glob("*-precompile.log"))


def test_two_compile_the_third_fetches_another_driver_compiles_a_corrupt_archive_is_refused(fleet) -> None:
    built, base = fleet
    first, second = _run(fleet, "m1"), _run(fleet, "m2")
    assert first["kernel_cache"]["action"] == second["kernel_cache"]["action"] == "compiled"
    assert first["kernel_cache"]["published"] and second["kernel_cache"]["published"]
    assert first["kernel_cache"]["why"] == ("no cache published for this release, model set, device class and "
                                            "environment")
    digest = first["kernel_cache"]["archive"]
    assert second["kernel_cache"]["archive"] == digest  # compiled independently, byte-identical
    assert second["kernel_cache"]["why"].startswith(f"cache {digest[:12]} compiled by 1 module(s) (m1); 2 needed")

    said: list[str] = []
    third = _run(fleet, "m3", summary=said)
    assert (f"run r1 on m3: done, {third['rows']} rows, precompile fetched {digest[:12]} (fleet kernel cache)"
            in " ".join(said[0].split()))
    assert third["kernel_cache"] == {"action": "fetched", "archive": digest, "key": first["kernel_cache"]["key"],
                                     "published": False, "why": ""}
    assert not _compiled(base, "m3") and _compiled(base, "m1") and _compiled(base, "m2")
    assert (third["precompile_source"], first["precompile_source"]) == ("fetched", "compiled")
    assert third["precompile_s"] < 1.0 < first["precompile_s"] * 3  # a fetch of 9 files; a compile of 0.36 s
    assert [s for s, _ in _precompile(base, "m3")] == ["fetched"]
    assert "compiled by m1, m2" in _precompile(base, "m3")[0][1]
    sha16 = built.sha256[:16]
    kernels = sorted(p.relative_to(base / "m1").as_posix().split("/", 4)[-1]
                     for p in (base / "m1" / "cache" / "tilelang" / sha16).rglob("*") if p.is_file())
    fetched = sorted(p.relative_to(base / "m3").as_posix().split("/", 4)[-1]
                     for p in (base / "m3" / "cache" / "tilelang" / sha16).rglob("*") if p.is_file())
    assert fetched == kernels and len(kernels) == 9
    server_logs = "".join(p.read_text() for p in RunStore(base / "m3").logs_dir("r1").glob("*-server-*.log"))
    assert "no precompiled TileLang kernels" not in server_logs
    assert third["rows"] == first["rows"] > 0

    other = _run(fleet, "m4", driver="3.1.0-sim")
    assert other["kernel_cache"]["action"] == "compiled" and _compiled(base, "m4")
    assert other["kernel_cache"]["why"].startswith("a cache of this release exists only for another environment "
                                                   "(driver 3.0.0-sim,")
    assert other["kernel_cache"]["archive"] != digest or other["kernel_cache"]["key"] != first["kernel_cache"]["key"]

    folder = base / "store" / sha16 / first["kernel_cache"]["key"]
    archive = folder / f"{digest}.tar"
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0xFF
    archive.write_bytes(bytes(data))
    fifth = _run(fleet, "m5")
    assert fifth["kernel_cache"]["action"] == "compiled" and _compiled(base, "m5")
    status, message = _precompile(base, "m5")[0]
    assert status == "refused" and message.startswith(f"kernel cache: archive {digest[:12]} refused: sha256 ")
    assert message.endswith("(corrupt or replaced); compiling")
    assert fifth["kernel_cache"]["archive"] == digest  # its own compile: the same bytes, put back in the store
    assert hashlib.sha256(archive.read_bytes()).hexdigest() == digest
    assert [p.module for p in read_publications(folder / "compiled")] == ["m1", "m2", "m5"]
    assert [f.module for f in read_fetches(folder / "fetched")] == ["m3"]
