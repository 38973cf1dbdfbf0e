"""The fleet's kernel cache: the trust rule, the key, and archives (built the same on every module, refused when
any byte or member is not what was trusted). Real files and real tars, nothing mocked."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from agent.kernel_cache import RefusedArchive, Store, build_archive, unpack_archive
from contract.fingerprint import EnvFingerprint
from contract.kernel_store import MANIFEST, Publication, cache_key, decide, read_publications

SHA = "ab" * 32
FP = EnvFingerprint(driver="3.0.0", musa="4.0.0", torch_musa="2.1.0", triton="3.1.0", tilelang="0.1.6",
                    firmware="1.2", kernel="6.1", os="Debian", agent="1.0")
KEY = cache_key(SHA, ["c2", "c1"], "M1000", FP)


def _pub(module: str, archive: str) -> Publication:
    return Publication(module=module, archive=archive, size=10, members=2, compile_s=72.0)


def test_no_publication_compiles_and_says_so():
    d = decide(KEY, [])
    assert (d.action, d.why) == ("compile", "no cache published for this release, model set, device class and "
                                            "environment")


def test_one_publication_is_not_trusted_unless_the_setting_says_so():
    one = [_pub("m1", "a" * 64)]
    d = decide(KEY, one)
    assert d.action == "compile"
    assert d.why == ("cache aaaaaaaaaaaa compiled by 1 module(s) (m1); 2 needed to trust it "
                     "(kernel_cache = \"trust-first\" trusts the first)")
    first = decide(KEY, one, trust_first=True)
    assert (first.action, first.archive, first.compiled_by) == ("fetch", "a" * 64, ("m1",))


def test_two_identical_compiles_are_trusted():
    d = decide(KEY, [_pub("m2", "a" * 64), _pub("m1", "a" * 64)])
    assert (d.action, d.archive, d.compiled_by) == ("fetch", "a" * 64, ("m1", "m2"))


def test_two_different_compiles_are_not_trusted():
    d = decide(KEY, [_pub("m1", "a" * 64), _pub("m2", "b" * 64)])
    assert d.action == "compile"
    assert d.why == "modules compiled different caches (aaaaaaaaaaaa by m1; bbbbbbbbbbbb by m2): none trusted"


def test_the_most_compiled_archive_wins():
    d = decide(KEY, [_pub("m1", "b" * 64), _pub("m2", "a" * 64), _pub("m3", "a" * 64), _pub("m4", "b" * 64),
                     _pub("m5", "b" * 64)])
    assert (d.action, d.archive, d.compiled_by) == ("fetch", "b" * 64, ("m1", "m4", "m5"))


def test_an_unknown_driver_never_shares():
    key = cache_key(SHA, ["c1"], "M1000", FP.model_copy(update={"driver": "unknown"}))
    d = decide(key, [_pub("m1", "a" * 64), _pub("m2", "a" * 64)], trust_first=True)
    assert (d.action, d.why) == ("compile", "this module's driver is unknown: the shared kernel cache is not used")


def test_another_driver_is_another_key_and_named():
    other = cache_key(SHA, ["c1", "c2"], "M1000", FP.model_copy(update={"driver": "3.1.0"}))
    assert other.digest() != KEY.digest()
    d = decide(other, [], elsewhere=[KEY])
    assert d.why == ("a cache of this release exists only for another environment (driver 3.0.0, MUSA 4.0.0, "
                     "torch_musa 2.1.0, Triton 3.1.0, TileLang 0.1.6; this module: driver 3.1.0, MUSA 4.0.0, "
                     "torch_musa 2.1.0, Triton 3.1.0, TileLang 0.1.6)")


def test_firmware_kernel_os_and_agent_do_not_change_the_key():
    same = FP.model_copy(update={"firmware": "9", "kernel": "7", "os": "Ubuntu", "agent": "2.0"})
    assert cache_key(SHA, ["c1", "c2"], "M1000", same) == KEY
    assert cache_key(SHA, ["c1", "c2"], "S4000", FP).digest() != KEY.digest()
    assert KEY.folder(Path("/s")) == Path("/s") / SHA[:16] / KEY.digest()


def _cache(root: Path, mode: int = 0o644) -> Path:
    (root / "Qwen3" / "sub").mkdir(parents=True)
    (root / "Qwen3" / "gemm.cubin.json").write_text('{"kernel": "gemm"}\n')
    (root / "Qwen3" / "sub" / "k.so").write_bytes(bytes(range(256)) * 10)
    (root / "Qwen3" / ".x.json.abc.tmp").write_text("half")  # a compile's temporary file: not a kernel
    for p in root.rglob("*"):
        if p.is_file():
            p.chmod(mode)
    return root


def test_the_same_files_make_the_same_archive(tmp_path):
    a = _cache(tmp_path / "a")
    b = _cache(tmp_path / "b", mode=0o600)
    os.utime(b / "Qwen3" / "gemm.cubin.json", (1, 1))
    da, size, members = build_archive(a, tmp_path / "a.tar")
    db, _, _ = build_archive(b, tmp_path / "b.tar")
    assert da == db == hashlib.sha256((tmp_path / "a.tar").read_bytes()).hexdigest()
    assert (members, size) == (2, (tmp_path / "a.tar").stat().st_size)
    with tarfile.open(tmp_path / "a.tar") as tar:
        assert tar.getnames() == [MANIFEST, "Qwen3/gemm.cubin.json", "Qwen3/sub/k.so"]


def test_an_archive_unpacks_into_the_cache(tmp_path):
    digest, _, _ = build_archive(_cache(tmp_path / "a"), tmp_path / "a.tar")
    dest = tmp_path / "dest"
    (dest / "Qwen3").mkdir(parents=True)
    (dest / "Qwen3" / "mine.txt").write_text("kept")
    assert unpack_archive(tmp_path / "a.tar", digest, dest) == 2
    assert (dest / "Qwen3" / "sub" / "k.so").read_bytes() == bytes(range(256)) * 10
    assert (dest / "Qwen3" / "mine.txt").read_text() == "kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "a.tar", "dest"]  # no staging left


def test_a_corrupted_archive_is_refused_and_nothing_placed(tmp_path):
    digest, size, _ = build_archive(_cache(tmp_path / "a"), tmp_path / "a.tar")
    data = bytearray((tmp_path / "a.tar").read_bytes())
    data[size // 2] ^= 0xFF
    (tmp_path / "a.tar").write_bytes(bytes(data))
    with pytest.raises(RefusedArchive, match=r"^sha256 [0-9a-f]{12}…, not the trusted " + digest[:12]):
        unpack_archive(tmp_path / "a.tar", digest, tmp_path / "dest")
    assert not (tmp_path / "dest").exists()


def _tar(path: Path, manifest: dict, members: list[tuple[tarfile.TarInfo, bytes]]) -> str:
    """A hand-made archive (what a hostile or broken store holds); its sha256, so only member checks can refuse."""
    data = json.dumps({"schema": 1, "files": manifest}).encode()
    with tarfile.open(path, "w") as tar:
        info = tarfile.TarInfo(MANIFEST)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        for info, body in members:
            tar.addfile(info, io.BytesIO(body))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _file(name: str, body: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(body)
    return info, body


def _entry(body: bytes) -> dict:
    return {"sha256": hashlib.sha256(body).hexdigest(), "size": len(body)}


@pytest.mark.parametrize(("manifest", "members", "why"), [
    ({"k": _entry(b"good")}, [_file("k", b"evil")], "member k: its sha256 is not the manifest's"),
    ({"k": _entry(b"good")}, [_file("k", b"longer")], "member k: 6 bytes, the manifest says 4"),
    ({"../k": _entry(b"x")}, [_file("../k", b"x")], "member '../k': not in the manifest, twice, or unsafe"),
    ({"k": _entry(b"x")}, [_file("k", b"x"), _file("k", b"x")], "member 'k': not in the manifest, twice, or unsafe"),
    ({"k": _entry(b"x"), "j": _entry(b"y")}, [_file("k", b"x")], "1 member(s) of the manifest missing, first j"),
])
def test_members_not_as_the_manifest_says_are_refused(tmp_path, manifest, members, why):
    digest = _tar(tmp_path / "h.tar", manifest, members)
    with pytest.raises(RefusedArchive) as exc:
        unpack_archive(tmp_path / "h.tar", digest, tmp_path / "dest")
    assert str(exc.value) == why
    assert not (tmp_path / "dest").exists() and not (tmp_path / "../k").exists()


def test_a_symlink_member_is_refused(tmp_path):
    link = tarfile.TarInfo("k")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    digest = _tar(tmp_path / "h.tar", {"k": _entry(b"")}, [(link, b"")])
    with pytest.raises(RefusedArchive, match="^member 'k': not a regular file$"):
        unpack_archive(tmp_path / "h.tar", digest, tmp_path / "dest")


def test_publishing_twice_keeps_one_archive_and_two_records(tmp_path):
    src = _cache(tmp_path / "a")
    store = Store(tmp_path / "store", KEY)
    p1 = store.publish(src, "m1", compile_s=72.0, run_id="r1")
    p2 = store.publish(_cache(tmp_path / "b"), "m2", compile_s=70.0, run_id="r1")
    assert p1.archive == p2.archive
    assert sorted(p.name for p in store.folder.iterdir()) == sorted(["compiled", f"{p1.archive}.tar", "key.json"])
    assert [p.module for p in read_publications(store.folder / "compiled")] == ["m1", "m2"]
    d = decide(KEY, store.publications())
    assert (d.action, d.compiled_by) == ("fetch", ("m1", "m2"))


def test_a_corrupted_archive_in_the_store_is_replaced_by_the_next_publisher(tmp_path):
    store = Store(tmp_path / "store", KEY)
    pub = store.publish(_cache(tmp_path / "a"), "m1", compile_s=1.0, run_id="r1")
    store.archive(pub.archive).write_bytes(b"garbage")
    store.publish(_cache(tmp_path / "b"), "m2", compile_s=1.0, run_id="r1")
    assert hashlib.sha256(store.archive(pub.archive).read_bytes()).hexdigest() == pub.archive


def test_a_record_not_named_for_its_module_does_not_count(tmp_path):
    folder = tmp_path / "compiled"
    folder.mkdir()
    (folder / "m9.json").write_text(_pub("m1", "a" * 64).model_dump_json())
    (folder / "m2.json").write_text("{torn")
    (folder / "m3.json").write_text(_pub("m3", "a" * 64).model_dump_json())
    assert [p.module for p in read_publications(folder)] == ["m3"]
