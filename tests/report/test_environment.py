"""Environment fingerprints in the history and the report (fast tier, a real SQLite history of synthetic fleets):
a module with another driver is named (and said of when it is an outlier), a comparison across runs or with a
baseline warns when a module's environment changed, and the setting refuses such a baseline in one line."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from contract.fingerprint import EnvFingerprint
from contract.records import RunProgress
from controller.history import ROW_FIELDS, History
from controller.report import build_report, compare_runs
from controller.report.environment import EnvironmentRefused, digests_of, fleet_odd
from controller.report.load import as_read
from controller.report.render import to_json, to_markdown
from controller.report.render.html import to_html
from controller.report.synth import fleet
from controller.settings import ControllerSettings
from tests.support.cli import given_app
from tests.support.frames import frame_to_rows

MODULES = [f"m{i:02d}" for i in range(6)]
FP = EnvFingerprint(driver="3.0.0-sim", firmware="4.2.0-sim", musa="4.0.0-sim", torch_musa="2.1.0-sim",
                    triton="3.1.0-sim", tilelang="0.1.6-sim", kernel="6.1.0", os="Debian GNU/Linux 12 (bookworm)",
                    agent="0.9.0", release="1.4.1")
NEW_DRIVER = FP.model_copy(update={"driver": "3.1.0-sim"})


def _store(h: History, reference: pd.DataFrame, run_id: str, prints: dict[str, EnvFingerprint],
           slow: dict[str, float] | None = None, seed: int = 1) -> None:
    reference = reference[reference["model_key"] == "qwen3"]  # one key: a fast-tier report
    keys = ["qwen3"]
    df = fleet(reference, modules=MODULES, module_factor=slow or {}, seed=seed, run_id=run_id, release="1.4.1")
    h.create_run(run_id, release="1.4.1", models=keys, modules=MODULES)
    h.upsert_rows(r.model_copy(update={"env_digest": prints[r.module].digest()}) for r in frame_to_rows(df))
    h.upsert_progress_many(RunProgress(run_id=run_id, module=m, updated_at=time.time(), fingerprint=p)
                           for m, p in prints.items())
    h.set_run_state(run_id, "done")
    time.sleep(0.01)  # created_at orders the runs


@pytest.fixture
def history(tmp_path: Path):
    h = History(tmp_path / "history.sqlite")
    yield h
    h.close()


def test_the_history_keeps_one_record_per_run_and_module_and_finds_it_by_digest(history: History, reference) -> None:
    _store(history, reference, "run-1", {m: NEW_DRIVER if m == "m02" else FP for m in MODULES})
    assert history.fingerprints("run-1") == {m: NEW_DRIVER if m == "m02" else FP for m in MODULES}
    assert history.fingerprints_by_digest([FP.digest(), NEW_DRIVER.digest(), "0" * 12]) == {
        FP.digest(): FP, NEW_DRIVER.digest(): NEW_DRIVER}
    rows = history.rows("run-1", "m02")
    assert rows and {r.env_digest for r in rows} == {NEW_DRIVER.digest()}
    frame = pd.DataFrame({"module": ["a", "a", "a", "b", "c"], "env_digest": ["x", "y", "y", None, "z"]})
    assert digests_of(frame) == digests_of(as_read(frame)) == {"a": "y", "c": "z"} and digests_of(None) == {}
    assert digests_of(frame.assign(env_digest=None)) == {}


def test_an_older_history_gains_the_digest_column(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    old = [f for f in ROW_FIELDS if f != "env_digest"]
    conn = sqlite3.connect(path)
    conn.executescript(f"CREATE TABLE rows ({', '.join(repr(f) for f in old)}, PRIMARY KEY (run_id, module,"
                       " model_key, profile, source));")
    conn.close()
    h = History(path)
    try:
        cols = [r[1] for r in h.conn.execute("PRAGMA table_info(rows)")]
        assert cols == old + ["env_digest"]
    finally:
        h.close()


def test_a_module_with_another_driver_is_named_and_its_outlier_explained(history: History, reference) -> None:
    _store(history, reference, "run-1", {m: NEW_DRIVER if m == "m02" else FP for m in MODULES},
           slow={"m02": 0.85})
    rep = build_report(history, "run-1", previous=False)
    assert [o.module for o in rep.outliers] == ["m02"]  # 15 % slower, and on another driver
    (odd,) = rep.environment
    assert (odd.module, odd.differences, odd.fleet_modules, odd.majority_modules) == (
        "m02", ("driver 3.1.0-sim (fleet 3.0.0-sim)",), 6, 5)
    assert rep.notes[-2:] == (
        "m02's environment differs from the fleet's (5 of 6 modules): driver 3.1.0-sim (fleet 3.0.0-sim)",
        "outlier m02 was measured in another environment than the fleet's (driver 3.1.0-sim (fleet 3.0.0-sim)): "
        "that, not the module, may be why it is out of line")
    md = to_markdown(rep)
    assert "| m02 | * |" in md and "other environment than the fleet: driver 3.1.0-sim (fleet 3.0.0-sim)" in md
    assert json.loads(to_json(rep))["environment"][0]["module"] == "m02"
    assert "other environment than the fleet: driver 3.1.0-sim (fleet 3.0.0-sim)" in to_html(rep)


def test_one_environment_names_nobody_and_a_tie_names_nobody() -> None:
    assert fleet_odd(dict.fromkeys(MODULES, FP)) == ()
    assert fleet_odd({"a": FP, "b": NEW_DRIVER}) == ()
    assert [d.module for d in fleet_odd({"a": FP, "b": FP, "c": NEW_DRIVER})] == ["c"]


def test_comparisons_warn_when_a_modules_environment_changed(history: History, reference) -> None:
    _store(history, reference, "run-1", dict.fromkeys(MODULES, FP), seed=1)
    _store(history, reference, "run-2", {m: NEW_DRIVER if m == "m04" else FP for m in MODULES}, seed=2)
    rep = compare_runs(history, "run-1", "run-2")
    assert rep.environment_changes == ("environment changed on m04 since run-1: driver 3.1.0-sim (was 3.0.0-sim)",)
    assert rep.environment_changes[0] in rep.notes
    # a baseline keeps its rows' digests: the same warning against it, and against each module's previous run
    history.add_baseline("1.4.1", history.rows("run-1"), source="run-1")
    rep = build_report(history, "run-2", "1.4.1")
    assert rep.environment_changes == (
        "environment changed on m04 since baseline:1.4.1:v1: driver 3.1.0-sim (was 3.0.0-sim)",
        "environment changed on m04 since each module's previous run: driver 3.1.0-sim (was 3.0.0-sim)")
    assert compare_runs(history, "run-1", "run-1").environment_changes == ()


WHY = ("m04 measured in another environment than baseline baseline:1.4.1:v1 (driver 3.1.0-sim (was 3.0.0-sim)) "
       "and baseline_same_environment is set: compare against a baseline of this environment")


def _changed_since_baseline(history: History, reference: pd.DataFrame) -> None:
    _store(history, reference, "run-1", dict.fromkeys(MODULES, FP), seed=1)
    history.add_baseline("1.4.1", history.rows("run-1"), source="run-1")
    _store(history, reference, "run-2", {m: NEW_DRIVER if m == "m04" else FP for m in MODULES}, seed=2)


def test_the_setting_refuses_a_baseline_of_another_environment(history: History, reference) -> None:
    _changed_since_baseline(history, reference)
    with pytest.raises(EnvironmentRefused) as info:
        build_report(history, "run-2", "1.4.1", same_environment=True, previous=False)
    assert str(info.value) == WHY
    assert build_report(history, "run-1", "1.4.1", same_environment=True, previous=False).verdict == "pass"


@pytest.mark.parametrize("same", [True, False])
def test_fleetctl_report_refuses_in_one_line_or_warns(history: History, reference, same: bool) -> None:
    _changed_since_baseline(history, reference)
    app = given_app(history, settings=ControllerSettings(baseline_same_environment=same))
    res = CliRunner().invoke(app, ["report", "run-2", "--baseline", "1.4.1", "-o", "json"])
    if same:
        assert res.exit_code == 2 and res.stderr.strip().splitlines() == [f"fleetctl: error: {WHY}"]
    else:
        assert res.exit_code == 0, res.output
        assert res.stderr.splitlines() == [
            "warning: environment changed on m04 since baseline:1.4.1:v1: driver 3.1.0-sim (was 3.0.0-sim)",
            "warning: environment changed on m04 since each module's previous run: driver 3.1.0-sim (was 3.0.0-sim)"]


def test_a_baseline_without_fingerprints_is_refused_only_with_the_setting(history: History, reference) -> None:
    _store(history, reference, "run-1", dict.fromkeys(MODULES, FP))
    history.add_baseline("seed", [r.model_copy(update={"env_digest": None}) for r in history.rows("run-1")], "seed")
    assert build_report(history, "run-1", "seed", previous=False).environment_changes == ()
    with pytest.raises(EnvironmentRefused, match=r"^baseline baseline:seed:v1 has no environment fingerprint and "):
        build_report(history, "run-1", "seed", same_environment=True, previous=False)


def test_the_report_names_the_modules_that_compiled_and_fetched_the_kernels(history: History, reference) -> None:
    from contract.kernel_store import KernelCacheUse

    _store(history, reference, "run-1", dict.fromkeys(MODULES, FP))
    assert not [n for n in build_report(history, "run-1", previous=False).notes if n.startswith("kernel cache")]
    uses = {"m00": KernelCacheUse(action="compiled", archive="a" * 64, published=True),
            "m01": KernelCacheUse(action="compiled", archive="a" * 64, published=True),
            "m05": KernelCacheUse(action="compiled", why="driver unknown"),
            **{m: KernelCacheUse(action="fetched", archive="a" * 64) for m in ("m02", "m03", "m04")}}
    history.upsert_progress_many(RunProgress(run_id="run-1", module=m, updated_at=time.time(), fingerprint=FP,
                                             kernel_cache=u) for m, u in uses.items())
    rep = build_report(history, "run-1", previous=False)
    assert rep.notes[0] == ("kernel cache: compiled on m00, m01, m05 (published by m00, m01); fetched on m02, m03, "
                            "m04")
    assert "- kernel cache: compiled on m00, m01, m05" in to_markdown(rep)
    history.upsert_progress_many([RunProgress(run_id="run-1", module=m, updated_at=time.time() + 1, fingerprint=FP,
                                              precompile_cached=True) for m in ("m00", "m01")])
    assert build_report(history, "run-1", previous=False).notes[0] == (
        "kernel cache: compiled on m05; fetched on m02, m03, m04; cached by an earlier run on m00, m01")
    # a module that compiled because the store's archive was refused says why in the report (issue 51)
    why = f"archive {'a' * 12} refused: sha256 bbbbbbbbbbbb…, not the trusted aaaaaaaaaaaa… (corrupt or replaced)"
    history.upsert_progress_many([RunProgress(run_id="run-1", module="m05", updated_at=time.time() + 2,
                                              fingerprint=FP, kernel_cache=KernelCacheUse(action="compiled", why=why))])
    assert build_report(history, "run-1", previous=False).notes[0].endswith(
        f"; m05 compiled because the store's {why}")
