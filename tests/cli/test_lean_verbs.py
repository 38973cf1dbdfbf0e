"""Verbs that read no rows import no row machinery (issue 47, item 6): ``fleetctl --help``, ``version``,
``runs`` and ``status`` of a judged run leave pandas, pyarrow, numpy, scipy, Celery, kombu, FastAPI, psycopg and
paramiko unimported. A guard for the start-up figures ``bench/cli.py`` measures: an import moved to a module's
top that drags one of these into a light verb fails here, by name, before it shows as CPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from contract.records import RunProgress, RunState
from controller.history import History

HEAVY = ("pandas", "pyarrow", "numpy", "scipy", "celery", "kombu", "fastapi", "psycopg", "paramiko", "fabric")
PROBE = (
    "import atexit, sys\n"
    f"HEAVY = {HEAVY!r}\n"
    "atexit.register(lambda: sys.__stderr__.write(\n"
    "    'LOADED ' + ' '.join(m for m in HEAVY if m in sys.modules) + '\\n'))\n"
    "from controller.cli.app import main\n"
    "sys.argv = ['fleetctl', *sys.argv[1:]]\n"
    "main()\n"
)
ENDED = "20261130-000000-ended"


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("lean")
    (home / "inventory.toml").write_text('[[module]]\nname = "m0"\nhost = "127.0.0.1"\nssh_user = "u"\n')
    h = History(home / "history.sqlite")
    h.create_run(ENDED, release="1.4.1", models=["qwen3"], modules=["m0"])
    now = time.time()
    h.upsert_progress_many([RunProgress(run_id=ENDED, module="m0", release="1.4.1", state=RunState.DONE,
                                        step="done", keys_total=1, keys_done=1, updated_at=now,
                                        started_at=now - 5, finished_at=now)])
    h.set_run_state(ENDED, "done", verdict="pass", line=f"PASS {ENDED} (1.4.1 vs baseline:1.4.1:v1)")
    h.close()
    return home


@pytest.mark.parametrize("argv", [["--help"], ["version"], ["runs"], ["status", ENDED]],
                         ids=["help", "version", "runs", "status-judged"])
def test_a_verb_that_reads_no_rows_imports_no_row_machinery(home: Path, argv: list[str]) -> None:
    env = dict(os.environ, FLEET_INVENTORY=str(home / "inventory.toml"), FLEET_HISTORY=str(home / "history.sqlite"),
               FLEET_DATA_DIR=str(home / "data"), FLEET_BROKER_URL="filesystem://", COLUMNS="120")
    env.pop("FLEET_CONFIG", None)
    proc = subprocess.run([sys.executable, "-c", PROBE, *argv], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    if argv[0] == "status":
        assert "verdict: pass" in proc.stdout  # shown as recorded, not judged again
    loaded = [line for line in proc.stderr.splitlines() if line.startswith("LOADED")]
    assert loaded == ["LOADED "], f"fleetctl {' '.join(argv)} imported {loaded[-1][7:] if loaded else '?'}"
