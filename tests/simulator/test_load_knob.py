"""The simulator's ``load`` speed metric: a release built to start its server slower (fast tier)."""

from __future__ import annotations

import pytest

from simulator import regress_spec
from simulator.runtime.core import SpecError, parse_speed


def test_a_server_40_percent_slower_to_start_is_a_load_factor() -> None:
    assert regress_spec("qwen35:server_ready_s:0.4") == "qwen35:load=0.714286"
    speed = parse_speed("qwen35:load=0.714286")
    assert speed.factor("qwen35", "load") == 0.714286 and speed.factor("qwen3", "load") == 1.0
    assert speed.factor("qwen35", "decode") == 1.0  # the load only


def test_all_and_a_bare_factor_leave_the_load_alone() -> None:
    assert parse_speed("0.5").factor("qwen3", "load") == 1.0
    assert parse_speed("all=0.5").factor("qwen3", "load") == 1.0
    assert parse_speed("load=0.5").factor("qwen3", "load") == 0.5
    with pytest.raises(SpecError, match="unknown metric 'loading'"):
        parse_speed("loading=0.5")
