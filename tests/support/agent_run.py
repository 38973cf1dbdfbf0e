"""One ``fleet-agent run`` of a release on this machine, as a module runs it: its rows, nothing left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from contract.records import ResultRow
from simulator.ports import free_port
from tests.support.procs import processes_under

ROOT = Path(__file__).resolve().parents[2]


def agent_rows(tmp: Path, tarball: Path, run_id: str, module: str, keys: str, env: dict[str, str],
               timeout: float) -> list[ResultRow]:
    """``python -m agent.cli run`` of ``tarball`` for ``keys`` (models under ``tmp/models``, work under
    ``tmp/module``), ``env`` over this process's; fails the test on a non-zero exit or a process left under
    ``tmp`` (killed first)."""
    cmd = [sys.executable, "-m", "agent.cli", "run", str(tarball), "--models", keys, "--model-root",
           str(tmp / "models"), "--workdir", str(tmp / module), "--run-id", run_id, "--module", module,
           "--server-port", str(free_port()), "--format", "json"]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                             env={**os.environ, **env})
    finally:
        strays = processes_under(tmp)
        for p in strays:
            p.kill()
    assert res.returncode == 0, res.stderr[-3000:]
    assert not strays
    return [ResultRow.model_validate(r) for r in json.loads(res.stdout)["rows"]]
