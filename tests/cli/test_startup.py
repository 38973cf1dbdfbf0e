"""What ``fleetctl`` imports to start (issue 18): ``--help`` only typer and the command signatures,
``runs`` the run history and settings (the broker only when the history holds a run as running), ``status``
of a running run the broker too but no report stack. Each verb runs in a fresh interpreter, which then lists
the packages it loaded, so that an import moved back to the top of a module fails here rather than in
``bench/cli.py``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from contract.settings import RESULT_EXPIRES
from controller.history import History

ROOT = Path(__file__).resolve().parents[2]

# What no verb below may load: the controller extras (reports, SSH, HTTP API).
EXTRAS = {"pandas", "numpy", "scipy", "pyarrow", "matplotlib", "jinja2", "fabric", "paramiko", "invoke",
          "fastapi", "uvicorn", "starlette"}
BROKER = {"celery", "kombu", "redis", "billiard", "amqp"}

LOADED = """
import contextlib, io, json, sys
from controller.cli.app import run
with contextlib.redirect_stdout(io.StringIO()):
    code = run(sys.argv[1:])
print(json.dumps({"code": code, "loaded": sorted({m.partition(".")[0] for m in sys.modules})}))
"""


def loaded_by(*args: str, code: int = 0) -> set[str]:
    """Top-level packages in ``sys.modules`` after ``fleetctl ARGS`` in a fresh interpreter (the
    environment is the test's: ``FLEET_*`` of the ``env`` fixture)."""
    r = subprocess.run([sys.executable, "-c", LOADED, *args], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout.splitlines()[-1])
    assert doc["code"] == code, (args, r.stderr)
    return set(doc["loaded"])


def test_help_loads_typer_only(env):
    """``--help`` builds the whole command tree from the signatures: no pydantic, rich, broker or extras."""
    loaded = loaded_by("--help")
    assert "typer" in loaded
    assert loaded & (EXTRAS | BROKER | {"pydantic", "pydantic_settings", "rich", "yaml"}) == set()


def test_version_loads_neither_the_history_nor_pydantic_models_nor_the_broker(env):
    """``fleetctl version`` reads the distribution's metadata and the records' schema number (issue 47): no
    controller.service, no contract.records (its pydantic models), no broker, no extras."""
    loaded = loaded_by("version")
    assert loaded & (EXTRAS | BROKER | {"rich", "sqlite3"}) == set()
    r = subprocess.run([sys.executable, "-c", LOADED.replace('sorted({m.partition(".")[0] for m in sys.modules})',
                                                             'sorted(sys.modules)'), "version"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    mods = set(json.loads(r.stdout.splitlines()[-1])["loaded"])
    assert {"contract.records", "controller.service.session", "controller.history"} & mods == set()


def test_status_of_a_judged_run_with_a_young_lost_module_reads_the_broker(env):
    """A module given up (LOST) may still send late rows while ``RESULT_EXPIRES`` runs: its judged run is synced."""
    from contract.records import RunState
    from controller import service
    from tests.support.cli import finished_run

    h = History(env / "history.sqlite")
    finished_run(h, "r1", modules=["m1", "m2"], state="done")
    h.set_run_state("r1", "done", verdict="pass", line="PASS r1")
    info = h.find_run("r1")
    with service.Session.load() as s:
        assert service.settled_view(s, info) is not None
        finished_run(h, "r2", modules=["m1"], state="failed", module_state=RunState.LOST)
        h.set_run_state("r2", "failed", verdict="failed", line="FAILED r2")
        lost = h.find_run("r2")
        assert service.settled_view(s, lost) is None
        assert service.settled_view(s, lost, now=lost.created_at + RESULT_EXPIRES + 1) is not None
    h.close()


def test_runs_of_ended_runs_reads_the_history_without_the_broker(env):
    h = History(env / "history.sqlite")
    h.create_run("r1", release="1.4.1", models=["qwen3"], modules=["m1"])
    h.set_run_state("r1", "done")
    loaded = loaded_by("runs", "-o", "json")
    assert loaded & (EXTRAS | BROKER | {"rich"}) == set()
    assert "sqlite3" in loaded


def test_runs_of_a_running_run_reads_the_broker_not_the_reports(env):
    """A run the history holds as running is shown in the state the broker holds (one read): the broker loads."""
    History(env / "history.sqlite").create_run("r1", release="1.4.1", models=["qwen3"], modules=["m1"])
    loaded = loaded_by("runs", "-o", "json")
    assert loaded & (EXTRAS | {"rich"}) == set()
    assert "celery" in loaded


def test_status_of_a_running_run_reads_the_broker_not_the_reports(env):
    """A running run has no verdict yet: no report (pandas) is built to show it."""
    History(env / "history.sqlite").create_run("r1", release="1.4.1", models=["qwen3"], modules=["m1"])
    loaded = loaded_by("status", "r1")
    assert loaded & EXTRAS == set()
    assert "celery" in loaded  # the live state: progress pulled from the (embedded) broker


def test_status_of_a_judged_run_shows_the_recorded_verdict_without_the_reports(env, capsys):
    """An ended run judged before (here against another baseline, as ``validate --baseline`` does)
    shows the verdict it got, unchanged and without building its report again."""
    from tests.support.cli import finished_run, run_main

    line = "REGRESSED r1 (1.4.2 vs baseline:1.4.0:v1): 1 regression(s)"
    h = History(env / "history.sqlite")
    finished_run(h, "r1", modules=["m1"], state="done")
    h.set_run_state("r1", "done", verdict="regressed", line=line)
    h.close()
    # issue 47: every module ended and the verdict is recorded: shown from the history, no broker read, no Celery
    assert loaded_by("status", "r1", code=1) & (EXTRAS | BROKER) == set()
    code, out, _ = run_main(capsys, "status", "r1")
    assert code == 1
    assert f"verdict: regressed - {line}" in out
    info = History(env / "history.sqlite").find_run("r1")
    assert (info.verdict, info.verdict_line) == ("regressed", line)


def test_a_resumed_run_loses_its_recorded_verdict_line(env):
    """A run set running again is judged afresh when it ends: its old line is not shown for the new end."""
    h = History(env / "history.sqlite")
    h.create_run("r1", release="1.4.1", models=["qwen3"], modules=["m1"])
    h.set_run_state("r1", "failed", verdict="failed", line="FAILED r1: some modules failed")
    assert h.find_run("r1").verdict_line == "FAILED r1: some modules failed"
    h.set_run_state("r1", "running")
    assert h.find_run("r1").verdict_line is None
    h.set_run_state("r1", "done")  # the sync's state change, no verdict yet
    assert h.find_run("r1").verdict_line is None


def test_a_history_without_verdict_lines_gets_the_column(tmp_path):
    """A history written before ``runs.verdict_line``: opened, it has the column (NULL), and a verdict recorded
    afterwards keeps its line."""
    import sqlite3

    path = tmp_path / "old.sqlite"
    History(path).create_run("r0", release="1.4.1", models=["qwen3"], modules=["m1"])
    with sqlite3.connect(path) as c:
        c.execute("ALTER TABLE runs DROP COLUMN verdict_line")
    h = History(path)
    assert h.find_run("r0").verdict_line is None
    h.set_run_state("r0", "done", verdict="pass", line="PASS r0")
    assert h.find_run("r0").verdict_line == "PASS r0"


def test_a_history_without_module_models_gets_the_column(tmp_path):
    """A history written before ``runs.module_models``: opened, it has the column, and each of its runs asked every
    module for all of its model keys."""
    import sqlite3

    path = tmp_path / "old.sqlite"
    History(path).create_run("r0", release="1.4.1", models=["qwen3", "qwen35"], modules=["m1"])
    with sqlite3.connect(path) as c:
        c.execute("ALTER TABLE runs DROP COLUMN module_models")
    h = History(path)
    assert h.find_run("r0").module_models == {} and h.find_run("r0").models_of("m1") == ("qwen3", "qwen35")
    h.create_run("r1", release="1.4.1", models=["qwen3", "qwen35"], modules=["m1", "m2"],
                 module_models={"m2": ["qwen35"]})
    assert h.find_run("r1").models_of("m2") == ("qwen35",) and h.find_run("r1").models_of("m1") == ("qwen3", "qwen35")


def test_a_recorded_verdict_line_prints_whole_on_one_line_brackets_and_all(env, capsys):
    """A key outlier is written ``m05[qwen35]`` and every finding carries ``[low, high]``: rich markup took
    ``[qwen35]`` for a tag and dropped it, and a line longer than the 200 columns of a pipe was wrapped."""
    from tests.support.cli import finished_run, run_main

    line = ("REGRESSED r1 (1.4.2 vs baseline:1.4.0:v1): 1 regression(s): fleet: qwen3 decode_tps -8.1% [-8.4%, -7.6%]"
            " vs baseline (tpot_ms +8.8%); 2 outlier(s): m05[qwen35] 0.80x [0.79, 0.81], sim-04 0.87x [0.86, 0.87]; "
            "release benchmark disagrees with the probe on 1 figure(s): m02[qwen3]")
    assert len(line) > 200
    h = History(env / "history.sqlite")
    finished_run(h, "r1", modules=["m1"], state="done")
    h.set_run_state("r1", "done", verdict="regressed", line=line)
    h.close()
    code, out, _ = run_main(capsys, "status", "r1")
    assert code == 1
    assert f"verdict: regressed - {line}\n" in out


def test_a_history_without_started_by_gets_the_column(tmp_path):
    """A history written before ``runs.started_by``: opened, it has the column ('': not known, which the API takes
    as another user's run), and the user is then recorded once (a resume keeps the first)."""
    import sqlite3

    path = tmp_path / "old.sqlite"
    History(path).create_run("r0", release="1.4.1", models=["qwen3"], modules=["m1"])
    with sqlite3.connect(path) as c:
        c.execute("ALTER TABLE runs DROP COLUMN started_by")
    h = History(path)
    assert h.find_run("r0").started_by == ""
    h.set_started_by("r0", "alice")
    h.set_started_by("r0", "bob")
    assert h.find_run("r0").started_by == "alice"


def test_every_lazy_service_name_resolves_and_none_is_missing():
    """``controller.service`` loads its names by a name -> module table (PEP 562): the table, ``__all__`` and the
    modules agree, so a name renamed or moved fails here rather than at a user's first call."""
    from controller import service
    from controller.service import _LAZY

    assert set(_LAZY) == set(service.__all__)
    for name in service.__all__:
        assert getattr(service, name) is not None, name


def test_help_lists_the_verbs_as_a_user_meets_them(capsys):
    """Issue 51: ``fleetctl --help`` listed bisect and compare-releases before validate. Every verb has its place in
    HELP_ORDER (a new one must be given one), and --help lists them in that order."""
    import typer.main

    from controller.cli.app import HELP_ORDER, build_app
    from tests.support.cli import run_main

    assert {n for n, c in typer.main.get_group(build_app()).commands.items() if not c.hidden} == set(HELP_ORDER)
    code, out, _ = run_main(capsys, "--help")
    listed = [line.split()[0] for line in out.split("Commands:", 1)[1].splitlines() if line.startswith("  ")]
    assert code == 0 and listed == list(HELP_ORDER)
