"""The fleet-wide kernel cache: its records, its store's layout, and the one rule that says which cache to take.

A module that precompiled a release's TileLang kernels publishes the compiled cache as a content-addressed archive
(``<sha256>.tar``) in a store next to the controller's staged releases (``<data_dir>/kernel-cache``); a module of
the same class that has not compiled them fetches and verifies it instead of compiling. Both sides read the store:
the agent (:mod:`agent.kernel_cache`) to fetch and publish, the controller (``fleetctl cache ls|prune``) to list
and prune it, so the layout and the records live here::

    <root>/<release sha256[:16]>/<key digest>/key.json                 the CacheKey (what every archive there is for)
    <root>/<release sha256[:16]>/<key digest>/<archive sha256>.tar     an archive, named by its own sha256
    <root>/<release sha256[:16]>/<key digest>/compiled/<module>.json   a Publication: that module compiled it
    <root>/<release sha256[:16]>/<key digest>/fetched/<module>.json    a Fetch: that module took an archive

The key holds the release, the model set, the device class and the compile-relevant part of the environment
fingerprint (:data:`CACHE_FIELDS`): a module never looks in another environment's folder, so it can never run kernels
compiled for a fingerprint other than its own. :func:`decide` is the trust rule (docs/adr/0030-fleet-kernel-cache.md).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from contract.fingerprint import LABELS, UNKNOWN, EnvFingerprint

# the fingerprint fields a compiled kernel depends on: the driver and the toolkit (MUSA, torch_musa, Triton,
# TileLang); firmware, kernel, OS and the agent's version do not change what TileLang compiles
CACHE_FIELDS: tuple[str, ...] = ("driver", "musa", "torch_musa", "triton", "tilelang")
DIGEST = re.compile(r"[0-9a-f]{64}")
KEY_DIGEST = re.compile(r"[0-9a-f]{16}")
RELEASE_DIR = re.compile(r"[0-9a-f]{16}")
MODULE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
KEY_FILE = "key.json"
# the archive's first member: every other member's sha256 and size
MANIFEST = "KCACHE-MANIFEST.json"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class CacheKey(_Frozen):
    """What a compiled kernel cache is for: one release, one model set, one device class, one environment."""

    schema_version: int = 1
    release_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    models: tuple[str, ...] = Field(description="sha256[:16] of each model's config.json, sorted")
    device_class: str = Field(min_length=1, max_length=64)
    environment: tuple[tuple[str, str], ...] = Field(description="(field, value) of CACHE_FIELDS, in that order")

    def digest(self) -> str:
        """16 hex digits of sha256 over the key's canonical JSON: the key's folder name."""
        text = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def folder(self, root: Path) -> Path:
        return root / self.release_sha256[:16] / self.digest()

    def same_but_environment(self, other: CacheKey) -> bool:
        return (self.release_sha256, self.models, self.device_class) == (other.release_sha256, other.models,
                                                                          other.device_class)

    def environment_text(self) -> str:
        return ", ".join(f"{LABELS[k]} {v}" for k, v in self.environment)


class Publication(_Frozen):
    """A module compiled the kernels of ``key`` itself and published the archive ``archive`` (its sha256)."""

    schema_version: int = 1
    module: str = Field(pattern=MODULE_NAME.pattern)
    archive: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)
    members: int = Field(ge=0)
    compile_s: float = Field(ge=0, description="the precompile's wall time on that module, s")
    run_id: str = ""
    at: float = 0.0


class Fetch(_Frozen):
    """A module took the archive ``archive`` instead of compiling."""

    schema_version: int = 1
    module: str = Field(pattern=MODULE_NAME.pattern)
    archive: str = Field(pattern=r"^[0-9a-f]{64}$")
    fetch_s: float = Field(ge=0, description="fetch, verify and unpack, wall s")
    run_id: str = ""
    at: float = 0.0


class KernelCacheUse(BaseModel):
    """How a run's precompile went with the shared cache (on its progress; None: sharing off or the local cache).

    ``action``: ``fetched`` (an archive verified and unpacked instead of compiling) or ``compiled`` (this module
    compiled; ``why`` says why it did not fetch); ``published``: its own compile went to the store. On a run's
    progress: a field its reader does not know is ignored (ADR 0051)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    action: Literal["compiled", "fetched"]
    archive: str = ""
    key: str = ""
    published: bool = False
    why: str = ""


class Decision(_Frozen):
    """What a module does for a key: fetch ``archive`` (trusted: compiled by ``compiled_by``), or compile (why)."""

    action: Literal["fetch", "compile"]
    archive: str = ""
    compiled_by: tuple[str, ...] = ()
    why: str = ""


def cache_key(release_sha256: str, model_configs: Iterable[str], device_class: str,
              fp: EnvFingerprint) -> CacheKey:
    """The key of a run's kernel cache (``model_configs``: sha256[:16] of each model folder's config.json)."""
    env = tuple((f, str(getattr(fp, f))) for f in CACHE_FIELDS)
    return CacheKey(release_sha256=release_sha256.lower(), models=tuple(sorted(set(model_configs))),
                    device_class=device_class, environment=env)


def unknown_fields(key: CacheKey) -> tuple[str, ...]:
    """Fields of the key's environment a probe could not read: such a module neither fetches nor publishes."""
    return tuple(f for f, v in key.environment if v == UNKNOWN)


def attested(records: Iterable[tuple[str, Any]]) -> list[Publication]:
    """The publications the broker attests (pure): each record under the key of the module that wrote it
    (:func:`contract.kv.attestation_key`), kept only where the record names that same module; a record that is not
    a publication, or that names another module (written by someone else), is dropped."""
    out: list[Publication] = []
    for module, value in records:
        try:
            pub = Publication.model_validate(value)
        except ValueError:
            continue
        if pub.module == module:
            out.append(pub)
    return out


def decide(key: CacheKey, published: Sequence[Publication], *, trust_first: bool = False,
           elsewhere: Sequence[CacheKey] = ()) -> Decision:
    """Fetch or compile (pure). An archive is trusted when ``2`` modules (1 with ``trust_first``) published the same
    sha256 for ``key``; of several trusted archives, the one most modules compiled (then the smallest sha256).
    ``published``: the publications under ``key``'s folder; ``elsewhere``: keys of the same release, model set and
    class for another environment (only to say why a module compiles)."""
    unknown = unknown_fields(key)
    if unknown:
        return Decision(action="compile", why=f"this module's {', '.join(LABELS[f] for f in unknown)} is unknown: "
                                              "the shared kernel cache is not used")
    by: dict[str, set[str]] = {}
    for p in published:
        by.setdefault(p.archive, set()).add(p.module)
    need = 1 if trust_first else 2
    ranked = sorted(by.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    if ranked and len(ranked[0][1]) >= need:
        digest, mods = ranked[0]
        return Decision(action="fetch", archive=digest, compiled_by=tuple(sorted(mods)))
    if len(ranked) > 1:
        seen = "; ".join(f"{d[:12]} by {', '.join(sorted(m))}" for d, m in ranked)
        return Decision(action="compile", why=f"modules compiled different caches ({seen}): none trusted")
    if ranked:
        digest, mods = ranked[0]
        return Decision(action="compile", why=f"cache {digest[:12]} compiled by {len(mods)} module(s) "
                                              f"({', '.join(sorted(mods))}); {need} needed to trust it "
                                              "(kernel_cache = \"trust-first\" trusts the first)")
    other = [k for k in elsewhere if k.same_but_environment(key) and k != key]
    if other:
        return Decision(action="compile", why=f"a cache of this release exists only for another environment "
                                              f"({other[0].environment_text()}; this module: "
                                              f"{key.environment_text()})")
    return Decision(action="compile", why="no cache published for this release, model set, device class and "
                                          "environment")


def _records(folder: Path) -> Iterator[tuple[Path, bytes]]:
    try:
        names = sorted(folder.iterdir())
    except OSError:
        return
    for path in names:
        if path.suffix == ".json" and not path.name.startswith("."):
            try:
                yield path, path.read_bytes()
            except OSError:
                continue


def read_publications(folder: Path) -> list[Publication]:
    """The publications in a key's ``compiled/`` folder that parse and whose file name is their module's; others
    are skipped (a torn or hand-made file never counts as a module's word)."""
    out = []
    for path, data in _records(folder):
        try:
            rec = Publication.model_validate_json(data)
        except ValueError:
            continue
        if rec.module == path.stem:
            out.append(rec)
    return out


def read_fetches(folder: Path) -> list[Fetch]:
    """As :func:`read_publications`, for a key's ``fetched/`` folder."""
    out = []
    for path, data in _records(folder):
        try:
            rec = Fetch.model_validate_json(data)
        except ValueError:
            continue
        if rec.module == path.stem:
            out.append(rec)
    return out


def read_key(folder: Path) -> CacheKey | None:
    """The key of a key folder (None: missing or unreadable, or not the folder's own)."""
    try:
        key = CacheKey.model_validate_json((folder / KEY_FILE).read_bytes())
    except (OSError, ValueError):
        return None
    return key if key.digest() == folder.name else None


def release_keys(root: Path, release_sha256: str) -> list[CacheKey]:
    """Every key stored for a release."""
    base = root / release_sha256.lower()[:16]
    try:
        folders = sorted(d for d in base.iterdir() if d.is_dir() and KEY_DIGEST.fullmatch(d.name))
    except OSError:
        return []
    return [k for k in (read_key(d) for d in folders) if k is not None]


def prune(root: Path, keep: set[str]) -> list[Path]:
    """Remove the store's release folders whose release (sha256[:16]) is not in ``keep``; the folders removed.
    Anything else in ``root`` (a name that is not a release's) stays."""
    try:
        found = sorted(d for d in root.iterdir() if d.is_dir() and not d.is_symlink() and RELEASE_DIR.fullmatch(d.name))
    except OSError:
        return []
    gone = [d for d in found if d.name not in keep]
    for d in gone:
        shutil.rmtree(d, ignore_errors=True)
    return gone
