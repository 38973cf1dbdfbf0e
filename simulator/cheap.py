"""Cheap simulated modules for scale runs: many modules on a small machine.

A demo module runs every profile of each key at time scale 50 (a qwen3 sweep: ~6.5 s of wall
time and ~0.55 s of CPU for its server and benchmark). A cheap module runs the same release,
the same scripts and the same agent pipeline (fetch, unpack, configure, generate, environment,
precompile, server, benchmark, parse, publish), but

- at time scale 1000 (precompile, model load and every token 1000x faster than module time),
- one profile per table of each key (``BENCH_PROFILE_SET=scale``: ``128:128`` for a sweep key,
  ``gsm8k:6`` for an MTP key, plus ``vision:250:500`` for qwen3vl),
- one request per TTFT figure (``BENCH_REPEATS=1``) and 8 output tokens (``BENCH_OUTPUT_LEN``).

Its figures are therefore not the seed's (timer jitter x 1000); what it keeps is every
process, every broker message, every row and every state change a real module produces,
which is what a scale run measures. These are environment variables of the module (read
by the release's scripts), so the same built release serves demo and cheap modules.
"""

from __future__ import annotations

CHEAP_TIME_SCALE = 1000.0
CHEAP_TELEMETRY_PERIOD = 1.0


def cheap_module_env(time_scale: float = CHEAP_TIME_SCALE,
                     telemetry_period: float = CHEAP_TELEMETRY_PERIOD) -> dict[str, str]:
    """Environment variables that make a simulated module cheap (see the module's docstring)."""
    return {
        "M1000_SIM_TIME_SCALE": f"{time_scale:g}",
        "BENCH_PROFILE_SET": "scale",
        "BENCH_REPEATS": "1",
        "BENCH_OUTPUT_LEN": "8",
        "M1000_SIM_PRIORITY": "off",
        "FLEET_TELEMETRY_PERIOD": f"{telemetry_period:g}",
    }
