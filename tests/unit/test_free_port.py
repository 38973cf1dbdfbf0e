"""Ports for simulated modules' servers (``simulator.ports.free_port``): a lab of N modules picks N
ports before any server binds one, so a port handed out once must not come back (the 50-module
smoke test failed once: two modules given the same port, the second found it "already in use
before starting the server")."""

from __future__ import annotations

from simulator.ports import _ephemeral_range, free_port


def test_no_port_is_handed_out_twice_and_none_is_ephemeral():
    ports = [free_port() for _ in range(3000)]  # ~13 % of the range below the ephemeral ports
    assert len(set(ports)) == len(ports)
    lo, _ = _ephemeral_range()
    assert all(10000 <= p < lo for p in ports) or lo <= 10100
