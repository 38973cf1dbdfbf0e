"""The result-table parser on hand-made tables no simulator produced."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.steps import parse_benchmark
from agent.tables import TableError, parse_rows, parse_tables

SWEEP = (
    "Model\tSize\tPrefillLen(tokens)\tCtx(K)\tBatch\tNChip\tInput(tokens)\tOutput(tokens)\tPrefill(tps)\tTTFT(ms)"
    "\tDecode(tps)\tTPOT(ms)\tProfile\tPrefix(tokens)\tMeasuredOutput(tokens)\n"
    "Qwen3\t30b_a3b\t128\t16\t1\t1\t128\t100\t64.606\t1981.228\t24.531\t40.765\t128:128\t0\t100\n"
    "Qwen3\t30b_a3b\t250\t16\t1\t1\t1000\t100\t76.303\t3276.39\t22.871\t43.723\t250:1000\t750\t100\n"
)
MTP = (
    "Model\tSize\tPrefillLen(tokens)\tBatch\tNChip\tInput(tokens)\tOutput(tokens)\tPrefill(tps)\tTTFT(ms)"
    "\tDecode(tps)\tTPOT(ms)\tPrompt Index\taccept rate((acclen-1)/(4-1))\taccept rate(acclen/4)\tPrediction"
    "\tGround Truth\tCorrect\n"
    "Qwen3.5_FQ\t35b_a3b\t882\t1\t1\t882\t169\t92.3\t9555.32\t21.19\t47.19\t13\t0.6667\t0.7545\t12\t13\tFALSE\n"
    "Qwen3.5_FQ\t35b_a3b\t868\t1\t1\t868\t61\t92.24\t9409.8\t26.83\t37.27\t17\t0.9167\t0.9531\t230\t230\tTRUE\n"
)
VISION = (
    "Model\tSize\tPrefillLen(k)\tCtx(k)\tBatch\tNChip\tInput(k)\tOutput(k)\tPrefill(tps)\tDecode(tps)\tVision(fps)"
    "\tPrecision\n"
    "Qwen3-VL\t8B\t0.25\t16\t1\t1\t0.5\t0.05\t137.503\t10.39\t6.004\tw4a16\n"
    "Qwen3-VL\t8B\t0.25\t16\t1\t1\t16\t0.05\t76.728\t9.752\t6.004\tw4a16\n"
)


def _cols(text: str) -> list[list[str]]:
    return [line.split("\t") for line in text.strip("\n").split("\n")]


def _join(rows: list[list[str]], sep: str = "\t", eol: str = "\n") -> str:
    return eol.join(sep.join(r) for r in rows) + eol


@pytest.mark.parametrize("text", [SWEEP, MTP, VISION])
def test_crlf_and_space_runs_give_the_same_rows(text):
    base = parse_rows(text)
    assert parse_rows(text.replace("\n", "\r\n")) == base
    assert parse_rows(_join(_cols(text), sep="   ")) == base
    assert parse_rows(_join(_cols(text), sep="  ", eol="\r\n")) == base


def test_mtp_header_with_single_spaces():
    rows = _cols(MTP)
    header = " ".join(rows[0])  # multi-word names separated by single blanks, like copied from a web page
    body = [" ".join(r) for r in rows[1:]]
    parsed = parse_rows("\n".join([header, *body]) + "\n")
    assert [r.profile for r in parsed] == ["gsm8k:13", "gsm8k:17"]
    assert parsed[0].correct is False and parsed[1].accept_rate_len == 0.9531


def test_shapes_and_units():
    sweep, mtp, vision = (parse_tables(t)[0] for t in (SWEEP, MTP, VISION))
    assert (sweep.kind, mtp.kind, vision.kind) == ("sweep", "mtp", "vision")
    assert sweep.rows[1].profile == "250:1000" and sweep.rows[1].prefix_tokens == 750
    assert (mtp.rows[0].prediction, mtp.rows[0].ground_truth) == ("12", "13")
    v = vision.rows[1]
    assert (v.prefill_len, v.input_tokens, v.output_tokens, v.vision_fps, v.precision) == (250, 16000, 50, 6.004,
                                                                                           "w4a16")
    assert v.profile == "vision:250:16000" and v.ctx_k == 16


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([SWEEP, MTP, VISION]), st.randoms(use_true_random=False))
def test_reordered_columns_give_the_same_rows(text, rnd):
    rows = _cols(text)
    order = list(range(len(rows[0])))
    rnd.shuffle(order)
    shuffled = [[r[i] for i in order] for r in rows]
    assert parse_rows(_join(shuffled)) == parse_rows(text)


def test_unknown_extra_columns_are_kept():
    rows = _cols(SWEEP)
    rows[0][3:3] = ["GPU Temp(C)"]
    rows[1][3:3] = ["61"]
    rows[2][3:3] = ["63"]
    table = parse_tables(_join(rows))[0]
    assert table.unknown_columns == ("GPU Temp(C)",)
    assert [r.extra for r in table.rows] == [{"GPU Temp(C)": "61"}, {"GPU Temp(C)": "63"}]
    assert table.rows[0].ttft_ms == 1981.228


def test_missing_optional_columns():
    rows = _cols(SWEEP)
    drop = {"Ctx(K)", "Profile", "Prefix(tokens)", "MeasuredOutput(tokens)", "Size", "TPOT(ms)"}
    keep = [i for i, h in enumerate(rows[0]) if h not in drop]
    parsed = parse_rows(_join([[r[i] for i in keep] for r in rows]))
    assert [r.profile for r in parsed] == ["128:128", "250:1000"]
    assert parsed[1].prefix_tokens == 750 and parsed[1].ctx_k is None and parsed[1].tpot_ms is None
    assert not parsed[0].flags


def test_empty_cells_are_missing_values():
    rows = _cols(SWEEP)
    rows[1][rows[0].index("Decode(tps)")] = "-"
    rows[1][rows[0].index("TPOT(ms)")] = ""
    parsed = parse_rows(_join(rows))
    assert parsed[0].decode_tps is None and parsed[0].tpot_ms is None


@pytest.mark.parametrize(
    ("mutate", "line", "what"),
    [
        (lambda r: r[2].__setitem__(8, "fast"), 3, "Prefill(tps)"),
        (lambda r: r[1].append("extra"), 2, "row has 16 cells, header has 15"),
        (lambda r: r[1].__setitem__(6, "12.5"), 2, "not a whole number"),
        (lambda r: r[1].__setitem__(0, ""), 2, "required column 'model'"),
    ],
)
def test_malformed_table_names_the_line(mutate, line, what):
    rows = _cols(SWEEP)
    mutate(rows)
    text = "some banner\n\n" + _join(rows)
    with pytest.raises(TableError) as exc:
        parse_rows(text, source="bench.out")
    assert exc.value.line == line + 2 and f"bench.out:{line + 2}:" in str(exc.value)
    assert what in str(exc.value)


def test_mtp_bad_boolean_names_the_line():
    text = MTP.replace("\tTRUE\n", "\tmaybe\n")
    with pytest.raises(TableError, match=r"line 3: column 'Correct': not a boolean"):
        parse_rows(text)


def test_header_without_rows_and_duplicate_columns():
    header = SWEEP.split("\n")[0]
    with pytest.raises(TableError, match="line 1: table header with no rows"):
        parse_rows(header + "\n\n")
    rows = _cols(SWEEP)
    rows[0][1] = "TTFT(ms)"
    with pytest.raises(TableError, match="duplicate column"):
        parse_rows(_join(rows))


def test_rows_breaking_the_seed_relations_are_flagged():
    rows = _cols(SWEEP)
    ttft = rows[0].index("TTFT(ms)")
    tpot = rows[0].index("TPOT(ms)")
    rows[1][ttft] = "2500"  # 128 / 64.606 tok/s is 1981 ms, not 2500
    rows[2][tpot] = "60"  # 1000 / 22.871 tok/s is 43.7 ms
    parsed = parse_rows(_join(rows))
    assert parsed[0].flags == ("ttft_vs_prefill",) and parsed[1].flags == ("tpot_vs_decode",)
    rows = _cols(SWEEP)
    rows[1][ttft] = f"{1981.228 * 1.02:.3f}"  # within 3 %: the seed's own rounding
    assert not parse_rows(_join(rows))[0].flags


def test_negative_figures_are_flagged():
    text = VISION.replace("\t6.004\tw4a16\n", "\t-1\tw4a16\n", 1)
    assert "vision_fps_invalid_negative" in parse_rows(text)[0].flags


@pytest.mark.parametrize(("cell", "why"), [("0", "zero"), ("0.000", "zero"), ("-24.5", "negative"), ("inf", "inf"),
                                           ("-inf", "inf"), ("nan", "nan")])
def test_figures_no_benchmark_measures_are_flagged_by_what_is_wrong(cell, why):
    rows = _cols(SWEEP)
    rows[1][rows[0].index("Decode(tps)")] = cell
    parsed = parse_rows(_join(rows))
    assert f"decode_tps_invalid_{why}" in parsed[0].flags
    assert not any("invalid" in f for f in parsed[1].flags)  # the other row is fine


def test_an_accept_rate_of_zero_is_a_figure_and_an_accept_length_of_zero_is_not():
    rows = _cols(MTP)
    rows[1][rows[0].index("accept rate((acclen-1)/(4-1))")] = "0"  # no draft token accepted: acclen 1
    rows[1][rows[0].index("accept rate(acclen/4)")] = "0.25"
    rows[2][rows[0].index("accept rate(acclen/4)")] = "0"
    first, second = parse_rows(_join(rows))
    assert not any("accept_rate" in f for f in first.flags)
    assert "accept_rate_len_invalid_zero" in second.flags


def test_a_profile_twice_in_one_table_is_flagged_on_the_later_row_and_kept():
    rows = _cols(SWEEP)
    text = _join([*rows, rows[1]])
    parsed = parse_rows(text)
    assert [r.flags for r in parsed] == [(), (), ("duplicate_row",)]
    kept = parse_benchmark(text, "qwen3")  # one row per profile, the last: its flag goes with it
    assert len(kept) == 2 and "duplicate_row" in next(r for r in kept if r.profile == "128:128").flags


def test_benchmark_output_around_the_tables():
    noise = "INFO starting\nwarmup 3/3 done\n"
    rows = parse_benchmark(noise + "Qwen3-VL-8B results\n" + SWEEP + "\n" + VISION + "bye\n", "qwen3vl")
    assert len(rows) == 4
    with pytest.raises(TableError, match="no vision table"):
        parse_benchmark(SWEEP, "qwen3vl")
    with pytest.raises(TableError, match="no result table"):
        parse_benchmark(noise, "qwen3")
    # a table printed twice (progress, then final) keeps one row per profile, the last
    twice = parse_benchmark(SWEEP + "\n" + SWEEP.replace("1981.228", "1981.5"), "qwen3")
    assert len(twice) == 2 and twice[0].ttft_ms == 1981.5


def test_no_tabs_single_space_data_rows():
    rows = _cols(SWEEP)
    text = "\t".join(rows[0]) + "\n" + "\n".join(" ".join(r) for r in rows[1:]) + "\n"
    assert parse_rows(text) == parse_rows(SWEEP)


def test_header_cases_and_blanks_inside_names():
    header = re.sub("Prefill\\(tps\\)", "prefill (TPS)", SWEEP.split("\n")[0])
    text = SWEEP.replace(SWEEP.split("\n")[0], header)
    assert parse_rows(text) == parse_rows(SWEEP)
