"""Webhooks: on a run's verdict, POST a JSON summary to each configured URL.

The body is signed with HMAC-SHA256 under a shared secret: header
``X-Fleet-Signature-256: sha256=<hex>`` over the exact body bytes (as GitHub does), so a receiver
can check it came from this controller; ``sent_at`` in the body lets it refuse replays.
Deliveries run on a small thread pool, never in the caller's thread, retried with exponential
backoff (tenacity) on connection errors, 429 and 5xx; a URL that keeps failing is given up
with one warning. :meth:`Webhooks.notify` never blocks.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import stat
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from contract.redact import redact_url
from controller.settings import ConfigError

log = logging.getLogger("fleet.webhooks")

SIGNATURE_HEADER = "X-Fleet-Signature-256"
EVENT_HEADER = "X-Fleet-Event"
DELIVERY_HEADER = "X-Fleet-Delivery"


def sign(secret: bytes, body: bytes) -> str:
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def verify(secret: bytes, body: bytes, header: str | None) -> bool:
    """What a receiver does: recompute the signature and compare in constant time."""
    return header is not None and hmac.compare_digest(sign(secret, body), header)


def load_secret(path: Path) -> bytes:
    try:
        mode = path.stat().st_mode
        secret = path.read_bytes().strip()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the webhook secret: {exc.strerror or exc}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"{path}: the webhook secret is readable by others (chmod 600 {path})")
    if len(secret) < 16:
        raise ConfigError(f"{path}: the webhook secret is shorter than 16 bytes")
    return secret


class Retryable(Exception):
    """A delivery that may succeed later (connection error, timeout, 429, 5xx)."""


class Webhooks:
    def __init__(self, urls: Sequence[str], secret: bytes, *, attempts: int = 6, backoff: float = 1.0,
                 max_backoff: float = 60.0, timeout: float = 10.0, workers: int = 4) -> None:
        for u in urls:
            if urlsplit(u).scheme not in ("http", "https") or not urlsplit(u).hostname:
                raise ConfigError(f"webhook URL {u!r}: not an http(s) URL")
        self.urls = list(urls)
        self._secret = secret
        self.attempts, self.backoff, self.max_backoff, self.timeout = attempts, backoff, max_backoff, timeout
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="webhook")

    def notify(self, event: str, payload: dict[str, Any], *, urls: Sequence[str] | None = None,
               delivery: str | None = None) -> list[Future[bool]]:
        """Queue one delivery per URL (``urls``: some of them; default all) and return at once (the futures,
        in that order, say whether each one arrived). ``delivery``: the X-Fleet-Delivery id (default: new)."""
        body = json.dumps({**payload, "event": event, "sent_at": time.time()}, separators=(",", ":"),
                          default=str).encode()
        delivery = delivery or str(uuid.uuid4())
        targets = self.urls if urls is None else urls
        return [self._pool.submit(self._deliver, url, event, delivery, body) for url in targets]

    def close(self, wait: bool = False) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=not wait)

    def _deliver(self, url: str, event: str, delivery: str, body: bytes) -> bool:
        try:
            for attempt in Retrying(stop=stop_after_attempt(self.attempts), reraise=True,
                                    wait=wait_exponential(multiplier=self.backoff, max=self.max_backoff),
                                    retry=retry_if_exception_type(Retryable)):
                with attempt:
                    self._post(url, event, delivery, body)
            return True
        except Exception as exc:  # given up: the service goes on
            log.warning("webhook %s to %s given up after %d attempts: %s", event, redact_url(url), self.attempts, exc)
            return False

    def _post(self, url: str, event: str, delivery: str, body: bytes) -> None:
        req = urllib.request.Request(url, data=body, method="POST", headers={
            "Content-Type": "application/json", "User-Agent": "m1000-fleet-webhook/1", EVENT_HEADER: event,
            DELIVERY_HEADER: delivery, SIGNATURE_HEADER: sign(self._secret, body)})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # http(s) checked above
                resp.read(1024)
        except urllib.error.HTTPError as exc:
            if exc.code == 429 or exc.code >= 500:
                raise Retryable(f"HTTP {exc.code}") from exc
            raise RuntimeError(f"HTTP {exc.code} (not retried)") from exc
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            raise Retryable(str(exc)) from exc
