"""``fleet-agent run``: exit codes, output formats, SIGINT (real process, real signal)."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agent.cli import app, rows_csv
from agent.store import RunStore
from contract.records import ResultRow
from simulator.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


def _invoke(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--models", "qwen3,gpt5"], "unknown model key 'gpt5'"),
        (["--models", ","], "no model key given"),
        (["--key-env", "qwen3FOO=1"], "expected KEY:VAR=VALUE"),
        (["--server-port", "70000"], "server_port"),
        (["--run-id", "../evil"], "run id '../evil'"),
        (["--sha256", "abc"], "not 64 hex digits"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, release, model_root, extra, message):
    res = _invoke("run", str(release.path), "--model-root", str(model_root), "--workdir", str(tmp_path / "w"), *extra)
    assert res.exit_code == 2, res.output
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], res.output


def test_missing_tarball_and_model_root(tmp_path, model_root):
    res = _invoke("run", str(tmp_path / "nope.tar.gz"), "--model-root", str(model_root))
    assert res.exit_code == 2 and "tarball not found" in res.output
    res = _invoke("run", str(model_root), "--model-root", str(tmp_path / "none"))
    assert res.exit_code == 2


def test_rows_csv_roundtrip():
    row = ResultRow(table="sweep", profile="1:1", model="M", ttft_ms=1.5, extra={"T": "1"}, flags=("a", "b"))
    got = list(csv.DictReader(io.StringIO(rows_csv([row]))))
    assert got[0]["ttft_ms"] == "1.5" and got[0]["flags"] == "a;b" and json.loads(got[0]["extra"]) == {"T": "1"}
    assert got[0]["prefill_tps"] == ""


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_")}
    env.update(extra)
    return env


def _cmd(release, model_root, tmp_path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "agent.cli", "run", str(release.path), "--models", "qwen3,qwen35_mtp",
            "--model-root", str(model_root), "--workdir", str(tmp_path / "w"), "--run-id", "c1", "--module", "m9",
            "--server-port", str(free_port()), "--sha256", release.sha256, *extra]


@pytest.mark.slow
@pytest.mark.usefixtures("no_leftovers")
def test_run_exit_0_then_1_and_formats(tmp_path, release, model_root):
    ok = subprocess.run(_cmd(release, model_root, tmp_path, "--format", "csv"), capture_output=True, text=True,
                        env=_env(tmp_path), cwd=ROOT, timeout=120)
    assert ok.returncode == 0, ok.stderr
    rows = list(csv.DictReader(io.StringIO(ok.stdout)))
    assert len(rows) == 26 and {r["module"] for r in rows} == {"m9"}
    assert "run c1 on m9: done, 26 rows, precompile ran" in ok.stderr
    bad = subprocess.run(
        [*_cmd(release, model_root, tmp_path, "--format", "json"), "--run-id", "c2", "--key-env",
         "qwen3:FAKE_BENCH_MODE=no-table"], capture_output=True, text=True, env=_env(tmp_path), cwd=ROOT, timeout=120)
    assert bad.returncode == 1, bad.stderr
    out = json.loads(bad.stdout)
    assert out["progress"]["precompile_cached"] is True
    assert [o["status"] for o in out["progress"]["outcomes"]] == ["failed", "passed"]
    table = subprocess.run(_cmd(release, model_root, tmp_path), capture_output=True, text=True, env=_env(tmp_path),
                           cwd=ROOT, timeout=120)
    assert table.returncode == 0 and "qwen35_mtp" in table.stdout and "gsm8k:13" in table.stdout


@pytest.mark.slow
@pytest.mark.usefixtures("no_leftovers")
def test_sigint_cancels_and_kills_every_process(tmp_path, release, model_root):
    proc = subprocess.Popen(_cmd(release, model_root, tmp_path, "--key-env", "qwen3:FAKE_BENCH_MODE=hang"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(tmp_path), cwd=ROOT)
    store = RunStore(tmp_path / "w")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        p = store.progress("c1") if (tmp_path / "w" / "runs" / "c1").exists() else None
        if p is not None and p.step == "benchmark" and p.model_key == "qwen3":
            break
        time.sleep(0.2)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    p = store.progress("c1")
    assert p is not None
    assert p.state.value == "cancelled" and [o.status for o in p.outcomes] == ["cancelled", "cancelled"]
    assert store.current_run() is None and store.last_run() == "c1"
