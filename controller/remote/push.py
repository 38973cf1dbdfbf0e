"""Put a release tarball into each module's release cache, verified, resumable, in parallel.

Layout on a module: ``<workdir>/incoming/<sha256>/<tarball name>``; while arriving it is
``.<name>.part`` next to it. A module that already holds the final file of that digest is
skipped. A transfer that was cut resumes from the partial file's size. The receiver on
the module (a small Python program, ``RECEIVER``, kept as ``scripts/receive_release.py``)
appends stdin to the partial file while hashing it, and renames it to the final name only
when size and sha256 match: nothing half-written is ever taken for whole.

Data goes through the OpenSSH client reading the file directly (``ssh.stream_file``);
the control step (probe) goes through Fabric. Both verify host keys against one
known_hosts file.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from controller.errors import FleetctlError
from controller.inventory import Module
from controller.remote import ssh

_SHA = re.compile(r"^[0-9a-f]{64}$")

# Runs on the module (Python >= 3.10, stdlib only): scripts/receive_release.py.
# argv: mode workdir sha256 name size offset [keep_newest [kept sha256 ...]]
RECEIVER = (files(__package__) / "scripts" / "receive_release.py").read_text(encoding="utf-8")


class PushError(FleetctlError):
    """A module did not get the release; the message says why."""


@dataclass(frozen=True)
class PushResult:
    """One module's push. ``remote_path``: the absolute path on the module (``RunRequest.tarball``); ``skipped``:
    the module already held this digest; ``bytes``: sent by this push (all attempts); ``resumed_from``: the offset
    the last attempt started at; ``sync_seconds``: what the module waited, after the last byte, for the file to be
    on disk; ``pruned``: sha256 of the releases removed from the module's incoming folder."""

    module: str
    remote_path: str
    skipped: bool = False
    bytes: int = 0
    seconds: float = 0.0
    error: str | None = None
    resumed_from: int = 0
    sync_seconds: float = 0.0
    pruned: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def mb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e6 if self.seconds > 0 and self.bytes else 0.0


def receiver_argv(python: str, mode: str, workdir: str, sha256: str, name: str, size: int, offset: int,
                  keep_newest: int = 0, keep: Iterable[str] = ()) -> list[str]:
    """The command line (as a list) that runs the receiver on a module (``keep_newest`` > 0: its probe
    removes the releases pushed there before, beyond the ``keep_newest`` last pushed, except ``keep``)."""
    kept = sorted(k for k in keep if _SHA.match(k))
    return [python, "-c", RECEIVER, mode, workdir, sha256, name, str(size), str(offset), str(keep_newest), *kept]


def parse_answer(module: str, text: str) -> dict[str, Any]:
    """The receiver's last stdout line is one JSON object."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    try:
        out = json.loads(lines[-1])
    except (IndexError, ValueError):
        raise PushError(f"{module}: receiver gave no answer: {text.strip()[-200:]!r}") from None
    if not isinstance(out, dict):
        raise PushError(f"{module}: receiver gave an unexpected answer: {text.strip()[-200:]!r}")
    return out


@dataclass(frozen=True)
class PushOptions:
    """How a push runs. ``retries``: extra attempts after a cut connection (each resumes); ``timeout``: of the
    whole transfer, per attempt, s; ``keep_newest`` > 0: the probe prunes the module's pushed releases beyond this
    many (:func:`push_release`); ``keep``: sha256 never pruned, the releases runs still use."""

    known_hosts: Path
    identity: Path | None = None
    python: str = "python3"
    retries: int = 2
    alive_interval: int = 5
    alive_count: int = 3
    connect_timeout: float = 10.0
    timeout: float | None = None
    keep_newest: int = 0
    keep: tuple[str, ...] = ()


def _push_one(module: Module, tarball: Path, sha256: str, opts: PushOptions,
              on_event: Callable[[str, str], None]) -> PushResult:
    target = ssh.SshTarget.of(module, opts.known_hosts, opts.identity, connect_timeout=opts.connect_timeout,
                              alive_interval=opts.alive_interval, alive_count=opts.alive_count)
    size = tarball.stat().st_size
    name = tarball.name
    t0 = time.monotonic()
    sent = 0
    remote_path = ""
    offset = 0
    pruned: list[str] = []

    def attempt() -> dict[str, Any]:
        nonlocal sent, remote_path, offset
        # the probe goes through the OpenSSH client too: its handshake is C in its own process,
        # where paramiko's would hold the GIL while the other modules' transfers start
        with open(os.devnull, "rb") as nothing:
            res = ssh.stream_file(target, nothing,
                                  ssh.remote_command(receiver_argv(opts.python, "probe", module.workdir, sha256,
                                                                   name, size, 0, opts.keep_newest, opts.keep)),
                                  timeout=60)
        if not res.ok:
            raise ssh.RemoteCommandError(module.name, "release cache probe", res)
        probe = parse_answer(module.name, res.stdout)
        remote_path = str(probe["path"])
        pruned.extend(str(x) for x in probe.get("pruned", ()) if str(x) not in pruned)
        if int(probe["final"]) == size:
            return {"ok": True, "skipped": True, "received": 0}
        offset = int(probe["part"]) if 0 < int(probe["part"]) < size else 0
        if int(probe.get("free", size)) < size - offset:
            raise PushError(f"{module.name}: not enough free disk for {name}: {int(probe['free'])} bytes free, "
                            f"{size - offset} needed")
        on_event(module.name, f"sending {size - offset} bytes" + (f" (resuming at {offset})" if offset else ""))
        line = ssh.remote_command(receiver_argv(opts.python, "receive", module.workdir, sha256, name, size, offset))
        with tarball.open("rb") as f:
            f.seek(offset)
            try:
                r = ssh.stream_file(target, f, line, timeout=opts.timeout)
            except ssh.SshError:
                sent += _bytes_read(f, offset)
                raise
        if not r.ok:
            raise PushError(f"{module.name}: receiver failed (exit {r.exit_code}): {r.tail()}")
        ans = parse_answer(module.name, r.stdout)
        sent += int(ans.get("received", 0))
        if not ans.get("ok"):
            if "kept for resume" in str(ans.get("error", "")):
                raise ssh.UnreachableError(module.name, str(ans["error"]))
            raise PushError(f"{module.name}: {ans.get('error')}")
        return ans

    try:
        for att in Retrying(stop=stop_after_attempt(1 + max(0, opts.retries)),
                            wait=wait_exponential(multiplier=0.5, max=10),
                            retry=retry_if_exception_type(ssh.UnreachableError), reraise=True):
            with att:
                ans = attempt()
    except (ssh.SshError, PushError, OSError) as exc:
        return PushResult(module.name, remote_path, False, sent, time.monotonic() - t0, str(exc), offset,
                          pruned=tuple(pruned))
    return PushResult(module.name, remote_path, bool(ans.get("skipped")), sent, time.monotonic() - t0, None, offset,
                      float(ans.get("sync_s", 0.0)), tuple(pruned))


def _bytes_read(f: Any, offset: int) -> int:
    """How far ssh read the local file (its stdin shares our file offset): bytes sent before a cut."""
    try:
        return max(0, os.lseek(f.fileno(), 0, os.SEEK_CUR) - offset)
    except OSError:
        return 0


def push_release(modules: Iterable[Module], tarball: Path, sha256: str, *, known_hosts: Path,
                 identity: Path | None = None, max_parallel: int = 4, python: str = "python3", retries: int = 2,
                 alive_interval: int = 5, alive_count: int = 3, connect_timeout: float = 10.0,
                 timeout: float | None = None, keep_newest: int = 0, keep: Iterable[str] = (),
                 on_event: Callable[[str, str], None] | None = None) -> dict[str, PushResult]:
    """Push ``tarball`` (whose digest is ``sha256``) to every module; one result per module.

    ``keep_newest`` > 0: before sending, each module removes the releases pushed there earlier beyond
    the ``keep_newest`` pushed last, except those in ``keep`` (the releases of runs that have not ended:
    a queued run reads its tarball when it starts) and any still arriving (``PushResult.pruned``).
    Never raises for one module's failure: see ``PushResult.error``.
    """
    tarball = Path(tarball)
    if not _SHA.match(sha256):
        raise PushError(f"sha256 {sha256!r} is not 64 lowercase hex digits")
    if not tarball.is_file():
        raise PushError(f"{tarball}: release tarball not found")
    opts = PushOptions(known_hosts=Path(known_hosts), identity=identity, python=python, retries=retries,
                       alive_interval=alive_interval, alive_count=alive_count, connect_timeout=connect_timeout,
                       timeout=timeout, keep_newest=keep_newest, keep=tuple(sorted(set(keep))))
    mods = list(modules)
    notify = on_event or (lambda _m, _e: None)
    with ThreadPoolExecutor(max_workers=max(1, min(max_parallel, len(mods) or 1))) as pool:
        futures = {m.name: pool.submit(_push_one, m, tarball, sha256, opts, notify) for m in mods}
        return {name: fut.result() for name, fut in futures.items()}
