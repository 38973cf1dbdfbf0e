"""A bisection probes only on modules it may use: not on one another user holds reserved (fast tier: the embedded
broker, heartbeats written as a live agent writes them, no workers)."""

from __future__ import annotations

import time
from pathlib import Path

from contract.kv import KV
from contract.records import Heartbeat, RunProgress, RunState
from controller.service import Session
from controller.service.bisect import _usable
from controller.service.bisect_state import BisectRecord, BisectRun, Candidate
from controller.service.reservations import reserve
from controller.settings import ControllerSettings

INV = "".join(f'[[module]]\nname = "{m}"\ntransport = "local"\n' for m in ("sim-01", "sim-02"))


def test_a_bisection_leaves_out_a_module_another_user_reserved(tmp_path: Path) -> None:
    (tmp_path / "inv.toml").write_text(INV)
    settings = ControllerSettings(broker_url="filesystem://", data_dir=tmp_path / "fleet",
                                  inventory=tmp_path / "inv.toml", history=tmp_path / "history.sqlite")
    with Session(settings, user="dave") as s:
        h, kv = s.history(), KV(s.fleet().app)
        h.create_run("good-run", release="1.4.1", modules=["sim-01", "sim-02"])
        now = time.time()
        h.upsert_progress_many([RunProgress(run_id="good-run", module=m, release="1.4.1", state=RunState.DONE,
                                            step="done", updated_at=now, finished_at=now)
                                for m in ("sim-01", "sim-02")])
        for m in ("sim-01", "sim-02"):
            kv.put_heartbeat(Heartbeat(module=m, agent_version="t", ts=time.time()))
        rec = BisectRecord(bisect_id="b1", created_at=now, candidates=(Candidate(version="1.4.1", source="x"),),
                           models=("qwen3",), devices="all", modules=("sim-01", "sim-02"),
                           runs=(BisectRun(run_id="good-run", role="good", index=0),))
        assert _usable(s, rec) == ["sim-01", "sim-02"]
        reserve(s, "sim-01", 3600, "flashing", user="carol")
        assert _usable(s, rec) == ["sim-02"]  # dave's bisection: not on carol's module
    with Session(settings, user="carol") as s:
        assert _usable(s, rec) == ["sim-01", "sim-02"]  # her own bisection uses it
