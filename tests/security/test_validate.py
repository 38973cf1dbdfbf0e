"""Fast tier: every check of the agent's request validation, and the worker's answer to a refusal."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agent.errors import BadInput
from agent.settings import AgentSettings
from agent.store import check_run_id
from agent.validate import (
    MAX_PAYLOAD_BYTES,
    RefusedRequest,
    env_name_problem,
    local_release_path,
    stage_local_release,
    validate_request,
)
from contract.kv import KV
from contract.records import MODEL_KEYS, RUN_ID_PATTERN, SCHEMA_VERSION, RunRequest, RunState

SHA = "ab" * 32


@pytest.fixture
def settings(tmp_path: Path) -> AgentSettings:
    return AgentSettings(module="mod-a", workdir=tmp_path / "work", data_dir=tmp_path / "fleet",
                         model_root=tmp_path / "models", broker_url="filesystem://")


@pytest.fixture
def good(settings: AgentSettings) -> dict:
    tar = local_release_path(settings.data_dir, SHA, "rel.tar.gz")
    tar.parent.mkdir(parents=True)
    tar.write_bytes(b"x")
    return {"schema_version": 1, "run_id": "20250101-000000-ab12", "module": "mod-a", "tarball": str(tar),
            "sha256": SHA, "release": "1.4.1", "models": ["qwen3", "qwen35_mtp"], "model_root": "/models",
            "model_paths": {"qwen3": "/data/q3"}, "key_env": {"qwen3": {"MUSA_VISIBLE_DEVICES": "0,1"}},
            "max_attempts": 2}


def refused(payload: object, settings: AgentSettings) -> RefusedRequest:
    with pytest.raises(RefusedRequest) as info:
        validate_request(payload, settings)
    return info.value


def with_(good: dict, **kw: object) -> dict:
    return {**good, **kw}


def test_good_request_passes(good, settings):
    req = validate_request(good, settings)
    assert isinstance(req, RunRequest) and req.models == ("qwen3", "qwen35_mtp")
    assert req.key_env == {"qwen3": {"MUSA_VISIBLE_DEVICES": "0,1"}}


def test_refusal_shape(good, settings):
    exc = refused(with_(good, models=["nope"]), settings)
    assert isinstance(exc, BadInput) and isinstance(exc, ValueError)
    assert exc.field == "models" and "unknown model key 'nope'" in exc.why
    assert str(exc) == f"refused request: models: {exc.why}"
    assert exc.run_id == good["run_id"] and exc.module == "mod-a"


@pytest.mark.parametrize("payload", [None, "text", 3, ["a"], b"\x80\x04"])
def test_not_an_object(payload, settings):
    exc = refused(payload, settings)
    assert exc.field == "payload" and exc.run_id is None and exc.module is None


def test_whole_payload_is_bounded(good, settings):
    big = with_(good, release="r", model_paths={"qwen3": "/" + "a" * (MAX_PAYLOAD_BYTES)})
    exc = refused(big, settings)
    assert exc.field == "payload" and "more than" in exc.why and exc.run_id == good["run_id"]


def test_not_plain_json(good, settings):
    assert refused(with_(good, release=object()), settings).field == "payload"


@pytest.mark.parametrize("version", [0, SCHEMA_VERSION - 2, SCHEMA_VERSION + 1, "1", 1.0, True, None])
def test_schema_version(good, settings, version):
    exc = refused(with_(good, schema_version=version), settings)
    assert exc.field == "schema_version"
    assert "upgrade" in str(exc)


@pytest.mark.parametrize("version", [SCHEMA_VERSION - 1, SCHEMA_VERSION])
def test_schema_version_of_the_controller_one_behind_runs(good, settings, version):
    """An agent runs requests of its own contract version and of the one before (ADR 0051)."""
    assert validate_request(with_(good, schema_version=version), settings).schema_version == version


@pytest.mark.parametrize("run_id", ["", "../x", "a/b", ".hidden", "-x", "x" * 129, "a b", "r1\n", "a:b", "r*",
                                    "ré", 12, None])
def test_run_id_pattern(good, settings, run_id):
    exc = refused(with_(good, run_id=run_id), settings)
    assert exc.field == "run_id" and exc.run_id is None


def test_run_id_pattern_is_one_definition():
    for ok in ("r1", "20250101-000000-ab12", "a.b_c-d", "x" * 128):
        assert RUN_ID_PATTERN.fullmatch(ok) and check_run_id(ok) == ok
    for bad in ("r1\n", "x" * 129, "a:b"):
        with pytest.raises(BadInput):
            check_run_id(bad)
        with pytest.raises(ValueError, match="run id"):
            RunRequest(run_id=bad, module="m", tarball="/t", sha256=SHA, models=("qwen3",), model_root="/m")


def test_run_for_another_module(good, settings):
    exc = refused(with_(good, module="mod-b"), settings)
    assert exc.field == "module" and "mod-b" in exc.why and exc.module is None and exc.run_id == good["run_id"]
    assert refused(with_(good, module=None), settings).field == "module"
    assert refused(with_(good, module=["mod-a"]), settings).field == "module"


def test_unknown_field_and_wrong_types(good, settings):
    assert refused(with_(good, evil="x"), settings).field == "evil"
    assert refused(with_(good, models="qwen3"), settings).field == "models"
    assert refused(with_(good, key_env={"qwen3": {"A": 1}}), settings).field.startswith("key_env")


@pytest.mark.parametrize("models, why", [
    ([], "no model key"),
    (["qwen3", "qwen3"], "twice"),
    (["qwen3", "../../etc"], "unknown model key"),
    (list(MODEL_KEYS) + ["qwen3"], "more than"),
])
def test_model_keys(good, settings, models, why):
    exc = refused(with_(good, models=models), settings)
    assert exc.field == "models" and why in exc.why


@pytest.mark.parametrize("name", [
    "BASH_FUNC_python3%%", "BASH_FUNC_x", "LD_PRELOAD", "LD_LIBRARY_PATH", "ld_preload", "PYTHONPATH",
    "PYTHONSTARTUP", "PYTHONHOME", "PATH", "IFS", "PS4", "BASH_ENV", "ENV", "SHELLOPTS", "M1000_FLEET_AGENT_WORKDIR",
    "FLEET_BROKER_URL", "GLIBC_TUNABLES", "1ABC", "A-B", "A B", "A=B", "", "A" * 129, "X\x00",
])
def test_key_env_names_denied(good, settings, name):
    assert env_name_problem(name)
    exc = refused(with_(good, key_env={"qwen3": {name: "1"}}), settings)
    assert exc.field == "key_env.qwen3", exc


def test_key_env_allowed_names():
    for name in ("MUSA_VISIBLE_DEVICES", "SGLANG_USE_TL_MOE_GROUPED_GEMM", "QWEN35_EXTRA_SERVER_ARGS", "_x", "http_x"):
        assert env_name_problem(name) is None


def test_key_env_values_and_counts(good, settings):
    exc = refused(with_(good, key_env={"qwen3": {"A": "a\x00b"}}), settings)
    assert exc.field == "key_env.qwen3.A" and "NUL" in exc.why
    exc = refused(with_(good, key_env={"qwen3": {"A": "a" * 5000}}), settings)
    assert exc.field == "key_env.qwen3.A" and "longer" in exc.why
    exc = refused(with_(good, key_env={"qwen3": {f"V{i}": "1" for i in range(33)}}), settings)
    assert exc.field == "key_env.qwen3" and "more than" in exc.why
    exc = refused(with_(good, key_env={"qwen3vl": {"A": "1"}}), settings)
    assert exc.field == "key_env" and "not a requested model key" in exc.why


@pytest.mark.parametrize("field, value", [
    ("model_root", "models"), ("model_root", ""), ("model_root", "/m\x00"), ("model_root", "/m\n"),
    ("model_root", "/" + "m" * 5000),
])
def test_model_root(good, settings, field, value):
    assert refused(with_(good, **{field: value}), settings).field == field


def test_model_paths(good, settings):
    assert refused(with_(good, model_paths={"qwen3": "rel/path"}), settings).field == "model_paths.qwen3"
    assert refused(with_(good, model_paths={"evil": "/x"}), settings).field == "model_paths"


@pytest.mark.parametrize("field, value", [
    ("sha256", "abc"), ("sha256", "g" * 64), ("release", "x" * 200), ("release", "a\nb"),
    ("max_attempts", 0), ("max_attempts", 1000),
])
def test_small_fields(good, settings, field, value):
    assert refused(with_(good, **{field: value}), settings).field == field


def test_tarball_confined_to_release_roots(good, settings, tmp_path):
    outside = tmp_path / "elsewhere" / "rel.tar.gz"
    outside.parent.mkdir()
    outside.write_bytes(b"x")
    exc = refused(with_(good, tarball=str(outside)), settings)
    assert exc.field == "tarball" and "outside the release roots" in exc.why
    assert refused(with_(good, tarball="rel.tar.gz"), settings).field == "tarball"
    assert refused(with_(good, tarball="/etc/shadow"), settings).field == "tarball"
    # '..' out of a root
    root = settings.data_dir / "releases"
    exc = refused(with_(good, tarball=f"{root}/../../elsewhere/rel.tar.gz"), settings)
    assert exc.field == "tarball"
    # a symlink inside a root pointing out of it: resolved first, refused
    link = root / SHA / "link.tar.gz"
    link.symlink_to(outside)
    exc = refused(with_(good, tarball=str(link)), settings)
    assert exc.field == "tarball" and str(outside) in exc.why
    # a symlinked root itself is fine, and the request names the resolved path
    incoming = settings.workdir / "incoming"
    real = tmp_path / "real-incoming"
    (real / SHA).mkdir(parents=True)
    (real / SHA / "rel.tar.gz").write_bytes(b"x")
    settings.workdir.mkdir(parents=True, exist_ok=True)
    incoming.symlink_to(real)
    req = validate_request(with_(good, tarball=str(incoming / SHA / "rel.tar.gz")), settings)
    assert req.tarball == str(real / SHA / "rel.tar.gz")


def test_release_roots_default_and_configured(settings, tmp_path):
    roots = settings.allowed_release_roots()
    assert roots == [Path(os.path.realpath(p)) for p in (settings.workdir / "incoming", settings.workdir / "releases",
                                                          settings.data_dir / "releases")]
    s2 = settings.model_copy(update={"release_roots": [tmp_path / "nfs"]})
    assert s2.allowed_release_roots()[-1] == tmp_path / "nfs" and len(s2.allowed_release_roots()) == 3


def test_release_roots_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("FLEET_RELEASE_ROOTS", json.dumps([str(tmp_path / "a"), str(tmp_path / "b")]))
    s = AgentSettings(module="m", workdir=tmp_path / "w")
    assert s.release_roots == [tmp_path / "a", tmp_path / "b"]


def test_stage_local_release(tmp_path):
    src = tmp_path / "SGLang-MUSA-M1000-M1000_1.4.1_sglang.tar.gz"
    src.write_bytes(b"release")
    dest = stage_local_release(src, SHA, tmp_path / "fleet")
    assert dest == (tmp_path / "fleet").resolve() / "releases" / SHA / src.name and dest.read_bytes() == b"release"
    assert stage_local_release(src, SHA, tmp_path / "fleet") == dest
    assert [p.name for p in dest.parent.iterdir()] == [src.name]


# --------------------------------------------------------------------------- the worker
def _app(settings: AgentSettings):
    from contract.celery_app import make_app

    return make_app(settings, module=settings.module)


def test_worker_refusal_publishes_failed_and_runs_nothing(good, settings, caplog):
    from agent.task import execute_run

    app = _app(settings)
    payload = with_(good, key_env={"qwen3": {"LD_PRELOAD": "/tmp/evil.so"}})
    with caplog.at_level("WARNING", logger="fleet.agent"):
        out = execute_run(app, settings, payload)
    assert out["state"] == "failed"
    p = KV(app).progress(good["run_id"], ["mod-a"])["mod-a"]
    assert p is not None and p.state == RunState.FAILED and p.step == "dispatch"
    assert p.error is not None and p.error.message == (
        "refused request: key_env.qwen3: variable LD_PRELOAD may not be set by a request")
    assert "refused request: key_env.qwen3" in caplog.text
    assert not (settings.workdir / "runs").exists() and not (settings.workdir / "releases").exists()


def test_worker_refusal_without_run_id_only_logs(good, settings, caplog):
    from agent.task import execute_run

    app = _app(settings)
    with caplog.at_level("WARNING", logger="fleet.agent"):
        out = execute_run(app, settings, with_(good, run_id="../../etc", module="mod-b"))
    assert out == {"state": "failed", "error": f"refused request: run_id: {'../../etc'!r} does not match "
                                               "1-128 letters, digits, '.', '_' or '-' (not starting with those)"}
    assert "refused request: run_id" in caplog.text
    with caplog.at_level("WARNING", logger="fleet.agent"):
        out = execute_run(app, settings, with_(good, module="mod-b"))
    assert out["error"].startswith("refused request: module:")
    assert KV(app).progress(good["run_id"], ["mod-a", "mod-b"]) == {"mod-a": None, "mod-b": None}
    assert not (settings.workdir / "runs").exists()


# --------------------------------------------------------------------------- the transport
@pytest.mark.parametrize("raw, why", [
    (1, "JSON object"), ([], "JSON object"), ({}, "no properties"), ({"properties": {}}, "no delivery tag"),
    ({"properties": {"delivery_tag": "t", "delivery_info": []}}, "delivery_info"),
    ({"properties": {"delivery_tag": "t"}, "headers": "x"}, "headers"),
    ({"properties": {"delivery_tag": "t"}, "body": 3}, "body is not a string"),
    ({"properties": {"delivery_tag": "t", "body_encoding": "base64"}, "body": "!!"}, "not base64"),
    ({"properties": {"delivery_tag": "t", "body_encoding": "rot13"}, "body": "x"}, "unknown body encoding"),
])
def test_malformed_envelopes(raw, why):
    from contract.safe_transport import envelope_problem

    assert why in (envelope_problem(raw) or "")


def test_good_envelope():
    import base64

    from contract.safe_transport import envelope_problem

    good = {"body": base64.b64encode(b"[]").decode(), "content-type": "application/json", "content-encoding": "utf-8",
            "headers": {}, "properties": {"delivery_tag": "t", "delivery_info": {}, "body_encoding": "base64"}}
    assert envelope_problem(good) is None


def test_redis_apps_use_the_hardened_transport(tmp_path):
    from contract.celery_app import make_app

    app = make_app(AgentSettings(module="m", broker_url="redis://127.0.0.1:1/0", workdir=tmp_path))
    assert app.conf.broker_transport == "contract.safe_transport:Transport"
    from contract.safe_transport import Transport

    with app.connection_for_write() as conn:
        assert conn.transport_cls == "contract.safe_transport:Transport" and isinstance(conn.transport, Transport)


def test_a_release_outside_the_roots_says_what_to_set(good, settings, tmp_path):
    """An agent whose data_dir is not the controller's refuses every local-transport run: the line names the
    path refused and the setting (and variable) that would allow it."""
    import json

    other = local_release_path(tmp_path / "controller-data", SHA, "rel.tar.gz")  # the controller's data_dir
    other.parent.mkdir(parents=True)
    other.write_bytes(b"x")
    exc = refused(with_(good, tarball=str(other)), settings)
    roots = ", ".join(str(r) for r in settings.allowed_release_roots())
    allow = str(tmp_path / "controller-data" / "releases")
    env = json.dumps([allow])
    assert exc.why == (f"{str(other)!r} is outside the release roots ({roots}): to allow it, add {allow!r} to "
                       f"release_roots in the agent's [agent] section (or FLEET_RELEASE_ROOTS='{env}'), "
                       "or give the agent the controller's data_dir")
    loose = tmp_path / "nfs" / "rel.tar.gz"  # not a staged release: its own folder
    loose.parent.mkdir()
    loose.write_bytes(b"x")
    assert f"add {str(loose.parent)!r} to release_roots" in refused(with_(good, tarball=str(loose)), settings).why
