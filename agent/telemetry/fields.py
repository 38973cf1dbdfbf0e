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

from contract.vocab import REASONS as REASONS

Kind = Literal["int", "float", "bitmask", "text"]
QPath = tuple[str, ...]


class FieldSpec(NamedTuple):
    # our name: an attribute of contract.records.DeviceSample (or gpu / name / uuid); its --query-gpu names, preferred
    # first; where ``-q`` prints it (the first match wins); the tool's unit (what the CSV prints without nounits)
    name: str
    queries: tuple[str, ...]
    kind: Kind
    q_paths: tuple[QPath, ...] = ()
    unit: str = ""


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

# NVML clocks event reasons: contract.vocab.REASONS (bit -> (name, what -q calls it)), shared with the report
REASON_NAMES: tuple[str, ...] = tuple(name for _, name, _ in REASONS)


def reason_names(mask: int) -> tuple[str, ...]:
    """The reasons set in an NVML clocks-event bitmask (unknown bits are ignored)."""
    return tuple(name for bit, name, _ in REASONS if mask & bit)
