"""The run task's body refuses bad requests before it builds any path, and always ends with a state.

``execute_run`` is called directly, with the embedded broker's backend (real files, no worker)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.outbox import flush_outbox, outbox_path, unacked_path
from agent.settings import AgentSettings
from agent.task import execute_run
from contract.celery_app import make_app
from contract.digest import seal
from contract.kv import KV
from contract.records import RunProgress, RunState


@pytest.fixture
def agent(tmp_path: Path):
    settings = AgentSettings(module="m1", workdir=tmp_path / "work", data_dir=tmp_path / "fleet",
                             broker_url="filesystem://", metrics_port=0)
    app = make_app(settings)
    yield settings, app, KV(app)
    app.close()


def _payload(**kw):
    base = {"run_id": "r1", "module": "m1", "tarball": "/nonexistent/x.tar.gz", "sha256": "0" * 64,
            "models": ["qwen3"], "model_root": "/nonexistent"}
    return {**base, **kw}


@pytest.mark.parametrize("run_id", ["a b", "../../escape", "../runs2/x", "x" * 200, ".hidden", "-rf", "a/b", ""])
def test_hostile_run_ids_build_no_path(agent, tmp_path, run_id):
    settings, app, kv = agent
    out = execute_run(app, settings, _payload(run_id=run_id))
    assert out["state"] == "failed" and "refused request: run_id" in out["error"]
    work = tmp_path / "work"
    assert not (work / "runs").exists() or list((work / "runs").iterdir()) == []
    assert {p.name for p in tmp_path.iterdir()} <= {"fleet", "work"}  # nothing escaped beside them


def test_refused_request_with_a_safe_run_id_is_published_as_failed(agent):
    settings, app, kv = agent
    out = execute_run(app, settings, _payload(models=["qwen3"], sha256="not-hex", max_attempts="many"))
    assert out["state"] == "failed"
    p = kv.progress("r1", ["m1"])["m1"]
    assert p is not None and p.state == RunState.FAILED and "refused request" in p.error.message


def test_run_for_another_module_is_refused_without_touching_it(agent):
    settings, app, kv = agent
    out = execute_run(app, settings, _payload(module="m2"))
    assert out["state"] == "failed" and "m2" in out["error"]
    assert kv.progress("r1", ["m2"])["m2"] is None  # nothing written under another module's name


def test_a_failing_release_ends_failed_with_its_reason_and_empties_the_outbox(agent):
    settings, app, kv = agent
    missing = settings.workdir / "incoming" / "SGLang-MUSA-M1000-M1000_1.4.1_sglang.tar.gz"  # in a release root
    out = execute_run(app, settings, _payload(tarball=str(missing)))
    assert out["state"] == "failed" and "fetch" in json.dumps(out["error"])
    p = kv.progress("r1", ["m1"])["m1"]
    assert p is not None and p.state == RunState.FAILED
    assert not outbox_path(settings.workdir, "r1").exists()


def test_outbox_is_sent_by_the_next_flush(agent):
    """A terminal state the backend did not take waits in the outbox and is sent by a later flush."""
    settings, app, kv = agent
    p = RunProgress(run_id="r9", module="m1", state=RunState.DONE, updated_at=1.0, finished_at=1.0)
    path = outbox_path(settings.workdir, "r9")
    path.parent.mkdir(parents=True)
    path.write_text(p.model_dump_json())
    assert kv.progress("r9", ["m1"])["m1"] is None
    assert flush_outbox(kv, settings.workdir) == 1
    assert kv.progress("r9", ["m1"])["m1"] == seal(p, []) and not path.exists()  # sealed: no rows kept here
    assert kv.rows("r9", "m1") == []
    assert unacked_path(settings.workdir, "r9").exists()  # until the controller acknowledges it
