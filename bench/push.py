"""Bench: `fleetctl push` next to `scp` (as typed, + remote `sync`, with push's cipher) to three namespace hosts.

Builds the SSH lab of the tests (three sshd hosts in network namespaces, needs root),
then, in the same run, sends the same file to the three hosts in parallel with each method
and prints, per round, each method's aggregate bytes/s and the CPU the sender spent (this
process and its ssh/scp children), and the ratio push/anchor of every round, min / median /
max over the rounds, for each anchor:

* ``scp``: scp as a person types it (OpenSSH's default cipher, chacha20-poly1305): the goal's anchor;
* ``scp+sync``: scp, then ``sync FILE`` on each host over ssh: scp with push's durability
  (push's receiver fsyncs the file and its folder before it says ok);
* ``scp-gcm``: ``scp -c aes128-gcm@openssh.com``, push's cipher: like for like on the wire,
  without durability or verification.

Push also verifies the sha256 on arrival and renames the file only then. Before the rounds it
prints the controller's sha256 time (once per release, not per module) and the CPU of the
receiving side alone (push's receiver vs ``cat > file; sync file``, fed through a pipe).

Fairness: before each timed transfer the previous one's files are removed and the page cache
is written back (``sync``), so that no method pays for another's dirty pages; and a round is
A B C D D C B A (the second transfer of a pair runs slower on this VM's disk, whichever it
is), its ratio the sum of the anchor's times over the sum of push's.

    .venv/bin/python bench/push.py            # 1 GiB, 3 rounds, every anchor
    .venv/bin/python bench/push.py --size-mib 256 --rounds 5 --anchors scp

Exit 1 when push reaches less than 0.95 of the goal anchor's throughput (``--goal-anchor``,
scp by default; see the README, Deploy, for why) in any round.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import paramiko  # noqa: E402

from bench import record  # noqa: E402 - bench/record.py, this script's folder
from contract.files import sha256_file  # noqa: E402
from controller.inventory import Module  # noqa: E402
from controller.remote.push import push_release, receiver_argv  # noqa: E402
from controller.remote.ssh import BULK_CIPHERS  # noqa: E402
from tests.ssh.netns import Host, Lab, capability_problem  # noqa: E402

GOAL = 0.95  # push / anchor throughput, every round
PUSH_CIPHER = BULK_CIPHERS.split(",")[0]  # what push negotiates with an OpenSSH server
ANCHORS = ("scp", "scp+sync", "scp-gcm")  # scp as typed (OpenSSH's default cipher), + sync FILE, with push's cipher


@dataclass(frozen=True)
class Took:
    wall: float
    cpu: float  # sender CPU: this process and its waited-for children (ssh, scp)
    sync: float = 0.0  # push: the slowest module's final fsync after the last byte; scp+sync: the remote sync


def make_file(path: Path, size: int) -> None:
    block = os.urandom(1 << 20)
    with path.open("wb") as f:
        for i in range(size >> 20):
            f.write(block[i % 7:] + block[: i % 7])  # distinct blocks, cheap to make


def _cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def timed(fn: Callable[[], float]) -> Took:
    c0, t0 = _cpu(), time.monotonic()
    extra = fn()
    return Took(time.monotonic() - t0, _cpu() - c0, extra)


def _ssh_opts(lab: Lab) -> list[str]:
    return ["-F", "/dev/null", "-i", str(lab.client_key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={lab.known_hosts}"]


def scp_all(lab: Lab, src: Path, *, sync: bool = False, cipher: str | None = None) -> float:
    """scp to every host in parallel; with ``sync``, then ``sync scp.bin`` on the host (fsync of that file)."""
    waits: list[float] = []
    how = ["-c", cipher] if cipher else []

    def one(h: Host) -> None:
        subprocess.run(["scp", "-q", *how, *_ssh_opts(lab), str(src), f"{h.user}@{h.address}:scp.bin"], check=True)
        if sync:
            t = time.monotonic()
            subprocess.run(["ssh", *_ssh_opts(lab), f"{h.user}@{h.address}", "sync scp.bin"], check=True)
            waits.append(time.monotonic() - t)

    with ThreadPoolExecutor(len(lab.hosts)) as pool:
        list(pool.map(one, lab.hosts))
    return max(waits, default=0.0)


def sftp_all(lab: Lab, src: Path) -> float:
    def one(h: Host) -> None:
        c = paramiko.SSHClient()
        c.load_host_keys(str(lab.known_hosts))
        c.set_missing_host_key_policy(paramiko.RejectPolicy())
        c.connect(h.address, username=h.user, key_filename=str(lab.client_key), look_for_keys=False,
                  allow_agent=False)
        try:
            c.open_sftp().put(str(src), "sftp.bin")
        finally:
            c.close()

    with ThreadPoolExecutor(len(lab.hosts)) as pool:
        list(pool.map(one, lab.hosts))
    return 0.0


def push_all(lab: Lab, src: Path, digest: str) -> float:
    mods = [Module(name=h.name, host=h.address, ssh_user=h.user) for h in lab.hosts]
    res = push_release(mods, src, digest, known_hosts=lab.known_hosts, identity=lab.client_key, retries=0)
    bad = [r for r in res.values() if r.error or r.skipped]
    if bad:
        raise SystemExit(f"push failed: {bad}")
    return max(r.sync_seconds for r in res.values())


def module_side_cpu(src: Path, digest: str, folder: Path) -> dict[str, float]:
    """CPU on the receiving side alone, fed through a pipe by ``cat``: push's receiver vs a plain write + fsync."""
    size = src.stat().st_size
    recv = receiver_argv(sys.executable, "receive", str(folder / "w"), digest, src.name, size, 0)
    plain = ["sh", "-c", 'cat > "$1" && sync "$1"', "sh", str(folder / "plain.bin")]
    out = {}
    for name, argv in (("receiver", recv), ("cat>file+sync", plain)):
        shutil.rmtree(folder / "w", ignore_errors=True)
        (folder / "plain.bin").unlink(missing_ok=True)
        os.sync()
        with subprocess.Popen(["cat", str(src)], stdout=subprocess.PIPE) as feed:
            c0 = _cpu()
            subprocess.run(argv, stdin=feed.stdout, stdout=subprocess.DEVNULL, check=True)
            feed.wait()
            out[name] = _cpu() - c0  # the feeding cat included, the same in both
    shutil.rmtree(folder / "w", ignore_errors=True)
    (folder / "plain.bin").unlink(missing_ok=True)
    return out


def clean(lab: Lab) -> None:
    for h in lab.hosts:
        for p in ("scp.bin", "sftp.bin"):
            (h.home / p).unlink(missing_ok=True)
        shutil.rmtree(h.home / "m1000-fleet" / "incoming", ignore_errors=True)


def spread(xs: list[float]) -> str:
    return f"min {min(xs):.2f} / median {statistics.median(xs):.2f} / max {max(xs):.2f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sftp", action="store_true", help="also paramiko SFTP (default windows), as a reference")
    ap.add_argument("--anchors", default=",".join(ANCHORS),
                    help=f"comma-separated, of {', '.join(ANCHORS)} (scp-gcm: scp -c {PUSH_CIPHER}, push's cipher)")
    ap.add_argument("--goal-anchor", choices=ANCHORS, default=ANCHORS[0],
                    help="the anchor the 0.95 goal is checked against (every anchor is printed)")
    args = ap.parse_args()
    args.anchors = [a.strip() for a in args.anchors.split(",") if a.strip()]
    if not set(args.anchors) <= set(ANCHORS) or args.goal_anchor not in args.anchors:
        ap.error(f"--anchors: of {', '.join(ANCHORS)}, including --goal-anchor {args.goal_anchor}")
    problem = capability_problem()
    if problem:
        print(f"bench/push.py: skipped: {problem}")
        return 0
    size = args.size_mib << 20
    total = size * 3
    print(f"bench/push.py: {args.size_mib} MiB to 3 namespace hosts in parallel, {args.rounds} round(s), "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="f7bench-") as tmp, Lab() as lab:
        src = Path(tmp) / "release.tar.gz"
        make_file(src, size)
        t = time.monotonic()
        digest = sha256_file(src)
        print(f"  sha256 of the file on the controller (fleetctl push without --sha256, once for all modules): "
              f"{time.monotonic() - t:.2f} s", flush=True)
        side = module_side_cpu(src, digest, Path(tmp))
        print("  module side alone, fed by cat through a pipe, CPU per GiB: "
              + ", ".join(f"{k} {v / (size / (1 << 30)):.2f} s" for k, v in side.items()), flush=True)
        every: dict[str, Callable[[], float]] = {
            "scp": lambda: scp_all(lab, src),
            "scp+sync": lambda: scp_all(lab, src, sync=True),
            "scp-gcm": lambda: scp_all(lab, src, cipher=PUSH_CIPHER),
            "push": lambda: push_all(lab, src, digest),
        }
        methods = {k: fn for k, fn in every.items() if k == "push" or k in args.anchors}
        if args.sftp:
            methods["sftp"] = lambda: sftp_all(lab, src)
        anchors = [k for k in methods if k.startswith("scp")]
        rounds: list[dict[str, list[Took]]] = []
        for n in range(args.rounds):
            got: dict[str, list[Took]] = {k: [] for k in methods}
            for k in [*methods, *reversed(methods)]:  # A B C C B A: the order effect cancels in the round
                clean(lab)
                os.sync()  # the previous transfer's dirty pages are not this one's cost
                got[k].append(timed(methods[k]))
            rounds.append(got)
            cells = []
            for k, ts in got.items():
                wall = sum(t.wall for t in ts)
                cells.append(f"{k} {2 * total / wall / 1e6:.0f} MB/s, sender CPU {sum(t.cpu for t in ts) / 2:.1f} s"
                             + (f", sync {max(t.sync for t in ts):.2f} s" if k in ("scp+sync", "push") else ""))
            ratio = {a: sum(t.wall for t in got[a]) / sum(t.wall for t in got["push"]) for a in anchors}
            print(f"  round {n + 1}: {'; '.join(cells)}; "
                  + ", ".join(f"push/{a} {r:.2f}" for a, r in ratio.items()), flush=True)
        clean(lab)
    print("  all rounds, aggregate:")
    for k in methods:
        walls = [t.wall for r in rounds for t in r[k]]
        cpus = [t.cpu for r in rounds for t in r[k]]
        print(f"    {k:9s} {total / statistics.mean(walls) / 1e6:7.1f} MB/s  sender CPU {statistics.mean(cpus):5.1f} s"
              f"  (runs: {', '.join(f'{w:.1f}s' for w in walls)})")
    ratios = {a: [sum(t.wall for t in r[a]) / sum(t.wall for t in r["push"]) for r in rounds]
              for a in anchors}
    for a, rs in ratios.items():
        mark = f"  <- goal >= {GOAL} in every round" if a == args.goal_anchor else ""
        print(f"  push/{a} throughput ratio per round: {spread(rs)}  ({', '.join(f'{r:.2f}' for r in rs)}){mark}")
    if "sftp" in methods:
        sftp = statistics.mean(t.wall for r in rounds for t in r["sftp"])
        scp = statistics.mean(t.wall for r in rounds for t in r["scp"])
        print(f"  paramiko SFTP (default windows)/scp: {scp / sftp:.2f}")
    return 0 if min(ratios[args.goal_anchor]) >= GOAL else 1


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
