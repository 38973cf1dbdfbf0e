"""The fleet's kernel cache: one validation of N simulated modules with and without it, side by side in one run.

Two fleets of N cheap simulated modules (``simulator/cheap.py``: real workers, the real release's scripts, time
scale 0.25: a qwen3 run is ~190 s of waiting, its precompile ~72 s of it) on one redis-server, one with
``kernel_cache`` on (two modules must compile identical archives before the others trust it) and one without.
Both go through the same two validations of one release, the two fleets at the same time (same machine load):

1. a canary validation on the first two modules: they compile (and, sharing, publish: two identical archives);
2. the validation of all N modules: the canary modules find their own local cache either way; the others
   compile (without) or fetch, verify and unpack the archive (with).

Printed: each validation's wall time in both fleets and their ratio, which modules compiled and which fetched
(from each module's progress as the controller's history holds it), each module's precompile time, and each
module's figures with the cache against the same module's without it (the relative difference of every
figure, the canary modules' differences giving the noise of two runs that did the same thing).

Exits 1 when the N-module validation with the cache takes more than 0.7 x the wall time without it.

Usage: python bench/kernel_cache.py [--modules 8] [--models qwen3] [--time-scale 0.25] [--keep DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.validate import stage_local_release  # noqa: E402
from bench import record  # noqa: E402 - bench/record.py, this script's folder
from contract.files import sha256_file  # noqa: E402
from contract.records import METRICS  # noqa: E402
from controller.cli.demo import Worker, inventory_toml, start_worker, stop_workers, wait_for_heartbeats  # noqa: E402
from controller.fleet import Fleet  # noqa: E402
from controller.history import History  # noqa: E402
from controller.inventory import load_inventory  # noqa: E402
from controller.settings import ControllerSettings  # noqa: E402
from simulator import build_release, make_models  # noqa: E402
from simulator.cheap import CHEAP_TELEMETRY_PERIOD, CHEAP_TIME_SCALE, cheap_module_env  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402

ARMS = ("off", "on")


def validate(settings: ControllerSettings, names: list[str], run_id: str, tarball: Path, sha: str, version: str,
             models: tuple[str, ...], out: dict[str, Any]) -> None:
    """One validation through the controller's seam (dispatch, then sync every 0.5 s): its wall, progress, rows."""
    history = History(settings.history_path)
    fleet = Fleet(settings, history)
    try:
        mods = [m for m in load_inventory(settings.inventory).modules if m.name in names]
        staged = stage_local_release(tarball, sha, settings.data_dir)
        w0 = time.monotonic()
        fleet.dispatch(run_id=run_id, modules=mods, tarballs={m.name: str(staged) for m in mods}, sha256=sha,
                       release=version, models=models)
        while True:
            time.sleep(0.5)
            view = fleet.sync(run_id)
            if view.finished:
                break
            if time.monotonic() - w0 > 1800:
                raise SystemExit(f"{run_id}: not finished after 30 min")
        out["wall"] = time.monotonic() - w0
        if view.state() != "done":
            bad = {m: (p.state.value if p else "-", p.error.one_line() if p and p.error else "")
                   for m, p in view.progress.items() if p is None or p.state.value != "done"}
            raise SystemExit(f"{run_id} ended {view.state()}: {list(bad.items())[:5]}")
        out["progress"] = dict(view.progress)
        out["rows"] = history.rows(run_id)
    finally:
        fleet.close()
        history.close()


def both(arms: dict[str, dict[str, Any]], names: dict[str, list[str]], run_id: str, tarball: Path, sha: str,
         version: str, models: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """The same validation in both fleets at once (a thread each); what each measured."""
    got: dict[str, dict[str, Any]] = {a: {} for a in ARMS}
    threads = [threading.Thread(target=validate, args=(arms[a]["settings"], names[a], f"{run_id}-{a}", tarball,
                                                      sha, version, models, got[a])) for a in ARMS]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    missing = [a for a in ARMS if "wall" not in got[a]]
    if missing:
        raise SystemExit(f"{run_id}: the validation of fleet {missing[0]} failed (see above)")
    return got


def precompile_s(base: Path, module: str, run_id: str) -> tuple[str, float]:
    """(how the module's precompile went, its seconds) from the run's events on the module: the precompile's
    ``ok`` or the kernel cache's ``fetched`` event (fetch, verify, unpack), else the local cache's ``skipped``."""
    import json

    path = base / "modules" / module / "work" / "runs" / run_id / "events.jsonl"
    for line in path.read_text(encoding="utf-8").splitlines():
        ev = json.loads(line)
        if ev["step"] == "precompile" and ev["status"] in ("ok", "skipped", "fetched"):
            return ev["status"], ev["duration_s"] or 0.0
    return "-", float("nan")


def figures(rows: list[Any], module: str) -> dict[tuple[str, str, str], float]:
    """A module's figures; the precompile's own (compiled vs fetched: what the cache changes on purpose) left out."""
    return {(r.model_key, r.profile, m): getattr(r, m) for r in rows if r.module == module and r.source == "release"
            for m in METRICS if m not in ("precompile_s", "precompile_fetch_s") and getattr(r, m)}


def spread(rows: list[Any], modules: list[str]) -> float:
    """The noise of one run, as a difference between two modules (what a module with / without the cache is): the
    largest relative difference of a figure between two of the run's modules (the same release on identical
    simulated modules doing the same thing), max / min - 1."""
    per = [figures(rows, m) for m in modules]
    worst = 0.0
    for k in set().union(*per):
        vals = [f[k] for f in per if k in f]
        worst = max(worst, max(vals) / min(vals) - 1)
    return worst


def compare(off: list[Any], on: list[Any], mod_off: str, mod_on: str) -> tuple[int, float, str]:
    """(figures compared, largest relative difference, of which figure) of one module with and without the cache."""
    a, b = figures(off, mod_off), figures(on, mod_on)
    common = sorted(set(a) & set(b))
    if not common or len(a) != len(b):
        return len(common), float("inf"), f"{len(a)} figures without, {len(b)} with"
    diffs = {k: abs(b[k] / a[k] - 1) for k in common}
    worst = max(diffs, key=lambda k: diffs[k])
    return len(common), diffs[worst], "/".join(worst)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modules", type=int, default=8)
    ap.add_argument("--models", default="qwen3")
    ap.add_argument("--time-scale", type=float, default=CHEAP_TIME_SCALE)
    ap.add_argument("--keep", help="keep everything in this folder (default: a temporary one, removed)")
    args = ap.parse_args()
    models = tuple(args.models.split(","))
    tmp = tempfile.TemporaryDirectory(prefix="fleet-kcache-") if not args.keep else None
    root = Path(args.keep) if tmp is None else Path(tmp.name)
    server = RedisServer(root / "redis")
    server.start()
    workers: list[Worker] = []
    try:
        rel = build_release(root / "release", version="1.6.0", time_scale=args.time_scale, noise=0.0, seed=1)
        sha = sha256_file(rel.path)
        arms: dict[str, dict[str, Any]] = {}
        names = {a: [f"{a}-{i + 1:02d}" for i in range(args.modules)] for a in ARMS}
        for k, a in enumerate(ARMS):
            base = root / a
            base.mkdir()
            settings = ControllerSettings(broker_url=f"{server.url.rsplit('/', 1)[0]}/{k + 1}", data_dir=base / "fleet",
                                          inventory=base / "inventory.toml", history=base / "history.sqlite",
                                          heartbeat_interval=5.0, offline_after=30.0)
            (base / "inventory.toml").write_text(inventory_toml(names[a], base, None))
            env = {**cheap_module_env(args.time_scale, telemetry_period=CHEAP_TELEMETRY_PERIOD),
                   "FLEET_KERNEL_CACHE": "true" if a == "on" else "false"}
            ws = []
            for name in names[a]:
                make_models(base / "modules" / name / "models", keys=list(models))
                ws.append(start_worker(name, base, settings, sim_env=env))
            wait_for_heartbeats(settings, ws, 300)
            workers += ws
            arms[a] = {"settings": settings, "base": base}
        print(f"{2 * args.modules} workers up; canary validations on 2 modules of each fleet", file=sys.stderr,
              flush=True)
        canary = both(arms, {a: names[a][:2] for a in ARMS}, "canary", rel.path, sha, rel.version, models)
        print("full validations", file=sys.stderr, flush=True)
        full = both(arms, names, "full", rel.path, sha, rel.version, models)
    finally:
        stop_workers(workers)
        server.stop()
    lines = [f"# kernel cache: {args.modules} simulated modules, models {','.join(models)}, time scale "
             f"{args.time_scale:g}, release {rel.version} ({sha[:16]})", "",
             "| validation | modules | wall s, without the cache | wall s, with it | with / without |",
             "| --- | --- | --- | --- | --- |"]
    for label, got, n in (("canary", canary, 2), ("full", full, args.modules)):
        lines.append(f"| {label} | {n} | {got['off']['wall']:.1f} | {got['on']['wall']:.1f} | "
                     f"{got['on']['wall'] / got['off']['wall']:.2f} |")
    ratio = full["on"]["wall"] / full["off"]["wall"]
    lines += ["", "| module | precompile without (s) | with: how | with (s) | kernel_cache (progress) | figures | "
                  "largest difference with / without |", "| --- | --- | --- | --- | --- | --- | --- |"]
    compiled: list[str] = []
    fetched: list[str] = []
    noise: list[float] = []
    shared: list[float] = []
    for i in range(args.modules):
        off_m, on_m = names["off"][i], names["on"][i]
        how_off, s_off = precompile_s(arms["off"]["base"], off_m, "full-off")
        how_on, s_on = precompile_s(arms["on"]["base"], on_m, "full-on")
        use = full["on"]["progress"][on_m].kernel_cache
        canary_use = canary["on"]["progress"][on_m].kernel_cache if i < 2 else None
        shown = use.action if use else ("local cache (canary: " + (canary_use.action if canary_use else "-") + ")")
        (fetched if use and use.action == "fetched" else compiled).append(on_m)
        n, worst, which = compare(full["off"]["rows"], full["on"]["rows"], off_m, on_m)
        (noise if i < 2 else shared).append(worst)
        lines.append(f"| {on_m} | {s_off:.2f} ({how_off}) | {how_on} | {s_on:.2f} | {shown} | {n} | "
                     f"{worst:.1%} ({which}) |")
    noise_off = spread(full["off"]["rows"], names["off"])
    noise_on = spread(full["on"]["rows"], names["on"])
    lines += ["", f"compiled (canary, local cache in the full run): {', '.join(compiled)}; fetched: "
                  f"{', '.join(fetched)}",
              f"largest relative difference of a module's figures, with vs without: canary modules (the same path "
              f"in both fleets) {max(noise):.1%}, modules that fetched {max(shared):.1%} (median "
              f"{statistics.median(shared):.1%})",
              f"noise of one run (the largest difference of a figure between two of the run's {args.modules} "
              f"modules): without the cache {noise_off:.1%}, with it {noise_on:.1%}; fetched modules within it: "
              f"{'yes' if max(shared) <= max(noise_off, noise_on) else 'no'}",
              f"full validation with the cache / without: {ratio:.2f} (acceptance: <= 0.70)"]
    print("\n".join(lines))
    if tmp is not None:
        tmp.cleanup()
    return 0 if ratio <= 0.7 else 1


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
