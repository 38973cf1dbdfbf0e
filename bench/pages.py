"""The run browser's pages (issue 52) against the API's JSON for the same data, from a history of 10,000 runs.

A history built once under ``--dir`` (kept; ``--rebuild`` builds it again): ``--runs`` ended runs (10,000), each on
2 of ``--modules`` modules (8) with 2 model keys (qwen3, qwen35: 44 rows a run, through the history's bulk insert),
10 runs a release (1,000 releases, qwen3's decode 10 % slower from 60 % of them on: a change point), every 7th run
regressed, four users, one run every 10 minutes (70 days), each module's progress and a dispatch event per run;
then the change points computed and kept once (what ``fleetctl serve`` keeps: the pages read them, never search).

Measured: the HTTP API of ``fleetctl serve`` (uvicorn in a thread, as the daemon starts it; embedded broker) on
loopback, each page and its JSON counterpart fetched in turn, ``--rounds`` times (first round not counted: imports
and caches), the whole request as a client sees it (urllib, one connection a request). Acceptance: every page
under 200 ms (its slowest round). And the live poll's split (ADR 0049): a poll of a running run's page, against
the service call it makes alone, the part an SSE stream (one connection kept) would save per tick.

    .venv/bin/python bench/pages.py [--dir /tmp/pages-bench] [--runs 10000] [--rounds 20] [--rebuild]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import record  # noqa: E402 - bench/record.py, this script's folder

TOKEN = "bench-admin-token-0123456789abcdef"
USERS = ("ada", "tom", "rita", "ci")
KEYS = ("qwen3", "qwen35")
BUDGET_MS = 200.0


def build(folder: Path, runs: int, modules: int, per_release: int = 10) -> Path:
    import numpy as np

    from bench.judge_cost import reference, store  # bench/judge_cost.py: the seed's rows, the bulk insert
    from contract.records import RunProgress, RunState
    from controller.history import History
    from controller.report.synth import fleet

    path = folder / f"pages{runs}.sqlite"
    if path.exists():
        return path
    t = time.perf_counter()
    ref = reference()
    ref = ref[ref["model_key"].astype(str).isin(KEYS)].reset_index(drop=True)
    tmp = folder / f"pages{runs}.building.sqlite"
    h = History(tmp)
    names = [f"m{i:02d}" for i in range(modules)]
    releases = (runs + per_release - 1) // per_release
    slower_from = int(releases * 0.6)
    start = time.time() - runs * 600
    step = 200
    for first in range(0, runs, step):
        ids = list(range(first, min(runs, first + step)))
        df = fleet(ref, modules=[f"x{i}" for i in range(len(ids) * 2)], seed=first)
        which = np.repeat(np.arange(len(ids) * 2), len(ref))
        run_of = np.array(ids)[which // 2]
        df["run_id"] = [f"run-{k:05d}" for k in run_of]
        df["module"] = [names[(2 * k + j) % modules] for k, j in zip(run_of, which % 2, strict=True)]
        slow = (df["model_key"].astype(str) == "qwen3").to_numpy() & (run_of // per_release >= slower_from)
        df.loc[slow, "decode_tps"] = df.loc[slow, "decode_tps"] * 0.9
        df["release"] = [f"1.{k // per_release}.0" for k in run_of]
        progress = []
        for k in ids:
            rid, rel = f"run-{k:05d}", f"1.{k // per_release}.0"
            mods = [names[(2 * k) % modules], names[(2 * k + 1) % modules]]
            h.create_run(rid, release=rel, models=KEYS, modules=mods, state="done")
            at = start + k * 600
            progress += [RunProgress(run_id=rid, module=m, release=rel, state=RunState.DONE, step="done",
                                     keys_total=2, keys_done=2, progress=1.0, rows=22, updated_at=at + 300,
                                     started_at=at + 5, finished_at=at + 300) for m in mods]
        store(h, df)
        h.upsert_progress_many(progress)
        with h.tx() as c:
            c.executemany("UPDATE runs SET created_at=?, finished_at=?, started_by=?, verdict=?, verdict_line=?"
                          " WHERE run_id=?",
                          [(start + k * 600, start + k * 600 + 300, USERS[k % 4],
                            "regressed" if k % 7 == 0 else "pass",
                            f"{'REGRESSED' if k % 7 == 0 else 'PASS'} run-{k:05d}", f"run-{k:05d}") for k in ids])
            c.executemany("INSERT INTO events (run_id, module, ts, message) VALUES (?,?,?,?)",
                          [(f"run-{k:05d}", names[(2 * k) % modules], start + k * 600, "dispatched") for k in ids])
    stored = time.perf_counter() - t
    h.migrate_columns()
    from controller.report.kept import keep_findings

    t2 = time.perf_counter()
    kept = keep_findings(h)
    h.close()
    for suffix in ("", ".columns"):
        if Path(f"{tmp}{suffix}").exists():
            Path(f"{tmp}{suffix}").rename(f"{path}{suffix}")
    print(f"built {path.name}: {runs:,} runs, {releases:,} releases, {modules} modules; stored in {stored:.0f} s, "
          f"change points computed and kept in {time.perf_counter() - t2:.0f} s ({len(kept.changes)} found)",
          flush=True)
    return path


def fetch(url: str, headers: dict[str, str]) -> tuple[float, int, int]:
    req = urllib.request.Request(url, headers=headers)
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=60) as r:
        body = r.read()
        status = r.status
    return (time.perf_counter() - t) * 1000, status, len(body)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "pages-bench")
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--modules", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--rebuild", action="store_true")
    a = ap.parse_args()
    a.dir.mkdir(parents=True, exist_ok=True)
    if a.rebuild:
        for p in a.dir.glob("pages*"):
            p.unlink()
    history = build(a.dir, a.runs, a.modules)

    from controller.cli.demo import inventory_toml
    from controller.history import History
    from controller.serve.daemon import start_api
    from controller.serve.pages.auth import COOKIE
    from controller.service import Session
    from controller.settings import ControllerSettings
    from simulator.ports import free_port

    h = History(history)
    newest = h.runs(limit=1)[0]
    h.set_run_state(newest.run_id, "running")  # one running run: the runs page polls it, its page is live
    h.close()
    inv = a.dir / "inventory.toml"
    inv.write_text(inventory_toml([f"m{i:02d}" for i in range(a.modules)], a.dir, None))
    tokens = a.dir / "tokens"
    tokens.write_text(f"# m1000-fleet tokens v2\nada admin {TOKEN}\n")
    tokens.chmod(0o600)
    port = free_port()
    settings = ControllerSettings(broker_url="filesystem://", data_dir=a.dir / "fleet", inventory=inv,
                                  history=history, api_port=port, api_tokens_file=tokens)
    base = f"http://127.0.0.1:{port}"
    rid, mod, rel = newest.run_id, newest.modules[0], newest.release
    pairs: list[tuple[str, str, str]] = [  # (name, page, the API's JSON of the same data)
        ("runs (newest 50)", "/ui/runs", "/api/v1/runs?limit=50"),
        ("runs, filtered", "/ui/runs?verdict=regressed&module=m03&user=ada", "/api/v1/runs?limit=50"),
        ("runs, a day", "/ui/runs?since=" + time.strftime("%Y-%m-%d", time.gmtime(newest.created_at - 30 * 86400))
         + "&until=" + time.strftime("%Y-%m-%d", time.gmtime(newest.created_at - 30 * 86400)),
         "/api/v1/runs?limit=50"),
        ("runs, oldest page", "/ui/runs?before=" + repr(time.time() - (a.runs - 40) * 600), "/api/v1/runs?limit=500"),
        ("runs' live poll", f"/ui/live/runs?ids={rid}", f"/api/v1/runs/{rid}"),
        ("a run (running)", f"/ui/runs/{rid}", f"/api/v1/runs/{rid}"),
        ("a run's live poll", f"/ui/runs/{rid}/live", f"/api/v1/runs/{rid}"),
        ("an old run", "/ui/runs/run-00007", "/api/v1/runs/run-00007"),
        ("modules", "/ui/modules", "/api/v1/devices"),
        ("a module", f"/ui/modules/{mod}", f"/api/v1/devices?devices={mod}"),
        ("releases", "/ui/releases", "/api/v1/trend"),
        ("a release", f"/ui/releases/{rel}", "/api/v1/trend"),
        ("queue and reservations", "/ui/queue", "/api/v1/reservations"),
    ]
    cookie = {"Cookie": f"{COOKIE}={TOKEN}"}
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    print(f"history {history.name}: {a.runs:,} runs; {a.rounds} rounds (+1 not counted), each page then its JSON")
    with Session(settings) as s:
        server = start_api(s)
        assert server is not None
        try:
            got: dict[str, dict[str, list[float]]] = {n: {"page": [], "json": []} for n, _, _ in pairs}
            sizes: dict[str, tuple[int, int]] = {}
            for r in range(a.rounds + 1):
                for name, page, api in pairs:
                    tp, sp, bp = fetch(base + page, cookie)
                    tj, sj, bj = fetch(base + api, bearer)
                    if (sp, sj) != (200, 200):
                        raise SystemExit(f"{name}: status {sp} / {sj}")
                    sizes[name] = (bp, bj)
                    if r:
                        got[name]["page"].append(tp)
                        got[name]["json"].append(tj)
            poll_split(s, rid)
        finally:
            server.stop()
    print(f"\n{'ms':26s} {'page median':>11s} {'p90':>7s} {'max':>7s} {'JSON median':>11s} {'p90':>7s} {'max':>7s} "
          f"{'page/JSON':>9s} {'page KiB':>9s}")
    worst = 0.0

    def p90(xs: list[float]) -> float:
        return statistics.quantiles(xs, n=10, method="inclusive")[-1]

    for name, _, _ in pairs:
        p, j = got[name]["page"], got[name]["json"]
        worst = max(worst, max(p))
        print(f"{name:26s} {statistics.median(p):11.1f} {p90(p):7.1f} {max(p):7.1f} {statistics.median(j):11.1f} "
              f"{p90(j):7.1f} {max(j):7.1f} {statistics.median(p) / statistics.median(j):9.2f} "
              f"{sizes[name][0] / 1024:9.1f}")
    ok = worst < BUDGET_MS
    print(f"\nslowest page round: {worst:.1f} ms (acceptance: every page < {BUDGET_MS:.0f} ms): "
          f"{'met' if ok else 'NOT met'}")
    return 0 if ok else 1


def poll_split(s: Any, rid: str) -> None:
    """A live poll's cost: the whole request (measured above) against the service call it makes, in this
    process (what an SSE stream would still make every tick)."""
    from controller import service

    def timed(fn: Callable[[], object], n: int = 50) -> float:
        fn()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t) / n * 1000

    data = timed(lambda: service.describe_run(s, rid))
    print(f"\nlive poll split: the run's service call alone (describe_run, live) {data:.2f} ms a tick")


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
