"""Benchmark: what a verdict costs against what its run costs (issue 47, item 1), side by side in one run.

Three histories, built once under ``--dir`` (kept; ``--rebuild`` builds them again), rows written as stored values
through the history's own bulk insert (``History.upsert_row_values``, one ``executemany`` per batch), the ended
runs' column files written by ``History.migrate_columns`` (what ``fleetctl history migrate`` does):

* ``alone.sqlite``: one unjudged 10,000-row run (``--small`` rows: 109 modules x 92 rows, release 1.4.2, every
  module done);
* ``big.sqlite``: a judged 1,000,000-row run (``--big`` rows, 10,870 modules, the same release and module names)
  and then the same unjudged 10,000-row run;
* ``runs.sqlite``: ``--runs`` ended runs (10,000) of ``--modules`` modules each (2: 184 rows a run), ``--per-release``
  runs a release (10: 1,000 releases, a trend's series of 1,000 values), qwen3's decode 10 % slower from 60 % of
  the releases on (a change point to find).

Measured, each as a fresh process where a user's command is one (process start and imports included; CPU =
user + sys of the child, peak RSS GNU time's):

1. ``fleetctl status RUN`` of the unjudged run (it judges it: report, verdict, change-point event) in ``big`` and
   in ``alone``, interleaved round by round (the run set running again between rounds, so each round judges);
   acceptance: big / alone <= 2 for CPU and peak RSS. ``--before TREE`` (a checkout of the code before, e.g.
   ``git archive HEAD | tar -x -C TREE``) runs the same verb of that code too (``--before-timeout`` s each, in
   TREE: ``python -m controller`` imports the code of its working folder first);
2. a scrape of ``/metrics`` (``ControllerCollector`` of ``fleetctl serve``, ``prometheus_client.generate_latest``,
   in this process) over ``runs.sqlite``: with no kept findings (the scrape starts their computation in the
   background and answers without waiting for it), while they are computed, once they are kept; acceptance: every
   scrape < 1 s; and the computation itself (the history's findings, once per history change);
3. ``fleetctl trend`` over ``runs.sqlite``: with the findings kept (what it reads when ``fleetctl serve`` or an
   earlier trend kept them), and with none kept (computes and keeps them); goal: seconds;
4. ``fleetctl status`` of the newest run of ``runs.sqlite`` set unjudged, where its release has neighbours (the
   run-ending path searches the run's own series), now and with ``--before``'s code.

Usage: .venv/bin/python bench/judge_cost.py [--dir /tmp/judge-cost] [--rounds 3] [--runs 10000]
       [--before TREE] [--only status,metrics,trend,long]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import record  # noqa: E402 - bench/record.py, this script's folder
from bench.spawn import spawn  # noqa: E402 - bench/spawn.py

BIN = Path(sys.executable).parent
RUN = "20261206-000000-judged"  # the unjudged 10 k-row run
BIG = "20261205-000000-big"
RELEASE = "1.4.2"


def reference() -> Any:
    from agent.tables import parse_seed
    from bench.report import seed_path  # bench/report.py: the reference document's path
    from controller.report.synth import rows_frame

    return rows_frame([r for rs in parse_seed(seed_path().read_text(encoding="utf-8")).values() for r in rs])


def store(h: Any, df: Any) -> None:
    from bench.report import stored_values  # bench/report.py

    step = 200_000
    for at in range(0, len(df), step):
        h.upsert_row_values(stored_values(df.iloc[at:at + step]))


def add_run(h: Any, ref: Any, run_id: str, rows: int, *, done: bool, seed: int) -> None:
    """A run of ``rows`` rows (modules m00000.., 92 rows each) of RELEASE; ``done``: judged (pass), else every
    module done and the run unjudged (state running, as a detached run's first ``fleetctl status`` finds it)."""
    from contract.records import RunProgress, RunState
    from controller.report.synth import fleet

    modules = [f"m{i:05d}" for i in range(max(1, round(rows / len(ref))))]
    keys = sorted(set(ref["model_key"].astype(str)))
    h.create_run(run_id, release=RELEASE, models=keys, modules=modules)
    for first in range(0, len(modules), 2000):
        store(h, fleet(ref, modules=modules[first:first + 2000], seed=seed + first, run_id=run_id, release=RELEASE))
    now = time.time()
    h.upsert_progress_many(RunProgress(run_id=run_id, module=m, release=RELEASE, state=RunState.DONE, step="done",
                                       keys_total=len(keys), keys_done=len(keys), updated_at=now, started_at=now - 5,
                                       finished_at=now) for m in modules)
    if done:
        h.set_run_state(run_id, "done", verdict="pass", line=f"PASS {run_id}")


def build_status(folder: Path, ref: Any, small: int, big: int) -> None:
    from controller.history import History

    for name, sizes in (("alone", ()), ("big", (big,))):
        path = folder / f"{name}.sqlite"
        if path.exists():
            continue
        t = time.perf_counter()
        tmp = folder / f"{name}.building.sqlite"
        h = History(tmp)
        for n in sizes:
            add_run(h, ref, BIG, n, done=True, seed=7)
        add_run(h, ref, RUN, small, done=False, seed=1)
        done = h.migrate_columns()
        h.close()
        for suffix in ("", ".columns"):
            if Path(f"{tmp}{suffix}").exists():
                Path(f"{tmp}{suffix}").rename(f"{path}{suffix}")
        print(f"built {path.name}: runs of {', '.join(f'{n:,}' for n in (*sizes, small))} rows, {done.written} column"
              f" file(s), in {time.perf_counter() - t:.0f} s", flush=True)


def build_runs(folder: Path, ref: Any, runs: int, modules: int, per_release: int) -> Path:
    """``runs`` ended runs, one ``executemany`` per 100 runs' rows."""
    import numpy as np

    from controller.history import History
    from controller.report.synth import fleet

    path = folder / f"runs{runs}.sqlite"
    if path.exists():
        return path
    t = time.perf_counter()
    tmp = folder / f"runs{runs}.building.sqlite"
    h = History(tmp)
    releases = (runs + per_release - 1) // per_release
    slower_from = int(releases * 0.6)
    names = [f"m{i:05d}" for i in range(modules)]
    step = 100
    for first in range(0, runs, step):
        ids = range(first, min(runs, first + step))
        df = fleet(ref, modules=[f"x{i}" for i in range(len(ids) * modules)], seed=first)
        which = np.repeat(np.arange(len(ids) * modules), len(ref))
        run_of = np.array(ids)[which // modules]
        df["run_id"] = [f"run-{k:05d}" for k in run_of]
        df["module"] = np.array(names, dtype=object)[which % modules]
        slow = (df["model_key"].astype(str) == "qwen3").to_numpy() & (run_of // per_release >= slower_from)
        df.loc[slow, "decode_tps"] = df.loc[slow, "decode_tps"] * 0.9
        df["release"] = [f"1.{k // per_release}.0" for k in run_of]
        for k in ids:
            h.create_run(f"run-{k:05d}", release=f"1.{k // per_release}.0", models=sorted(set(ref["model_key"])),
                         modules=names, state="done")
        store(h, df)
    stored = time.perf_counter() - t
    done = h.migrate_columns()
    h.close()
    for suffix in ("", ".columns"):
        Path(f"{tmp}{suffix}").rename(f"{path}{suffix}")
    print(f"built {path.name}: {runs:,} runs x {modules * len(ref)} rows, {releases:,} releases; stored in "
          f"{stored:.0f} s, {done.written:,} column files in {time.perf_counter() - t - stored:.0f} s", flush=True)
    return path


# --------------------------------------------------------------------------- measuring
def run_once(argv: list[str], env: dict[str, str], timeout: float = 600,
             cwd: Path | None = None) -> tuple[float, float, float, int]:
    """(wall s, CPU s (user + sys), peak RSS MiB, exit code) of ``argv`` as a fresh process (in ``cwd``: ``python -m``
    imports the tree it runs in first); exit 124 when it ran past ``timeout`` (killed). The peak is GNU time's (the
    ``ru_maxrss`` of a forked child counts this process's pages from before its exec: gigabytes after section 2)."""
    with tempfile.NamedTemporaryFile("r") as rss:
        s = spawn(["/usr/bin/time", "-q", "-f", "%M", "-o", rss.name, *argv], env=env, cwd=cwd, timeout=timeout)
        code = 124 if s.timed_out else s.check((0, 1)).code
        peak = rss.read().split()
        return s.wall_s, s.cpu_s, int(peak[-1]) / 1024 if peak else float("nan"), code


def env_of(folder: Path, history: Path, tree: Path | None = None) -> dict[str, str]:
    env = dict(os.environ, FLEET_DATA_DIR=str(folder / "data"), FLEET_BROKER_URL="filesystem://",
               FLEET_HISTORY=str(history), COLUMNS="120", FLEET_LOST_AFTER="86400", BENCH_RECORD="0")
    inv = folder / "inventory.toml"
    if not inv.exists():
        inv.write_text('[[module]]\nname = "m00000"\nhost = "127.0.0.1"\nssh_user = "u"\n')
    env["FLEET_INVENTORY"] = str(inv)
    for k in ("FLEET_CONFIG", "FLEET_SERVICE", "PYTHONDONTWRITEBYTECODE"):
        env.pop(k, None)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    return env


def unjudge(history: Path) -> None:
    """The run set running again (resumed): its verdict line goes, so the next ``fleetctl status`` judges it."""
    from controller.history import History

    h = History(history)
    h.set_run_state(RUN, "running")
    h.close()


def status_section(folder: Path, rounds: int, before: Path | None, before_timeout: float) -> bool:
    cases: dict[str, tuple[Path, Path | None]] = {"alone": (folder / "alone.sqlite", None),
                                                  "big": (folder / "big.sqlite", None)}
    if before is not None:
        cases |= {"alone, before": (folder / "alone.sqlite", before), "big, before": (folder / "big.sqlite", before)}
    got: dict[str, list[tuple[float, float, float, int]]] = {k: [] for k in cases}
    for r in range(rounds + 1):  # round 0: the page cache and the .pyc files warmed, not counted
        for name, (history, tree) in cases.items():
            if tree is not None and r not in (0, 1):
                continue  # the code before: one counted round (45 s of CPU a round in a big history)
            unjudge(history)
            argv = [sys.executable, "-m", "controller", "status", RUN] if tree is not None else \
                [str(BIN / "fleetctl"), "status", RUN]
            one = run_once(argv, env_of(folder, history, tree), before_timeout if tree is not None else 600, cwd=tree)
            if r:
                got[name].append(one)
    print(f"\n1. fleetctl status of the unjudged {RUN} (judges it), fresh process; median [min-max] of "
          f"{rounds} interleaved rounds (the code before: 1 round)")
    print(f"{'history':22s} {'wall s':>10s} {'CPU s':>22s} {'peak RSS MiB':>26s}")
    med: dict[str, tuple[float, float]] = {}
    for name, ones in got.items():
        cpu = [c for _, c, _, _ in ones]
        rss = [m for _, _, m, _ in ones]
        timed_out = any(code == 124 for *_, code in ones)
        med[name] = (statistics.median(cpu), statistics.median(rss))
        print(f"{name:22s} {statistics.median(w for w, *_ in ones):10.2f} {med[name][0]:8.2f} "
              f"[{min(cpu):.2f}-{max(cpu):.2f}] {med[name][1]:10.0f} [{min(rss):.0f}-{max(rss):.0f}]"
              f"{'  (killed at the timeout)' if timed_out else ''}")
    cpu_ratio = med["big"][0] / med["alone"][0]
    rss_ratio = med["big"][1] / med["alone"][1]
    ok = cpu_ratio <= 2 and rss_ratio <= 2
    print(f"big / alone: CPU {cpu_ratio:.2f}x, peak RSS {rss_ratio:.2f}x (acceptance: <= 2x each): "
          f"{'met' if ok else 'NOT met'}")
    if before is not None:
        print(f"the code before, big / alone: CPU {med['big, before'][0] / med['alone, before'][0]:.1f}x, peak RSS "
              f"{med['big, before'][1] / med['alone, before'][1]:.1f}x; big now vs before: CPU "
              f"{med['big, before'][0] / med['big'][0]:.1f}x less")
    return ok


def metrics_section(history: Path) -> bool:
    from prometheus_client import CollectorRegistry, generate_latest

    from controller.history import History
    from controller.serve.metrics import ControllerCollector

    h = History(history)
    h.forget_trend_findings()  # none kept: the first scrape finds none
    c = ControllerCollector(h, states=dict, queue_depths=dict)
    reg = CollectorRegistry()
    reg.register(c)
    print(f"\n2. a scrape of /metrics (ControllerCollector, generate_latest) with {len(h.runs(limit=10**6)):,} runs in "
          "the history")
    scrapes: list[tuple[str, float, bool]] = []

    def scrape(what: str) -> None:
        t = time.perf_counter()
        text = generate_latest(reg).decode()
        scrapes.append((what, time.perf_counter() - t, 'm1000_trend_change_points{' in text))

    scrape("none kept (starts the computation)")
    t = time.perf_counter()
    while c.trend_computing():
        time.sleep(0.5)
        if len([s for s in scrapes if s[0].startswith("while")]) < 3:
            scrape("while it is computed")
    computed = time.perf_counter() - t
    scrape("kept")
    scrape("kept, again")
    for what, s, has in scrapes:
        print(f"  {what:38s} {s:7.3f} s  trend series in it: {'yes' if has else 'no'}")
    print(f"  the findings computed in the background and kept in {computed:.1f} s wall (scraped every 0.5 s "
          "meanwhile)")
    h.close()
    worst = max(s for _, s, _ in scrapes)
    ok = worst < 1.0
    print(f"  slowest scrape {worst:.3f} s (acceptance: < 1 s): {'met' if ok else 'NOT met'}")
    return ok


def trend_section(folder: Path, history: Path) -> None:
    from controller.history import History

    env = env_of(folder, history)
    argv = [str(BIN / "fleetctl"), "trend", "-o", "json"]
    kept = [run_once(argv, env) for _ in range(3)]  # kept by the scrapes above (or by the first of these)
    print("\n3. fleetctl trend -o json over the same history, fresh process")
    print(f"  kept (median of 3):          {statistics.median(k[0] for k in kept):7.2f} s wall, "
          f"{statistics.median(k[1] for k in kept):7.2f} s CPU, {statistics.median(k[2] for k in kept):6.0f} MiB")
    h = History(history)
    h.forget_trend_findings()
    h.close()
    cold = run_once(argv, env, timeout=1200)
    print(f"  none kept (computes, keeps): {cold[0]:7.2f} s wall, {cold[1]:7.2f} s CPU, {cold[2]:6.0f} MiB"
          f"{'  (killed at 1,200 s)' if cold[3] == 124 else ''}")


def long_section(folder: Path, history: Path, before: Path | None, before_timeout: float) -> None:
    """``fleetctl status`` of the newest run of ``runs.sqlite`` (unjudged: set running first), where its release has
    neighbours: the run's own series are searched (with it and without it), of its 2 modules and every key."""
    from contract.records import RunProgress, RunState
    from controller.history import History

    h = History(history)
    info = h.runs(limit=1)[0]
    run, now = info.run_id, time.time()
    if not h.progress(run):  # every module done: status judges it (a run without progress is still running)
        h.upsert_progress_many(RunProgress(run_id=run, module=m, release=info.release, state=RunState.DONE,
                                           step="done", keys_total=len(info.models), keys_done=len(info.models),
                                           updated_at=now, started_at=now - 5, finished_at=now) for m in info.modules)
    h.close()
    cases = {"now": None, **({"before": before} if before is not None else {})}
    print(f"\n4. fleetctl status of {run} (unjudged) in the history of section 2, fresh process, one round each")
    for name, tree in cases.items():
        h = History(history)
        h.set_run_state(run, "running")
        h.close()
        argv = [sys.executable, "-m", "controller", "status", run] if tree is not None else \
            [str(BIN / "fleetctl"), "status", run]
        wall, cpu, rss, code = run_once(argv, env_of(folder, history, tree), before_timeout, cwd=tree)
        print(f"  {name:8s} {wall:7.2f} s wall, {cpu:7.2f} s CPU, {rss:6.0f} MiB"
              f"{'  (killed at the timeout)' if code == 124 else ''}")
    if before is not None:
        scrape = ("import sys, time; from prometheus_client import CollectorRegistry, generate_latest; "
                  "from controller.history import History; from controller.serve.metrics import ControllerCollector; "
                  "r = CollectorRegistry(); r.register(ControllerCollector(History(sys.argv[1]), dict, dict)); "
                  "t = time.perf_counter(); generate_latest(r); print(time.perf_counter() - t)")
        wall, cpu, rss, code = run_once([sys.executable, "-c", scrape, str(history)], env_of(folder, history, before),
                                        before_timeout, cwd=before)
        print(f"  the code before: its first /metrics scrape (process start included) {wall:7.2f} s wall, {cpu:7.2f} s "
              f"CPU, {rss:6.0f} MiB{'  (killed at the timeout)' if code == 124 else ''}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "judge-cost")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--small", type=int, default=10_000)
    ap.add_argument("--big", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--modules", type=int, default=2)
    ap.add_argument("--per-release", type=int, default=10)
    ap.add_argument("--before", type=Path, default=None, help="a checkout of the code before (status only)")
    ap.add_argument("--before-timeout", type=float, default=300)
    ap.add_argument("--only", default="status,metrics,trend,long")
    ap.add_argument("--build-only", action="store_true")
    args = ap.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    only = set(args.only.split(","))
    ref = reference()
    if "status" in only:
        build_status(args.dir, ref, args.small, args.big)
    runs = build_runs(args.dir, ref, args.runs, args.modules, args.per_release) \
        if only & {"metrics", "trend", "long"} else None
    if args.build_only:
        return 0
    print(f"load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs; max RSS of this process so far "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    ok = True
    if "status" in only:
        ok &= status_section(args.dir, args.rounds, args.before, args.before_timeout)
    if runs is not None and "metrics" in only:
        ok &= metrics_section(runs)
    if runs is not None and "trend" in only:
        trend_section(args.dir, runs)
    if runs is not None and "long" in only:
        long_section(args.dir, runs, args.before, args.before_timeout)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
