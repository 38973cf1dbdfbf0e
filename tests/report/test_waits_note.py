"""The report says how long the run's module parts waited on their queues, and behind which run (issue 32 item 4)."""

from __future__ import annotations

from pathlib import Path

from contract.records import RunProgress, RunState
from controller.history import History
from controller.report.load import build_report


def test_the_report_notes_each_modules_wait_and_what_it_waited_behind(tmp_path: Path) -> None:
    h = History(tmp_path / "h.sqlite")
    try:
        h.create_run("nightly-1203", release="1.4.1", modules=["m-a"])
        h.upsert_progress(RunProgress(run_id="nightly-1203", module="m-a", release="1.4.1", state=RunState.DONE,
                                      started_at=900.0, finished_at=4000.0, updated_at=4000.0))
        h.create_run("rc-2", release="1.4.2", modules=["m-a", "m-b"])
        h.set_dispatched("rc-2", "normal", 1000.0)
        for m, started in (("m-a", 1000.0 + 4320), ("m-b", 1000.4)):  # 1 h 12 min behind the nightly; at once
            h.upsert_progress(RunProgress(run_id="rc-2", module=m, release="1.4.2", state=RunState.BENCHMARKING,
                                          started_at=started, updated_at=started))
        rep = build_report(h, "rc-2", previous=False)
        assert rep.notes[0] == ("waited on the module queues (dispatch to start): m-a 1 h 12 min behind "
                                "'nightly-1203'; m-b 0 s")
        assert not [n for n in build_report(h, "nightly-1203", previous=False).notes if n.startswith("waited")]
    finally:
        h.close()
