"""A dispatch's requests recorded with their parts and not yet sent (ADR 0060): the history's side, and the pure
rule of which parts a follower sends them to."""

from __future__ import annotations

from pathlib import Path

from contract.records import RunProgress, RunState
from controller.fleet.dispatch import still_queued
from controller.history import History, UnsentRequest


def _req(module: str, at: float, run_id: str = "r1") -> UnsentRequest:
    return UnsentRequest(run_id=run_id, module=module, payload={"run_id": run_id, "module": module},
                         priority="normal", started_by="ana", created_at=at)


def test_recorded_with_the_progress_read_by_age_and_marked_sent(tmp_path: Path) -> None:
    h = History(tmp_path / "h.sqlite")
    queued = [RunProgress(run_id="r1", module=m, release="1.4.1", step="queued", keys_total=1, updated_at=10.0)
              for m in ("m0", "m1")]
    h.record_queued(queued, [_req("m0", 10.0), _req("m1", 20.0), _req("m0", 10.0, run_id="r2")])
    assert set(h.progress("r1")) == {"m0", "m1"}  # the same transaction as the requests
    assert [r.module for r in h.unsent("r1")] == ["m0", "m1"]
    assert [r.module for r in h.unsent("r1", before=15.0)] == ["m0"]  # m1's may still be on its way
    assert h.unsent("r1")[0].payload == {"run_id": "r1", "module": "m0"}
    h.record_queued([], [_req("m0", 30.0)])  # a resumed dispatch records it again: one request, the newest
    assert [(r.module, r.created_at) for r in h.unsent("r1")] == [("m0", 30.0), ("m1", 20.0)]
    h.mark_sent("r1", ["m0"])
    assert [r.module for r in h.unsent("r1")] == ["m1"]
    h.mark_sent("r1")
    assert h.unsent("r1") == [] and [r.module for r in h.unsent("r2")] == ["m0"]
    h.close()


def test_a_follower_sends_only_to_a_part_its_module_has_not_started() -> None:
    base = RunProgress(run_id="r1", module="m0", release="1.4.1", step="queued", keys_total=1, updated_at=1.0)
    assert still_queued(base)
    assert not still_queued(None)  # no part recorded: nothing to send it for
    assert not still_queued(base.model_copy(update={"step": "unpack", "started_at": 2.0}))
    assert not still_queued(base.model_copy(update={"started_at": 2.0}))
    assert not still_queued(base.model_copy(update={"state": RunState.CANCELLED}))  # cancelled before it was sent
