"""The end of a module's kernel log and of its agent's journal, read on the module (over SSH, or here for a module
whose transport is local): what explains a hang, a lost module or a failed key.

One Python program runs there and answers one JSON object, name -> text: ``kernel-previous-boot`` (``journalctl -k
-b -1``: the boot a power cycle ended, where a hang left its trace), ``kernel`` (``journalctl -k``, else ``dmesg``),
``agent`` (the agent's user unit's journal, else ``<workdir>/agent/agent.log`` of the supervisor deploy writes).
What cannot be read says why in its place. Nothing from the inventory reaches a shell: the program's arguments are
quoted words (:func:`controller.remote.ssh.remote_command`).

Lazy imports: :mod:`controller.remote.ssh` is imported for a module reached over SSH only: it loads fabric and
paramiko (155 ms of CPU, ``bench/import_costs.py``: bench/results/import_costs_20261207_0346_lazy-libraries.txt),
which the logs of a module whose transport is local (the simulator's, the demo's) never need.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from controller.inventory import Module

LINES = 200  # the tail of each log
TIMEOUT = 30.0

_READ = r"""
import json, os, subprocess, sys
wd, n = os.path.expanduser(sys.argv[1]), sys.argv[2]
def run(argv):
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, str(exc)
    text = p.stdout if p.returncode == 0 else ""
    if not [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("-- No entries")]:
        return None, (p.stderr.strip() or p.stdout.strip() or "exit %d" % p.returncode).splitlines()[-1]
    return text, ""
def first(*tries):
    why = []
    for argv, tail in tries:
        text, err = run(argv)
        if text is not None:
            return "\n".join(text.splitlines()[-int(n):]) + "\n" if tail else text
        why.append("%s: %s" % (" ".join(argv[:2]), err))
    return "not available: " + "; ".join(why) + "\n"
out = {}
out["kernel-previous-boot"] = first((["journalctl", "-k", "-b", "-1", "-n", n, "--no-pager", "-o", "short-iso"], 0))
out["kernel"] = first((["journalctl", "-k", "-n", n, "--no-pager", "-o", "short-iso"], 0), (["dmesg", "-T"], 1),
                      (["dmesg"], 1))
agent = first((["journalctl", "--user", "-u", "fleet-agent.service", "-n", n, "--no-pager", "-o", "short-iso"], 0))
log = os.path.join(wd, "agent", "agent.log")
if agent.startswith("not available") and os.path.isfile(log):
    with open(log, "rb") as fh:
        fh.seek(max(0, os.path.getsize(log) - (1 << 20)))
        agent = "\n".join(fh.read().decode("utf-8", "replace").splitlines()[-int(n):]) + "\n"
out["agent"] = agent
print(json.dumps(out))
"""


def read_logs(m: Module, *, known_hosts: Path, identity: Path | None = None, lines: int = LINES) -> dict[str, str]:
    """The module's log tails (name -> text); :class:`controller.remote.ssh.SshError` when it cannot be reached."""
    if m.transport == "local":
        p = subprocess.run([sys.executable, "-c", _READ, m.workdir, str(lines)], capture_output=True, text=True,
                           timeout=TIMEOUT)
        found = json.loads(p.stdout.strip().splitlines()[-1])
    else:
        from controller.remote import ssh

        target = ssh.SshTarget.of(m, known_hosts, identity)
        with ssh.open_session(target) as sess:
            found = sess.python("python3", _READ, m.workdir, str(lines), what="read the kernel log",
                                timeout=TIMEOUT)
    return {str(k): str(v) for k, v in found.items()}
