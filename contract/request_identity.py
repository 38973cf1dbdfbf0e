"""What makes two run requests the same request, and one line naming what differs (pure): a module answers a run
id only for the request it recorded under it (:mod:`agent.task`)."""

from __future__ import annotations

import posixpath
from typing import NamedTuple

from contract.records import RunRequest


class RequestIdentity(NamedTuple):
    """What makes two run requests the same request (see :func:`request_identity`)."""

    run_id: str
    module: str
    sha256: str
    release: str
    models: tuple[str, ...]
    model_root: str
    model_paths: tuple[tuple[str, str], ...]
    key_env: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]


def request_identity(req: RunRequest) -> RequestIdentity:
    """The fields that say what a run measures, normalised (pure).

    A module answers a request from its record of a run, or resumes that run, only when the record
    is of the same request: a record says what was measured, so two requests are the same when they
    measure the same thing on the same module under the same run id:

    - ``run_id`` and ``module``: the record's name;
    - ``sha256`` (lower case): the release's content, what is benchmarked;
    - ``release``: its label (``release``, else the tarball's file name, as the pipeline names it),
      written into every progress and row of the record: a record with another label would be taken
      for another release by the controller;
    - ``models``: which keys are measured, as a set (their order changes when, not what);
    - ``model_root``, ``model_paths`` and ``key_env`` of the requested keys (empty ones dropped): which
      weights are loaded and how the servers start (a flag in ``key_env`` changes the figures).

    Not part of it: ``tarball`` is where the release lies on the module (a location: two controllers
    stage the same content under different paths), ``max_attempts`` is how often a delivery may be
    retried (a policy of the controller, not what is measured), ``schema_version`` how it was written.
    """
    keys = sorted(set(req.models))
    return RequestIdentity(
        run_id=req.run_id, module=req.module, sha256=req.sha256.strip().lower(), release=release_label(req),
        models=tuple(keys), model_root=posixpath.normpath(req.model_root) if req.model_root else "",
        model_paths=tuple((k, posixpath.normpath(req.model_paths[k])) for k in keys if req.model_paths.get(k)),
        key_env=tuple((k, tuple(sorted(req.key_env[k].items()))) for k in keys if req.key_env.get(k)),
    )


def release_label(req: RunRequest) -> str:
    """The release's name in a run's records: ``release``, else the tarball's file name."""
    return req.release or posixpath.basename(req.tarball)


def release_difference(recorded: RunRequest, request: RunRequest) -> str | None:
    """One line saying that ``request`` is for another release than the ``recorded`` request of its run id
    (sha256 or label), or None."""
    a, b = request_identity(recorded), request_identity(request)
    if (a.sha256, a.release) == (b.sha256, b.release):
        return None
    return (f"run id {request.run_id} was used here for release sha256 {a.sha256[:12]}… ({a.release}); "
            f"this request is for {b.sha256[:12]}… ({b.release}): refused")


def request_difference(recorded: RunRequest, request: RunRequest) -> str | None:
    """One line naming what differs between ``request`` and the ``recorded`` request of its run id on this
    module (:func:`request_identity`), or None when they are the same request (pure)."""
    release = release_difference(recorded, request)
    if release is not None:
        return release
    a, b = request_identity(recorded), request_identity(request)
    was: list[str] = []
    now: list[str] = []

    def differ(what: str, old: str, new: str) -> None:
        was.append(f"{what} {_clip(old)}")
        now.append(f"{what} {_clip(new)}")

    if a.module != b.module:
        differ("module", a.module, b.module)
    if a.models != b.models:
        differ("models", ",".join(a.models) or "-", ",".join(b.models) or "-")
    if a.model_root != b.model_root:
        differ("model root", a.model_root, b.model_root)
    if a.model_paths != b.model_paths:
        differ("model paths", _pairs(a.model_paths), _pairs(b.model_paths))
    if a.key_env != b.key_env:  # the variables' names only: a value may be a secret
        old_env, new_env = dict(a.key_env), dict(b.key_env)
        changed = sorted(k for k in {*old_env, *new_env} if old_env.get(k) != new_env.get(k))
        old_names, new_names = _env_names(old_env, changed), _env_names(new_env, changed)
        differ("key env", old_names, new_names if new_names != old_names else new_names + " (other values)")
    if not was:
        return None
    return f"run id {request.run_id} was used here with {', '.join(was)}; this request has {', '.join(now)}: refused"


def _clip(text: str, n: int = 120) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _pairs(items: tuple[tuple[str, str], ...]) -> str:
    return ",".join(f"{k}={v}" for k, v in items) or "-"


def _env_names(env: dict[str, tuple[tuple[str, str], ...]], keys: list[str]) -> str:
    return "; ".join(f"{k}: {','.join(name for name, _ in env[k]) if k in env else '-'}" for k in keys)
