import pytest

from agent.settings import AgentSettings
from contract.kv import Beat
from contract.records import Heartbeat, KeyOutcome, RunProgress, RunState, UnknownModelKey, parse_model_keys
from contract.settings import BrokerSettings, SettingsError, load_settings
from controller.fleet import (
    REFUSED_STEP,
    BadRelease,
    ModuleStatus,
    RunView,
    derive_state,
    failed_progress,
    module_failed,
    refused_parts,
    release_version,
)
from controller.fleet.dispatch import unsent


def hb(ts, **kw):
    return Beat(Heartbeat(module="m", agent_version="1", ts=ts, **kw), ts)


@pytest.mark.parametrize(("beat", "failures", "state"), [
    (None, 0, "offline"),
    (hb(0.0), 0, "offline"),
    (hb(95.0), 0, "idle"),
    (hb(95.0, run_id="r1", step="benchmark"), 0, "busy"),
    (hb(95.0, healthy=False, detail="disk"), 0, "bad"),
    (hb(95.0), 3, "bad"),
])
def test_derive_state(beat, failures, state):
    got, reason = derive_state(beat, 100.0, offline_after=30.0, consecutive_failures=failures)
    assert got == state
    if state != "idle":
        assert reason


def test_release_version_from_name(tmp_path):
    assert release_version(tmp_path / "SGLang-MUSA-M1000-M1000_1.4.1_sglang.tar.gz") == "1.4.1"
    with pytest.raises(BadRelease, match="not a release tarball name"):
        release_version(tmp_path / "release.tgz")


def test_run_view_state():
    def p(state, outcomes=()):
        return RunProgress(run_id="r", module="m", state=state, outcomes=outcomes)
    assert RunView("r", ("a",), {"a": None}).state() == "running"
    assert RunView("r", ("a", "b"), {"a": p(RunState.DONE), "b": p(RunState.DONE)}).state() == "done"
    failed_key = (KeyOutcome(model_key="qwen3", status="failed"),)
    assert RunView("r", ("a",), {"a": p(RunState.DONE, failed_key)}).state() == "failed"
    assert RunView("r", ("a",), {"a": p(RunState.CANCELLED)}).state() == "cancelled"


def test_model_keys():
    assert parse_model_keys("qwen3, qwen35_mtp,qwen3") == ("qwen3", "qwen35_mtp")
    assert len(parse_model_keys("all")) == 7
    with pytest.raises(UnknownModelKey, match="unknown model key 'qwen4'"):
        parse_model_keys("qwen3,qwen4")


def test_settings_from_file_and_env(tmp_path, monkeypatch):
    cfg = tmp_path / "agent.toml"
    cfg.write_text('[fleet]\nbroker_url = "redis://fleet:s3cret@10.0.0.1:6379/0"\n[agent]\nmodule = "m-a01"\n')
    monkeypatch.delenv("FLEET_MODULE", raising=False)
    s = load_settings(AgentSettings, cfg)
    assert s.module == "m-a01"
    assert "s3cret" not in s.redacted_broker_url()
    assert s.visibility_timeout > s.run_time_limit
    monkeypatch.setenv("FLEET_MODULE", "from-env")
    assert load_settings(AgentSettings, cfg).module == "from-env"
    cfg.write_text('[agent]\nmodul = "typo"\n')
    with pytest.raises(SettingsError, match="unknown setting 'modul'"):
        load_settings(AgentSettings, cfg)
    with pytest.raises(ValueError, match="unsupported broker scheme"):
        BrokerSettings(broker_url="amqp://x")
    with pytest.raises(ValueError, match="greater than 0"):
        BrokerSettings(run_time_limit=0)
    # the soft limit is derived (issue 50): a fifth earlier, 600 s at most, always before the hard one
    assert (BrokerSettings(run_time_limit=50).run_soft_time_limit, BrokerSettings().run_soft_time_limit) == (40, 14400)


def test_password_file_stays_out_of_the_url_text(tmp_path):
    pw = tmp_path / "pw"
    pw.write_text("p@ss/word\n")
    s = BrokerSettings(broker_url="rediss://fleet@redis.lab:6380/1", broker_password_file=pw)
    assert s.broker_url_with_secret() == "rediss://fleet:p%40ss%2Fword@redis.lab:6380/1"
    assert "p@ss" not in s.redacted_broker_url() and "p%40ss" not in s.broker_url


def test_dispatch_argsrepr_names_the_run_not_its_values():
    """What Celery puts in a run message's headers (and worker events) in place of the request's repr."""
    from controller.fleet import args_label

    req = {"run_id": "r-1", "module": "sim-01", "key_env": {"qwen3": {"TOKEN": "s3cret"}}}
    assert args_label([req]) == "(<run request r-1 for sim-01>,)"
    assert "s3cret" not in args_label([req])
    assert args_label([1.5]) == "(<1 argument(s)>)"


def test_upsert_progress_many_keeps_the_newest_in_one_transaction(tmp_path):
    from controller.history import History

    h = History(tmp_path / "h.sqlite")
    h.create_run("r1", modules=["a", "b"])
    old, new = (RunProgress(run_id="r1", module=m, step=s, updated_at=t) for m, s, t in (("a", "queued", 1.0),
                                                                                          ("a", "unpack", 2.0)))
    h.upsert_progress_many([new, RunProgress(run_id="r1", module="b", step="queued", updated_at=1.0)])
    h.upsert_progress_many([old])  # older: does not win
    h.upsert_progress_many([])
    got = h.progress("r1")
    assert got["a"].step == "unpack" and got["b"].step == "queued"
    h.close()


def test_a_run_with_parts_refused_at_dispatch_is_done_unless_every_part_was():
    """Issue 46 item 5: a part refused at dispatch (offline, bad, reserved) leaves the run judged on the modules that
    ran; every part refused, or a part that failed at ``dispatch`` (no release there), fails it."""
    done = RunProgress(run_id="r", module="a", state=RunState.DONE)
    held = failed_progress("r", "b", "1.4.1", REFUSED_STEP, "reserved by alice until 15:00 (fw)", 1, 1.0)
    bad = failed_progress("r", "c", "1.4.1", REFUSED_STEP, "module bad: agent reports itself unhealthy", 1, 1.0)
    no_release = failed_progress("r", "d", "1.4.1", "dispatch", "release not available on the module", 1, 1.0)
    assert refused_parts({"a": done, "b": held, "c": bad, "d": no_release, "e": None}) == {
        "b": "reserved by alice until 15:00 (fw)", "c": "module bad: agent reports itself unhealthy"}
    assert RunView("r", ("a", "b", "c"), {"a": done, "b": held, "c": bad}).state() == "done"
    assert RunView("r", ("b", "c"), {"b": held, "c": bad}).state() == "failed"
    assert RunView("r", ("a", "b", "d"), {"a": done, "b": held, "d": no_release}).state() == "failed"
    assert module_failed(held)  # still a part that did not pass: `retry --failed-only` sends it again


@pytest.mark.parametrize(("state", "reserved", "has_release", "expected"), [
    ("idle", None, True, None),
    ("unreachable", None, True, None),  # queued: taken when it is back
    ("idle", "reserved by alice until 15:00", False, (REFUSED_STEP, "reserved by alice until 15:00")),
    ("offline", None, False, (REFUSED_STEP, "module offline: no heartbeat ever")),
    ("bad", None, True, (REFUSED_STEP, "module bad: no heartbeat ever")),
    ("idle", None, False, ("dispatch", "release not available on the module")),
])
def test_why_a_part_is_not_sent(state, reserved, has_release, expected):
    assert unsent(ModuleStatus("m", state, "no heartbeat ever"), reserved, has_release) == expected
