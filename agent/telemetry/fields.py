"""What the sampler asks the device tool for: one catalog of fields (pure data).

Each field has the names ``--query-gpu`` knows it by (the first is asked first; the others
are older or vendor spellings tried when the tool refuses a name), how its value is read,
and where ``-q`` prints it (paths of section / label, matched case-insensitively), for the
fallback when the query interface does not offer it. Values keep the tool's units (°C, W,
MHz, %, MiB); the exporter converts them to base units.

Xid errors are not here: neither ``nvidia-smi --query-gpu`` nor ``-q`` prints them (they go
to the kernel log; DCGM reads them through NVML events).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

Kind = Literal["int", "float", "bitmask", "text"]
QPath = tuple[str, ...]


class FieldSpec(NamedTuple):
    name: str  # our name: an attribute of contract.records.DeviceSample (or gpu / name / uuid)
    queries: tuple[str, ...]  # --query-gpu names, preferred first
    kind: Kind
    q_paths: tuple[QPath, ...] = ()  # where ``-q`` prints it, first match wins
    unit: str = ""  # the tool's unit (what the CSV prints without nounits)


_POWER = ("GPU Power Readings", "Power Readings")

FIELDS: tuple[FieldSpec, ...] = (
    FieldSpec("gpu", ("index",), "int"),
    FieldSpec("name", ("name",), "text", (("Product Name",),)),
    FieldSpec("uuid", ("uuid",), "text", (("GPU UUID",),)),
    FieldSpec("temperature_c", ("temperature.gpu",), "float", (("Temperature", "GPU Current Temp"),), "C"),
    FieldSpec("memory_temperature_c", ("temperature.memory",), "float", (("Temperature", "Memory Current Temp"),),
              "C"),
    FieldSpec("power_w", ("power.draw", "power.draw.instant"), "float",
              tuple((s, label) for s in _POWER for label in ("Instantaneous Power Draw", "Power Draw",
                                                               "Average Power Draw")), "W"),
    FieldSpec("power_limit_w", ("power.limit", "enforced.power.limit"), "float",
              tuple((s, label) for s in _POWER for label in ("Current Power Limit", "Enforced Power Limit",
                                                               "Power Limit")), "W"),
    # SM clock; a -q without an SM line (mthreads-gmi prints Graphics only) gives the graphics clock
    FieldSpec("sm_clock_mhz", ("clocks.sm",), "float", (("Clocks", "SM"), ("Clocks", "Graphics")), "MHz"),
    FieldSpec("memory_clock_mhz", ("clocks.mem",), "float", (("Clocks", "Memory"),), "MHz"),
    FieldSpec("graphics_clock_mhz", ("clocks.gr",), "float", (("Clocks", "Graphics"),), "MHz"),
    FieldSpec("max_sm_clock_mhz", ("clocks.max.sm",), "float", (("Max Clocks", "SM"), ("Max Clocks", "Graphics")),
              "MHz"),
    FieldSpec("utilization_pct", ("utilization.gpu",), "float", (("Utilization", "GPU"),), "%"),
    FieldSpec("memory_utilization_pct", ("utilization.memory",), "float", (("Utilization", "Memory"),), "%"),
    FieldSpec("memory_used_mib", ("memory.used",), "float",
              (("FB Memory Usage", "Used"), ("Memory Usage", "Used")), "MiB"),
    FieldSpec("memory_total_mib", ("memory.total",), "float",
              (("FB Memory Usage", "Total"), ("Memory Usage", "Total")), "MiB"),
    # bitmask of NVML clocks event reasons; -q lists them one per line (see REASONS)
    FieldSpec("clock_event_reasons", ("clocks_event_reasons.active", "clocks_throttle_reasons.active"), "bitmask",
              (("Clocks Event Reasons",), ("Clocks Throttle Reasons",))),
    # volatile uncorrected ECC errors; -q: the sum of the "Uncorrectable" counters under ECC Errors / Volatile
    FieldSpec("ecc_uncorrected", ("ecc.errors.uncorrected.volatile.total",), "int", (("ECC Errors", "Volatile"),)),
)
BY_NAME: dict[str, FieldSpec] = {f.name: f for f in FIELDS}
IDENTITY = ("gpu", "name", "uuid")
# the numeric fields of a sample, in catalog order
NUMERIC: tuple[str, ...] = tuple(f.name for f in FIELDS if f.name not in IDENTITY)

# NVML clocks event reasons (nvmlClocksEventReason*): bit -> (name, what -q calls it)
REASONS: tuple[tuple[int, str, str], ...] = (
    (0x1, "gpu_idle", "Idle"),
    (0x2, "applications_clocks_setting", "Applications Clocks Setting"),
    (0x4, "sw_power_cap", "SW Power Cap"),
    (0x8, "hw_slowdown", "HW Slowdown"),
    (0x10, "sync_boost", "Sync Boost"),
    (0x20, "sw_thermal_slowdown", "SW Thermal Slowdown"),
    (0x40, "hw_thermal_slowdown", "HW Thermal Slowdown"),
    (0x80, "hw_power_brake_slowdown", "HW Power Brake Slowdown"),
    (0x100, "display_clock_setting", "Display Clock Setting"),
)
REASON_NAMES: tuple[str, ...] = tuple(name for _, name, _ in REASONS)
# reasons that slow a busy device down (idle, sync boost and display settings are not a slowdown)
SLOWDOWN_REASONS: frozenset[str] = frozenset({
    "sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown",
    "applications_clocks_setting"})
REASON_LABELS: dict[str, str] = {name: label for _, name, label in REASONS}


def reason_names(mask: int) -> tuple[str, ...]:
    """The reasons set in an NVML clocks-event bitmask (unknown bits are ignored)."""
    return tuple(name for bit, name, _ in REASONS if mask & bit)
