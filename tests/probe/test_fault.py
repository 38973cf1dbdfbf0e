"""The simulator's fault ``bench-skew`` (pure parts; the slow tests run it)."""

from __future__ import annotations

import pytest

from simulator.runtime import core


def test_bench_skew_is_a_fault_with_a_default_factor_and_an_override():
    faults = core.parse_faults("bench-skew:qwen3,no-table")
    assert core.faults_for(faults, "qwen3") == {"bench-skew", "no-table"}
    assert core.bench_skew(core.faults_for(faults, "qwen3"), {}) == core.BENCH_SKEW == 0.8
    assert core.bench_skew(core.faults_for(faults, "qwen35"), {core.ENV_BENCH_SKEW: "0.5"}) == 1.0
    assert core.bench_skew(frozenset({"bench-skew"}), {core.ENV_BENCH_SKEW: "1.3"}) == 1.3
    with pytest.raises(core.SpecError, match="M1000_SIM_BENCH_SKEW"):
        core.bench_skew(frozenset({"bench-skew"}), {core.ENV_BENCH_SKEW: "-1"})
