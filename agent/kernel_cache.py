"""The fleet-wide kernel cache on the agent: fetch a trusted compiled TileLang cache instead of compiling, publish
one after compiling (records and layout: :mod:`contract.kernel_store`; why: docs/adr/0030-fleet-kernel-cache.md).

An archive is an uncompressed tar made the same way on every module (members sorted, owner, mode and time
fixed) whose first member, :data:`~contract.kernel_store.MANIFEST`, lists every other member's sha256 and size: two
modules that compiled the same kernels publish byte-identical archives, and the archive's own sha256 is its name.
Fetching checks, before a byte lands in the module's cache, the archive's sha256 against the trusted one, then
while unpacking every member against the manifest (a regular file, a plain relative path, its size and sha256,
no member twice, none missing), into a staging folder moved into place only when all passed.

:class:`RunCache` is the pipeline's one seam with the store (a folder: ``<data_dir>/kernel-cache`` next to the
staged releases, or a shared mount); everything it decides comes from :func:`contract.kernel_store.decide`.
Nothing here fails a run: a store that cannot be read or written, or an archive refused, means compiling.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import posixpath
import shutil
import stat
import tarfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from agent.errors import BadInput
from contract.files import write_atomic
from contract.kernel_store import (
    KEY_FILE,
    MANIFEST,
    CacheKey,
    Decision,
    Fetch,
    KernelCacheUse,
    Publication,
    attested,
    cache_key,
    decide,
    read_fetches,
    read_publications,
    release_keys,
    unknown_fields,
)

if TYPE_CHECKING:
    from agent.pipeline import Run

log = logging.getLogger(__name__)

CHUNK = 1 << 20
MAX_MANIFEST = 16 << 20


class KernelCacheConfig(BaseModel):
    """Where the shared kernel cache lives and how far it is trusted (None on :class:`AgentConfig`: off)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    root: Path = Field(description="the store: <data_dir>/kernel-cache by default")
    trust_first: bool = Field(default=False, description="trust an archive one module compiled (else two must "
                                                         "have compiled identical ones)")
    device_class: str = Field(default="M1000", min_length=1, max_length=64)
    max_bytes: int = Field(default=64 << 30, ge=1, description="an archive larger than this is refused, bytes")
    max_members: int = Field(default=200_000, ge=1)
    fetch_timeout: float = Field(default=600.0, gt=0, description="a fetch (verify and unpack) stopped after, s")


class Ledger(Protocol):
    """Who compiled what, on the broker (:class:`contract.kv.KV`): each module writes its own record only (its ACL),
    so a module that can write the store cannot make another module trust an archive it alone compiled."""

    def put_attestation(self, cache_key: str, module: str, record: dict[str, Any]) -> None: ...

    def attestations(self, cache_key: str) -> list[tuple[str, Any]]: ...


class RefusedArchive(BadInput):
    """An archive that is not the trusted one, or whose members do not match its manifest."""


# --------------------------------------------------------------------------- archives (files in, files out)
def _files(src: Path) -> list[tuple[str, Path]]:
    """(archive name, path) of every regular file under ``src``, sorted; BadInput on anything else but folders."""
    out: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames.sort()
        for name in [*dirnames, *filenames]:
            p = Path(dirpath) / name
            if p.is_symlink() or not (p.is_dir() or p.is_file()):
                raise BadInput(f"{p}: not a regular file or folder: the cache is not published")
        for name in filenames:
            p = Path(dirpath) / name
            if not (name.startswith(".") and ".tmp" in name):  # a compile's temporary file
                out.append((p.relative_to(src).as_posix(), p))
    return sorted(out)


def _sha256(path: Path, stop: Callable[[], str] | None = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
            why = stop() if stop is not None else ""
            if why:
                raise RefusedArchive(why)
    return h.hexdigest()


def _regular(path: Path) -> int:
    """The size of ``path`` when it is a regular file itself (not a link to one, nor a device, a pipe or a folder:
    a link to /dev/zero in place of an archive would be read for ever); :class:`RefusedArchive` otherwise."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        raise RefusedArchive("not in the store") from None
    if not stat.S_ISREG(st.st_mode):
        raise RefusedArchive("not a regular file in the store (a link, a device or a folder): refused")
    return st.st_size


def _info(name: str, size: int) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.size, ti.mode, ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname = size, 0o644, 0, 0, 0, "", ""
    return ti


def build_archive(src: Path, out: Path) -> tuple[str, int, int]:
    """Write the archive of the cache folder ``src`` to ``out``: (its sha256, its size, files in it). The same
    files give the same bytes on every module (docs/adr/0030)."""
    files = _files(src)
    manifest = {"schema": 1, "files": {name: {"sha256": _sha256(p), "size": p.stat().st_size} for name, p in files}}
    data = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(_info(MANIFEST, len(data)), _Bytes(data))
        for name, p in files:
            with open(p, "rb") as f:
                tar.addfile(_info(name, manifest["files"][name]["size"]), f)  # type: ignore[index]
    return _sha256(out), out.stat().st_size, len(files)


class _Bytes:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def read(self, n: int = -1) -> bytes:
        end = len(self.data) if n < 0 else self.pos + n
        chunk, self.pos = self.data[self.pos:end], min(end, len(self.data))
        return chunk


def _safe_name(name: str) -> bool:
    parts = name.split("/")
    return (0 < len(name.encode()) <= 1024 and "\x00" not in name and not name.startswith("/")
            and posixpath.normpath(name) == name and all(p not in ("", ".", "..") for p in parts) and name != MANIFEST)


def _manifest(tar: tarfile.TarFile, first: tarfile.TarInfo | None) -> dict[str, tuple[str, int]]:
    if first is None or first.name != MANIFEST or not first.isreg() or first.size > MAX_MANIFEST:
        raise RefusedArchive(f"its first member is not {MANIFEST}")
    f = tar.extractfile(first)
    try:
        doc = json.loads(f.read() if f is not None else b"")
        return {str(n): (str(v["sha256"]), int(v["size"])) for n, v in doc["files"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise RefusedArchive(f"{MANIFEST} is not a manifest: {exc}") from None


def _copy_checked(src: IO[bytes], dest: Path, size: int) -> str:
    h = hashlib.sha256()
    n = 0
    with open(dest, "wb") as out:
        while block := src.read(CHUNK):
            n += len(block)
            if n > size:
                break
            h.update(block)
            out.write(block)
    return h.hexdigest() if n == size else ""


def unpack_archive(archive: Path, digest: str, dest: Path, *, max_bytes: int = 64 << 30,
                   max_members: int = 200_000, stop: Callable[[], str] | None = None) -> int:
    """Check ``archive`` is ``digest`` and every member matches its manifest, then move its files into ``dest``
    (merged with what is there); the files placed. :class:`RefusedArchive` (nothing placed) when any check fails,
    when ``archive`` is not a regular file, or when ``stop`` (asked between blocks) says why to stop (a deadline, a
    cancel); OSError when this machine fails (disk full)."""
    size = _regular(archive)
    if size > max_bytes:
        raise RefusedArchive(f"{size} bytes, more than {max_bytes}")
    got = _sha256(archive, stop)
    if got != digest:
        raise RefusedArchive(f"sha256 {got[:12]}…, not the trusted {digest[:12]}… (corrupt or replaced)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    stage = dest.parent / f".{dest.name}.fetch-{os.getpid()}"
    shutil.rmtree(stage, ignore_errors=True)
    try:
        names = _extract(archive, stage, max_members, stop)
        # every check passed: into place, file by file (a folder there already is merged)
        for name in names:
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(stage / name, target)
        return len(names)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _extract(archive: Path, stage: Path, max_members: int, stop: Callable[[], str] | None = None) -> list[str]:
    try:
        with tarfile.open(archive, "r:") as tar:
            members: Iterator[tarfile.TarInfo] = iter(tar)
            manifest = _manifest(tar, next(members, None))
            if len(manifest) > max_members:
                raise RefusedArchive(f"{len(manifest)} members, more than {max_members}")
            seen: dict[str, None] = {}
            for m in members:
                if not m.isreg() or not _safe_name(m.name) or m.name not in manifest or m.name in seen:
                    what = "not a regular file" if not m.isreg() else "not in the manifest, twice, or unsafe"
                    raise RefusedArchive(f"member {m.name[:200]!r}: {what}")
                sha, size = manifest[m.name]
                if m.size != size:
                    raise RefusedArchive(f"member {m.name}: {m.size} bytes, the manifest says {size}")
                (stage / m.name).parent.mkdir(parents=True, exist_ok=True)
                src = tar.extractfile(m)
                if src is None or _copy_checked(src, stage / m.name, size) != sha:
                    raise RefusedArchive(f"member {m.name}: its sha256 is not the manifest's")
                seen[m.name] = None
                why = stop() if stop is not None else ""
                if why:
                    raise RefusedArchive(why)
    except (tarfile.TarError, EOFError) as exc:
        raise RefusedArchive(f"not a readable tar: {exc}") from None
    missing = sorted(set(manifest) - set(seen))
    if missing:
        raise RefusedArchive(f"{len(missing)} member(s) of the manifest missing, first {missing[0]}")
    return list(seen)


# --------------------------------------------------------------------------- the store
class Store:
    """The store's files for one key (layout: :mod:`contract.kernel_store`)."""

    def __init__(self, root: Path, key: CacheKey) -> None:
        self.root, self.key, self.folder = root, key, key.folder(root)

    def publications(self) -> list[Publication]:
        return read_publications(self.folder / "compiled")

    def fetches(self) -> list[Fetch]:
        return read_fetches(self.folder / "fetched")

    def elsewhere(self) -> list[CacheKey]:
        return release_keys(self.root, self.key.release_sha256)

    def archive(self, digest: str) -> Path:
        return self.folder / f"{digest}.tar"

    def publish(self, src: Path, module: str, *, compile_s: float, run_id: str) -> Publication:
        """Archive ``src`` into the store (an identical archive there already is kept; one whose bytes are not its
        name is replaced) and record that ``module`` compiled it."""
        self.folder.mkdir(parents=True, exist_ok=True)
        write_atomic(self.folder / KEY_FILE, self.key.model_dump_json() + "\n")
        tmp = self.folder / f".{module}.{os.getpid()}.tar.part"
        try:
            digest, size, members = build_archive(src, tmp)
            dest = self.archive(digest)
            if dest.is_file() and _sha256(dest) == digest:
                tmp.unlink()
            else:
                os.replace(tmp, dest)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        pub = Publication(module=module, archive=digest, size=size, members=members, compile_s=round(compile_s, 3),
                          run_id=run_id, at=time.time())
        write_atomic(self.folder / "compiled" / f"{module}.json", pub.model_dump_json() + "\n")
        return pub

    def record_fetch(self, fetch: Fetch) -> None:
        write_atomic(self.folder / "fetched" / f"{fetch.module}.json", fetch.model_dump_json() + "\n")


def model_configs(folders: Iterable[str]) -> list[str]:
    """sha256[:16] of each model folder's config.json (``unknown`` when unreadable: no sharing then)."""
    out = []
    for folder in folders:
        try:
            out.append(hashlib.sha256((Path(folder) / "config.json").read_bytes()).hexdigest()[:16])
        except OSError:
            out.append("unknown")
    return out


# --------------------------------------------------------------------------- the pipeline's seam
class RunCache:
    """One run's use of the shared cache: :meth:`fetch` before the precompile, :meth:`publish` after it."""

    def __init__(self, run: Run, cfg: KernelCacheConfig, key: CacheKey, ledger: Ledger | None = None) -> None:
        self.run, self.cfg, self.key, self.ledger = run, cfg, key, ledger
        self.store = Store(cfg.root, key)
        self.dest = run.store.tilelang_cache(run.sha16)
        self.why = ""

    def published(self) -> list[Publication]:
        """Who compiled what for this key: the broker's attestations (each written by its module only) where there
        is a broker; the store's own records only without one (``fleet-agent run``: trust then rests on the
        store's writers)."""
        if self.ledger is None:
            return self.store.publications()
        return attested(self.ledger.attestations(self.key.digest()))

    def _stop(self, deadline: float) -> Callable[[], str]:
        def why() -> str:
            if self.run.cancelled():
                return "the run was cancelled"
            if time.monotonic() > deadline:
                return f"the fetch took longer than its {self.cfg.fetch_timeout:g} s"
            return ""
        return why

    @classmethod
    def of(cls, run: Run, folders: list[str]) -> RunCache | None:
        cfg = run.cfg.kernel_cache
        if cfg is None or run.fingerprint is None:
            return None
        configs = model_configs(folders)
        key = cache_key(run.req.sha256, configs, cfg.device_class, run.fingerprint)
        return cls(run, cfg, key, run.ledger)

    def _say(self, status: str, msg: str, duration_s: float | None = None) -> None:
        log.info("run %s: kernel cache: %s", self.run.req.run_id, msg)
        self.run.agent_log("precompile", None, [f"kernel cache: {msg}"])
        self.run.event("precompile", status, message=f"kernel cache: {msg}", duration_s=duration_s)

    def fetch(self) -> KernelCacheUse | None:
        """Fetch, verify and unpack the trusted archive for this key: its use (None: compile, ``why`` says why, in
        an event too)."""
        t0 = time.monotonic()
        if "unknown" in self.key.models:
            decision = Decision(action="compile", why="a model folder has no readable config.json")
        else:
            try:
                decision = decide(self.key, self.published(), trust_first=self.cfg.trust_first,
                                  elsewhere=self.store.elsewhere())
            except OSError as exc:
                decision = Decision(action="compile", why=f"the store {self.cfg.root} cannot be read: {exc}")
            except Exception as exc:
                # the broker's attestations unreadable: compile, never fail the run
                decision = Decision(action="compile", why=f"who compiled what cannot be read from the broker: {exc}")
        if decision.action == "compile":
            self.why = decision.why
            self._say("compile", f"compiling: {decision.why}")
            return None
        try:
            n = unpack_archive(self.store.archive(decision.archive), decision.archive, self.dest,
                               max_bytes=self.cfg.max_bytes, max_members=self.cfg.max_members,
                               stop=self._stop(time.monotonic() + self.cfg.fetch_timeout))
        except (BadInput, OSError) as exc:
            self.why = f"archive {decision.archive[:12]} refused: {exc}"
            self._say("refused", f"{self.why}; compiling")
            return None
        took = time.monotonic() - t0
        with contextlib.suppress(OSError, ValueError):
            self.store.record_fetch(Fetch(module=self.run.cfg.module, archive=decision.archive, fetch_s=round(took, 3),
                                          run_id=self.run.req.run_id, at=time.time()))
        self._say("fetched", f"fetched {decision.archive[:12]} ({n} files, compiled by "
                             f"{', '.join(decision.compiled_by)}) in {took:.1f} s: not compiled here",
                  duration_s=took)
        return KernelCacheUse(action="fetched", archive=decision.archive, key=self.key.digest())

    def publish(self, compile_s: float) -> KernelCacheUse:
        """Publish this module's compiled cache (never raises: a failure is an event and the run goes on)."""
        if unknown_fields(self.key) or "unknown" in self.key.models:
            return KernelCacheUse(action="compiled", key=self.key.digest(), why=self.why)
        try:
            pub = self.store.publish(self.dest, self.run.cfg.module, compile_s=compile_s, run_id=self.run.req.run_id)
        except (BadInput, OSError, ValueError) as exc:
            self._say("unpublished", f"not published: {exc}")
            return KernelCacheUse(action="compiled", key=self.key.digest(), why=self.why)
        if self.ledger is not None:
            # the record others trust: the broker's, under this module's own key
            try:
                self.ledger.put_attestation(self.key.digest(), pub.module, pub.model_dump(mode="json"))
            except Exception as exc:
                self._say("unpublished", f"archive {pub.archive[:12]} stored, but not attested on the broker "
                                         f"(no other module will trust it): {exc}")
                return KernelCacheUse(action="compiled", key=self.key.digest(), why=self.why)
        self._say("published", f"published {pub.archive[:12]} ({pub.members} files, {pub.size} bytes) to "
                               f"{self.store.folder}")
        return KernelCacheUse(action="compiled", archive=pub.archive, key=self.key.digest(), published=True,
                              why=self.why)
