"""Fetch and unpack: checksums, unsafe members, truncation, staging and disk full."""

from __future__ import annotations

import hashlib
import io
import shutil
import tarfile
from collections.abc import Sequence
from pathlib import Path

import pytest

from agent.errors import BadInput, ChecksumMismatch, UnsafeTarball
from agent.unpack import (
    ENTRY_ALLOWANCE,
    Need,
    Room,
    UnpackError,
    UnpackLimits,
    lacks,
    member_problem,
    room_needed,
    unpack,
    verify_sha256,
)
from tests.support.tmpfs import mounted_tmpfs

TOP = "rel"


def _tar(path: Path, extra: Sequence[tarfile.TarInfo] = (), data: bytes = b"echo hi\n") -> Path:
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
    """A 2 MiB tmpfs."""
    yield from mounted_tmpfs(tmp_path / "tiny", "size=2m")


@pytest.fixture
def few_inodes_fs(tmp_path):
    """A 64 MiB tmpfs of 200 inodes."""
    yield from mounted_tmpfs(tmp_path / "few", "size=64m,nr_inodes=200")


class Counting:
    """A ``check`` that counts its calls: one per member extracted (none when refused up front)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1


def _tiny_members(n: int) -> list[tarfile.TarInfo]:
    return [_info(f"{TOP}/d{i // 500}/f{i}", size=1) for i in range(n)]


def test_many_one_byte_members_are_refused_before_a_byte_is_written(tmp_path, tiny_fs):
    """1,000 one-byte files are 1 KB of data but 4 MB of 4 KiB blocks: more than the 2 MiB disk."""
    tb = _tar(tmp_path / "r.tar.gz", _tiny_members(1000))
    check = Counting()
    with pytest.raises(UnpackError) as exc:
        unpack(tb, tiny_fs / "releases" / "x", check=check)
    msg = str(exc.value)
    assert "r.tar.gz" in msg and "not enough disk space" in msg and "4096-byte blocks" in msg and "\n" not in msg
    assert check.calls == 0  # not one member extracted
    assert list((tiny_fs / "releases").iterdir()) == []


def test_more_members_than_inodes_are_refused_before_a_byte_is_written(tmp_path, few_inodes_fs):
    tb = _tar(tmp_path / "r.tar.gz", _tiny_members(400))
    check = Counting()
    with pytest.raises(UnpackError) as exc:
        unpack(tb, few_inodes_fs / "releases" / "x", check=check)
    msg = str(exc.value)
    assert "r.tar.gz" in msg and "not enough inodes" in msg and "not enough disk space" not in msg
    assert check.calls == 0
    assert list((few_inodes_fs / "releases").iterdir()) == []


def test_a_release_still_unpacks_on_a_small_file_system(tmp_path, few_inodes_fs):
    """The simulated release (39 members) fits in 200 inodes and is unpacked whole."""
    from simulator import build_release

    rel = build_release(tmp_path / "dist")
    done = unpack(rel.path, few_inodes_fs / "releases" / "x")
    with tarfile.open(rel.path) as tar:
        assert done.members == len(tar.getmembers())
    assert (done.top / "scripts/ci/musa/setup_env.sh").is_file()


def test_member_count_and_name_length_are_capped(tmp_path):
    tb = _tar(tmp_path / "r.tar.gz", _tiny_members(50))
    with pytest.raises(UnsafeTarball, match=r"more than 20 members; tarball refused"):
        unpack(tb, tmp_path / "releases" / "x", limits=UnpackLimits(max_members=20))
    long = _tar(tmp_path / "long.tar.gz", [_info(f"{TOP}/" + "/".join(["d" * 200] * 6), size=1)])
    with pytest.raises(UnsafeTarball, match=r"name of 1209 bytes, over the limit of 1024"):
        unpack(long, tmp_path / "releases" / "y")
    wide = _tar(tmp_path / "wide.tar.gz", [_info(f"{TOP}/" + "w" * 300, size=1)])
    with pytest.raises(UnsafeTarball, match="component of 300 bytes"):
        unpack(wide, tmp_path / "releases" / "z")
    assert not (tmp_path / "releases").exists()
    assert unpack(tb, tmp_path / "releases" / "ok").members == 55  # the default caps are far above


def test_not_enough_space_is_refused_up_front(tmp_path, tiny_fs):
    tb = _tar(tmp_path / "r.tar.gz", [_info(f"rel/blob{i}", size=1_000_000) for i in range(3)])
    with pytest.raises(UnpackError, match="not enough disk space"):
        unpack(tb, tiny_fs / "releases" / "x")
    assert list((tiny_fs / "releases").iterdir()) == []


def test_disk_full_mid_extraction_keeps_nothing(tmp_path, tiny_fs, monkeypatch):
    tb = _tar(tmp_path / "r.tar.gz", [_info(f"rel/blob{i}", size=1_000_000) for i in range(3)])
    monkeypatch.setattr("agent.unpack.room", lambda p: Room(free_bytes=1 << 40, block=4096, free_inodes=None))
    with pytest.raises(UnpackError, match="disk full while unpacking"):
        unpack(tb, tiny_fs / "releases" / "x")
    assert list((tiny_fs / "releases").iterdir()) == []
    assert shutil.disk_usage(tiny_fs).used < 100_000  # the partial files went with the staging folder


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


def test_room_needed_counts_blocks_entries_and_inodes():
    """200,000 one-byte members: 200 KB of data, ~870 MB of 4 KiB blocks and entries, 200,001 inodes."""
    members = [_info(f"{TOP}/f{i}", size=1) for i in range(200_000)]
    need = room_needed(members, 4096)
    assert need.bytes == 4096 + 200_000 * (4096 + ENTRY_ALLOWANCE) and need.inodes == 200_001
    short = lacks(need, Room(free_bytes=500 * 1024**2, block=4096, free_inodes=10**7))
    assert short is not None and short.startswith("not enough disk space: 200000 members need")
    assert lacks(need, Room(free_bytes=10 * 1024**3, block=4096, free_inodes=None)) is None  # no inode count
    hard = _info(f"{TOP}/h", type=tarfile.LNKTYPE, linkname=f"{TOP}/f0")
    assert room_needed([hard], 4096) == Need(members=1, bytes=4096 + ENTRY_ALLOWANCE, inodes=1)
