"""Fetch and unpack: checksums, unsafe members, truncation, staging and disk full."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from agent.errors import BadInput, ChecksumMismatch, UnsafeTarball
from agent.unpack import UnpackError, member_problem, unpack, verify_sha256

TOP = "rel"


def _tar(path: Path, extra: list[tarfile.TarInfo] = (), data: bytes = b"echo hi\n") -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, is_dir in ((TOP, True), (f"{TOP}/scripts", True), (f"{TOP}/scripts/ci", True),
                             (f"{TOP}/scripts/ci/musa", True), (f"{TOP}/scripts/ci/musa/setup_env.sh", False)):
            info = tarfile.TarInfo(name)
            if is_dir:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.size, info.mode = len(data), 0o755
                tar.addfile(info, io.BytesIO(data))
        for info in extra:
            tar.addfile(info, io.BytesIO(b"x" * info.size) if info.isfile() else None)
    return path


def _info(name: str, **kw: object) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    for k, v in kw.items():
        setattr(info, k, v)
    return info


def test_good_tarball_unpacks_via_staging_and_is_reused(tmp_path):
    tb = _tar(tmp_path / "r.tar.gz")
    digest = verify_sha256(tb, hashlib.sha256(tb.read_bytes()).hexdigest().upper())
    dest = tmp_path / "releases" / digest[:16]
    done = unpack(tb, dest)
    assert not done.reused and done.top == dest / TOP
    assert (done.top / "scripts/ci/musa/setup_env.sh").read_text() == "echo hi\n"
    assert sorted(p.name for p in dest.parent.iterdir()) == [digest[:16]]  # no staging left
    again = unpack(tb, dest)
    assert again.reused and again.top == done.top


def test_checksum_mismatch_and_bad_digest(tmp_path):
    tb = _tar(tmp_path / "r.tar.gz")
    with pytest.raises(ChecksumMismatch, match="sha256 mismatch"):
        verify_sha256(tb, "a" * 64)
    with pytest.raises(BadInput, match="not 64 hex digits"):
        verify_sha256(tb, "xyz")
    with pytest.raises(BadInput, match="tarball not found"):
        verify_sha256(tmp_path / "missing.tar.gz", "a" * 64)


@pytest.mark.parametrize(
    ("member", "why"),
    [
        (_info("/etc/evil", size=1), "absolute path"),
        (_info("rel/../../evil", size=1), "'..' in path"),
        (_info("rel/link", type=tarfile.SYMTYPE, linkname="../../etc/passwd"), "outside the release"),
        (_info("rel/abslink", type=tarfile.SYMTYPE, linkname="/etc/passwd"), "absolute path"),
        (_info("rel/hard", type=tarfile.LNKTYPE, linkname="../etc/passwd"), "outside the release"),
        (_info("rel/dev", type=tarfile.CHRTYPE, devmajor=1, devminor=3), "device"),
        (_info("rel/blk", type=tarfile.BLKTYPE), "device"),
        (_info("rel/fifo", type=tarfile.FIFOTYPE), "FIFO"),
        (_info("rel/suid", size=1, mode=0o4755), "setuid"),
        (_info("rel/sgid", size=1, mode=0o2755), "setuid/setgid"),
    ],
)
def test_unsafe_member_refuses_the_whole_tarball(tmp_path, member, why):
    tb = _tar(tmp_path / "r.tar.gz", [member])
    dest = tmp_path / "releases" / "x"
    with pytest.raises(UnsafeTarball, match=why) as exc:
        unpack(tb, dest)
    assert member.name in str(exc.value) and "refused" in str(exc.value)
    assert not dest.exists() and not (tmp_path / "releases").exists()  # nothing written at all


def test_links_inside_the_release_are_fine():
    assert member_problem(_info("rel/a/link", type=tarfile.SYMTYPE, linkname="../b")) is None
    assert member_problem(_info("rel/hard", type=tarfile.LNKTYPE, linkname="rel/a")) is None
    assert member_problem(_info("rel/x/../y", size=0)) == "'..' in path"


def test_truncated_tarball_is_refused_before_extraction(tmp_path):
    tb = _tar(tmp_path / "r.tar.gz", [_info("rel/big.bin", size=200_000)])
    data = tb.read_bytes()
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(data[: len(data) // 2])
    digest = verify_sha256(cut, hashlib.sha256(cut.read_bytes()).hexdigest())  # even with a matching digest
    with pytest.raises(UnsafeTarball, match="truncated or corrupt"):
        unpack(cut, tmp_path / "releases" / digest[:16])
    assert not (tmp_path / "releases").exists()


def test_no_release_folder_is_refused_and_staging_removed(tmp_path):
    tb = tmp_path / "r.tar.gz"
    with tarfile.open(tb, "w:gz") as tar:
        info = _info("just/a/file.txt", size=1)
        tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(BadInput, match="no release folder"):
        unpack(tb, tmp_path / "releases" / "x")
    assert list((tmp_path / "releases").iterdir()) == []


def test_failure_mid_extraction_removes_staging(tmp_path):
    tb = _tar(tmp_path / "r.tar.gz", [_info(f"rel/f{i}", size=10) for i in range(5)])
    calls = []

    def check():
        calls.append(1)
        if len(calls) == 7:
            raise RuntimeError("stop here")

    with pytest.raises(RuntimeError):
        unpack(tb, tmp_path / "releases" / "x", check=check)
    assert list((tmp_path / "releases").iterdir()) == []


@pytest.fixture
def tiny_fs(tmp_path):
    """A 2 MiB tmpfs (needs root and mount)."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("disk-full test needs root to mount a small tmpfs")
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount tmpfs: {res.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_not_enough_space_is_refused_up_front(tmp_path, tiny_fs):
    tb = _tar(tmp_path / "r.tar.gz", [_info(f"rel/blob{i}", size=1_000_000) for i in range(3)])
    with pytest.raises(UnpackError, match="not enough disk space"):
        unpack(tb, tiny_fs / "releases" / "x")
    assert list((tiny_fs / "releases").iterdir()) == []


def test_disk_full_mid_extraction_keeps_nothing(tmp_path, tiny_fs, monkeypatch):
    tb = _tar(tmp_path / "r.tar.gz", [_info(f"rel/blob{i}", size=1_000_000) for i in range(3)])
    real = shutil.disk_usage
    monkeypatch.setattr("agent.unpack.shutil.disk_usage", lambda p: real(p)._replace(free=1 << 40))
    with pytest.raises(UnpackError, match="disk full while unpacking"):
        unpack(tb, tiny_fs / "releases" / "x")
    assert list((tiny_fs / "releases").iterdir()) == []
    assert real(tiny_fs).used < 100_000  # the partial files went with the staging folder


@pytest.mark.skipif(not hasattr(tarfile, "data_filter"), reason="tarfile has no extraction filters (Python < 3.10.12)")
def test_checked_filter_gives_what_the_data_filter_gives(tmp_path):
    """Files and folders skip the data filter's realpath walks, not its attributes: same modes, no archive owner."""
    extra = [_info("rel/open", size=2, mode=0o777, uid=4321, gid=4321, uname="nobody", gname="nogroup"),
             _info("rel/plain", size=2, mode=0o640, uid=4321),
             _info("rel/d", type=tarfile.DIRTYPE, mode=0o777, uid=4321)]
    tb = _tar(tmp_path / "r.tar.gz", extra)
    done = unpack(tb, tmp_path / "releases" / "x")
    ref = tmp_path / "ref"
    with tarfile.open(tb) as tar:
        tar.extractall(ref, filter="data")
    for name in ("open", "plain", "d", "scripts/ci/musa/setup_env.sh"):
        got, want = (done.top / name).stat(), (ref / TOP / name).stat()
        assert (got.st_mode, got.st_uid, got.st_gid) == (want.st_mode, want.st_uid, want.st_gid), name
