"""A release's layout, checked by the controller before it dispatches (``contract.layout``,
``controller.service.releases.read_release``): pure names first, then real tarballs on disk."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import zlib
from pathlib import Path

import pytest

from contract.files import sha256_file
from contract.layout import LayoutScan, required_files
from controller.service.releases import read_release, release_problem

PIPELINE = ["scripts/ci/musa/tilelang_workflow_config.json", "scripts/ci/musa/generate_tilelang_workflow.sh",
            "scripts/ci/musa/setup_env.sh", "scripts/ci/musa/precompile_tilelang_kernels.sh",
            "scripts/ci/musa/run_tilelang_benchmark.sh"]


def test_required_files_are_the_pipelines_and_each_keys_start_script():
    assert list(required_files(["qwen3", "qwen35", "qwen35_mtp"])) == [
        *PIPELINE, "scripts/ci/musa/start_qwen3_server.sh", "scripts/ci/musa/start_qwen35_server.sh"]


@pytest.mark.parametrize("top", ["", "rel/", "./rel/", "./"])
def test_a_scan_is_complete_once_one_top_folder_holds_every_file(top):
    scan = LayoutScan(["qwen3"])
    names = [f"{top}README", *(f"{top}{n}" for n in PIPELINE), f"{top}scripts/ci/musa/start_qwen3_server.sh"]
    assert [scan.add(n) for n in names] == [False] * (len(names) - 1) + [True]
    assert scan.complete and scan.missing() == []


def test_files_split_over_two_top_folders_are_not_a_release():
    scan = LayoutScan(["qwen3"])
    for n in PIPELINE[:3]:
        scan.add(f"a/{n}")
    for n in PIPELINE[3:]:
        scan.add(f"b/{n}")
    assert not scan.complete
    assert scan.missing() == [*PIPELINE[3:], "scripts/ci/musa/start_qwen3_server.sh"]
    assert LayoutScan(["qwen3"]).missing() == list(required_files(["qwen3"]))  # nothing seen: everything


def _tar(path: Path, names: list[str], tail: bytes = b"") -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name in names:
            tar.addfile(tarfile.TarInfo(f"rel/{name}"), io.BytesIO(b""))
        if tail:
            info = tarfile.TarInfo("rel/weights.bin")
            info.size = len(tail)
            tar.addfile(info, io.BytesIO(tail))
    return path


def test_a_release_is_hashed_and_its_layout_checked_in_one_read(tmp_path):
    path = _tar(tmp_path / "r.tar.gz", [*PIPELINE, "scripts/ci/musa/start_qwen3_server.sh"], os.urandom(1 << 20))
    assert read_release(path, ("qwen3",)) == (sha256_file(path), None)
    assert release_problem(path, ("qwen3",)) is None


def test_the_listing_stops_at_the_last_file_the_pipeline_needs(tmp_path):
    """The member after them is corrupt: a full listing fails there, the check never reads it (only hashes it)."""
    path = _tar(tmp_path / "r.tar.gz", [*PIPELINE, "scripts/ci/musa/start_qwen3_server.sh"], os.urandom(4 << 20))
    data = bytearray(path.read_bytes())
    data[-(1 << 20):] = os.urandom(1 << 20)  # deflate data of weights.bin, far past the scripts
    path.write_bytes(bytes(data))
    with pytest.raises((tarfile.TarError, OSError, EOFError, zlib.error)), tarfile.open(path, "r:gz") as tar:
        tar.getmembers()
    assert read_release(path, ("qwen3",)) == (hashlib.sha256(data).hexdigest(), None)


@pytest.mark.parametrize(("content", "models", "says"), [
    (b"not really a tarball", ("qwen3",), "not a readable release tarball (a gzip-compressed tar): "),
    ("missing-benchmark", ("qwen3",),
     "not a release: no scripts/ci/musa/run_tilelang_benchmark.sh in the tarball (a release holds scripts/ci/musa/ "
     "with tilelang_workflow_config.json, generate_tilelang_workflow.sh, setup_env.sh, "
     "precompile_tilelang_kernels.sh, run_tilelang_benchmark.sh, start_qwen3_server.sh, under one top folder)"),
    ("qwen3-only", ("qwen3", "qwen3vl"), "not a release: no scripts/ci/musa/start_qwen3vl_server.sh in the tarball"),
    ("empty", ("qwen3",), "not a release: no scripts/ci/musa/tilelang_workflow_config.json and 5 more in the "
                          "tarball"),
])
def test_what_is_not_a_release_is_said_in_one_line(tmp_path, content, models, says):
    path = tmp_path / "r.tar.gz"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        names = {"missing-benchmark": [n for n in PIPELINE if "benchmark" not in n] + [
                     "scripts/ci/musa/start_qwen3_server.sh"],
                 "qwen3-only": [*PIPELINE, "scripts/ci/musa/start_qwen3_server.sh"], "empty": ["README"]}[content]
        _tar(path, names)
    sha, problem = read_release(path, models)
    assert sha == sha256_file(path) and problem is not None and problem.startswith(says), problem
    assert "\n" not in problem
