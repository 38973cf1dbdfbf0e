"""A daemon a release's start script leaves behind (issue 25, item 5): it waits for the server to serve, then takes
its port once free. Run as ``python3 squatter.py HOST PORT RECORD_DIR`` (argv only: it is started with an empty
environment); it writes ``squatter-PID.pid`` at its start and ``squatter-PID.bound`` once it holds the port.

The tests copy this file into a release (:data:`SOURCE`); importing it runs nothing."""

import os
import socket
import sys
import time
from pathlib import Path

SOURCE = Path(__file__).read_text()


def main(host: str, port: int, record: str) -> None:
    with open(os.path.join(record, f"squatter-{os.getpid()}.pid"), "w") as f:
        f.write(str(os.getpid()))
    while True:  # the server first
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            break
        except OSError:
            time.sleep(0.05)
    while True:  # then its port, once it lets go
        s = socket.socket()
        try:
            s.bind((host, port))
            s.listen()
            break
        except OSError:
            s.close()
            time.sleep(0.05)
    with open(os.path.join(record, f"squatter-{os.getpid()}.bound"), "w") as f:
        f.write(str(port))
    time.sleep(3600)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
