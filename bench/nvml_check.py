"""The agent's energy per key against NVML's counter read by another process (issue 45: within 2 %).

``record``: reads every device's NVML energy counter (``agent/telemetry/nvml.py``: nvidia-ml-py, else the driver's
library through ctypes) every ``--period`` s (2 ms) and writes each change, when it was seen, into a JSON-lines
file until stopped (SIGTERM / SIGINT) or ``--seconds``; one line ``{"ts": epoch s, "mj": {"0": mJ, ...}}`` per tick
(the counter advances in ticks: about every 100 ms on the lent H100). Start it before the agent's run, stop it
after.

``compare``: for every key's benchmark window of a run (the rows' ``energy``: start, end, and the agent's joules)
the same window's energy from that log (the counter interpolated between its ticks at each edge, devices summed),
side by side:
agent J, NVML J, ratio, and whether they agree within ``--tolerance`` (2 %). A key without an agent figure is a
failure too (the acceptance: every key has one at the default settings). Exit 0 only when every key agrees.

On the lent GPU machine, around ``bench/engine_llama_run.py`` (its run's workdir is ``<out>/work``, run id
``llama-bench``):
    python3 bench/nvml_check.py record /tmp/nvml.jsonl & rec=$!
    python3 bench/engine_llama_run.py --device cuda ... --out /tmp/llama-run
    kill $rec; wait $rec
    python3 bench/nvml_check.py compare /tmp/nvml.jsonl /tmp/llama-run/work/runs/llama-bench
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from bisect import bisect_left
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from agent.telemetry.nvml import counter_source, nvml_counter  # noqa: E402
from bench import record  # noqa: E402 - bench/record.py, this script's folder
from contract.records import ResultRow  # noqa: E402


def record_counter(path: Path, period: float, seconds: float) -> int:
    read = nvml_counter()
    if read is None:
        print("NVML offers no energy counter here (no NVIDIA driver, or a device before Volta)", file=sys.stderr)
        return 2
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(1))
    end = time.monotonic() + seconds if seconds > 0 else float("inf")
    n, reads, last = 0, 0, None
    with path.open("w", encoding="utf-8") as fh:
        while not stop and time.monotonic() < end:
            got = read()
            reads += 1
            if got != last:  # a tick: its time is when it was first seen
                fh.write(json.dumps({"ts": time.time(), "mj": {str(k): v for k, v in got.items()}}) + "\n")
                fh.flush()
                n, last = n + 1, got
            time.sleep(period)
    print(f"{n} ticks of NVML's counter ({counter_source()}) in {reads} readings every {period:g} s into {path}")
    return 0


def counter_at(ts: list[float], mj: list[float], t: float) -> float | None:
    """The counter at ``t``, interpolated between the readings around it (None outside the log)."""
    i = bisect_left(ts, t)
    if i == len(ts) or (i == 0 and ts[0] > t):
        return None
    if ts[i] == t or i == 0:
        return mj[i]
    a, b = i - 1, i
    return mj[a] + (mj[b] - mj[a]) * (t - ts[a]) / (ts[b] - ts[a])


def compare(log: Path, run_dir: Path, tolerance: float) -> int:
    lines = [json.loads(x) for x in log.read_text(encoding="utf-8").splitlines() if x.strip()]
    ts = [x["ts"] for x in lines]
    devices = sorted({d for x in lines for d in x["mj"]})
    series = {d: [float(x["mj"].get(d, "nan")) for x in lines] for d in devices}
    rows = [ResultRow.model_validate_json(x) for x in (run_dir / "results.jsonl").read_text().splitlines() if x]
    keys: dict[str, ResultRow] = {}
    for r in rows:
        if r.source == "release":
            keys[r.model_key] = r  # one window per key: every release row carries it
    print(f"NVML log {log}: {len(lines)} readings, devices {devices}; run {run_dir}")
    print("| key | window s | agent source | agent J | NVML J | agent / NVML | within |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    bad = 0
    for key, r in sorted(keys.items()):
        w = r.energy
        if w is None:
            print(f"| {key} | - | - | none | - | - | NO (no energy record) |")
            bad += 1
            continue
        nvml: float | None = 0.0
        for d in devices:
            a, b = counter_at(ts, series[d], w.start), counter_at(ts, series[d], w.end)
            nvml = None if a is None or b is None or nvml is None else nvml + (b - a) / 1000.0
        agent = r.energy_j
        ok = agent is not None and nvml is not None and nvml > 0 and abs(agent / nvml - 1) <= tolerance
        bad += not ok
        ratio = f"{agent / nvml:.4f}" if agent is not None and nvml else "-"
        why = "yes" if ok else ("NO: " + (w.note or "no agent figure") if agent is None else
                                "NO: the log does not cover the window" if nvml is None else "NO")
        print(f"| {key} | {w.window_s:.2f} | {w.source or '-'} | {agent if agent is not None else 'none'} | "
              f"{f'{nvml:.6g}' if nvml is not None else '-'} | {ratio} | {why} |")
    print(f"{len(keys) - bad} of {len(keys)} keys within {tolerance:.0%} of NVML's counter")
    return 0 if keys and not bad else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("log", type=Path)
    r.add_argument("--period", type=float, default=0.002)
    r.add_argument("--seconds", type=float, default=0.0, help="stop after this long (0: when signalled)")
    c = sub.add_parser("compare")
    c.add_argument("log", type=Path)
    c.add_argument("run_dir", type=Path, help="<workdir>/runs/<run id> of the agent's run")
    c.add_argument("--tolerance", type=float, default=0.02)
    a = ap.parse_args()
    if a.cmd == "record":
        return record_counter(a.log, a.period, a.seconds)
    return compare(a.log, a.run_dir, a.tolerance)


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
