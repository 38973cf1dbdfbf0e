"""The agent's hold on its processes (:mod:`agent.procs`): parsers (fast) and a real subreaper (slow)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent import procs

ROOT = Path(__file__).resolve().parents[2]

MOUNTINFO = """\
25 30 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
42 31 0:39 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
"""


def test_cgroup_paths_are_parsed():
    assert procs.cgroup_v2_path("4:memory:/x\n0::/user.slice/app.slice/fleet-agent.service\n") == \
        "/user.slice/app.slice/fleet-agent.service"
    assert procs.cgroup_v2_path("0::/\n") == "/"
    assert procs.cgroup_v2_path("4:memory:/x\n") is None  # cgroup v1 only
    assert procs.cgroup2_mount(MOUNTINFO) == ("/sys/fs/cgroup/unified", "/")
    assert procs.cgroup2_mount(MOUNTINFO.replace("cgroup2 cgroup2", "tmpfs tmpfs")) is None


def test_spawn_into_moves_the_process_itself_then_execs_it():
    cg = procs.RunCgroup(Path("/sys/fs/cgroup/x/run-r1"))
    argv = procs.spawn_into(cg, ["bash", "start.sh"])
    assert argv[:2] == ["/bin/sh", "-c"] and argv[3:] == ["/sys/fs/cgroup/x/run-r1/cgroup.procs", "bash", "start.sh"]
    assert 'exec "$@"' in argv[2]
    assert procs.spawn_into(None, ["bash", "start.sh"]) == ["bash", "start.sh"]
    assert procs.base_name(Path("/a")) != procs.base_name(Path("/b"))


# A subreaper whose own subprocess calls (owned or not) keep their exit codes while it reaps the orphans of a
# daemonizing child: 40 rounds of `sh -c 'exit 3'` next to children that leave orphans behind and exit.
SUBREAPER = r"""
import json, os, subprocess, sys, threading, time
import psutil
from agent import procs
why = procs.hold_orphans()
codes, owned_codes = [], []
def plain():
    for _ in range(40):
        codes.append(subprocess.run(["sh", "-c", "exit 3"]).returncode)  # a Popen the reaper does not know
def owned():
    for _ in range(40):
        p = procs.REAPER.start(lambda: subprocess.Popen(["sh", "-c", "sleep 0.01; exit 5"]))
        owned_codes.append(p.wait())
        procs.REAPER.disown(p.pid)
def orphans():
    for _ in range(20):  # each leaves a grandchild that is re-parented here and exits later
        subprocess.run(["sh", "-c", "(sleep 0.2; exit 7) & exit 0"])
threads = [threading.Thread(target=f) for f in (plain, owned, orphans)]
for t in threads: t.start()
for t in threads: t.join()
time.sleep(0.2 + 3 * procs.ZOMBIE_GRACE + 0.5)
kids = [(c.pid, c.status()) for c in psutil.Process().children()]
print(json.dumps({"why": why, "sub": procs.is_subreaper(), "codes": sorted(set(codes)),
                  "owned": sorted(set(owned_codes)), "kids": kids, "reaped": procs.REAPER.reaped}))
"""


@pytest.mark.slow
def test_the_subreaper_reaps_its_orphans_and_leaves_every_wait_its_exit_code():
    out = subprocess.run([sys.executable, "-c", SUBREAPER], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    if got["why"]:
        pytest.skip(f"no child subreaper here: {got['why']}")
    assert got["sub"] is True
    assert got["codes"] == [3] and got["owned"] == [5]  # no wait saw ECHILD (returncode 0)
    assert got["kids"] == [], "zombies the subreaper adopted were not reaped"
    assert got["reaped"] >= 20
