"""Pure planners and parsers of the pipeline's steps.

A planner turns (release folder, request, config) into commands, environments and paths;
a parser turns what a step produced into data. Nothing here spawns a process or writes a
file: :mod:`agent.pipeline` runs the plans through :mod:`agent.executor`.
Commands are argument lists; values from the request or configuration reach the release's
scripts only as environment variables or as ``"$1"`` of a fixed shell snippet, never
interpolated into a shell command line.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agent.errors import BadInput
from agent.tables import TableError, parse_tables
from contract.layout import BENCHMARK, GENERATE, PRECOMPILE, SETUP_ENV, start_script
from contract.layout import CONFIG_JSON as CONFIG_JSON  # re-exported (the pipeline names it in its notes)
from contract.records import MODEL_KEYS, ResultRow, TableKind

ENV_SEPARATOR = b"\0--m1000-fleet-env-separator--\0"
# variables bash itself changes between the two dumps of the environment capture
_SHELL_NOISE = frozenset({"_", "SHLVL", "PWD", "OLDPWD", "BASH_EXECUTION_STRING"})


@dataclass(frozen=True)
class StepPlan:
    """One process to run: what, where, with which environment, for how long."""

    step: str
    argv: tuple[str, ...]
    cwd: Path
    env: Mapping[str, str] = field(default_factory=dict)
    timeout: float = 600.0
    model_key: str | None = None


def release_digest(sha256: str) -> str:
    return sha256.lower()[:16]


# ----- model folders and the workflow config -------------------------------------------


def model_folder(key: str, model_root: str | Path, overrides: Mapping[str, str]) -> Path:
    """The folder of ``key`` on this module: the request's override, else ``<root>/<default dir>``."""
    if key not in MODEL_KEYS:
        raise BadInput(f"unknown model key {key!r} (known: {', '.join(MODEL_KEYS)})")
    over = overrides.get(key)
    return Path(over) if over else Path(model_root) / MODEL_KEYS[key].model_dir


def model_folders(keys: Sequence[str], model_root: str | Path, overrides: Mapping[str, str]) -> list[str]:
    """Distinct folders of ``keys``, in order (two keys can share a model, e.g. qwen35 / qwen35_mtp)."""
    out: list[str] = []
    for k in keys:
        p = str(model_folder(k, model_root, overrides))
        if p not in out:
            out.append(p)
    return out


def configure_workflow(text: str, folders: Sequence[str], source: str = CONFIG_JSON) -> str:
    """The workflow config JSON with ``model_paths`` set to ``folders``; other keys kept."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadInput(f"{source}:{exc.lineno}: not valid JSON: {exc.msg}") from None
    if not isinstance(data, dict):
        raise BadInput(f"{source}: expected a JSON object at the top")
    data["model_paths"] = list(folders)
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def precompile_marker(sha256: str, folders: Sequence[str]) -> str:
    """File name marking a finished precompile of this release for this set of model folders."""
    digest = hashlib.sha256("\n".join(sorted(set(folders))).encode()).hexdigest()[:16]
    return f"{release_digest(sha256)}-{digest}.done"


# ----- environment --------------------------------------------------------------------


def plan_generate(top: Path, env: Mapping[str, str], timeout: float) -> StepPlan:
    return StepPlan("generate", ("bash", str(top / GENERATE)), top, env, timeout)


def plan_environment(top: Path, env: Mapping[str, str], timeout: float) -> StepPlan:
    """``source setup_env.sh`` in bash, then its environment dumped (NUL separated) after a separator.

    The environment before is the one the step is given (``env``): bash passes it on unchanged
    but for :data:`_SHELL_NOISE`, so it is not dumped too (an ``env`` process fewer per run).
    """
    snippet = 'printf "\\0--m1000-fleet-env-separator--\\0"; source "$1" >&2 || exit $?; env -0'
    return StepPlan("environment", ("bash", "-c", snippet, "setup_env", str(top / SETUP_ENV)), top, env, timeout)


def _env0(blob: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in blob.split(b"\0"):
        if not item:
            continue
        name, sep, value = item.partition(b"=")
        if not sep:
            continue
        out[name.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return out


def parse_env_capture(blob: bytes, before: Mapping[str, str]) -> dict[str, str]:
    """Variables that ``setup_env.sh`` exported or changed (unset ones are not carried), from the step's output
    (:func:`plan_environment`) and the environment the step was given (``before``)."""
    _, sep, after = blob.partition(ENV_SEPARATOR)
    if not sep:
        raise BadInput("environment capture: no separator in the output (setup_env.sh did not run)")
    # compared as the dump reads them: bytes of the environment decoded as UTF-8, undecodable bytes replaced
    b = {k: os.fsencode(v).decode("utf-8", "replace") for k, v in before.items()}
    return {k: v for k, v in _env0(after).items() if k not in _SHELL_NOISE and b.get(k) != v}


def script_env(base: Mapping[str, str], captured: Mapping[str, str], *, host: str, port: int,
               cache_dir: Path) -> dict[str, str]:
    """Environment of every release script after ``setup_env.sh``."""
    env = dict(base)
    env.update(captured)
    env["SERVER_HOST"] = host
    env["SERVER_PORT"] = str(port)
    env["TILELANG_CACHE_DIR"] = str(cache_dir)
    return env


def plan_precompile(top: Path, env: Mapping[str, str], timeout: float) -> StepPlan:
    return StepPlan("precompile", ("bash", str(top / PRECOMPILE)), top, env, timeout)


# ----- per model key --------------------------------------------------------------------


def key_env(key: str, *extra: Mapping[str, str] | None) -> dict[str, str]:
    """The key's variables: ``MODEL_KEYS[key].env`` plus configured / requested extras (later wins)."""
    env = dict(MODEL_KEYS[key].env)
    for e in extra:
        if e:
            env.update(e)
    return env


def plan_server(top: Path, key: str, env: Mapping[str, str], kenv: Mapping[str, str]) -> StepPlan:
    script = top / start_script(key)
    return StepPlan("server", ("bash", str(script)), top, {**env, **kenv}, 0.0, key)


def plan_benchmark(top: Path, key: str, env: Mapping[str, str], kenv: Mapping[str, str],
                   timeout: float) -> StepPlan:
    return StepPlan("benchmark", ("bash", str(top / BENCHMARK)), top, {**env, **kenv, "MODEL_KEY": key},
                    timeout, key)


# a levelled log line: a timestamp, then one level letter (llama-server: ``0.00.007.195 E llama_model_load: ...``)
_LEVELLED = re.compile(r"^[\d.:T-]+\s+([EWIDT])\s+(\S.*)$")


def last_reason(tail: str, limit: int = 300) -> str:
    """The line of a dying process's output that says why, progress bars dropped.

    A real inference server that fails while loading prints a Python traceback (its last line,
    the exception, says why), often after progress bars redrawn with carriage returns; one that
    writes a levelled log (a timestamp and a level letter a line, as llama-server) says why in its
    first error line, and then what followed from it (``exiting due to model loading error``): there
    the first ``E`` line, without its timestamp.
    """
    lines = [raw.rsplit("\r", 1)[-1].strip() for raw in tail.splitlines()]
    errors = [m.group(2) for m in map(_LEVELLED.match, lines) if m and m.group(1) == "E"]
    for line in errors[:1] or reversed(lines):
        if line and not line.startswith(("Traceback", "File ", "^")):
            return line if len(line) <= limit else line[: limit - 3] + "..."
    return ""


# what a step's last output lines say of why it died, most specific first: (cause, pattern)
_CAUSES = (
    ("no space left on device", re.compile(r"no space left on device|ENOSPC|disk quota exceeded|EDQUOT", re.I)),
    ("out of memory", re.compile(r"out of memory|\bOOM\b|MemoryError|cannot allocate memory|ENOMEM|"
                                 r"std::bad_alloc|failed to allocate", re.I)),
    ("too many open files", re.compile(r"too many open files|EMFILE", re.I)),
    ("permission denied", re.compile(r"permission denied|EACCES|read-only file system|EROFS", re.I)),
)


_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b:?")


def failure_cause(tail: str, exit_code: int | None) -> str:
    """Why a step's process failed, in a few words, from its exit status and the output it ended with.

    A process killed by a signal says which (``killed by SIGKILL``; the kernel's OOM killer sends that one, so
    an out-of-memory line beside it is named too); a known cause among its last lines is named by its usual words
    and the line that said it ("no space left on device: OSError: [Errno 28] No space left on device: '/w/k.so'");
    else the exception a Python traceback ends with, or "" (a last line that is only progress says nothing).
    """
    said = ""
    lines = [raw.rsplit("\r", 1)[-1].strip() for raw in tail.splitlines()]
    for line in reversed(lines[-40:]):
        hit = next((name for name, rx in _CAUSES if rx.search(line)), None)
        if hit:
            said = hit if line.rstrip(".!").lower() == hit else f"{hit}: {line}"
            break
    if said and len(said) > 300:
        said = said[:297] + "..."
    if exit_code is not None and exit_code < 0:
        try:
            sig = signal.Signals(-exit_code).name
        except ValueError:
            sig = f"signal {-exit_code}"
        return f"killed by {sig}" + (f" ({said})" if said else "")
    if exit_code is not None and 128 < exit_code <= 128 + 64 and not said:  # a shell whose child a signal killed
        try:
            return f"a process it ran was killed by {signal.Signals(exit_code - 128).name}"
        except ValueError:
            pass
    if said:
        return said
    last = last_reason(tail)
    return last if _EXCEPTION.match(last) else ""


def health_url(host: str, port: int) -> str:
    h = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{h}:{port}/health"


def parse_benchmark(text: str, key: str, source: str = "") -> list[ResultRow]:
    """Rows of the benchmark's tables; every table shape ``key`` must produce has to be there."""
    tables = parse_tables(text, source)
    if not tables:
        raise TableError("no result table in the benchmark output", max(1, text.count("\n")), source)
    want: tuple[TableKind, ...] = MODEL_KEYS[key].tables
    got = {t.kind for t in tables}
    missing = [k for k in want if k not in got]
    if missing:
        raise TableError(f"no {missing[0]} table in the benchmark output of {key}", max(1, text.count("\n")),
                         source)
    by_profile: dict[str, ResultRow] = {}
    for r in (r for t in tables for r in t.rows):
        # a table printed twice (progress, then summary): the last one wins
        by_profile.pop(r.profile, None)
        by_profile[r.profile] = r
    return list(by_profile.values())
