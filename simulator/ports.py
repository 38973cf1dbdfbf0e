"""Loopback ports for simulated modules' servers, picked before any of them binds one."""

from __future__ import annotations

import random
import socket
from pathlib import Path


def _ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


_HANDED_OUT: set[int] = set()  # ports free_port gave this process: a module's server may not have bound its own yet


def free_port() -> int:
    """A loopback port free now and not handed out before by this process, below the kernel's
    ephemeral range when it can be: a port the kernel may hand to an outgoing connection (50
    agents make hundreds) can be taken between this choice and the server's bind ("already in
    use before starting the server"), and so can one given to another module whose server has
    not started yet (50 random picks out of ~22,000 ports: a repeat in ~5 % of labs)."""
    lo, _ = _ephemeral_range()
    rng = random.SystemRandom()
    for _ in range(50):
        port = rng.randrange(10000, lo) if lo > 10100 else 0
        if port in _HANDED_OUT:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            got = int(s.getsockname()[1])
        if got not in _HANDED_OUT:
            _HANDED_OUT.add(got)
            return got
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        got = int(s.getsockname()[1])
    _HANDED_OUT.add(got)
    return got
