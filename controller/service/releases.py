"""Releases on their way to the modules: downloaded from a URL, staged, pushed, and pruned.

A URL release is fetched into ``<data_dir>/releases/<sha256>/``; modules of the local
transport read it from under the data folder, the others get it pushed over SSH. Releases
no run may still read are pruned (``keep_releases`` newest kept).
"""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

from controller.inventory import Module
from controller.service.session import Session, UnusableRelease

log = logging.getLogger(__name__)


SHA256_NAME = re.compile(r"[0-9a-f]{64}")


def releases_in_use(s: Session) -> set[str]:
    """sha256 of the releases runs may still read: those of runs not ended (a queued run reads its tarball
    when it starts) and the ``keep_releases`` newest by their last run. Kept staged here and pushed on the
    modules; empty before the first run."""
    return s.read_history().releases_in_use(s.settings.keep_releases) if s.has_history() else set()


def prune_releases(s: Session) -> list[Path]:
    """Remove the releases staged under ``<data_dir>/releases/<sha256>/`` (local transport, URL
    downloads) that no running run uses and that are not among the ``keep_releases`` newest; the
    folders removed. Anything else there (a download in progress, a name not a sha256) stays."""
    root = s.settings.data_dir.expanduser() / "releases"
    if not root.is_dir():
        return []
    keep = releases_in_use(s)
    gone = [d for d in sorted(root.iterdir())
            if d.is_dir() and not d.is_symlink() and SHA256_NAME.fullmatch(d.name) and d.name not in keep]
    for d in gone:
        shutil.rmtree(d, ignore_errors=True)
        log.info("staged release %s removed (kept: %d newest and those of running runs)", d.name,
                 s.settings.keep_releases)
    return gone


def download_release(s: Session, url: str, sha256: str | None = None) -> tuple[Path, str]:
    """Fetch a release URL into ``<data_dir>/releases/<sha256>/<name>`` (streamed, size-limited, with a
    deadline, checked against ``sha256`` when given); its path and sha256. UnusableRelease on any failure."""
    from controller.service.release_url import (
        ReleaseUrlError,
        check_release_url,
        check_sha256,
        fetch_release,
        url_policy,
    )

    try:
        return fetch_release(check_release_url(url), s.settings.data_dir.expanduser() / "releases",
                             sha256=check_sha256(sha256), max_bytes=s.settings.release_download_max_bytes,
                             timeout=s.settings.release_download_timeout, policy=url_policy(s.settings))
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
        from agent.validate import stage_local_release

        staged = str(stage_local_release(tarball, sha, s.settings.data_dir))
        paths = {m.name: staged for m in local}
    errors: dict[str, str] = {}
    remote = [m for m in modules if m.transport == "ssh"]
    if remote:
        from controller.remote.push import push_release

        results = push_release(remote, tarball, sha, known_hosts=s.settings.known_hosts, identity=s.settings.ssh_key,
                               keep_newest=s.settings.keep_releases, keep=releases_in_use(s))
        for name, r in results.items():
            if r.pruned:
                log.info("%s: removed %d release(s) pushed there before: %s", name, len(r.pruned),
                         ", ".join(x[:16] for x in r.pruned))
            if r.error:
                errors[name] = f"push failed: {r.error}"
            else:
                paths[name] = str(r.remote_path)
    return paths, errors
