"""The SSE parser on hand-made byte streams, fed in every way they can be cut into reads."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.probe.sse import SSEEvent, SSEParser


def parse(reads: list[bytes]) -> tuple[list[SSEEvent], int, int]:
    p = SSEParser()
    out: list[SSEEvent] = []
    for r in reads:
        out += p.feed(r)
    rest, cut = p.close()
    return out + rest, cut, p.comments


def test_events_end_at_blank_lines_and_one_space_is_dropped():
    events, cut, _ = parse([b'data: {"a":1}\n\ndata:{"b":2}\n\ndata:  two spaces\n\n'])
    assert [e.data for e in events] == ['{"a":1}', '{"b":2}', " two spaces"]
    assert cut == 0


def test_a_data_line_split_across_reads_is_one_event():
    events, cut, _ = parse([b'da', b'ta: {"choi', b'ces":[]}', b'\n', b'\n'])
    assert events == [SSEEvent('{"choices":[]}')]
    assert cut == 0


def test_crlf_cr_and_lf_line_ends_and_a_crlf_split_across_reads():
    events, _, _ = parse([b"data: a\r\n\r\ndata: b\r\rdata: c\n\ndata: d\r", b"\n\r", b"\n"])
    assert [e.data for e in events] == ["a", "b", "c", "d"]


def test_keep_alive_comments_are_counted_and_never_events():
    events, _, comments = parse([b": keep-alive\n\n:ping\n", b"data: x\n\n: bye\n\n"])
    assert [e.data for e in events] == ["x"]
    assert comments == 3


def test_multi_line_data_joins_with_newline_and_event_names_are_kept():
    events, _, _ = parse([b"event: delta\ndata: line 1\ndata: line 2\nid: 7\nretry: 10\n\n"])
    assert events == [SSEEvent("line 1\nline 2", "delta")]


def test_done_is_an_event_like_any_other():
    events, _, _ = parse([b"data: [DONE]\n\n"])
    assert events == [SSEEvent("[DONE]")]


def test_a_last_event_without_its_blank_line_is_dispatched_at_the_end():
    events, cut, _ = parse([b"data: 1\n\ndata: 2\n"])
    assert [e.data for e in events] == ["1", "2"] and cut == 0
    events, cut, _ = parse([b"data: 1\n\ndata: 2\r"])
    assert [e.data for e in events] == ["1", "2"] and cut == 0


def test_a_stream_cut_in_the_middle_of_a_line_reports_the_cut_and_drops_the_half_event():
    events, cut, _ = parse([b'data: {"ok":1}\n\ndata: {"choices":[{"te'])
    assert [e.data for e in events] == ['{"ok":1}']
    assert cut == len(b'data: {"choices":[{"te')


STREAM = (b': hello\r\n\r\ndata: {"x":1}\r\n\r\nevent: e\ndata: a\ndata: b\n\n'
          b"data: \xe4\xbd\xa0\xe5\xa5\xbd\n\ndata: [DONE]\r\r")


@given(st.lists(st.integers(min_value=1, max_value=len(STREAM) - 1), unique=True, max_size=12))
def test_any_cut_into_reads_gives_the_same_events(cuts):
    bounds = [0, *sorted(cuts), len(STREAM)]
    reads = [STREAM[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    events, cut, comments = parse(reads)
    assert events == [SSEEvent('{"x":1}'), SSEEvent("a\nb", "e"), SSEEvent("你好"), SSEEvent("[DONE]")]
    assert cut == 0 and comments == 1


@pytest.mark.parametrize("line", [b"data", b"data:"])
def test_a_data_field_without_value_is_an_empty_line_of_data(line):
    events, _, _ = parse([line + b"\n\n"])
    assert events == [SSEEvent("")]
