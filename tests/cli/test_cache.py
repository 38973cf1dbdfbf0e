"""``fleetctl cache ls|prune`` over a store the agents' own code filled (real archives and records)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from agent.kernel_cache import Store
from contract.fingerprint import EnvFingerprint
from contract.kernel_store import Fetch, cache_key
from controller.history import History
from tests.support.cli import finished_run, run_main

FP = EnvFingerprint(driver="3.0.0", musa="4.0.0", torch_musa="2.1.0", triton="3.1.0", tilelang="0.1.6")


def digest(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def _publish(env, release: str, modules: list[str], fetched: Sequence[str] = ()) -> Store:
    src = env / "kernels"
    (src / "Qwen3").mkdir(parents=True, exist_ok=True)
    (src / "Qwen3" / "gemm.cubin.json").write_text('{"kernel": "gemm"}\n')
    store = Store(env / "fleet" / "kernel-cache", cache_key(digest(release), ["c1"], "M1000", FP))
    for m in modules:
        pub = store.publish(src, m, compile_s=72.0, run_id="r1")
    for m in fetched:
        store.record_fetch(Fetch(module=m, archive=pub.archive, fetch_s=0.5, run_id="r2"))
    return store


def test_cache_ls_names_who_compiled_and_who_fetched(env, capsys):
    store = _publish(env, "a", ["m2", "m1"], fetched=["m4", "m3"])
    _publish(env, "b", ["m5"])
    code, out, err = run_main(capsys, "cache", "ls", "-o", "json")
    assert code == 0, err
    docs = json.loads(out)
    assert [(d["release"], d["compiled_by"], d["fetched_by"], d["trusted"]) for d in docs] == sorted([
        (digest("a")[:16], ["m1", "m2"], ["m3", "m4"], True), (digest("b")[:16], ["m5"], [], False)])
    a = next(d for d in docs if d["release"] == digest("a")[:16])
    assert a["key"] == store.key.digest() and a["device_class"] == "M1000"
    assert a["environment"] == "driver 3.0.0, MUSA 4.0.0, torch_musa 2.1.0, Triton 3.1.0, TileLang 0.1.6"
    assert a["size"] == store.archive(a["archive"]).stat().st_size
    code, out, _ = run_main(capsys, "cache", "ls", "-o", "csv")
    assert out.splitlines()[0] == \
        "version,release,key,device_class,environment,archive,size,compiled_by,fetched_by,trusted"
    assert '"m1,m2","m3,m4",True' in out
    assert not (env / "history.sqlite").exists()  # a read verb
    # a release the history has run is named by its version (issue 51), not only by its tarball's hash
    finished_run(History(env / "history.sqlite"), "r-a", modules=["m1"], sha256=digest("a"), release="1.4.2")
    code, out, _ = run_main(capsys, "cache", "ls", "-o", "json")
    assert {d["release"]: d["version"] for d in json.loads(out)} == {digest("a")[:16]: "1.4.2", digest("b")[:16]: ""}


def test_cache_ls_on_an_empty_store(env, capsys):
    code, out, _ = run_main(capsys, "cache", "ls")
    assert (code, out.strip()) == (0, f"no kernel cache in {env / 'fleet' / 'kernel-cache'}")


def test_cache_prune_keeps_the_releases_runs_may_use(env, capsys, monkeypatch):
    monkeypatch.setattr("controller.service.releases.KEEP_RELEASES", 1)
    h = History(env / "history.sqlite")
    finished_run(h, "r-running", modules=["m1"], sha256=digest("running"))
    finished_run(h, "r-old", modules=["m1"], state="done", sha256=digest("old"))
    finished_run(h, "r-new", modules=["m1"], state="done", sha256=digest("new"))
    h.close()
    for name in ("running", "old", "new"):
        _publish(env, name, ["m1"])
    code, out, _ = run_main(capsys, "cache", "prune")
    assert (code, out.strip()) == (0, f"removed the kernel caches of 1 release(s): {digest('old')[:16]}")
    left = sorted(p.name for p in (env / "fleet" / "kernel-cache").iterdir())
    assert left == sorted([digest("running")[:16], digest("new")[:16]])
    code, out, _ = run_main(capsys, "cache", "prune", "--all")
    assert out.strip().startswith("removed the kernel caches of 2 release(s)")
    assert list((env / "fleet" / "kernel-cache").iterdir()) == []


def test_pruning_the_staged_releases_prunes_their_kernel_caches(env, monkeypatch):
    from controller.service import Session, prune_releases

    monkeypatch.setattr("controller.service.releases.KEEP_RELEASES", 1)
    h = History(env / "history.sqlite")
    finished_run(h, "r-old", modules=["m1"], state="done", sha256=digest("old"))
    finished_run(h, "r-new", modules=["m1"], state="done", sha256=digest("new"))
    h.close()
    for name in ("old", "new"):
        _publish(env, name, ["m1"])
    (env / "fleet" / "kernel-cache" / "notes").mkdir()
    with Session.load() as s:
        prune_releases(s)
    left = sorted(p.name for p in (env / "fleet" / "kernel-cache").iterdir())
    assert left == sorted([digest("new")[:16], "notes"])
