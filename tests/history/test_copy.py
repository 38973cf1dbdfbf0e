"""``fleetctl history copy``: a SQLite history written by today's code copied into another history on either
engine (a fresh SQLite file; a fresh PostgreSQL database, slow tier), compared run by run: every row, progress,
event, verdict, baseline, telemetry summary, fingerprint and webhook record; copying again is idempotent, and a
run that was running when copied is brought up to date."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from contract.fingerprint import EnvFingerprint
from contract.records import ResultRow, RunProgress, RunState, TelemetrySummary
from controller.history import VERDICT_EVENT, History, HistoryError, copy_history, url_digest
from controller.settings import ControllerSettings


def _row(run: str, module: str, key: str, profile: str, tps: float, **more: Any) -> ResultRow:
    return ResultRow(run_id=run, module=module, release="1.0", model_key=key, table="sweep", profile=profile,
                     model="m", decode_tps=tps, prefill_len=128, **more)


def _source(path: Path) -> History:
    h = History(path)
    h.create_run("r1", release="1.0", sha256="s1", models=["a"], modules=["m1", "m2"], module_models={"m2": ["a"]})
    h.set_dispatched("r1", "high", 100.5)
    h.set_started_by("r1", "ana")
    h.upsert_progress_many([
        RunProgress(run_id="r1", module="m1", state=RunState.DONE, updated_at=20.0, started_at=101.0,
                    fingerprint=EnvFingerprint(driver="d1")),
        RunProgress(run_id="r1", module="m2", state=RunState.DONE, updated_at=21.0, started_at=102.0)])
    h.upsert_rows([_row("r1", m, "a", f"p{i}", 10.0 + i, correct=i % 2 == 0, flags=("jit",) if i else (),
                        extra={"k": str(i)}) for m in ("m1", "m2") for i in range(3)])
    h.upsert_rows([_row("r1", "m1", "a", "p0", 9.0, source="probe")])
    h.upsert_telemetry(TelemetrySummary(run_id="r1", module="m1", tool="mthreads-gmi", samples=3))
    h.add_event("r1", "m1", "dispatched")
    h.webhook_targets(["http://hook/a"])
    h.set_run_state("r1", "done", "fail", line="FAIL r1: qwen3 decode -8 %", findings='{"regressions": [1]}')
    h.mark_webhook("r1", VERDICT_EVENT, url_digest("http://hook/a"), "delivered")
    h.add_baseline("1.0", [_row("x", "ref", "a", "p0", 11.0)], source="reference")
    h.add_module_event("m2", "reset: failed runs cleared")
    h.create_run("r2", release="1.1")  # still running when copied
    h.upsert_rows([_row("r2", "m1", "a", "p0", 12.0)])
    return h


def _everything(h: History) -> dict[str, Any]:
    """What a user reads back of a history, run by run (the runs' order included)."""
    out: dict[str, Any] = {"runs": [r.model_dump() for r in h.runs(kind="run")],
                           "baseline_runs": [r.model_dump() for r in h.runs(kind="baseline")],
                           "baselines": [{k: v for k, v in b.items()} for b in h.baselines()],
                           "m2 events": h.module_events("m2")}
    for run in ("r1", "r2", h.baseline_run_id(release="1.0") or ""):
        out[run] = {"rows": h.rows(run, source=None), "progress": h.progress(run), "events": h.events(run),
                    "telemetry": h.telemetry(run), "fingerprints": h.fingerprints(run),
                    "webhooks": h.webhook_outcomes(run)}
    return out


def test_a_history_is_copied_whole_and_again_idempotently(tmp_path: Path, location: str | Path) -> None:
    src = _source(tmp_path / "src.sqlite")
    dst = History(location)
    done = copy_history(src.db, dst.db)
    assert (done.copied, done.current, done.replaced, done.module_events, done.targets) == (3, 0, 0, 1, 1)
    want = _everything(src)
    assert _everything(dst) == want
    assert len(want["r1"]["rows"]) == 7 and want["runs"][1]["verdict_line"] == "FAIL r1: qwen3 decode -8 %"
    assert dst.row_frame(["r1"])["decode_tps"].sum() == pytest.approx(src.row_frame(["r1"])["decode_tps"].sum())
    # again: nothing doubled (the events table has no key: a second insert would show)
    again = copy_history(src.db, dst.db)
    assert (again.copied, again.current, again.replaced, again.module_events, again.targets) == (0, 3, 0, 0, 0)
    assert _everything(dst) == want
    # the running run ends with more rows: the next copy brings it up to date
    src.upsert_rows([_row("r2", "m2", "a", "p0", 13.0)])
    src.set_run_state("r2", "done", "pass")
    later = copy_history(src.db, dst.db)
    assert (later.copied, later.current, later.replaced) == (0, 2, 1)
    assert _everything(dst) == _everything(src)
    assert [(e.run_id, e.verdict) for e in dst.pending_webhooks(dst.webhook_targets(["http://hook/a"]),
                                                                 max_age=3600)] == [("r2", "pass")]
    with pytest.raises(HistoryError, match="cannot be copied into itself"):
        copy_history(src.db, History(tmp_path / "src.sqlite").db)
    src.close()
    dst.close()


def test_fleetctl_history_copy_prints_what_it_did(tmp_path: Path, location: str | Path) -> None:
    _source(tmp_path / "src.sqlite").close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    cmd = [str(Path(sys.executable).with_name("fleetctl")), "--history", str(tmp_path / "src.sqlite"), "history",
           "copy", "--to", str(location)]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    shown = ControllerSettings(history=str(location)).history_path  # a URL without its credentials
    assert " ".join(first.stdout.split()) == (f"3 run(s) copied, 0 already current, 0 brought up to date; 1 module "
                                              f"event(s) and 1 webhook target(s) added ({tmp_path / 'src.sqlite'} -> "
                                              f"{shown})")
    again = subprocess.run([*cmd, "-o", "json"], env=env, capture_output=True, text=True, timeout=60)
    assert json.loads(again.stdout) == {"copied": 0, "current": 3, "replaced": 0, "module_events": 0,
                                        "webhook_targets": 0}
