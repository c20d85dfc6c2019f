"""SSE decoding and stream timing on recorded real streams (and two synthetic ones)."""

from __future__ import annotations

import pytest

from tandem.bench.records import ErrorCategory
from tandem.bench.timed_request import ENDPOINTS, SSEDecoder, StreamAccumulator


def split_every(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def replay(endpoint: str, data: bytes, read_size: int = 64, *, clean_end: bool = True) -> dict:
    """Feed a recorded stream in reads of read_size bytes, read k arriving at t = k ms."""
    acc = StreamAccumulator(ENDPOINTS[endpoint])
    for k, raw in enumerate(split_every(data, read_size)):
        acc.feed(raw, k / 1000)
    return acc.finish(clean_end=clean_end)


@pytest.mark.parametrize("size", [1, 7, 64, 100_000], ids=lambda s: f"reads of {s} bytes")
def test_decoder_gives_the_same_events_whatever_the_read_boundaries(fixture_bytes, size):
    data = fixture_bytes("sse_chat_ok.txt")
    decoder = SSEDecoder()
    events = [e for raw in split_every(data, size) for e in decoder.feed(raw)]
    assert len(events) == 11  # role chunk, 8 tokens, usage, [DONE]
    assert events[-1].data == "[DONE]"
    assert decoder.close() == []


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b": ping\n\ndata: x\n\n", [(None, "x")]),
        (b"data: a\r\ndata: b\r\n\r\n", [(None, "a\nb")]),
        (b"event: error\ndata: {}\n\n", [("error", "{}")]),
        (b"data:nospace\n\n", [(None, "nospace")]),
        (b"id: 3\n\n", []),
    ],
    ids=[
        "comment skipped",
        "crlf and two data lines joined",
        "named event",
        "no space after colon",
        "event without data ignored",
    ],
)
def test_decoder_follows_the_sse_rules(raw, expected):
    assert [(e.event, e.data) for e in SSEDecoder().feed(raw)] == expected


def test_decoder_keeps_a_utf8_character_split_across_reads():
    data = 'data: {"t": "é"}\n\n'.encode()
    cut = data.index("é".encode()) + 1
    decoder = SSEDecoder()
    events = decoder.feed(data[:cut]) + decoder.feed(data[cut:])
    assert events[0].data == '{"t": "é"}'


@pytest.mark.parametrize(
    ("endpoint", "fixture", "prompt_tokens"),
    [
        ("chat", "sse_chat_ok.txt", 17),
        ("completions", "sse_completions_ok.txt", 11),
    ],
    ids=["chat", "completions"],
)
def test_recorded_stream_gives_eight_tokens_from_usage(
    fixture_bytes, endpoint, fixture, prompt_tokens
):
    fields = replay(endpoint, fixture_bytes(fixture), read_size=100_000)
    assert fields["ok"] and fields["error"] is None
    assert fields["output_tokens"] == 8 and fields["output_tokens_from_usage"]
    assert fields["prompt_tokens"] == prompt_tokens
    assert len(fields["chunk_times_s"]) == 8  # the chat role chunk is not a token
    assert fields["finish_reason"] == "length"


def test_times_are_the_arrival_of_the_read_that_completed_the_chunk(fixture_bytes):
    fields = replay("completions", fixture_bytes("sse_completions_ok.txt"), read_size=64)
    times = fields["chunk_times_s"]
    assert times == sorted(times) and len(set(times)) == 8
    assert fields["ttft_s"] == times[0] == fields["ttfat_s"]
    assert fields["e2el_s"] == times[-1]  # the usage chunk and [DONE] come later and do not count


def test_reasoning_is_read_from_both_field_names_and_ttfat_waits_for_the_answer(fixture_bytes):
    fields = replay("chat", fixture_bytes("sse_chat_reasoning.synthetic.txt"), read_size=100)
    assert fields["ok"]
    assert fields["reasoning_chunks"] == 3 and fields["reasoning_chars"] == len("Let me think.")
    assert fields["ttft_s"] < fields["ttfat_s"]
    assert fields["reasoning_tokens"] == 4 and fields["output_tokens"] == 6
    assert fields["finish_reason"] == "stop"


def test_a_midstream_error_event_fails_the_request_with_the_servers_message(fixture_bytes):
    fields = replay("chat", fixture_bytes("sse_chat_error_midstream.synthetic.txt"))
    assert not fields["ok"]
    assert fields["error"] is ErrorCategory.SSE_ERROR
    assert fields["error_detail"] == "EngineCore encountered an issue."


def test_a_stream_cut_before_done_is_truncated_but_keeps_its_timings(fixture_bytes):
    data = fixture_bytes("sse_chat_ok.txt")
    cut = data[: data.index(b'"finish_reason":"length"')]
    fields = replay("chat", cut, clean_end=True)
    assert fields["error"] is ErrorCategory.TRUNCATED and not fields["ok"]
    assert fields["ttft_s"] is not None and len(fields["chunk_times_s"]) == 7


def test_a_stream_without_usage_counts_chunks_and_says_so(fixture_bytes):
    data = fixture_bytes("sse_completions_ok.txt")
    lines = [b for b in data.split(b"\n\n") if b and b'"usage"' not in b]
    fields = replay("completions", b"\n\n".join(lines) + b"\n\n")
    assert fields["ok"] and fields["output_tokens"] == 8
    assert fields["output_tokens_from_usage"] is False


def test_a_done_only_stream_is_empty():
    fields = replay("chat", b"data: [DONE]\n\n")
    assert fields["error"] is ErrorCategory.EMPTY


def test_non_json_data_is_a_protocol_error():
    fields = replay("completions", b"data: <html>\n\ndata: [DONE]\n\n")
    assert fields["error"] is ErrorCategory.PROTOCOL
