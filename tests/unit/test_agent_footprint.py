"""The agent's footprint (issue 18): what its worker loads, and why; one process.

Each check runs in a fresh interpreter (a subprocess): ``sys.modules`` and the collector's state
of the test process say nothing about a worker's. ``bench/agent.py`` measures the megabytes.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

AT_START = """
import json, sys
from pathlib import Path
from contract.celery_app import make_app
from agent.settings import AgentSettings
from agent.task import register_tasks
import agent.entry, agent.pipeline  # the deployed form (`fleet-agent worker`) and what the worker loads at start
base = Path(sys.argv[1])
s = AgentSettings(module="m1", workdir=base / "work", data_dir=base / "fleet", broker_url="filesystem://")
app = make_app(s, module=s.module)
register_tasks(app, s)
with app.connection_for_read() as conn:
    conn.transport  # the embedded broker's transport, resolved and built
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
"""


def test_the_worker_loads_no_redis_metrics_or_rich_at_start(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", AT_START, str(tmp_path)], capture_output=True, text=True,
                         cwd=ROOT, timeout=60, check=True)
    loaded = set(json.loads(out.stdout))
    assert {"celery", "pydantic", "agent"} <= loaded  # the check saw a real worker's imports
    # redis: ~20 MiB, for Redis brokers only; prometheus_client: when /metrics or a Pushgateway is configured
    # (MetricsServing); rich: the commands that print; typer: the other commands
    assert not loaded & {"redis", "prometheus_client", "rich", "typer"}


@pytest.mark.parametrize(("argv", "parsed"), [
    (["worker"], (None, "INFO")),
    (["worker", "--config", "/a.toml"], ("/a.toml", "INFO")),
    (["worker", "-c", "/a.toml", "--loglevel", "DEBUG"], ("/a.toml", "DEBUG")),
    (["worker", "--config=/a.toml", "--loglevel=WARNING"], ("/a.toml", "WARNING")),
    (["worker", "--help"], None),
    (["worker", "--config"], None),
    (["worker", "--config", "--loglevel"], None),
    (["worker", "--pool", "solo"], None),
    (["worker", "-c=/a.toml"], None),
    (["run", "x.tar.gz"], None),
    ([], None),
])
def test_fleet_agent_worker_is_parsed_without_the_cli_library_and_anything_else_goes_to_it(
        argv: list[str], parsed: tuple[str | None, str] | None) -> None:
    from agent.entry import worker_args

    assert worker_args(argv) == parsed


def test_fleet_agent_worker_starts_the_worker_without_typer() -> None:
    code = ("import sys\nfrom agent.entry import main\ntry:\n    main(['worker', '--loglevel', 'WARNING'])\n"
            "except SystemExit as exc:\n    print(exc.code, 'typer' in sys.modules)")
    env = {**os.environ, "FLEET_BROKER_URL": "bogus://"}  # the settings refuse it before anything starts
    env.pop("FLEET_CONFIG", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60,
                         check=True, env=env)
    assert out.stdout.split() == ["2", "False"] and "bogus" in out.stderr, out.stdout + out.stderr


def test_any_other_command_line_given_to_main_goes_to_the_cli_as_given() -> None:
    """``main(argv)`` answers ``argv``, not the process's own command line (here ``-c``)."""
    code = ("from agent.entry import main\ntry:\n    main(['worker', '--help'])\n"
            "except SystemExit as exc:\n    print('exit', exc.code)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert "Usage: fleet-agent worker" in out.stdout, out.stdout + out.stderr
    assert out.stdout.split()[-2:] == ["exit", "0"]


def test_the_redis_transports_are_built_on_first_use_and_keep_their_checks() -> None:
    code = ("import sys, contract.safe_transport as t; before = 'redis' in sys.modules; T = t.SentinelTransport; "
            "print(before, 'redis' in sys.modules, T.__module__, T.Channel.__name__, "
            "t.Transport.Channel._brpop_read is t._CheckedReads._brpop_read)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60,
                         check=True)
    assert out.stdout.split() == ["False", "True", "contract.safe_transport", "SentinelChannel", "True"]


TRIM = """
import sys
from agent.worker import settle

def rss_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])

blocks = [bytes(2000) for _ in range(40000)]  # 80 MiB through malloc (over pymalloc's 512 bytes)
kept = blocks[::10]  # one block in ten stays: the heap cannot shrink from its top
del blocks
before = rss_kib()
settle()
print(before - rss_kib())
"""


def test_the_worker_hands_freed_heap_pages_back_once_it_serves() -> None:
    if not Path("/proc/self/status").exists():
        pytest.skip("needs /proc/self/status (Linux) to read a process's RSS")
    from agent import malloc

    if not malloc.trim():
        pytest.skip("needs glibc's malloc_trim (this libc has none)")
    out = subprocess.run([sys.executable, "-c", TRIM], capture_output=True, text=True, cwd=ROOT, timeout=60,
                         check=True)
    # the freed blocks lie between kept ones: glibc keeps them resident until malloc_trim hands them back
    assert int(out.stdout) / 1024 > 20, out.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_the_worker_is_one_process_and_serves_metrics(tmp_path: Path) -> None:
    from controller.cli.demo import inventory_toml, start_worker, stop_workers, wait_for_heartbeats
    from controller.settings import ControllerSettings

    settings = ControllerSettings(broker_url="filesystem://", data_dir=tmp_path / "fleet",
                                  inventory=tmp_path / "inventory.toml", history=tmp_path / "history.sqlite")
    (tmp_path / "inventory.toml").write_text(inventory_toml(["sim-01"], tmp_path, None), encoding="utf-8")
    port = _free_port()
    w = start_worker("sim-01", tmp_path, settings, sim_env={"FLEET_METRICS_PORT": str(port)})
    try:
        wait_for_heartbeats(settings, [w], 60)
        deadline, body = time.monotonic() + 30, ""
        while time.monotonic() < deadline and "# HELP m1000_" not in body:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                    body = resp.read().decode()
            except OSError:
                time.sleep(0.2)
        assert "# HELP m1000_" in body, w.log.read_text(encoding="utf-8")[-2000:]
        import psutil

        worker = psutil.Process(w.proc.pid)
        assert worker.children() == [], worker.children()  # no pool child: the run executes in this process
    finally:
        stop_workers([w])
