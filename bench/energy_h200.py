"""Energy on a real H200: NVML's energy counter against nvidia-smi's power samples integrated by the agent.

Reads a recording made on the lent H200 by ``tests/fixtures/h200/energy-recorder.py.txt`` (how: the fixture's
README) and integrates it with the agent's own code (:mod:`agent.telemetry.energy`) over each load window:
the counter read at the window's edges (the reference), NVML's power readings at 50 ms, and nvidia-smi's
``power.draw`` (on Hopper a 1 s average), ``power.draw.instant`` and ``power.draw.average`` at 100 ms
(``-lms 100``) and at 1 s (one call a second, as the agent's sampler calls it). Prints each as J, J/token and
its ratio to the counter, side by side. Goal: every 1 s and 100 ms figure within 5 % of the counter.

    .venv/bin/python bench/energy_h200.py [RECORDING]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from agent.telemetry.energy import counter_energy, integrate_power  # noqa: E402
from bench import record  # noqa: E402 - bench/record.py, this script's folder

FIXTURE = ROOT / "tests" / "fixtures" / "h200" / "energy-decode-loop.jsonl"
FIELDS = ("power.draw", "power.draw.instant", "power.draw.average")
GOAL = 0.05


def compare(path: Path) -> tuple[list[str], bool]:
    """Lines of the comparison and whether every nvidia-smi figure met the goal."""
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    by: dict[str, list[dict[str, Any]]] = {}  # JSON records
    for r in recs:
        by.setdefault(str(r["kind"]), []).append(r)
    meta = by["meta"][0]
    lines = [f"device {meta['name']}, driver {meta['driver']}, torch {meta['torch']}; recording {path.name}"]
    ok = True
    for w in by["window"]:
        a, b, tokens = float(w["start"]), float(w["end"]), int(w["tokens"])
        ref = counter_energy([(float(r["ts"]), float(r["mj"])) for r in by["nvml"]], a, b,
                             period_s=0.05)
        assert ref.joules is not None, ref.note
        lines.append(f"== window {w['name']}: {b - a:.2f} s, {tokens} tokens; counter {ref.joules:.1f} J = "
                     f"{ref.joules / tokens * 1000:.4f} mJ/token, average {ref.joules / (b - a):.1f} W")
        series = [("NVML power 50 ms", [(float(r["ts"]), float(r["mw"]) / 1000) for r in by["nvml"]], 0.05)]
        for kind, period in (("smi100", 0.1), ("smi1s", 1.0)):
            for f in FIELDS:
                pts = [(float(r["ts"]), float(r[f])) for r in by[kind] if r.get(f) is not None]
                series.append((f"nvidia-smi {f} {'100 ms' if period < 1 else '1 s'}", pts, period))
        for name, pts, period in series:
            got = integrate_power(pts, a, b, period_s=period)
            assert got.joules is not None, got.note
            ratio = got.joules / ref.joules
            met = abs(ratio - 1) <= GOAL
            ok = ok and (met or name.startswith("NVML"))
            lines.append(f"   {name:<36} {got.joules:9.1f} J  {got.joules / tokens * 1000:7.4f} mJ/token  "
                         f"ratio {ratio:.4f} ({ratio - 1:+.2%}){'' if met else '  OUTSIDE 5 %'}")
    lines.append(f"goal: every nvidia-smi figure within {GOAL:.0%} of the counter: {'met' if ok else 'MISSED'}")
    return lines, ok


def main() -> int:
    lines, ok = compare(Path(sys.argv[1]) if len(sys.argv) > 1 else FIXTURE)
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
