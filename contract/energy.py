"""How a result row's energy figures were reached: the record of one benchmark window (agent.telemetry.energy).

A row carries its figures (``ResultRow.energy_j``, ``j_per_token``, ...) as plain columns, for the analysis; this
record beside them says where they came from, or why they were dropped (docs/adr/0022-energy-per-token.md).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


class EnergyWindow(BaseModel):
    """How a row's energy figures were reached: the window, the source, and what covered it.

    ``source`` "counter": the device's cumulative energy counter (NVML's total energy), read at the
    window's edges; "samples": the power samples integrated (trapezoid, clipped to the window).
    ``note`` is non-empty when the figures were dropped (a counter reset, a gap in the samples, too
    little coverage, no output tokens), and says why.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")  # read by the other side (ADR 0051)

    source: Literal["counter", "samples", ""] = ""
    start: float  # epoch s
    end: float
    window_s: float
    # power samples (or counter readings) inside the window, their median interval, the share of the window between
    # the first and the last sample around it, the longest interval between two samples over it
    samples: int = 0
    period_s: float | None = None
    coverage: float = 0.0
    max_gap_s: float | None = None
    output_tokens: int | None = None
    idle_samples: int = 0  # samples behind idle_power_w
    # the idle power measured before the benchmark (server up and idle, settled: agent.telemetry.rate); None: read
    # from the samples before the server started (an older agent, or the idle measurement off)
    # idle_spread_w: max - min of the idle window's power samples (summed over the devices); idle_settle_s: seconds
    # from the idle step's start to the end of the window used; idle_settled False: the idle power did not settle
    # within idle_max_s (the last window)
    idle_spread_w: float | None = None
    idle_settle_s: float | None = None
    idle_settled: bool | None = None
    note: str = ""
