"""Two controllers on one PostgreSQL history (issue 33's acceptance): real ``fleetctl watch`` processes follow the
same run of a simulated lab into one database; one is SIGKILLed mid-sync; the run ends with every row of each
module stored once and its verdict recorded once (one run record, one webhook event)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agent.store import RunStore
from controller.history import VERDICT_EVENT, History
from tests.support.lab import make_lab
from tests.support.postgres_server import PostgresServer
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow
MODULES = ("sim-01", "sim-02")
KEYS = "qwen3,qwen35_mtp"


def _watch(env: dict[str, str], run_id: str, log: Path) -> subprocess.Popen[bytes]:
    exe = Path(sys.executable).parent / "fleetctl"
    with log.open("wb") as out:
        return subprocess.Popen([str(exe), "watch", run_id], env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def test_two_controllers_one_killed_mid_sync_store_every_row_once_and_one_verdict(
        pg_server: PostgresServer, tmp_path: Path) -> None:
    from simulator import build_release

    release = build_release(tmp_path / "release", time_scale=50.0, noise=0.0, seed=3)
    url = pg_server.fresh_database()
    lab = make_lab(tmp_path / "lab", ("filesystem://", None), len(MODULES))
    lab.settings = lab.settings.model_copy(update={"history": url})
    procs: list[subprocess.Popen[bytes]] = []
    history = History(url)
    try:
        lab.start()
        r = lab.fleetctl("validate", str(release.path), "--models", KEYS, "--devices", ",".join(MODULES), "--detach")
        assert r.returncode == 0, r.stderr
        run_id = r.stdout.strip().splitlines()[-1]
        killed = _watch(lab.env(), run_id, tmp_path / "killed.log")
        survivor = _watch(lab.env(), run_id, tmp_path / "survivor.log")
        procs += [killed, survivor]
        wait_for(lambda: history.row_count(run_id) > 0, 120, "the first rows synced")
        assert killed.poll() is None, (tmp_path / "killed.log").read_text()
        os.killpg(killed.pid, signal.SIGKILL)  # mid-sync: the run is still going on the modules
        killed.wait(timeout=10)
        try:
            code = survivor.wait(timeout=180)
        except subprocess.TimeoutExpired:
            pytest.fail("the surviving controller did not end: " + (tmp_path / "survivor.log").read_text()[-2000:])
        log = (tmp_path / "survivor.log").read_text()
        assert code in (0, 1) and "verdict:" in log, log

        for m in MODULES:
            local = sorted((r.source, r.model_key, r.profile, r.ttft_ms) for r in RunStore(
                lab.base / "modules" / m / "work").rows(run_id))
            stored = sorted((r.source, r.model_key, r.profile, r.ttft_ms) for r in history.rows(run_id, m, source=None))
            assert local and stored == local, f"{m}: rows on the module and in the history differ"
        run = history.run(run_id)
        assert run is not None and run.state != "running" and run.verdict is not None
        assert run.verdict_line is not None and run.verdict_line.split()[0] == run.verdict.upper()
        (runs,) = history.db.execute("SELECT COUNT(*) FROM runs WHERE run_id=?", (run_id,)).fetchone()
        events = history.db.execute("SELECT verdict FROM webhook_outbox WHERE run_id=? AND event=?",
                                    (run_id, VERDICT_EVENT)).fetchall()
        assert runs == 1 and [e[0] for e in events] == [run.verdict]
        # the killed controller's replacement finds the run ended and judged: nothing doubled
        again = lab.fleetctl("status", run_id)
        assert again.returncode in (0, 1), again.stderr
        assert history.db.execute("SELECT COUNT(*) FROM webhook_outbox WHERE run_id=?", (run_id,)).fetchone() == (1,)
        assert history.row_count(run_id) == sum(1 for m in MODULES for r in RunStore(
            lab.base / "modules" / m / "work").rows(run_id) if r.source == "release")
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
        history.close()
        lab.stop()
