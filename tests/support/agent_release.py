"""The agent tests' hand-made release (shell scripts of ``tests/agent/release``, the seed's tables), model
folders and agent configs (fixtures, for the agent and the pipeline-level telemetry tests)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent.executor import group_members
from agent.pipeline import AgentConfig
from agent.tables import parse_tables, seed_key_for
from contract.records import MODEL_KEYS, RunRequest
from simulator.ports import free_port
from tests.support.procs import processes_under

TEMPLATE = Path(__file__).resolve().parents[1] / "agent" / "release"
TOP = "20260803_M1000_1.4.1_sglang"


def seed_blocks(seed_text: str) -> dict[str, str]:
    """The seed's raw table text per model key (the VL key gets its two tables)."""
    lines = seed_text.replace("\r\n", "\n").split("\n")
    out: dict[str, str] = {}
    prev = None
    for t in parse_tables(seed_text):
        key = seed_key_for(t, prev)
        prev = key
        start = t.header_line - 1
        end = start
        while end < len(lines) and lines[end].strip():
            end += 1
        out[key] = out.get(key, "") + ("\n" if key in out else "") + "\n".join(lines[start:end]) + "\n"
    return out


@dataclass(frozen=True)
class Release:
    path: Path
    sha256: str


def build_release(out: Path, tables: dict[str, str], name: str = "release.tar.gz") -> Release:
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    with tarfile.open(path, "w:gz") as tar:
        tar.add(TEMPLATE, arcname=TOP)
        for key, text in tables.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{TOP}/tables/{key}.txt")
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return Release(path, hashlib.sha256(path.read_bytes()).hexdigest())


@pytest.fixture(scope="session")
def tables(seed_text: str) -> dict[str, str]:
    return seed_blocks(seed_text)


@pytest.fixture
def release(tmp_path: Path, tables: dict[str, str]) -> Release:
    return build_release(tmp_path / "dist", tables)


@pytest.fixture
def model_root(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    for spec in MODEL_KEYS.values():
        (root / spec.model_dir).mkdir(parents=True, exist_ok=True)
    return root


@pytest.fixture
def record_dir(tmp_path: Path) -> Path:
    d = tmp_path / "record"
    d.mkdir()
    return d


@pytest.fixture
def make_config(tmp_path: Path, record_dir: Path) -> Callable[..., AgentConfig]:
    def make(**kw: Any) -> AgentConfig:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_")}
        env["FAKE_RECORD_DIR"] = str(record_dir)
        env.update(kw.pop("env", {}))
        values: dict[str, Any] = {
            "module": "m-test", "workdir": tmp_path / "work", "server_port": free_port(),
            "ready_timeout": 20.0, "benchmark_timeout": 30.0, "stop_grace": 3.0, "poll_interval": 0.1,
            "port_free_timeout": 5.0, "base_env": env,
        }
        values.update(kw)
        return AgentConfig(**values)
    return make


@pytest.fixture
def make_request(release: Release, model_root: Path) -> Callable[..., RunRequest]:
    def make(models: tuple[str, ...] = ("qwen3",), **kw: Any) -> RunRequest:
        values: dict[str, Any] = {
            "run_id": "r1", "module": "m-test", "tarball": str(release.path), "sha256": release.sha256,
            "release": "fake-1.4.1", "models": models, "model_root": str(model_root),
        }
        values.update(kw)
        return RunRequest(**values)
    return make


def recorded_pgids(record_dir: Path) -> list[int]:
    return [json.loads(p.read_text())["pgid"] for p in record_dir.glob("server-*.json")]


@pytest.fixture
def no_leftovers(tmp_path: Path, record_dir: Path) -> Iterator[None]:
    """After the test: no process of the run remains (by process group and by working folder)."""
    yield
    left = {pgid: group_members(pgid) for pgid in recorded_pgids(record_dir)}
    strays = processes_under(tmp_path)
    for p in strays:  # clean up before failing, so one failure does not poison the machine
        p.kill()
    assert not {g: m for g, m in left.items() if m}, f"process groups left behind: {left}"
    assert not strays, f"processes left behind: {[p.cmdline() for p in strays]}"
