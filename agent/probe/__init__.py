"""The probe: the agent's own streaming client, with pinned metric definitions.

It measures an OpenAI-compatible server (``/v1/completions``, ``/v1/chat/completions``,
streamed) next to the release's own benchmark, so a release whose benchmark miscounts is
caught (``release_benchmark_disagrees``). Pieces, pure except the transport:

- :mod:`agent.probe.sse`: server-sent events from bytes as they arrive;
- :mod:`agent.probe.measure`: the definitions (TTFT, ITL, TPOT, E2E, throughputs,
  goodput, percentiles, accept length) and the error kinds, from an :class:`Exchange`;
- :mod:`agent.probe.prompts`: profiles (``prefill_len:input_len``) and request bodies;
- :mod:`agent.probe.transport`: HTTP/1.1 on asyncio streams (the one I/O seam);
- :mod:`agent.probe.runner`: load shapes (sequential, fixed concurrency, Poisson rate);
- :mod:`agent.probe.compare`: probe rows and the cross-check with the release's rows.
"""

from __future__ import annotations

from agent.probe.compare import FLAG, Disagreement, cross_check, probe_row
from agent.probe.measure import Exchange, interpret, percentile, summarise
from agent.probe.records import SLO, LoadShape, ProbeReport, ProfileResult, RequestResult, load_shapes
from agent.probe.runner import ProbeConfig, ProbeError, probe_async, run_probe
from agent.probe.sse import SSEEvent, SSEParser

__all__ = ["FLAG", "SLO", "Disagreement", "Exchange", "LoadShape", "ProbeConfig", "ProbeError", "ProbeReport",
           "ProfileResult", "RequestResult", "SSEEvent", "SSEParser", "cross_check", "interpret", "load_shapes",
           "percentile", "probe_async", "probe_row", "run_probe", "summarise"]
