"""Metric definitions, table-driven: percentiles, None for no data, TPOT, goodput, concurrency."""

from __future__ import annotations

import pytest

from tandem.bench.config import BenchConfig
from tandem.bench.load_generator import coalescing_warnings, replay_warnings
from tandem.bench.metrics import (
    LatencyStats,
    Slo,
    load_point_metrics,
    max_concurrency,
    percentile,
    tpot_s,
)
from tandem.bench.records import ErrorCategory, RequestRecord
from tandem.bench.server_metrics import ServerDelta


def rec(
    index: int = 0,
    *,
    ttft: float = 0.1,
    gaps: tuple[float, ...] = (0.01, 0.01, 0.01),
    tokens: int | None = 4,
    start: float = 0.0,
    scheduled: float = 0.0,
    ok: bool = True,
    prompt: int = 10,
) -> RequestRecord:
    times, t = [ttft], ttft
    for g in gaps:
        t += g
        times.append(t)
    if not ok:
        return RequestRecord(
            index=index,
            load_point="c1",
            endpoint="chat",
            scheduled_s=scheduled,
            start_s=start,
            ok=False,
            error=ErrorCategory.HTTP_STATUS,
        )
    return RequestRecord(
        index=index,
        load_point="c1",
        endpoint="chat",
        scheduled_s=scheduled,
        start_s=start,
        ok=True,
        ttft_s=ttft,
        ttfat_s=ttft,
        e2el_s=times[-1],
        chunk_times_s=times,
        prompt_tokens=prompt,
        output_tokens=tokens,
    )


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([1.0], 50, 1.0),
        ([1.0, 2.0], 50, 1.5),
        ([1.0, 2.0, 3.0, 4.0], 90, 3.7),
        ([1.0, 2.0, 3.0, 4.0], 99, 3.97),
        ([0.0, 10.0], 0, 0.0),
        ([0.0, 10.0], 100, 10.0),
    ],
    ids=[
        "one value",
        "median of two interpolates",
        "p90 of four like numpy",
        "p99 of four like numpy",
        "p0 is the minimum",
        "p100 is the maximum",
    ],
)
def test_percentile_matches_numpy_linear(values, q, expected):
    assert percentile(values, q) == pytest.approx(expected)


def test_stats_of_no_data_are_none_not_zero():
    stats = LatencyStats.of([])
    assert stats.count == 0
    assert (stats.mean, stats.p50, stats.p99, stats.std) == (None, None, None, None)


def test_stats_use_population_std():
    stats = LatencyStats.of([1.0, 3.0])
    assert (stats.mean, stats.std, stats.min, stats.max) == (2.0, 1.0, 1.0, 3.0)


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        (rec(ttft=0.1, gaps=(0.02, 0.02, 0.02), tokens=4), 0.02),
        (rec(ttft=0.1, gaps=(0.06,), tokens=4), 0.02),  # 2 chunks carried 4 tokens (spec decode)
        (rec(ttft=0.1, gaps=(), tokens=1), None),
        (rec(ok=False), None),
    ],
    ids=[
        "one token per chunk",
        "several tokens per chunk divide by tokens not chunks",
        "one token has no TPOT",
        "failed request has no TPOT",
    ],
)
def test_tpot_is_decode_time_over_tokens_after_the_first(record, expected):
    assert tpot_s(record) == (pytest.approx(expected) if expected is not None else None)


def test_prefill_and_decode_speed_are_llama_benchys_pp_and_tg_per_request():
    """pp = prompt tokens / TTFT; tg = tokens after the first / the time they took."""
    m = load_point_metrics([rec(0, ttft=0.5, prompt=1000), rec(1, ttft=0.25, prompt=1000)])
    assert m.prefill_tok_s.min == pytest.approx(2000) and m.prefill_tok_s.max == pytest.approx(4000)
    assert m.decode_tok_s.p50 == pytest.approx(3 / 0.03)
    assert m.prompt_tokens.p50 == 1000
    assert load_point_metrics([rec(ok=False)]).prefill_tok_s.count == 0


def test_load_point_aggregates_only_successes_and_counts_errors_by_category():
    records = [rec(0, start=0.0), rec(1, start=0.2), rec(2, ok=False, start=0.3)]
    m = load_point_metrics(records)
    assert (m.requests, m.completed, m.failed) == (3, 2, 1)
    assert m.errors == {"http-status": 1}
    assert m.output_tokens_total == 8 and m.prompt_tokens_total == 20
    assert m.duration_s == pytest.approx(0.2 + 0.13)
    assert m.output_throughput_tok_s == pytest.approx(8 / 0.33)
    assert m.itl_s.count == 6 and m.itl_s.p50 == pytest.approx(0.01)
    assert m.goodput_rps is None  # no SLO given


def test_goodput_counts_requests_meeting_every_slo():
    records = [rec(0, ttft=0.1), rec(1, ttft=0.5), rec(2, ttft=0.1, gaps=(0.2, 0.2, 0.2))]
    m = load_point_metrics(records, Slo(ttft_s=0.2, tpot_s=0.05))
    assert m.goodput_rps == pytest.approx(1 / m.duration_s)


def test_client_queue_is_reported_apart_from_latency():
    m = load_point_metrics([rec(0, scheduled=0.0, start=0.5)])
    assert m.queue_s.p50 == pytest.approx(0.5)
    assert m.ttft_s.p50 == pytest.approx(0.1)  # TTFT is measured from the send, not the schedule


@pytest.mark.parametrize(
    ("starts", "expected"),
    [
        ([0.0, 1.0, 2.0], 1),
        ([0.0, 0.0, 0.0], 3),
        ([0.0, 0.05, 0.2], 2),
        ([], 0),
    ],
    ids=["back to back", "all at once", "two overlap", "no requests"],
)
def test_max_concurrency_sweeps_request_intervals(starts, expected):
    # each request lasts 0.13 s (ttft 0.1 + three gaps of 0.01)
    assert max_concurrency([rec(i, start=s) for i, s in enumerate(starts)]) == expected


def _streamed(tokens: int, chunks: int) -> RequestRecord:
    times = [0.1 + 0.01 * i for i in range(chunks)]
    return RequestRecord(
        index=0,
        load_point="c1",
        endpoint="completions",
        scheduled_s=0.0,
        start_s=0.0,
        ok=True,
        ttft_s=times[0],
        e2el_s=times[-1],
        chunk_times_s=times,
        output_tokens=tokens,
        output_tokens_from_usage=True,
    )


@pytest.mark.parametrize(
    ("tokens", "chunks", "acceptance", "warned"),
    [
        (128, 128, None, False),
        (128, 1, None, True),  # the whole answer in one chunk: the API process fell behind
        (128, 40, 3.2, False),  # speculative decoding: ~3.2 tokens per step is expected
        (128, 8, 3.2, True),  # 16 per chunk is far beyond the accepted length
    ],
    ids=["one token per chunk", "one chunk per answer", "spec decode", "spec decode merged"],
)
def test_merged_chunks_are_warned_about(tokens, chunks, acceptance, warned):
    metrics = load_point_metrics([_streamed(tokens, chunks)], Slo())
    delta = ServerDelta(spec_acceptance_length=acceptance) if acceptance else None
    assert bool(coalescing_warnings(metrics, delta)) is warned


@pytest.mark.parametrize(
    ("settings", "hit_rate", "warned"),
    [
        ({}, 0.85, True),  # prompts that share nothing, answered from the cache: seen before
        ({}, 0.05, False),
        ({}, None, False),  # caching off, or nothing looked up
        ({"prefix_tokens": 144, "prefix_groups": 2}, 0.85, False),  # the shared-prefix case
        ({"turns": 3}, 0.85, False),  # later turns carry the earlier ones
        ({"prompt_file": "chats.jsonl"}, 0.85, False),  # rows may share a system prompt
    ],
    ids=["replayed", "stray hits", "no figure", "shared prefix", "multi-turn", "prompt file"],
)
def test_prompts_the_server_had_seen_are_warned_about(settings, hit_rate, warned):
    config = BenchConfig(url="http://x", model="m", seed=7, **settings)
    delta = ServerDelta(prefix_cache_hit_rate=hit_rate)
    warnings = replay_warnings(config, delta)
    assert bool(warnings) is warned
    if warned:
        assert "85% of the prompt tokens" in warnings[0] and "--seed 7" in warnings[0]


def test_ttft_is_reported_per_turn():
    records = [
        rec(i, ttft=0.1 * turn, prompt=100 * turn).model_copy(
            update={"conversation": i // 3, "turn": turn}
        )
        for i, turn in enumerate([1, 2, 3, 1, 2, 3])
    ]
    records.append(rec(6, ok=False).model_copy(update={"conversation": 2, "turn": 1}))
    turns = load_point_metrics(records).turns
    assert [(t.turn, t.requests, t.completed) for t in turns] == [(1, 3, 2), (2, 2, 2), (3, 2, 2)]
    assert [t.ttft_s.p50 for t in turns] == pytest.approx([0.1, 0.2, 0.3])
    assert [t.prompt_tokens.p50 for t in turns] == [100, 200, 300]
    assert load_point_metrics([rec(0)]).turns == []  # one turn: no per-turn table
