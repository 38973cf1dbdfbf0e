"""Releases staged under <data_dir>/releases/<sha256>/ (local transport, URL downloads) do not pile
up: each validate keeps those of running runs and the `KEEP_RELEASES` newest, and nothing else of
the folder's contents is touched."""

from __future__ import annotations

import hashlib
from pathlib import Path

from controller.history import History
from controller.service import Session
from tests.support.cli import TARBALL, finished_run, run_main


def digest(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def staged(env: Path, name: str) -> Path:
    d = env / "fleet" / "releases" / digest(name)
    d.mkdir(parents=True)
    (d / TARBALL).write_bytes(b"a release")
    return d


def test_prune_keeps_running_and_newest(env, monkeypatch):
    monkeypatch.setattr("controller.service.releases.KEEP_RELEASES", 2)
    h = History(env / "history.sqlite")
    dirs = {n: staged(env, n) for n in ("running-old", "a", "b", "c", "d")}
    finished_run(h, "r-running", modules=["m1"], sha256=digest("running-old"))  # still running, oldest
    for i, n in enumerate(("a", "b", "c", "d")):
        finished_run(h, f"r-{i}", modules=["m1"], state="done", sha256=digest(n))
    finished_run(h, "r-a-again", modules=["m1"], state="done", sha256=digest("a"))  # a ran last: newest
    other = env / "fleet" / "releases" / "not-a-digest"
    other.mkdir()
    part = env / "fleet" / "releases" / ".download-0123.part"
    part.write_bytes(b"in progress")
    with Session.load() as s:
        from controller.service import prune_releases

        gone = prune_releases(s)
    assert sorted(gone) == sorted([dirs["b"], dirs["c"]])
    assert [n for n, d in dirs.items() if d.exists()] == ["running-old", "a", "d"]
    assert other.is_dir() and part.is_file()


def test_validate_prunes(env, capsys, monkeypatch):
    monkeypatch.setattr("controller.service.releases.KEEP_RELEASES", 1)
    h = History(env / "history.sqlite")
    old = staged(env, "old")
    finished_run(h, "r-old", modules=["m1"], state="done", sha256=digest("old"))
    code, _, err = run_main(capsys, "validate", TARBALL, "--models", "qwen3", "--detach")
    assert code in (0, 1), err
    assert not old.exists()  # the new run's release is the newest now
