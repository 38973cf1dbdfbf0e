"""The simulated device's scheduler (pure): batch 1 is the fitted model's timeline; more requests share the device."""

from __future__ import annotations

import pytest

from simulator.runtime.device import DECODE_SLOWDOWN, Device, Job


def _job(arrival: float, prefill: float = 100.0, tokens: int = 5, step: float = 10.0, new: int = 128,
         kv: int = 228) -> Job:
    return Job(arrival, prefill, [(step, 1)] * (tokens - 1), new=new, kv=kv)


def _drain(dev: Device, jobs: list[Job], until: float = 1e6, tick: float = 1.0) -> None:
    t = 0.0
    while t < until and not all(j.finished for j in jobs):
        dev.advance(t)
        t += tick


def test_one_request_gets_the_fitted_timeline_on_absolute_times() -> None:
    dev = Device(16384)
    j = _job(1000.0)
    dev.submit(j)
    dev.advance(1000.5)  # registered a little after it was sent: its clock starts at the send instant
    assert j.chunks == [(1100.0, 1)]
    dev.advance(1100.0)  # the first token was sent at its time: the decode steps follow it
    _drain(dev, [j])
    assert [t for t, _ in j.chunks] == pytest.approx([1100.0, 1110.0, 1120.0, 1130.0, 1140.0])
    assert all(n == 1 for _, n in j.chunks)  # one token per chunk


def test_step_after_a_prefill_starts_when_the_first_token_was_sent() -> None:
    dev = Device(16384)
    j = _job(0.0)
    dev.submit(j)
    dev.advance(0.0)
    dev.advance(103.0)  # the server woke 3 ms late for the first token
    assert j.chunks[1] == (113.0, 1)
    dev.advance(500.0)  # later steps keep absolute times, however late the wake-ups
    assert [t for t, _ in j.chunks[1:]] == pytest.approx([113.0, 123.0, 133.0, 143.0])


def test_speculative_steps_are_one_chunk_each() -> None:
    dev = Device(16384)
    j = Job(0.0, 50.0, [(40.0, 3), (40.0, 4), (40.0, 2)], new=900, kv=1000)
    dev.submit(j)
    _drain(dev, [j])
    assert j.chunks == [(50.0, 1), (90.0, 3), (130.0, 4), (170.0, 2)]


def test_requests_arriving_together_share_one_prefill_and_slower_decode_steps() -> None:
    dev = Device(16384, batch_saving=lambda jobs: 60.0)
    a, b = _job(0.0), _job(0.0)
    for j in (a, b):
        dev.submit(j)
    _drain(dev, [a, b])
    assert a.chunks[0] == b.chunks[0] == (140.0, 1)  # 100 + 100 - 60 saved by batching
    step = 10.0 * (1 + DECODE_SLOWDOWN)
    assert [t for t, _ in a.chunks] == pytest.approx([140.0 + k * step for k in range(5)])


def test_a_new_request_waits_for_the_running_step_then_stalls_decoding() -> None:
    dev = Device(16384)
    a = _job(0.0, tokens=20)
    dev.submit(a)
    dev.advance(0.0)
    dev.advance(100.0)  # a decodes from 100: steps end at 110, 120, ...
    b = _job(115.0)
    dev.submit(b)
    _drain(dev, [a, b])
    assert b.chunks[0] == (220.0, 1)  # prefilled after a's step that ended at 120
    assert (130.0, 1) not in a.chunks and a.chunks[3][0] == pytest.approx(220.0 + 10.0 * (1 + DECODE_SLOWDOWN))


def test_kv_capacity_queues_requests_until_one_finishes() -> None:
    dev = Device(500)
    a, b = _job(0.0, kv=300), _job(0.0, kv=300)
    for j in (a, b):
        dev.submit(j)
    _drain(dev, [a, b])
    assert a.chunks[0] == (100.0, 1)
    assert b.chunks[0][0] == pytest.approx(a.chunks[-1][0] + 100.0)  # after a left the device


def test_a_cancelled_request_leaves_the_batch() -> None:
    dev = Device(16384)
    a, b = _job(0.0, tokens=10), _job(0.0, tokens=10)
    for j in (a, b):
        dev.submit(j)
    dev.advance(0.0)
    dev.advance(200.0)
    dev.cancel(a)
    before = len(b.chunks)
    dev.advance(400.0)
    gaps = [y - x for (x, _), (y, _) in zip(b.chunks[before - 1:], b.chunks[before:], strict=False)]
    assert gaps and all(g == pytest.approx(10.0) for g in gaps[1:])  # alone again: batch-1 steps
