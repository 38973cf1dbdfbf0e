"""``fleetctl serve`` outlives its run history and its broker (issue 48, item 1).

The run history's PostgreSQL server SIGKILLed and started again under ``fleetctl serve`` while a validation runs
(the item's acceptance), with real processes: a PostgreSQL 15 server of the test's own, ``fleetctl serve``
with its API, /metrics and a webhook, an attached ``fleetctl validate`` and a simulated module.

While the server is down: serve stays up, ``/health`` and ``m1000_fleet_serve_part_up`` name the history, the API's
history routes answer 503 with the history's one line at once, and the attached ``validate`` names the history (not
the broker). Once it is back: the run's rows (as many as the module stored), one verdict, one webhook event and one
delivery; the attached ``validate`` ends with the verdict instead of showing its last table. And the broker's
redis-server SIGKILLed and started again under ``serve``: ``/health`` names the broker, the history's routes still
answer, and ``serve`` says when it is back.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.store import RunStore
from controller.history import VERDICT_EVENT, History, HistoryUnavailable
from simulator.ports import free_port
from tests.support.http_servers import TOKEN, Receiver, wait_port, write_tokens
from tests.support.lab import make_lab
from tests.support.postgres_server import PostgresServer, running_postgres
from tests.support.procs import stop_group
from tests.support.redis_server import RedisServer, running_redis
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow
KEYS = "qwen3,qwen35_mtp"


@pytest.fixture
def pg() -> Iterator[PostgresServer]:
    """A server of this test alone (it is killed)."""
    with running_postgres() as server:
        yield server


@pytest.fixture
def own_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with running_redis(tmp_path_factory) as server:
        yield server


def get(url: str, token: bool = True) -> tuple[int, str]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        stop_group(proc)


def test_postgres_sigkilled_and_restarted_under_serve_mid_run(pg: PostgresServer, tmp_path: Path) -> None:
    from simulator import build_release

    release = build_release(tmp_path / "release", time_scale=50.0, noise=0.0, seed=3)
    url = pg.fresh_database()
    lab = make_lab(tmp_path / "lab", ("filesystem://", None), 1)
    lab.settings = lab.settings.model_copy(update={"history": url})
    receiver = Receiver()
    secret = tmp_path / "webhook.key"
    secret.write_text("a-shared-webhook-secret-0123456789\n")
    secret.chmod(0o600)
    api_port, metrics_port = free_port(), free_port()
    exe = Path(sys.executable).parent / "fleetctl"
    env = {**lab.env(), "FLEET_CONTROLLER_METRICS_PORT": str(metrics_port)}
    procs: list[subprocess.Popen[bytes]] = []
    history = History(url)
    try:
        lab.start()
        with (tmp_path / "serve.log").open("wb") as out:
            serve = subprocess.Popen([str(exe), "serve", "--interval", "0.3", "--api-port", str(api_port), "--tokens",
                                      str(write_tokens(tmp_path / "tokens", TOKEN)), "--webhook", receiver.url,
                                      "--webhook-secret-file", str(secret)], env=env, stdout=out,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        procs.append(serve)
        wait_port(api_port, serve)
        api = f"http://127.0.0.1:{api_port}"
        with (tmp_path / "validate.log").open("wb") as out:
            validate = subprocess.Popen([str(exe), "validate", str(release.path), "--models", KEYS],
                                        env={**lab.env(), "COLUMNS": "200"}, stdout=out, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        procs.append(validate)
        wait_for(lambda: history.running_runs(), 60, "the run in the history")
        (run_id,) = history.running_runs()
        wait_for(lambda: history.row_count(run_id) > 0, 120, "the first rows synced")

        pg.kill()
        wait_for(lambda: get(f"{api}/health", token=False)[0] == 503, 20, "/health degraded")
        code, body = get(f"{api}/health", token=False)
        parts = json.loads(body)["parts"]
        assert not parts["history"]["up"] and parts["broker"]["up"], body
        assert "run history unreachable" in parts["history"]["reason"], body
        t0 = time.monotonic()
        code, body = get(f"{api}/api/v1/runs/{run_id}")
        assert code == 503 and time.monotonic() - t0 < 3, body  # at once, not after a connect timeout (5 s)
        detail = json.loads(body)["detail"]
        assert detail.startswith("run history unreachable since ") and "tries again in" in detail, detail
        assert len(detail.splitlines()) == 1
        assert get(f"{api}/api/v1/runs/{run_id}", token=False)[0] == 401  # the token first, as ever
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
            scraped = r.read().decode()
        assert 'm1000_fleet_serve_part_up{part="history"} 0.0' in scraped
        assert 'm1000_fleet_serve_part_up{part="broker"} 1.0' in scraped
        # the run ends on the module while the history is away
        store = RunStore(lab.base / "modules" / "sim-01" / "work")
        wait_for(lambda: (p := store.progress(run_id)) is not None and p.state.terminal, 180, "the run's end")
        time.sleep(2)  # serve and validate meet the history away a few more times
        assert serve.poll() is None, (tmp_path / "serve.log").read_text()
        down_for = time.monotonic() - t0

        pg.start()
        back = time.monotonic()

        def judged() -> bool:  # the test's own connection too: its first use after the restart fails, then made again
            try:
                r = history.run(run_id)
            except HistoryUnavailable:
                return False
            return r is not None and r.verdict is not None

        wait_for(judged, 90, "the verdict")
        judged_after = time.monotonic() - back
        wait_for(lambda: receiver.got, 60, "the webhook")
        print(f"history down {down_for:.1f} s; verdict {judged_after:.1f} s and webhook "
              f"{time.monotonic() - back:.1f} s after the server was back")
        assert judged_after < 60  # the backoff's longest wait (30.5 s) and a pass, on a loaded machine
        try:
            code = validate.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("the attached validate did not end: " + (tmp_path / "validate.log").read_text()[-3000:])
        vlog = (tmp_path / "validate.log").read_text()
        assert code in (0, 1) and "verdict" in vlog.lower(), vlog[-3000:]
        assert "run history unreachable" in vlog and "broker" not in vlog.split("run history unreachable")[0][-80:]
        assert "broker filesystem:// unreachable" not in vlog and "run history reachable again" in vlog, vlog[-3000:]
        wait_for(lambda: get(f"{api}/health", token=False)[0] == 200, 30, "/health ok again")
        time.sleep(2)  # a few more passes: nothing is sent twice

        local = sorted((r.source, r.model_key, r.profile, r.ttft_ms) for r in store.rows(run_id))
        stored = sorted((r.source, r.model_key, r.profile, r.ttft_ms) for r in history.rows(run_id, "sim-01",
                                                                                             source=None))
        assert local and stored == local, "rows on the module and in the history differ"
        run = history.run(run_id)
        assert run is not None and run.state != "running" and run.verdict is not None
        (runs,) = history.db.execute("SELECT COUNT(*) FROM runs WHERE run_id=?", (run_id,)).fetchone()
        events = history.db.execute("SELECT verdict FROM webhook_outbox WHERE run_id=? AND event=?",
                                    (run_id, VERDICT_EVENT)).fetchall()
        assert runs == 1 and [e[0] for e in events] == [run.verdict]
        delivered = [json.loads(b) for _, b in receiver.got if json.loads(b).get("run_id") == run_id]
        assert len(delivered) == 1 and delivered[0]["verdict"] == run.verdict, receiver.got
        code, body = get(f"{api}/api/v1/runs/{run_id}")
        assert code == 200 and json.loads(body)["verdict"] == run.verdict
        slog = (tmp_path / "serve.log").read_text()
        assert "Traceback" not in slog and "run history reachable again after" in slog, slog
        assert serve.poll() is None
    finally:
        for p in procs:
            _kill_group(p)
        history.close()
        receiver.close()
        lab.stop()


def test_redis_sigkilled_and_restarted_under_serve(own_redis: RedisServer, tmp_path: Path) -> None:
    lab = make_lab(tmp_path / "lab", (own_redis.url, own_redis), 1)  # no agent: serve alone
    api_port, metrics_port = free_port(), free_port()
    exe = Path(sys.executable).parent / "fleetctl"
    env = {**lab.env(), "FLEET_CONTROLLER_METRICS_PORT": str(metrics_port)}
    with (tmp_path / "serve.log").open("wb") as out:
        serve = subprocess.Popen([str(exe), "serve", "--interval", "0.3", "--api-port", str(api_port), "--tokens",
                                  str(write_tokens(tmp_path / "tokens", TOKEN))], env=env, stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_port(api_port, serve)
        api = f"http://127.0.0.1:{api_port}"
        assert get(f"{api}/health", token=False)[0] == 200
        own_redis.kill()
        wait_for(lambda: get(f"{api}/health", token=False)[0] == 503, 30, "/health degraded")
        parts = json.loads(get(f"{api}/health", token=False)[1])["parts"]
        assert parts["history"]["up"] and not parts["broker"]["up"], parts
        assert "unreachable" in parts["broker"]["reason"] and parts["broker"]["retry_in_s"] is not None, parts
        assert get(f"{api}/api/v1/runs")[0] == 200  # the history's routes still answer
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
            assert 'm1000_fleet_serve_part_up{part="broker"} 0.0' in r.read().decode()
        time.sleep(2)
        assert serve.poll() is None
        own_redis.start()
        wait_for(lambda: get(f"{api}/health", token=False)[0] == 200, 60, "/health ok again")
        log = (tmp_path / "serve.log").read_text()
        assert "broker unreachable since" in log and "broker reachable again after" in log, log
        assert "Traceback" not in log and serve.poll() is None
    finally:
        _kill_group(serve)


def test_serve_started_while_postgres_is_down_waits_for_it(pg: PostgresServer, tmp_path: Path) -> None:
    """A PostgreSQL server not up yet when serve starts (both started with the host): serve waits, saying so once,
    then starts its API."""
    url = pg.fresh_database()
    pg.stop()
    lab = make_lab(tmp_path / "lab", ("filesystem://", None), 1)
    lab.settings = lab.settings.model_copy(update={"history": url})
    api_port = free_port()
    exe = Path(sys.executable).parent / "fleetctl"
    with (tmp_path / "serve.log").open("wb") as out:
        serve = subprocess.Popen([str(exe), "serve", "--interval", "0.3", "--api-port", str(api_port), "--tokens",
                                  str(write_tokens(tmp_path / "tokens", TOKEN))], env=lab.env(), stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: "run history unreachable since" in (tmp_path / "serve.log").read_text(), 30, "the wait said")
        time.sleep(2)
        assert serve.poll() is None, (tmp_path / "serve.log").read_text()
        pg.start()
        wait_port(api_port, serve)
        assert get(f"http://127.0.0.1:{api_port}/health", token=False)[0] == 200
        log = (tmp_path / "serve.log").read_text()
        assert log.count("run history unreachable since") == 1 and "Traceback" not in log, log
    finally:
        _kill_group(serve)
