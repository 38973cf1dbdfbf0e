"""Server-sent events from bytes, as they arrive (pure: no I/O, no clock).

The WHATWG event-stream rules, as much as an OpenAI-compatible stream needs: lines end
with CRLF, LF or CR (a CR at the end of one read may be the first half of a CRLF split
across two reads); ``:`` starts a comment (keep-alive); ``data:`` lines accumulate,
joined with ``\\n``; a blank line dispatches the event; one space after the colon is
dropped; ``event:`` names it. A ``data:`` line split across reads is simply an
incomplete line until its end arrives.

At the end of the stream, :meth:`SSEParser.close` dispatches complete ``data:`` lines
still waiting for their blank line (a server that ends its last event with a single
newline) and reports bytes of a line that never ended: the stream was cut in the middle.
"""

from __future__ import annotations

from typing import NamedTuple


class SSEEvent(NamedTuple):
    data: str
    event: str = ""


class SSEParser:
    """Feed bytes with :meth:`feed`; get the events each read completes."""

    __slots__ = ("_buf", "_data", "_event", "comments")

    def __init__(self) -> None:
        # an incomplete line (or a lone CR waiting for a possible LF)
        self._buf = b""
        self._data: list[bytes] = []
        self._event = b""
        self.comments = 0  # keep-alive and other comment lines seen

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        data = self._buf + chunk if self._buf else chunk
        if b"\r" in data:
            hold = data.endswith(b"\r")  # maybe half a CRLF: decide when the next byte arrives
            if hold:
                data = data[:-1]
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            lines = data.split(b"\n")
            self._buf = lines.pop() + (b"\r" if hold else b"")
        else:
            lines = data.split(b"\n")
            self._buf = lines.pop()
        out: list[SSEEvent] = []
        for line in lines:
            self._line(line, out)
        return out

    def _line(self, line: bytes, out: list[SSEEvent]) -> None:
        if not line:
            if self._data:
                out.append(SSEEvent(b"\n".join(self._data).decode("utf-8", "replace"),
                                    self._event.decode("utf-8", "replace")))
            self._data = []
            self._event = b""
            return
        if line[:1] == b":":
            self.comments += 1
            return
        name, colon, value = line.partition(b":")
        if not colon:
            value = b""
        elif value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            self._data.append(value)
        elif name == b"event":
            self._event = value
        # id, retry and unknown fields carry nothing a completion stream needs

    def close(self) -> tuple[list[SSEEvent], int]:
        """The end of the stream: (events still pending, bytes of a line cut before its end)."""
        out: list[SSEEvent] = []
        rest, self._buf = self._buf, b""
        cut = 0
        if rest.endswith(b"\r"):  # a line ended by a CR just before the end: complete
            self._line(rest[:-1], out)
        elif rest:
            cut = len(rest)  # the event in progress is incomplete: not dispatched
            self._data = []
        self._line(b"", out)  # a last event that lacked its blank line
        return out, cut
