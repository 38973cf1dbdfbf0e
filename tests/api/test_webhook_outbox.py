"""The webhook outbox in the run history: a verdict recorded while ``fleetctl serve`` was down (an
attached ``fleetctl validate``) is sent when serve starts, once, to a real test HTTP server, with a
valid signature and a delivery id that stays the same; verdicts from before a URL was configured
are not sent to it; the outbox stores no webhook URL (only its sha256)."""

from __future__ import annotations

from controller.history import History
from controller.serve.daemon import Notifier
from controller.service import Session
from controller.service.webhooks import DELIVERY_HEADER, SIGNATURE_HEADER, Webhooks, verify
from tests.support.frames import reference  # noqa: F401 - the fixture, registered by name
from tests.support.webhooks import serve_once, with_hooks


def test_a_verdict_recorded_while_serve_was_down_is_sent_when_it_starts(controller, receiver, tmp_path):
    settings = with_hooks(controller, tmp_path, receiver.url + "?token=hook-secret-in-url")
    h = History(controller.history_path)  # a verdict recorded before the webhook was ever configured
    h.set_run_state("run-a", "done", verdict="pass", line="PASS run-a")
    h.close()
    serve_once(settings)  # serve runs once with the webhook: the URL is registered, run-a is not sent
    assert receiver.got == []
    # serve is down; an attached fleetctl records run-b's verdict (as service.judge does, without the
    # report that takes seconds to build: the CI flow test goes through judge)
    h = History(controller.history_path)
    h.set_run_state("run-b", "done", verdict="regressed", line="REGRESSED run-b: qwen3 decode 8 % slower")
    h.close()
    serve_once(settings)  # serve starts: the pending verdict goes out
    assert len(receiver.got) == 1
    headers, body = receiver.got[0]
    assert verify(b"a-shared-webhook-secret-0123456789", body, headers[SIGNATURE_HEADER.lower()])
    doc = receiver.json()
    assert (doc["event"], doc["run_id"], doc["verdict"]) == ("run.verdict", "run-b", "regressed")
    assert doc["verdict_line"] == "REGRESSED run-b: qwen3 decode 8 % slower"
    serve_once(settings)  # delivered once: not again
    assert len(receiver.got) == 1
    h = History(controller.history_path)
    try:
        assert list(h.webhook_outcomes("run-b").values()) == ["delivered"]
        stored = "\n".join(h.conn.iterdump())
    finally:
        h.close()
    assert "hook-secret-in-url" not in stored and receiver.url not in stored


def test_notifier_resends_what_was_in_flight_with_the_same_delivery_id(controller, receiver):
    """A service stopped before a delivery's outcome was recorded sends it again at its next start,
    under the same X-Fleet-Delivery id (a receiver may de-duplicate on it)."""
    with Session(controller) as s:
        hooks = Webhooks([receiver.url], b"0123456789abcdef-secret")
        try:
            Notifier(s, hooks)  # registers the URL
            s.history().set_run_state("run-b", "done", verdict="regressed", line="REGRESSED run-b")
            first = Notifier(s, hooks)
            assert first.drain() == 1
            for fut in first.inflight.values():
                assert fut.result(timeout=10) is True
            # stopped here: the outcome was never recorded; the next service sends it again
            again = Notifier(s, hooks)
            assert again.drain() == 1
            again.wait(timeout=10)
            assert again.drain() == 0 and Notifier(s, hooks).drain() == 0
        finally:
            hooks.close(wait=True)
    assert len(receiver.got) == 2
    assert receiver.got[0][0][DELIVERY_HEADER.lower()] == receiver.got[1][0][DELIVERY_HEADER.lower()]


def test_two_services_on_one_history_send_an_event_once(controller, receiver):
    """Two services (other hosts or data folders) draining one history: the one that claims an event's URL sends
    it; the other sends nothing, while the delivery is in flight nor after it is recorded."""
    with Session(controller) as s:
        hooks = Webhooks([receiver.url], b"0123456789abcdef-secret")
        try:
            Notifier(s, hooks)  # registers the URL
            s.history().set_run_state("run-b", "done", verdict="regressed", line="REGRESSED run-b")
            a, b = Notifier(s, hooks, holder="host-a:/srv/fleet"), Notifier(s, hooks, holder="host-b:/srv/fleet")
            assert (a.drain(), b.drain()) == (1, 0)
            a.wait(timeout=10)
            assert (a.drain(), b.drain()) == (0, 0)
        finally:
            hooks.close(wait=True)
    assert len(receiver.got) == 1


def test_a_verdict_event_carries_its_findings_with_their_intervals(controller, receiver, tmp_path,
                                                                  reference):  # noqa: F811 - the fixture
    """The webhook body carries the verdict's regressions and outliers, each with its 95 % interval
    (``ci_low``/``ci_high``), as the history queued them with the verdict (issue 30, item 3)."""
    from controller.report import analyse
    from controller.report.render import findings_json, verdict_line
    from controller.report.synth import fleet

    cur = fleet(reference, module_factor={"m03": 0.88}, regress={("qwen3", "decode_tps"): 0.08}, seed=1)
    rep = analyse(cur, run_id="run-b", baseline=reference, baseline_id="b")
    settings = with_hooks(controller, tmp_path, receiver.url)
    serve_once(settings)  # the URL registered: what is queued from now on is sent to it
    h = History(controller.history_path)
    h.set_run_state("run-b", "done", verdict=rep.verdict, line=verdict_line(rep), findings=findings_json(rep))
    h.close()
    serve_once(settings)
    doc = receiver.json()
    (reg,), (o,) = rep.regressions, rep.outliers
    assert [(x["module"], x["model_key"], x["metric"], x["change"], x["ci_low"], x["ci_high"])
            for x in doc["regressions"]] == [("*", "qwen3", "decode_tps", reg.change, reg.ci_low, reg.ci_high)]
    assert [(x["module"], x["factor"], x["ci_low"], x["ci_high"]) for x in doc["outliers"]] == [
        ("m03", o.factor, o.ci_low, o.ci_high)]
    assert reg.ci_low is not None and o.ci_low is not None
    assert f"[{reg.ci_low:+.1%}, {reg.ci_high:+.1%}]" in doc["verdict_line"]


def test_a_judged_verdict_is_sent_with_its_report_findings(controller, receiver, tmp_path):
    """Through ``service.judge`` (what serve and an attached fleetctl call): the outbox keeps the report's
    findings with the verdict, and the webhook body carries them with their intervals."""
    from controller import service

    settings = with_hooks(controller, tmp_path, receiver.url)
    serve_once(settings)
    with Session(controller) as s:
        j = service.judge(s, "run-b")
    assert j.report is not None and j.report.regressions and j.report.outliers
    serve_once(settings)
    doc = receiver.json()
    assert doc["run_id"] == "run-b" and doc["verdict_line"] == j.line
    assert [(x["module"], x["model_key"], x["metric"], x["ci_low"], x["ci_high"]) for x in doc["regressions"]] == [
        (r.module, r.model_key, r.metric, r.ci_low, r.ci_high) for r in j.report.regressions]
    assert [(x["module"], x["ci_low"], x["ci_high"]) for x in doc["outliers"]] == [
        (o.module, o.ci_low, o.ci_high) for o in j.report.outliers]

