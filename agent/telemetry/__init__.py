"""Device telemetry: the module's accelerators, sampled through the vendor's tool during every run.

``mthreads-gmi`` on M1000 modules, ``nvidia-smi`` elsewhere (``--query --json`` first, then the
query interface both share; same code path). Pure parts: :mod:`.fields` (what is asked),
:mod:`.plan` (which tool, which argv), :mod:`.gmi_json` (``--json`` to readings), :mod:`.parse`
(CSV and ``-q`` text to readings), :mod:`.summary` (per-key statistics), :mod:`.exposition`
(``/metrics`` families). I/O: :mod:`.sampler` (the thread and its one process seam). Records
(:class:`~contract.records.DeviceSample`, :class:`~contract.records.TelemetrySummary`) live in
:mod:`contract.records`.
"""

from __future__ import annotations

from agent.telemetry.sampler import SAMPLES_FILE, Sampler, TelemetryConfig, ToolResult, run_tool
from agent.telemetry.summary import read_samples, summarize

__all__ = ["SAMPLES_FILE", "Sampler", "TelemetryConfig", "ToolResult", "read_samples", "run_tool", "summarize"]
