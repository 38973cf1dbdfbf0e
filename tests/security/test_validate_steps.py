"""Fast tier: the steps of the agent's request validation, each called on its own (pure: no settings, no disk)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.validate import (
    MAX_PAYLOAD_BYTES,
    REQUEST_CHECKS,
    Refusal,
    check_request,
    identity_refusal,
    key_env_refusal,
    model_paths_refusal,
    models_refusal,
    parse_request,
    path_refusal,
    readable_ids,
    scalar_refusal,
    size_refusal,
    tarball_path_refusal,
    tarball_refusal,
    version_refusal,
)
from contract.records import SCHEMA_VERSION, RunRequest

SHA = "ab" * 32
GOOD = {"schema_version": SCHEMA_VERSION, "run_id": "20250101-000000-ab12", "module": "mod-a",
        "tarball": f"/data/releases/{SHA}/rel.tar.gz", "sha256": SHA, "release": "1.4.1",
        "models": ["qwen3", "qwen35_mtp"], "model_root": "/models", "model_paths": {"qwen3": "/data/q3"},
        "key_env": {"qwen3": {"MUSA_VISIBLE_DEVICES": "0,1"}}, "max_attempts": 2}


def req(**kw: object) -> RunRequest:
    """A parsed request with ``kw`` changed past the schema (``model_copy`` does not validate): what each step sees."""
    return RunRequest.model_validate(GOOD).model_copy(update=kw)


def refused(found: RunRequest | Refusal | None) -> Refusal:
    """What a step gives for input the test expects it to refuse."""
    assert isinstance(found, Refusal), found
    return found


def test_every_step_passes_a_good_request():
    parsed = check_request(GOOD, "mod-a")
    assert isinstance(parsed, RunRequest) and parsed.tarball == GOOD["tarball"]
    assert [check(parsed) for check in REQUEST_CHECKS] == [None] * len(REQUEST_CHECKS)
    assert size_refusal(GOOD) is None and version_refusal(GOOD) is None and identity_refusal(GOOD, "mod-a") is None


def test_readable_ids_only_where_valid():
    assert readable_ids(GOOD, "mod-a") == ("20250101-000000-ab12", "mod-a")
    assert readable_ids({**GOOD, "module": "mod-b"}, "mod-a") == ("20250101-000000-ab12", None)
    assert readable_ids({**GOOD, "run_id": "../x"}, "mod-a") == (None, "mod-a")
    assert readable_ids(["a"], "mod-a") == (None, None)


def test_size_and_plain_json():
    assert size_refusal({"x": object()}) == Refusal("payload", "not plain JSON data")
    found = size_refusal({"x": "a" * MAX_PAYLOAD_BYTES})
    assert found is not None and found.field == "payload" and "more than" in found.why


@pytest.mark.parametrize("version, todo", [(SCHEMA_VERSION + 1, "upgrade this agent"),
                                           (SCHEMA_VERSION - 2, "upgrade the controller"),
                                           ("1", "upgrade the controller")])
def test_version(version, todo):
    found = version_refusal({"schema_version": version})
    assert found is not None and found.field == "schema_version" and todo in found.why
    assert version_refusal({}) is None  # no version: this agent's


def test_identity_names_run_id_before_module():
    assert identity_refusal({"module": "mod-b"}, "mod-a") == Refusal("run_id", "missing")
    assert identity_refusal({**GOOD, "module": None}, "mod-a") == Refusal("module", "missing")
    assert identity_refusal({**GOOD, "module": 3}, "mod-a") == Refusal("module", "3 is not a string")
    assert identity_refusal(GOOD, "mod-b") == Refusal("module", "run for module 'mod-a' reached 'mod-b'")


def test_parse_names_the_schemas_first_field():
    found = parse_request({**GOOD, "max_attempts": "many"})
    assert isinstance(found, Refusal) and found.field == "max_attempts"


def test_scalars():
    assert scalar_refusal(req(sha256="g" * 64)) == Refusal("sha256", "not 64 hex digits")
    assert refused(scalar_refusal(req(release="1\n2"))).field == "release"
    assert refused(scalar_refusal(req(max_attempts=0))).field == "max_attempts"


def test_models():
    assert models_refusal(req(models=())) == Refusal("models", "no model key")
    assert models_refusal(req(models=("nope",))) == Refusal("models", "unknown model key 'nope'")
    assert models_refusal(req(models=("qwen3", "qwen3"))) == Refusal("models", "a model key is given twice")


def test_paths():
    assert path_refusal("f", "") == Refusal("f", "empty path")
    assert path_refusal("f", "rel/x") == Refusal("f", "'rel/x' is not an absolute path")
    assert refused(path_refusal("f", "/a\x00b")).why.startswith("control character")
    assert refused(model_paths_refusal(req(model_root="x"))).field == "model_root"
    assert refused(model_paths_refusal(req(model_paths={"qwen3": "x"}))).field == "model_paths.qwen3"
    assert refused(tarball_path_refusal(req(tarball="rel.tar.gz"))).field == "tarball"


def test_key_env():
    assert refused(key_env_refusal(req(key_env={"gemma": {}}))).field == "key_env"
    assert refused(key_env_refusal(req(key_env={"qwen3": {"LD_PRELOAD": "x"}}))).field == "key_env.qwen3"
    assert key_env_refusal(req(key_env={"qwen3": {"A": "\x00"}})) == Refusal("key_env.qwen3.A", "NUL in value")


def test_check_request_stops_at_the_first_refusal_in_order():
    both = {**GOOD, "sha256": "x", "models": []}  # scalars are checked before model keys
    assert check_request(both, "mod-a") == Refusal("sha256", "not 64 hex digits")
    assert refused(check_request({**GOOD, "run_id": None, "schema_version": 99}, "mod-a")).field == "schema_version"
    assert check_request(None, "mod-a") == Refusal("payload", "a JSON object was expected, got NoneType")


def test_tarball_within_roots_and_what_to_allow():
    parsed = req()
    inside = Path(parsed.tarball)
    assert tarball_refusal(parsed, inside, [Path("/data/releases")]) is None
    found = tarball_refusal(parsed, inside, [Path("/srv")])
    assert found is not None and found.field == "tarball"
    assert "add '/data/releases' to release_roots" in found.why and "resolves to" not in found.why
    moved = tarball_refusal(parsed, Path("/elsewhere/rel.tar.gz"), [Path("/srv")])
    assert moved is not None and "(resolves to /elsewhere/rel.tar.gz)" in moved.why and "add '/elsewhere'" in moved.why
