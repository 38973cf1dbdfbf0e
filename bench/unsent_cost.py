"""Benchmark: what recording each module's request with its part costs a dispatch (ADR 0060), beside the progress
rows alone, in one run.

A dispatch to N modules writes N queued parts; since ADR 0060 it also writes N requests in the same transaction and
deletes them in one more after its sends. Each round times (process CPU) both on a fresh SQLite history, rounds
interleaved; prints the medians and the difference per module. Then what every sync pass of an unfinished run adds
since ADR 0060: its one query for requests still unsent, on the history of that dispatch (every request marked
sent, as in the common case), the mean of ``--queries`` calls.

Usage: .venv/bin/python bench/unsent_cost.py [--modules 10000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
from bench import record  # bench/record.py, this script's folder
from contract.records import RunProgress
from controller.history import History, UnsentRequest

PAYLOAD = {"run_id": "r", "tarball": "/var/lib/m1000/releases/sglang-musa-1.4.1.tar.gz", "sha256": "a" * 64,
           "release": "1.4.1", "models": ["qwen3", "qwen35_mtp"], "model_root": "/models", "model_paths": {},
           "max_attempts": 2, "key_env": {}}


def once(n: int, run: str, with_requests: bool) -> float:
    with tempfile.TemporaryDirectory(prefix="bench-unsent-") as tmp:
        h = History(Path(tmp) / "history.sqlite")
        progress = [RunProgress(run_id=run, module=f"m{i}", release="1.4.1", step="queued", keys_total=2,
                                updated_at=1.0) for i in range(n)]
        t = time.process_time()
        if with_requests:
            h.record_queued(progress, (UnsentRequest(run_id=run, module=f"m{i}", payload={**PAYLOAD, "module": f"m{i}"},
                                                     priority="normal", started_by="u", created_at=1.0)
                                       for i in range(n)))
            h.mark_sent(run, [f"m{i}" for i in range(n)])
        else:
            h.upsert_progress_many(progress)
        spent = time.process_time() - t
        h.close()
    return spent


def follower_query(n: int, queries: int) -> float:
    """CPU of one sync pass's ``History.unsent`` on a run of ``n`` modules whose requests were all sent."""
    with tempfile.TemporaryDirectory(prefix="bench-unsent-") as tmp:
        h = History(Path(tmp) / "history.sqlite")
        h.record_queued([RunProgress(run_id="r", module=f"m{i}", release="1.4.1", step="queued", keys_total=2,
                                     updated_at=1.0) for i in range(n)],
                        [UnsentRequest(run_id="r", module=f"m{i}", payload=PAYLOAD, priority="normal",
                                       started_by="u", created_at=1.0) for i in range(n)])
        h.mark_sent("r", [f"m{i}" for i in range(n)])
        t = time.process_time()
        for _ in range(queries):
            assert h.unsent("r", before=time.time() - 60) == []
        spent = (time.process_time() - t) / queries
        h.close()
    return spent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modules", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--queries", type=int, default=10_000)
    args = ap.parse_args()
    got: dict[bool, list[float]] = {False: [], True: []}
    for r in range(args.rounds):
        for with_requests in got:
            got[with_requests].append(once(args.modules, f"r{r}", with_requests))
    before, after = statistics.median(got[False]), statistics.median(got[True])
    print(f"{args.modules} modules, median of {args.rounds} interleaved rounds (process CPU of the history writes)")
    print(f"parts only (before ADR 0060):          {before:.3f} s")
    print(f"parts + requests, then marked sent:    {after:.3f} s  (+{after - before:.3f} s, "
          f"{(after - before) / args.modules * 1e6:.0f} us a module)")
    query = follower_query(args.modules, args.queries)
    print(f"a sync pass's query for unsent requests, none left: {query * 1e6:.1f} us "
          f"(mean of {args.queries} calls)")
    return 0


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
