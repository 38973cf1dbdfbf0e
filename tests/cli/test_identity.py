"""Who ``fleetctl`` acts as (issue 32, item 3): ``$FLEET_USER``, else the OS user name, recorded as the user who
started a run (kept when another user resumes it) and as the sender of a cancel."""

from __future__ import annotations

import getpass

from controller.history import History
from tests.support.cli import TARBALL, run_main


def test_runs_and_cancels_record_the_local_user(env, capsys, monkeypatch):
    monkeypatch.setenv("FLEET_USER", "carol")
    code, out, err = run_main(capsys, "validate", TARBALL, "--models", "qwen3", "--run-id", "carols", "--detach")
    assert code == 0 and out.strip() == "carols", err
    monkeypatch.setenv("FLEET_USER", "dave")
    code, _, err = run_main(capsys, "validate", TARBALL, "--run-id", "carols", "--resume", "--detach")
    assert code == 0, err
    code, _, err = run_main(capsys, "cancel", "carols")
    assert code == 0, err
    monkeypatch.delenv("FLEET_USER")
    code, _, err = run_main(capsys, "retry", "carols", "--detach")
    assert code == 0, err
    h = History(env / "history.sqlite")
    try:
        carols = h.run("carols")
        assert carols is not None and carols.started_by == "carol"  # resumed by dave: still carol's
        assert [(m, msg) for m, _, msg in h.events("carols") if msg.startswith("cancel")] == [
            ("m1", "cancel requested by dave")]
        retried = [r for r in h.runs() if r.run_id != "carols"]
        assert [r.started_by for r in retried] == [getpass.getuser()]
    finally:
        h.close()
