"""The pipeline against a hand-made release (real processes, real HTTP, real signals)."""

from __future__ import annotations

import json

import pytest

from agent.pipeline import run_pipeline
from agent.records import RunState
from agent.tables import parse_seed

pytestmark = pytest.mark.usefixtures("no_leftovers")


def test_two_keys_pass_with_seed_figures(make_config, make_request, record_dir, seed_text):
    cfg = make_config()
    seen = []
    result = run_pipeline(make_request(("qwen3", "qwen35_mtp")), cfg, on_progress=seen.append)
    assert result.ok, result.progress.error
    assert result.progress.state == RunState.DONE
    seed = parse_seed(seed_text)
    assert len(result.rows) == len(seed["qwen3"]) + len(seed["qwen35_mtp"])
    want = {(r.model_key, r.profile): r for k in ("qwen3", "qwen35_mtp") for r in seed[k]}
    for r in result.rows:
        assert (r.run_id, r.module, r.release) == ("r1", "m-test", "fake-1.4.1")
        assert r.ttft_ms == want[(r.model_key, r.profile)].ttft_ms
    assert seen[-1].state == RunState.DONE and seen[-1].progress == 1.0
    assert seen[0].state == RunState.PENDING
    # the MTP key's variables reached its server, MODEL_KEY and setup_env's variables the benchmark
    servers = [json.loads(p.read_text()) for p in record_dir.glob("server-*.json")]
    mtp = next(s["env"] for s in servers if s["env"].get("SGLANG_USE_TL_MOE_GROUPED_GEMM") == "0")
    assert "--speculative-num-draft-tokens 4" in mtp["QWEN35_EXTRA_SERVER_ARGS"]
    bench = json.loads((record_dir / "bench-qwen35_mtp.json").read_text())
    assert bench["MODEL_KEY"] == "qwen35_mtp"
    assert bench["TILELANG_EXTRA_FLAGS"] == "--opt 3 --with spaces"
    assert bench["SERVER_PORT"] == str(cfg.server_port)
    assert bench["TILELANG_CACHE_DIR"].endswith("/cache/tilelang/" + make_request().sha256[:16])
    assert "SGLANG_USE_TL_MOE_GROUPED_GEMM" not in json.loads((record_dir / "bench-qwen3.json").read_text())
