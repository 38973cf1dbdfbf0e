"""Roles on the HTTP API (issue 32, item 3): every route registered on the app is walked, each with a token of
each role, and answers 403 exactly where its declared role is above the caller's; a route that declares no
role fails here (and the app refuses to start). Runs and cancels record the token's user."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.routing import RouteContext
from starlette.routing import Mount, Route

from controller.history import History
from controller.serve.api import PREFIX, Role, Tokens, _protected, create_app
from controller.serve.pages import PAGES
from controller.settings import ControllerSettings
from tests.support.cli import INV, TARBALL
from tests.support.http_servers import write_user_tokens

USERS = {Role.read: "rita", Role.trigger: "tom", Role.admin: "ada"}
TOKENS = {role: f"{role.value}-token-0123456789abcdef" for role in Role}
OWNED = "run-a"  # started by the trigger user
OTHERS = "run-b"  # started by someone else
# the routes outside /api/v1, reachable without a token by design (a new one must be added here, knowingly)
PUBLIC = {("GET", f"{PREFIX}/openapi.json"), ("HEAD", f"{PREFIX}/openapi.json"), ("MOUNT", "/docs/static"),
          ("GET", "/docs"), ("GET", "/docs/oauth2-redirect"), ("GET", "/favicon.ico"),
          ("GET", "/links/runs/{run_id}/report.html")}
# what a walked route is given: each path parameter, a query and a body that it answers at once (a 404, a 400:
# the walk checks the role, which is checked before the route's parameters are; {} where nothing is said: a
# caller without the role gets its 403 before the body is looked at)
PATH_VALUES = {"run_id": "no-such-run", "module": "no-such-module", "command": "cycle"}
QUERIES = {("GET", f"{PREFIX}/trend"): {"models": "no-such-key"}}
BODIES = {("POST", f"{PREFIX}/runs"): {"release": "/nowhere/" + TARBALL},
          ("POST", f"{PREFIX}/reservations"): {"devices": "m01", "duration": "forever"}}


def auth(role: Role) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[role]}"}


@pytest.fixture
def app_client(controller: ControllerSettings, tmp_path: Path) -> Iterator:
    from fastapi.testclient import TestClient

    path = write_user_tokens(tmp_path / "tokens", ((USERS[r], r.value, TOKENS[r]) for r in Role))
    h = History(controller.history_path)
    try:
        h.set_started_by(OWNED, USERS[Role.trigger])
        h.set_started_by(OTHERS, "someone")
    finally:
        h.close()
    app = create_app(controller, Tokens.load(path))
    with TestClient(app) as c:
        yield app, c


def walked(app) -> Iterator[tuple[str, str, RouteContext]]:
    """(method, path, route) of every route of the app, its included routers' as included."""
    from fastapi.routing import iter_route_contexts

    for r in iter_route_contexts(app.routes):
        assert r.path is not None, r  # a Mount or a Route: both have one
        if isinstance(r.original_route, Mount):
            yield "MOUNT", r.path, r
        else:
            assert isinstance(r.original_route, Route), r
            for m in sorted(r.methods or ()):
                yield m, r.path, r


def call(client, method: str, path: str, role: Role, run_id: str | None = None):
    values = {**PATH_VALUES, **({"run_id": run_id} if run_id else {})}
    try:
        url = path.format(**values)
    except KeyError as exc:
        raise AssertionError(f"{method} {path}: no value for path parameter {exc}: add one to PATH_VALUES") from None
    body = BODIES.get((method, path), {}) if method in ("POST", "PUT", "PATCH") else None
    return client.request(method, url, headers=auth(role), params=QUERIES.get((method, path)), json=body)


def test_every_route_answers_each_role_as_declared(app_client):
    from controller.serve.access import declared

    app, client = app_client
    seen = 0
    for method, path, route in walked(app):
        if path == PAGES or path.startswith(PAGES + "/"):
            continue  # the run browser's pages: walked by tests/api/test_pages.py with each role's cookie
        if not _protected(path):
            assert (method, path) in PUBLIC, f"{method} {path}: reachable without a token and not in PUBLIC"
            continue
        checks = declared(route)
        assert len(checks) == 1, f"{method} {path}: {len(checks)} declared roles"
        needed = checks[0]
        for role in Role:
            r = call(client, method, path, role)
            if role.allows(needed.role):
                assert r.status_code not in (401, 403), (method, path, role, r.status_code, r.text)
            else:
                assert (r.status_code, r.json()) == (403, {
                    "detail": f"this needs role {needed.role.value}; user {USERS[role]} has role {role.value}"}), \
                    (method, path, role)
            if needed.others is not None and "{run_id}" in path:  # the user's own run, and another user's
                r = call(client, method, path, role, run_id=OWNED)
                assert (r.status_code == 403) == (not role.allows(needed.role)), (method, path, role, r.text)
                r = call(client, method, path, role, run_id=OTHERS)
                assert (r.status_code == 403) == (not role.allows(needed.others)), (method, path, role, r.text)
        seen += 1
    assert seen == 12  # the routes under /api/v1 but the schema: walked, not skipped


def test_the_routes_declare_these_roles(app_client):
    """The roles themselves, as the issue sets them: reading is read, starting or cancelling runs is trigger,
    another user's run is admin."""
    from controller.serve.access import declared

    app, _ = app_client
    got = {(m, p): (declared(r)[0].role.value, declared(r)[0].others) for m, p, r in walked(app) if _protected(p)}
    assert got == {
        ("POST", f"{PREFIX}/runs"): ("trigger", None),
        ("GET", f"{PREFIX}/runs"): ("read", None),
        ("GET", f"{PREFIX}/runs/{{run_id}}"): ("read", None),
        ("GET", f"{PREFIX}/runs/{{run_id}}/report"): ("read", None),
        ("POST", f"{PREFIX}/runs/{{run_id}}/report/link"): ("read", None),
        ("POST", f"{PREFIX}/runs/{{run_id}}/cancel"): ("trigger", Role.admin),
        ("GET", f"{PREFIX}/trend"): ("read", None),
        ("GET", f"{PREFIX}/devices"): ("read", None),
        ("GET", f"{PREFIX}/reservations"): ("read", None),
        ("POST", f"{PREFIX}/reservations"): ("trigger", None),
        ("DELETE", f"{PREFIX}/reservations/{{module}}"): ("trigger", Role.admin),
        ("POST", f"{PREFIX}/devices/{{module}}/power/{{command}}"): ("admin", None),
    }
    ops = app.openapi()["paths"]  # and what the schema tells clients
    assert {(m.upper(), p): (op["x-role"], op.get("x-role-others")) for p, o in ops.items() for m, op in o.items()} \
        == {k: (role, others.value if others else None) for k, (role, others) in got.items()}


def test_a_route_without_a_role_is_refused_at_start(controller):
    from fastapi import FastAPI

    from controller.serve.access import undeclared

    app = FastAPI()

    @app.get(f"{PREFIX}/forgotten")
    def forgotten() -> dict[str, str]:
        return {}

    @app.get("/outside")
    def outside() -> dict[str, str]:
        return {}

    assert undeclared(app.routes, _protected) == [f"GET {PREFIX}/forgotten"]


def test_a_role_declared_on_a_router_route_is_seen_and_a_missing_one_refused():
    """The app's routes live on included routers (an included router is one entry of ``app.routes``): the check
    walks them as included, their prefix applied."""
    from fastapi import APIRouter, Depends, FastAPI

    from controller.serve.access import RoleCheck, declared, undeclared
    from controller.serve.routes.common import READ

    router = APIRouter()

    @router.get("/runs", dependencies=[Depends(READ)])
    def runs() -> list[str]:
        return []

    @router.post("/runs/{run_id}/cancel")
    def forgotten(run_id: str, who=Depends(RoleCheck(Role.trigger, others=Role.admin))) -> None:
        return None

    @router.get("/orphan")
    def orphan() -> None:
        return None

    app = FastAPI()
    app.include_router(router, prefix=PREFIX)
    assert undeclared(app.routes, _protected) == [f"GET {PREFIX}/orphan"]
    got = {p: [(c.role, c.others) for c in declared(r)] for m, p, r in walked(app) if _protected(p)}
    assert got == {f"{PREFIX}/runs": [(Role.read, None)],
                   f"{PREFIX}/runs/{{run_id}}/cancel": [(Role.trigger, Role.admin)], f"{PREFIX}/orphan": []}


def test_runs_and_cancels_record_the_tokens_user(app_client, controller):
    _, client = app_client
    rel = str(controller.inventory.parent / TARBALL)
    r = client.post(f"{PREFIX}/runs", headers=auth(Role.trigger), json={"release": rel, "run_id": "toms-run"})
    assert r.status_code == 201, r.text
    assert client.get(f"{PREFIX}/runs/toms-run", headers=auth(Role.read)).json()["started_by"] == "tom"
    # resumed by the admin: still tom's
    r = client.post(f"{PREFIX}/runs", headers=auth(Role.admin),
                    json={"release": rel, "run_id": "toms-run", "resume": True})
    assert r.status_code == 201, r.text
    assert client.get(f"{PREFIX}/runs/toms-run", headers=auth(Role.read)).json()["started_by"] == "tom"
    r = client.post(f"{PREFIX}/runs/{OTHERS}/cancel", headers=auth(Role.trigger))
    assert (r.status_code, r.json()) == (403, {"detail": f"cancelling run {OTHERS} (started by user someone) needs "
                                                         "role admin; user tom has role trigger"})
    assert client.post(f"{PREFIX}/runs/toms-run/cancel", headers=auth(Role.trigger)).status_code == 202
    assert client.post(f"{PREFIX}/runs/{OTHERS}/cancel", headers=auth(Role.admin)).status_code == 202
    h = History(controller.history_path)
    try:
        assert [(m, msg) for m, _, msg in h.events("toms-run") if msg.startswith("cancel")] == [
            ("m1", "cancel requested by tom")]
        assert [(m, msg) for m, _, msg in h.events(OTHERS)] == [(f"m{i:02d}", "cancel requested by ada")
                                                                for i in range(6)]
        owned, baseline = h.run("run-a"), h.run("baseline:1.4.1:v1")
        assert owned is not None and baseline is not None
        assert owned.started_by == "tom" and baseline.started_by == ""
    finally:
        h.close()


def test_a_run_of_no_recorded_user_is_others_work(app_client, controller):
    h = History(controller.history_path)
    try:
        h.conn.execute("UPDATE runs SET started_by='' WHERE run_id=?", (OTHERS,))
    finally:
        h.close()
    _, client = app_client
    r = client.post(f"{PREFIX}/runs/{OTHERS}/cancel", headers=auth(Role.trigger))
    assert (r.status_code, r.json()) == (403, {"detail": f"cancelling run {OTHERS} (started by a user not recorded) "
                                                         "needs role admin; user tom has role trigger"})
    assert client.post(f"{PREFIX}/runs/{OTHERS}/cancel", headers=auth(Role.admin)).status_code == 202


def test_reservations_are_the_tokens_users_and_others_are_released_by_an_admin(app_client, controller):
    """tom reserves m1 (trigger); ada's reserve of it is refused naming tom; rita reads it; tom may not release
    ada's, ada (admin) may release tom's; each reserve and release is an event of the module."""
    _, client = app_client
    controller.inventory.write_text(INV + INV.replace("m1", "m2"))  # before the first request reads it
    r = client.post(f"{PREFIX}/reservations", headers=auth(Role.trigger),
                    json={"devices": "m1", "duration": "2h", "reason": "flashing"})
    assert r.status_code == 201, r.text
    (got,) = r.json()
    assert (got["module"], got["user"], got["reason"]) == ("m1", "tom", "flashing")
    assert 7190 < got["left_s"] <= 7200 and got["id"].startswith("res-")
    r = client.post(f"{PREFIX}/reservations", headers=auth(Role.admin), json={"devices": "m1,m2", "duration": "1h"})
    assert (r.status_code, r.json()) == (409, {"detail": f"m1 is reserved by tom until {got['until_local']} "
                                                         "(flashing): not reserved"})
    r = client.post(f"{PREFIX}/reservations", headers=auth(Role.admin), json={"devices": "m2", "duration": "1h"})
    assert r.status_code == 201, r.text
    r = client.get(f"{PREFIX}/reservations", headers=auth(Role.read))
    assert [(x["module"], x["user"]) for x in r.json()] == [("m1", "tom"), ("m2", "ada")]
    r = client.post(f"{PREFIX}/reservations", headers=auth(Role.read), json={"devices": "m3", "duration": "1h"})
    assert r.status_code == 403
    r = client.delete(f"{PREFIX}/reservations/m2", headers=auth(Role.trigger))
    assert (r.status_code, r.json()) == (403, {"detail": "releasing m2 (reserved by user ada) needs role admin; "
                                                         "user tom has role trigger"})
    assert client.delete(f"{PREFIX}/reservations/m1", headers=auth(Role.admin)).json()["user"] == "tom"
    assert client.delete(f"{PREFIX}/reservations/m2", headers=auth(Role.admin)).status_code == 200
    r = client.delete(f"{PREFIX}/reservations/m2", headers=auth(Role.admin))
    assert (r.status_code, r.json()) == (404, {"detail": "m2 is not reserved"})
    assert client.get(f"{PREFIX}/reservations", headers=auth(Role.read)).json() == []
    h = History(controller.history_path)
    try:
        assert [m for _, m in h.module_events("m1")] == [
            f"reserved by tom until {got['until_local']} (flashing) [{got['id']}]", f"released by ada (reserved by "
                                                                                     f"tom) [{got['id']}]"]
        assert [m.split(" until")[0][:15] for _, m in h.module_events("m2")] == ["reserved by ada", "released by ada"]
    finally:
        h.close()
