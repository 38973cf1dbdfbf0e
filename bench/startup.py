"""Start-up costs of simulated modules, a release and one that starts its server 40 % slower, side by side in one run.

Each round runs ``fleet-agent run`` (the real agent, real release processes) on ``--modules`` simulated modules, one
after the other, for release A, then A again, then B (built with ``--regress KEY:server_ready_s:0.4``: its model load
1.4x as long); every run in a fresh work folder, so that every run compiles its kernels. Printed per run: each
module's server ready, first request and precompile (wall s, from its rows), then per release the spread of those
across modules (relative standard deviation, and the largest |change| of a module between A's two runs: the noise
a start-up tolerance must stand above), and B / A.

Usage: flock /tmp/bench.lock .venv/bin/python bench/startup.py [--modules 4] [--time-scale 20] [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import simulator  # noqa: E402
from simulator.ports import free_port  # noqa: E402

FIGURES = ("server_ready_s", "warmup_s", "precompile_s")


def one_run(tarball: Path, models: Path, work: Path, module: str, key: str, run_id: str) -> dict[str, float]:
    """One validation of ``key`` on one simulated module: its release rows' start-up figures."""
    env = {**os.environ, "BENCH_PROFILE_SET": "scale", "BENCH_REPEATS": "1", "BENCH_OUTPUT_LEN": "8"}
    cmd = [sys.executable, "-m", "agent.cli", "run", str(tarball), "--models", key, "--model-root", str(models),
           "--workdir", str(work), "--run-id", run_id, "--module", module, "--server-port", str(free_port()),
           "--format", "json"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    if res.returncode != 0:
        raise SystemExit(f"{module} {run_id}: fleet-agent run exited {res.returncode}: {res.stderr[-2000:]}")
    row = next(r for r in json.loads(res.stdout)["rows"] if r["source"] == "release")
    return {f: float(row[f]) for f in FIGURES}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modules", type=int, default=4)
    ap.add_argument("--time-scale", type=float, default=20.0)
    ap.add_argument("--key", default="qwen35")
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="startup-bench-") as tmp:
        base = Path(tmp)
        a = simulator.build_release(base / "a", version="9.0.0", noise=0.0, time_scale=args.time_scale)
        speed = simulator.regress_spec(f"{args.key}:server_ready_s:0.4")
        b = simulator.build_release(base / "b", version="9.0.1", noise=0.0, time_scale=args.time_scale, speed=speed)
        simulator.make_models(base / "models")
        print(f"time scale {args.time_scale:g}, key {args.key}, {args.modules} modules, release B speed {speed}")
        figures: dict[str, list[dict[str, float]]] = {"A": [], "A2": [], "B": []}
        n = 0
        for r in range(args.rounds):
            for label, rel in (("A", a), ("A2", a), ("B", b)):
                for i in range(args.modules):
                    n += 1
                    got = one_run(rel.path, base / "models", base / f"w{n}", f"sim-{i + 1}", args.key, f"r{n}")
                    figures[label].append(got)
                    print(f"round {r} {label:2} sim-{i + 1}: " + ", ".join(f"{f} {got[f]:.3f}" for f in FIGURES),
                          flush=True)
        m = args.modules
        for f in FIGURES:
            a1, a2, bb = ([x[f] for x in figures[k]] for k in ("A", "A2", "B"))
            rsd = statistics.stdev(a1 + a2) / statistics.mean(a1 + a2)
            pairs = [y / x - 1 for x, y in zip(a1, a2, strict=True)]
            # per round, the fleet's change: the median over the modules of each module's change (as the verdict's
            # t-test sees it), same release (A again / A) and the slower one (B / A again)
            same = [statistics.median(pairs[r * m:(r + 1) * m]) for r in range(args.rounds)]
            slow = [statistics.median([y / x - 1 for x, y in zip(a2[r * m:(r + 1) * m], bb[r * m:(r + 1) * m],
                                                                  strict=True)]) for r in range(args.rounds)]
            print(f"{f}: A median {statistics.median(a1):.3f} s, A again {statistics.median(a2):.3f} s, "
                  f"B {statistics.median(bb):.3f} s; across modules and runs of A: rsd {rsd:.1%}; a module's "
                  f"|change| between A's runs: median {statistics.median(abs(x) for x in pairs):.1%}, largest "
                  f"{max(abs(x) for x in pairs):.1%}; the fleet's change A again / A per round: "
                  + ", ".join(f"{x:+.1%}" for x in same) + "; B / A again per round: "
                  + ", ".join(f"{x:+.1%}" for x in slow))

if __name__ == "__main__":
    main()
