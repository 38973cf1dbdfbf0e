from agent.records import MODEL_KEYS
from agent.tables import parse_seed


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
