"""The fleet's kernel cache store, as the controller sees it: what is there (``fleetctl cache ls``) and pruning it
(``fleetctl cache prune``). The agents write it (:mod:`agent.kernel_cache`); the layout and the records are
:mod:`contract.kernel_store`'s. Pure reading and deleting of one folder: no broker, no history written."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from contract.kernel_store import (
    DIGEST,
    KEY_DIGEST,
    RELEASE_DIR,
    prune,
    read_fetches,
    read_key,
    read_publications,
)
from controller.service.releases import releases_in_use
from controller.service.session import Session


@dataclass(frozen=True)
class CacheEntry:
    """One archive of one key: which modules compiled it, which fetched it."""

    release: str  # sha256[:16]
    key: str
    device_class: str
    environment: str
    archive: str
    size: int
    compiled_by: tuple[str, ...]
    fetched_by: tuple[str, ...]
    # compiled by two modules (a module trusting the first takes it with one)
    trusted: bool
    version: str = ""  # the release's version where a run of it is in the history

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["compiled_by"], d["fetched_by"] = list(self.compiled_by), list(self.fetched_by)
        return d


def entries(root: Path) -> list[CacheEntry]:
    """Every archive in the store at ``root``, by release, key and archive; archives no module published are
    listed too (compiled by nobody: a leftover of a failed publication)."""
    out: list[CacheEntry] = []
    for rel in _dirs(root, RELEASE_DIR.fullmatch):
        for folder in _dirs(rel, KEY_DIGEST.fullmatch):
            key = read_key(folder)
            if key is None:
                continue
            pubs, fetches = read_publications(folder / "compiled"), read_fetches(folder / "fetched")
            archives = sorted({p.stem for p in folder.glob("*.tar") if DIGEST.fullmatch(p.stem)}
                              | {p.archive for p in pubs})
            for a in archives:
                path = folder / f"{a}.tar"
                compiled = tuple(sorted(p.module for p in pubs if p.archive == a))
                out.append(CacheEntry(release=rel.name, key=folder.name, device_class=key.device_class,
                                      environment=key.environment_text(), archive=a,
                                      size=path.stat().st_size if path.is_file() else 0, compiled_by=compiled,
                                      fetched_by=tuple(sorted(f.module for f in fetches if f.archive == a)),
                                      trusted=len(compiled) >= 2))
    return out


def _dirs(folder: Path, ok: Any) -> list[Path]:
    try:
        return sorted(d for d in folder.iterdir() if d.is_dir() and not d.is_symlink() and ok(d.name))
    except OSError:
        return []


def cache_entries(s: Session) -> list[CacheEntry]:
    """:func:`entries`, each named by its release's version where the history has run it."""
    found = entries(s.settings.kernel_cache_root())
    if not found or not s.has_history():  # a read verb: it makes no history
        return found
    versions = {sha[:16]: v for sha, v in s.history().release_versions().items()}
    return [replace(e, version=versions.get(e.release, "")) for e in found]


def prune_cache(s: Session, *, everything: bool = False) -> list[Path]:
    """``fleetctl cache prune``: the caches of releases no run may still use (those the staged releases keep:
    running runs' and the ``KEEP_RELEASES`` newest), or every cache with ``everything``."""
    keep = set() if everything else {sha[:16] for sha in releases_in_use(s)}
    return prune(s.settings.kernel_cache_root(), keep)
