"""A module's serial console read through a real ser2net (raw TCP) serving a serial line (a pty pair of socat's):
what it printed before a hang is kept; a console that does not answer is one line, never a wait; the logs kept
after a failed part carry it (``console.log``), whatever SSH says."""

from __future__ import annotations

import time

import pytest

from contract.records import RunProgress, RunState
from controller.fleet.kernel_logs import KernelLogs, failed_parts, logs_folder
from controller.inventory import Module
from controller.remote.console import ConsoleCapture, LineTail
from tests.support.outlet import free_port
from tests.support.serial_console import ser2net_console
from tests.support.wait import wait_for

HUNG = "BUG: soft lockup - CPU#2 stuck for 22s! [sglang:4242]"


def test_line_tail_keeps_the_last_lines_without_escapes():
    t = LineTail(lines=3)
    t.feed(b"[ 0.1] one\r\n[ 0.2] \x1b[31mtwo\x1b[0m\r\n[ 0.3] thr")
    t.feed(b"ee\r\n[ 0.4] four\r\n[ 0.5] half")
    assert t.text() == "[ 0.2] two\n[ 0.3] three\n[ 0.4] four\n[ 0.5] half\n" and t.seen == 4
    t.feed(b"x" * 10_000)  # a console that prints no newline: cut into bounded lines, the tail still bounded
    assert len(t.lines) == 3 and all(len(ln) <= 4096 for ln in t.lines)


def test_telnet_commands_are_dropped_across_pieces():
    from controller.remote.console import TelnetData

    t = TelnetData()
    stream = (b"\xff\xfb\x01\xff\xfb\x03" b"[ 1.0] a\xff\xff b\r\n"  # WILL ECHO, WILL SGA; IAC IAC: a 255
              b"\xff\xfa\x2c\x65\x00\x01\xc2\x00\xff\xf0" b"[ 2.0] c\r\n")  # RFC 2217 SB COM-PORT ... SE
    assert b"".join(t.feed(stream[i:i + 3]) for i in range(0, len(stream), 3)) == b"[ 1.0] a\xff b\r\n[ 2.0] c\r\n"


@pytest.mark.slow
@pytest.mark.parametrize("accepter", ["tcp", "telnet,tcp", "telnet(rfc2217),tcp"])
def test_capture_keeps_what_the_console_printed_before_the_hang(tmp_path, accepter):
    with ser2net_console(tmp_path / "console", accepter) as con:
        cap = ConsoleCapture(con.address, lines=200, retry=0.2).start()
        try:
            # connected is not yet read: ser2net opens the line after it accepts (printed before: lost 1 run in 4)
            def printed_and_read() -> bool:
                con.print("[     0.000000] console up")
                return "console up" in cap.text()

            wait_for(printed_and_read, 10, "a first line read through ser2net")
            con.print(*(f"[{i:6d}.000000] m1000 0000:01:00.0: step {i}" for i in range(300)), HUNG)
            wait_for(lambda: HUNG in cap.text(), 10, "the hang's line read")
            text = cap.text()
        finally:
            cap.stop()
    head, *lines = text.splitlines()
    kind = "raw TCP" if accepter == "tcp" else "telnet"
    assert head.startswith(f"# serial console {con.address} (ser2net {kind}), read by the controller since ")
    assert "(connected); the last 200 of " in head, head
    assert lines[-1] == HUNG and lines[0].endswith("step 101") and len(lines) == 200


@pytest.mark.slow
def test_console_that_does_not_answer_is_one_line_and_the_pass_does_not_wait(tmp_path):
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    modules = {"sim-01": Module(name="sim-01", transport="local", workdir=str(tmp_path / "w"), console=address)}

    def unreachable(m: Module) -> dict[str, str]:
        raise OSError(f"{m.name}: ssh: connect to host 192.0.2.1 port 22: Connection timed out")

    class Events:
        def __init__(self) -> None:
            self.kept: list[tuple[str, float, str]] = []

        def add_event(self, run_id: str, module: str, message: str) -> None:
            self.kept.append((module, time.time(), message))

        def events(self, run_id: str) -> list[tuple[str, float, str]]:
            return list(self.kept)

    logs, h = KernelLogs(modules, tmp_path / "data", unreachable), Events()
    now = time.time()
    lost = RunProgress(run_id="r1", module="sim-01", release="1.4.1", keys_total=2, updated_at=now,
                       state=RunState.LOST)
    try:
        t0 = time.monotonic()
        assert logs.after_pass(h, "r1", {"sim-01": lost}, {}, now) == []  # its SSH failed: not "done"
        took = time.monotonic() - t0
    finally:
        logs.close()
    assert took < 2.5, took  # refused at once; a console never answering is bounded by the capture's wait
    text = (logs_folder(tmp_path / "data", "r1", "sim-01") / "console.log").read_text()
    assert text.count("\n") == 1 and text.startswith(f"not available: serial console {address} (ser2net raw TCP) "
                                                     "did not answer (ConnectionRefusedError: "), text
    msgs = [m for _, _, m in h.kept]
    assert msgs[0].startswith("serial console kept (lost): ") and msgs[0].endswith("/r1/sim-01/console.log")
    assert msgs[1].startswith("kernel log not kept (lost): sim-01: ssh: connect to host")
    ((m, why, kept, command),) = failed_parts(h.kept, "r1")
    assert (m, why, command) == ("sim-01", "lost", "fleetctl logs r1 --module sim-01 --kernel")
    assert kept[0] == "serial console kept" and kept[1].startswith("kernel log not kept (sim-01: ssh: connect to")


def test_console_entry_is_host_and_port():
    from controller.inventory import InventoryError, parse_inventory

    inv = parse_inventory({"module": [{"name": "a", "console": "console-server:3001"}]})
    assert inv.modules[0].console == "console-server:3001"
    assert parse_inventory({"module": [{"name": "a", "console": "telnet://c:3001"}]}).modules[0].console
    with pytest.raises(InventoryError, match=r"module 'a': field 'console': .*'http://c:3001' is not host:port of "
                                             r"a ser2net raw TCP port"):
        parse_inventory({"module": [{"name": "a", "console": "http://c:3001"}]}, "inv.toml")
