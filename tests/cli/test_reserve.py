"""``fleetctl reserve``, ``reservations``, ``unreserve`` on the embedded broker: who may take and end what, in one
line each, and every reserve and release an event of the module."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controller.fleet.reservations import shown_until
from controller.history import History
from tests.support.cli import one_line, run_main

INV = "".join(f'[[module]]\nname = "{m}"\ntransport = "local"\n' for m in ("m1", "m2"))


def as_user(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], user: str,
            *args: str) -> tuple[int, str, str]:
    monkeypatch.setenv("FLEET_USER", user)
    return run_main(capsys, *args)


def held(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> list[dict]:
    code, out, err = as_user(monkeypatch, capsys, "rita", "reservations", "-o", "json")
    assert code == 0, err
    return json.loads(out)


def test_reserve_refuse_renew_and_release(env: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    (env / "inv.toml").write_text(INV)
    code, out, err = as_user(monkeypatch, capsys, "alice", "reserve", "-d", "m1", "--for", "2h", "--reason", "fw")
    assert code == 0, err
    (first,) = held(monkeypatch, capsys)
    until = shown_until(first["until"])
    assert out == f"m1: reserved by alice until {until} [{first['id']}]\n"
    assert (first["user"], first["reason"], 7190 < first["left_s"] <= 7200) == ("alice", "fw", True)

    code, _, err = as_user(monkeypatch, capsys, "bob", "reserve", "-d", "m1,m2", "--for", "1h")
    assert (code, one_line(err)) == (2, f"fleetctl: error: m1 is reserved by alice until {until} (fw): not reserved")
    assert [r["module"] for r in held(monkeypatch, capsys)] == ["m1"]  # m2 not taken either: whole or nothing
    code, _, err = as_user(monkeypatch, capsys, "bob", "unreserve", "-d", "m1")
    assert (code, one_line(err)) == (2, f"fleetctl: error: m1 is reserved by alice until {until} (fw): not yours; "
                                        "unreserve it with --force")
    code, out, _ = as_user(monkeypatch, capsys, "bob", "unreserve")
    assert (code, out) == (0, "nothing to unreserve: none of the modules selected is reserved by you\n")

    code, _, err = as_user(monkeypatch, capsys, "alice", "reserve", "-d", "m1", "--for", "30m")  # renewed
    assert code == 0, err
    (again,) = held(monkeypatch, capsys)
    assert (again["id"], again["reason"], 1790 < again["left_s"] <= 1800) == (first["id"], "fw", True)

    code, out, err = as_user(monkeypatch, capsys, "bob", "unreserve", "-d", "m1", "--force")
    assert (code, out) == (0, "m1: unreserved (it was alice's)\n"), err
    assert held(monkeypatch, capsys) == []
    code, _, err = as_user(monkeypatch, capsys, "bob", "unreserve", "-d", "m1")
    assert (code, one_line(err)) == (2, "fleetctl: error: m1 is not reserved")
    code, _, err = as_user(monkeypatch, capsys, "bob", "reserve", "-d", "m1", "--for", "2")
    assert (code, one_line(err)) == (2, "fleetctl: error: duration '2': give a number and a unit s, m, h or d "
                                        "(30m, 2h, 1d)")
    h = History(env / "history.sqlite")
    try:
        assert [m for _, m in h.module_events("m1")] == [
            f"reserved by alice until {until} (fw) [{first['id']}]",
            f"reserved by alice until {shown_until(again['until'])} (fw) [{first['id']}]",
            f"released by bob (reserved by alice) [{first['id']}]"]
        assert h.module_events("m2") == []
    finally:
        h.close()


def test_the_old_name_release_still_unreserves_with_a_note(env: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 50: ``fleetctl release`` (a reservation's end, in a tool whose noun is a release) is ``unreserve``;
    the old name is kept hidden for one release, saying so in one line on stderr."""
    (env / "inv.toml").write_text(INV)
    assert as_user(monkeypatch, capsys, "alice", "reserve", "-d", "m1", "--for", "1h")[0] == 0
    code, out, err = as_user(monkeypatch, capsys, "alice", "release", "-d", "m1")
    assert (code, out) == (0, "m1: unreserved\n"), err
    assert one_line(err) == "fleetctl: note: 'fleetctl release' is now 'fleetctl unreserve'; the old name goes in " \
                            "the next release"
    assert held(monkeypatch, capsys) == []
    code, out, _ = run_main(capsys, "--help")
    verbs = [line.split()[0] for line in out.split("Commands:", 1)[1].splitlines() if line.startswith("  ")]
    assert "unreserve" in verbs and "release" not in verbs
