"""Cheap simulated modules for scale runs: many modules on a small machine.

A demo module runs every profile of each key at time scale 50 (a qwen3 sweep: ~6.5 s of wall
time and ~0.55 s of CPU for its server and benchmark). A cheap module runs the same release,
the same scripts and the same agent pipeline (fetch, unpack, configure, generate, environment,
precompile, server, benchmark, probe, parse, publish), but its run is made of **waiting**, not CPU:

- one profile per table of each key (``BENCH_PROFILE_SET=scale``: ``128:128`` for a sweep key,
  ``gsm8k:6`` for an MTP key, plus ``vision:250:500`` for qwen3vl), one request per TTFT figure
  (``BENCH_REPEATS=1``) and 8 output tokens (``BENCH_OUTPUT_LEN``): a few requests, not hundreds;
- time scale 0.25 (``M1000_SIM_TIME_SCALE``): every simulated wait (precompile, model load, each
  token) lasts 4x its module time, so a qwen3 run is ~190 s of sleeping processes around ~0.5-0.65 s of CPU
  (``bench/scale.py``: the worker, its pipeline's steps, the release's interpreters; ~3 ms per second
  of run); at 1000 (the first cheap
  modules) the same CPU was the whole 1-2 s run, and N runs on 2 cores were N x that CPU, serialized;
- device telemetry every 10 s instead of every second (``FLEET_TELEMETRY_PERIOD``, an agent setting:
  each sample is a process; a real module pays it on its own CPU).

Its figures are therefore not the seed's; what it keeps is every process, every broker message,
every row and every state change a real module produces, which is what a scale run measures.
These are environment variables of the module (read by the release's scripts and by the agent),
so the same built release serves demo and cheap modules. ``time_scale=1000`` gives the old,
CPU-bound cheap module (a ~1 s run: enough for a smoke test of rows and controller CPU).
"""

from __future__ import annotations

CHEAP_TIME_SCALE = 0.25
CHEAP_TELEMETRY_PERIOD = 10.0


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
