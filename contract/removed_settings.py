"""Settings that issue 50 turned into constants or merged (ADR 0058), and the one line that tells so.

A config file or a ``FLEET_*`` variable that still names one is warned about, once per process, in one line
on stderr, and the program goes on: during a rolling upgrade one rendered config serves agents of two
versions (ADR 0051), and none of these values changes what a run measures.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping

# section -> setting -> what replaced it (said after "is gone (issue 50): ")
REMOVED: dict[str, dict[str, str]] = {
    "fleet": {
        "run_soft_time_limit": "derived from run_time_limit, a fifth of it earlier, 600 s at most",
        "start_timeout": "now a constant, 300 s",
        "collect_timeout": "now a constant, 600 s",
        "result_expires": "now a constant, 7 days",
    },
    "agent": {
        "stop_grace": "now a constant, 15 s",
        "keep_releases": "now a constant, 3",
        "unpack_max_members": "now a constant, 100000",
        "unpack_max_name_bytes": "now a constant, 1024 bytes",
        "telemetry_tool": "the tool is found on PATH: mthreads-gmi, else nvidia-smi",
        "telemetry_min_samples": "now a constant, 20",
        "telemetry_fast": "now always on",
        "telemetry_idle_window": "now a constant, 1 s",
        "final_state_wait": "now a constant, 2 s",
        "final_resend_interval": "derived: every sixth heartbeat (30 s at heartbeat_interval 5)",
        "probe_requests": "now a constant, 5",
        "probe_tolerance": "now a constant, 0.02",
        "probe_repeat": "a run sets it per key with the PROBE_REPEAT variable (else 1 round)",
        "probe_sweep_budget": "now a constant, 300 s",
        "warmup_request": "now always on",
        "kernel_cache_trust_first": 'merged into kernel_cache (kernel_cache = "trust-first")',
    },
    "controller": {
        "failures_for_bad": "now a constant, 3",
        "failures_cooldown": "now a constant, 900 s",
        "clock_skew_warn": "now a constant, 30 s",
        "progress_interval": "now a constant, 60 s",
        "api_max_body_bytes": "now a constant, 65536",
        "api_header_timeout": "merged into api_timeout",
        "api_body_timeout": "merged into api_timeout",
        "api_keepalive_timeout": "now a constant, 5 s",
        "frame_cache_mib": "now a constant, 1024 MiB",
        "release_download_max_bytes": "now a constant, 8 GiB",
        "release_download_timeout": "now a constant, 1800 s",
        "keep_releases": "now a constant, 5",
        "power_cycles_per_run": "merged into power_cycle_after (0: never; else once a run)",
        "power_cycles_per_hour": "now a constant, 3",
    },
}

# the variable of a removed setting, where it was not FLEET_<NAME> (both programs had a keep_releases)
_ENV_NAMES = {("controller", "keep_releases"): "FLEET_CONTROLLER_KEEP_RELEASES"}
_said: set[str] = set()


def _say(line: str) -> None:
    if line not in _said:
        _said.add(line)
        print(line, file=sys.stderr, flush=True)


def gone(section: str, name: str, written: str | None = None) -> str:
    """The one line for ``name`` of ``[section]`` (``written``: the section it was found in, if another)."""
    return f"[{written or section}] {name} is gone (issue 50): {REMOVED[section][name]}; see CHANGELOG"


def drop_removed(where: str, section: str, table: Mapping[str, object], sections: Iterable[str]) -> dict[str, object]:
    """``table`` (``[section]`` of the file ``where``) without the removed settings of ``sections`` it names,
    each said in one line."""
    kept = dict(table)
    for name in list(kept):
        owner = next((s for s in sections if name in REMOVED.get(s, {})), None)
        if owner is not None:
            del kept[name]
            _say(f"{where}: {gone(owner, name, section)}")
    return kept


def env_var(section: str, name: str, prefix: str = "FLEET_") -> str:
    """The variable that set removed setting ``name`` of ``[section]``."""
    return _ENV_NAMES.get((section, name)) or f"{prefix}{name}".upper()


def warn_removed_env(environ: Mapping[str, str], sections: Iterable[str]) -> list[str]:
    """Say, in one line each, the removed settings of ``sections`` that a variable still names; the variables."""
    present = {k.upper() for k in environ}
    named = []
    for section in sections:
        for name in REMOVED.get(section, {}):
            var = env_var(section, name)
            if var in present:
                named.append(var)
                _say(f"{var}: {gone(section, name)}")
    return named
