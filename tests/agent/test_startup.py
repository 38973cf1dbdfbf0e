"""The release's start-up costs on a key's rows (agent.startup, pure; fast tier)."""

from __future__ import annotations

import pytest

from agent.startup import with_startup
from contract.records import PrecompileSource, ResultRow


def _rows() -> list[ResultRow]:
    release = ResultRow(table="sweep", profile="128:128", model="m", model_key="qwen35", decode_tps=50.0)
    probe = release.model_copy(update={"source": "probe"})
    return [release, probe]


def test_a_compiled_precompile_is_a_compile_on_every_release_row() -> None:
    rel, probe = with_startup(_rows(), server_ready_s=212.00049, warmup_s=3.2504, precompile_source="compiled",
                              precompile_s=71.4996)
    assert (rel.server_ready_s, rel.warmup_s, rel.precompile_s, rel.precompile_fetch_s, rel.precompile_source) == (
        212.0, 3.25, 71.5, None, "compiled")
    assert probe == _rows()[1]  # the probe's rows carry none: they are not the release's figures


@pytest.mark.parametrize(("source", "compiled", "fetched"), [("fetched", None, 4.5), ("cached", None, None),
                                                              (None, None, None)])
def test_a_fetched_or_cached_precompile_is_never_a_compile(source: PrecompileSource | None, compiled: float | None,
                                                           fetched: float | None) -> None:
    rel, _ = with_startup(_rows(), server_ready_s=1.5, warmup_s=None, precompile_source=source,
                          precompile_s=4.5)
    assert (rel.precompile_s, rel.precompile_fetch_s, rel.precompile_source, rel.warmup_s) == (
        compiled, fetched, source, None)


def test_the_warm_up_request_is_on_and_a_config_may_turn_it_off(tmp_path) -> None:
    """Always on from the agent's settings (a setting until issue 50); a test or bench's AgentConfig may turn it off."""
    from agent.config import AgentConfig
    from agent.settings import AgentSettings

    on = AgentSettings(module="m1", workdir=tmp_path / "work", data_dir=tmp_path / "fleet")
    off = AgentConfig.from_settings(on, warmup_request=False)
    assert (AgentConfig.from_settings(on).warmup_request, off.warmup_request) == (True, False)
