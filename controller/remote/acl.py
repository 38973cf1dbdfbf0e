"""Redis ACL users for the fleet: one per module, one for the controller (``fleetctl broker acl``).

What the redis transport of kombu/Celery and the fleet's key-value records use (found with
``redis-cli MONITOR`` on a real run, and kombu's source), and so what each user may touch:

=============================================  ======================  ==================
key / channel                                  module ``M``            controller
=============================================  ======================  ==================
``module.M`` and its priority lists            BRPOP, LLEN, re-queue   LPUSH, LLEN
``module.M\\x06\\x16<n>``
``_kombu.binding.module.M``,                   SADD, SMEMBERS (own)    all
``_kombu.binding_permanent.module.M``
``unacked:module.M``, ``unacked_index:…``,     HSET/HDEL/ZADD/ZREM/    -
``unacked_mutex:…`` (per module, see           ZRANGE/SET NX, the
:func:`contract.celery_app.make_app`)             mutex's Lua script
``celery-task-meta-M:<run>`` (key + channel)   SETEX, GET, PUBLISH     GET, SUBSCRIBE
``m1000-fleet:hb:M``                           SET EX (fixed expiry)   MGET, PTTL (its age)
``m1000-fleet:{progress,rows,telemetry}:…:M``  SETEX + PUBLISH         GET/MGET
``m1000-fleet:cancel:M:<run>``                 read only, own only     SETEX
``m1000-fleet:cancel-run:<run>``               read only (MGET)        SETEX
``m1000-fleet:ack:M:<run>``                    read only, own only     SETEX
``m1000-fleet:preempt:M:<run>``                read only, own only     SETEX
``m1000-fleet:reserve:M``                      read only, own only     SET EX, MGET, DEL
``m1000-fleet:{lease,conflict}:M``             read/write, own only    all (conflict: PTTL)
=============================================  ======================  ==================

Commands a module may run are listed one by one (:data:`MODULE_COMMANDS`): no KEYS, SCAN,
FLUSH*, CONFIG, DEBUG, ACL, MONITOR, CLIENT KILL or LIST, SUBSCRIBE (CLIENT ID and UNBLOCK: an agent that
stops ends its own BRPOP at once, :mod:`contract.safe_transport`). The controller has every
command but the ``@dangerous`` ones. Both may run INFO (``@dangerous``, but read-only): the
agent and the controller read ``maxmemory`` and ``maxmemory-policy`` from ``INFO memory`` when
they start and refuse an evicting broker (:mod:`contract.eviction`); CONFIG GET would also
show the passwords' settings. The default user is switched off.

Key patterns rely on module names and run ids holding no ``:`` and no glob characters
(the inventory and :data:`contract.records.RUN_ID_PATTERN` ensure it): a module reads its own
per-module cancel flags (``cancel:M:*``, the module in a fixed place) and the run-wide ones
(``cancel-run:*``), never another module's; likewise the acknowledgements of its final states
(``ack:M:*``) and its results (task ids ``<module>:<run>``,
:func:`contract.celery_app.task_id`). Passwords are stored hashed (``#<sha256>``)
in the ACL file; the clear passwords are only in ``passwords/<name>.password`` (0600),
which ``fleetctl deploy --module-credentials`` installs on each module.

Lazy imports: the rules' functions import :mod:`contract.celery_app`, :mod:`contract.kv` and
:mod:`contract.attest`, which load Celery (``celery.app.base`` 123 ms of CPU, ``bench/import_costs.py``:
bench/results/import_costs_20261207_0346_lazy-libraries.txt), when a rule is written: ``fleetctl --help``
imports this module for an option's default and stays at ~0.14 s of CPU in all (``bench/cli.py``).
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from controller.errors import FleetctlError

CONTROLLER_USER = "fleet-controller"

# Kinds of per-module records (``m1000-fleet:<kind>:...:<module>``) a module writes.
MODULE_WRITE_KINDS = ("hb", "progress", "rows", "telemetry", "lease", "conflict", "kc")
# Kinds that may also carry the module first (``m1000-fleet:<kind>:<module>:...``).
MODULE_PREFIX_KINDS: tuple[str, ...] = ()

MODULE_COMMANDS = (
    # connection
    "auth", "hello", "ping", "echo", "select", "quit", "reset", "client|setname", "client|getname",
    "client|id",
    # a stopping agent ends its own BRPOP at once (contract.safe_transport: close); another module's use of it can
    # only end a blocked command of someone else early (as its timeout would: a BRPOP polls again, a WAIT counts)
    "client|unblock",
    # queue (kombu redis transport)
    "brpop", "llen", "lpush", "rpush",
    # bindings
    "sadd", "smembers", "srem", "sismember",
    # unacked (kombu QoS) and its mutex
    "hset", "hget", "hdel", "zadd", "zrem", "zrange", "zrangebyscore", "zrevrangebyscore",
    "eval", "evalsha", "script|load", "script|exists",
    # results and records (Celery's redis backend)
    "get", "mget", "set", "setex", "psetex", "del", "expire", "pexpire", "exists", "publish",
    # a reservation's time left, by the broker's clock (contract.kv.KV.get_expiring)
    "pttl",
    # transactions
    "multi", "exec", "discard", "watch", "unwatch",
    # a run's final state waits for the replicas (Sentinel: agent.settings final_state_replicas)
    "wait",
    # INFO memory at start: an evicting broker is refused (contract.eviction)
    "info",
)

_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


class AclError(FleetctlError, ValueError):
    """A name the broker's ACL cannot hold (a user, a key pattern)."""


def _check_name(name: str) -> str:
    if not _SAFE_NAME.fullmatch(name):
        raise AclError(f"name {name!r}: ACL users and key patterns need 1-63 letters, digits, '.', '_', '-'")
    return name


def password_hash(password: str) -> str:
    return "#" + hashlib.sha256(password.encode("utf-8")).hexdigest()


def module_key_patterns(module: str) -> list[str]:
    """Keys ``module`` may read and write (its queue, bindings, unacked, results, records)."""
    from contract.attest import ATTEST_INDEX
    from contract.celery_app import queue_name, task_id
    from contract.kv import PREFIX

    m = _check_name(module)
    q = queue_name(m)
    pats = [q, f"{q}[^-A-Za-z0-9._]*",  # the queue and its priority lists (module.M\x06\x16<n>)
            f"_kombu.binding.{q}", f"_kombu.binding_permanent.{q}",
            f"unacked:{q}", f"unacked_index:{q}", f"unacked_mutex:{q}",
            f"celery-task-meta-{task_id(m, '*')}"]
    for kind in MODULE_WRITE_KINDS:
        pats += [f"{PREFIX}:{kind}:{m}", f"{PREFIX}:{kind}:*:{m}"]
    for kind in MODULE_PREFIX_KINDS:
        pats.append(f"{PREFIX}:{kind}:{m}:*")
    # the kernel cache's index of who attested: every module's (a hint)
    pats.append(f"{PREFIX}:{ATTEST_INDEX}:*")
    return pats


def module_channel_patterns(module: str) -> list[str]:
    """Channels ``module`` may publish to: Celery's backend publishes every value on its key's name."""
    from contract.celery_app import task_id
    from contract.kv import PREFIX

    m = _check_name(module)
    pats = [f"celery-task-meta-{task_id(m, '*')}"]
    for kind in MODULE_WRITE_KINDS:
        pats += [f"{PREFIX}:{kind}:{m}", f"{PREFIX}:{kind}:*:{m}"]
    for kind in MODULE_PREFIX_KINDS:
        pats.append(f"{PREFIX}:{kind}:{m}:*")
    return pats


def module_read_only_patterns(module: str) -> list[str]:
    """Keys ``module`` may only read: its own per-module cancel flags and the run-wide ones, and the
    controller's acknowledgements of its own final states, its preemptions and its reservation (another user's work
    waits there until it ends: :mod:`agent.hold`)."""
    from contract.attest import ATTEST
    from contract.kv import PREFIX, ack_key, cancel_key, preempt_key, reservation_key

    m = _check_name(module)
    # and every module's kernel cache attestations (who compiled what: each writes only its own, read by all)
    return [cancel_key("*", m), cancel_key("*"), ack_key("*", m), preempt_key("*", m), reservation_key(m),
            f"{PREFIX}:{ATTEST}:*"]


def module_rule(module: str, password: str) -> str:
    keys = " ".join(f"~{p}" for p in module_key_patterns(module))
    read_only = " ".join(f"%R~{p}" for p in module_read_only_patterns(module))
    channels = " ".join(f"&{p}" for p in module_channel_patterns(module))
    commands = " ".join(f"+{c}" for c in MODULE_COMMANDS)
    return (f"user {module} on {password_hash(password)} resetkeys resetchannels -@all {commands} "
            f"{keys} {read_only} {channels}")


def controller_rule(user: str, password: str) -> str:
    return f"user {_check_name(user)} on {password_hash(password)} ~* &* +@all -@dangerous +info"


def render_acl(module_passwords: dict[str, str], controller: tuple[str, str]) -> str:
    """The ACL file: the default user off, the controller, one user per module."""
    user, pw = controller
    if user in module_passwords:
        raise AclError(f"controller user {user!r} is also a module name")
    # redis-server's ACL file takes no comments: users only. Passwords are hashed here; the clear
    # ones are in passwords/<user>.password (mode 0600).
    lines = ["user default off resetkeys resetchannels -@all", controller_rule(user, pw)]
    lines += [module_rule(m, module_passwords[m]) for m in sorted(module_passwords)]
    return "\n".join(lines) + "\n"


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


@dataclass(frozen=True)
class AclFiles:
    """The ACL file, the passwords' folder (``<user>.password`` each), the users whose password was made now,
    and every user."""

    acl: Path
    passwords: Path
    created: tuple[str, ...]
    users: tuple[str, ...]


def write_acl(out: Path, modules: Iterable[str], *, controller_user: str = CONTROLLER_USER,
              rotate: bool = False) -> AclFiles:
    """Write ``out/users.acl`` and ``out/passwords/<user>.password`` (0600; existing ones kept unless ``rotate``)."""
    names = [_check_name(m) for m in modules]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    pw_dir = out / "passwords"
    pw_dir.mkdir(mode=0o700, exist_ok=True)
    os.chmod(pw_dir, 0o700)
    created: list[str] = []

    def password(user: str) -> str:
        path = pw_dir / f"{user}.password"
        if path.is_file() and not rotate:
            text = path.read_text(encoding="utf-8").strip()
            if text:
                return text
        pw = secrets.token_urlsafe(32)
        _write_private(path, pw + "\n")
        created.append(user)
        return pw

    ctl = password(_check_name(controller_user))
    mods = {m: password(m) for m in names}
    acl = out / "users.acl"
    _write_private(acl, render_acl(mods, (controller_user, ctl)))
    return AclFiles(acl, pw_dir, tuple(created), (controller_user, *sorted(mods)))
