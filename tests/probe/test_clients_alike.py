"""Issue 45's acceptance on this CPU: two independent clients, the project's probe (as the agent runs it) and a plain
client written from sglang ``bench_serving``'s definitions (``bench/plain_client.py``: no private header, no
scheduling priority), agree with the reference document within 1 % against the simulated module while both cores
are busy with CPU hogs; the server's own TTFT (its usage chunk's ``m1000_sim``) within 0.5 %.

Time scale 2: a client's own time counts 2 times (``bench/sim_clients.py``: at 50, +3 to +8 % TTFT for the plain
client on a loaded machine, its own wall time times 50, while the simulated server's own TTFT stays on the
reference). Real processes; the alone tier: the load is the test's own hogs, one per core, not a neighbour's (beside
six other suites at load 17 on 2 cores, the plain client's own CPU share added ~1.8 % at 128 tokens: the assertion
says how much was the client's own)."""

from __future__ import annotations

import math
import os
import signal
from collections.abc import Iterator

import pytest

from bench import sim_clients
from simulator.ports import free_port

pytestmark = [pytest.mark.slow, pytest.mark.alone]
SCALE = 2.0
PROFILES = ("128:128", "500:500")


@pytest.fixture(scope="module")
def loaded_server() -> Iterator[str]:
    port = free_port()
    proc = sim_clients.serve(SCALE, port)
    hogs = []
    try:
        url = f"http://127.0.0.1:{port}"
        sim_clients.wait_ready(url, 60)
        hogs = sim_clients.hogs(os.cpu_count() or 1)
        yield url
    finally:
        for h in hogs:
            h.kill()
            h.wait()
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)


@pytest.mark.parametrize("profile", PROFILES)
def test_the_probe_and_a_plain_client_agree_with_the_reference_under_load(loaded_server: str, profile: str) -> None:
    ttft_ref, tpot_ref = sim_clients.reference()[profile]
    plain = sim_clients.plain_round(loaded_server, profile, 3, SCALE, os.urandom(3).hex())
    probe = sim_clients.probe_round(loaded_server, profile, 3)
    (p_ttft, p_tpot, server), (q_ttft, q_tpot, _) = plain[0], probe[0]
    assert not math.isnan(server) and server == pytest.approx(ttft_ref, rel=0.005)  # the server's own: exact
    why = f"the server's own TTFT {server:.1f} ms; the plain client added {p_ttft - server:.1f} ms of its own"
    assert p_ttft == pytest.approx(ttft_ref, rel=0.01), why
    assert q_ttft == pytest.approx(ttft_ref, rel=0.01), f"probe {q_ttft:.1f} ms; {why}"
    assert p_tpot == pytest.approx(tpot_ref, rel=0.01) and q_tpot == pytest.approx(tpot_ref, rel=0.01)
