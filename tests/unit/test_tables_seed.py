from agent.tables import parse_seed
from contract.records import MODEL_KEYS


def test_seed_parses_into_every_model_key(seed_text):
    tables = parse_seed(seed_text)
    assert set(tables) == set(MODEL_KEYS)
    assert [len(tables[k]) for k in MODEL_KEYS] == [11, 11, 15, 11, 15, 11, 18]
    assert not [r for rows in tables.values() for r in rows if r.flags]


def test_seed_mtp_row_values(seed_text):
    row = next(r for r in parse_seed(seed_text)["qwen35_mtp"] if r.prompt_index == 13)
    assert (row.prediction, row.ground_truth, row.correct) == ("12", "13", False)
    assert row.accept_rate == 0.7455 and row.accept_rate_len == 0.8136
    assert row.profile == "gsm8k:13"


def test_seed_every_table_shape(seed_text):
    from agent.tables import parse_tables

    tables = parse_tables(seed_text)
    assert [t.kind for t in tables] == ["sweep", "sweep", "mtp", "sweep", "mtp", "sweep", "sweep", "vision"]
    assert all(not t.unknown_columns for t in tables)
    seed = parse_seed(seed_text)
    sweep = next(r for r in seed["qwen3"] if r.profile == "250:16000")
    assert (sweep.prefill_len, sweep.input_tokens, sweep.prefix_tokens, sweep.measured_output) == (250, 16000, 15750,
                                                                                                  100)
    assert sweep.ttft_ms == 5358.567 and sweep.tpot_ms == 63.85 and sweep.ctx_k == 16
    fq_mtp = next(r for r in seed["qwen35_fq_mtp"] if r.prompt_index == 18)
    assert fq_mtp.prefix_tokens is None and fq_mtp.prediction == "57500" and fq_mtp.correct is True
    vision = [r for r in seed["qwen3vl"] if r.table == "vision"]
    assert len(vision) == 7 and {r.vision_fps for r in vision} == {6.004} and {r.precision for r in vision} == {"w4a16"}
    assert [r.input_tokens for r in vision] == [250, 500, 1000, 2000, 4000, 8000, 16000]
    assert vision[0].output_tokens == 50 and vision[0].profile == "vision:250:250"
    assert vision[0].ttft_ms is None and not vision[0].flags


def test_seed_with_crlf_and_spaces_parses_the_same(seed_text):
    import re

    base = parse_seed(seed_text)
    mangled = re.sub("\t", "   ", seed_text).replace("\n", "\r\n")
    assert parse_seed(mangled) == base
