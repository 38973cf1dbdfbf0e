"""Benchmark: a module's serial console read at the failure vs read all along (issue 49 item 4, ADR 0053).

A real ser2net (Debian's) serves a serial line, a pty pair of socat's; the "module" prints ``--lines``
kernel-like lines to its end at the line's rate (``--baud``), without blocking (``O_NONBLOCK``, as the
simulator's ``console_line`` and a UART nobody reads: what does not fit is dropped), then the hang's last line.
Sides, each on a fresh ser2net and line:

* ``at failure``: nothing reads the console while the module prints; the controller connects after the hang and
  reads for ``--read`` s (what a bounded read at the moment of the failure gets);
* ``kept``: :class:`controller.remote.console.ConsoleCapture` connected before the module prints (what the
  controller does from the first sync pass of a run).

Each side: the hang's line read or not, how many of the last 200 lines printed were read, lines the module's
writes dropped. Then what the capture costs the controller: its CPU seconds per 10,000 lines read (the writer's
included: one process), its CPU share of a core over ``--idle`` s connected to a quiet console, and the seconds
a console that does not answer takes to give its one line.

Goals: ``kept`` holds the hang's line and the last 200 lines; idle CPU under 0.1 % of a core (exit 1 when missed).

Usage: python bench/console_capture.py [--lines 1000] [--baud 115200] [--read 2] [--idle 10]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import record
from controller.remote.console import ConsoleCapture
from tests.support.outlet import free_port

HUNG = "[  412.734123] watchdog: BUG: soft lockup - CPU#2 stuck for 22s! [sglang:4242]"


def line_of(i: int) -> str:
    return f"[{i / 100:12.6f}] m1000 0000:01:00.0: qwen3: step {i} decode batch 8 ok"


def emit(path: Path, n: int, baud: int) -> int:
    """The module prints ``n`` lines then the hang's at the line's rate (10 bits a byte at ``baud``), never
    blocking; the lines dropped (EAGAIN)."""
    fd = os.open(path, os.O_WRONLY | os.O_NOCTTY | os.O_NONBLOCK)
    dropped = 0
    t = time.monotonic()
    try:
        for text in [*(line_of(i) for i in range(n)), HUNG]:
            data = f"{text}\r\n".encode()
            t += len(data) * 10 / baud
            time.sleep(max(0.0, t - time.monotonic()))
            try:
                os.write(fd, data)
            except BlockingIOError:
                dropped += 1
    finally:
        os.close(fd)
    return dropped


def judged(text: str, n: int) -> str:
    got = set(text.splitlines())  # the last 200 printed: 199 numbered lines and the hang's
    last = sum(line_of(i) in got for i in range(max(0, n - 199), n)) + (HUNG in got)
    return f"hang line {'read' if HUNG in got else 'NOT read'}; {last}/{min(200, n + 1)} of the last lines"


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=1000)
    ap.add_argument("--baud", type=int, default=115200, help="the serial line's rate the module prints at")
    ap.add_argument("--read", type=float, default=2.0)
    ap.add_argument("--idle", type=float, default=10.0)
    a = ap.parse_args(argv)
    import pytest

    from tests.support.serial_console import ser2net_console

    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        try:
            with ser2net_console(Path(tmp) / "a") as con:
                dropped = emit(con.line, a.lines, a.baud)
                buf = b""
                host, port = con.address.rsplit(":", 1)
                with socket.create_connection((host, int(port)), timeout=3) as s:
                    s.settimeout(0.2)
                    end = time.monotonic() + a.read
                    while time.monotonic() < end:
                        with contextlib.suppress(TimeoutError):
                            buf += s.recv(65536)
                seen = judged(buf.decode("utf-8", "replace"), a.lines)
                print(f"at failure ({a.read:g} s read after the hang): {seen}; {len(buf.splitlines())} lines read; "
                      f"{dropped} of {a.lines + 1} writes dropped")
            with ser2net_console(Path(tmp) / "b") as con:
                cap = ConsoleCapture(con.address, lines=200, retry=0.2).start()
                while "console up" not in cap.text():  # ser2net opens the line after it accepts
                    con.print("console up")
                    time.sleep(0.05)
                t0, c0 = time.monotonic(), cpu()
                dropped = emit(con.line, a.lines, a.baud)
                while HUNG not in cap.text() and time.monotonic() - t0 < 30:
                    time.sleep(0.01)
                spent = cpu() - c0
                got = judged(cap.text(), a.lines)
                print(f"kept (a capture connected before): {got}; {dropped} of {a.lines + 1} writes dropped; "
                      f"read in {time.monotonic() - t0:.2f} s")
                ok &= got == "hang line read; 200/200 of the last lines"
                print(f"capture CPU: {spent / max(1, a.lines + 1 - dropped) * 10_000:.3f} s per 10,000 lines "
                      "(the whole process's, writer included)")
                threads = threading.active_count()
                c0, t0 = cpu(), time.monotonic()
                time.sleep(a.idle)
                idle = (cpu() - c0) / (time.monotonic() - t0)
                cap.stop()
                print(f"capture idle, connected: {idle:.4%} of a core over {a.idle:g} s ({threads - 1} thread(s) "
                      "beside the main one)")
                ok &= idle < 0.001
        except pytest.skip.Exception as exc:
            print(f"skipped: {exc}")
            return 1
    cap = ConsoleCapture(f"127.0.0.1:{free_port()}", retry=0.2).start()
    t0 = time.monotonic()
    cap.settled(2.0)
    text = cap.text()
    cap.stop()
    print(f"a console that does not answer: {time.monotonic() - t0:.3f} s, {text.count(chr(10))} line: "
          f"{text.strip()}")
    print("goals (kept: hang line and 200/200; idle < 0.1 % of a core):", "met" if ok else "NOT met")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
