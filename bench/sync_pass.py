"""The controller's sync pass, ``Fleet.statuses`` and the live view at 1,000 / 10,000 modules: this tree beside
the merge base's implementation, side by side in one run (issue 47 item 2).

One redis-server (AOF everysec, as deployed). The modules' agents are faked at the broker seam, in this process
between the measured calls (their writes are not the controller's CPU): every module's heartbeat and progress, as
a real agent publishes them through ``contract.kv``. The old implementation (``controller/fleet/collect.py``,
``states.py`` and ``controller/cli/live.py`` at ``--base``, read with ``git show``) is imported from a temporary
folder and runs on the same broker over a history of its own; the two take turns pass by pass. Measured per N:

- steady pass: every module benchmarking; a pass every 0.5 s, and between two passes 10 % of the heartbeats and
  10 % of the progress records change (a heartbeat every 5 s): the mean CPU of a pass, and per module
- final passes: every module done with the seed's 11 qwen3 rows and a sealed final state (the rows and the
  progress taken into the history, the seal acknowledged): the CPU until the run is finished, and the longest pass
- the live view's refresh (sync pass excluded): rendering the view into a terminal of 140 columns, this tree's
  with the modules changed since the last refresh (``changed_modules``)
- ``Fleet.statuses`` over the N modules, the history holding ``--past-runs`` earlier runs of every module

Usage: python bench/sync_pass.py [--sizes 1000,10000] [--passes 10] [--past-runs 20] [--base REV]
       [--profile N]  (cProfile of this tree's steady pass at N, the 25 costliest functions)
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from rich.console import Console  # noqa: E402

from bench import record  # noqa: E402 - bench/record.py, this script's folder
from contract.digest import seal  # noqa: E402
from contract.kv import HEARTBEAT_TTL, _key  # noqa: E402
from contract.records import Heartbeat, KeyOutcome, RunProgress, RunState  # noqa: E402
from controller.cli import live  # noqa: E402
from controller.cli.demo import inventory_toml, reference_rows  # noqa: E402
from controller.fleet import Fleet  # noqa: E402
from controller.history import History  # noqa: E402
from controller.inventory import load_inventory  # noqa: E402
from controller.settings import ControllerSettings  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402

RELEASE = "1.5.0"


def old_modules(base: str, folder: Path) -> tuple[type, ModuleType]:
    """(a Fleet whose sync and statuses are ``base``'s, ``base``'s live view module), from ``git show``."""
    loaded = {}
    for name, path in (("collect", "controller/fleet/collect.py"), ("states", "controller/fleet/states.py"),
                       ("live", "controller/cli/live.py")):
        src = subprocess.run(["git", "-C", str(ROOT), "show", f"{base}:{path}"], check=True, capture_output=True,
                             text=True).stdout
        file = folder / f"old_{name}.py"
        file.write_text(src)
        spec = importlib.util.spec_from_file_location(f"bench_old_{name}", file)
        assert spec and spec.loader
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        loaded[name] = mod
    old_fleet = type("OldFleet", (loaded["collect"].Sync, loaded["states"].ModuleStates, Fleet), {})
    return old_fleet, loaded["live"]


def add_past_runs(history: History, names: list[str], runs: int) -> None:
    """``runs`` earlier finished runs of every module, as weeks of a lab's use leave them."""
    now = time.time() - 86400
    with history.tx() as c:
        for k in range(runs):
            rid = f"past-{k:04d}"
            c.execute("INSERT INTO runs (run_id, created_at, release, models, modules, state) VALUES (?,?,?,?,?,?)",
                      (rid, now + k, "1.4.0", '["qwen3"]', "[]", "done"))
            c.executemany(
                "INSERT INTO module_runs (run_id, module, state, updated_at, progress) VALUES (?,?,?,?,?)",
                [(rid, m, "done", now + k, RunProgress(
                    run_id=rid, module=m, release="1.4.0", state=RunState.DONE, keys_total=1, keys_done=1,
                    updated_at=now + k, finished_at=now + k, outcomes=(KeyOutcome(
                        model_key="qwen3", status="passed", rows=11),)).model_dump_json()) for m in names])


class FakeAgents:
    """N agents at the broker seam: heartbeats and progress of run ``run_ids`` (one per implementation)."""

    def __init__(self, client: Any, names: list[str], run_ids: tuple[str, ...], expiry: int) -> None:
        self.client, self.names, self.run_ids, self.expiry = client, names, run_ids, expiry
        self.tick = 0
        self.seed = [r for r in reference_rows() if r.model_key == "qwen3"]

    def beat(self, names: list[str], run_id: str | None) -> None:
        pipe = self.client.pipeline(transaction=False)
        now = time.time()
        for m in names:
            hb = Heartbeat(module=m, agent_version="fake", ts=now, run_id=run_id, step="benchmark" if run_id else None)
            pipe.set(_key("hb", m), hb.model_dump_json(), ex=HEARTBEAT_TTL)
        pipe.execute()

    def progress(self, names: list[str], frac: float) -> None:
        pipe = self.client.pipeline(transaction=False)
        now = time.time()
        for run_id in self.run_ids:
            for m in names:
                p = RunProgress(run_id=run_id, module=m, release=RELEASE, state=RunState.BENCHMARKING,
                                step="benchmark", model_key="qwen3", keys_total=1, started_at=now - 60,
                                updated_at=now, progress=frac)
                pipe.set(_key("progress", run_id, m), p.model_dump_json(exclude={"telemetry"}), ex=self.expiry)
        pipe.execute()

    def step(self) -> None:
        """What changes between two passes: a tenth of the heartbeats and a tenth of the progress records."""
        n = len(self.names)
        k = max(1, n // 10)
        part = [self.names[(self.tick * k + i) % n] for i in range(k)]
        self.tick += 1
        self.beat(part, "r")
        self.progress(part, min(0.99, 0.1 + 0.01 * self.tick))

    def finish(self) -> None:
        now = time.time()
        pipe = self.client.pipeline(transaction=False)
        for run_id in self.run_ids:
            for m in self.names:
                rows = [r.model_copy(update={"run_id": run_id, "module": m, "release": RELEASE}) for r in self.seed]
                p = seal(RunProgress(run_id=run_id, module=m, release=RELEASE, state=RunState.DONE, step="done",
                                     keys_total=1, keys_done=1, progress=1.0, started_at=now - 60, updated_at=now,
                                     finished_at=now, rows=len(rows), outcomes=(KeyOutcome(
                                         model_key="qwen3", status="passed", rows=len(rows)),)), rows)
                pipe.set(_key("rows", run_id, m), "[" + ",".join(r.model_dump_json() for r in rows) + "]",
                         ex=self.expiry)
                pipe.set(_key("progress", run_id, m), p.model_dump_json(exclude={"telemetry"}), ex=self.expiry)
        pipe.execute()
        self.beat(self.names, None)


def cpu(fn: Callable[[], Any]) -> tuple[float, Any]:
    c = time.process_time()
    out = fn()
    return time.process_time() - c, out


def render(console: Console, module: ModuleType, view: Any, kw: dict[str, Any]) -> None:
    """The live view of ``view`` as ``module`` renders it, printed (the part of a refresh after the pass)."""
    console.print(module.render(view, title="run", **kw))


def measure(n: int, args: argparse.Namespace, server: RedisServer, base: Path, db: int,
            impls: dict[str, tuple[type, ModuleType]]) -> dict[str, dict[str, float]]:
    folder = base / f"n{n}"
    folder.mkdir(parents=True)
    names = [f"fake-{i + 1:05d}" for i in range(n)]
    (folder / "inventory.toml").write_text(inventory_toml(names, folder, None))
    mods = list(load_inventory(folder / "inventory.toml").modules)
    fleets: dict[str, Fleet] = {}
    for label, (cls, _) in impls.items():
        settings = ControllerSettings(broker_url=f"redis://127.0.0.1:{server.port}/{db}", data_dir=folder / label,
                                      inventory=folder / "inventory.toml", history=folder / f"{label}.sqlite",
                                      heartbeat_interval=5.0, offline_after=30.0)
        history = History(settings.history_path)
        add_past_runs(history, names, args.past_runs)
        history.create_run(f"run-{label}", release=RELEASE, models=("qwen3",), modules=names)
        history.set_dispatched(f"run-{label}", "normal", time.time())
        fleets[label] = cls(settings, history)
    first = next(iter(fleets.values()))
    agents = FakeAgents(first.app.backend.client, names, tuple(f"run-{label}" for label in impls),
                        int(first.app.backend.expires or 86400))
    agents.beat(names, "r")
    agents.progress(names, 0.1)
    out: dict[str, dict[str, float]] = {label: {} for label in impls}
    console = Console(file=io.StringIO(), width=140, force_terminal=True)
    for label, f in fleets.items():  # the first pass of each takes every module's state: not a steady pass
        f.sync(f"run-{label}")
    if args.profile == n:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        f = fleets["this tree"]
        for _ in range(3):  # past the passes that follow the first (every record written once more)
            agents.step()
            f.sync("run-this tree")
        agents.step()
        prof.enable()
        f.sync("run-this tree")
        prof.disable()
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(25)
    passes: dict[str, list[float]] = {label: [] for label in impls}
    renders: dict[str, list[float]] = {label: [] for label in impls}
    last: dict[str, Any] = dict.fromkeys(impls)
    for _ in range(args.passes):
        time.sleep(0.5)  # the live view's refresh period: what a pass reads once a heartbeat interval comes due
        agents.step()
        for label, f in fleets.items():
            t, view = cpu(partial(f.sync, f"run-{label}"))
            passes[label].append(t)
            module = impls[label][1]
            kw = {"changed": module.changed_modules(last[label], view)} if hasattr(module, "changed_modules") else {}
            t, _ = cpu(partial(render, console, module, view, kw))
            last[label] = view
            console.file = io.StringIO()
            renders[label].append(t)
    for label in impls:
        out[label]["pass"] = statistics.mean(passes[label])
        out[label]["pass max"] = max(passes[label])  # the pass that reads the heartbeats that came due
        print(f"N={n} {label}: steady passes CPU ms, in order: "
              + " ".join(f"{t * 1e3:.0f}" for t in passes[label]), file=sys.stderr, flush=True)
        out[label]["render"] = statistics.median(renders[label])
    agents.finish()
    if args.profile == n:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        fleets["this tree"].sync("run-this tree")
        prof.disable()
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(30)
    for label, f in fleets.items():
        total, k, most, each = 0.0, 0, 0.0, []
        while True:
            t, view = cpu(partial(f.sync, f"run-{label}"))
            total, k, most = total + t, k + 1, max(most, t)
            each.append(t)
            if view.finished or k > 400:
                break
        if view.state() != "done":
            raise SystemExit(f"{label}: the run at {n} ended {view.state()}")
        out[label]["final"] = total
        print(f"N={n} {label}: final passes CPU ms, in order: " + " ".join(f"{t * 1e3:.0f}" for t in each),
              file=sys.stderr, flush=True)
        out[label]["final passes"] = k
        out[label]["final max"] = most
        out[label]["rows"] = f.history.row_count(f"run-{label}")
    if args.profile == n:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        fleets["this tree"].statuses(mods)
        prof.disable()
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(20)
    agents.beat(names, None)  # the modules idle and alive, as after a run
    statuses: dict[str, list[float]] = {label: [] for label in fleets}
    for _ in range(args.statuses):
        for label, f in fleets.items():
            t, st = cpu(partial(f.statuses, mods))
            statuses[label].append(t)
            out[label]["idle"] = sum(s.state == "idle" for s in st.values())
    for label, f in fleets.items():
        out[label]["statuses"] = statistics.median(statuses[label])
        f.history.close()
        f.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1000,10000")
    ap.add_argument("--passes", type=int, default=20, help="steady passes per implementation and N (0.5 s apart)")
    ap.add_argument("--statuses", type=int, default=3, help="Fleet.statuses calls per implementation and N")
    ap.add_argument("--past-runs", type=int, default=20)
    ap.add_argument("--base", default="", help="the old implementation's revision (default: merge-base with main)")
    ap.add_argument("--profile", type=int, default=0, help="profile this tree alone at N (no old beside it)")
    args = ap.parse_args()
    base_rev = args.base or subprocess.run(["git", "-C", str(ROOT), "merge-base", "HEAD", "main"], check=True,
                                           capture_output=True, text=True).stdout.strip()
    print(f"old: {base_rev[:10]} (controller/fleet/collect.py, states.py, controller/cli/live.py); new: this tree")
    with tempfile.TemporaryDirectory(prefix="sync-pass-") as tmp:
        base = Path(tmp)
        old_fleet, old_live = old_modules(base_rev, base)
        impls = {"old": (old_fleet, old_live), "this tree": (Fleet, live)}
        if args.profile:
            del impls["old"]
        server = RedisServer(base / "redis")
        server.start()
        try:
            rows: list[tuple[int, dict[str, dict[str, float]]]] = []
            for k, n in enumerate(int(x) for x in args.sizes.split(",") if x):
                r = measure(n, args, server, base, 1 + k, impls)
                rows.append((n, r))
                print(f"measured N={n}: {r}", file=sys.stderr, flush=True)
        finally:
            server.stop()
    print("\n| N | | steady pass CPU ms | per module ms | longest steady pass ms | live view refresh ms | "
          "final passes CPU s (passes) | longest final pass s | Fleet.statuses ms | per module ms |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for n, r in rows if not args.profile else ():
        o, t = r["old"], r["this tree"]
        for label, x in (("old", o), ("this tree", t)):
            print(f"| {n} | {label} | {x['pass'] * 1e3:.1f} | {x['pass'] * 1e3 / n:.4f} | {x['pass max'] * 1e3:.0f} | "
                  f"{x['render'] * 1e3:.1f} | "
                  f"{x['final']:.2f} ({x['final passes']:.0f}) | {x['final max']:.2f} | {x['statuses'] * 1e3:.0f} | "
                  f"{x['statuses'] * 1e3 / n:.4f} |")
        print(f"| {n} | **old / new** | **{o['pass'] / t['pass']:.1f}x** | | "
              f"**{o['pass max'] / t['pass max']:.1f}x** | {o['render'] / t['render']:.1f}x | "
              f"{o['final'] / t['final']:.1f}x | {o['final max'] / t['final max']:.1f}x | "
              f"**{o['statuses'] / t['statuses']:.1f}x** | |")
        if o["rows"] != t["rows"] or o["idle"] != t["idle"]:
            print(f"N={n}: the two disagree: rows {o['rows']} vs {t['rows']}, idle {o['idle']} vs {t['idle']}")
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
