"""Arrival schedules, load-point planning and prompt files: pure and seeded."""

from __future__ import annotations

import math

import pytest

from tandem.bench.config import BenchConfig
from tandem.bench.timed_request import ENDPOINTS, Exchange, Prompt, Sampling
from tandem.bench.workload import (
    Conversation,
    arrival_offsets_s,
    plan_load_points,
    sample_token_ids,
    schedule,
)
from tandem.errors import SpecError


@pytest.mark.parametrize(
    ("rate", "burst", "expected"),
    [
        (None, 1.0, [0.0, 0.0, 0.0]),
        (math.inf, 1.0, [0.0, 0.0, 0.0]),
        (2.0, math.inf, [0.5, 1.0, 1.5]),
    ],
    ids=["no rate: all at once", "infinite rate: all at once", "constant rate: even spacing"],
)
def test_deterministic_schedules(rate, burst, expected):
    assert arrival_offsets_s(3, rate, burst) == pytest.approx(expected)


@pytest.mark.parametrize("burstiness", [1.0, 0.5, 4.0], ids=["poisson", "bursty", "smooth"])
def test_gamma_schedule_is_seeded_sorted_and_ends_at_n_over_rate(burstiness):
    a = arrival_offsets_s(50, 5.0, burstiness, seed=3)
    assert a == arrival_offsets_s(50, 5.0, burstiness, seed=3)
    assert a != arrival_offsets_s(50, 5.0, burstiness, seed=4)
    assert a == sorted(a) and a[-1] == pytest.approx(50 / 5.0)


def test_token_ids_differ_per_request_and_repeat_per_seed():
    pool = list(range(100, 200))
    assert sample_token_ids(pool, 16, 0, 1) == sample_token_ids(pool, 16, 0, 1)
    assert sample_token_ids(pool, 16, 0, 1) != sample_token_ids(pool, 16, 0, 2)
    assert len(sample_token_ids(pool, 16, 0, 1)) == 16


def test_load_points_of_a_ladder_a_rate_and_the_long_context_case():
    config = BenchConfig(
        url="http://h:8000/v1/",
        concurrency=[1, 4],
        rates_rps=[2.0],
        long_context=True,
        output_tokens=32,
    )
    points = plan_load_points(config, max_model_len=1024)
    assert config.url == "http://h:8000"
    assert [p.label for p in points] == ["c1", "c4", "r2", "long"]
    assert [p.requests for p in points] == [8, 16, 16, 2]
    assert points[-1].input_tokens == 1024 - 32 - 64  # room left for the chat template


def test_a_depth_sweep_measures_every_concurrency_at_every_depth_in_turn():
    config = BenchConfig(url="http://h", concurrency=[1, 2], depths=[0, 512], rates_rps=[1.0])
    points = plan_load_points(config, max_model_len=1024)
    assert [p.label for p in points] == ["c1-d0", "c2-d0", "c1-d512", "c2-d512", "r1"]
    assert [p.depth_tokens for p in points] == [0, 0, 512, 512, 0]


@pytest.mark.parametrize(
    ("kwargs", "max_len", "field"),
    [
        ({"input_tokens": 1000, "output_tokens": 100}, 1024, "input_tokens"),
        ({"long_context": True}, None, "long_context"),
    ],
    ids=["lengths beyond max_model_len", "long context without a known max_model_len"],
)
def test_impossible_workloads_name_the_field(kwargs, max_len, field):
    with pytest.raises(SpecError) as info:
        plan_load_points(BenchConfig(url="http://h", **kwargs), max_len)
    assert info.value.field == field


def test_a_constant_rate_run_reads_back_from_its_summary():
    """burstiness=inf (constant rate) survives JSON, which has no infinity."""
    import math

    from tandem.bench.config import BenchConfig
    from tandem.bench.load_generator import BenchResult, ServerInfo

    config = BenchConfig(url="http://x", concurrency=[], rates_rps=[2.0], burstiness=math.inf)
    result = BenchResult(config=config, server=ServerInfo(url="http://x", model="m"))
    assert BenchResult.model_validate_json(result.model_dump_json()).config.burstiness == math.inf


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        ({"turns": 6, "input_tokens": 100, "output_tokens": 100}, "6 turns × (input_tokens"),
        ({"prefix_tokens": 900, "input_tokens": 100, "output_tokens": 100}, "prefix_tokens +"),
        ({"depths": [0, 900], "input_tokens": 100, "output_tokens": 100}, "the deepest depth +"),
    ],
    ids=["the last turn is too long", "the prefix is too long", "the deepest depth is too deep"],
)
def test_a_conversation_that_outgrows_the_context_is_refused(kwargs, said):
    with pytest.raises(SpecError) as info:
        plan_load_points(BenchConfig(url="http://h", endpoint="chat", **kwargs), 1024)
    assert said in info.value.message and info.value.field == "input_tokens"
    fits = BenchConfig(url="http://h", turns=2, input_tokens=100, output_tokens=100)
    assert plan_load_points(fits, 1024)[0].label == "c1"


def test_rounds_repeat_the_whole_ladder_in_order():
    points = plan_load_points(BenchConfig(url="http://h", concurrency=[1, 4]), 1024)
    assert [(p.label, p.round) for p in schedule(points, 3)] == [
        ("c1", 1),
        ("c4", 1),
        ("c1", 2),
        ("c4", 2),
        ("c1", 3),
        ("c4", 3),
    ]


def test_a_later_turn_carries_the_system_prompt_and_the_earlier_exchanges():
    conversation = Conversation((Prompt("first"), Prompt("second")), system="shared", group=2)
    prompt = conversation.prompt(1, (Exchange("first", "an answer"),))
    body = ENDPOINTS["chat"].payload("m", prompt, Sampling(max_tokens=4))
    assert body["messages"] == [
        {"role": "system", "content": "shared"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "an answer"},
        {"role": "user", "content": "second"},
    ]
    # completions: the shared prefix, a blank line, the prompt; token ids as they are
    body = ENDPOINTS["completions"].payload("m", conversation.prompt(0), Sampling(max_tokens=4))
    assert body["prompt"] == "shared\n\nfirst"
    ids = Prompt("", (5, 6, 7))
    assert ENDPOINTS["completions"].payload("m", ids, Sampling(max_tokens=4))["prompt"] == [5, 6, 7]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"turns": 2, "endpoint": "completions"}, "turns"),
        ({"prefix_groups": 4}, "prefix_groups"),
        ({"prefix_tokens": 64, "prompt_file": "p.jsonl"}, "prefix_tokens"),
        ({"prompt_column": "text", "prompt_file": "p.jsonl"}, "prompt_column"),
        ({"prompt_column": "text"}, "prompt_column"),
        ({"depths": [0, 256], "prefix_tokens": 64}, "depths"),
        ({"depths": [256], "prompt_file": "p.jsonl"}, "depths"),
        ({"depths": [256], "concurrency": [], "rates_rps": [1.0]}, "depths"),
    ],
    ids=[
        "turns on completions",
        "groups without a prefix",
        "a prefix in front of a prompt file",
        "a column of a JSONL file",
        "a column without a file",
        "a depth and a shared prefix",
        "a depth in front of a prompt file",
        "depths without a concurrency ladder",
    ],
)
def test_settings_a_run_would_ignore_are_conflicts(kwargs, field):
    problems = BenchConfig(url="http://h", **kwargs).conflicts()
    assert [p.field for p in problems] == [field]
    assert BenchConfig(url="http://h", prompt_column="q", prompt_file="x.CSV").conflicts() == []
