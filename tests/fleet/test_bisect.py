"""``fleetctl bisect`` on real workers (embedded broker) over a series of simulated nightly releases with a decode
regression planted at a release the test draws at random: 4 modules name it in 2 rounds, 1 module in the binary
number; a candidate whose server cannot start is skipped and said; a controller killed mid-bisection resumes, a
module lost meanwhile gives its candidate to another; a cancel stops it and its runs."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from controller.history import History
from controller.service.bisect_plan import bounds, next_probes
from controller.service.bisect_state import BisectStore
from tests.support.lab import make_lab
from tests.support.procs import leftovers
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow

SCALE = 200.0  # a run of qwen3 ~10 s; at 1000 one module's 11 profiles are too noisy for a 95 % call of 8 %


def _series(tmp_path: Path, regress_at: int, count: int = 16, broken: tuple[int, ...] = ()) -> list:
    from simulator.series import build_series

    return build_series(tmp_path / "releases", count=count, regress_at=regress_at, regress="qwen3:decode_tps:0.08",
                        noise=0.01, time_scale=SCALE, seed=11, broken=broken)


def _oracle_rounds(count: int, first_bad: int, k: int, skip: frozenset[int] = frozenset()) -> int:
    calls: list = [None] * count
    calls[0], calls[-1] = "good", "bad"
    rounds = 0
    while not bounds(calls).done:
        for p in next_probes(calls, k):
            calls[p] = "skip" if p in skip else ("bad" if p >= first_bad else "good")
        rounds += 1
    return rounds


def _bisect(lab, series, *extra: str, timeout: float = 600) -> dict:
    r = lab.fleetctl("bisect", "--good", series[0].version, "--bad", series[-1].version, "--releases",
                     str(series[0].path.parent), "--models", "qwen3", "-o", "json", *extra, timeout=timeout)
    assert r.returncode == 0, (r.stderr, r.stdout[-3000:])  # the document says why no release was named
    return json.loads(r.stdout)


# alone: its targets are every metric that moved, and with both cores saturated by the slow tier's other workers the
# start-up figures (precompile_s, server_ready_s) moved too
@pytest.mark.alone
def test_four_modules_name_the_planted_release_in_two_rounds_and_skip_one_that_cannot_run(tmp_path: Path):
    at = random.choice([i for i in range(1, 16) if i not in (3, 4)])  # 3 cannot start: 4 would be one of 3, 4
    series = _series(tmp_path, at, broken=(3,))
    lab = make_lab(tmp_path / "lab", ("filesystem://", None), 4)
    lab.start()
    try:
        doc = _bisect(lab, series)
        assert doc["first_bad"] == series[at].version, (at, doc["line"])
        assert doc["rounds"] == 2, (at, doc["line"])  # re-measures (a call within noise) stay in their round
        assert doc["again"] == sum(e["outcome"] == "measured (again)" for e in doc["evidence"])
        assert doc["calls"][series[3].version] == "skip"
        assert f"skipped (could not run): {series[3].version}" in doc["line"]
        assert [(t["model_key"], t["metric"]) for t in doc["targets"]] == [("qwen3", "decode_tps")]
        assert -0.11 < doc["targets"][0]["bad_change"] < -0.05
        first_round = [e for e in doc["evidence"] if e["round"] == 1 and not e["outcome"].endswith("(again)")]
        assert sorted(e["module"] for e in first_round) == ["sim-01", "sim-02", "sim-03", "sim-04"]
        assert [e["release"] for e in first_round] == [series[i].version for i in (3, 6, 9, 12)]
        h = History(lab.settings.history_path)
        notes = [r.note for r in h.runs(limit=100)]
        assert len(notes) == 2 + len(doc["evidence"])  # the two references and every candidate's run
        assert all(n.startswith(f"bisect {doc['bisect_id']}: ") for n in notes)
        assert leftovers(lab) == []
    finally:
        lab.stop()


def test_one_module_takes_the_binary_number_of_rounds(tmp_path: Path):
    at = random.randrange(1, 16)
    series = _series(tmp_path, at)
    lab = make_lab(tmp_path / "lab", ("filesystem://", None), 1)
    lab.start()
    try:
        # one module, one pair of references: a load spike of this machine during one of them moves every
        # profile's prefill (a TTFT is ~10 ms of wall time at this scale), and the default targets chased it
        # (prefill -2.6 % in a clean run); the four-module test checks the default targets
        doc = _bisect(lab, series, "--metric", "decode_tps")
        assert doc["first_bad"] == series[at].version, (at, doc["line"])
        assert doc["rounds"] == _oracle_rounds(16, at, 1) and doc["rounds"] in (3, 4), (at, doc["line"])
        assert max(e["round"] for e in doc["evidence"]) == doc["rounds"]
        assert {e["module"] for e in doc["evidence"]} == {"sim-01"}
    finally:
        lab.stop()


# alone: a load-sensitive lab (3 modules, lost_after 5 s). The kill comes once every round-1 run has left the
# controller for its module (its module started it): a controller killed between recording a run and sending its
# messages leaves the run's parts queued with no message anywhere, given up only after START_TIMEOUT (300 s; the
# "never started" bound of controller/fleet/collect.py:liveness): most likely the hang of the failing runs of this
# test under load on 2026-12-06/07 (300 s waiting, not reproduced on demand); a product gap named in that session's
# note, not what this test is about.
@pytest.mark.alone
def test_a_killed_controller_resumes_and_a_lost_module_gives_its_candidate_to_another(tmp_path: Path):
    series = _series(tmp_path, 5, count=8)
    lab = make_lab(tmp_path / "lab", ("filesystem://", None), 3, offline_after=2.0, lost_after=5.0)
    lab.start()
    store = BisectStore(lab.settings.data_dir)
    exe = Path(sys.executable).parent / "fleetctl"
    cmd = [str(exe), "bisect", "--good", series[0].version, "--bad", series[-1].version, "--releases",
           str(series[0].path.parent), "--models", "qwen3", "--metric", "decode_tps", "-o", "json"]
    try:
        first = subprocess.Popen(cmd, env=lab.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for(lambda: store.list() and any(r.round == 1 for r in store.list()[0].runs), 180,
                 "the first round dispatched")
        history = History(lab.settings.history_location)

        def round_one_started() -> bool:
            runs = [r for r in store.list()[0].runs if r.round == 1]
            return all(p.started_at is not None for r in runs for p in history.progress(r.run_id).values()
                       ) and all(history.progress(r.run_id) for r in runs)

        wait_for(round_one_started, 120, "the first round's runs started on their modules")
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=10)
        (rec,) = store.list()
        victim = next(r for r in rec.runs if r.round == 1)
        lab.kill(victim.module)  # its candidate's run is lost with it
        resumed = subprocess.Popen([str(exe), "bisect", "--resume", rec.bisect_id, "-o", "json"], env=lab.env(),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        owner = lab.settings.data_dir / "bisect" / f"{rec.bisect_id}.owner"
        wait_for(lambda: owner.exists() and owner.read_text() == str(resumed.pid), 60, "the resumed bisect owning it")
        again = lab.fleetctl("bisect", "--resume", rec.bisect_id)
        assert again.returncode == 2 and "is being run by another fleetctl" in again.stderr, again.stderr
        out, err = resumed.communicate(timeout=400)
        assert resumed.returncode == 0, err
        doc = json.loads(out)
        assert doc["first_bad"] == series[5].version, doc["line"]
        assert doc["lost"] == [victim.module]
        moved = [e for e in doc["evidence"] if e["release"] == series[victim.index].version]
        # measured again elsewhere only where the round's other calls left it open (issue 51: a candidate the same
        # round made irrelevant is not re-measured); the first bad release is series[5]
        others = [r.index for r in rec.runs if r.round == 1 and r.module != victim.module]
        good, bad = max([0, *(i for i in others if i < 5)]), min([len(series) - 1, *(i for i in others if i >= 5)])
        if good < victim.index < bad:
            assert [e["outcome"] for e in moved] == ["lost", "measured (again)"]
            assert moved[1]["module"] != victim.module
        else:
            assert [e["outcome"] for e in moved] == ["lost"]
        assert not any(e["module"] == victim.module for e in doc["evidence"] if e["round"] > 1)
    finally:
        lab.stop()


# alone: once in six parallel slow tiers (both cores saturated) its run was not shown cancelled within 60 s of the
# bisection's cancel; alone and under a 3-process CPU load it passes in 9-20 s. Not understood yet: see issue 44's note
@pytest.mark.alone
def test_cancel_stops_the_bisection_and_its_runs(tmp_path: Path):
    series = _series(tmp_path, 5, count=8)
    lab = make_lab(tmp_path / "lab", ("filesystem://", None), 2)
    lab.start()
    store = BisectStore(lab.settings.data_dir)
    exe = Path(sys.executable).parent / "fleetctl"
    try:
        proc = subprocess.Popen([str(exe), "bisect", "--good", series[0].version, "--bad", series[-1].version,
                                 "--releases", str(series[0].path.parent), "--models", "qwen3"], env=lab.env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for(lambda: store.list() and store.list()[0].runs, 60, "the first run dispatched")
        (rec,) = store.list()
        r = lab.fleetctl("bisect", "--cancel", rec.bisect_id)
        assert r.returncode == 0 and r.stderr.strip() == f"bisection {rec.bisect_id}: cancelled", r.stderr
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 1, err
        assert f"CANCELLED {rec.bisect_id}: cancelled" in out
        (run,) = History(lab.settings.history_path).runs()
        wait_for(lambda: json.loads(lab.fleetctl("status", run.run_id, "-o", "json").stdout)["state"] == "cancelled",
                 60, "the run cancelled")
    finally:
        lab.stop()


def test_a_candidate_validate_refuses_is_skipped_and_the_answer_names_both_suspects(tmp_path: Path):
    series = _series(tmp_path, 2, count=4)
    series[1].path.write_bytes(series[1].path.read_bytes()[:200])  # a truncated tarball: refused before it runs
    lab = make_lab(tmp_path / "lab", ("filesystem://", None), 1)
    lab.start()
    try:
        doc = _bisect(lab, series)
        assert doc["first_bad"] is None and doc["suspects"] == [series[1].version, series[2].version], doc["line"]
        assert doc["calls"][series[1].version] == "skip" and series[1].version in doc["refused"]
        assert doc["line"].startswith(f"the first bad release is one of {series[1].version}, {series[2].version}")
        assert [e["release"] for e in doc["evidence"]] == [series[2].version]
    finally:
        lab.stop()
