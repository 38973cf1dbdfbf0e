"""``fleetctl`` in this process (exit code, stdout, stderr), its one-line errors, and a run history filled
with synthetic runs (a baseline from the seed, run-a clean, run-b regressed: no broker work)."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import pytest

from contract.records import MODEL_KEYS, RunProgress, RunState
from controller.history import History

INV = '[[module]]\nname = "m1"\ntransport = "local"\n'
TARBALL = "SGLang-MUSA-M1000-M1000_1.4.1_sglang.tar.gz"
MODULES = [f"m{i:02d}" for i in range(6)]


def write_release_stub(path: Path, marker: str = "") -> Path:
    """A tarball with a release's layout and nothing behind it (every script of every key an empty file):
    what the controller checks before it dispatches; ``marker`` makes its sha256 its own."""
    import io
    import tarfile

    from contract.layout import required_files

    with tarfile.open(path, "w:gz") as tar:
        for name in (*required_files(MODEL_KEYS), f"README{marker}"):
            data = marker.encode() if name.startswith("README") else b""
            info = tarfile.TarInfo(f"stub_release/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``fleetctl ARGS`` in this process: (exit code, stdout, stderr)."""
    from controller.cli.app import main

    with pytest.raises(SystemExit) as e:
        main(list(args))
    cap = capsys.readouterr()
    return int(e.value.code or 0), cap.out, cap.err


def one_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, err
    return lines[0]


def closed_port() -> int:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def finished_run(h: History, run_id: str, *, modules: list[str], state: str = "running",
                 module_state: RunState = RunState.DONE, release: str = "1.4.2", models: tuple[str, ...] = ("qwen3",),
                 sha256: str = "") -> None:
    """A run whose modules all reported a terminal state (the run row itself may still say running)."""
    h.create_run(run_id, release=release, models=models, modules=modules, sha256=sha256)
    now = time.time()
    for m in modules:
        h.upsert_progress(RunProgress(run_id=run_id, module=m, release=release, state=module_state, step="done",
                                      keys_total=len(models), keys_done=len(models), updated_at=now,
                                      started_at=now - 5, finished_at=now))
    if state != "running":
        h.set_run_state(run_id, state)
    time.sleep(0.01)  # created_at orders the runs


def fill(h: History, seed_rows: list, *, state: str = "running") -> None:
    """Baseline 1.4.1@v1 from the seed; run-a (clean) and run-b (qwen3 decode 8 % worse), both finished."""
    from controller.report.synth import fleet, rows_frame
    from tests.support.frames import frame_to_rows

    reference = rows_frame(seed_rows)
    h.add_baseline("1.4.1", seed_rows, "seed")
    keys = tuple(sorted(set(reference["model_key"])))
    for run_id, regress, seed in (("run-a", None, 1), ("run-b", {("qwen3", "decode_tps"): 0.08}, 2)):
        df = fleet(reference, module_factor={"m03": 0.88}, regress=regress, seed=seed, run_id=run_id,
                   release="1.4.1")
        finished_run(h, run_id, modules=MODULES, state=state, release="1.4.1", models=keys)
        h.upsert_rows(frame_to_rows(df))


class GivenSession:
    """The parts of a :class:`controller.service.Session` a verb reads, given: a fake at the CLI's seam (the
    session), for a verb run on a history or inventory a test made. Closing it closes nothing of theirs."""

    def __init__(self, history: History | None = None, inventory: Any = None, settings: Any = None) -> None:
        self._history, self._inventory, self._settings = history, inventory, settings

    @property
    def settings(self) -> Any:
        if self._settings is None:
            from controller.settings import ControllerSettings

            self._settings = ControllerSettings()
        return self._settings

    def read_history(self) -> History:
        assert self._history is not None, "this verb reads the run history: give one"
        return self._history

    history = read_history

    def inventory(self) -> Any:
        assert self._inventory is not None, "this verb reads the inventory: give one"
        return self._inventory

    def close(self) -> None:
        pass


def given_app(history: History | None = None, *, inventory: Any = None, settings: Any = None) -> Any:
    """fleetctl's command tree (:func:`controller.cli.app.build_app`) whose verbs read the parts given (a
    :class:`GivenSession`): ``CliRunner().invoke(given_app(h), ["report", ...])`` runs the verb as fleetctl does."""
    from controller.cli.app import build_app
    from controller.cli.invocation import Invocation

    inv = Invocation()
    inv._session = GivenSession(history, inventory, settings)  # type: ignore[assignment]  # the parts a verb reads
    app = build_app()
    app.info.context_settings = {**(app.info.context_settings or {}), "obj": inv}
    return app
