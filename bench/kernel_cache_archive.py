"""The kernel cache's archive format, measured on real machine code: plain tar vs gzip, build / verify / unpack.

A compiled TileLang cache is kernel folders of shared objects (``kernel_lib.so``), CUDA/MUSA sources and small
parameter files. Stand-in: every shared object of this project's venv (real ELF machine code, so compression acts
on it as on kernels), copied into a folder as a cache would hold them. Measured, each 3 times (the median):

- build: :func:`agent.kernel_cache.build_archive` (plain tar, manifest of sha256s), and the same with gzip level 1
  and 6 over the same members;
- fetch: the archive's sha256 plus every member checked while unpacking (:func:`agent.kernel_cache.unpack_archive`)
  for plain; for gzip the same checks through a decompressing read;
- sizes.

Usage: python bench/kernel_cache_archive.py [--limit-mb 300]
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import shutil
import statistics
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from agent.kernel_cache import build_archive, unpack_archive  # noqa: E402
from bench import record  # noqa: E402 - bench/record.py, this script's folder


def stand_in(dest: Path, limit: int) -> tuple[int, int]:
    """Copy the venv's shared objects into ``dest`` (one folder each, as kernel folders); (files, bytes)."""
    total = n = 0
    for so in sorted((ROOT / ".venv").rglob("*.so*")):
        if not so.is_file() or so.is_symlink():
            continue
        size = so.stat().st_size
        if total + size > limit:
            continue
        folder = dest / hashlib.sha256(str(so).encode()).hexdigest()[:16]
        folder.mkdir(parents=True)
        shutil.copyfile(so, folder / "kernel_lib.so")
        total, n = total + size, n + 1
    return n, total


def timed(fn: Callable[[], object], rounds: int = 3) -> float:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit-mb", type=int, default=300)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kcache-archive-") as tmp:
        base = Path(tmp)
        files, size = stand_in(base / "cache", args.limit_mb << 20)
        plain = base / "plain.tar"
        build = timed(lambda: build_archive(base / "cache", plain))
        digest = hashlib.sha256(plain.read_bytes()).hexdigest()

        def fetch() -> None:
            shutil.rmtree(base / "dest", ignore_errors=True)
            unpack_archive(plain, digest, base / "dest")

        unpack = timed(fetch)
        lines = [f"# stand-in cache: {files} shared objects of the venv, {size / 2**20:.1f} MiB", "",
                 "| format | size MiB | ratio | build s | fetch s (sha256 + members checked + placed) |",
                 "| --- | --- | --- | --- | --- |",
                 f"| plain tar | {plain.stat().st_size / 2**20:.1f} | 1.00 | {build:.2f} | {unpack:.2f} |"]
        for level in (1, 6):
            gz = base / f"l{level}.tar.gz"

            def compress(level: int = level, gz: Path = gz) -> None:
                with open(plain, "rb") as src, gzip.open(gz, "wb", compresslevel=level) as out:
                    shutil.copyfileobj(src, out, 1 << 20)

            c = timed(compress, rounds=1)

            def gunzip_check(gz: Path = gz) -> None:
                h = hashlib.sha256()
                with open(gz, "rb") as f:
                    while b := f.read(1 << 20):
                        h.update(b)
                shutil.rmtree(base / "dest", ignore_errors=True)
                (base / "dest").mkdir()
                with tarfile.open(gz, "r:gz") as tar:
                    for m in tar:
                        if m.isreg():
                            src = tar.extractfile(m)
                            assert src is not None
                            hm = hashlib.sha256()
                            target = base / "dest" / m.name
                            target.parent.mkdir(parents=True, exist_ok=True)
                            with open(target, "wb") as out:
                                while b := src.read(1 << 20):
                                    hm.update(b)
                                    out.write(b)

            u = timed(gunzip_check, rounds=1)
            lines.append(f"| tar.gz level {level} | {gz.stat().st_size / 2**20:.1f} | "
                         f"{gz.stat().st_size / plain.stat().st_size:.2f} | {build + c:.2f} | {u:.2f} |")
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
