"""Time from a fault to the run's terminal state, and rows lost, for each fault kind, next to its bound.

One simulated module on a real redis-server, the reliability suite's lab (real worker processes,
real signals): for each fault, a fresh lab runs two keys (qwen3, qwen35_mtp), the fault strikes while
the second key is benchmarked, and the script measures the wall time from the fault to the
module's terminal state as the controller sees it, and the rows the module stored that the
history lacks. Exits non-zero when a fault passes its bound or loses a row.

Usage: python bench/faults.py [--time-scale 50] [--only NAME,...]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from agent.store import RunStore  # noqa: E402
from bench import record  # noqa: E402 - bench/record.py, this script's folder
from tests.support.lab import make_lab  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402
from tests.support.reliability import KEYS, Bench  # noqa: E402


def _worker_restart(b: Bench, redis: RedisServer) -> None:
    b.lab.kill("sim-01")
    b.lab.start(["sim-01"])


def _sigterm_restart(b: Bench, redis: RedisServer) -> None:
    w = b.lab.workers.pop("sim-01")
    os.kill(w.proc.pid, signal.SIGTERM)
    w.proc.wait(timeout=60)
    b.lab.start(["sim-01"])


def _redis_kill(b: Bench, redis: RedisServer) -> None:
    redis.kill()
    time.sleep(1.0)
    redis.start()


def _backend_down_10s(b: Bench, redis: RedisServer) -> None:
    redis.stop()
    time.sleep(10.0)
    redis.start()


def _agent_lost(b: Bench, redis: RedisServer) -> None:
    b.lab.kill("sim-01")


def _evicting_broker(b: Bench, redis: RedisServer) -> None:
    """allkeys-lru with little headroom and a filler client, from the second key until the module's run ended
    and Redis had time to evict its rows and final state (nobody syncing meanwhile)."""
    from tests.reliability.test_evicting_broker import HEADROOM, RATE, memory_pressure

    store = RunStore(b.workdir("sim-01"))
    with memory_pressure(redis):
        end = time.monotonic() + 120
        while store.current_run() is not None and time.monotonic() < end:
            time.sleep(0.2)
        time.sleep(3 * HEADROOM / RATE)


def _redis_full_10s(b: Bench, redis: RedisServer) -> None:
    """Redis full (``noeviction``, ``maxmemory`` reached) for 10 s while the key runs, then freed; the most
    Redis clients seen meanwhile is printed (it grew ~12 a second before the fix)."""
    from tests.reliability.test_redis_full import Filler

    filler = Filler(redis.port)
    try:
        filler.limit(256 * 1024)
        filler.fill()
        most, end = filler.clients(), time.monotonic() + 10.0
        while time.monotonic() < end:
            filler.fill()  # what expired is taken again: Redis stays full
            most = max(most, filler.clients())
            time.sleep(0.2)
        filler.free()
        print(f"   redis clients while full: at most {most}")
    finally:
        filler.close()


# name -> (inject, lab overrides, bound from the fault to the terminal state, s)
FAULTS: dict[str, tuple[Callable[[Bench, RedisServer], None], dict[str, float], float]] = {
    "worker SIGKILL + restart": (_worker_restart, {"lost_after": 60.0}, 120.0),
    "worker SIGTERM + restart": (_sigterm_restart, {}, 120.0),
    "redis-server SIGKILL + AOF restart": (_redis_kill, {}, 120.0),
    "backend down 10 s": (_backend_down_10s, {}, 120.0),
    "agent gone (lost_after 6 s)": (_agent_lost, {"offline_after": 2.0, "lost_after": 6.0}, 6.0 + 10.0),
    "evicting broker (allkeys-lru, filler)": (_evicting_broker, {}, 120.0),
    "redis full 10 s (noeviction)": (_redis_full_10s, {}, 120.0),
}


def one(name: str, base: Path, redis: RedisServer, release) -> tuple[float, int, str]:
    inject, overrides, _ = FAULTS[name]
    b = Bench(make_lab(base, (redis.url, redis), 1, None, **overrides))  # no extra names: overrides are settings
    b.lab.start()
    try:
        run_id = b.validate(release)
        b.on_key(run_id, "sim-01", KEYS[1])
        t0 = time.monotonic()
        inject(b, redis)
        view = b.finished(run_id, 300)
        took = time.monotonic() - t0
        local = len(RunStore(b.workdir("sim-01")).rows(run_id))  # the release's rows and the probe's
        progress = view.progress["sim-01"]
        assert progress is not None, f"{name}: the run ended without sim-01's progress"
        return took, local - len(b.history.rows(run_id, source=None)), progress.state.value
    finally:
        b.lab.stop()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--time-scale", type=float, default=50.0)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    from simulator import build_release

    names = [n for n in FAULTS if not args.only or any(k.strip().lower() in n.lower() for k in args.only.split(","))]
    failed = False
    with tempfile.TemporaryDirectory(prefix="m1000-faults-") as tmp:
        base = Path(tmp)
        release = build_release(base / "release", time_scale=args.time_scale, noise=0.0, seed=3)
        redis = RedisServer(base / "redis")
        redis.start()
        try:
            print(f"{'fault':38} {'to terminal':>12} {'bound':>8} {'rows lost':>10}  final state")
            for i, name in enumerate(names):
                took, lost, state = one(name, base / f"lab{i}", redis, release)
                bound = FAULTS[name][2]
                bad = took > bound or lost != 0
                failed |= bad
                print(f"{name:38} {took:10.1f} s {bound:6.0f} s {lost:10d}  {state}{'  <- FAILS' if bad else ''}",
                      flush=True)
        finally:
            redis.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
