"""Every verb's exit code (0 pass, 1 failed or regressed, 2 error), ``-o json`` parseable on every
verb that lists or shows, one meaning per short flag, and the new verbs: version, describe,
logs, retry, report defaulting to the latest run. Fast: a filled run history, no worker."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from controller.history import History
from tests.support.cli import TARBALL, finished_run, one_line, run_main

EXIT_CODES = [
    (["--help"], 0),
    (["version"], 0),
    (["runs"], 0),
    (["results", "run-b"], 0),
    (["status", "run-a"], 0),
    (["status", "run-b"], 1),  # regressed
    (["status", "nope"], 2),
    (["report", "run-a", "--check"], 0),
    (["report", "--check"], 1),  # the latest run: run-b, regressed
    (["report", "run-b"], 0),  # without --check a report is a document: 0
    (["report", "nope"], 2),
    (["compare", "run-a", "run-b", "--check"], 1),
    (["trend"], 0),
    (["trend", "--metric", "nope"], 2),
    (["trend", "--from-csv", "missing.csv", "--column", "v"], 2),
    (["trend", "--max-pvalue", "0"], 2),
    (["describe", "run", "run-b"], 0),
    (["describe", "run", "nope"], 2),
    (["describe", "module", "m1"], 0),
    (["describe", "module", "m9"], 2),
    (["devices"], 0),
    (["devices", "-d", "m9"], 2),
    (["baseline", "list"], 0),
    (["history", "migrate"], 0),
    (["cancel", "nope"], 2),
    (["cancel", "run-b"], 0),
    (["logs", "nope"], 2),
    (["retry", "nope"], 2),
    (["validate", "missing.tar.gz"], 2),
    (["no-such-verb"], 2),
    (["runs", "--no-such-option"], 2),
    (["runs", "-o", "yaml"], 2),
]


@pytest.mark.parametrize(("args", "code"), EXIT_CODES, ids=[" ".join(a) for a, _ in EXIT_CODES])
def test_exit_codes(filled, capsys, args, code):
    got, _, err = run_main(capsys, *args)
    assert got == code, err
    if code == 2 and args[0] not in ("no-such-verb",) and "--no-such-option" not in args and "yaml" not in args:
        assert one_line(err).startswith("fleetctl: error: "), err


def test_history_migrate_writes_each_ended_run_once(filled, capsys):
    """The filled history's baseline, run-a and run-b get their column files; a second migration writes none."""
    code, out, _ = run_main(capsys, "history", "migrate", "-o", "json")
    assert code == 0 and json.loads(out) == {"written": 3, "current": 0, "running": 0, "abandoned": 0}
    code, out, _ = run_main(capsys, "history", "migrate")
    assert code == 0 and out.startswith("0 run(s) written, 3 already current, 0 not ended"), out


LISTING = [["runs"], ["results", "run-b"], ["devices"], ["describe", "run", "run-b"], ["describe", "module", "m1"],
           ["baseline", "list"], ["version"], ["status", "run-b"]]


@pytest.mark.parametrize("args", LISTING, ids=[" ".join(a) for a in LISTING])
def test_output_json_and_csv(filled, capsys, args):
    code, out, err = run_main(capsys, *args, "-o", "json")
    assert code in (0, 1), err
    doc = json.loads(out)
    assert doc
    code, out, err = run_main(capsys, *args, "--output", "csv")
    assert code in (0, 1), err
    assert "," in out.splitlines()[0]  # the header, then one line per record


def test_short_flags_have_one_meaning() -> None:
    """Every short flag means one thing on every verb (walks the whole command tree)."""
    from typer.main import get_command

    from controller.cli.app import build_app

    meanings: dict[str, set[str]] = {}

    def walk(cmd) -> None:
        for p in cmd.params:
            for opt in p.opts + p.secondary_opts:
                if len(opt) == 2 and opt.startswith("-") and opt != "-h":
                    meanings.setdefault(opt, set()).add(max(p.opts, key=len))
        for sub in getattr(cmd, "commands", {}).values():
            walk(sub)

    walk(get_command(build_app()))
    clash = {k: v for k, v in meanings.items() if len(v) > 1}
    assert clash == {}
    assert meanings["-o"] == {"--output"} and meanings["-d"] == {"--devices"} and meanings["-i"] == {"--inventory"}


def test_runs_json_has_every_field(filled, capsys):
    _, out, _ = run_main(capsys, "runs", "-n", "1", "-o", "json")
    (r,) = json.loads(out)
    assert r["run_id"] == "run-b" and r["verdict"] is None and r["state"] == "done" and len(r["modules"]) == 6


def test_read_verbs_create_no_history(env, capsys):
    for args in (["runs"], ["devices"], ["report"], ["results"], ["describe", "module", "m1"], ["trend"]):
        run_main(capsys, *args)
    assert not (env / "history.sqlite").exists()


def test_report_defaults_to_the_latest_run(filled, capsys):
    code, out, _ = run_main(capsys, "report")
    assert code == 0 and out.startswith("# Fleet report run-b")
    code, out, _ = run_main(capsys, "report", "run-a", "-o", "json")
    assert json.loads(out)["run_id"] == "run-a"


def test_describe_run_shows_modules_and_errors(filled, capsys):
    h = History(filled)
    finished_run(h, "run-c", modules=["m1"], state="failed")
    code, out, _ = run_main(capsys, "describe", "run", "run-c")
    assert code == 0 and "run-c" in out and "m1" in out
    code, out, _ = run_main(capsys, "describe", "run", "run-c", "-o", "json")
    doc = json.loads(out)
    assert doc["run_id"] == "run-c" and doc["module_states"]["m1"]["state"] == "done" and doc["errors"] == {}


def test_describe_module(filled, capsys):
    h = History(filled)
    finished_run(h, "run-m1", modules=["m1"])
    code, out, _ = run_main(capsys, "describe", "module", "m1", "-o", "json")
    doc = json.loads(out)
    assert code == 0 and doc["state"] == "offline" and doc["recent_runs"][0]["run_id"] == "run-m1"


def test_logs_of_a_local_module(env, capsys):
    work = env / "work"
    logs = work / "runs" / "r1" / "logs"
    logs.mkdir(parents=True)
    (logs / "01-unpack.log").write_text("unpacked\n")
    (logs / "05-server-qwen35_mtp.log").write_text("server up\n")
    (logs / "06-benchmark-qwen35_mtp.log").write_text("bench mtp\n")
    (logs / "07-benchmark-qwen3.log").write_text("bench qwen3\n")
    (env / "inv.toml").write_text(f'[[module]]\nname = "m1"\ntransport = "local"\nworkdir = "{work}"\n')
    finished_run(History(env / "history.sqlite"), "r1", modules=["m1"])
    code, out, _ = run_main(capsys, "logs", "r1")
    assert code == 0 and "unpacked" in out and "bench qwen3" in out and "==> 07-benchmark-qwen3.log <==" in out
    _, out, _ = run_main(capsys, "logs", "r1", "--step", "benchmark", "--key", "qwen35_mtp")
    assert "bench mtp" in out and "bench qwen3" not in out and "server up" not in out
    _, out, _ = run_main(capsys, "logs", "r1", "--step", "server", "--module", "m1")
    assert out.strip().endswith("server up")
    code, _, err = run_main(capsys, "logs", "r1", "--module", "m2")
    assert code == 2 and "did not run on module 'm2'" in one_line(err)


def test_retry_makes_a_new_run_of_the_same_release(env, capsys):
    from contract.files import sha256_file

    h = History(env / "history.sqlite")
    h.create_run("first", release="1.4.1", tarball=str(env / TARBALL), sha256=sha256_file(env / TARBALL),
                 models=("qwen3", "qwen35"), modules=["m1"])
    finished_run(h, "second", modules=["m1"])
    code, out, err = run_main(capsys, "retry", "first", "--detach")
    assert code == 0, err
    new = out.strip().splitlines()[-1]
    assert new != "first"
    info = h.run(new)
    assert info is not None and info.models == ("qwen3", "qwen35") and info.modules == ("m1",)
    assert info.tarball == str(env / TARBALL)
    time.sleep(0.01)
    code, _, err = run_main(capsys, "retry", "second", "--failed-only")
    assert code == 2 and "no module failed" in one_line(err)
    code, out, err = run_main(capsys, "retry", new, "--failed-only", "--detach")  # m1 failed: offline, no agent
    assert code == 0, err
    retried = h.run(out.strip().splitlines()[-1])
    assert retried is not None and retried.modules == ("m1",)


def test_exit_codes_are_documented():
    readme = (Path(__file__).resolve().parents[2] / "docs" / "reference" / "cli.md").read_text()
    assert "| 0 | pass" in readme and "| 1 | " in readme and "| 2 | " in readme


def test_logs_of_an_ssh_module_run_the_remote_script(env, capsys, monkeypatch):
    """Remote modules: the script sent over SSH, run here by a stand-in session (the SSH tier
    covers the connection itself)."""
    import contextlib
    import subprocess
    import sys

    from controller.remote import ssh

    work = env / "remote-work"
    (work / "runs" / "r2" / "logs").mkdir(parents=True)
    (work / "runs" / "r2" / "logs" / "03-precompile.log").write_text("kernels compiled\n")
    (env / "inv.toml").write_text(f'[[module]]\nname = "m1"\nhost = "10.0.0.9"\nworkdir = "{work}"\n')
    finished_run(History(env / "history.sqlite"), "r2", modules=["m1"])

    class Stand:
        def python(self, python, script, *args, what):
            out = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, check=True)
            return json.loads(out.stdout)

    monkeypatch.setattr(ssh, "open_session", lambda target: contextlib.nullcontext(Stand()))
    code, out, err = run_main(capsys, "logs", "r2", "--step", "precompile")
    assert code == 0 and "kernels compiled" in out, err
