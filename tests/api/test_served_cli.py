"""``fleetctl report --service`` and ``fleetctl trend --service`` against a real ``fleetctl serve`` process: the
same bytes and exit codes as the command reading the history here, and every failure one line, exit 2 (no
token, a refused one, a token file of the wrong shape, no service, a bad URL, an unknown run, a format not
served, ``--service`` with ``--history``); ``FLEET_SERVICE`` gives way to an explicit ``--history``."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from contract.records import ResultRow
from simulator.ports import free_port
from tests.support.cli import INV, closed_port, fill
from tests.support.frames import reference, seed_rows  # noqa: F401 - fixtures, registered by name
from tests.support.http_servers import TOKEN, wait_port, write_tokens
from tests.support.trend import release_history

pytestmark = pytest.mark.slow

FLEETCTL = str(Path(sys.executable).with_name("fleetctl"))


@dataclass(frozen=True)
class Lab:
    history: Path
    url: str
    cwd: Path  # an empty folder: no fleet.toml, no inventory


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, reference: pd.DataFrame,  # noqa: F811 - the fixtures
        seed_rows: list[ResultRow]) -> Iterator[Lab]:  # noqa: F811
    base = tmp_path_factory.mktemp("served")
    history = base / "history.sqlite"
    h = release_history(history, reference, regress={("qwen3", "decode_tps"): 0.10})  # 12 releases, a change
    fill(h, seed_rows, state="done")  # baseline 1.4.1, run-a (pass), run-b (regressed)
    h.close()
    (base / "inventory.toml").write_text(INV)
    tokens = write_tokens(base / "tokens", TOKEN)
    port = free_port()
    env = {**_bare_env(), "FLEET_HISTORY": str(history), "FLEET_CONTROLLER_METRICS_PORT": "0"}
    proc = subprocess.Popen([FLEETCTL, "serve", "--interval", "3600", "--api-port", str(port), "--tokens",
                             str(tokens)], cwd=base, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_port(port, proc)
        (base / "elsewhere").mkdir()
        yield Lab(history, f"http://127.0.0.1:{port}", base / "elsewhere")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def _bare_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}


def fleetctl(lab: Lab, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([FLEETCTL, *args], cwd=lab.cwd, env={**_bare_env(), "FLEET_TOKEN": TOKEN, **env},
                          capture_output=True, text=True, timeout=120)


def _same(lab: Lab, *args: str) -> subprocess.CompletedProcess[str]:
    """``fleetctl ARGS`` through the service and reading the history here: the same stdout, stderr, exit code."""
    here = fleetctl(lab, "--history", str(lab.history), *args)
    served = fleetctl(lab, *args, "--service", lab.url)
    assert (served.returncode, served.stdout, served.stderr) == (here.returncode, here.stdout, here.stderr), args
    return served


def test_a_served_report_is_the_report_read_here(lab: Lab) -> None:
    got = _same(lab, "report", "run-b", "--check")
    assert got.returncode == 1 and got.stdout.startswith("# Fleet report run-b")
    assert _same(lab, "report", "run-a", "--check").returncode == 0
    assert '"verdict": "regressed"' in _same(lab, "report", "latest", "-o", "json").stdout
    lenient = _same(lab, "report", "run-b", "--baseline", "1.4.1", "--tolerance", "0.5", "--energy-tolerance", "0.2",
                    "--startup-tolerance", "0.3", "--check")
    assert lenient.returncode == 0


def test_a_served_html_report_is_written_where_asked(lab: Lab, tmp_path: Path) -> None:
    here = fleetctl(lab, "--history", str(lab.history), "report", "run-b", "-o", "html", "--out", str(tmp_path / "a"))
    served = fleetctl(lab, "report", "run-b", "-o", "html", "--out", str(tmp_path / "b"), "--service", lab.url)
    assert served.returncode == here.returncode == 0, served.stderr
    assert served.stdout == here.stdout and served.stdout.startswith("REGRESSED run-b")
    assert served.stderr == f"wrote {tmp_path / 'b' / 'report.html'}\n"
    # the same page but for the ids matplotlib gives its SVG's parts, from a random hash salt in each process
    drawn = re.compile(r"\b(?:m|p|h|image)[0-9a-f]{10}\b")  # h: the tolerance band's hatch pattern
    a, b = ((tmp_path / x / "report.html").read_text() for x in "ab")
    assert len(drawn.findall(a)) > 10 and drawn.sub("", b) == drawn.sub("", a)


def test_a_served_trend_is_the_trend_read_here(lab: Lab) -> None:
    assert '"release": "1.6.0"' in _same(lab, "trend", "--metric", "decode_tps", "-o", "json").stdout
    assert "qwen3" in _same(lab, "trend", "-m", "qwen3").stdout
    assert _same(lab, "trend", "-m", "qwen3", "--min-magnitude", "0.5").stdout.startswith("no change points over 13")


def test_fleet_service_gives_way_to_an_explicit_history(lab: Lab) -> None:
    nowhere = f"http://127.0.0.1:{closed_port()}"
    here = fleetctl(lab, "--history", str(lab.history), "report", "run-b", FLEET_SERVICE=nowhere, FLEET_TOKEN="")
    assert here.returncode == 0 and here.stdout.startswith("# Fleet report run-b")
    served = fleetctl(lab, "report", "run-b", FLEET_SERVICE=lab.url)
    assert served.returncode == 0 and served.stdout == here.stdout


def test_every_failure_is_one_line_and_exit_2(lab: Lab, tmp_path: Path) -> None:
    (tmp_path / "words").write_text(f"ci user {TOKEN}\n")
    (tmp_path / "token").write_text(f"{TOKEN}\n")
    url = lab.url
    cases: list[tuple[list[str], dict[str, str], str]] = [
        (["--service", url], {"FLEET_TOKEN": ""}, "--service needs a token of role read: set FLEET_TOKEN"),
        (["--service", url], {"FLEET_TOKEN": "not-the-token-0123456789"}, "the token was refused"),
        (["--service", url], {"FLEET_TOKEN": "", "FLEET_TOKEN_FILE": str(tmp_path / "words")},
         "must hold one token alone, holds 3 words"),
        (["--service", url], {"FLEET_TOKEN": "", "FLEET_TOKEN_FILE": str(tmp_path / "nope")}, "cannot be read"),
        (["--service", f"http://127.0.0.1:{closed_port()}"], {}, "Connection refused"),
        (["--service", "ftp://controller"], {}, "not the http(s) URL of a fleetctl serve"),
        (["--service", "http://[::1"], {}, "not the http(s) URL of a fleetctl serve"),
        (["--service", f"http://ci:{TOKEN}@127.0.0.1:1"], {}, "a URL with credentials is refused"),
        (["--service", url, "--baseline", "9.9"], {}, "no baseline '9.9'"),
        (["--service", url, "-o", "csv"], {}, "--output csv with --service: not served"),
        (["--service", url, "--tolerance", "2"], {}, "--tolerance must be a fraction between 0 and 1, got 2.0"),
    ]
    for args, env, said in cases:
        got = fleetctl(lab, "report", "run-b", *args, **env)
        assert got.returncode == 2 and got.stdout == "", (args, got)
        assert got.stderr.startswith("fleetctl: error: ") and got.stderr.count("\n") == 1, (args, got.stderr)
        assert said in got.stderr and TOKEN not in got.stderr, (args, got.stderr)
    unknown = fleetctl(lab, "report", "nosuch", "--service", url)
    assert unknown.returncode == 2 and "nosuch" in unknown.stderr and unknown.stderr.count("\n") == 1
    both = fleetctl(lab, "--history", str(lab.history), "report", "run-b", "--service", url)
    assert both.returncode == 2 and "--service and --history: give one" in both.stderr
    bad_trend = fleetctl(lab, "trend", "--metric", "nope", "--service", url)
    assert bad_trend.returncode == 2 and "--metric 'nope': not a metric" in bad_trend.stderr
    from_file = fleetctl(lab, "report", "run-b", "--service", url, FLEET_TOKEN="",
                         FLEET_TOKEN_FILE=str(tmp_path / "token"))
    assert from_file.returncode == 0 and from_file.stdout.startswith("# Fleet report run-b")


def test_a_proxy_answering_a_page_of_html_is_one_line(lab: Lab) -> None:
    from http.server import BaseHTTPRequestHandler

    from tests.support.http_servers import ThreadedServer

    class Gateway(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(502)
            self.end_headers()
            self.wfile.write(b"<html>\n<body>\n<h1>502 Bad Gateway</h1>\n</body>\n</html>\n")

    proxy = ThreadedServer()
    try:
        got = fleetctl(lab, "report", "run-b", "--service", proxy.serve(Gateway))
    finally:
        proxy.close()
    assert got.returncode == 2 and got.stderr.count("\n") == 1 and "502 Bad Gateway" in got.stderr, got.stderr
