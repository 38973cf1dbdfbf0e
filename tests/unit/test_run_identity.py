"""A module answers a run request from its record only when the record is of the same request.

The identity (``contract.request_identity.request_identity``) is pure; the run task's body (``execute_run``) is called
directly with the embedded broker's backend (real files, no worker), on a module folder that holds the record
of a finished run, as the first of two controllers using one run id leaves it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent.outbox import outbox_path
from agent.settings import AgentSettings
from agent.store import RunStore
from agent.task import execute_run
from contract.celery_app import make_app
from contract.kv import KV
from contract.records import (
    ResultRow,
    RunProgress,
    RunRequest,
    RunState,
    StepError,
)
from contract.request_identity import release_difference, request_difference, request_identity

SHA_141 = "ab12" * 16
SHA_142 = "cd34" * 16
TARBALL = "SGLang-MUSA-M1000-M1000_{}_sglang.tar.gz"


def _request(**kw: Any) -> RunRequest:
    values: dict[str, Any] = {
        "run_id": "same-1", "module": "m1", "tarball": f"/srv/a/{TARBALL.format('1.4.1')}", "sha256": SHA_141,
        "release": "1.4.1", "models": ("qwen3", "qwen35_mtp"), "model_root": "/models",
        "model_paths": {"qwen3": "/models/q3"}, "key_env": {"qwen3": {"SGLANG_FLAG": "1"}},
    }
    values.update(kw)
    return RunRequest(**values)


# --------------------------------------------------------------------------- the identity (pure)
def test_same_request_delivered_again_or_staged_elsewhere_is_the_same_request():
    first = _request()
    assert request_difference(first, first) is None
    # where the tarball lies is a location, not content; the delivery policy is not what is measured
    elsewhere = _request(tarball=f"/data/other/{TARBALL.format('1.4.1')}", max_attempts=5, sha256=SHA_141.upper())
    assert request_identity(elsewhere) == request_identity(first)
    assert request_difference(first, elsewhere) is None
    # the keys as a set; paths and env of keys not requested, and empty env, do not count
    reordered = _request(models=("qwen35_mtp", "qwen3"), model_paths={"qwen3": "/models/q3/", "qwen3vl": "/x"},
                         key_env={"qwen3": {"SGLANG_FLAG": "1"}, "qwen35_mtp": {}}, model_root="/models/")
    assert request_difference(first, reordered) is None


def test_another_release_is_named_by_sha256_and_version():
    why = request_difference(_request(), _request(sha256=SHA_142, release="1.4.2",
                                                  tarball=f"/srv/a/{TARBALL.format('1.4.2')}"))
    assert why == ("run id same-1 was used here for release sha256 ab12ab12ab12… (1.4.1); "
                   "this request is for cd34cd34cd34… (1.4.2): refused")
    assert release_difference(_request(), _request(sha256=SHA_142, release="1.4.2")) == why
    # the same content under another label: its records would carry the other name
    relabelled = request_difference(_request(), _request(release="1.4.1-rc"))
    assert relabelled is not None and "(1.4.1); this request is for ab12ab12ab12… (1.4.1-rc)" in relabelled
    # no label: the tarball's file name is the release's name, as the pipeline names it
    assert request_difference(_request(release=""), _request(release="", tarball="/x/" + TARBALL.format("1.4.1"))) \
        is None


@pytest.mark.parametrize(("change", "said"), [
    ({"models": ("qwen3",)}, "with models qwen3,qwen35_mtp; this request has models qwen3: refused"),
    ({"model_root": "/other"}, "with model root /models; this request has model root /other: refused"),
    ({"model_paths": {}}, "with model paths qwen3=/models/q3; this request has model paths -: refused"),
    ({"key_env": {"qwen3": {"SGLANG_FLAG": "2"}}},
     "with key env qwen3: SGLANG_FLAG; this request has key env qwen3: SGLANG_FLAG (other values): refused"),
    ({"key_env": {"qwen3": {"SGLANG_FLAG": "1", "SECRET": "s3cr3t"}}},
     "with key env qwen3: SGLANG_FLAG; this request has key env qwen3: SECRET,SGLANG_FLAG: refused"),
    ({"module": "m2"}, "with module m1; this request has module m2: refused"),
])
def test_each_other_setting_is_named_in_one_line(change, said):
    why = request_difference(_request(), _request(**change))
    assert why == f"run id same-1 was used here {said}"
    assert "\n" not in why and "s3cr3t" not in why  # variable names only: a value may be a secret
    assert release_difference(_request(), _request(**change)) is None  # the same release: the pipeline may resume


def test_several_differences_are_named_together():
    why = request_difference(_request(), _request(models=("qwen3",), model_root="/other"))
    assert why == ("run id same-1 was used here with models qwen3,qwen35_mtp, model root /models; "
                   "this request has models qwen3, model root /other: refused")


# --------------------------------------------------------------------------- the run task
@pytest.fixture
def agent(tmp_path: Path):
    settings = AgentSettings(module="m1", workdir=tmp_path / "work", data_dir=tmp_path / "fleet",
                             broker_url="filesystem://", metrics_port=0)
    app = make_app(settings)
    yield settings, app, KV(app)
    app.close()


def _payload(settings: AgentSettings, version: str, sha: str, **kw: object) -> dict[str, object]:
    base: dict[str, object] = {
        "run_id": "same-1", "module": "m1", "tarball": str(settings.workdir / "incoming" / TARBALL.format(version)),
        "sha256": sha, "release": version, "models": ["qwen3"], "model_root": "/nonexistent/models"}
    return {**base, **kw}


def _record_finished_run(settings: AgentSettings, payload: dict[str, object]) -> list[ResultRow]:
    """The module's record of run same-1 of release 1.4.1, finished (as the first controller's run left it), and
    its final state still waiting in the outbox (the broker was away when it ended)."""
    store = RunStore(settings.workdir)
    req = RunRequest.model_validate(payload)
    store.write_request(req)
    rows = [ResultRow(run_id="same-1", module="m1", release="1.4.1", model_key="qwen3", table="sweep",
                      profile=f"128:{n}", model="Qwen3", ttft_ms=10.0 + n) for n in (128, 256)]
    store.put_rows("same-1", "qwen3", rows)
    done = RunProgress(run_id="same-1", module="m1", release="1.4.1", state=RunState.DONE, step="done",
                       keys_total=1, keys_done=1, rows=2, updated_at=1.0, finished_at=1.0)
    store.write_progress(done)
    outbox = outbox_path(settings.workdir, "same-1")
    outbox.parent.mkdir(parents=True, exist_ok=True)
    outbox.write_text(done.model_dump_json())
    return rows


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_another_release_under_a_used_run_id_is_refused_and_the_record_left_alone(agent):
    settings, app, kv = agent
    _record_finished_run(settings, _payload(settings, "1.4.1", SHA_141))
    before = _files(settings.workdir)
    out = execute_run(app, settings, _payload(settings, "1.4.2", SHA_142))
    why = ("run id same-1 was used here for release sha256 ab12ab12ab12… (1.4.1); "
           "this request is for cd34cd34cd34… (1.4.2): refused")
    assert out["state"] == "failed" and out["error"]["message"] == why and out["release"] == "1.4.2"
    p = kv.progress("same-1", ["m1"])["m1"]
    assert p is not None and p.state == RunState.FAILED and p.release == "1.4.2" and p.error.message == why
    assert kv.rows("same-1", "m1") is None  # the recorded run's rows are not published as this request's
    assert _files(settings.workdir) == before  # its files, attempts and outbox entry as they were


@pytest.mark.parametrize("change", [{"models": ["qwen3", "qwen35"]}, {"key_env": {"qwen3": {"SGLANG_FLAG": "1"}}},
                                    {"model_root": "/nonexistent/other"}])
def test_other_settings_under_a_used_run_id_are_refused(agent, change):
    settings, app, kv = agent
    _record_finished_run(settings, _payload(settings, "1.4.1", SHA_141))
    before = _files(settings.workdir)
    out = execute_run(app, settings, _payload(settings, "1.4.1", SHA_141, **change))
    assert out["state"] == "failed" and out["error"]["message"].startswith("run id same-1 was used here with ")
    assert kv.rows("same-1", "m1") is None and _files(settings.workdir) == before


def test_the_same_request_delivered_again_is_answered_from_the_record(agent):
    settings, app, kv = agent
    first = _payload(settings, "1.4.1", SHA_141)
    rows = _record_finished_run(settings, first)
    again = {**first, "tarball": str(settings.workdir / "releases" / TARBALL.format("1.4.1")), "max_attempts": 3}
    out = execute_run(app, settings, again)  # staged elsewhere, another policy: the same request
    assert out["state"] == "done" and out["release"] == "1.4.1"
    assert kv.progress("same-1", ["m1"])["m1"].state == RunState.DONE
    assert sorted(r.profile for r in kv.rows("same-1", "m1")) == sorted(r.profile for r in rows)
    assert not (settings.workdir / "runs" / "same-1" / "attempts").exists()  # not benchmarked again


def test_a_record_whose_request_cannot_be_read_is_not_answered_from(agent):
    settings, app, kv = agent
    _record_finished_run(settings, _payload(settings, "1.4.1", SHA_141))
    (settings.workdir / "runs" / "same-1" / "request.json").write_text('{"run_id": "same-1"}')
    out = execute_run(app, settings, _payload(settings, "1.4.1", SHA_141))
    assert out["state"] == "failed" and "whose request cannot be read" in out["error"]["message"]
    assert kv.rows("same-1", "m1") is None


# --------------------------------------------------------------------------- the controller (embedded broker)
@pytest.fixture
def fleet(tmp_path: Path):
    from controller.fleet import Fleet
    from controller.history import History
    from controller.settings import ControllerSettings

    settings = ControllerSettings(broker_url="filesystem://", data_dir=tmp_path / "fleet",
                                  inventory=tmp_path / "inventory.toml", history=tmp_path / "history.sqlite")
    f = Fleet(settings, History(settings.history_path))
    yield f
    f.close()


def _rows(release: str) -> list[ResultRow]:
    return [ResultRow(run_id="same-1", module="m1", release=release, model_key="qwen3", table="sweep",
                      profile="128:128", model="Qwen3", ttft_ms=10.0)]


def test_controller_refuses_a_run_id_on_the_broker_that_its_history_lacks(fleet):
    from controller.fleet import RunIdInUse

    fleet.check_new_run_id("same-1", modules=["m1", "m2"])  # nothing anywhere: a new run id
    fleet.kv.put_progress(RunProgress(run_id="same-1", module="m1", release="1.4.1", state=RunState.DONE))
    with pytest.raises(RunIdInUse) as err:
        fleet.check_new_run_id("same-1", modules=["m1", "m2"])
    assert str(err.value) == (f"run id 'same-1' is already on the broker, not in {fleet.history.path}: "
                              "m1 (done, release 1.4.1) (another controller's run); choose another run id")
    fleet.check_new_run_id("same-1", modules=["m2"])  # only the chosen modules are looked at
    fleet.history.create_run("same-1", release="1.4.1", models=["qwen3"], modules=["m1"])
    fleet.check_new_run_id("same-1", resume=True, modules=["m1"])  # this history's own run, resumed


def test_sync_takes_no_record_of_another_release(fleet):
    fleet.history.create_run("same-1", release="1.4.2", models=["qwen3"], modules=["m1"])
    fleet.kv.put_final(RunProgress(run_id="same-1", module="m1", release="1.4.1", state=RunState.DONE, rows=1,
                                   started_at=1.0, updated_at=2.0, finished_at=2.0), _rows("1.4.1"))
    p = fleet.sync("same-1").progress["m1"]
    assert p.state == RunState.FAILED and p.release == "1.4.2" and p.error.step == "sync"
    assert "is of release 1.4.1 (done), not 1.4.2: not taken as this run's result" in p.error.message
    assert fleet.history.rows("same-1", source=None) == [] and fleet.history.run("same-1").state == "failed"


@pytest.mark.parametrize(("state", "kept"), [(RunState.FAILED, "refused"), (RunState.DONE, None)])
def test_sync_takes_no_rows_of_another_release(fleet, state, kept):
    """The module's own state of this run (e.g. its refusal), with the rows of the other release still on the
    broker: no row is taken, and the part is failed (a refusal keeps its own reason)."""
    fleet.history.create_run("same-1", release="1.4.2", models=["qwen3"], modules=["m1"])
    error = StepError(step="dispatch", message="refused") if kept else None
    fleet.kv.put_final(RunProgress(run_id="same-1", module="m1", release="1.4.2", state=state, rows=1,
                                   updated_at=2.0, finished_at=2.0, error=error), _rows("1.4.1"))
    p = fleet.sync("same-1").progress["m1"]
    assert p.state == RunState.FAILED and fleet.history.rows("same-1", source=None) == []
    if kept:
        assert p.error.message == kept
    else:
        assert p.error.step == "sync" and "rows of run same-1 on m1 are of release 1.4.1" in p.error.message
    assert any("are of release 1.4.1, not 1.4.2" in msg for _, _, msg in fleet.history.events("same-1"))


def test_sync_takes_the_rows_of_its_own_release(fleet):
    fleet.history.create_run("same-1", release="1.4.1", models=["qwen3"], modules=["m1"])
    fleet.kv.put_final(RunProgress(run_id="same-1", module="m1", release="1.4.1", state=RunState.DONE, rows=1,
                                   updated_at=2.0, finished_at=2.0), _rows("1.4.1"))
    assert fleet.sync("same-1").progress["m1"].state == RunState.DONE
    assert len(fleet.history.rows("same-1", source=None)) == 1
