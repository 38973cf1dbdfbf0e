"""Fast tier: symlink chains in a release tarball are refused by the agent's own checks.

The chain from issue 12: ``R/a/b/up -> ../..``, ``R/x -> a/b/up``, ``R/x2 -> x/..`` and a file
``R/x2/x2/tmp/f``. Each link looks harmless alone (normalised, none leaves ``R``); on disk
``R/x2`` is the extraction folder itself and the file lands outside ``R``. The checks must
hold without tarfile's ``filter`` argument (Python 3.10 before 3.10.12).
"""

from __future__ import annotations

import io
import tarfile
import warnings
from pathlib import Path

import pytest

from agent import unpack as unpack_mod
from agent.errors import UnsafeTarball
from agent.unpack import member_problem, tree_problem, unpack

R = "R"
BASE = [(R, "dir"), (f"{R}/scripts", "dir"), (f"{R}/scripts/ci", "dir"), (f"{R}/scripts/ci/musa", "dir"),
        (f"{R}/scripts/ci/musa/setup_env.sh", "file"), (f"{R}/a", "dir"), (f"{R}/a/b", "dir")]


def _member(name: str, kind: str, target: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    if kind == "dir":
        info.type, info.mode = tarfile.DIRTYPE, 0o755
    elif kind == "sym":
        info.type, info.linkname = tarfile.SYMTYPE, target
    elif kind == "hard":
        info.type, info.linkname = tarfile.LNKTYPE, target
    else:
        info.size, info.mode = 3, 0o644
    return info


def make_tar(path: Path, extra: list[tuple[str, str, str]]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, kind in BASE:
            m = _member(name, kind)
            tar.addfile(m, io.BytesIO(b"hi\n") if m.isfile() else None)
        for name, kind, target in extra:
            m = _member(name, kind, target)
            tar.addfile(m, io.BytesIO(b"hi\n") if m.isfile() else None)
    return path


CHAIN = [(f"{R}/a/b/up", "sym", "../.."), (f"{R}/x", "sym", "a/b/up"), (f"{R}/x2", "sym", "x/.."),
         (f"{R}/x2/x2/tmp/f", "file", "")]


@pytest.fixture(params=["with-filter", "without-filter"])
def filter_mode(request, monkeypatch):
    if request.param == "without-filter":  # as on Python 3.10 before 3.10.12
        monkeypatch.setattr(unpack_mod, "has_data_filter", lambda: False)
    return request.param


def test_each_link_of_the_chain_passes_the_member_check_alone():
    assert all(member_problem(_member(n, k, t)) is None for n, k, t in CHAIN)


def test_issue_chain_is_refused(tmp_path, filter_mode):
    tb = make_tar(tmp_path / "chain.tar.gz", CHAIN)
    dest = tmp_path / "releases" / "0123456789abcdef"
    with pytest.raises(UnsafeTarball) as exc:
        unpack(tb, dest)
    assert "refused" in str(exc.value)
    assert not dest.exists() and not list((tmp_path / "releases").glob("*"))
    assert not list(tmp_path.rglob("f"))


@pytest.mark.parametrize("extra, why", [
    ([(f"{R}/a/b/up", "sym", "../.."), (f"{R}/x", "sym", "a/b/up"), (f"{R}/x2", "sym", "x/..")],
     "resolves outside the release's top folder"),
    ([(f"{R}/x", "sym", "a"), (f"{R}/x/f", "file", "")], "passes through the symlink member 'R/x'"),
    ([(f"{R}/x/f", "file", ""), (f"{R}/x", "sym", "a")], "passes through the symlink member 'R/x'"),
    ([(f"{R}/x", "sym", "a"), (f"{R}/x/b", "sym", "..")], "passes through the symlink member 'R/x'"),
    ([(f"{R}/l1", "sym", "l2"), (f"{R}/l2", "sym", "l1")], "symlink loop"),
    ([(f"{R}/up", "sym", ".."), (f"{R}/esc", "sym", "up/..")], "resolves outside"),
    ([(f"{R}/sib", "sym", "../S")], "resolves outside the release's top folder 'R'"),
    ([(f"{R}/l", "sym", "x"), (f"{R}/x", "sym", "/etc")], "absolute path"),
    ([(f"{R}/x", "sym", "a/b"), (f"{R}/h", "hard", f"{R}/x/../../etc/passwd")], "hard link"),
    ([(f"{R}/h", "hard", f"{R}/nope")], "not an earlier regular file"),
    ([(f"{R}/x", "sym", "a"), (f"{R}/h", "hard", f"{R}/x/f")], "hard link"),
])
def test_chains_refused(tmp_path, filter_mode, extra, why):
    tb = make_tar(tmp_path / "t.tar.gz", extra)
    with pytest.raises(UnsafeTarball, match=why):
        unpack(tb, tmp_path / "releases" / "x")
    assert not (tmp_path / "releases" / "x").exists()


def test_links_within_the_top_folder_unpack(tmp_path, filter_mode):
    extra = [(f"{R}/a/b/f", "file", ""), (f"{R}/a/b/up", "sym", "../.."), (f"{R}/l", "sym", "a/b/f"),
             (f"{R}/d", "sym", "a/b"), (f"{R}/self", "sym", "."), (f"{R}/h", "hard", f"{R}/a/b/f"),
             (f"{R}/viaup", "sym", "a/b/up/scripts")]
    tb = make_tar(tmp_path / "ok.tar.gz", extra)
    with warnings.catch_warnings():  # 3.12+ warns when no filter is given
        warnings.simplefilter("ignore", DeprecationWarning)
        done = unpack(tb, tmp_path / "releases" / "x")
    assert done.top == tmp_path / "releases" / "x" / R
    assert (done.top / "l").read_text() == "hi\n" and (done.top / "d" / "f").read_text() == "hi\n"
    assert (done.top / "viaup" / "ci" / "musa" / "setup_env.sh").is_file()


def test_tree_problem_without_a_top_folder():
    ms = [_member("scripts", "dir"), _member("other", "dir"), _member("l", "sym", "other")]
    assert tree_problem(ms) is None
    assert tree_problem([*ms, _member("bad", "sym", "../x")]) is not None


def test_without_filter_extractall_gets_no_filter_argument(tmp_path, monkeypatch):
    seen = {}
    real = tarfile.TarFile.extractall

    def spy(self, path=".", members=None, **kw):
        seen.update(kw)
        kw.setdefault("filter", "fully_trusted")  # what 3.10.11 does, without the warning
        return real(self, path, members, **kw)

    monkeypatch.setattr(unpack_mod, "has_data_filter", lambda: False)
    monkeypatch.setattr(tarfile.TarFile, "extractall", spy)
    unpack(make_tar(tmp_path / "ok.tar.gz", []), tmp_path / "releases" / "x")
    assert "filter" not in seen
