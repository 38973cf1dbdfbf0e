"""The real server's streams, recorded once (transformers serve on this machine's CPU and on an H200), replayed.

They are the ground truth of what a real server sends: a chat stream whose first chunk carries
only the role, several tokens in one chunk, usage in a last chunk with empty text, no
``[DONE]`` line, HTTP 422 for a field the OpenAI API does not define. Also the release's
pure planners: what the start script refuses, and why.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.steps import last_reason
from agent.validate import env_name_problem
from simulator.build import BuildError
from simulator.engine.release import parse_profiles
from simulator.engine.runtime import serve, transformers_serve
from simulator.engine.runtime.bench import measure, words
from simulator.engine.runtime.common import EngineError
from tests.support.engine import FIXTURES, replay, sections


def test_cpu_completion_stream_counts_tokens_from_usage():
    lines = sections("transformers-serve-cpu-sse.txt")["completions"]
    m = measure(0.0, replay(lines))
    assert (m.tokens, m.tokens_from, m.chunks, m.cached) == (8, "usage", 8, 0)
    assert m.text.split() == [w for w in m.text.split() if w.startswith("w")] and len(m.text.split()) == 8
    events = [i for i, line in enumerate(lines) if line.startswith(b"data:")]
    first_text, last_text = events[0], events[7]
    assert m.ttft_ms == pytest.approx(10 * (first_text + 1))
    assert m.tpot_ms == pytest.approx(10 * (last_text - first_text) / 7)
    assert not any(b"[DONE]" in line for line in lines)  # the stream just ends


def test_chat_stream_first_chunk_is_role_only_and_does_not_count_as_first_token():
    for name in ("transformers-serve-cpu-sse.txt", "transformers-serve-h200-sse.txt"):
        lines = sections(name)["chat"]
        first = json.loads(next(line for line in lines if line.startswith(b"data:"))[5:])
        assert first["choices"][0]["delta"] == {"role": "assistant"}
        m = measure(0.0, replay(lines))
        second_event = [i for i, line in enumerate(lines) if line.startswith(b"data:")][1]
        assert m.ttft_ms == pytest.approx(10 * (second_event + 1)), name
        assert m.tokens == 8 and m.tokens_from == "usage", name


def test_h200_chat_stream_carries_eight_tokens_in_one_chunk():
    m = measure(0.0, replay(sections("transformers-serve-h200-sse.txt")["chat"]))
    assert (m.chunks, m.tokens) == (1, 8)
    assert m.tpot_ms == 0.0  # one text chunk: no decode interval to measure, not a made-up figure


def test_h200_completion_stream_replays_like_the_cpu_one():
    m = measure(0.0, replay(sections("transformers-serve-h200-sse.txt")["completions"]))
    assert (m.tokens, m.chunks, m.tokens_from) == (8, 8, "usage")


def test_without_usage_tokens_come_from_chunks_and_a_textless_stream_is_an_error():
    lines = [line for line in sections("transformers-serve-cpu-sse.txt")["completions"] if b"usage" not in line]
    m = measure(0.0, replay(lines))
    assert (m.tokens, m.tokens_from) == (8, "chunks")
    role_only = sections("transformers-serve-cpu-sse.txt")["chat"][:2]
    with pytest.raises(EngineError, match="without any text"):
        measure(0.0, replay(role_only))


def test_recorded_refusals_of_the_real_server():
    text = (FIXTURES / "transformers-serve-cpu-sse.txt").read_text()
    assert "Unexpected fields in the request: {'ignore_eos'}\"}\nHTTP 422" in text
    assert "Server is pinned to 'tiny-qwen3-moe'; requested 'default'.\"}\nHTTP 400" in text


def test_prompt_words_are_one_token_each(tmp_path: Path):
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 2048, "max_position_embeddings": 8192}))
    vocab, ctx_k = transformers_serve.model_sizes({"path": str(tmp_path)}, {}, {})
    assert (vocab, ctx_k) == (2046, 8)  # the tokenizer's last two ids are not words
    assert len(words(3, 50, vocab).split()) == 50
    assert all(0 <= int(w[1:]) < 2046 for w in words(9, 500, vocab).split())


def test_start_script_refuses_speculative_decoding_and_unknown_arguments():
    with pytest.raises(EngineError, match="speculative decoding .* not supported by transformers serve"):
        serve.plan({}, "Qwen3.5-35B-A3B-GPTQ-Int4", "127.0.0.1", "30000",
                   ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3"], transformers_serve)
    with pytest.raises(EngineError, match="unsupported extra server arguments --tp-size 2"):
        serve.plan({}, "Qwen3-30B-A3B-GPTQ-Int4", "127.0.0.1", "30000", ["--tp-size", "2"], transformers_serve)


def test_start_script_refuses_an_unsupported_architecture_and_an_unprepared_model(tmp_path: Path):
    wf = tmp_path / "wf.json"
    models = [{"name": "Qwen3-VL-8B", "path": "/m/Qwen3-VL-8B", "model_type": "qwen3_vl", "supported": False,
               "why": "architecture qwen3_vl is not served by this release (supported: qwen3_moe)"},
              {"name": "Qwen3-30B-A3B-GPTQ-Int4", "path": "/m/q3", "model_type": "qwen3_moe", "supported": True,
               "why": ""}]
    wf.write_text(json.dumps({"models": models}))
    env = {"SGLANG_MUSA_RELEASE_DIR": str(tmp_path), "TILELANG_WORKFLOW_FILE": str(wf),
           "TILELANG_CACHE_DIR": str(tmp_path / "cache")}
    with pytest.raises(EngineError, match="qwen3_vl is not served"):
        serve.plan(env, "Qwen3-VL-8B", "127.0.0.1", "1", [], transformers_serve)
    with pytest.raises(EngineError, match="not prepared .* run scripts/ci/musa/precompile_tilelang_kernels.sh"):
        serve.plan(env, "Qwen3-30B-A3B-GPTQ-Int4", "127.0.0.1", "1", [], transformers_serve)
    (tmp_path / "cache" / "engine").mkdir(parents=True)
    (tmp_path / "cache" / "engine" / "Qwen3-30B-A3B-GPTQ-Int4.json").write_text(json.dumps({"path": "/m/q3"}))
    argv = serve.plan({**env, "M1000_ENGINE_PYTHON": "/e/python", "M1000_ENGINE_DEVICE": "cuda:0"},
                      "Qwen3-30B-A3B-GPTQ-Int4", "127.0.0.1", "31000", [], transformers_serve)
    assert argv == ["/e/python", "-m", "transformers.cli.transformers", "serve", "--device", "cuda:0", "--host",
                    "127.0.0.1", "--port", "31000", "--log-level", "info", "/m/q3"]


def test_profiles_spec():
    assert parse_profiles("16,64;128@32", 16) == {"no_prefix": [16, 64], "shared_prefix": [128], "prefix_new": 32,
                                                  "output": 16}
    assert parse_profiles("128", 100)["shared_prefix"] == []
    for bad in ("", "a,b", "16;32@32", "16;-1@4"):
        with pytest.raises(BuildError):
            parse_profiles(bad, 16)


def test_last_reason_of_a_dying_server():
    tail = ("Loading weights:   0%|  | 0/25\rLoading weights: 40%|  | 10/25\n"
            "Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
            "safetensors_rust.SafetensorError: Error while deserializing header: header too large\n")
    assert last_reason(tail) == "safetensors_rust.SafetensorError: Error while deserializing header: header too large"
    assert last_reason("a\rprogress 100%\n\n") == "progress 100%"
    assert last_reason("") == ""


def test_requests_cannot_choose_the_release_interpreter():
    assert env_name_problem("M1000_ENGINE_PYTHON") is not None
    assert env_name_problem("M1000_ENGINE_DEVICE") is None
