"""Golden checks on a schedule, on real workers: with ``golden_every_runs = 1`` a ``fleetctl serve`` pass
dispatches a golden check to the module that ran a validation (not to the one that ran none, nor while a user
holds it reserved), judges it when it
ends (the module's golden history starts); after the module's device slows down and it runs another validation,
the next scheduled check finds it drifted and it goes ``bad``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from controller.history import History
from tests.support.lab import make_lab

pytestmark = pytest.mark.slow


def test_serve_schedules_golden_checks_after_validations_and_a_drifted_module_goes_bad(tmp_path: Path):
    from simulator import build_release

    rel = build_release(tmp_path / "rel", version="1.4.1", time_scale=50.0, noise=0.01, seed=7)
    # the validations only make a check due (any release counts, their figures are not judged): time scale 1000
    quick = build_release(tmp_path / "quick", version="1.4.2", time_scale=1000.0, noise=0.01, seed=7)
    lab = make_lab(tmp_path / "lab", ("filesystem://", None), 2)
    lab.start()
    env = {**lab.env(), "FLEET_GOLDEN_RELEASE": str(rel.path), "FLEET_GOLDEN_EVERY_RUNS": "1"}
    exe = str(Path(sys.executable).parent / "fleetctl")

    def serve_once() -> str:
        r = subprocess.run([exe, "serve", "--once"], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return r.stdout + r.stderr

    def scheduled_check(module: str) -> str:
        out = serve_once()
        found = re.findall(r"golden check on (\S+) \(.*\): dispatched (\S+)", out)
        assert [m for m, _ in found] == [module], out
        run_id = found[0][1]
        deadline = time.monotonic() + 240
        while f"run {run_id} finished" not in out:  # serve judges what it sees end
            assert time.monotonic() < deadline, out
            time.sleep(2)
            out = serve_once()
        return run_id

    def validate() -> None:
        r = lab.fleetctl("validate", str(quick.path), "--models", "qwen3", "--devices", "sim-01", timeout=300)
        assert r.returncode in (0, 1) and "sim-01: done, ok" in r.stderr, r.stderr  # 1: its verdict (no baseline)

    try:
        validate()
        gone = {**env, "FLEET_GOLDEN_RELEASE": str(tmp_path / "gone.tgz")}
        wrong = subprocess.run([exe, "serve", "--once"], env=gone, capture_output=True, text=True, timeout=120)
        assert wrong.returncode == 0 and "golden check on sim-01 (1 validation(s) and no golden check yet): " \
            "not dispatched: " in wrong.stdout + wrong.stderr, wrong.stdout + wrong.stderr
        r = lab.fleetctl("reserve", "--devices", "sim-01", "--for", "1h", user="carol")
        assert r.returncode == 0, r.stderr
        assert "golden check" not in serve_once()  # due, but reserved: no check goes there
        assert lab.fleetctl("unreserve", user="carol").returncode == 0
        first = scheduled_check("sim-01")  # sim-02 ran no validation: not due
        h = History(lab.settings.history_path)
        assert h.find_run(first).note == "golden check 1.4.1" and h.find_run(first).modules == ("sim-01",)
        assert "golden check" not in serve_once()  # no validation since: nothing due
        lab.kill("sim-01")
        lab.start(["sim-01"], sim_env={"sim-01": {"M1000_SIM_SPEED": "decode=0.88"}})
        validate()
        scheduled_check("sim-01")
        r = lab.fleetctl("devices", "-o", "json")
        st = {d["module"]: d for d in json.loads(r.stdout)}
        assert st["sim-01"]["state"] == "bad", st["sim-01"]
        assert st["sim-01"]["reason"].startswith("golden check: sim-01 drifted: qwen3 decode_tps")
        assert st["sim-02"]["state"] == "idle"
        assert "golden check" not in serve_once()  # a bad module is not checked again
    finally:
        lab.stop()
