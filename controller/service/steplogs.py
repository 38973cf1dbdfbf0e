"""The step logs a run left on its modules: read from a local module's workdir, or over SSH.

A log is named ``NN-step[-key].log``; :func:`parse_log_name` reads the step and model key back.

Lazy imports: :mod:`controller.remote.ssh` is imported when a log is read over SSH: it loads paramiko and
fabric (143 and 155 ms CPU a fresh process, ``bench/import_costs.py``:
bench/results/import_costs_20261207_0346_lazy-libraries.txt), which a local module's logs
do not need.
"""

from __future__ import annotations

from pathlib import Path

from contract.records import MODEL_KEYS
from contract.vocab import LOG_STEPS
from controller.fleet.kernel_logs import logs_folder
from controller.inventory import Module
from controller.service.lifecycle import check_run_id, find_run
from controller.service.records import LogFile
from controller.service.session import BadRequest, NotFound, Session


def logs(s: Session, run: str, *, module: str | None = None, step: str | None = None,
         key: str | None = None, kernel: bool = False) -> list[LogFile]:
    """The step logs a run left on its modules (local modules: their workdir; SSH modules: over SSH); ``kernel``:
    instead, the kernel log and agent journal tails the controller kept (:mod:`controller.fleet.kernel_logs`)."""
    info = find_run(s, run)
    if step is not None and step not in LOG_STEPS:
        raise BadRequest(f"--step {step!r}: no such step (the steps with logs: {', '.join(LOG_STEPS)})")
    if key is not None and key not in MODEL_KEYS:
        raise BadRequest(f"--key {key!r}: no such model key (known: {', '.join(MODEL_KEYS)})")
    names = [m for m in info.modules if module is None or m == module]
    if module is not None and not names:
        raise NotFound(f"run {info.run_id} did not run on module {module!r} (modules: {', '.join(info.modules)})")
    if kernel:
        return [f for name in names for f in _kept_logs(s, info.run_id, name)]
    known = {m.name: m for m in s.inventory().modules}
    out: list[LogFile] = []
    for name in names:
        m = known.get(name)
        if m is None:
            raise NotFound(f"module {name!r} of run {info.run_id} is no longer in {s.settings.inventory}")
        files = _local_logs(m, info.run_id) if m.transport == "local" else _remote_logs(s, m, info.run_id)
        out += [f for f in files if (step is None or f.step == step) and (key is None or f.model_key == key)]
    return out


def _kept_logs(s: Session, run_id: str, module: str) -> list[LogFile]:
    folder = logs_folder(s.settings.data_dir, check_run_id(run_id), module)
    return [LogFile(module, p.name, "kernel", None, str(p), p.read_text(encoding="utf-8", errors="replace"))
            for p in sorted(folder.glob("*.log"))] if folder.is_dir() else []


def parse_log_name(name: str) -> tuple[str, str | None]:
    """``07-benchmark-qwen35_mtp.log`` -> ("benchmark", "qwen35_mtp"); ``03-configure.log`` -> ("configure", None)."""
    _, _, rest = name.removesuffix(".log").partition("-")  # drop NN
    for k in sorted(MODEL_KEYS, key=len, reverse=True):
        if rest.endswith("-" + k):
            return rest[: -len(k) - 1], k
    return rest, None


def _local_logs(m: Module, run_id: str) -> list[LogFile]:
    folder = Path(m.workdir).expanduser() / "runs" / check_run_id(run_id) / "logs"
    if not folder.is_dir():
        return []
    out = []
    for p in sorted(folder.glob("*.log")):
        step, model_key = parse_log_name(p.name)
        out.append(LogFile(m.name, p.name, step, model_key, str(p), p.read_text(encoding="utf-8", errors="replace")))
    return out


_REMOTE_LOGS = r"""
import json, os, sys
d = os.path.join(os.path.expanduser(sys.argv[1]), "runs", sys.argv[2], "logs")
out = {}
if os.path.isdir(d):
    for n in sorted(os.listdir(d)):
        if n.endswith(".log"):
            with open(os.path.join(d, n), "rb") as fh:
                out[n] = fh.read(4 << 20).decode("utf-8", "replace")
print(json.dumps(out))
"""


def _remote_logs(s: Session, m: Module, run_id: str) -> list[LogFile]:
    from controller.remote import ssh

    target = ssh.SshTarget.of(m, s.settings.known_hosts, s.settings.ssh_key)
    with ssh.open_session(target) as sess:
        found = sess.python("python3", _REMOTE_LOGS, m.workdir, check_run_id(run_id), what="read step logs")
    out = []
    for name, text in sorted(found.items()):
        step, model_key = parse_log_name(str(name))
        out.append(LogFile(m.name, str(name), step, model_key, f"{m.host}:{m.workdir}/runs/{run_id}/logs/{name}",
                           str(text)))
    return out
