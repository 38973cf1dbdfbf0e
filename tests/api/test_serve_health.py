"""``fleetctl serve``'s parts (issue 48, item 1): what :class:`Health` records, how a pass is tried again with backoff
(:func:`until_reached`: an attempt that fails is the seam) and what ``GET /health`` and the 503 gate answer."""

from __future__ import annotations

import threading

from fastapi import FastAPI
from fastapi.testclient import TestClient

from controller.fleet import BrokerUnavailable
from controller.history import HistoryStopped, HistoryUnavailable
from controller.serve.health import Health, add_health, needs_history, until_reached


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_part_down_then_up_keeps_its_first_failure_time_and_says_how_long() -> None:
    clock = Clock()
    h = Health(clock)
    assert h.as_json()["status"] == "ok" and h.up("history") is None
    assert h.down("history", "server gone") is True
    clock.now += 5
    assert h.down("history", "connection refused", retry_at=clock.now + 2) is False  # still down: since kept
    st = h.state("history")
    assert st.since == 1000.0 and st.reason == "connection refused"
    line = st.line(clock.now)
    assert line.startswith("run history unreachable since ") and "(5 s): connection refused" in line
    assert line.endswith("fleetctl serve tries again in 2 s")
    body = h.as_json()
    assert body["status"] == "degraded" and body["parts"]["history"]["up"] is False
    assert body["parts"]["broker"]["up"] is True and h.unreachable("history")
    clock.now += 3
    assert h.up("history") == 8.0 and h.as_json()["status"] == "ok"


def test_a_refused_statement_is_failing_not_unreachable() -> None:
    h = Health(Clock())
    h.down("history", "disk full", answers=True)
    assert h.is_down("history") and not h.unreachable("history")
    assert h.state("history").line(1000.0).startswith("run history failing since ")


def test_history_routes() -> None:
    assert needs_history("/api/v1/runs/x", "/api/v1") and needs_history("/links/runs/x/report.html", "/api/v1")
    assert not needs_history("/api/v1/reservations", "/api/v1")
    assert not needs_history("/api/v1/openapi.json", "/api/v1") and not needs_history("/health", "/api/v1")
    assert needs_history("/ui/runs", "/api/v1") and needs_history("/ui/runs/r1/live", "/api/v1")
    assert not needs_history("/ui/login", "/api/v1") and not needs_history("/ui/queue", "/api/v1")


def test_until_reached_retries_with_growing_waits_names_each_part_once_and_says_when_back() -> None:
    h = Health()
    outcomes: list[BaseException | None] = [HistoryUnavailable("history gone"), HistoryUnavailable("still"),
                                            BrokerUnavailable("broker gone"), None]
    said: list[str] = []
    waits: list[float] = []
    stop = threading.Event()
    real_wait = stop.wait

    def wait(timeout: float | None = None) -> bool:  # no sleeping in a fast test: the waits are recorded
        waits.append(timeout or 0.0)
        return False

    stop.wait = wait  # type: ignore[method-assign]  # this event's waits recorded

    def attempt() -> None:
        exc = outcomes.pop(0)
        if exc is not None:
            raise exc

    assert until_reached(attempt, h, stop, said.append) is True
    stop.wait = real_wait  # type: ignore[method-assign]  # and given back
    assert len(waits) == 3 and waits[0] < waits[2]  # backoff: 0.5 s +- jitter, then longer
    assert [s.split(" ", 2)[:2] for s in said[:2]] == [["run", "history"], ["broker", "unreachable"]]
    assert said[-1].startswith("broker reachable again after") and not h.degraded()
    assert sum("run history unreachable" in s for s in said) == 1  # said once, not at each try


def test_until_reached_gives_up_when_stopped() -> None:
    h = Health()
    stop = threading.Event()
    stop.set()

    tries: list[int] = []

    def attempt() -> None:
        tries.append(1)
        raise HistoryStopped("statement timeout")

    assert until_reached(attempt, h, stop, lambda _: None) is False
    assert tries == [1]  # no second try once stopped


def test_health_route_and_the_gate() -> None:
    h = Health()
    app = FastAPI()
    add_health(app, h, "/api/v1")

    @app.get("/api/v1/runs")
    def runs() -> list[str]:
        return ["r1"]

    @app.get("/api/v1/reservations")
    def reservations() -> list[str]:
        return []

    @app.get("/ui/runs")
    def page() -> str:
        return "<p>runs</p>"

    c = TestClient(app)
    assert c.get("/health").json()["status"] == "ok" and c.get("/api/v1/runs").json() == ["r1"]
    h.down("history", "connection refused", retry_at=h.clock() + 7)
    r = c.get("/health")
    assert r.status_code == 503 and r.json()["parts"]["history"]["reason"] == "connection refused"
    r = c.get("/api/v1/runs")
    assert r.status_code == 503 and r.json()["detail"].startswith("run history unreachable since ")
    assert 6 <= int(r.headers["Retry-After"]) <= 7
    assert c.get("/api/v1/reservations").status_code == 200  # the broker's alone
    r = c.get("/ui/runs")  # a person's page: the line in a page, not JSON
    assert r.status_code == 503 and r.headers["content-type"].startswith("text/html")
    assert "run history unreachable since " in r.text and "connection refused" in r.text
    h.down("history", "disk full", answers=True)
    assert c.get("/api/v1/runs").status_code == 200  # reads may still succeed: the route tries
    h.up("history")
    assert c.get("/health").status_code == 200
