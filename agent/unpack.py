"""Fetch and unpack: verify the tarball's sha256, check every member, extract via staging.

The whole tarball is refused (before anything is extracted) when a member has an absolute
path, a ``..`` component, a link pointing outside the release, is a device or FIFO, or
carries setuid/setgid bits; a truncated or corrupt file is refused too. The members are
also checked as a tree (:func:`tree_problem`), following the archive's own symlinks the
way the file system will once they are on disk: no member's path may pass through a
symlink member, no symlink may resolve (through other symlinks) outside the release's
top folder, and a hard link must name a regular file of the archive. These checks do not
rely on tarfile's ``filter`` argument, which Python 3.10 before 3.10.12 lacks; where it
exists, links pass the ``data`` filter as a second fence, and files and folders get its
attributes (:func:`checked_filter`). The tarball is opened once: its members are read and
checked, then extracted from the same open file. Extraction goes to a staging folder next
to the destination, renamed into place only when complete; on any failure (disk full
included) the staging folder is removed and nothing else was written.

Before a byte is written, the members are counted against the file system they go to
(:func:`room_needed`, :func:`lacks`): every file takes whole blocks (``f_frsize``), every
member a directory entry and (but hard links) an inode, so 200,000 one-byte members need
~800 MB and 200,000 inodes, not 200 KB. A tarball with more members, or longer names, than
:class:`UnpackLimits` allows is refused while its headers are read (a release has a few
thousand members).
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import shutil
import stat
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.errors import AgentError, BadInput, ChecksumMismatch, UnsafeTarball
from contract.files import sha256_file
from contract.layout import WORKFLOW_DIR


class UnpackError(AgentError, OSError):
    """Extraction failed for a reason of this machine (disk full, permissions)."""


# raises to stop (cancel, deadline); called between chunks / members
Check = Callable[[], None]


def _noop() -> None:
    return None


@dataclass(frozen=True)
class UnpackLimits:
    """Caps on what one tarball may hold (far above a release: the simulated one has 39 members, an SGLang
    tree a few thousand, its longest path ~150 bytes)."""

    max_members: int = 100_000
    # a member's whole path (the kernel's PATH_MAX is 4096), one component of it (NAME_MAX of common file systems)
    max_name_bytes: int = 1024
    max_component_bytes: int = 255


# bytes per member: its directory entry, and its inode where inodes take data blocks
ENTRY_ALLOWANCE = 256
# a symlink target shorter than this lives in the inode (ext4); longer ones take a block
FAST_SYMLINK = 60


@dataclass(frozen=True)
class Room:
    """What a file system has free for an unprivileged writer (``os.statvfs``)."""

    # free_bytes: f_bavail * f_frsize; block: f_frsize, the unit a file's size is rounded up to; free_inodes:
    # f_favail, None where the file system counts none (f_files == 0: btrfs, some FUSE)
    free_bytes: int
    block: int
    free_inodes: int | None


@dataclass(frozen=True)
class Need:
    """What extracting a set of members takes on a file system of a given block size."""

    members: int
    bytes: int
    inodes: int


def room(path: Path) -> Room:
    st = os.statvfs(path)
    block = st.f_frsize or st.f_bsize or 4096
    return Room(free_bytes=st.f_bavail * block, block=block, free_inodes=st.f_favail if st.f_files else None)


def room_needed(members: list[tarfile.TarInfo], block: int) -> Need:
    """Blocks and inodes ``members`` take once extracted (the staging folder included). Pure.

    A regular file takes its size rounded up to whole blocks; a folder one block; a symlink one block
    unless its target fits in the inode; a hard link no inode and no block. Every member also takes
    :data:`ENTRY_ALLOWANCE` bytes for its directory entry."""
    block = max(1, block)
    total, inodes = block, 1  # the staging folder
    for m in members:
        total += ENTRY_ALLOWANCE
        if m.islnk():
            continue
        inodes += 1
        if m.isfile():
            total += -(-m.size // block) * block
        elif m.isdir() or (m.issym() and len(m.linkname.encode()) >= FAST_SYMLINK):
            total += block
    return Need(members=len(members), bytes=total, inodes=inodes)


def lacks(need: Need, free: Room) -> str | None:
    """What the file system lacks for ``need`` (one phrase), or None when it fits. Pure."""
    short = []
    if need.bytes > free.free_bytes:
        short.append(f"not enough disk space: {need.members} members need {need.bytes} bytes in "
                     f"{free.block}-byte blocks, {free.free_bytes} free")
    if free.free_inodes is not None and need.inodes > free.free_inodes:
        short.append(f"not enough inodes: {need.members} members need {need.inodes} inodes, "
                     f"{free.free_inodes} free")
    return "; ".join(short) or None


def name_problem(m: tarfile.TarInfo, limits: UnpackLimits) -> str | None:
    """Why ``m``'s name (or link target) is too long for ``limits``, or None. Pure."""
    for what, text in (("name", m.name), ("link target", m.linkname if m.issym() or m.islnk() else "")):
        size = len(text.encode("utf-8", "surrogateescape"))
        if size > limits.max_name_bytes:
            return f"{what} of {size} bytes, over the limit of {limits.max_name_bytes}"
        longest = max((len(c.encode("utf-8", "surrogateescape")) for c in text.replace("\\", "/").split("/")),
                      default=0)
        if longest > limits.max_component_bytes:
            return f"{what} with a component of {longest} bytes, over the limit of {limits.max_component_bytes}"
    return None


def tarball_sha256(path: Path, check: Check = _noop) -> str:
    """The tarball's sha256 (``check`` between chunks); no file or a folder there is BadInput."""
    try:
        return sha256_file(path, check=check)
    except FileNotFoundError:
        raise BadInput(f"{path}: tarball not found") from None
    except IsADirectoryError:
        raise BadInput(f"{path}: is a folder, not a tarball") from None


def verify_sha256(path: Path, expected: str, check: Check = _noop) -> str:
    want = expected.strip().lower()
    if len(want) != 64 or any(c not in "0123456789abcdef" for c in want):
        raise BadInput(f"expected sha256 {expected!r} is not 64 hex digits")
    got = tarball_sha256(path, check=check)
    if got != want:
        raise ChecksumMismatch(f"{path}: sha256 mismatch (expected {want[:16]}..., got {got[:16]}...)")
    return got


def member_problem(m: tarfile.TarInfo) -> str | None:
    """Why ``m`` makes the tarball unsafe, or None. Pure."""
    name = m.name
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        return "absolute path"
    parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".")]
    if ".." in parts:
        return "'..' in path"
    if m.ischr() or m.isblk() or m.isfifo() or not (m.isfile() or m.isdir() or m.issym() or m.islnk()):
        return "device, FIFO or special file"
    if m.mode & (stat.S_ISUID | stat.S_ISGID):
        return "setuid/setgid bit"
    if m.issym() or m.islnk():
        target = m.linkname
        if target.startswith("/"):
            return f"link to absolute path {target!r}"
        base = posixpath.dirname(posixpath.normpath(name)) if m.issym() else ""
        resolved = posixpath.normpath(posixpath.join(base, target))
        if resolved == ".." or resolved.startswith("../"):
            return f"link pointing outside the release ({target!r})"
    return None


def _parts(name: str) -> list[str]:
    return [p for p in name.replace("\\", "/").split("/") if p not in ("", ".")]


MAX_LINK_HOPS = 40  # like the kernel's limit on symlinks followed in one lookup


def _resolve(parts: list[str], links: dict[str, str]) -> list[str] | None:
    """Where ``parts`` lands once the archive's own symlinks are followed; None above the extraction root."""
    done: list[str] = []
    todo = list(parts)
    hops = 0
    while todo:
        c = todo.pop(0)
        if c in ("", "."):
            continue
        if c == "..":
            if not done:
                return None
            done.pop()
            continue
        done.append(c)
        target = links.get("/".join(done))
        if target is not None:
            hops += 1
            if hops > MAX_LINK_HOPS:
                raise ValueError("symlink loop")
            if target.startswith("/"):
                return None
            done.pop()
            todo = target.replace("\\", "/").split("/") + todo
    return done


def release_top(members: list[tarfile.TarInfo]) -> str:
    """The release's top folder: the first path component every member shares ('' when none)."""
    firsts = {(_parts(m.name) or [""])[0] for m in members}
    if len(firsts) != 1:
        return ""
    top = firsts.pop()
    # a lone file or link at the root is no folder
    if any(_parts(m.name) == [top] and not m.isdir() for m in members):
        return ""
    return top


def tree_problem(members: list[tarfile.TarInfo]) -> tuple[tarfile.TarInfo, str] | None:
    """The first member that is unsafe given the others (symlink chains), and why; None when safe."""
    links = {"/".join(_parts(m.name)): m.linkname for m in members if m.issym()}
    files = set()
    top = release_top(members)
    for m in members:
        parts = _parts(m.name)
        for i in range(1, len(parts)):
            prefix = "/".join(parts[:i])
            if prefix in links:
                return m, f"path passes through the symlink member {prefix!r}"
        if m.issym():
            try:
                to = _resolve(parts[:-1] + _parts(m.linkname), links)
            except ValueError:
                return m, f"symlink loop through {m.linkname!r}"
            if to is None or (top and (not to or to[0] != top)):
                where = f"the release's top folder {top!r}" if top else "the release"
                return m, f"link {m.linkname!r} resolves outside {where}"
        elif m.islnk():
            target = "/".join(_parts(m.linkname))
            if target not in files:
                return m, f"hard link to {m.linkname!r}, which is not an earlier regular file of the archive"
        if m.isfile():
            files.add("/".join(parts))
    return None


@dataclass(frozen=True)
class Unpacked:
    # <workdir>/releases/<sha16>, and its folder holding scripts/ci/musa
    root: Path
    top: Path
    reused: bool
    members: int


def check_members(tarball: Path, limits: UnpackLimits | None = None) -> list[tarfile.TarInfo]:
    """Every member of ``tarball``, or :class:`UnsafeTarball` naming the first bad one."""
    try:
        with tarfile.open(tarball, "r:*") as tar:
            return _members(tar, tarball, limits or UnpackLimits())
    except UnsafeTarball:
        raise
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
        raise UnsafeTarball(f"{tarball}: not a readable tarball (truncated or corrupt): {exc}") from None


def _read_members(tar: tarfile.TarFile, tarball: Path, limits: UnpackLimits) -> list[tarfile.TarInfo]:
    """The members' headers, read to the end (a truncated file fails here), stopping at the first one past
    ``limits`` (a tarball of a million members is refused after reading ``max_members`` headers)."""
    members: list[tarfile.TarInfo] = []
    try:
        for m in tar:
            if len(members) >= limits.max_members:
                raise UnsafeTarball(f"{tarball}: more than {limits.max_members} members; tarball refused")
            problem = name_problem(m, limits)
            if problem:
                shown = m.name if len(m.name) <= 100 else m.name[:100] + "..."
                raise UnsafeTarball(f"{tarball}: member {shown!r}: {problem}; tarball refused")
            members.append(m)
    except UnsafeTarball:
        raise
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
        raise UnsafeTarball(f"{tarball}: not a readable tarball (truncated or corrupt): {exc}") from None
    return members


def _members(tar: tarfile.TarFile, tarball: Path, limits: UnpackLimits) -> list[tarfile.TarInfo]:
    """Every member of the open ``tar``, checked (:class:`UnsafeTarball` naming the first bad one)."""
    members = _read_members(tar, tarball, limits)
    if not members:
        raise UnsafeTarball(f"{tarball}: empty tarball")
    for m in members:
        problem = member_problem(m)
        if problem:
            raise UnsafeTarball(f"{tarball}: member {m.name!r}: {problem}; tarball refused")
    bad = tree_problem(members)
    if bad:
        raise UnsafeTarball(f"{tarball}: member {bad[0].name!r}: {bad[1]}; tarball refused")
    return members


def has_data_filter() -> bool:
    """tarfile's extraction filters exist (3.12, and back-ported to 3.8.17, 3.9.17, 3.10.12, 3.11.4)."""
    return hasattr(tarfile, "data_filter")


def checked_filter(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    """tarfile's ``data`` filter for members the checks above have already placed.

    A link goes through the ``data`` filter whole. A file or folder gets the filter's attributes
    (permissions without high or group/other write bits, no owner taken from the archive) without
    its two ``realpath`` walks of the destination and the member's path (~0.2 ms a member, most of
    an unpack's CPU): what those walks would find, :func:`tree_problem` has refused already, since
    the staging folder is new and holds only members of this archive, none of them a path through
    a symlink member, and no member name absolute or with ``..``.
    """
    if member.issym() or member.islnk() or not (member.isreg() or member.isdir()):
        return tarfile.data_filter(member, dest)
    attrs: dict[str, Any] = {"mode": None, "uid": None, "gid": None, "uname": None, "gname": None}
    # the data filter's rule: no high bits, no group/other write, owner rw, exec only if owner's
    if member.isreg():
        mode = member.mode & 0o755
        attrs["mode"] = (mode if mode & 0o100 else mode & ~0o111) | 0o600
    return member.replace(**attrs, deep=False)


def find_top(root: Path) -> Path:
    """The release's top folder: ``root`` itself or its single child holding ``scripts/ci/musa``."""
    if (root / WORKFLOW_DIR).is_dir():
        return root
    cands = [p for p in sorted(root.iterdir()) if p.is_dir() and (p / WORKFLOW_DIR).is_dir()]
    if len(cands) != 1:
        raise BadInput(f"{root}: no release folder with {WORKFLOW_DIR}/ in the tarball")
    return cands[0]


def _checked(members: list[tarfile.TarInfo], check: Check) -> Iterator[tarfile.TarInfo]:
    for m in members:
        check()
        yield m


def unpack(tarball: Path, dest: Path, check: Check = _noop, limits: UnpackLimits | None = None) -> Unpacked:
    """Extract ``tarball`` into ``dest`` (via a staging folder); reuse ``dest`` if already complete."""
    if dest.is_dir():
        return Unpacked(root=dest, top=find_top(dest), reused=True, members=0)
    try:
        tar = tarfile.open(tarball, "r:*")  # noqa: SIM115 - closed by the with below (open errors named first)
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
        raise UnsafeTarball(f"{tarball}: not a readable tarball (truncated or corrupt): {exc}") from None
    with tar:  # one open file for the checks and the extraction
        members = _members(tar, tarball, limits or UnpackLimits())
        top = _extract(tar, tarball, members, dest, check)
    with contextlib.suppress(OSError):
        _fsync_dir(dest.parent)
    return Unpacked(root=dest, top=top, reused=False, members=len(members))


def _extract(tar: tarfile.TarFile, tarball: Path, members: list[tarfile.TarInfo], dest: Path, check: Check) -> Path:
    """Extract the checked ``members`` into ``dest`` via a staging folder; the top folder's path under ``dest``."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    free = room(dest.parent)
    short = lacks(room_needed(members, free.block), free)
    if short:
        raise UnpackError(f"{dest.parent}: cannot unpack {tarball.name}: {short}; nothing written")
    staging = dest.parent / f".staging-{dest.name}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        staging.mkdir()
        kwargs = {"filter": checked_filter} if has_data_filter() else {}
        tar.extractall(staging, members=_checked(members, check), **kwargs)  # type: ignore[arg-type]
        top = find_top(staging)
        os.replace(staging, dest)
    except BadInput:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    except (OSError, tarfile.TarError, EOFError) as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(exc, OSError) and exc.errno == 28:
            raise UnpackError(f"{dest.parent}: disk full while unpacking {tarball.name}; nothing kept") from exc
        raise UnpackError(f"unpacking {tarball.name} failed: {exc}; nothing kept") from exc
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return dest / top.relative_to(staging)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
