"""The ``trend.change_point`` webhook event: queued when a finished run makes a change point across the release
history detectable (once: the runs after it do not queue it again), sent by ``fleetctl serve`` to a real test HTTP
server, signed, with the change points in its body."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.history import CHANGE_POINT_EVENT
from controller.service.lifecycle import queue_change_check, queue_change_points
from controller.service.webhooks import EVENT_HEADER, SIGNATURE_HEADER, verify
from controller.settings import ControllerSettings
from tests.support.frames import reference  # noqa: F401 - the fixture, registered by name
from tests.support.trend import add_release, release_history
from tests.support.webhooks import serve_once, with_hooks

SLOWER = {("qwen3", "decode_tps"): 0.10}  # fleet(regress=...): decode 10 % slower


def test_a_run_that_makes_a_change_point_detectable_sends_it_once(tmp_path: Path, reference, receiver):  # noqa: F811
    settings = with_hooks(ControllerSettings(broker_url="filesystem://", data_dir=tmp_path / "fleet",
                                             history=tmp_path / "history.sqlite"), tmp_path, receiver.url)
    h = release_history(settings.history_path, reference, releases=8, regress=SLOWER)  # the change at 1.6.0
    try:
        serve_once(settings)  # the URL is registered
        assert queue_change_points(h, h.find_run("run-7"), "pass", "done") == 0  # 2 releases after it: too few yet
        add_release(h, reference, 8, regress=SLOWER)
        assert queue_change_points(h, h.find_run("run-8"), "pass", "done") >= 1  # the third release after names it
        add_release(h, reference, 9, regress=SLOWER)
        assert queue_change_points(h, h.find_run("run-9"), "pass", "done") == 0  # named once, not again
    finally:
        h.close()
    serve_once(settings)
    assert len(receiver.got) == 1
    headers, body = receiver.got[0]
    assert headers[EVENT_HEADER.lower()] == CHANGE_POINT_EVENT == "trend.change_point"
    assert verify(b"a-shared-webhook-secret-0123456789", body, headers[SIGNATURE_HEADER.lower()])
    doc = receiver.json()
    assert (doc["event"], doc["run_id"], doc["release"]) == ("trend.change_point", "run-8", "1.8.0")
    cps = doc["change_points"]
    assert {(c["release"], c["previous"], c["model_key"], c["in_force"]) for c in cps} == {
        ("1.6.0", "1.5.0", "qwen3", "yes")}
    assert {c["metric"] for c in cps} <= {"decode_tps", "tpot_ms"} and "fleet" in {c["scope"] for c in cps}
    assert all(-0.13 < c["size_value"] < -0.07 for c in cps if c["metric"] == "decode_tps")
    assert doc["line"].startswith(f"{len(cps)} new change points with run run-8 (1.8.0): qwen3 ")
    serve_once(settings)
    assert len(receiver.got) == 1  # delivered once


def test_an_ended_run_queues_its_search_for_serve_which_sends_what_it_finds(tmp_path: Path, reference,  # noqa: F811
                                                                            receiver):
    """The path that ends a run (``service.judge``) queues the search (``trend.check``) instead of running it;
    ``fleetctl serve`` runs it in a thread of its own and sends the ``trend.change_point`` event it queues."""
    settings = with_hooks(ControllerSettings(broker_url="filesystem://", data_dir=tmp_path / "fleet",
                                             history=tmp_path / "history.sqlite"), tmp_path, receiver.url)
    h = release_history(settings.history_path, reference, releases=9, regress=SLOWER)  # run-8 names the change at 1.6.0
    try:
        serve_once(settings)  # the URL is registered
        assert queue_change_check(h, h.find_run("run-8"), "pass", "PASS run-8", "done")
        assert not h.pending_webhooks(h.webhook_targets([receiver.url]), max_age=60)[0].payload  # nothing searched
    finally:
        h.close()
    serve_once(settings)  # the check runs, its event is queued and sent
    assert [headers[EVENT_HEADER.lower()] for headers, _ in receiver.got] == [CHANGE_POINT_EVENT]
    assert receiver.json()["run_id"] == "run-8" and receiver.json()["change_points"]
    serve_once(settings)
    assert len(receiver.got) == 1  # the check is not run nor sent again


@pytest.mark.slow
def test_a_growing_drift_is_sent_once_not_at_every_run(tmp_path: Path, reference):  # noqa: F811
    """decode_tps 1 % slower a release from 1.4.0 on: the runs after the one that names it find the drift again
    with its start and end moved (estimates, as the history grows) or find it first as a step: each overlaps what
    the history without the run had, so it is not sent again."""
    from controller.report.load import history_frames, read_rows, run_keys
    from controller.report.trend import new_changes

    h = release_history(tmp_path / "history.sqlite", reference, releases=0)
    sent: dict[str, list[tuple[int, str, str, str]]] = {}  # per profile: (run, kind, release, until)
    try:
        for i in range(22):
            add_release(h, reference, i, regress={("qwen3", "decode_tps"): 0.01 * max(0, i - 3)})
            info = h.find_run(f"run-{i}")
            rows, runs = history_frames(h, run_keys(info, read_rows(h, [info.run_id])))
            for c in new_changes(rows, runs, info.run_id):
                if c.module == "*" and c.metric == "decode_tps":
                    sent.setdefault(c.profile, []).append((i, c.change.kind, c.release, c.until))
    finally:
        h.close()
    profiles = set(reference.loc[reference["model_key"] == "qwen3", "profile"])
    assert set(sent) == profiles, sent  # every profile's series drifted, and each was named
    for profile, events in sent.items():
        assert len(events) == 1 or [e[1] for e in events] == ["step", "drift"], (profile, events)  # the drift it grew
        assert events[-1][0] <= 13, (profile, events)  # into at most; none sent in the last 8 runs
