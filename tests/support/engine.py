"""Where the real-engine tier's pieces are: the repository, its engine fixtures, the engine's interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "engine"


def engine_python() -> Path | None:
    """The interpreter with torch + transformers[serving] (``make engine``), or None."""
    raw = os.environ.get("M1000_TEST_ENGINE_PYTHON")
    path = Path(raw) if raw else REPO / ".venv-engine" / "bin" / "python"
    return path if path.exists() else None


def llama_server(timeout: float = 2400.0) -> Path | None:
    """The llama-server ``make engine`` built, waiting for a build in progress (``make test`` starts one in the
    background); None when there is none."""
    from simulator.engine.llamacpp import wait_built

    built = wait_built(timeout)
    return built.server if built is not None else None


def sections(name: str) -> dict[str, list[bytes]]:
    """A recorded fixture of ``tests/fixtures/engine/`` by its ``== name`` sections (raw lines)."""
    out: dict[str, list[bytes]] = {}
    current = ""
    for line in (FIXTURES / name).read_bytes().splitlines(keepends=True):
        if line.startswith(b"== "):
            current = line[3:].strip().decode()
            out[current] = []
        else:
            out[current].append(line)
    return out


def replay(lines: list[bytes], step: float = 0.01) -> list[tuple[float, bytes]]:
    """The recorded lines, one every ``step`` seconds after a request sent at t = 0."""
    return [(step * (i + 1), line) for i, line in enumerate(lines)]


def make_models(engine_py: Path, root: Path, engine: str, *args: str, timeout: float = 600) -> Path:
    """``python -m simulator make-models --engine <engine> ... root`` with the engine's interpreter, offline."""
    res = subprocess.run([str(engine_py), "-m", "simulator", "make-models", "--engine", engine, *args, str(root)],
                         capture_output=True, text=True, timeout=timeout, cwd=REPO,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    return root


def fleet_agent_run(env: dict[str, str], tarball: Path, models: str, root: Path, work: Path, run_id: str, module: str,
                    *extra: str, timeout: float = 400) -> tuple[int, dict]:
    """``fleet-agent run`` of a real-engine release (``env`` over this process's): its exit code and JSON."""
    from simulator.ports import free_port

    cmd = [sys.executable, "-m", "agent.cli", "run", str(tarball), "--models", models, "--model-root", str(root),
           "--workdir", str(work), "--run-id", run_id, "--module", module, "--server-port", str(free_port()),
           "--format", "json", *extra]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO, env={**os.environ, **env})
    assert res.stdout.strip(), res.stderr[-3000:]
    return res.returncode, json.loads(res.stdout)


def outcomes(out: dict) -> dict[str, dict]:
    """A run's outcomes by model key."""
    return {o["model_key"]: o for o in out["progress"]["outcomes"]}


