"""Transport and load shapes against a loopback server in the same event loop (real sockets, fast)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from agent.probe.measure import interpret
from agent.probe.records import LoadShape, load_shapes
from agent.probe.runner import ProbeConfig, ProbeError, probe_async
from agent.probe.transport import Transport
from simulator.ports import free_port
from tests.probe.fakeserver import FakeServer

BODY = json.dumps({"model": "m", "prompt": [1, 2, 3], "max_tokens": 3, "stream": True}).encode()


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


@pytest.mark.parametrize("framing", ["chunked", "length", "close"])
def test_every_body_framing_gives_the_same_figures(framing):
    async def go() -> None:
        async with FakeServer(framing=framing) as srv:
            t = Transport(srv.url)
            try:
                results = [interpret(await t.request("POST", "/v1/completions", BODY)) for _ in range(3)]
            finally:
                await t.aclose()
            assert all(r.ok for r in results), results
            assert [r.output_tokens for r in results] == [3, 3, 3]
            assert all(r.ttft_ms and r.e2e_ms is not None and r.ttft_ms < r.e2e_ms for r in results)
            assert srv.connections == (3 if framing == "close" else 1)  # keep-alive unless the server closes
    run(go())


def test_a_keep_alive_connection_closed_by_the_server_is_replaced_once():
    async def go() -> None:
        async with FakeServer(close_after_answer=True) as srv:
            t = Transport(srv.url)
            try:
                first = await t.request("POST", "/v1/completions", BODY)
                await asyncio.sleep(0.05)  # the server has closed the pooled connection by now
                second = await t.request("POST", "/v1/completions", BODY)
            finally:
                await t.aclose()
            assert first.status == second.status == 200 and second.error is None
            assert srv.connections == 2
    run(go())


def test_connection_refused_timeout_and_a_cut_stream():
    async def go() -> None:
        t = Transport(f"http://127.0.0.1:{free_port()}")
        refused = await t.request("POST", "/v1/completions", BODY)
        assert refused.status is None and refused.error == "connection"
        async with FakeServer(hang=True) as srv:
            t = Transport(srv.url)
            t0 = time.monotonic()
            slow = await t.request("POST", "/v1/completions", BODY, timeout=0.3)
            assert slow.error == "timeout" and 0.25 < time.monotonic() - t0 < 2
            assert slow.status == 200 and interpret(slow).error == "timeout"
            await t.aclose()
        async with FakeServer(cut_after=2) as srv:
            t = Transport(srv.url)
            cut = await t.request("POST", "/v1/completions", BODY)
            r = interpret(cut)
            assert cut.error == "broken_stream" and r.error == "broken_stream"
            again = await t.request("POST", "/v1/completions", BODY)  # the broken connection was not reused
            assert again.status == 200
            await t.aclose()
    run(go())


def test_no_private_header_and_the_base_url_forms():
    async def go() -> None:
        async with FakeServer(sim_scale=50) as srv:  # a simulated server is sent what any server is sent
            rep = await probe_async(ProbeConfig(base_url=srv.url + "/v1/", profiles=("4:4",), requests=1, warmup=0,
                                                output_len=3))
            assert rep.time_scale == 50
            posts = [s for s in srv.seen if s.path == "/v1/completions"]
            assert posts and all(not any(h.startswith("x-sim") for h in s.headers) for s in posts)
    run(go())
    with pytest.raises(ValueError):
        Transport("ftp://host")


def test_prefix_warmed_first_warmup_excluded_and_requests_measured_in_order():
    async def go() -> None:
        async with FakeServer() as srv:
            cfg = ProbeConfig(base_url=srv.url, profiles=("4:10",), requests=3, warmup=1, output_len=3, prompt="ids")
            rep = await probe_async(cfg)
            gens = srv.generations
            assert rep.prompt == "ids" and rep.results[0].prompt == "ids"
            assert len(gens) == 1 + 1 + 3  # prefix warm, warm-up, measured
            prefix = gens[0].body["prompt"]
            assert len(prefix) == 6 and gens[0].body["max_tokens"] == 1
            for g in gens[1:]:
                assert len(g.body["prompt"]) == 10 and g.body["prompt"][:6] == prefix
                assert g.body["max_tokens"] == 3 and g.body["ignore_eos"] is True
            assert len({tuple(g.body["prompt"]) for g in gens[1:]}) == 4  # each request its own new part
            (r,) = rep.results
            assert (r.requests, r.ok, r.errors) == (3, 3, {})
            assert r.output_tokens == 9 and r.input_tokens == 10
            assert rep.model == "fake-model" and rep.time_scale == 1.0
            assert "x-sim-sent-ns" not in gens[0].headers
    run(go())


def test_text_by_default_the_servers_own_detokenized_text_else_words_and_the_mode_labelled():
    async def go() -> None:
        async with FakeServer(detokenize=True) as srv:
            rep = await probe_async(ProbeConfig(base_url=srv.url, profiles=("4:10",), requests=3, warmup=0,
                                                output_len=3))
            detok = [s for s in srv.seen if s.path == "/detokenize"]
            gens = srv.generations
            assert rep.prompt == "text" and rep.results[0].prompt == "text"
            prompts = [g.body["prompt"] for g in gens]
            assert all(isinstance(p, str) for p in prompts)  # text on the wire: the server tokenizes
            assert all(len(p.split()) == 10 and p.split()[0].startswith("d") for p in prompts[1:])
            assert prompts[1].split()[:6] == prompts[0].split()  # the shared prefix, as text
            assert len(detok) == 1 + 1 + 3  # the mode check, then one per prompt (before its clock starts)
            assert detok[-1].body["tokens"] == [int(w[1:]) for w in prompts[-1].split()]
            (r,) = rep.results
            assert r.input_tokens == 10 and r.ok == 3
            assert len(r.samples) == 3
            for x in r.samples:
                assert x.first_byte_ms is not None and x.ttft_ms is not None and x.e2e_ms is not None
                assert 0 < x.first_byte_ms <= x.ttft_ms <= x.e2e_ms
        async with FakeServer() as srv:  # no /detokenize (the simulator): one token per word, w<id>
            rep = await probe_async(ProbeConfig(base_url=srv.url, profiles=("4:4",), requests=1, warmup=0,
                                                output_len=3))
            (g,) = srv.generations
            assert rep.prompt == "words" and all(w.startswith("w") and w[1:].isdigit()
                                                 for w in g.body["prompt"].split())
            assert len(g.body["prompt"].split()) == 4
    run(go())


def test_a_422_for_engine_fields_is_retried_once_without_them_and_remembered():
    async def go() -> None:
        async with FakeServer(reject_engine_fields=True) as srv:
            cfg = ProbeConfig(base_url=srv.url, model="m", api="chat", images=2, requests=2, warmup=1, output_len=3)
            rep = await probe_async(cfg)
            gens = srv.generations
            assert [("ignore_eos" in g.body) for g in gens] == [True, False, False, False]
            assert [p["type"] for p in gens[1].body["messages"][0]["content"]] == ["text", "image_url", "image_url"]
            (r,) = rep.results
            assert r.ok == 2 and not r.engine_fields and not rep.engine_fields
            assert r.ttft_ms is not None and r.ttft_ms.n == 2  # the role-only chunk is not the first token
    run(go())


def test_concurrency_keeps_that_many_in_flight_and_errors_are_counted():
    async def go() -> None:
        async with FakeServer(gap_s=0.01, fail_request=4) as srv:
            cfg = ProbeConfig(base_url=srv.url, model="m", requests=8, warmup=0, output_len=3,
                              loads=load_shapes("1,4"))
            rep = await probe_async(cfg)
            seq, par = rep.results
            assert seq.load == LoadShape() and par.load == LoadShape(kind="concurrency", value=4)
            assert (seq.requests, seq.ok, seq.errors) == (8, 7, {"http_status": 1})
            assert seq.error_details == ("http_status: HTTP 500: boom",)
            assert (par.requests, par.ok) == (8, 8)
            assert srv.max_in_flight == 4
            assert par.duration_s < seq.duration_s
    run(go())


def test_poisson_rate_sends_every_request_and_the_simulator_scale_applies():
    async def go() -> None:
        async with FakeServer(sim_scale=50) as srv:
            cfg = ProbeConfig(base_url=srv.url, model="m", requests=6, warmup=0, output_len=3,
                              loads=load_shapes(rate=2000.0))
            rep = await probe_async(cfg)
            (r,) = rep.results
            assert r.ok == 6 and rep.time_scale == 50 and r.time_scale == 50
            assert r.ttft_ms is not None and r.ttft_ms.p50 > 50 * 0.0001  # wall ms x 50
            assert srv.generations and not any("x-sim-sent-ns" in g.headers for g in srv.generations)
    run(go())


def test_stop_ends_the_run_with_what_was_measured():
    async def go() -> None:
        async with FakeServer() as srv:
            calls = {"n": 0}

            def stop() -> bool:
                calls["n"] += 1
                return calls["n"] > 3

            cfg = ProbeConfig(base_url=srv.url, model="m", profiles=("8:8", "16:16"), requests=5, warmup=0)
            rep = await probe_async(cfg, stop=stop)
            assert len(rep.results) == 1 and rep.results[0].requests < 5
    run(go())


def test_no_server_and_no_model_is_one_clear_error():
    with pytest.raises(ProbeError, match="no server answers"):
        run(probe_async(ProbeConfig(base_url=f"http://127.0.0.1:{free_port()}")))


def test_load_shape_parsing():
    assert load_shapes() == (LoadShape(),)
    assert [s.label for s in load_shapes("1,4,16")] == ["sequential", "concurrency 4", "concurrency 16"]
    assert load_shapes(rate=2.5)[0].label == "rate 2.5/s"
    for bad in ("0", "x", "1.5"):
        with pytest.raises(ValueError):
            load_shapes(bad)
    with pytest.raises(ValueError):
        load_shapes("2", 1.0)


def test_the_simulated_release_priority_is_taken_and_given_back(monkeypatch):
    import os

    from agent.probe.runner import sim_priority

    before = (os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0))
    monkeypatch.setenv("M1000_SIM_PRIORITY", "off")
    sim_priority()()
    assert (os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0)) == before
    monkeypatch.setenv("M1000_SIM_PRIORITY", "rt")
    undo = sim_priority()
    try:
        if os.geteuid() == 0:  # with permission: real-time round robin while the probe measures
            assert os.sched_getscheduler(0) == os.SCHED_RR
    finally:
        undo()
    assert (os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0)) == before
