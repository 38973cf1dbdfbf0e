"""kombu's redis transport, hardened against messages that are not kombu messages.

Whoever can write to the broker can LPUSH anything onto a module's queue. kombu's redis
transport decodes the popped item with ``json.loads`` and reads its ``properties`` inside
the worker's event loop: a non-JSON item or a malformed envelope raises there, and Celery
stops the whole worker ("Unrecoverable error"). This transport checks the envelope first
and drops (with an error logged) what it cannot use; a message it does deliver is then
checked by Celery (JSON only: a pickle body is refused) and by :mod:`agent.validate`.

Selected by :func:`agent.celery_app.make_app` for ``redis://`` and ``rediss://`` brokers.
"""

from __future__ import annotations

import base64
import binascii
import logging
from typing import Any

from kombu.transport import redis as kombu_redis

log = logging.getLogger("fleet.agent")

MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # a run request is a few KiB; the agent refuses more than 64 KiB anyway


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


class Channel(kombu_redis.Channel):
    def _brpop_read(self, **options: Any) -> bool:
        try:
            return bool(super()._brpop_read(**options))
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # json.JSONDecodeError is a ValueError
            log.error("dropped an item of a queue that is not a kombu message: %s", str(exc)[:200])
            return True


class Transport(kombu_redis.Transport):
    Channel = Channel

    def _deliver(self, message: Any, queue: str) -> None:
        problem = envelope_problem(message)
        if problem:
            log.error("dropped a malformed message from queue %s: %s", queue, problem)
            return
        super()._deliver(message, queue)
