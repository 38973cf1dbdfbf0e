"""Validation of a run request on the agent, before anything runs.

Whoever can write to the broker can put a message on a module's queue: the request is
treated as hostile until checked. :func:`validate_request` turns the task's argument into
a :class:`RunRequest` or raises :class:`RefusedRequest` naming the field and why:

- the whole payload is a JSON object of bounded size, ``schema_version`` this agent's contract version or the one
  before (:func:`contract.compat.runs_request`: a controller one version behind is served);
- ``run_id`` matches :data:`contract.records.RUN_ID_PATTERN`; ``module`` is this agent's;
- ``models`` are known model keys, bounded in number, no duplicates;
- ``key_env``: only requested model keys; variable names match :data:`ENV_NAME` and are not
  in the deny list (:func:`env_name_problem`: loader, interpreter and shell start-up
  variables, the agent's own); counts and value lengths bounded; no NUL;
- ``tarball``: an absolute path that, symlinks resolved, lies inside one of the allowed
  release roots (:meth:`AgentSettings.allowed_release_roots`); the request that comes back
  names the resolved path, so what is checked is what is read;
- ``model_root`` and ``model_paths``: absolute, bounded, no control characters;
- ``sha256`` 64 hex digits, ``release`` short and printable, ``max_attempts`` small.

Each check is a pure function of the payload (or the parsed request) returning a :class:`Refusal` or None;
:func:`check_request` is the decision, in the order above, and :func:`validate_request` applies it, resolving the
tarball's path on disk for :func:`tarball_refusal` (the one step that reads the file system).

A refused request runs nothing: the worker records the run as failed for this module
(when the run id and module could be read) with ``refused request: <field>: <why>``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agent.errors import BadInput
from agent.settings import AgentSettings
from contract.compat import runs_request
from contract.records import (
    MODEL_KEYS,
    RUN_ID_RULE,
    SCHEMA_VERSION,
    RunProgress,
    RunRequest,
    RunState,
    StepError,
    is_run_id,
)

MAX_PAYLOAD_BYTES = 64 * 1024  # the JSON of one request, whole
MAX_PATH = 4096
MAX_RELEASE = 128
MAX_ENV_PER_KEY = 32
MAX_ENV_TOTAL = 128
MAX_ENV_VALUE = 4096
MAX_ATTEMPTS = 10

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
# Names that change how a program, the loader, an interpreter or the shell starts, and the
# agent's own variables. Compared case-insensitively.
DENY_ENV_NAMES = frozenset({
    "PATH", "IFS", "PS1", "PS2", "PS3", "PS4", "ENV", "BASH_ENV", "SHELLOPTS", "BASHOPTS", "CDPATH", "GLOBIGNORE",
    "PROMPT_COMMAND", "HOME", "SHELL", "TMPDIR", "HOSTALIASES", "LOCALDOMAIN", "RES_OPTIONS", "NLSPATH",
    "LOCPATH", "GCONV_PATH", "GLIBC_TUNABLES", "PERL5LIB", "PERL5OPT", "PERLLIB", "RUBYOPT", "RUBYLIB",
    "NODE_OPTIONS", "NODE_PATH", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "BROWSER", "EDITOR", "PAGER",
    "GIT_SSH", "GIT_SSH_COMMAND", "GIT_EXEC_PATH", "SSH_ASKPASS", "SSL_CERT_FILE", "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY",
})
DENY_ENV_PREFIXES = ("BASH_FUNC_", "LD_", "PYTHON", "MALLOC_", "DYLD_", "FLEET_", "M1000_FLEET_", "CELERY_")
# Which interpreter a release runs is the module's choice (e.g. M1000_ENGINE_PYTHON), never a request's.
DENY_ENV_SUFFIXES = ("_PYTHON", "_PYTHONPATH")


class RefusedRequest(BadInput):
    """A run request the agent will not run: ``refused request: <field>: <why>``.

    ``run_id`` and ``module`` are set when the request carried them as valid strings, so
    the caller can still record the run as failed.
    """

    def __init__(self, field: str, why: str, *, run_id: str | None = None, module: str | None = None) -> None:
        self.field = field
        self.why = why
        self.run_id = run_id
        self.module = module
        super().__init__(f"refused request: {field}: {why}")


def env_name_problem(name: object) -> str | None:
    """Why ``name`` may not be set in a release script's environment, or None."""
    if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
        return f"variable name {_short(name)} is not [A-Za-z_][A-Za-z0-9_]* (at most 128)"
    up = name.upper()
    if up in DENY_ENV_NAMES or up.startswith(DENY_ENV_PREFIXES) or up.endswith(DENY_ENV_SUFFIXES):
        return f"variable {name} may not be set by a request"
    return None


def _short(value: object, n: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= n else text[: n - 3] + "..."


def _control(text: str) -> bool:
    return any(ord(c) < 32 or ord(c) == 127 for c in text)


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused: the ``field`` it got wrong and ``why``, the decision :class:`RefusedRequest`
    carries. Each check below returns one, or None where its part of the request is good."""

    field: str
    why: str


def path_refusal(field: str, value: str) -> Refusal | None:
    """``value`` is not an absolute path of bounded length without control characters."""
    if not value:
        return Refusal(field, "empty path")
    if len(value) > MAX_PATH:
        return Refusal(field, f"path longer than {MAX_PATH} characters")
    if _control(value):
        return Refusal(field, "control character (NUL, newline, ...) in path")
    if not value.startswith("/"):
        return Refusal(field, f"{_short(value)} is not an absolute path")
    return None


def within(path: Path, roots: list[Path]) -> bool:
    return any(path == r or r in path.parents for r in roots)


def readable_ids(payload: object, module: str) -> tuple[str | None, str | None]:
    """The run id and module ``payload`` names, each where it is valid (and the module this agent's), else None:
    what a refused run is recorded under."""
    if not isinstance(payload, dict):
        return None, None
    raw_run, raw_module = payload.get("run_id"), payload.get("module")
    run_id = raw_run if is_run_id(raw_run) else None
    return run_id, raw_module if isinstance(raw_module, str) and raw_module == module else None


def size_refusal(payload: dict[str, Any]) -> Refusal | None:
    """The payload is not plain JSON data, or its JSON is over :data:`MAX_PAYLOAD_BYTES`."""
    try:
        size = len(json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
    except (TypeError, ValueError, RecursionError):
        return Refusal("payload", "not plain JSON data")
    if size > MAX_PAYLOAD_BYTES:
        return Refusal("payload", f"{size} bytes, more than {MAX_PAYLOAD_BYTES}")
    return None


def version_refusal(payload: dict[str, Any]) -> Refusal | None:
    """``schema_version`` is neither this agent's contract version nor the one before."""
    version = payload.get("schema_version", SCHEMA_VERSION)
    if type(version) is int and runs_request(version):
        return None
    todo = "upgrade this agent (fleetctl deploy)" if type(version) is int and version > SCHEMA_VERSION \
        else "upgrade the controller"
    return Refusal("schema_version", f"{_short(version)} is not {SCHEMA_VERSION - 1} or {SCHEMA_VERSION} (this "
                                     f"agent's contract and the one before): {todo}")


def identity_refusal(payload: dict[str, Any], module: str) -> Refusal | None:
    """``run_id`` does not match the pattern, or ``module`` is missing or not ``module`` (this agent's)."""
    raw_run, raw_module = payload.get("run_id"), payload.get("module")
    if not is_run_id(raw_run):
        return Refusal("run_id", "missing" if raw_run is None else f"{_short(raw_run)} does not match {RUN_ID_RULE}")
    if not isinstance(raw_module, str):
        return Refusal("module", "missing" if raw_module is None else f"{_short(raw_module)} is not a string")
    if raw_module != module:
        return Refusal("module", f"run for module {_short(raw_module)} reached {module!r}")
    return None


def parse_request(payload: dict[str, Any]) -> RunRequest | Refusal:
    """``payload`` as a :class:`RunRequest`, or the first field its schema refuses."""
    try:
        return RunRequest.model_validate(payload)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first.get("loc", ())) or "payload"
        return Refusal(loc, str(first.get("msg", "invalid")))


def scalar_refusal(req: RunRequest) -> Refusal | None:
    """``sha256`` not 64 hex digits, ``release`` long or with control characters, ``max_attempts`` out of range."""
    sha = req.sha256
    if len(sha) != 64 or any(c not in "0123456789abcdefABCDEF" for c in sha):
        return Refusal("sha256", "not 64 hex digits")
    if len(req.release) > MAX_RELEASE or _control(req.release):
        return Refusal("release", f"longer than {MAX_RELEASE} characters or with control characters")
    if not 1 <= req.max_attempts <= MAX_ATTEMPTS:
        return Refusal("max_attempts", f"{req.max_attempts} is not within 1..{MAX_ATTEMPTS}")
    return None


def models_refusal(req: RunRequest) -> Refusal | None:
    """``models`` empty, too many, an unknown key or a key twice."""
    if not req.models:
        return Refusal("models", "no model key")
    if len(req.models) > len(MODEL_KEYS):
        return Refusal("models", f"{len(req.models)} keys, more than the {len(MODEL_KEYS)} known")
    for k in req.models:
        if k not in MODEL_KEYS:
            return Refusal("models", f"unknown model key {_short(k)}")
    if len(set(req.models)) != len(req.models):
        return Refusal("models", "a model key is given twice")
    return None


def model_paths_refusal(req: RunRequest) -> Refusal | None:
    """``model_root`` or a ``model_paths`` entry not an absolute path, or an entry of an unknown key."""
    found = path_refusal("model_root", req.model_root)
    if found:
        return found
    if len(req.model_paths) > len(MODEL_KEYS):
        return Refusal("model_paths", "more entries than known model keys")
    for k, p in req.model_paths.items():
        if k not in MODEL_KEYS:
            return Refusal("model_paths", f"unknown model key {_short(k)}")
        found = path_refusal(f"model_paths.{k}", p)
        if found:
            return found
    return None


def key_env_refusal(req: RunRequest) -> Refusal | None:
    """The release scripts' extra environment: only requested keys, allowed names, bounded counts and values."""
    total = 0
    for k, env in req.key_env.items():
        if k not in req.models:
            return Refusal("key_env", f"{_short(k)} is not a requested model key")
        if len(env) > MAX_ENV_PER_KEY:
            return Refusal(f"key_env.{k}", f"{len(env)} variables, more than {MAX_ENV_PER_KEY}")
        total += len(env)
        for name, value in env.items():
            problem = env_name_problem(name)
            if problem:
                return Refusal(f"key_env.{k}", problem)
            if len(value) > MAX_ENV_VALUE:
                return Refusal(f"key_env.{k}.{name}", f"value longer than {MAX_ENV_VALUE} characters")
            if "\x00" in value:
                return Refusal(f"key_env.{k}.{name}", "NUL in value")
    if total > MAX_ENV_TOTAL:
        return Refusal("key_env", f"{total} variables, more than {MAX_ENV_TOTAL}")
    return None


def tarball_path_refusal(req: RunRequest) -> Refusal | None:
    """``tarball`` not an absolute path (checked before it is resolved)."""
    return path_refusal("tarball", req.tarball)


# The checks of a parsed request, in the order a refusal names the first one failed.
REQUEST_CHECKS: tuple[Callable[[RunRequest], Refusal | None], ...] = (
    scalar_refusal, models_refusal, model_paths_refusal, key_env_refusal, tarball_path_refusal)


def check_request(payload: object, module: str) -> RunRequest | Refusal:
    """The decision on ``payload`` for the agent of ``module``, short of the tarball's place on disk (see
    :func:`tarball_refusal`): the parsed request, or the first :class:`Refusal`. Pure."""
    if not isinstance(payload, dict):
        return Refusal("payload", f"a JSON object was expected, got {type(payload).__name__}")
    first = size_refusal(payload) or version_refusal(payload) or identity_refusal(payload, module)
    if first:
        return first
    req = parse_request(payload)
    if isinstance(req, Refusal):
        return req
    for check in REQUEST_CHECKS:
        found = check(req)
        if found:
            return found
    return req


def tarball_refusal(req: RunRequest, resolved: Path, roots: list[Path]) -> Refusal | None:
    """The tarball, resolved to ``resolved`` (every symlink followed), lies in none of the release ``roots``:
    the refusal says which folder to allow."""
    if within(resolved, roots):
        return None
    shown = f" (resolves to {resolved})" if str(resolved) != req.tarball else ""
    folder = _release_folder(resolved, req.sha256)
    return Refusal("tarball", f"{_short(req.tarball, 200)}{shown} is outside the release roots "
                              f"({', '.join(str(r) for r in roots)}): to allow it, add {str(folder)!r} to "
                              f"release_roots in the agent's [agent] section (or FLEET_RELEASE_ROOTS="
                              f"'{json.dumps([str(folder)])}'), or give the agent the controller's data_dir")


def validate_request(payload: object, settings: AgentSettings) -> RunRequest:
    """The checked :class:`RunRequest` of ``payload``, naming the tarball's resolved path (what is checked is
    what is read), or :class:`RefusedRequest`: :func:`check_request`, then the tarball's path resolved on disk
    and :func:`tarball_refusal`."""
    checked = check_request(payload, settings.module)
    if isinstance(checked, RunRequest):
        resolved = Path(os.path.realpath(checked.tarball))
        refusal = tarball_refusal(checked, resolved, settings.allowed_release_roots())
        if refusal is None:
            same = str(resolved) == checked.tarball
            return checked if same else checked.model_copy(update={"tarball": str(resolved)})
        checked = refusal
    run_id, module = readable_ids(payload, settings.module)
    raise RefusedRequest(checked.field, checked.why, run_id=run_id, module=module)


def _release_folder(tarball: Path, sha256: str) -> Path:
    """The folder to allow for ``tarball``: the root above the ``<sha256>/`` folder of a staged release
    (``<data_dir>/releases/<sha256>/<name>``: every later release too), else the tarball's own folder."""
    parent = tarball.parent
    return parent.parent if parent.name == sha256.lower() else parent


def refused_progress(exc: RefusedRequest, settings: AgentSettings, now: float) -> RunProgress | None:
    """The failed state to publish for a refused request, when it names a run of this module."""
    if exc.run_id is None or exc.module != settings.module:
        return None
    return RunProgress(run_id=exc.run_id, module=exc.module, state=RunState.FAILED, step="dispatch",
                       updated_at=now, finished_at=now, error=StepError(step="dispatch", message=str(exc)))


# --------------------------------------------------------------------------- local transport
def local_release_path(data_dir: Path, sha256: str, name: str) -> Path:
    """Where a release for modules of the local transport lives: ``<data_dir>/releases/<sha256>/<name>``."""
    return Path(data_dir).expanduser().resolve() / "releases" / sha256 / name


def stage_local_release(tarball: Path, sha256: str, data_dir: Path) -> Path:
    """Put ``tarball`` under the data folder's release root (hard link, else copy), atomically; its path."""
    dest = local_release_path(data_dir, sha256, tarball.name)
    src = Path(tarball).resolve()
    if dest.is_file() and dest.stat().st_size == src.stat().st_size:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.{os.getpid()}.part"
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    try:
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)
        os.replace(tmp, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return dest
