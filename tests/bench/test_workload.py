"""Arrival schedules, load-point planning and prompt files: pure and seeded."""

from __future__ import annotations

import math

import pytest

from tandem.bench.config import BenchConfig
from tandem.bench.workload import (
    arrival_offsets_s,
    load_prompt_file,
    plan_load_points,
    sample_token_ids,
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


def test_prompt_file_reads_jsonl_and_plain_lines(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "a b"}\n\nplain line\n')
    assert load_prompt_file(path) == ["a b", "plain line"]


def test_prompt_file_error_names_file_and_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"text": "x"}\n')
    with pytest.raises(SpecError) as info:
        load_prompt_file(path)
    assert info.value.file == str(path) and "line 1" in info.value.message


def test_a_constant_rate_run_reads_back_from_its_summary():
    """burstiness=inf (constant rate) survives JSON, which has no infinity."""
    import math

    from tandem.bench.config import BenchConfig
    from tandem.bench.load_generator import BenchResult, ServerInfo

    config = BenchConfig(url="http://x", concurrency=[], rates_rps=[2.0], burstiness=math.inf)
    result = BenchResult(config=config, server=ServerInfo(url="http://x", model="m"))
    assert BenchResult.model_validate_json(result.model_dump_json()).config.burstiness == math.inf
