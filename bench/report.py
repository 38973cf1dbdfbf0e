"""Benchmark: a report over 1,000,000 result rows, next to a bare pandas groupby of the same rows.

Builds a synthetic fleet from the reference tables (92 rows per module, ~10,870 modules, 2 %
noise, one slow module, one 8 % decode regression), then times in the same run:

* bare   ``df.groupby(["model_key", "profile"])[metrics].median()`` (the floor of any analysis);
* report ``analyse(...)``: outliers, fleet vs baseline, summary, verdict (goal: <= 1 s and <= 4x
  the bare groupby of the same run);
* report with the previous run of every module (another 1,000,000 rows);
* Markdown and JSON rendering of the result.

Prints each figure (median and spread of ``--repeat``, bare and report interleaved so that a busy
machine slows both alike) and the ratio to the bare groupby; exits 1 when the goal is missed.

``--scale 10000,100000,1000000,10000000`` instead runs each size in a fresh process and prints
the report's time, the bare groupby's, their ratio and the process's peak RSS (a table for the
README).

``--history 10000,1000000 --side-by-side TREE [--repeat N]`` instead runs ``fleetctl report`` of each size and
``fleetctl trend`` over 100 runs, as fresh processes, of the code in TREE (a checkout of the commit before) and of
this tree, interleaved, and compares their outputs byte for byte (the histories: built by ``--history`` first).

``--history 10000,1000000,3000000 [--db PATH] [--postgresql]`` instead stores runs of those sizes in a run history
(built once, kept at ``--db``, then ``history migrate``) and, for each size, in fresh processes: reads the
run the way the report does now (its column file, ADR 0028), the way it did before (``read_sql_query`` in
chunks, text made categoricals) and the floor (a bare ``pd.read_parquet`` of the same rows), each followed by
the report over what was read; prints read and end-to-end times side by side, the frame and the peak RSS;
then ``fleetctl report`` of each size as a fresh process (imports included), and ``fleetctl trend`` over
100 runs of 10,000 rows. ``--postgresql`` also stores the runs in a PostgreSQL history (a server of the script's
own, tests/support/postgres_server.py) and reads and reports them from there, side by side.

``--power N`` instead measures the verdicts' error rates on N seeds of the acceptance scenario
(6 modules, 2 % noise, one module 0.88x), in one process per core: false regressions and false
outliers with no change (goals: at most 1 in 1,000 and 1 in 100), the detection rate of a decode
regression of 2-12 % (goal: every seed from 6 %; N seeds at 6 %, N/5 at the other sizes), and how
often the change's 95 % interval holds the injected change. Exits 1 below a goal.

``--paired-power N [--rounds 1,2,3]`` instead measures the paired comparison (``fleetctl ab``,
:mod:`controller.report.analysis.paired`): 4 modules, R rounds of A B B A, 2 % noise, each module drifting by a
speed factor per round (3 %) and a trend within the round (1 % per run); release B with a 2 % decode regression on
one key (N seeds at 1.5 % and 2 %; N/5 at 3 %) or none (N seeds): per R and per tolerance (1 %, 1.5 %, 2 %) the
detection rate (goal >= 95 % at 2 %), the false regressions (goal <= 1 in 1,000) and the median minimum detectable
change of decode; and the stated MDC checked: of the seeds whose planted change was at least the MDC stated for its
key, the share named (it claims 95 %). Exits 1 when no R meets both goals at the default tolerance; says the
smallest R that does.

Usage: .venv/bin/python bench/report.py [--rows 1000000] [--repeat 5] [--power 1000] [--scale 10000,...]
       [--history 10000,...] [--paired-power 1000 [--rounds 1,2,3]]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from agent.tables import parse_seed  # noqa: E402
from bench import record  # noqa: E402 - bench/record.py, this script's folder
from contract.records import METRICS  # noqa: E402
from controller.report import analyse  # noqa: E402
from controller.report.render import to_json, to_markdown, verdict_line  # noqa: E402
from controller.report.synth import fleet, rows_frame  # noqa: E402

if TYPE_CHECKING:
    import pandas as pd

T = TypeVar("T")
TARGET_S = 1.0  # report over 1 M rows
TARGET_RATIO = 4.0  # x the bare groupby of the same run


def peak_rss_mib() -> float:
    """This process's peak RSS (VmHWM: of this program only; ``ru_maxrss`` would carry over the
    parent's peak from before the fork)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(fn: Callable[[], T]) -> tuple[float, T]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def interleaved(fns: dict[str, Callable[[], object]], repeat: int) -> dict[str, list[float]]:
    """Each function once per round, rounds repeated: load on the machine hits all of them alike."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            times[k].append(timed(fn)[0])
    return times


def spread(ts: list[float]) -> str:
    return f"{statistics.median(ts):7.3f} s  [{min(ts):.3f}-{max(ts):.3f}]"


def seed_path() -> Path:
    for p in (ROOT.parent / "shared" / "seeds" / "000_29a7ee896c0fa7ef.txt",
              ROOT / "simulator" / "data" / "reference_tables.txt"):
        if p.exists():
            return p
    raise SystemExit("reference document not found")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--power", type=int, default=0, help="measure error rates over this many seeds instead")
    ap.add_argument("--paired-power", type=int, default=0,
                    help="measure the paired comparison's error rates over this many seeds instead")
    ap.add_argument("--rounds", default="1,2,3", help="--paired-power: comma-separated round counts")
    ap.add_argument("--scale", default="", help="comma-separated row counts: one fresh process per size")
    ap.add_argument("--history", default="", help="comma-separated row counts: read from a SQLite history")
    ap.add_argument("--formats", action="store_true", help="--db's run of --rows rows in each column format")
    ap.add_argument("--trigger-cost", type=int, default=0, help="modules written with and without the triggers")
    ap.add_argument("--trend-read", action="store_true", help=argparse.SUPPRESS)  # a --history child
    ap.add_argument("--db", default="/tmp/bench-report-history.sqlite", help="the --history database (reused)")
    ap.add_argument("--postgresql", action="store_true",
                    help="--history: the same runs in a PostgreSQL history too (a server of this script's own)")
    ap.add_argument("--side-by-side", default="", metavar="TREE",
                    help="with --history: fleetctl report and trend of this checkout (the code before) and of this "
                         "one, interleaved (--repeat rounds), on the histories --history built")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a --scale child: JSON out
    ap.add_argument("--read", default="", help=argparse.SUPPRESS)  # a --history child: 'columns', 'sqlite', 'floor'
    args = ap.parse_args()

    if args.scale:
        return scale([int(x) for x in args.scale.split(",")], args.repeat)
    if args.read:
        return read_child(args.db, args.rows, args.read)
    if args.trigger_cost:
        return trigger_cost(args.trigger_cost, args.repeat)
    if args.trend_read:
        return trend_read(Path(args.db))
    if args.formats:
        return formats(Path(args.db), args.rows, args.repeat)
    if args.history and args.side_by_side:
        return side_by_side(Path(args.db), [int(x) for x in args.history.split(",")], Path(args.side_by_side),
                            args.repeat)
    if args.history and args.postgresql:
        from tests.support.postgres_server import postgres_server  # Debian's postgresql 15, a server of our own

        with postgres_server() as pg:
            return history_table(Path(args.db), [int(x) for x in args.history.split(",")], pg.fresh_database())
    if args.history:
        return history_table(Path(args.db), [int(x) for x in args.history.split(",")])
    ref = rows_frame([r for rows in parse_seed(seed_path().read_text(encoding="utf-8")).values() for r in rows])
    if args.power:
        return power(ref, args.power)
    if args.paired_power:
        return paired_power(ref, args.paired_power, [int(x) for x in args.rounds.split(",")])
    if args.one:
        return one(ref, args.rows, args.repeat)
    modules = max(6, round(args.rows / len(ref)))
    t = time.perf_counter()
    cur = fleet(ref, modules=modules, module_factor={"m03": 0.88}, regress={("qwen3", "decode_tps"): 0.08},
                seed=1, run_id="run-b")
    prev = fleet(ref, modules=modules, module_factor={"m03": 0.88}, seed=2, run_id="run-a")
    print(f"rows: {len(cur):,} per run ({modules:,} modules x {len(ref)} rows); built in "
          f"{time.perf_counter() - t:.1f} s")

    metrics = list(METRICS)
    _, rep2 = timed(lambda: analyse(cur, run_id="run-b", baseline=ref, baseline_id="b", previous=prev))
    times = interleaved({
        "bare": lambda: cur.groupby(["model_key", "profile"])[metrics].median(),
        "report": lambda: analyse(cur, run_id="run-b", baseline=ref, baseline_id="b"),
        "previous": lambda: analyse(cur, run_id="run-b", baseline=ref, baseline_id="b", previous=prev),
        "render": lambda: (to_markdown(rep2), to_json(rep2)),
    }, args.repeat)
    bare, rep_t = statistics.median(times["bare"]), statistics.median(times["report"])
    ratios = [r / b for r, b in zip(times["report"], times["bare"], strict=True)]
    print(f"median [min-max] of {args.repeat} interleaved rounds")
    print(f"bare groupby median (7 metrics)        {spread(times['bare'])}   1.0x")
    print(f"report (baseline)                      {spread(times['report'])}  {rep_t / bare:5.1f}x "
          f"(per round {min(ratios):.1f}-{max(ratios):.1f}x)")
    prev_t = statistics.median(times["previous"])
    print(f"report (baseline + previous run)       {spread(times['previous'])}  {prev_t / bare:5.1f}x")
    print(f"markdown + json rendering              {spread(times['render'])}")
    print(f"verdict: {verdict_line(rep2)}")
    ratio = statistics.median(ratios)
    ok = rep_t <= TARGET_S * len(cur) / 1_000_000 and ratio <= TARGET_RATIO
    print(f"goal: report over {len(cur):,} rows <= {TARGET_S * len(cur) / 1_000_000:.2f} s and <= {TARGET_RATIO}x "
          f"the bare groupby: {'met' if ok else 'NOT met'} ({rep_t:.2f} s, {ratio:.1f}x)")
    return 0 if ok else 1


def one(ref: pd.DataFrame, rows: int, repeat: int) -> int:
    """One size, in this process: JSON with times and peak RSS (a --scale child). The frame is in the
    form the run history gives the report (``load.as_read``: text columns as categoricals)."""
    import tracemalloc

    import controller.report.analysis.nulls  # noqa: F401  (scipy.special: imported by the first report, not timed)
    from controller.report.load import as_read

    modules = max(6, round(rows / len(ref)))
    cur = as_read(fleet(ref, modules=modules, module_factor={"m03": 0.88}, regress={("qwen3", "decode_tps"): 0.08},
                        seed=1, run_id="run-b"))
    built = peak_rss_mib()
    metrics = list(METRICS)
    times = interleaved({
        "bare": lambda: cur.groupby(["model_key", "profile"])[metrics].median(),
        "report": lambda: analyse(cur, run_id="run-b", baseline=ref, baseline_id="b"),
    }, repeat)
    # the report's own peak above the frame, once more, untimed (tracemalloc sees numpy's buffers)
    tracemalloc.start()
    analyse(cur, run_id="run-b", baseline=ref, baseline_id="b")
    own = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    print(json.dumps({"rows": len(cur), "bare": statistics.median(times["bare"]), "own_mib": own,
                      "report": statistics.median(times["report"]),
                      "ratios": [r / b for r, b in zip(times["report"], times["bare"], strict=True)],
                      "frame_mib": float(cur.memory_usage(deep=True).sum()) / 2**20, "built_rss_mib": built,
                      "peak_rss_mib": peak_rss_mib()}))
    return 0


def scale(sizes: list[int], repeat: int) -> int:
    print("| rows | report | bare groupby | ratio (min-max) | frame | report's own peak (tracemalloc) | "
          "peak RSS (after building the frame) |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for n in sizes:
        out = subprocess.run([sys.executable, __file__, "--one", "--rows", str(n), "--repeat",
                              str(repeat if n < 5_000_000 else min(repeat, 2))],
                             capture_output=True, text=True, check=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        print(f"| {r['rows']:,} | {r['report']:.3f} s | {r['bare']:.3f} s | {r['report'] / r['bare']:.1f}x "
              f"({min(r['ratios']):.1f}-{max(r['ratios']):.1f}) | {r['frame_mib']:.0f} MiB | "
              f"{r['own_mib']:,.0f} MiB ({r['own_mib'] * 2**20 / r['rows']:.0f} B/row) | "
              f"{r['peak_rss_mib']:.0f} MiB ({r['built_rss_mib']:.0f}) |", flush=True)
    return 0


def _run_id(rows: int) -> str:
    return f"bench-{rows}"


def stored_values(df: pd.DataFrame) -> list[tuple[Any, ...]]:
    """A synthetic frame's rows as the history stores them, whichever its engine (``History.upsert_row_values``):
    NaN as NULL, ``correct`` as 0/1."""
    import pandas as pd

    from controller.history import ROW_FIELDS

    df = df[list(ROW_FIELDS)].astype(object).where(df[list(ROW_FIELDS)].notna(), None)
    df["correct"] = pd.Series([None if c is None else int(c) for c in df["correct"]], index=df.index, dtype=object)
    return list(df.itertuples(index=False, name=None))


def fill_history(db: str | Path, ref: pd.DataFrame, sizes: list[int], runs: int = 1, prefix: str = "bench") -> None:
    """``runs`` ended runs of each size in the history at ``db`` (a SQLite path or a PostgreSQL URL: rows written as
    stored values, ``History.upsert_row_values``; pydantic records of 10 M rows would take longer than the reads
    measured); with ``runs`` > 1 each run is of its own release (a trend's series)."""
    from controller.history import History

    h = History(db)
    try:
        for n in sizes:
            for k in range(runs):
                run_id = _run_id(n) if runs == 1 else f"{prefix}-{n}-{k:03d}"
                h.create_run(run_id, release="1.4.2" if runs == 1 else f"1.{k}.0", state="done")
                if h.row_count(run_id):
                    continue
                modules = max(6, round(n / len(ref)))
                t = time.perf_counter()
                step = 10_000  # modules per batch: bounded memory while filling
                for first in range(0, modules, step):
                    names = [f"m{i:05d}" for i in range(first, min(modules, first + step))]
                    df = fleet(ref, modules=names, module_factor={"m00003": 0.88},
                               regress={("qwen3", "decode_tps"): 0.08}, seed=first + 1000 * k, run_id=run_id)
                    h.upsert_row_values(stored_values(df))
                if runs == 1 or k == runs - 1:
                    print(f"stored {run_id}: {modules * len(ref):,} rows in {time.perf_counter() - t:.0f} s",
                          flush=True)
        t = time.perf_counter()
        done = h.migrate_columns()
        print(f"fleetctl history migrate: {done.written} run(s) written, {done.current} current "
              f"in {time.perf_counter() - t:.1f} s", flush=True)
    finally:
        h.close()


def _parquet_floor(db: Path, run_id: str) -> Path:
    """The run's rows as a plain Parquet file (pyarrow's defaults), for the floor: a bare read of the same rows."""
    from controller.history import History

    out = db.with_name(f"{db.name}.floor-{run_id}.parquet")
    if not out.exists():
        h = History(db)
        h.row_frame([run_id]).to_parquet(out)  # the same rows the report reads
        h.close()
    return out


def read_child(db: str, rows: int, how: str) -> int:
    """Read one run (``how``: 'columns', the history as the report reads it now; 'sqlite', as it read it before
    (``read_sql_query`` in chunks, text made categoricals); 'floor', a bare ``pd.read_parquet`` of the same
    rows), then the report over it: JSON out."""
    import pandas as pd

    import controller.report.analysis.nulls  # noqa: F401  (scipy.special: imported by the first report, not timed)
    from controller.history import ROW_FIELDS, History
    from controller.report.load import _compact, concat_compact, read_rows

    ref = rows_frame([r for rs in parse_seed(seed_path().read_text(encoding="utf-8")).values() for r in rs])
    run_id = _run_id(rows)
    floor = _parquet_floor(Path(db), run_id) if how == "floor" else None
    base_rss = peak_rss_mib()
    h = History(db)
    t = time.perf_counter()
    if how == "sqlite":
        cols = ", ".join(f'"{f}"' for f in ROW_FIELDS)
        chunks = pd.read_sql_query(f"SELECT {cols} FROM rows WHERE run_id=?", h.conn, params=[run_id],
                                   chunksize=50_000)
        cur = concat_compact((_compact(c) for c in chunks if len(c)), ROW_FIELDS)
    elif how == "floor":
        cur = pd.read_parquet(floor)
    else:
        cur = read_rows(h, [run_id])
    read_s = time.perf_counter() - t
    read_rss = peak_rss_mib()
    t = time.perf_counter()
    rep = analyse(cur, run_id=run_id, baseline=ref, baseline_id="b")
    report_s = time.perf_counter() - t
    print(json.dumps({"rows": len(cur), "read": read_s, "report": report_s, "base_rss_mib": base_rss,
                      "frame_mib": float(cur.memory_usage(deep=True).sum()) / 2**20, "read_rss_mib": read_rss,
                      "peak_rss_mib": peak_rss_mib(), "verdict": rep.verdict}))
    return 0


def _timed_process(argv: list[str], timeout: float = 600) -> tuple[float, float, int]:
    """``argv`` as a fresh process: (wall seconds, its peak RSS in MiB, exit code; 124 when killed at ``timeout``).
    The peak is GNU time's (``ru_maxrss`` of a forked child would count this process's pages from before its
    exec)."""
    import tempfile

    with tempfile.NamedTemporaryFile("r") as rss:
        t = time.perf_counter()
        try:
            code = subprocess.run(["/usr/bin/time", "-q", "-f", "%M", "-o", rss.name, *argv], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            return time.perf_counter() - t, float("nan"), 124
        wall = time.perf_counter() - t
        return wall, int(rss.read().split()[-1]) / 1024, code


def _cli(*args: str, timeout: float = 600) -> tuple[float, float, int]:
    """``fleetctl ARGS`` as a fresh process (process start and imports included)."""
    return _timed_process([str(Path(sys.executable).with_name("fleetctl")), *args], timeout)


def history_table(db: Path, sizes: list[int], pg: str | None = None, trend_runs: int = 100,
                  trend_rows: int = 10_000) -> int:
    """Each size read and reported in fresh processes: the history now, before (SQLite), and the floor; on
    PostgreSQL too when ``pg`` (a database's URL) is given; then ``fleetctl report`` end to end (process start
    and imports included) on each engine, and a trend over ``trend_runs`` runs (SQLite)."""
    ref = rows_frame([r for rs in parse_seed(seed_path().read_text(encoding="utf-8")).values() for r in rs])
    fill_history(db, ref, sizes)
    histories = {"SQLite": str(db)}
    if pg:
        fill_history(pg, ref, sizes)
        histories["PostgreSQL"] = pg
    print(f"{db}: {db.stat().st_size / 2**20:,.0f} MiB. A fresh process per cell; peak RSS of the process "
          "(in brackets: after the read, before the report)")
    print("| rows | read: now (column file) | read: before (SQLite, chunks) | floor: pd.read_parquet | now / floor "
          "| read + report: now / floor | frame | peak RSS now (after read) / floor | peak / frame |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    ok, base = True, 0.0
    goals: list[tuple[str, bool, str]] = []
    on_pg: dict[int, dict[str, Any]] = {}
    floors: dict[int, float] = {}
    for n in sizes:
        got = {}
        reads = [("columns", str(db)), ("sqlite", str(db)), ("floor", str(db))] + ([("pg", pg)] if pg else [])
        for how, where in reads:  # side by side, each in its own process
            out = subprocess.run([sys.executable, __file__, "--read", "columns" if how == "pg" else how,
                                  "--rows", str(n), "--db", where], capture_output=True, text=True, check=True).stdout
            got[how] = json.loads(out.strip().splitlines()[-1])
        if pg:
            p, fl = got["pg"], got["floor"]
            on_pg[n] = p
            ok &= p["verdict"] == fl["verdict"]
            goals.append((f"read of {n:,} rows from PostgreSQL <= 2x the floor", p["read"] <= 2 * fl["read"],
                          f"{p['read']:.3f} s, {p['read'] / fl['read']:.2f}x"))
        a, b, f = got["columns"], got["sqlite"], got["floor"]
        floors[n] = f["read"]
        ok &= a["verdict"] == b["verdict"] == f["verdict"]
        goals.append((f"read of {n:,} rows <= 2x the floor", a["read"] <= 2 * f["read"],
                      f"{a['read']:.3f} s, {a['read'] / f['read']:.2f}x"))
        base = a["base_rss_mib"]
        print(f"| {a['rows']:,} | {a['read']:.3f} s | {b['read']:.2f} s | {f['read']:.3f} s | "
              f"{a['read'] / f['read']:.2f}x | {a['read'] + a['report']:.2f} s / {f['read'] + f['report']:.2f} s "
              f"({(a['read'] + a['report']) / (f['read'] + f['report']):.2f}x) | {a['frame_mib']:,.0f} MiB | "
              f"{a['peak_rss_mib']:,.0f} ({a['read_rss_mib']:,.0f}) / {f['peak_rss_mib']:,.0f} MiB | "
              f"{(a['peak_rss_mib'] - base) / a['frame_mib']:.1f}x above the interpreter "
              f"({a['peak_rss_mib'] / a['frame_mib']:.1f}x whole) |", flush=True)
    print(f"(the interpreter with the report's imports, before any read: {base:,.0f} MiB)")
    if pg:
        print("\nthe same runs in a PostgreSQL history (a server of this script's own, fsync off; column files kept in"
              " the database, ADR 0031), read as the report reads them, in fresh processes:")
        print("| rows | read: PostgreSQL | floor: pd.read_parquet | PostgreSQL / floor | read + report | peak RSS "
              "(after read) | peak / frame |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for n, a in on_pg.items():
            print(f"| {a['rows']:,} | {a['read']:.3f} s | {floors[n]:.3f} s | {a['read'] / floors[n]:.2f}x | "
                  f"{a['read'] + a['report']:.2f} s | {a['peak_rss_mib']:,.0f} ({a['read_rss_mib']:,.0f}) MiB | "
                  f"{(a['peak_rss_mib'] - a['base_rss_mib']) / a['frame_mib']:.1f}x above the interpreter |",
                  flush=True)
    imports, _, _ = _cli_imports()
    floor_imports = statistics.median(_timed_process([sys.executable, "-c", "import pandas, pyarrow"])[0]
                                      for _ in range(3))
    print(f"\n`fleetctl report RUN` end to end, a fresh process each (3 in a row, median); the report's imports "
          f"alone (python -c '{REPORT_IMPORTS}'): {imports:.2f} s; python + pandas + pyarrow alone: "
          f"{floor_imports:.2f} s")
    print("the floor end to end: a fresh process of python, pandas and pyarrow reading the same rows from Parquet "
          f"and taking a bare groupby median (`python -c '{FLOOR_SCRIPT}' FILE`), interleaved with the reports")
    print("| rows | history | fleetctl report | floor end to end | report / floor | peak RSS: report / floor |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    for n in sizes:
        floor_argv = [sys.executable, "-c", FLOOR_SCRIPT, str(_parquet_floor(db, _run_id(n)))]
        for engine, where in histories.items():
            runs, bare = [], []
            for _ in range(3):
                runs.append(_cli("--history", where, "report", _run_id(n)))
                bare.append(_timed_process(floor_argv))
            ok &= all(r[2] == 0 for r in runs + bare)
            wall, fl = statistics.median(r[0] for r in runs), statistics.median(r[0] for r in bare)
            print(f"| {n:,} | {engine} | {wall:.2f} s [{min(r[0] for r in runs):.2f}-{max(r[0] for r in runs):.2f}] | "
                  f"{fl:.2f} s [{min(r[0] for r in bare):.2f}-{max(r[0] for r in bare):.2f}] | {wall / fl:.2f}x | "
                  f"{max(r[1] for r in runs):,.0f} / {max(r[1] for r in bare):,.0f} MiB |", flush=True)
            if n == 1_000_000:
                goals.append((f"fleetctl report of 1,000,000 rows <= 1 s end to end ({engine})", wall <= 1.0,
                              f"{wall:.2f} s, of which the imports alone {imports:.2f} s"))
                goals.append((f"fleetctl report of 1,000,000 rows <= 2x the floor end to end ({engine})",
                              wall <= 2 * fl, f"{wall:.2f} s, {wall / fl:.2f}x the floor's {fl:.2f} s"))
    trend_db = db.with_name(db.stem + "-trend" + db.suffix)
    fill_history(trend_db, ref, [trend_rows], runs=trend_runs, prefix="trend")
    print(f"\na trend over {trend_runs} runs of {trend_rows:,} rows (each its own release), a fresh process each:")
    read_argv = [sys.executable, __file__, "--trend-read", "--db", str(trend_db)]
    print("the trend's read alone (history_frames, in-process, imports excluded): "
          + subprocess.run(read_argv, capture_output=True, text=True, check=True).stdout.strip(), flush=True)
    wall, rss, code = _cli("--history", str(trend_db), "trend", "-m", "qwen3", "--metric", "decode_tps", timeout=60)
    print("fleetctl trend -m qwen3 --metric decode_tps (read + change points): "
          + ("> 60 s (killed)" if code == 124 else f"{wall:.2f} s, peak RSS {rss:,.0f} MiB, exit {code}"), flush=True)
    goals.append((f"a trend over {trend_runs} runs of {trend_rows:,} rows <= 1 s", code == 0 and wall <= 1.0,
                  "> 60 s" if code == 124 else f"{wall:.2f} s"))
    print()
    for what, met, figure in goals:
        print(f"goal: {what}: {'met' if met else 'NOT met'} ({figure})")
    ok &= all(met for _, met, _ in goals)
    return 0 if ok else 1


def side_by_side(db: Path, sizes: list[int], before: Path, repeat: int) -> int:
    """``fleetctl report`` of each size and ``fleetctl trend`` over 100 runs as fresh processes, of the code in
    ``before`` (a checkout of the commit before, found first on PYTHONPATH) and of this tree, interleaved round by
    round (a busy machine slows both alike), with their outputs compared byte for byte; exits 1 on a difference."""
    import os

    trend_db = db.with_name(db.stem + "-trend" + db.suffix)
    if not db.exists() or not trend_db.exists():
        raise SystemExit(f"{db} and {trend_db}: build them first (bench/report.py --history ... --db {db})")
    cmds = {f"fleetctl report of {n:,} rows": ["--history", str(db), "report", _run_id(n), "-o", "json"]
            for n in sizes}
    cmds["fleetctl trend -m qwen3 --metric decode_tps (100 runs x 10 k rows)"] = [
        "--history", str(trend_db), "trend", "-m", "qwen3", "--metric", "decode_tps", "-o", "json"]
    code = "import sys; from controller.cli.app import main; sys.argv[0] = 'fleetctl'; sys.exit(main())"
    trees = {"before": before.resolve(), "now": ROOT}

    def run(tree: Path, args: list[str]) -> tuple[float, float, bytes, float]:
        """(wall s, peak RSS MiB, stdout, CPU s: user + system, which other sessions' load does not stretch)."""
        env = {**os.environ, "PYTHONPATH": str(tree)}
        with __import__("tempfile").NamedTemporaryFile("r") as rss:
            t = time.perf_counter()
            out = subprocess.run(["/usr/bin/time", "-q", "-f", "%M %U %S", "-o", rss.name, sys.executable, "-c", code,
                                  *args], capture_output=True, env=env, cwd=tree,  # cwd: first on sys.path
                                 check=True).stdout
            wall = time.perf_counter() - t
            peak, user, system = rss.read().split()[-3:]
            return wall, int(peak) / 1024, out, float(user) + float(system)

    print(f"before: {trees['before']} (git {_head(trees['before'])}); now: {ROOT} (git {_head(ROOT)}); "
          f"{repeat} interleaved rounds after one untimed, fresh processes, median [min-max]")
    print("| command | wall: before | now | now / before | CPU (user + sys): before | now | now / before "
          "| peak RSS before / now | output |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    ok = True
    for what, args in cmds.items():
        for tree in trees.values():
            run(tree, args)  # untimed: bytecode written, files in the page cache
        got: dict[str, list[tuple[float, float, bytes, float]]] = {k: [] for k in trees}
        for _ in range(repeat):
            for k, tree in trees.items():
                got[k].append(run(tree, args))
        same = len({r[2] for rs in got.values() for r in rs}) == 1
        ok &= same
        wall = {k: [r[0] for r in rs] for k, rs in got.items()}
        cpu = {k: [r[3] for r in rs] for k, rs in got.items()}
        med = {k: statistics.median(v) for k, v in wall.items()}
        cmed = {k: statistics.median(v) for k, v in cpu.items()}
        print(f"| {what} | {spread(wall['before']).strip()} | {spread(wall['now']).strip()} | "
              f"{med['now'] / med['before']:.2f}x | {spread(cpu['before']).strip()} | {spread(cpu['now']).strip()} | "
              f"{cmed['now'] / cmed['before']:.2f}x | {max(r[1] for r in got['before']):,.0f} / "
              f"{max(r[1] for r in got['now']):,.0f} MiB | {'identical' if same else 'DIFFERENT'} |", flush=True)
    return 0 if ok else 1


def _head(tree: Path) -> str:
    return subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()


def formats(db: Path, rows: int, repeat: int) -> int:
    """The column file's format chosen by measurement (ADR 0028): a run's rows written and read back into the
    report's frame (text as sorted categoricals) as Parquet and as Arrow IPC, each compression; interleaved."""
    import pyarrow as pa
    import pyarrow.ipc as ipc
    import pyarrow.parquet as pq

    from controller.history import History
    from controller.history.columns import TEXT_FIELDS, frame

    h = History(db)
    table = h._run_table(_run_id(rows))  # the run's rows as the history keeps them column-wise
    h.close()
    folder = db.with_name(db.name + ".formats")
    folder.mkdir(exist_ok=True)

    def ipc_write(path: Path, compression: str | None) -> None:
        with pa.OSFile(str(path), "wb") as sink, ipc.new_file(
                sink, table.schema, options=ipc.IpcWriteOptions(compression=compression)) as w:
            w.write_table(table, max_chunksize=table.num_rows)

    def ipc_read(path: Path) -> object:
        return frame([ipc.open_file(pa.py_buffer(path.read_bytes())).read_all()])

    def pq_read(path: Path) -> object:
        return frame([pq.read_table(path, read_dictionary=list(TEXT_FIELDS)).cast(table.schema)])

    cands: dict[str, tuple[Callable[[Path], object], Callable[[Path], object]]] = {
        "parquet snappy": (lambda p: pq.write_table(table, p), pq_read),
        "parquet zstd": (lambda p: pq.write_table(table, p, compression="zstd"), pq_read),
        "arrow ipc uncompressed": (lambda p: ipc_write(p, None), ipc_read),
        "arrow ipc lz4": (lambda p: ipc_write(p, "lz4"), ipc_read),
        "arrow ipc zstd": (lambda p: ipc_write(p, "zstd"), ipc_read),
    }
    paths = {k: folder / k.replace(" ", "_") for k in cands}
    writes = interleaved({k: partial(cands[k][0], paths[k]) for k in cands}, repeat)
    reads = interleaved({k: partial(cands[k][1], paths[k]) for k in cands}, repeat)
    print(f"{table.num_rows:,} rows, {repeat} interleaved rounds (median [min-max]); read = file to the report's frame")
    print("| format | size | write | read |")
    print("| --- | ---: | ---: | ---: |")
    for k in cands:
        print(f"| {k} | {paths[k].stat().st_size / 2**20:.1f} MiB | {spread(writes[k])} | {spread(reads[k])} |")
    return 0


def trend_read(db: Path) -> int:
    """The rows of every run as ``fleetctl trend`` reads them (3 times; the first one cold): times out."""
    from controller.history import History
    from controller.report.load import history_frames

    h = History(db)
    times = []
    for _ in range(3):
        t = time.perf_counter()
        rows, runs = history_frames(h)
        times.append(time.perf_counter() - t)
    print(f"{len(rows):,} rows of {len(runs)} runs read in {' / '.join(f'{x:.2f} s' for x in times)}")
    return 0


def trigger_cost(modules: int, repeat: int) -> int:
    """What the row-generation triggers (ADR 0028) add to writing rows: ``modules`` x the seed's rows inserted with
    ``executemany`` (50 modules a transaction) into a fresh history with and without the triggers, interleaved."""
    import tempfile

    from controller.history import ROW_FIELDS, History

    ref = rows_frame([r for rs in parse_seed(seed_path().read_text(encoding="utf-8")).values() for r in rs])
    df = fleet(ref, modules=[f"m{i:05d}" for i in range(modules)], seed=1, run_id="w")
    data = list(df.astype({"correct": object}).where(df.notna(), None)[list(ROW_FIELDS)]
                .itertuples(index=False, name=None))
    sql = f"INSERT OR REPLACE INTO rows VALUES ({','.join('?' * len(ROW_FIELDS))})"
    batch = len(ref) * 50

    def write(triggers: bool) -> None:
        with tempfile.TemporaryDirectory() as d:
            h = History(Path(d) / "h.sqlite")
            if not triggers:
                h.conn.executescript("DROP TRIGGER rows_generation_insert; DROP TRIGGER rows_generation_delete;"
                                     " DROP TRIGGER rows_generation_update;")
            for i in range(0, len(data), batch):
                with h.tx() as c:
                    c.executemany(sql, data[i:i + batch])
            h.close()

    times = interleaved({"with triggers": lambda: write(True), "without": lambda: write(False)}, repeat)
    w, wo = statistics.median(times["with triggers"]), statistics.median(times["without"])
    print(f"{len(data):,} rows written, {repeat} interleaved rounds: with the triggers {spread(times['with triggers'])}"
          f", without {spread(times['without'])}: {w / wo:.2f}x ({(w - wo) / len(data) * 1e6:.1f} µs a row)")
    return 0


# what fleetctl report imports before it reads (the null distributions' scipy.special among them; no scipy.stats)
REPORT_IMPORTS = "import controller.cli.app, controller.report.load, controller.report.analysis.nulls"


# the floor of a report end to end: python, pandas and pyarrow, a bare read of the rows and a bare groupby
FLOOR_SCRIPT = ("import sys, pandas as pd; df = pd.read_parquet(sys.argv[1]); "
                f"df.groupby(['model_key', 'profile'], observed=True)[{list(METRICS)!r}].median()")


def _cli_imports() -> tuple[float, float, int]:
    return _timed_process([sys.executable, "-c", REPORT_IMPORTS])


POWER_SIZES = (0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.10, 0.12)  # decode regressions of the detection curve
GOAL_SIZE = 0.06  # detected in every seed from this size on


def _power_case(args: tuple[int, float]) -> tuple[float, int, bool, bool, bool, bool]:
    """One seed of the acceptance scenario (6 modules, 2 % noise, m03 0.88x), with a decode regression of
    ``size`` on one key (0: none): (size, seed, any regression, outliers not exactly [m03], that regression
    named, its change's 95 % interval holds the injected change)."""
    seed, size = args
    ref = _POWER_REF
    keys = sorted(set(ref["model_key"]))
    key = keys[seed % len(keys)]
    regress = {(key, "decode_tps"): size} if size else None
    rep = analyse(fleet(ref, module_factor={"m03": 0.88}, regress=regress, seed=(10_000 if size else 0) + seed),
                  baseline=ref)
    named = [(r.module, r.model_key, r.profile, r.metric) for r in rep.regressions]
    wrong_out = [o.module for o in rep.outliers] != ["m03"]
    hit = ("*", key, "*", "decode_tps") in named
    (ch,) = [c for c in rep.changes if (c.model_key, c.metric) == (key, "decode_tps")]
    covered = ch.ci_low is not None and ch.ci_high is not None and ch.ci_low <= -size <= ch.ci_high
    return size, seed, bool(rep.regressions), wrong_out, hit, covered


_POWER_REF: Any = None  # the reference frame, set once per worker process


def _power_init(ref: pd.DataFrame) -> None:
    global _POWER_REF
    _POWER_REF = ref
    from scipy import stats  # noqa: F401  (loaded once per worker)


def power(ref: pd.DataFrame, seeds: int) -> int:
    """False alarms over ``seeds`` no-change seeds; detection of a decode regression over sizes 2-12 %
    (``seeds`` at the goal's 6 %, a fifth of them at each other size; the key rotates with the seed), and how
    often the change's 95 % interval holds the injected change. In processes, one per core."""
    import multiprocessing as mp
    import os

    cases = [(s, 0.0) for s in range(seeds)]
    for size in POWER_SIZES:
        cases += [(s, size) for s in range(seeds if size == GOAL_SIZE else max(seeds // 5, 1))]
    t = time.perf_counter()
    with mp.get_context("fork").Pool(os.cpu_count() or 1, initializer=_power_init, initargs=(ref,)) as pool:
        out = pool.map(_power_case, cases, chunksize=20)
    wall = time.perf_counter() - t
    print(f"{len(cases):,} reports (acceptance scenario: 6 modules, 2 % noise, m03 0.88x) in {wall:.0f} s "
          f"on {os.cpu_count()} processes ({wall / len(cases) * (os.cpu_count() or 1) * 1000:.0f} ms each)")
    none = [o for o in out if o[0] == 0.0]
    false_reg = sum(o[2] for o in none)
    false_out = sum(o[3] for o in none)
    print(f"no change, {len(none):,} seeds: false regressions {false_reg} ({false_reg / len(none):.2%}, goal <= 0.1 %);"
          f" runs whose outliers are not exactly [m03] {false_out} ({false_out / len(none):.2%}, goal <= 1 %)")
    print("| decode regression | seeds | named | detection | other findings | 95 % interval holds it |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    ok = false_reg * 1000 <= len(none) and false_out * 100 <= len(none)
    for size in POWER_SIZES:
        got = [o for o in out if o[0] == size]
        hits = sum(o[4] for o in got)
        cover = sum(o[5] for o in got)
        extra = sum(o[3] for o in got)
        print(f"| {size:.0%} | {len(got):,} | {hits:,} | {hits / len(got):.1%} | outliers off in {extra} | "
              f"{cover / len(got):.1%} |")
        if size >= GOAL_SIZE and hits < len(got):
            ok = False
    print(f"goals (false regressions <= 1/1000, false outliers <= 1/100, detection 100 % from {GOAL_SIZE:.0%}): "
          f"{'met' if ok else 'NOT met'}")
    return 0 if ok else 1


PAIRED_SIZES = (0.015, 0.02, 0.03)  # planted decode regressions of release B
PAIRED_GOAL_SIZE = 0.02
PAIRED_FULL_SIZES = (0.015, 0.02)  # N seeds each (the goal's size, and one near the stated MDC); N/5 the others
PAIRED_TOLERANCES = (0.01, 0.015, 0.02)


def _paired_case(args: tuple[int, int, float]) -> tuple[int, float, int, list[tuple[bool, bool]], float]:
    """One seed of the paired scenario: (rounds, size, seed, per tolerance (any regression, the planted one
    named), decode's minimum detectable change at the default tolerance on the planted key)."""
    from controller.report.analysis.paired import paired_compare, paired_thresholds
    from controller.report.analysis.verdict import key_status
    from controller.report.model import DERIVED, PairedRun
    from controller.report.synth import paired_fleet

    rounds, seed, size = args
    ref = _POWER_REF
    keys = sorted(set(ref["model_key"]))
    key = keys[seed % len(keys)]
    rows, runs = paired_fleet(ref, modules=4, rounds=rounds, regress={(key, "decode_tps"): size} if size else None,
                              seed=(1_000_000 if size else 0) + 1000 * rounds + seed)
    rep = paired_compare(rows, [PairedRun(run_id=r, arm=a, round=n) for r, a, n in runs],
                         release_a="A", release_b="B")
    per_tol = []
    for tol in PAIRED_TOLERANCES:
        th = paired_thresholds(tol)
        reg = {(c.model_key, c.metric) for c in rep.changes
               if key_status(c.metric, c.change, c.p_value, th) == "regressed" and c.metric not in DERIVED}
        per_tol.append((bool(reg), (key, "decode_tps") in reg))
    (dec,) = [c for c in rep.changes if (c.model_key, c.metric) == (key, "decode_tps")]
    return rounds, size, seed, per_tol, float("nan") if dec.mdc is None else dec.mdc


def paired_power(ref: pd.DataFrame, seeds: int, rounds: list[int]) -> int:
    """The paired comparison's false regressions (``seeds`` no-change seeds) and detection of a planted decode
    regression (``seeds`` at 2 %, a fifth at 1.5 % and 3 %), per round count and tolerance."""
    import math
    import multiprocessing as mp
    import os

    from controller.report.analysis.paired import PAIRED_TOLERANCE

    cases = []
    for r in rounds:
        cases += [(r, s, 0.0) for s in range(seeds)]
        for size in PAIRED_SIZES:
            cases += [(r, s, size) for s in range(seeds if size in PAIRED_FULL_SIZES else max(seeds // 5, 1))]
    t = time.perf_counter()
    with mp.get_context("fork").Pool(os.cpu_count() or 1, initializer=_power_init, initargs=(ref,)) as pool:
        out = pool.map(_paired_case, cases, chunksize=10)
    wall = time.perf_counter() - t
    print(f"{len(cases):,} paired comparisons (4 modules, A B B A rounds, 2 % noise, module drift 3 % per round and "
          f"1 % per run) in {wall:.0f} s on {os.cpu_count()} processes")
    print("| rounds | tolerance | false regressions (no change) | detection 1.5 % | detection 2 % | detection 3 % "
          "| median MDC of decode |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    smallest = None
    checks: list[str] = []
    for r in rounds:
        mine = [o for o in out if o[0] == r]
        mdcs = sorted(o[4] for o in mine if o[1] == 0.0 and not math.isnan(o[4]))
        mdc = mdcs[len(mdcs) // 2] if mdcs else float("nan")
        for j, tol in enumerate(PAIRED_TOLERANCES):
            none = [o for o in mine if o[1] == 0.0]
            false_reg = sum(o[3][j][0] for o in none)
            det = {}
            for size in PAIRED_SIZES:
                got = [o for o in mine if o[1] == size]
                det[size] = (sum(o[3][j][1] for o in got), len(got))
            hits, n = det[PAIRED_GOAL_SIZE]
            ok = false_reg * 1000 <= len(none) and hits * 100 >= 95 * n
            if ok and tol == PAIRED_TOLERANCE and smallest is None:
                smallest = r
            cols = " | ".join(f"{h / max(m, 1):.1%} ({h}/{m})" for h, m in det.values())
            print(f"| {r} | {tol:.1%} | {false_reg} / {len(none):,} | {cols} | "
                  f"{mdc:.2%} (at {PAIRED_TOLERANCE:.0%}) |")
        # the stated minimum detectable change checked: of the seeds whose planted change was at least the MDC
        # stated for its key (at the default tolerance), how many named it (it claims >= 95 %)
        j = PAIRED_TOLERANCES.index(PAIRED_TOLERANCE)
        for size in PAIRED_SIZES:
            within = [o for o in mine if o[1] == size and not math.isnan(o[4]) and o[4] <= size]
            named = sum(o[3][j][1] for o in within)
            checks.append(f"| {r} | {size:.1%} | {len(within)} of {sum(o[1] == size for o in mine)} | "
                          f"{named / max(len(within), 1):.1%} ({named}/{len(within)}) |")
    print(f"the minimum detectable change checked (tolerance {PAIRED_TOLERANCE:.0%}): of the seeds whose planted "
          "change was at least the MDC stated for its key, the share named (goal >= 95 %)")
    print("| rounds | planted | seeds with MDC <= planted | named |")
    print("| ---: | ---: | ---: | ---: |")
    print("\n".join(checks))
    print(f"goals at the default tolerance {PAIRED_TOLERANCE:.0%} (a 2 % decode regression named in >= 95 % of seeds, "
          f"<= 1 false regression in 1,000): " + (f"met from {smallest} round(s) on" if smallest else "NOT met"))
    return 0 if smallest else 1


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
