"""What the two real-engine benches (``engine_run.py``, ``engine_llama_run.py``) measure and print alike.

One validation through the agent's pipeline (``agent.pipeline.run_pipeline``, as ``fleet-agent run`` does),
with this process's CPU time beside its children's; then each key's outcome and tables as the release
printed them, each step's duration, and the agent's overhead. Not a bench of its own: both import it.
"""

from __future__ import annotations

import json
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.pipeline import AgentConfig, run_pipeline
from agent.store import RunStore
from contract.records import RunRequest

CHILD_STEPS = ("generate", "environment", "precompile", "server", "benchmark", "probe")


@dataclass(frozen=True)
class Measured:
    result: Any  # the pipeline's result
    events: list[dict[str, Any]]
    logs: Path  # the run's log folder
    wall_s: float
    agent_cpu_s: float
    children_cpu_s: float


def _cpu(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def run_measured(req: RunRequest, cfg: AgentConfig, after: Callable[[], None] = lambda: None) -> Measured:
    """Run the pipeline once; ``after`` runs when it ends (a sampler stopped), before the clocks are read."""
    self0, kids0 = _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)
    w0 = time.monotonic()
    try:
        result = run_pipeline(req, cfg)
    finally:
        after()
    wall = time.monotonic() - w0
    self1, kids1 = _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)
    return Measured(result=result, events=RunStore(cfg.workdir).events(req.run_id),
                    logs=Path(cfg.workdir) / "runs" / req.run_id / "logs", wall_s=wall, agent_cpu_s=self1 - self0,
                    children_cpu_s=kids1 - kids0)


def print_outcomes(m: Measured) -> None:
    """Each key's outcome, then each key's tables as the release printed them."""
    for o in m.result.progress.outcomes:
        print(f"{o.model_key}: {o.status}, {o.rows} rows, {o.duration_s:.1f} s"
              + (f" -- {o.error.one_line()}" if o.error else ""))
    for out in sorted(m.logs.glob("*benchmark-*.out")):
        print(f"\n## {out.name}\n{out.read_text(encoding='utf-8').strip()}")


def print_steps_and_overhead(m: Measured, device: str, key_width: int = 14) -> dict[str, Any]:
    """Each step's duration, and the agent's overhead (printed as JSON, and returned)."""
    print("\n## steps (s)")
    child = 0.0
    for e in m.events:
        if e["status"] in ("ok", "failed", "skipped") and e.get("duration_s") is not None:
            print(f"{e['step']:<12} {e.get('model_key') or '':<{key_width}} {e['status']:<8} {e['duration_s']:8.2f}  "
                  f"{e.get('message', '')[:90]}")
            if e["step"] in CHILD_STEPS:
                child += e["duration_s"]
    summary = {"device": device, "run_wall_s": round(m.wall_s, 2), "child_steps_wall_s": round(child, 2),
               "agent_wall_outside_steps_s": round(m.wall_s - child, 2), "agent_cpu_s": round(m.agent_cpu_s, 2),
               "children_cpu_s": round(m.children_cpu_s, 2),
               "agent_cpu_share": round(m.agent_cpu_s / max(m.children_cpu_s, 1e-9), 4)}
    print("\n## agent overhead\n" + json.dumps(summary))
    return summary
