"""Simulated M1000 module and SGLang-MUSA release (stand-in for hardware in tests and the demo).

Public API::

    build_release(out_dir, *, version="1.4.1", noise=0.0, speed="1.0", time_scale=50.0, seed=0,
                  faults="", date="20260803") -> BuiltRelease
    make_models(root, keys=None) -> dict[str, Path]
    regress_spec("qwen3:decode:0.08") -> "qwen3:decode=0.92" (also "qwen3:decode_tps:0.08": the report's name)
    slow_factor(1.12) -> 1.12   (the demo's --slow, checked)
    parse_speed(spec) / parse_faults(spec) / parse_device(spec)   (validate knob specs; raise SpecError)
    DEVICE_TOOL_DIR   the simulated module's device tool (``mthreads-gmi``): put it first on the agent's PATH
    ENV_DRIVER        the driver version that tool reports (one module's can differ from the others')
"""

from __future__ import annotations

from pathlib import Path

from simulator.build import BuildError, BuiltRelease, build_release, make_models, tarball_name
from simulator.runtime.core import (
    DEVICE_CONDITIONS,
    ENV_DEVICE,
    ENV_DEVICE_DIR,
    ENV_DRIVER,
    ENV_FAULT,
    ENV_MODULE_SEED,
    ENV_NOISE,
    ENV_SEED,
    ENV_SPEED,
    ENV_TIME_SCALE,
    FAULT_NAMES,
    SPEED_METRICS,
    Fault,
    SimError,
    SpecError,
    Speed,
    parse_device,
    parse_faults,
    parse_speed,
)
from simulator.specs import REPORT_METRICS, regress_spec, slow_factor

DEVICE_TOOL_DIR = Path(__file__).resolve().parent / "device"

__all__ = [
    "DEVICE_CONDITIONS", "DEVICE_TOOL_DIR", "ENV_DEVICE", "ENV_DEVICE_DIR", "ENV_DRIVER",
    "ENV_FAULT", "ENV_MODULE_SEED", "ENV_NOISE", "ENV_SEED", "ENV_SPEED", "ENV_TIME_SCALE", "FAULT_NAMES",
    "REPORT_METRICS", "SPEED_METRICS",
    "BuildError", "BuiltRelease", "Fault", "SimError", "Speed", "SpecError",
    "build_release", "make_models", "parse_device", "parse_faults", "parse_speed", "regress_spec", "slow_factor",
    "tarball_name",
]
