"""Slow tier (redis): the kernel cache's trust does not rest on the store's writers (issue 48 item 2).

Every module can write the shared store (it publishes archives there), so who compiled what is attested on the
broker instead, each module under its own key that only it may write (its generated Redis ACL user). A module with
write access to the store and its own broker credentials tries to make another module fetch an archive it alone
compiled: it writes records for two invented modules in the store and on the broker (refused: NOPERM), and one of
its own; the other module's decision sees one attestation and compiles. An archive replaced by a link to /dev/zero
is refused at once (it was read for ever, the run stuck in ``environment``); a fetch has a deadline.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import redis

from agent.kernel_cache import RefusedArchive, Store, build_archive, unpack_archive
from contract.attest import Attestations, attestation_key
from contract.celery_app import make_app
from contract.fingerprint import EnvFingerprint
from contract.kernel_store import Publication, attested, cache_key, decide
from contract.kv import KV
from contract.settings import BrokerSettings
from tests.support.secure import pw, start_acl_redis

pytestmark = [pytest.mark.slow, pytest.mark.redis]

FP = EnvFingerprint(driver="3.0.0", musa="4.0.0", torch_musa="2.1.0", triton="3.1.0", tilelang="0.1.6")
MODULES = ["sim-01", "sim-02", "sim-03"]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    base = tmp_path_factory.mktemp("kc")
    server, files = start_acl_redis(base, MODULES)
    apps = {m: make_app(BrokerSettings(broker_url=f"redis://{m}:{pw(files, m)}@127.0.0.1:{server.port}/2",
                                       data_dir=base / m)) for m in MODULES}
    try:
        yield base, {m: Attestations(KV(a)) for m, a in apps.items()}
    finally:
        for a in apps.values():
            a.close()
        server.stop()


def _kernels(folder: Path, text: str) -> Path:
    (folder / "Qwen3").mkdir(parents=True, exist_ok=True)
    (folder / "Qwen3" / "gemm.cubin.json").write_text(text)
    return folder


def test_a_module_cannot_make_another_trust_an_archive_it_alone_compiled(lab, tmp_path):
    base, kv = lab
    key = cache_key("ab" * 32, ["c1"], "M1000", FP)
    store = Store(base / "store", key)
    evil = store.publish(_kernels(tmp_path / "evil", '{"kernel": "planted"}\n'), "sim-01", compile_s=1.0, run_id="r1")
    kv["sim-01"].put_attestation(key.digest(), "sim-01", evil.model_dump(mode="json"))  # its own: allowed
    # sim-01 forges two more compilers of its archive: in the store (it can write there) and on the broker
    for ghost in ("ghost-a", "ghost-b"):
        forged = evil.model_copy(update={"module": ghost})
        (store.folder / "compiled" / f"{ghost}.json").write_text(forged.model_dump_json())
        with pytest.raises(redis.exceptions.NoPermissionError):
            kv["sim-01"].kv.backend.client.set(attestation_key(key.digest(), ghost), forged.model_dump_json())
    # nor can it write under another module's key, or a key of its own that names another module
    with pytest.raises(redis.exceptions.NoPermissionError):
        kv["sim-01"].put_attestation(key.digest(), "sim-02", evil.model_dump(mode="json"))
    kv["sim-01"].put_attestation(key.digest() + ":x", "sim-01", evil.model_copy(update={"module": "sim-03"})
                                 .model_dump(mode="json"))  # m1000-fleet:kc:<d>:x:sim-01: allowed, means nothing
    # the store's records say three modules compiled it; the broker says one
    assert {p.module for p in store.publications()} == {"sim-01", "ghost-a", "ghost-b"}
    seen = attested(kv["sim-02"].attestations(key.digest()))
    assert [p.module for p in seen] == ["sim-01"]
    d = decide(key, seen)
    assert d.action == "compile" and "compiled by 1 module(s) (sim-01); 2 needed" in d.why
    # two honest modules compile the same kernels: their archive is trusted, the planted one never
    for m in ("sim-02", "sim-03"):
        pub = store.publish(_kernels(tmp_path / m, '{"kernel": "gemm"}\n'), m, compile_s=1.0, run_id="r2")
        kv[m].put_attestation(key.digest(), m, pub.model_dump(mode="json"))
    d = decide(key, attested(kv["sim-01"].attestations(key.digest())))
    assert d.action == "fetch" and d.compiled_by == ("sim-02", "sim-03") and d.archive != evil.archive


def test_an_archive_replaced_by_a_link_or_too_slow_to_read_is_refused(tmp_path):
    digest, _, _ = build_archive(_kernels(tmp_path / "src", '{"kernel": "gemm"}\n'), tmp_path / "a.tar")
    link = tmp_path / "store" / f"{digest}.tar"
    link.parent.mkdir()
    os.symlink("/dev/zero", link)
    t0 = time.monotonic()
    with pytest.raises(RefusedArchive, match="not a regular file"):
        unpack_archive(link, digest, tmp_path / "dest")
    assert time.monotonic() - t0 < 1.0 and not (tmp_path / "dest").exists()
    with pytest.raises(RefusedArchive, match="took longer"):  # a deadline (or a cancel) asked between blocks
        unpack_archive(tmp_path / "a.tar", digest, tmp_path / "dest", stop=lambda: "the fetch took longer than 1 s")
    assert not (tmp_path / "dest").exists()
    assert unpack_archive(tmp_path / "a.tar", digest, tmp_path / "dest") == 1


def test_a_record_naming_another_module_than_its_key_is_dropped():
    pub = Publication(module="sim-01", archive="a" * 64, size=1, members=1, compile_s=1.0)
    assert attested([("sim-01", pub.model_dump(mode="json")), ("sim-02", pub.model_dump(mode="json")),
                     ("sim-03", {"not": "a publication"})]) == [pub]
