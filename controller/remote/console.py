"""A module's serial console through a ser2net raw TCP port (or a telnet one, RFC 2217 included: its commands
dropped, nothing negotiated): what it printed, kept while the controller follows a run (ADR 0053).

A serial line keeps nothing for a reader who comes late: a UART that nobody reads drops what it receives, and
ser2net opens the device only while a client is connected. So the lines a hang printed (a driver's last words, a
soft-lockup trace) are only there for a reader who was already connected. :class:`ConsoleCapture` is that reader:
one daemon thread per console, a connection kept open (tried again every ``RETRY`` s while the console does not
answer), the last ``LINES`` lines kept in memory. :meth:`ConsoleCapture.text` is what is kept with a run; a
console that never answered is one line saying so. Nothing here blocks its caller beyond ``wait`` seconds.

Captures are shared in the process (:func:`acquire` / :func:`release`, counted): one connection per console
however many sessions follow runs on it. ser2net's ``max-connections`` must leave room for it beside a person's
(and ``kickolduser`` off), see docs/howto/recover-hung-modules.md.
"""

from __future__ import annotations

import collections
import re
import socket
import threading
import time
from datetime import UTC, datetime

from controller.inventory import console_address

# the tail kept, as the kernel log's
LINES = 200
# a line longer than this (a console printing no newline) is cut there
LINE_BYTES = 4096
# seconds between tries at a console that does not answer or closed the connection
RETRY = 5.0
CONNECT_TIMEOUT = 3.0
# colours, cursor moves, controls
_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|[\x00-\x08\x0b-\x1f\x7f]")


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


IAC, SB, SE = 255, 250, 240


class TelnetData:
    """The data bytes of a telnet stream fed in pieces: its commands and option negotiations (``IAC WILL ECHO``, an
    RFC 2217 ``IAC SB COM-PORT-OPTION ... IAC SE``) dropped, ``IAC IAC`` a 255 (pure: no I/O; nothing answered: a
    reader that only reads needs no option)."""

    def __init__(self) -> None:
        self.state = "data"

    def feed(self, data: bytes) -> bytes:
        out = bytearray()
        for b in data:
            st = self.state
            if st == "data":
                if b == IAC:
                    self.state = "iac"
                else:
                    out.append(b)
            elif st == "iac":
                self.state = {IAC: "data", SB: "sb"}.get(b, "option" if 251 <= b <= 254 else "data")
                if b == IAC:
                    out.append(IAC)
            elif st == "option":
                self.state = "data"
            elif st == "sb":
                self.state = "sb-iac" if b == IAC else "sb"
            else:  # sb-iac
                self.state = "data" if b == SE else "sb"
        return bytes(out)


class LineTail:
    """The last ``lines`` lines of a byte stream fed in pieces (pure: no I/O); ``telnet``: the stream is telnet's."""

    def __init__(self, lines: int = LINES, *, telnet: bool = False) -> None:
        self.lines: collections.deque[str] = collections.deque(maxlen=lines)
        self.partial = b""
        self.seen = 0  # lines completed in all
        self.telnet = TelnetData() if telnet else None

    def feed(self, data: bytes) -> None:
        if self.telnet is not None:
            data = self.telnet.feed(data)
        *done, self.partial = (self.partial + data).split(b"\n")
        for raw in done:
            self._add(raw)
        while len(self.partial) > LINE_BYTES:
            self._add(self.partial[:LINE_BYTES])
            self.partial = self.partial[LINE_BYTES:]

    def _add(self, raw: bytes) -> None:
        self.lines.append(_ESCAPES.sub("", raw.decode("utf-8", "replace").replace("\r", "")))
        self.seen += 1

    def text(self) -> str:
        rest = [_ESCAPES.sub("", self.partial.decode("utf-8", "replace"))] if self.partial.strip() else []
        return "".join(f"{ln}\n" for ln in [*self.lines, *rest])


class ConsoleCapture:
    """One console's reader thread and the tail it keeps (:meth:`start`, :meth:`text`, :meth:`stop`)."""

    def __init__(self, address: str, *, lines: int = LINES, retry: float = RETRY) -> None:
        self.address = address
        self.host, self.port, telnet = console_address(address)
        self.retry = retry
        self.tail = LineTail(lines, telnet=telnet)
        self.started_at = time.time()
        # the current connection's start; None while there is none
        self.connected_at: float | None = None
        # why the last try failed or the connection ended
        self.error: str | None = None
        self.tries = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"console {address}", daemon=True)

    def start(self) -> ConsoleCapture:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=CONNECT_TIMEOUT + 2.0)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.tries += 1
            try:
                with socket.create_connection((self.host, self.port), timeout=CONNECT_TIMEOUT) as sock:
                    sock.settimeout(0.5)  # how soon stop() is seen
                    with self._lock:
                        self.connected_at, self.error = time.time(), None
                    self._read(sock)
            except OSError as exc:
                with self._lock:
                    self.error = f"{type(exc).__name__}: {exc.strerror or exc}" if exc.args else type(exc).__name__
            with self._lock:
                self.connected_at = None
                if self.tail.telnet is not None:
                    # a new connection's negotiation starts afresh
                    self.tail.telnet = TelnetData()
            self._stop.wait(self.retry)

    def _read(self, sock: socket.socket) -> None:
        while not self._stop.is_set():
            try:
                data = sock.recv(65536)
            except TimeoutError:
                continue
            if not data:
                with self._lock:
                    self.error = "the console closed the connection"
                return
            with self._lock:
                self.tail.feed(data)

    def settled(self, wait: float) -> None:
        """Wait up to ``wait`` s for a first answer of a capture just started (connected, or failed once)."""
        end = self.started_at + wait
        while time.time() < end and self.tries <= 1 and self.connected_at is None and self.error is None:
            time.sleep(0.05)
        # connected: what ser2net or the line held is read for the rest of the wait
        if self.connected_at is not None:
            time.sleep(max(0.0, end - time.time()))

    def text(self) -> str:
        """What is kept with a run: a header line, then the last lines; one line when nothing was ever read."""
        with self._lock:
            body, seen, at, why = self.tail.text(), self.tail.seen, self.connected_at, self.error
        where = f"serial console {self.address} (ser2net {'telnet' if self.tail.telnet else 'raw TCP'})"
        if not body and at is None:
            return f"not available: {where} did not answer ({why or 'no answer yet'}; tried {self.tries} time(s) " \
                   f"since {_stamp(self.started_at)})\n"
        state = "connected" if at is not None else f"connection lost: {why}"
        head = f"# {where}, read by the controller since {_stamp(self.started_at)} ({state}); " \
               f"the last {min(seen, len(self.tail.lines))} of {seen} line(s)\n"
        return head + (body or "(nothing printed)\n")


_shared: dict[str, tuple[ConsoleCapture, int]] = {}
_shared_lock = threading.Lock()


def acquire(address: str) -> ConsoleCapture:
    """The process's capture of ``address``, started at its first use."""
    with _shared_lock:
        cap, n = _shared.get(address) or (ConsoleCapture(address).start(), 0)
        _shared[address] = (cap, n + 1)
        return cap


def release(address: str) -> None:
    """One use of ``address``'s capture ended; the last stops its thread."""
    with _shared_lock:
        cap, n = _shared.get(address, (None, 0))
        if cap is None:
            return
        if n > 1:
            _shared[address] = (cap, n - 1)
            return
        del _shared[address]
    cap.stop()
