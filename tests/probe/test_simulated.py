"""The probe in the pipeline, against the simulator's release (real server processes, real HTTP).

The simulated server paces tokens in wall time, ``time_scale`` times faster than a module;
the probe multiplies its wall times back, so its figures are the seed's (within 3 %).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import simulator
from agent.pipeline import AgentConfig, run_pipeline
from agent.records import RunRequest
from agent.store import RunStore
from agent.tables import parse_seed
from controller.demo import free_port

pytestmark = pytest.mark.slow
TOLERANCE = 0.03


def base_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("M1000_SIM_", "FLEET_"))}
    real_bin = str(Path(os.path.realpath(sys.executable)).parent)  # the release's scripts run python3 from PATH
    env["PATH"] = os.pathsep.join([real_bin, env.get("PATH", "")])
    env.update(extra or {})
    return env


def validate(base: Path, built: simulator.BuiltRelease, keys: tuple[str, ...], run_id: str, *,
             env: dict[str, str] | None = None, key_env: dict[str, dict[str, str]] | None = None, **cfg: object):
    models = base / "models"
    if not models.exists():
        simulator.make_models(models)
    config = AgentConfig(module="sim-1", workdir=base / "work", server_port=free_port(), base_env=base_env(env),
                         key_env=key_env or {}, ready_timeout=60, benchmark_timeout=300, **cfg)  # type: ignore[arg-type]
    req = RunRequest(run_id=run_id, module="sim-1", tarball=str(built.path), sha256=built.sha256,
                     release=built.version, models=keys, model_root=str(models))
    return run_pipeline(req, config), config


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("probe-sim")
    return base, simulator.build_release(base / "dist", noise=0.0, time_scale=50.0)


def test_probe_rows_match_the_seed_and_add_little_to_a_key(sim, seed_text):
    base, built = sim
    result, cfg = validate(base, built, ("qwen3",), "full")
    assert result.ok, result.progress.error
    release = [r for r in result.rows if r.source == "release"]
    probes = [r for r in result.rows if r.source == "probe"]
    assert len(release) == 11 and result.progress.outcomes[0].rows == 11
    (p,) = probes
    assert p.profile == "128:128" and p.extra["probe_ok"] == "2" and p.extra["probe_time_scale"] == "50"
    assert not p.flags and not any(r.flags for r in release)
    seed = {r.profile: r for r in parse_seed(seed_text)["qwen3"]}["128:128"]
    for m in ("ttft_ms", "tpot_ms", "prefill_tps", "decode_tps"):
        assert getattr(p, m) == pytest.approx(getattr(seed, m), rel=TOLERANCE), m
    # the probe's share of the key's wall time (server start to stop)
    events = RunStore(cfg.workdir).events("full")
    probe_s = next(e["duration_s"] for e in events if e["step"] == "probe" and e["status"] == "ok")
    key_s = result.progress.outcomes[0].duration_s
    print(f"\nprobe {probe_s:.2f} s of the key's {key_s:.2f} s ({probe_s / key_s:.1%})")
    assert probe_s <= 0.10 * key_s
    log = next(RunStore(cfg.workdir).logs_dir("full").glob("*-benchmark-qwen3.log")).read_text()
    assert "[agent] probe http://127.0.0.1:" in log and "128:128: TTFT" in log


def test_a_module_can_turn_the_probe_off_or_choose_profiles(sim, seed_text):
    base, built = sim
    off, _ = validate(base, built, ("qwen3",), "off", key_env={"qwen3": {"BENCH_PROFILES": "128:128,250:500"}},
                      probe=False)
    assert off.ok and [r.source for r in off.rows] == ["release", "release"]
    more, _ = validate(base, built, ("qwen3",), "more", key_env={"qwen3": {"BENCH_PROFILES": "128:128,250:500"}},
                       probe_profiles=("250:500", "500:500"), probe_requests=3)
    probes = {r.profile: r for r in more.rows if r.source == "probe"}
    assert list(probes) == ["250:500"]  # only profiles the release measured too
    seed = {r.profile: r for r in parse_seed(seed_text)["qwen3"]}["250:500"]
    assert probes["250:500"].prefix_tokens == 250 and probes["250:500"].extra["probe_ok"] == "3"
    assert probes["250:500"].ttft_ms == pytest.approx(seed.ttft_ms, rel=TOLERANCE)
