"""What ``fleetctl`` imports to start (issue 18): ``--help`` only typer and the command signatures,
``runs`` the run history and settings (no broker), ``status`` of a running run the broker too but
no report stack. Each verb runs in a fresh interpreter, which then lists the packages it loaded,
so that an import moved back to the top of a module fails here rather than in ``bench/cli.py``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from controller.history import History

ROOT = Path(__file__).resolve().parents[2]

# What no verb below may load: the controller extras (reports, SSH, HTTP API).
EXTRAS = {"pandas", "numpy", "scipy", "pyarrow", "matplotlib", "jinja2", "fabric", "paramiko", "invoke",
          "fastapi", "uvicorn", "starlette"}
BROKER = {"celery", "kombu", "redis", "billiard", "amqp"}

LOADED = """
import contextlib, io, json, sys
from controller.cli import run
with contextlib.redirect_stdout(io.StringIO()):
    code = run(sys.argv[1:])
print(json.dumps({"code": code, "loaded": sorted({m.partition(".")[0] for m in sys.modules})}))
"""


def loaded_by(*args: str) -> set[str]:
    """Top-level packages in ``sys.modules`` after ``fleetctl ARGS`` in a fresh interpreter (the
    environment is the test's: ``FLEET_*`` of the ``env`` fixture)."""
    r = subprocess.run([sys.executable, "-c", LOADED, *args], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout.splitlines()[-1])
    assert doc["code"] == 0, (args, r.stderr)
    return set(doc["loaded"])


def test_help_loads_typer_only(env):
    """``--help`` builds the whole command tree from the signatures: no pydantic, rich, broker or extras."""
    loaded = loaded_by("--help")
    assert "typer" in loaded
    assert loaded & (EXTRAS | BROKER | {"pydantic", "pydantic_settings", "rich", "yaml"}) == set()


def test_runs_reads_the_history_without_the_broker(env):
    History(env / "history.sqlite").create_run("r1", release="1.4.1", models=["qwen3"], modules=["m1"])
    loaded = loaded_by("runs", "-o", "json")
    assert loaded & (EXTRAS | BROKER | {"rich"}) == set()
    assert "sqlite3" in loaded


def test_status_of_a_running_run_reads_the_broker_not_the_reports(env):
    """A running run has no verdict yet: no report (pandas) is built to show it."""
    History(env / "history.sqlite").create_run("r1", release="1.4.1", models=["qwen3"], modules=["m1"])
    loaded = loaded_by("status", "r1")
    assert loaded & EXTRAS == set()
    assert "celery" in loaded  # the live state: progress pulled from the (embedded) broker
