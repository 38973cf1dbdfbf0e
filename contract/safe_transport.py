"""kombu's redis transport, hardened against messages that are not kombu messages.

Whoever can write to the broker can LPUSH anything onto a module's queue. kombu's redis
transport decodes the popped item with ``json.loads`` and reads its ``properties`` inside
the worker's event loop: a non-JSON item or a malformed envelope raises there, and Celery
stops the whole worker ("Unrecoverable error"). This transport checks the envelope first
and drops (with an error logged) what it cannot use; a message it does deliver is then
checked by Celery (JSON only: a pickle body is refused) and by :mod:`agent.validate`.

Selected by :func:`contract.celery_app.make_app` for ``redis://``, ``rediss://`` and ``sentinel://``
brokers (:class:`SentinelTransport`: the same checks on kombu's Sentinel transport).

A full Redis (``maxmemory`` reached, ``noeviction``) refuses every write, and Redis 7.0-7.2 refuse any
command queued in a MULTI (redis/redis#9926, lifted in 7.4 by #12961), even a ZREM. kombu 5.7's ack
(``QoS.ack``: MULTI, ZREM, HDEL, EXEC) then raised ``OutOfMemoryError`` in the worker's event loop; a
``ResponseError`` is a channel error that Celery (``broker_channel_error_retry``) answers by restarting the
consumer; the new connection's ``Transport.register_with_event_loop`` restores unacked messages under a
mutex (``SET NX``, refused too) and raised again, before Celery kept the connection: nobody closed it, and
each attempt (~6 a second under ``RestartFreqExceeded``) left its two sockets open (2,262 clients, then
"max number of clients reached" for the whole fleet). Here (:class:`_MemoryFullQoS`) the ack and the
reject remove the message's records without a transaction (two plain removals, which a full Redis takes;
each is idempotent, a half-done pair is cleaned by the next restore), the periodic restore of unacked
messages skips a full Redis (it runs again within 10 s), a message delivered while Redis is full is
taken without its unacked record (the module's own run record and the controller's start timeout cover
it), and a transport whose registration fails closes its channels (:class:`_ClosedOnFailedRegistration`).

:class:`FilesystemTransport` (the embedded broker) fixes a race of kombu's filesystem transport:
it creates a message file and then writes it, and a worker polling the folder can move and read
the file in between, find it empty, and stop ("Unrecoverable error: JSONDecodeError"). Seen with
32 demo modules on a busy 2-core machine. Here a message is written under a name no reader takes
and renamed into place once complete.

The Redis classes are built on first use (``contract.safe_transport:Transport`` resolves them):
``import redis`` costs ~20 MiB of RSS, which an agent on the embedded broker never needs.
"""

from __future__ import annotations

import base64
import binascii
import fcntl
import logging
import os
import uuid
import weakref
from queue import Empty
from time import monotonic, monotonic_ns, sleep
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem as kombu_fs
from kombu.utils.json import dumps

log = logging.getLogger("fleet.agent")

# the transport option naming an agent's shared pool (share_pool)
SHARED_POOL_OPTION = "fleet_shared_pool"
# a run request is a few KiB; the agent refuses more than 64 KiB anyway
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


def envelope_problem(message: Any) -> str | None:
    """Why ``message`` (a decoded queue item) is not a kombu message the worker can take, or None."""
    if not isinstance(message, dict):
        return f"a JSON object was expected, got {type(message).__name__}"
    props = message.get("properties")
    if not isinstance(props, dict):
        return "no properties"
    if not isinstance(props.get("delivery_tag"), str) or not props["delivery_tag"]:
        return "no delivery tag"
    if not isinstance(props.get("delivery_info", {}), dict):
        return "delivery_info is not an object"
    if not isinstance(message.get("headers", {}), dict | type(None)):
        return "headers are not an object"
    for k in ("content-type", "content-encoding"):
        if not isinstance(message.get(k, ""), str | type(None)):
            return f"{k} is not a string"
    body = message.get("body")
    if body is not None and not isinstance(body, str | bytes):
        return "body is not a string"
    encoding = props.get("body_encoding")
    if encoding not in (None, "base64"):
        return f"unknown body encoding {str(encoding)[:40]!r}"
    if encoding == "base64" and body:
        try:
            base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError):
            return "body is not base64"
    return None


# An agent's result backend and its broker channels share one connection pool for the commands outside BRPOP (an
# ack, a publish, the restore of unacked messages, a heartbeat, a result): the BRPOP connection and one more, where
# Celery and kombu open one pool each (three connections per idle agent, four once two threads met in the backend's).
_SHARED_POOLS: dict[str, Any] = {}


# the redis channels of this process that have polled
_POLLING: weakref.WeakSet[Any] = weakref.WeakSet()


def unblock_polls() -> None:
    """End every BRPOP this process has in flight (:meth:`_CheckedReads.unblock_poll`): a worker that is told to
    stop wakes from its event loop's wait at once instead of at the loop's next timer (up to 1 s). Safe from any
    thread; not from a signal handler (a redis pool's lock)."""
    for channel in list(_POLLING):
        channel.unblock_poll()


def share_pool(key: str, pool: Any) -> None:
    """The redis channels whose transport option :data:`SHARED_POOL_OPTION` is ``key`` take ``pool`` (a redis-py
    connection pool to the same server, database and user) for their commands outside BRPOP."""
    _SHARED_POOLS[key] = pool


class _CheckedReads:
    """The checks shared by the plain and the Sentinel channel (mixed in before kombu's channel)."""

    # (the pool it was built on, the client): _create_client; (the BRPOP socket, its CLIENT ID): close
    _sync_client: tuple[Any, Any] | None = None
    _poll_client_id: tuple[Any, int | None] | None = None

    def _brpop_read(self, **options: Any) -> bool:
        try:
            return bool(super()._brpop_read(**options))  # type: ignore[misc]
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # json.JSONDecodeError is a ValueError
            log.error("dropped an item of a queue that is not a kombu message: %s", str(exc)[:200])
            return True

    def _brpop_start(self, timeout: Any = None) -> Any:
        self._note_poll_client_id()
        _POLLING.add(self)
        return super()._brpop_start(timeout)  # type: ignore[misc]

    def _note_poll_client_id(self) -> None:
        """The server's id of the BRPOP connection (``CLIENT ID``: once per socket, not per poll), for
        :meth:`unblock_poll`."""
        conn = self.client.connection  # type: ignore[attr-defined]
        sock = getattr(conn, "_sock", None)
        if sock is None or (self._poll_client_id is not None and self._poll_client_id[0] is sock):
            return
        self._poll_client_id = (sock, None)
        try:
            conn.send_command("CLIENT", "ID")
            self._poll_client_id = (sock, int(conn.read_response()))
        except self.connection_errors as exc:  # type: ignore[attr-defined]
            log.debug("no CLIENT ID for the BRPOP connection: %s", exc)
            raise
        except Exception as exc:
            # e.g. an ACL without client|id: close() waits for the BRPOP, as kombu's does
            log.debug("no CLIENT ID for the BRPOP connection: %s", exc)

    def unblock_poll(self) -> None:
        """End the BRPOP in flight now with ``CLIENT UNBLOCK`` (from another connection): its reply is nil, as at
        its server-side timeout, or the message it had taken already (read and delivered as before). Nothing
        where no BRPOP is in flight, its id is not known, or the broker refuses (an ACL without client|unblock)."""
        ident = self._poll_client_id
        if not self._in_poll or self.closed or ident is None or ident[1] is None:  # type: ignore[attr-defined]
            return
        if getattr(self.client.connection, "_sock", None) is not ident[0]:  # type: ignore[attr-defined]
            return
        try:
            self._create_client().client_unblock(ident[1])
        except Exception as exc:  # kombu's wait for the BRPOP's timeout
            log.debug("CLIENT UNBLOCK of the BRPOP connection: %s", exc)

    def close(self) -> None:
        """kombu's close reads the reply of the BRPOP in flight, which an idle queue sends only at the BRPOP's
        server-side timeout (``polling_interval``, 5 s): the warm shutdown of an idle agent waited for it. Here
        the BRPOP is ended first (:meth:`unblock_poll`), so the close reads its reply at once."""
        self.unblock_poll()
        _POLLING.discard(self)
        super().close()  # type: ignore[misc]

    def _shared_pool(self) -> Any:
        """The pool :func:`share_pool` gave this channel's transport options, if it reaches the same server,
        database and user as the channel would (else None: the channel's own)."""
        key = self.connection.client.transport_options.get(SHARED_POOL_OPTION)  # type: ignore[attr-defined]
        pool = _SHARED_POOLS.get(key) if key else None
        if pool is None:
            return None
        own, theirs = self._connparams(), pool.connection_kwargs  # type: ignore[attr-defined]
        differ = [k for k in ("host", "port", "path", "db", "username", "password") if own.get(k) != theirs.get(k)]
        if differ:
            log.warning("broker channel: not sharing the result backend's connections (%s differ)", ", ".join(differ))
            return None
        return pool

    def _get_pool(self, asynchronous: bool = False) -> Any:
        shared = None if asynchronous else self._shared_pool()
        return shared if shared is not None else super()._get_pool(asynchronous=asynchronous)  # type: ignore[misc]

    def _disconnect_pools(self) -> None:
        """kombu's; a shared pool stays connected (its other users go on)."""
        if self._pool is not None and self._pool in _SHARED_POOLS.values():  # type: ignore[has-type]
            self._pool = None
        super()._disconnect_pools()  # type: ignore[misc]

    def _create_client(self, asynchronous: bool = False) -> Any:
        """kombu builds a new ``redis.Redis`` on its pool for every command outside its poll loop (a publish,
        an ack): ~1 ms of CPU each (its response callbacks), a third of the controller's CPU per dispatched
        module. One client per pool does the same (a client on a pool is thread-safe); a new pool gets a new one."""
        if asynchronous:
            return super()._create_client(asynchronous=True)  # type: ignore[misc]
        pool = self.pool  # type: ignore[attr-defined]
        if self._sync_client is None or self._sync_client[0] is not pool:
            self._sync_client = (pool, super()._create_client())  # type: ignore[misc]
        return self._sync_client[1]


class _CheckedDelivery:
    def _deliver(self, message: Any, queue: str) -> None:
        problem = envelope_problem(message)
        if problem:
            log.error("dropped a malformed message from queue %s: %s", queue, problem)
            return
        super()._deliver(message, queue)  # type: ignore[misc]


class _ClosedOnFailedRegistration:
    def register_with_event_loop(self, connection: Any, loop: Any) -> None:
        """kombu's; when it raises, the transport's channels (and their Redis connections) are closed first.
        Celery's consumer keeps the kombu connection only once this returned (``Consumer.connect``), so a
        failure here left its sockets open until the garbage collector found them, one set per retry."""
        try:
            super().register_with_event_loop(connection, loop)  # type: ignore[misc]
        except BaseException:
            try:
                self.close_connection(connection)  # type: ignore[attr-defined]
            except Exception as exc:  # the original error is the one to report
                log.debug("closing a transport that failed to register: %s", exc)
            raise


class _Full:
    """Whether the broker refused a write for want of memory: logged once per episode, not per command."""

    def __init__(self) -> None:
        self.since: float | None = None

    def refused(self, what: str, exc: BaseException) -> None:
        if self.since is None:
            self.since = monotonic()
            log.warning("broker full (%s): %s; going on without it until Redis has memory again",
                        str(exc).splitlines()[0][:200], what)

    def accepted(self) -> None:
        if self.since is not None:
            log.info("broker takes writes again (full for %.0f s)", monotonic() - self.since)
            self.since = None


_REDIS_CLASSES = ("Channel", "Transport", "SentinelChannel", "SentinelTransport")


def _redis_classes() -> dict[str, Any]:
    """The checked Redis (and Sentinel) channel and transport classes, on kombu's."""
    from kombu.transport import redis as kombu_redis
    from kombu.transport import virtual
    from redis.exceptions import OutOfMemoryError

    full = _Full()

    class _MemoryFullQoS(kombu_redis.QoS):
        def _remove_from_indices(self, delivery_tag: Any, pipe: Any = None) -> Any:
            # restore_by_tag's transaction (its LPUSH needs memory anyway)
            if pipe is not None:
                return super()._remove_from_indices(delivery_tag, pipe)
            with self.channel.conn_or_acquire() as client:
                return (client.pipeline(transaction=False)
                        .zrem(self.unacked_index_key, delivery_tag).hdel(self.unacked_key, delivery_tag))

        def append(self, message: Any, delivery_tag: Any) -> None:
            try:
                super().append(message, delivery_tag)
            except OutOfMemoryError as exc:
                # the message is popped already: run it rather than drop it
                full.refused("a message taken without its unacked record", exc)
                virtual.QoS.append(self, message, delivery_tag)
            else:
                full.accepted()

        def restore_visible(self, start: int = 0, num: int = 10, interval: int = 10) -> None:
            try:
                super().restore_visible(start=start, num=num, interval=interval)
            except OutOfMemoryError as exc:  # its mutex is a SET NX: next time
                full.refused("unacked messages not restored this time", exc)
            else:
                full.accepted()

    class Channel(_CheckedReads, kombu_redis.Channel):
        QoS = _MemoryFullQoS

    class SentinelChannel(_CheckedReads, kombu_redis.SentinelChannel):
        QoS = _MemoryFullQoS

    class Transport(_ClosedOnFailedRegistration, _CheckedDelivery, kombu_redis.Transport):
        pass

    class SentinelTransport(_ClosedOnFailedRegistration, _CheckedDelivery, kombu_redis.SentinelTransport):
        pass

    Transport.Channel, SentinelTransport.Channel = Channel, SentinelChannel

    found = {"Channel": Channel, "Transport": Transport, "SentinelChannel": SentinelChannel,
             "SentinelTransport": SentinelTransport}
    for cls in found.values():
        cls.__module__, cls.__qualname__ = __name__, cls.__name__
    return found


# PEP 562: ``Transport`` & co. are built when first asked for
def __getattr__(name: str) -> Any:
    if name in _REDIS_CLASSES:
        globals().update(_redis_classes())
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def message_name(priority: int, queue: str, now_ns: int | None = None) -> str:
    """A message file's name: ``<priority>_<ns>_<uuid>.<queue>.msg``. kombu's reader takes a queue's files in
    name order, so the priority digit (0 first, :mod:`contract.priority`) orders them, then the time they were
    written: the machine's monotonic clock in nanoseconds, 20 digits (kombu's milliseconds left messages sent
    within one millisecond in the order of their random uuids); no ``.`` before the queue (kombu matches the
    queue on what follows the first one)."""
    ns = monotonic_ns() if now_ns is None else now_ns
    return f"{max(0, min(9, priority))}_{ns:020d}_{uuid.uuid4()}.{queue}.msg"


def name_priority(name: str) -> int | None:
    """The priority digit of a message file's name (:func:`message_name`); None for kombu's own names."""
    head = name.split("_", 1)[0]
    return int(head) if len(head) == 1 and head.isdigit() else None


class FilesystemChannel(kombu_fs.Channel):
    def _put(self, queue: Any, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        """Write the message under a name readers skip (``....msg.tmp``), then rename it into place; the name
        starts with the message's priority, so the reader takes a higher one first (:func:`message_name`)."""
        name = message_name(self._get_message_priority(payload), queue)
        final = os.path.join(self.data_folder_out, name)
        tmp = final + ".tmp"
        try:
            with open(tmp, "wb") as fh:
                fh.write(dumps(payload).encode())
            os.replace(tmp, final)
        except OSError as exc:
            raise ChannelError(f"cannot add a message to {self.data_folder_out}: {exc}") from exc

    def _queue_bind(self, exchange: Any, routing_key: Any, pattern: Any, queue: Any) -> None:
        """kombu's, made atomic: under a lock file of its own, the exchange's table is read, extended and
        written under a temporary name, then renamed into place. kombu's opens a new table with "wb" and
        locks it after: a publisher binding the same queue in between read an empty table ("Expecting value:
        line 1 column 1") and the dispatch to that module failed (1 of 32 demo modules, busy machine)."""
        file = self._exchange_file(exchange)
        entry = kombu_fs.exchange_queue_t(routing_key or "", pattern or "", queue or "")
        try:
            self.control_folder.mkdir(exist_ok=True)
            with open(f"{file}.lock", "a") as lock:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # released when closed
                queues = self.get_table(exchange)
                if entry in queues:
                    return
                tmp = f"{file}.{os.getpid()}.tmp"
                with open(tmp, "w", encoding="utf-8") as fh:
                    fh.write(dumps([entry, *queues]))
                os.replace(tmp, file)
        except OSError as exc:
            raise ChannelError(f"cannot bind {queue!r} in {self.control_folder}: {exc}") from exc

    def get_table(self, exchange: Any) -> Any:
        """kombu's; a table written by a writer without the rename above (empty, or half written) is read
        again for up to 1 s before it is an error."""
        for _ in range(100):
            try:
                return super().get_table(exchange)
            except ValueError:
                sleep(0.01)
        raise ChannelError(f"the exchange table of {exchange!r} in {self.control_folder} is not readable JSON")

    def _get(self, queue: Any, timeout: Any = None) -> Any:
        try:
            return super()._get(queue)
        except (ValueError, UnicodeDecodeError) as exc:  # written by a writer without the rename above
            log.error("dropped an unreadable message of queue %s: %s", queue, str(exc)[:200])
            raise Empty() from None


class FilesystemTransport(kombu_fs.Transport):
    Channel = FilesystemChannel
