"""The environment fingerprint of a run (:class:`contract.fingerprint.EnvFingerprint`), gathered once the
release is set up: pure planners and parsers, :func:`gather` over a runner, and :func:`probe_run`, the
pipeline's runner (its executor, the agent's one seam with processes).

Where each field comes from, cheapest first:

- the driver and firmware: what the telemetry sampler read from the device tool's ``--query --json`` (the
  published ``mthreads-gmi`` shape), else the tool asked once (``--query --json``, else ``-q`` text, whose
  ``Driver Version`` and ``MTBios Version`` / ``VBIOS Version`` lines ``nvidia-smi`` prints too);
- MUSA, torch_musa, Triton, TileLang: one fixed Python snippet run with the release's interpreter in its
  environment after ``setup_env.sh`` (package metadata only: nothing is imported, no torch start-up), else
  variables the release's ``setup_env.sh`` exports (:data:`ENV_VERSIONS`);
- kernel and OS: ``uname`` and ``/etc/os-release`` of the agent's own process; the agent's version.

Commands are fixed argument lists (no shell, nothing interpolated); each probe has a timeout, and a probe
that fails, hangs or prints nonsense leaves its fields ``"unknown"``: a fingerprint never fails a run.
"""

from __future__ import annotations

import json
import logging
import platform
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from agent.telemetry.gmi_json import JSON_FLAGS, NotGmiJson, parse_json
from agent.telemetry.plan import choose_tool
from contract.fingerprint import UNKNOWN, EnvFingerprint
from contract.version import agent_version

if TYPE_CHECKING:
    from agent.pipeline import Run

log = logging.getLogger(__name__)

# (argv, environment) -> stdout when the command exited 0, else None (failed, timed out, missing)
Runner = Callable[[Sequence[str], Mapping[str, str]], "str | None"]

# variables a release's setup_env.sh may export, read when its Python has no such package
ENV_VERSIONS: dict[str, str] = {"musa": "MUSA_VERSION", "torch_musa": "TORCH_MUSA_VERSION",
                                "triton": "TRITON_VERSION", "tilelang": "TILELANG_VERSION"}
# run by the release's Python: the versions it has, as JSON (metadata only, no import of torch)
VERSIONS_SNIPPET = """\
import json, os
from importlib import metadata
out = {}
for field, dist in (("torch_musa", "torch_musa"), ("triton", "triton"), ("tilelang", "tilelang")):
    try:
        out[field] = metadata.version(dist)
    except Exception:
        pass
home = os.environ.get("MUSA_HOME") or os.environ.get("MUSA_PATH") or "/usr/local/musa"
try:
    with open(os.path.join(home, "version.txt"), encoding="utf-8") as f:
        out["musa"] = f.read(200).strip().splitlines()[0]
except Exception:
    pass
print(json.dumps(out))
"""
_LINE = re.compile(r"^\s*(Driver Version|MTBios Version|VBIOS Version)\s*:\s*(\S.*?)\s*$", re.MULTILINE)
_CLEAN = re.compile(r"[^\x20-\x7e]")


def clean(value: object) -> str:
    """A probe's value as recorded: printable ASCII, at most 200 characters; ``"unknown"`` when empty or N/A."""
    text = _CLEAN.sub("", str(value)).strip()[:200]
    return text if text and text.lower() not in ("n/a", "[n/a]", "none") else UNKNOWN


def python_argv(env: Mapping[str, str]) -> list[str]:
    """The release's interpreter (``$PYTHON``, as its scripts use it, else ``python3``) running the snippet."""
    return [env.get("PYTHON") or "python3", "-c", VERSIONS_SNIPPET]


def parse_versions(stdout: str | None, env: Mapping[str, str]) -> dict[str, str]:
    """The snippet's JSON, each field it lacks from :data:`ENV_VERSIONS`, else ``"unknown"``."""
    found: dict[str, object] = {}
    if stdout:
        try:
            doc = json.loads(stdout.strip().splitlines()[-1])
            found = doc if isinstance(doc, dict) else {}
        except (ValueError, IndexError):
            found = {}
    return {f: clean(found.get(f) or env.get(var) or "") for f, var in ENV_VERSIONS.items()}


def parse_device(json_out: str | None, q_out: str | None) -> tuple[str, str]:
    """(driver, firmware) from ``--query --json``, else from ``-q`` text; distinct firmware joined by ','."""
    if json_out:
        try:
            got = parse_json(json_out)
            return clean(got.driver or ""), clean(",".join(sorted(set(got.firmware.values()))))
        except NotGmiJson:
            pass
    lines: dict[str, list[str]] = {}
    for label, value in _LINE.findall(q_out or ""):
        lines.setdefault(label, []).append(value)
    firmware = lines.get("MTBios Version") or lines.get("VBIOS Version") or []
    return clean((lines.get("Driver Version") or [""])[0]), clean(",".join(sorted(set(firmware))))


def _is_json(text: str | None) -> bool:
    try:
        return text is not None and bool(parse_json(text).readings)
    except NotGmiJson:
        return False


def os_name(text: str | None) -> str:
    """``PRETTY_NAME`` of an ``/etc/os-release`` text (quotes removed)."""
    for line in (text or "").splitlines():
        name, _, value = line.partition("=")
        if name.strip() == "PRETTY_NAME":
            return clean(value.strip().strip("\"'"))
    return UNKNOWN


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")[:4096]
    except OSError:
        return None


def gather(run: Runner, env: Mapping[str, str], *, tool: str | None, release: str,
           device: tuple[str, str] | None = None, os_release: Path = Path("/etc/os-release")) -> EnvFingerprint:
    """The fingerprint: ``device`` (driver, firmware) where the sampler already read them, else the device
    ``tool`` (None: none, or not to be asked), and the release's Python, asked through ``run`` in the release's
    environment ``env``. Never raises for what a probe does."""
    if device is None:
        json_out = run([tool, *JSON_FLAGS], env) if tool else None
        q_out = run([tool, "-q"], env) if tool and not _is_json(json_out) else None
        device = parse_device(json_out, q_out)
    driver, firmware = (clean(x) for x in device)
    versions = parse_versions(run(python_argv(env), env), env)
    return EnvFingerprint(driver=driver, firmware=firmware, **versions, kernel=clean(platform.release()),
                          os=os_name(_read(os_release)), agent=clean(agent_version()), release=clean(release))


def probe_run(run: Run, top: Path, env: Mapping[str, str], timeout: float = 10.0) -> EnvFingerprint:
    """:func:`gather` for the pipeline's run: each probe through its executor (in the run's process group, killed
    past ``timeout``, the device tool past the sampler's own timeout), in the release folder, its output kept out
    of the step logs; never raises.

    The sampler's driver and firmware are taken when it has them (its JSON answers); a tool the sampler found
    missing, hanging or failing before any sample is not asked again (a hanging tool must not hold the run)."""
    out = run.store.run_dir(run.req.run_id) / "fingerprint.out"
    tool = choose_tool(run.cfg.telemetry.tool, shutil.which)
    s, device = run.sampler, None
    if s is not None and s.driver:
        device = (s.driver, ",".join(sorted(set(s.firmware.values()))))
    elif s is not None and s.notes and not s.samples:
        tool = None

    def execute(argv: Sequence[str], penv: Mapping[str, str]) -> str | None:
        limit = min(timeout, run.cfg.telemetry.timeout_s) if argv[0] == tool else timeout
        try:
            res = run.ex.run(argv, env=penv, cwd=top, log_path=out.with_suffix(".log"), timeout=limit,
                             cancel=run.cancel, raw_stdout=out, log_stdout=False)
            return out.read_text(encoding="utf-8", errors="replace") if res.ok else None
        except OSError:
            return None
        finally:
            out.unlink(missing_ok=True)

    try:
        return gather(execute, env, tool=tool, release=run.release, device=device)
    except Exception:  # a fingerprint must never fail the run
        log.exception("environment fingerprint of %s failed (recorded as unknown)", run.req.run_id)
        return EnvFingerprint(release=clean(run.release))
