"""Bench: `fleetctl push` next to plain `scp` (and paramiko SFTP) to three namespace hosts.

Builds the SSH lab of the tests (three sshd hosts in network namespaces, needs root),
then, in the same run, sends the same file to the three hosts in parallel with each method
and prints aggregate throughputs and the ratio push/scp of every round (min / median / max).
Push includes what scp does not: sha256 verification on arrival, fsync and the rename.

Fairness: before each timed transfer the previous one's files are removed and the page cache
is written back (``sync``), so that no method pays for another's dirty pages; and a round is
scp, push, push, scp (the second transfer of a pair runs ~20 % slower on this VM's disk,
whichever it is), its ratio the sum of scp's times over the sum of push's.

    .venv/bin/python bench/push.py            # 1 GiB, 3 rounds
    .venv/bin/python bench/push.py --size-mib 256 --rounds 5

Exit 1 when push reaches less than 0.95 of scp's throughput in any round.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import paramiko  # noqa: E402

from controller.inventory import Module  # noqa: E402
from controller.push import file_sha256, push_release  # noqa: E402
from tests.ssh.netns import Host, Lab, capability_problem  # noqa: E402

GOAL = 0.95  # push / scp throughput, every round


def make_file(path: Path, size: int) -> None:
    block = os.urandom(1 << 20)
    with path.open("wb") as f:
        for i in range(size >> 20):
            f.write(block[i % 7:] + block[: i % 7])  # distinct blocks, cheap to make


def scp_all(lab: Lab, src: Path) -> float:
    def one(h: Host) -> None:
        subprocess.run(["scp", "-q", "-F", "/dev/null", "-i", str(lab.client_key), "-o", "IdentitiesOnly=yes",
                        "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                        "-o", f"UserKnownHostsFile={lab.known_hosts}", str(src), f"{h.user}@{h.address}:scp.bin"],
                       check=True)

    t0 = time.monotonic()
    with ThreadPoolExecutor(len(lab.hosts)) as pool:
        list(pool.map(one, lab.hosts))
    return time.monotonic() - t0


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

    t0 = time.monotonic()
    with ThreadPoolExecutor(len(lab.hosts)) as pool:
        list(pool.map(one, lab.hosts))
    return time.monotonic() - t0


def push_all(lab: Lab, src: Path, digest: str) -> float:
    mods = [Module(name=h.name, host=h.address, ssh_user=h.user) for h in lab.hosts]
    t0 = time.monotonic()
    res = push_release(mods, src, digest, known_hosts=lab.known_hosts, identity=lab.client_key, retries=0)
    dt = time.monotonic() - t0
    bad = [r for r in res.values() if r.error or r.skipped]
    if bad:
        raise SystemExit(f"push failed: {bad}")
    return dt


def clean(lab: Lab) -> None:
    for h in lab.hosts:
        for p in ("scp.bin", "sftp.bin"):
            (h.home / p).unlink(missing_ok=True)
        shutil.rmtree(h.home / "m1000-fleet" / "incoming", ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-sftp", action="store_true", help="skip the paramiko SFTP reference")
    args = ap.parse_args()
    problem = capability_problem()
    if problem:
        print(f"bench/push.py: skipped: {problem}")
        return 0
    size = args.size_mib << 20
    with tempfile.TemporaryDirectory(prefix="f7bench-") as tmp, Lab() as lab:
        src = Path(tmp) / "release.tar.gz"
        make_file(src, size)
        digest = file_sha256(src)
        times: dict[str, list[float]] = {"scp": [], "push": [], "sftp": []}
        methods = {"scp": lambda: scp_all(lab, src), "push": lambda: push_all(lab, src, digest)}
        if not args.no_sftp:
            methods["sftp"] = lambda: sftp_all(lab, src)
        per_round: list[dict[str, float]] = []
        for _ in range(args.rounds):
            got = {k: 0.0 for k in methods}
            for k in [*methods, *reversed(methods)]:  # A B B A: the order effect cancels in the round
                clean(lab)
                os.sync()  # the previous transfer's dirty pages are not this one's cost
                t = methods[k]()
                times[k].append(t)
                got[k] += t
            per_round.append(got)
        clean(lab)
    total = size * 3
    rate = {k: total / (sum(v) / len(v)) / 1e6 for k, v in times.items() if v}
    print(f"bench/push.py: {args.size_mib} MiB to 3 namespace hosts in parallel, {args.rounds} round(s), "
          f"{os.cpu_count()} CPUs")
    for k, r in rate.items():
        print(f"  {k:5s} {r:7.1f} MB/s aggregate  (runs: {', '.join(f'{t:.1f}s' for t in times[k])})")
    ratios = [r["scp"] / r["push"] for r in per_round]
    print(f"  push/scp throughput ratio per round: min {min(ratios):.2f} / median {statistics.median(ratios):.2f} / "
          f"max {max(ratios):.2f}  ({', '.join(f'{r:.2f}' for r in ratios)}; goal >= {GOAL} in every round)")
    if "sftp" in rate:
        print(f"  paramiko SFTP (default windows)/scp: {rate['sftp'] / rate['scp']:.2f}")
    return 0 if min(ratios) >= GOAL else 1


if __name__ == "__main__":
    raise SystemExit(main())
