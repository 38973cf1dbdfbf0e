"""Releases on their way to the modules: downloaded from a URL, staged, pushed, and pruned.

A URL release is fetched into ``<data_dir>/releases/<sha256>/``; modules of the local
transport read it from under the data folder, the others get it pushed over SSH. Releases
no run may still read are pruned (the :data:`KEEP_RELEASES` newest kept).

Lazy imports: :mod:`controller.remote.push` is imported when a release is pushed over SSH: it loads paramiko
and fabric (143 and 155 ms CPU a fresh process, ``bench/import_costs.py``:
bench/results/import_costs_20261207_0346_lazy-libraries.txt), which local modules and
the verbs that only read never need.
"""

from __future__ import annotations

import hashlib
import io
import logging
import re
import shutil
import tarfile
import zlib
from pathlib import Path
from typing import Any, BinaryIO

from agent.validate import stage_local_release
from contract.kernel_store import prune as prune_kernel_caches
from contract.layout import WORKFLOW_DIR, LayoutScan
from contract.oneline import error_line
from controller.inventory import Module
from controller.service.release_url import ReleaseUrlError, check_release_url, check_sha256, fetch_release, url_policy
from controller.service.session import Session, UnusableRelease

log = logging.getLogger(__name__)

# Constants that were [controller] settings until issue 50 (ADR 0058)
# staged releases kept (newest by their last run), and pushed ones on each module, besides running
KEEP_RELEASES = 5
RELEASE_DOWNLOAD_MAX_BYTES = 8 * 1024**3  # the largest release a URL may deliver
RELEASE_DOWNLOAD_TIMEOUT = 1800.0  # s, the whole download (a read: 30 s at most)


SHA256_NAME = re.compile(r"[0-9a-f]{64}")
CHUNK = 1 << 20


class _Hashing(io.RawIOBase):
    """A file read through a hash: every byte a reader takes is hashed once, in order."""

    def __init__(self, raw: BinaryIO, digest: Any) -> None:
        self.raw, self.digest = raw, digest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = self.raw.readinto(buffer)  # type: ignore[attr-defined]
        if n:
            self.digest.update(memoryview(buffer)[:n])
        return n or 0


def _layout_problem(tar_file: BinaryIO, models: tuple[str, ...]) -> str | None:
    """Read members of the tarball in ``tar_file`` (streamed, decompressed) until every file the pipeline needs
    for ``models`` has been seen; what is wrong with it (None: a release). Reads no further than that member."""
    scan = LayoutScan(models)
    try:
        with tarfile.open(fileobj=tar_file, mode="r|*", bufsize=CHUNK) as tar:
            for member in tar:
                if scan.add(member.name):
                    return None
    except (tarfile.TarError, EOFError, OSError, zlib.error, ValueError) as exc:
        return f"not a readable release tarball (a gzip-compressed tar): {error_line(exc)}"
    missing = scan.missing()
    more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
    return (f"not a release: no {missing[0]}{more} in the tarball (a release holds {WORKFLOW_DIR}/ with "
            f"{', '.join(f.rsplit('/', 1)[1] for f in scan.required)}, under one top folder)")


def read_release(path: Path, models: tuple[str, ...]) -> tuple[str, str | None]:
    """One pass over the release at ``path``: (its sha256, what keeps it from being a release for ``models`` or
    None). The members are listed only until the files the pipeline needs have all been seen
    (:class:`contract.layout.LayoutScan`), from the bytes the hash reads anyway; the rest of the file is only
    hashed. OSError when it cannot be read."""
    h = hashlib.sha256()
    with open(path, "rb") as raw:
        f = io.BufferedReader(_Hashing(raw, h), CHUNK)
        problem = _layout_problem(f, models)
        while f.read(CHUNK):
            pass
    return h.hexdigest(), problem


def release_problem(path: Path, models: tuple[str, ...]) -> str | None:
    """What keeps the file at ``path`` from being a release for ``models`` (None: nothing), reading it only until
    the pipeline's files were seen (a release already hashed: a download)."""
    with open(path, "rb") as f:
        return _layout_problem(f, models)


def releases_in_use(s: Session) -> set[str]:
    """sha256 of the releases runs may still read: those of runs not ended (a queued run reads its tarball
    when it starts) and the :data:`KEEP_RELEASES` newest by their last run. Kept staged here and pushed on the
    modules; empty before the first run."""
    return s.read_history().releases_in_use(KEEP_RELEASES) if s.has_history() else set()


def prune_releases(s: Session) -> list[Path]:
    """Remove the releases staged under ``<data_dir>/releases/<sha256>/`` (local transport, URL
    downloads) that no running run uses and that are not among the :data:`KEEP_RELEASES` newest; the
    folders removed. Anything else there (a download in progress, a name not a sha256) stays. The fleet's kernel
    caches of the releases not kept go too (:func:`contract.kernel_store.prune`)."""
    root = s.settings.data_dir.expanduser() / "releases"
    keep = releases_in_use(s)
    gone_caches = prune_kernel_caches(s.settings.kernel_cache_root(), {sha[:16] for sha in keep})
    if gone_caches:
        log.info("kernel caches of %d release(s) removed: %s", len(gone_caches), ", ".join(d.name for d in gone_caches))
    if not root.is_dir():
        return []
    gone = [d for d in sorted(root.iterdir())
            if d.is_dir() and not d.is_symlink() and SHA256_NAME.fullmatch(d.name) and d.name not in keep]
    for d in gone:
        shutil.rmtree(d, ignore_errors=True)
        log.info("staged release %s removed (kept: %d newest and those of running runs)", d.name,
                 KEEP_RELEASES)
    return gone


def download_release(s: Session, url: str, sha256: str | None = None) -> tuple[Path, str]:
    """Fetch a release URL into ``<data_dir>/releases/<sha256>/<name>`` (streamed, size-limited, with a
    deadline, checked against ``sha256`` when given); its path and sha256. UnusableRelease on any failure."""
    try:
        return fetch_release(check_release_url(url), s.settings.data_dir.expanduser() / "releases",
                             sha256=check_sha256(sha256), max_bytes=RELEASE_DOWNLOAD_MAX_BYTES,
                             timeout=RELEASE_DOWNLOAD_TIMEOUT, policy=url_policy(s.settings))
    except ReleaseUrlError as exc:
        raise UnusableRelease(str(exc)) from None


def distribute(s: Session, modules: list[Module], tarball: Path, sha: str) -> tuple[dict[str, str], dict[str, str]]:
    """Make the release available on each module: (module -> path there, module -> error).

    Modules of the local transport read it from under the data folder (agents read tarballs only
    from their release roots: ``<data_dir>/releases`` by default); the others get it pushed over SSH.
    """
    paths: dict[str, str] = {}
    local = [m for m in modules if m.transport == "local"]
    if local:
        staged = str(stage_local_release(tarball, sha, s.settings.data_dir))
        paths = {m.name: staged for m in local}
    errors: dict[str, str] = {}
    remote = [m for m in modules if m.transport == "ssh"]
    if remote:
        from controller.remote.push import push_release

        results = push_release(remote, tarball, sha, known_hosts=s.settings.known_hosts, identity=s.settings.ssh_key,
                               keep_newest=KEEP_RELEASES, keep=releases_in_use(s))
        for name, r in results.items():
            if r.pruned:
                log.info("%s: removed %d release(s) pushed there before: %s", name, len(r.pruned),
                         ", ".join(x[:16] for x in r.pruned))
            if r.error:
                errors[name] = f"push failed: {r.error}"
            else:
                paths[name] = str(r.remote_path)
    return paths, errors
