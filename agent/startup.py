"""The release's start-up costs on a key's rows (pure): its server's ready time, its first request's, the precompile's.

Measured by :mod:`agent.model_key` (server start until ``/health`` answers 200; the one request the agent sends once
it does) and :mod:`agent.pipeline` (the precompile step, once a run); written here on every release row of the key,
as the energy of its window is, so that the controller's history, report and verdict take them like any metric
(``contract.records.STARTUP_METRICS``, judged as docs/adr/0029-start-up-costs-judged.md says).
"""

from __future__ import annotations

from collections.abc import Sequence

from contract.records import PrecompileSource, ResultRow


def with_startup(rows: Sequence[ResultRow], *, server_ready_s: float | None, warmup_s: float | None,
                 precompile_source: PrecompileSource | None, precompile_s: float | None) -> list[ResultRow]:
    """``rows`` with the start-up costs on each release row (probe rows unchanged).

    The precompile's wall time goes to ``precompile_s`` when it compiled and to ``precompile_fetch_s`` when it
    fetched a cache another module compiled; a cached (skipped) precompile has no figure: its few milliseconds are
    no compile, and judged against a compiled baseline would read as one ten thousand times faster.
    """
    update: dict[str, object] = {
        "server_ready_s": _seconds(server_ready_s), "warmup_s": _seconds(warmup_s),
        "precompile_source": precompile_source,
        "precompile_s": _seconds(precompile_s) if precompile_source == "compiled" else None,
        "precompile_fetch_s": _seconds(precompile_s) if precompile_source == "fetched" else None,
    }
    return [r.model_copy(update=update) if r.source == "release" else r for r in rows]


def _seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
