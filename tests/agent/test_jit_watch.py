"""Kernels compiled while measuring (agent.jit_watch): the before/after diff of the TileLang cache, on real folders."""

from __future__ import annotations

import os
from pathlib import Path

from agent.jit_watch import Compiled, Listing, Watch, annotate, cache_dir, compiled, list_cache
from contract.records import ResultRow


def _touch(root: Path, rel: str, mtime: float | None = None) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("x")
    if mtime is not None:
        os.utime(p, (mtime, mtime))


def test_the_diff_names_exactly_the_new_kernel_libraries_in_order() -> None:
    before = Listing(frozenset({"qwen3/gemm.cubin.json", "ab12/kernel_lib.so"}))
    after = Listing(frozenset({"qwen3/gemm.cubin.json", "ab12/kernel_lib.so", "ff00/kernel_lib.so",
                               "qwen3/jit/prefill_n64.cubin.json", "0a/kernel.cubin"}))
    got = compiled(before, after, {"ff00/kernel_lib.so": 105.5, "0a/kernel.cubin": 103.25}, started=100.0)
    assert got == Compiled(kernels=3, names=("0a/kernel.cubin", "ff00/kernel_lib.so",
                                             "qwen3/jit/prefill_n64.cubin.json"), first_s=3.25)


def test_nothing_new_is_no_compile_and_a_removed_kernel_is_not_one() -> None:
    a = Listing(frozenset({"k/kernel_lib.so", "j/kernel_lib.so"}))
    assert compiled(a, a) == Compiled()
    assert compiled(a, Listing(frozenset({"k/kernel_lib.so"}))) == Compiled()
    assert Compiled().one_line() == "no kernel compiled while measuring"


def test_a_listing_cut_short_is_not_read_as_compiles() -> None:
    cut = Listing(frozenset({"a/kernel_lib.so"}), complete=False)
    assert compiled(Listing(frozenset()), cut) == Compiled()
    assert compiled(cut, Listing(frozenset({"a/kernel_lib.so", "b/kernel_lib.so"}))) == Compiled()


def test_listing_keeps_kernel_libraries_only_and_walks_subfolders(tmp_path: Path) -> None:
    for rel in ("ab/kernel_lib.so", "ab/wrapped_kernel.cu", "ab/params.pkl", "m/gemm.cubin.json", "m/kernels.json",
                "m/x.cubin.json.tmp.42", "deep/er/k.mubin"):
        _touch(tmp_path, rel)
    assert list_cache(tmp_path) == Listing(frozenset({"ab/kernel_lib.so", "m/gemm.cubin.json", "deep/er/k.mubin"}))
    assert list_cache(tmp_path / "absent") == Listing(frozenset())
    assert list_cache(None) == Listing(frozenset())
    assert list_cache(tmp_path, limit=3).complete is False


def test_the_cache_is_tilelang_cache_dir_else_the_default_under_home() -> None:
    assert cache_dir({"TILELANG_CACHE_DIR": "/w/cache/tilelang/0123", "HOME": "/home/a"}) == Path(
        "/w/cache/tilelang/0123")
    assert cache_dir({"TILELANG_CACHE_DIR": " ", "HOME": "/home/a"}) == Path("/home/a/.tilelang/cache")
    assert cache_dir({}) is None


def test_a_watch_sees_the_kernels_written_during_the_step_and_when(tmp_path: Path) -> None:
    _touch(tmp_path, "qwen3/gemm.cubin.json")
    watch = Watch({"TILELANG_CACHE_DIR": str(tmp_path)}, clock=1000.0)
    _touch(tmp_path, "qwen35/jit/prefill_n128.cubin.json", mtime=1002.5)
    _touch(tmp_path, "qwen35/jit/prefill_n64.cubin.json", mtime=1001.0)
    _touch(tmp_path, "qwen35/jit/notes.txt")
    found = watch.stop()
    assert found == Compiled(kernels=2, names=("qwen35/jit/prefill_n128.cubin.json",
                                               "qwen35/jit/prefill_n64.cubin.json"), first_s=1.0)
    assert found.one_line() == ("2 kernel(s) compiled while measuring, the first 1.0 s into the step: "
                                "qwen35/jit/prefill_n128.cubin.json, qwen35/jit/prefill_n64.cubin.json; "
                                "the figures include compile time")


def test_annotate_stamps_release_rows_only() -> None:
    rel = ResultRow(table="sweep", profile="128:128", model="m")
    probe = ResultRow(table="sweep", profile="128:128", model="m", source="probe")
    out = annotate([rel, probe], Compiled(kernels=2, names=("a.so", "b.so"), first_s=0.5))
    assert (out[0].jit_kernels, out[0].jit_kernel_names, out[0].jit_first_s) == (2, "a.so; b.so", 0.5)
    assert (out[1].jit_kernels, out[1].jit_kernel_names, out[1].jit_first_s) == (0, "", None)
    assert annotate([rel], Compiled()) == [rel]


def test_a_row_from_before_the_field_still_parses_with_none_compiled() -> None:
    old = {"table": "sweep", "profile": "128:128", "model": "m", "ttft_ms": 50.0}
    row = ResultRow.model_validate(old)
    assert (row.jit_kernels, row.jit_kernel_names, row.jit_first_s) == (0, "", None)
