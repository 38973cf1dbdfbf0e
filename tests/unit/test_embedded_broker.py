"""The embedded broker (kombu's filesystem transport, hardened): a message is never read half written.

kombu's own ``_put`` creates the message file, then writes it; a worker polling the folder in between
moved the empty file away, failed to decode it and stopped ("Unrecoverable error"): one of 32 demo
modules on a busy machine never ran its part. These run a real channel on a real folder.
"""

from __future__ import annotations

import threading
from pathlib import Path
from queue import Empty

import pytest
from kombu import Connection

from contract.celery_app import embedded_folders, make_app
from contract.settings import BrokerSettings


def _channel(tmp_path: Path):
    app = make_app(BrokerSettings(broker_url="filesystem://", data_dir=tmp_path))
    assert app.conf.broker_transport == "contract.safe_transport:FilesystemTransport"
    conn: Connection = app.connection_for_write()
    return conn, conn.default_channel


def test_put_is_write_then_rename(tmp_path: Path) -> None:
    conn, ch = _channel(tmp_path)
    try:
        ch._put("module.q", {"body": "x", "properties": {"delivery_tag": "t"}})
        folder = embedded_folders(tmp_path)["queue"]
        names = [p.name for p in folder.iterdir()]
        assert len(names) == 1 and names[0].endswith(".module.q.msg"), names
        assert ch._get("module.q")["body"] == "x"
        with pytest.raises(Empty):
            ch._get("module.q")
    finally:
        conn.release()


def test_an_unreadable_message_file_is_dropped_not_fatal(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    conn, ch = _channel(tmp_path)
    try:
        (embedded_folders(tmp_path)["queue"] / "1_0000.module.q.msg").write_bytes(b"")  # as kombu's race left it
        with pytest.raises(Empty):
            ch._get("module.q")
        assert "dropped an unreadable message of queue module.q" in caplog.text
    finally:
        conn.release()


def test_concurrent_writer_and_reader_lose_nothing(tmp_path: Path) -> None:
    writer_conn, writer = _channel(tmp_path)
    reader_conn, reader = _channel(tmp_path)
    n, got = 300, []

    def write() -> None:
        for i in range(n):
            writer._put("module.q", {"body": "y" * 4000, "i": i, "properties": {"delivery_tag": str(i)}})

    t = threading.Thread(target=write)
    t.start()
    try:
        while True:
            done = not t.is_alive()  # read before the folder: after it, one drain finds everything
            try:
                got.append(reader._get("module.q")["i"])
            except Empty:
                if done:
                    break
        t.join()
        assert sorted(got) == list(range(n))
    finally:
        writer_conn.release()
        reader_conn.release()


def test_binding_while_a_publisher_reads_the_table(tmp_path: Path) -> None:
    """Worker and controller bind a module's queue while the controller routes to it: kombu's own bind
    opened a new exchange table (empty) before it locked and wrote it, and the reader between the two
    failed ("Expecting value: line 1 column 1"): 1 of 32 demo modules failed at dispatch. Each table is
    now complete whenever it exists, and two binders of one exchange lose neither binding."""
    a_conn, a = _channel(tmp_path)
    b_conn, b = _channel(tmp_path)
    r_conn, r = _channel(tmp_path)
    n, errors = 150, []

    def bind(ch, suffix: str) -> None:
        for i in range(n):
            try:
                ch._queue_bind(f"module.m{i}", f"module.m{i}", "", f"module.m{i}{suffix}")
            except Exception as exc:  # collected, asserted below
                errors.append(exc)

    def read() -> None:
        for _ in range(3):
            for i in range(n):
                try:
                    r.get_table(f"module.m{i}")
                except Exception as exc:
                    errors.append(exc)

    threads = [threading.Thread(target=bind, args=(a, "")), threading.Thread(target=bind, args=(b, ".b")),
               threading.Thread(target=read)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert errors == []
        for i in range(n):
            assert sorted(q.queue for q in r.get_table(f"module.m{i}")) == [f"module.m{i}", f"module.m{i}.b"]
    finally:
        for c in (a_conn, b_conn, r_conn):
            c.release()
