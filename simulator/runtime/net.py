"""TCP for the release's server and benchmark on the interpreter's ``_socket``.

The ``socket`` module builds its enums at import (with ``enum``: ~3 ms of CPU at every server's and benchmark's
start), ``socketserver`` and ``selectors`` ~1 ms more: on every simulated module, 100 starting at once. This is the
little of them the two programs use: a listening IPv4 socket that hands each connection to a daemon thread
(``socketserver.ThreadingTCPServer``), a client connection (``socket.create_connection``), and the buffered
reader and unbuffered writer of a connection (``socket.makefile("rb")``, ``socketserver``'s ``_SocketWriter``).
Standard library only.
Kept by decision record docs/adr/0005-simulator-stand-ins.md (socketserver measured beside it).
"""

from __future__ import annotations

import _socket
import _thread
import io
from _struct import unpack_from

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from _socket import socket as Socket  # the class, as socket.socket
    from collections.abc import Callable
else:
    Socket = _socket.socket


SO_TIMESTAMPNS = 35  # Linux's SO_TIMESTAMPNS_OLD (asm-generic/socket.h; not in _socket): the kernel's receive time
SCM_TIMESTAMPNS = SO_TIMESTAMPNS  # its control message: a struct timespec of CLOCK_REALTIME
_TIMESPEC = 16  # bytes of a struct timespec (two longs, 64-bit Linux)
_ANC = 64  # ancillary buffer: one timestamp message (CMSG_SPACE(16) = 32) with room


def receive_stamps(sock: Socket) -> bool:
    """Ask the kernel for the receive time of what ``sock`` reads (Linux; a listening socket's connections inherit
    it). False where the kernel refuses: the reader then has no stamp."""
    try:
        sock.setsockopt(_socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        return True
    except OSError:
        return False


class _Reader(io.RawIOBase):
    """A connection's reading half as a raw stream (``socket.SocketIO`` for ``"rb"``), to be buffered.

    ``stamp_ns``: the kernel's receive time (CLOCK_REALTIME ns) of the data the last read returned, when the
    socket asks for it (:func:`receive_stamps`); 0 otherwise."""

    def __init__(self, sock: Socket) -> None:
        super().__init__()
        self._sock = sock
        self.stamp_ns = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        n, anc, _, _ = self._sock.recvmsg_into([buffer], _ANC)
        for level, kind, data in anc:
            if level == _socket.SOL_SOCKET and kind == SCM_TIMESTAMPNS and len(data) >= _TIMESPEC:
                sec, nsec = unpack_from("@qq", data)
                self.stamp_ns = sec * 1_000_000_000 + nsec
        return n

    def fileno(self) -> int:
        return self._sock.fileno()


class Writer:
    """A connection's writing half, unbuffered: every write is sent whole (``sendall``)."""

    def __init__(self, sock: Socket) -> None:
        self._sock = sock

    def write(self, data: bytes) -> int:
        self._sock.sendall(data)
        return len(data)

    def flush(self) -> None:
        pass


def no_delay(sock: Socket) -> None:
    """Nagle's algorithm off: every write leaves at once (the server streams tokens)."""
    sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)


def reader(sock: Socket) -> io.BufferedReader:
    """``sock.makefile("rb")``; its ``raw`` is a :class:`_Reader` (``raw.stamp_ns``)."""
    return io.BufferedReader(_Reader(sock))


def connect(host: str, port: int, timeout: float | None) -> Socket:
    """``socket.create_connection((host, port), timeout)`` with Nagle's algorithm off; the last error if none works."""
    error: OSError | None = None
    # an ASCII name as bytes: what the idna codec makes of it, without importing the codec for a str (encodings.idna
    # with re, unicodedata and stringprep: ~4 ms of CPU of every benchmark's start, socket.create_connection's too)
    name: str | bytes = host.encode("ascii") if host.isascii() else host
    for family, kind, proto, _, address in _socket.getaddrinfo(name, port, 0, _socket.SOCK_STREAM):
        sock = _socket.socket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(address)
            no_delay(sock)
            return sock
        except OSError as exc:
            error = exc
            sock.close()
    raise error or OSError(f"getaddrinfo found no address for {host}")


class Listener:
    """An IPv4 listening socket whose connections are each served on a thread of their own, as
    ``socketserver.ThreadingTCPServer`` with ``allow_reuse_address`` and ``daemon_threads``.

    ``serve(connection, address)`` runs on the connection's thread; the connection is shut down and closed after it,
    whatever it raised (an exception is then reported on stderr, by ``sys.unraisablehook``). Threads are
    ``_thread``'s: ``threading`` imports functools and collections, ~4 ms of every server's start; like daemon
    threads they do not keep the process alive.
    """

    def __init__(self, address: tuple[str, int], serve: Callable[[Socket, tuple[str, int]], object],
                 backlog: int = 5) -> None:
        self.serve = serve
        self.closed = False
        self._stopped = _thread.allocate_lock()
        self.socket = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
        try:
            self.socket.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
            self.socket.bind(address)
            self.stamps = receive_stamps(self.socket)
            self.socket.listen(backlog)
        except OSError:
            self.socket.close()
            raise

    def start(self) -> None:
        """``serve_forever`` on a thread of its own (``wait`` returns when it ends)."""
        self._stopped.acquire()
        _thread.start_new_thread(self._run, ())

    def _run(self) -> None:
        try:
            self.serve_forever()
        finally:
            self._stopped.release()

    def wait(self) -> None:
        """Until ``serve_forever`` (started by ``start``) has returned; a signal's exception interrupts it."""
        with self._stopped:
            pass

    def serve_forever(self) -> None:
        """Accept until ``shutdown``."""
        while not self.closed:
            try:
                fd, address = self.socket._accept()  # type: ignore[attr-defined]
            except OSError:
                if self.closed:
                    return
                continue  # e.g. ECONNABORTED: the client gave up before it was accepted
            conn = _socket.socket(fileno=fd)
            _thread.start_new_thread(self._serve, (conn, address))

    def _serve(self, conn: Socket, address: tuple[str, int]) -> None:
        try:
            self.serve(conn, address)
        finally:
            try:  # noqa: SIM105 - contextlib.suppress: one more module at every start
                conn.shutdown(_socket.SHUT_WR)
            except OSError:
                pass
            conn.close()

    def shutdown(self) -> None:
        """Stop accepting (wakes ``serve_forever`` up)."""
        self.closed = True
        try:  # noqa: SIM105 - as above
            self.socket.shutdown(_socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        self.socket.close()
