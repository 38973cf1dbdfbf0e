"""Scale smoke test: 50 cheap simulated modules on a real redis-server, one validation.

Every module is a real ``fleet-agent`` worker running the real release's scripts, made cheap
(``simulator/cheap.py``). The controller dispatches and syncs in this process, as ``fleetctl
validate`` does, so its CPU is measured: it must stay within ``CPU_PER_MODULE`` per module for the
whole run (dispatch and every sync pass; measured ~5-10 ms, the bound leaves room for a busy machine).
Every module ends done and every row reaches the history.
"""

from __future__ import annotations

import os
import time

import pytest

from agent.store import RunStore
from agent.validate import stage_local_release
from contract.files import sha256_file
from controller.fleet import Fleet
from controller.history import History
from simulator.cheap import cheap_module_env
from tests.support.lab import make_lab
from tests.support.redis_server import REDIS, RedisServer

pytestmark = [pytest.mark.slow, pytest.mark.redis]

N = int(os.environ.get("FLEET_SCALE_TEST_MODULES", "50"))
CPU_PER_MODULE = 0.040  # s of controller CPU per module for one validation (dispatch + sync passes)


@pytest.fixture
def redis_server(tmp_path):
    if not REDIS:
        pytest.skip("redis-server not installed (make test installs Debian's redis-server)")
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_fifty_cheap_modules_one_validation(tmp_path, redis_server):
    from simulator import build_release

    lab = make_lab(tmp_path / "lab", (redis_server.url, redis_server), N, heartbeat_interval=2.0,
                   offline_after=30.0)
    rel = build_release(tmp_path / "release", noise=0.0, seed=5)
    try:
        for i in range(0, N, 10):  # in batches, each up before the next: no start-up storm on two cores
            batch = lab.names[i:i + 10]
            lab.start(batch, sim_env={n: cheap_module_env(time_scale=1000.0) for n in batch})
        history = History(lab.settings.history_path)
        fleet = Fleet(lab.settings, history)
        mods = list(lab.state().inventory().modules)
        sha = sha256_file(rel.path)
        staged = stage_local_release(rel.path, sha, lab.settings.data_dir)
        c0, t0 = time.process_time(), time.monotonic()
        fleet.dispatch(run_id="scale-smoke", modules=mods, tarballs={m.name: str(staged) for m in mods},
                       sha256=sha, release=rel.version, models=("qwen3",))
        while not (view := fleet.sync("scale-smoke")).finished:
            assert time.monotonic() - t0 < 60, f"not finished in 60 s: {view.state()}"
            time.sleep(0.5)
        cpu = time.process_time() - c0
        bad = {m: p.error.one_line() if p and p.error else None for m, p in view.progress.items()
               if p is None or p.state.value != "done"}
        bad |= {f"{m}/{o.model_key}": o.error.one_line() if o.error else o.status for m, p in view.progress.items()
                if p is not None for o in p.outcomes if o.status == "failed"}
        assert view.state() == "done" and not bad, bad
        for name in lab.names:  # every row of every module is in the history (the probe's rows beside them too)
            local = sorted((r.source, r.model_key, r.profile) for r in RunStore(lab.base / "modules" / name / "work")
                           .rows("scale-smoke"))
            assert local and local == sorted((r.source, r.model_key, r.profile)
                                             for r in history.rows("scale-smoke", name, source=None))
        assert history.row_count("scale-smoke") == N
        assert cpu <= CPU_PER_MODULE * N, f"controller CPU {cpu:.2f} s for {N} modules"
        print(f"{N} modules: {time.monotonic() - t0:.1f} s, controller CPU {cpu * 1e3 / N:.1f} ms per module")
        fleet.close()
        history.close()
    finally:
        lab.stop()
