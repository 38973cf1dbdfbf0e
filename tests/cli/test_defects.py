"""The defects of issue 16 (and items 4 and 8 of issue 11 on the controller side), each
tried as a user would: ``fleetctl`` in this process, one line on stderr, the exit code."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from controller.history import History
from tests.support.cli import TARBALL, closed_port, finished_run, one_line, run_main

ROOT = Path(__file__).resolve().parents[2]


# 1. "verdict: regressed - regressed"
def test_verdict_line_is_the_reports(filled, capsys):
    code, out, err = run_main(capsys, "status", "run-b")
    assert code == 1, err
    line = next(ln for ln in out.splitlines() if ln.startswith("verdict:"))
    assert "regressed - regressed" not in line
    assert "REGRESSED run-b (1.4.1 vs baseline:1.4.1:v1): 1 regression(s): fleet: qwen3 decode_tps" in line


# 2. the controller extras missing: --help and the verbs that need nothing more still run
BLOCKER = """
import importlib.abc, sys
BLOCKED = {"paramiko", "fabric", "invoke", "pandas", "numpy", "scipy", "pyarrow", "matplotlib", "jinja2",
           "fastapi", "uvicorn", "starlette"}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Block())
sys.argv[0] = "fleetctl"
from controller.cli.app import main
main(sys.argv[1:])
"""


def _without_extras(env: Path, *args: str) -> subprocess.CompletedProcess[str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    e.update(FLEET_DATA_DIR=str(env / "fleet"), FLEET_INVENTORY=str(env / "inv.toml"),
             FLEET_HISTORY=str(env / "history.sqlite"), PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", BLOCKER, *args], env=e, capture_output=True, text=True, timeout=60,
                          cwd=env)


@pytest.mark.slow  # over the fast tier's 2 s CPU budget with a neighbour on the other core
def test_without_controller_extras(env):
    r = _without_extras(env, "--help")
    assert r.returncode == 0 and "validate" in r.stdout and "deploy" in r.stdout, r.stderr
    r = _without_extras(env, "devices")
    assert r.returncode == 0 and "m1" in r.stdout, r.stderr
    for verb in (["deploy"], ["report", "latest"], ["devices", "check"]):
        r = _without_extras(env, *verb)
        assert r.returncode == 2, (verb, r.stderr)
        assert "install m1000-fleet[controller]" in one_line(r.stderr), (verb, r.stderr)


# 3. ReportError, PushError, DeployError and pydantic's ValidationError end in one line, exit 2
def _errors() -> list[Exception]:
    from pydantic import BaseModel

    from controller.remote.deploy import DeployError
    from controller.remote.push import PushError
    from controller.report.model import ReportError

    class M(BaseModel):
        n: int

    try:
        M(n="x")  # type: ignore[arg-type]  # the bad value is the point
    except Exception as exc:  # the very error pydantic raises
        validation = exc
    return [ReportError("report went wrong"), PushError("push went wrong"), DeployError("deploy went wrong"),
            validation]


@pytest.mark.parametrize("i", range(4), ids=["report", "push", "deploy", "validation"])
def test_user_errors_are_one_line(env, capsys, monkeypatch, i):
    exc = _errors()[i]

    def boom(*a, **k):
        raise exc

    History(env / "history.sqlite").close()
    monkeypatch.setattr(History, "runs", boom)
    code, _, err = run_main(capsys, "runs")
    line = one_line(err)
    assert code == 2 and "Traceback" not in err and line.startswith("fleetctl: error: ")
    if i == 3:
        assert "n:" in line and "integer" in line
    else:
        assert "went wrong" in line


def test_bad_setting_is_one_line(env, capsys, monkeypatch):
    monkeypatch.setenv("FLEET_OFFLINE_AFTER", "soon")
    code, _, err = run_main(capsys, "runs")
    assert code == 2 and "offline_after" in one_line(err)


# 4. an unknown --baseline is refused before anything is dispatched
def test_unknown_baseline_before_dispatch(env, capsys):
    code, _, err = run_main(capsys, "validate", TARBALL, "--models", "qwen3", "--baseline", "9.9.9")
    assert code == 2 and "no baseline '9.9.9'" in one_line(err)
    h = History(env / "history.sqlite")
    assert h.runs() == []


# 5. rich markup ate "[fleet]" in the help of --config (fleetctl), then of `fleet-agent worker --help`:
# every command of both programs, every help text, every bracketed word kept
RICH_TAG = re.compile(r"\[[a-z#/@][^\[\]]*\]")  # what rich's markup would take for a tag (rich.markup.RE_TAGS)


def _commands(cmd, path=()):
    """(path, click command) of ``cmd`` and every subcommand under it."""
    yield path, cmd
    for name, sub in sorted(getattr(cmd, "commands", {}).items()):
        yield from _commands(sub, (*path, name))


def _help_texts(cmd) -> list[str]:
    return [t for t in (cmd.help, cmd.short_help, *(getattr(p, "help", None) for p in cmd.params)) if t]


def _help(capsys, program: str, *args: str) -> str:
    """``PROGRAM ARGS --help`` as the user sees it, whitespace collapsed (wrapping is not a loss)."""
    if program == "fleetctl":
        code, out, err = run_main(capsys, *args, "--help")
    else:
        from agent.cli import main

        with pytest.raises(SystemExit) as e:
            main([*args, "--help"])
        code, (out, err) = int(e.value.code or 0), capsys.readouterr()
    assert code == 0, (program, args, err)
    return " ".join(out.split())


@pytest.mark.parametrize("program", ["fleetctl", "fleet-agent"])
def test_help_of_every_command_keeps_bracketed_words(env, capsys, program):
    from typer.main import get_command

    if program == "fleetctl":
        from controller.cli.app import build_app

        top = get_command(build_app())
    else:
        from agent.cli import app

        top = get_command(app)
    walked = set()
    for path, cmd in _commands(top):
        words = {w for text in _help_texts(cmd) for w in RICH_TAG.findall(text)}
        shown = _help(capsys, program, *path)
        lost = sorted(w for w in words if w not in shown)
        assert lost == [], f"{program} {' '.join(path)} --help lost {lost}"
        walked.add(path)
    some = ({(), ("validate",), ("devices", "reset"), ("describe", "run"), ("baseline", "import"), ("broker", "acl")}
            if program == "fleetctl" else {(), ("run",), ("probe",), ("worker",), ("exporter",)})
    assert some <= walked
    # the two that lost theirs: "TOML config file (sections  and )", "TOML config (, )"
    if program == "fleetctl":
        assert "TOML config file (sections [fleet] and [controller])" in _help(capsys, "fleetctl")
    else:
        assert "TOML config ([fleet], [agent]); FLEET_* variables override it" in _help(capsys, program, "worker")


# 6. report --check: 0 pass, 1 not pass (as README says), never 3
def test_report_check_exit_codes(filled, capsys):
    code, out, _ = run_main(capsys, "report", "run-b", "--check")
    assert code == 1 and out.startswith("# Fleet report run-b")
    code, _, _ = run_main(capsys, "report", "run-a", "--check")
    assert code == 0


# 7. a read verb with the broker down: one line naming the broker, exit 2
def test_devices_broker_down(env, capsys, monkeypatch):
    port = closed_port()
    monkeypatch.setenv("FLEET_BROKER_URL", f"redis://:hunter2@127.0.0.1:{port}/0")
    t0 = time.monotonic()
    code, _, err = run_main(capsys, "devices")
    line = one_line(err)
    assert code == 2 and "unreachable" in line and f"127.0.0.1:{port}" in line and "hunter2" not in err
    assert time.monotonic() - t0 < 20


# 8. two agent runs started in the same second get different ids
def test_agent_run_ids_do_not_collide(tmp_path, monkeypatch) -> None:
    from typer.testing import CliRunner

    import agent.pipeline
    from agent import cli as agent_cli

    seen: list[str] = []

    class Result:
        ok = True
        rows = ()

        def __init__(self, req):
            from contract.records import RunProgress

            self.progress = RunProgress(run_id=req.run_id, module=req.module)

    def fake_pipeline(req, cfg, **_):
        seen.append(req.run_id)
        return Result(req)

    real = time.strftime
    monkeypatch.setattr(time, "strftime", lambda fmt, t=None: real(fmt, time.gmtime(0)))  # the same second
    monkeypatch.setattr(agent.pipeline, "run_pipeline", fake_pipeline)
    tar = tmp_path / TARBALL
    tar.write_bytes(b"x")
    (tmp_path / "models").mkdir()
    for _ in range(2):
        res = CliRunner().invoke(agent_cli.app, ["run", str(tar), "--models", "qwen3", "--model-root",
                                                 str(tmp_path / "models"), "--workdir", str(tmp_path / "w"),
                                                 "--module", "m1"])
        assert res.exit_code == 0, res.output
    assert len(seen) == 2 and seen[0] != seen[1] and all(s.startswith("local-") for s in seen)


# issue 11, item 8: one run whose report cannot be built does not stop `fleetctl serve`
def test_serve_survives_a_report_that_fails(env, capsys, monkeypatch):
    import controller.report

    h = History(env / "history.sqlite")
    finished_run(h, "run-bad", modules=["m1"])
    finished_run(h, "run-good", modules=["m1"])
    real = controller.report.build_report

    def build(history, run_id, *a, **k):
        if run_id.startswith("run-bad"):
            raise RuntimeError("the report of run-bad cannot be built")
        return real(history, run_id, *a, **k)

    monkeypatch.setattr(controller.report, "build_report", build)
    code, _, err = run_main(capsys, "serve", "--once")
    assert code == 0, err
    assert "run-bad" in err and "Traceback" not in err
    good = h.run("run-good")
    assert good is not None and good.state == "done" and good.verdict is not None


# issue 11, item 4: an existing run id is refused unless --resume
def test_existing_run_id_refused_unless_resume(env, capsys):
    from contract.files import sha256_file

    h = History(env / "history.sqlite")
    finished_run(h, "old-run", modules=["m1"], state="done", release="1.4.1",
                 sha256=sha256_file(env / TARBALL))
    before = h.progress("old-run")["m1"]
    code, _, err = run_main(capsys, "validate", TARBALL, "--models", "qwen3", "--run-id", "old-run")
    assert code == 2 and "run id 'old-run' already exists" in one_line(err) and "--resume" in err
    assert h.progress("old-run")["m1"] == before  # nothing dispatched
    code, _, err = run_main(capsys, "validate", TARBALL, "--models", "qwen3", "--run-id", "old-run", "--resume")
    assert code == 1, err  # resumed: m1 has no agent here, so it fails at dispatch
    assert h.progress("old-run")["m1"].error is not None
    (env / "other").mkdir()
    (env / "other" / TARBALL).write_bytes(b"another release")
    code, _, err = run_main(capsys, "validate", f"other/{TARBALL}", "--run-id", "old-run", "--resume")
    assert code == 2 and "another release" in one_line(err)


# issue 25, item 1: a module answers a run id only for the same request, so --resume asks for the run's models
def test_resume_asks_for_the_runs_own_models(env, capsys):
    from contract.files import sha256_file

    h = History(env / "history.sqlite")
    finished_run(h, "sub-run", modules=["m1"], state="failed", release="1.4.1", models=("qwen3", "qwen35"),
                 sha256=sha256_file(env / TARBALL))
    code, _, err = run_main(capsys, "validate", TARBALL, "--models", "qwen3vl", "--run-id", "sub-run", "--resume")
    assert code == 2
    assert "run 'sub-run' validates models qwen3,qwen35; --resume resumes the same models" in one_line(err)
    code, _, err = run_main(capsys, "validate", TARBALL, "--run-id", "sub-run", "--resume")  # --models all
    assert code == 1, err  # resumed with the run's two keys: m1 has no agent here, so it fails at dispatch
    assert h.progress("sub-run")["m1"].keys_total == 2


# `fleetctl validate` takes a release URL as the API does (downloaded by the controller, checked first)
def test_validate_release_url_checked_before_dispatch(env, capsys, tmp_path, monkeypatch):
    from contract.files import sha256_file
    from tests.support.http_servers import ReleaseServer

    monkeypatch.setenv("FLEET_RELEASE_URL_HOSTS", '["127.0.0.1"]')  # the test release server is on loopback
    server = ReleaseServer(env)
    try:
        url = f"{server.url}/{TARBALL}"
        code, _, err = run_main(capsys, "validate", url, "--models", "qwen3", "--sha256", "0" * 64)
        assert code == 2 and "does not match" in one_line(err), err
        code, _, err = run_main(capsys, "validate", f"{server.url}/gone_{TARBALL}", "--models", "qwen3")
        assert code == 2 and "must end in a release tarball name" in one_line(err), err  # refused before fetching
        code, _, err = run_main(capsys, "validate", f"{server.url}/gone/1.4.2/{TARBALL.replace('1.4.1', '1.4.2')}")
        assert code == 2 and "404" in one_line(err), err
        assert not (env / "fleet" / "releases" / sha256_file(env / TARBALL)).exists()  # nothing half-kept
        assert History(env / "history.sqlite").runs() == []  # nothing dispatched
        assert server.paths == [f"/{TARBALL}", f"/gone/1.4.2/{TARBALL.replace('1.4.1', '1.4.2')}"]
    finally:
        server.close()
