"""The files a run leaves on the module, and a small reader API over them.

Layout under the agent's workdir::

    releases/<sha16>/                    the unpacked release (staging, then rename)
    cache/verified/<sha16>.sha256        its tarball's sha256, once verified (a later run skips the hash)
    cache/precompile/<sha16>-<h>.done    a finished precompile of that release + model set
    cache/tilelang/<sha16>/              TILELANG_CACHE_DIR given to the release's scripts
    runs/<run_id>/request.json           the RunRequest
    runs/<run_id>/progress.json          the latest RunProgress
    runs/<run_id>/results.jsonl          one ResultRow per line, appended per key
    runs/<run_id>/events.jsonl           one line per step start / end
    runs/<run_id>/logs/NN-step[-key].log timestamped output of each step
    state.json                           {"current_run", "last_run", "updated_at"}

Whole files are written atomically (write to a temporary name, fsync, rename); JSON-lines
files only ever get whole lines appended. Readers skip a torn last line.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from contract.files import write_atomic as write_atomic
from contract.records import ResultRow, RunProgress, RunRequest, is_run_id
from contract.vocab import LOG_STEPS
from contract.vocab import check_run_id as check_run_id

_LOG_NUMBER = re.compile(r"^(\d+)-")


def append_lines(path: Path, lines: Iterable[str]) -> None:
    """Append whole lines in one write (readers never see half a record unless the disk fails)."""
    data = "".join(line.rstrip("\n") + "\n" for line in lines)
    if not data:
        return
    try:
        f = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by the with below
    except FileNotFoundError:  # its folder made on the first write only
        path.parent.mkdir(parents=True, exist_ok=True)
        f = open(path, "a", encoding="utf-8")  # noqa: SIM115
    with f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def read_json(path: Path) -> Any:
    """The value of a JSON file; None when it is gone or unreadable."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn line (crash mid-append): never taken for whole
        if isinstance(item, dict):
            out.append(item)
    return out


class RunStore:
    """Reader (and, for the pipeline, writer) of one module's workdir."""

    def __init__(self, workdir: str | Path) -> None:
        self.workdir = Path(workdir)
        self._held: list[tuple[Path, str]] = []  # event lines held back (add_event(hold=True)), in order
        self._lock = threading.Lock()

    # ----- paths
    @property
    def runs_dir(self) -> Path:
        return self.workdir / "runs"

    def run_dir(self, run_id: str) -> Path:
        return self.runs_dir / check_run_id(run_id)

    def logs_dir(self, run_id: str) -> Path:
        return self.run_dir(run_id) / "logs"

    def release_dir(self, sha16: str) -> Path:
        return self.workdir / "releases" / sha16

    def release_verified(self, sha16: str) -> Path:
        """The full sha256 of the tarball ``release_dir(sha16)`` was unpacked from, once it was verified."""
        return self.workdir / "cache" / "verified" / f"{sha16}.sha256"

    def precompile_marker(self, name: str) -> Path:
        return self.workdir / "cache" / "precompile" / name

    def tilelang_cache(self, sha16: str) -> Path:
        return self.workdir / "cache" / "tilelang" / sha16

    def prune_releases(self, *, keep: int, current: str) -> list[str]:
        """Remove the unpacked releases beyond the ``keep`` used most recently (``current`` is always
        kept and marked used now), with their TileLang caches, verified digests and precompile markers;
        their names.
        One run at a time per module: no other run is using them. Staging folders are left alone."""
        root = self.workdir / "releases"
        with contextlib.suppress(OSError):
            os.utime(root / current)
        try:
            found = [d for d in root.iterdir() if d.is_dir() and not d.is_symlink() and not d.name.startswith(".")]
        except OSError:
            return []
        by_use = sorted(found, key=lambda d: (d.name != current, -d.stat().st_mtime, d.name))
        gone = [d.name for d in by_use[keep:]]
        for name in gone:
            shutil.rmtree(root / name, ignore_errors=True)
            shutil.rmtree(self.tilelang_cache(name), ignore_errors=True)
            self.release_verified(name).unlink(missing_ok=True)
            for marker in (self.workdir / "cache" / "precompile").glob(f"{name}-*.done"):
                marker.unlink(missing_ok=True)
        return gone

    @property
    def state_path(self) -> Path:
        return self.workdir / "state.json"

    # ----- readers
    def runs(self) -> list[str]:
        """Run ids on this module, oldest first."""
        if not self.runs_dir.is_dir():
            return []
        dirs = [p for p in self.runs_dir.iterdir() if p.is_dir() and is_run_id(p.name)]
        return [p.name for p in sorted(dirs, key=lambda p: (p.stat().st_mtime, p.name))]

    def request(self, run_id: str) -> RunRequest | None:
        path = self.run_dir(run_id) / "request.json"
        try:
            return RunRequest.model_validate_json(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None

    def progress(self, run_id: str) -> RunProgress | None:
        path = self.run_dir(run_id) / "progress.json"
        try:
            return RunProgress.model_validate_json(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None

    def rows(self, run_id: str) -> list[ResultRow]:
        """Result rows of a run; one per (module, model key, profile, source), the latest kept."""
        by_id: dict[tuple[str, ...], ResultRow] = {}
        for item in read_jsonl(self.run_dir(run_id) / "results.jsonl"):
            row = ResultRow.model_validate(item)
            by_id.pop(row.identity, None)
            by_id[row.identity] = row
        return list(by_id.values())

    def events(self, run_id: str) -> list[dict[str, Any]]:
        return read_jsonl(self.run_dir(run_id) / "events.jsonl")

    def state(self) -> dict[str, Any]:
        try:
            data = json.loads(self.state_path.read_text(encoding="utf-8"))
        except (FileNotFoundError, json.JSONDecodeError):
            return {"current_run": None, "last_run": None, "updated_at": None}
        return data if isinstance(data, dict) else {"current_run": None, "last_run": None, "updated_at": None}

    def current_run(self) -> str | None:
        value = self.state().get("current_run")
        return value if isinstance(value, str) else None

    def last_run(self) -> str | None:
        value = self.state().get("last_run")
        return value if isinstance(value, str) else None

    # ----- writers (the pipeline's side)
    def write_request(self, request: RunRequest) -> None:
        write_atomic(self.run_dir(request.run_id) / "request.json", request.model_dump_json(indent=2) + "\n")

    def write_progress(self, progress: RunProgress) -> None:
        write_atomic(self.run_dir(progress.run_id) / "progress.json", progress.model_dump_json(indent=2) + "\n")

    def put_rows(self, run_id: str, model_key: str, rows: list[ResultRow]) -> None:
        """Store the rows of one model key: appended; an earlier attempt's rows of that key are replaced."""
        path = self.run_dir(run_id) / "results.jsonl"
        existing = read_jsonl(path)
        lines = [r.model_dump_json() for r in rows]
        if any(item.get("model_key") == model_key for item in existing):
            kept = [json.dumps(item, ensure_ascii=False) for item in existing if item.get("model_key") != model_key]
            write_atomic(path, "".join(line + "\n" for line in kept + lines))
        else:
            append_lines(path, lines)

    def add_event(self, run_id: str, *, step: str, status: str, model_key: str | None = None,
                  duration_s: float | None = None, exit_code: int | None = None, message: str = "",
                  hold: bool = False) -> None:
        """One line of ``events.jsonl``, appended and fsynced with the lines held before it.

        ``hold``: the line (its time taken now) is held back and written with the next event or by
        :meth:`flush_events`, in the same append: one fsync for a step's end and the next one's start.
        """
        event = {
            "ts": time.time(), "step": step, "model_key": model_key, "status": status,
            "duration_s": None if duration_s is None else round(duration_s, 3), "exit_code": exit_code,
            "message": message,
        }
        path = self.run_dir(run_id) / "events.jsonl"
        with self._lock:
            self._held.append((path, json.dumps(event, ensure_ascii=False)))
            if not hold:
                self._write_held()

    def flush_events(self) -> None:
        """Write the event lines held back (:meth:`add_event` with ``hold``), if any."""
        if self._held:
            with self._lock:
                self._write_held()

    def _write_held(self) -> None:
        held, self._held = self._held, []
        for path in dict.fromkeys(p for p, _ in held):
            append_lines(path, [line for p, line in held if p == path])

    def set_state(self, *, current_run: str | None, last_run: str | None) -> None:
        data = {"current_run": current_run, "last_run": last_run, "updated_at": time.time()}
        write_atomic(self.state_path, json.dumps(data) + "\n")

    def next_log(self, run_id: str, step: str, model_key: str | None = None) -> Path:
        """``logs/NN-step[-key].log`` with NN one past the logs already there (earlier attempts kept); ``step``
        is one of :data:`contract.vocab.LOG_STEPS` (what ``fleetctl logs --step`` offers)."""
        if step not in LOG_STEPS:
            raise ValueError(f"log step {step!r} is not in contract.vocab.LOG_STEPS")
        logs = self.logs_dir(run_id)
        try:
            names = os.listdir(logs)
        except FileNotFoundError:
            logs.mkdir(parents=True, exist_ok=True)
            names = []
        nums = [int(m.group(1)) for name in names if name.endswith(".log") and (m := _LOG_NUMBER.match(name))]
        n = max(nums, default=0) + 1
        return logs / (f"{n:02d}-{step}" + (f"-{model_key}" if model_key else "") + ".log")


def forget_current(workdir: Path, run_id: str) -> None:
    """state.json no longer names ``run_id`` as current (removed when it cannot be rewritten: a full disk)."""
    store = RunStore(workdir)
    if store.current_run() != run_id:
        return
    try:
        store.set_state(current_run=None, last_run=run_id)
    except OSError:
        store.state_path.unlink(missing_ok=True)
