"""The values ``contract/removed_settings.py`` tells a user ("now a constant, 300 s") are the constants the
programs use: contract/ may not import agent/ or controller/, so its messages spell the values, and this test
ties each one to its constant (a changed constant fails here, not in a user's stale warning)."""

from __future__ import annotations

import re

import pytest

from agent import config as agent_config
from agent.outbox import FINAL_STATE_WAIT
from agent.telemetry.energy import MIN_SAMPLES
from agent.telemetry.sampler import TelemetryConfig
from contract.removed_settings import REMOVED
from contract.settings import RESULT_EXPIRES
from controller.cli.live import PROGRESS_INTERVAL
from controller.fleet import collect, power, states
from controller.serve import guard
from controller.serve.daemon import FRAME_CACHE_BYTES
from controller.service import releases

CONSTANTS: dict[tuple[str, str], float] = {
    ("fleet", "start_timeout"): collect.START_TIMEOUT,
    ("fleet", "collect_timeout"): collect.COLLECT_TIMEOUT,
    ("fleet", "result_expires"): RESULT_EXPIRES,
    ("agent", "stop_grace"): agent_config.STOP_GRACE,
    ("agent", "keep_releases"): agent_config.KEEP_RELEASES,
    ("agent", "unpack_max_members"): agent_config.UNPACK_MAX_MEMBERS,
    ("agent", "unpack_max_name_bytes"): agent_config.UNPACK_MAX_NAME_BYTES,
    ("agent", "telemetry_min_samples"): MIN_SAMPLES,
    ("agent", "telemetry_idle_window"): TelemetryConfig.model_fields["idle_window_s"].default,
    ("agent", "final_state_wait"): FINAL_STATE_WAIT,
    ("agent", "probe_requests"): agent_config.PROBE_REQUESTS,
    ("agent", "probe_tolerance"): agent_config.PROBE_TOLERANCE,
    ("agent", "probe_sweep_budget"): agent_config.PROBE_SWEEP_BUDGET,
    ("controller", "failures_for_bad"): states.FAILURES_FOR_BAD,
    ("controller", "failures_cooldown"): states.FAILURES_COOLDOWN,
    ("controller", "clock_skew_warn"): states.CLOCK_SKEW_WARN,
    ("controller", "progress_interval"): PROGRESS_INTERVAL,
    ("controller", "api_max_body_bytes"): guard.MAX_BODY_BYTES,
    ("controller", "api_keepalive_timeout"): guard.KEEPALIVE_TIMEOUT,
    ("controller", "frame_cache_mib"): FRAME_CACHE_BYTES,
    ("controller", "release_download_max_bytes"): releases.RELEASE_DOWNLOAD_MAX_BYTES,
    ("controller", "release_download_timeout"): releases.RELEASE_DOWNLOAD_TIMEOUT,
    ("controller", "keep_releases"): releases.KEEP_RELEASES,
    ("controller", "power_cycles_per_hour"): power.POWER_CYCLES_PER_HOUR,
}
SAID = re.compile(r"now a constant, ([\d.]+)(?: (s|bytes|MiB|GiB|days))?")
UNITS = {None: 1, "s": 1, "bytes": 1, "MiB": 2**20, "GiB": 2**30, "days": 86400}


def _said() -> dict[tuple[str, str], float]:
    out = {}
    for section, names in REMOVED.items():
        for name, line in names.items():
            m = SAID.fullmatch(line)
            if m:
                out[(section, name)] = float(m.group(1)) * UNITS[m.group(2)]
    return out


def test_every_value_said_has_its_constant_here() -> None:
    assert set(_said()) == set(CONSTANTS)


@pytest.mark.parametrize("key", sorted(CONSTANTS), ids=lambda k: f"{k[0]}.{k[1]}")
def test_the_value_said_is_the_constant_used(key: tuple[str, str]) -> None:
    assert _said()[key] == pytest.approx(CONSTANTS[key]), (
        f"contract/removed_settings.py says [{key[0]}] {key[1]} is {REMOVED[key[0]][key[1]]!r}; the constant is "
        f"{CONSTANTS[key]!r}")
