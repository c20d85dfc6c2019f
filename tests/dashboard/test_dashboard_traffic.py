"""Rates and p95s between two readings of a leader's /metrics, as Prometheus computes them."""

from __future__ import annotations

import pytest
from status_factory import reading

from tandem.dashboard.traffic import _quantile, between, combine
from tandem.vllm_metrics import TTFT_SECONDS, Histogram, ServingReading


def test_the_recorded_page_reads_whole():
    """metrics_after.txt: two requests of 8 tokens, finished by `length`; no prefix caching."""
    after = reading()
    assert after.generation_tokens == 16 and after.prompt_tokens == 28
    assert after.finished["length"] == 2 and after.requests_finished == 2
    assert after.prefix_caching is False and after.spec_drafts is None
    ttft = after.histograms[TTFT_SECONDS]
    assert ttft.count == 2 and ttft.buckets[0] == (0.001, 0.0) and ttft.buckets[-1][1] == 2


def test_two_readings_give_rates_and_percentiles():
    before, after = reading("before"), reading("after")
    traffic = between(before, after, 2.0)
    assert traffic.finished == 2 and traffic.requests_per_s == 1.0
    assert traffic.output_tok_s == 8.0 and traffic.input_tok_s == 14.0
    assert traffic.error_share == 0.0 and traffic.preemptions_per_s == 0.0
    # the two TTFTs fell in (0.01, 0.02] and (0.06, 0.08]: p95 interpolates in the second
    assert traffic.ttft_p95_s == pytest.approx(0.06 + 0.02 * (1.9 - 1) / (2 - 1))
    assert traffic.prefix_hit_rate is None  # caching is off: no rate, not 0 %
    assert traffic.spec_acceptance is None and not traffic.idle


def test_an_idle_window_is_no_traffic_not_zero():
    after = reading()
    traffic = between(after, after, 5.0)
    assert traffic.idle and traffic.finished == 0
    assert traffic.ttft_p95_s is None and traffic.error_share is None
    assert traffic.requests_per_s == 0.0  # a rate of nothing is 0; the page says "no traffic"


def test_a_counter_that_went_down_voids_the_window():
    traffic = between(reading("after"), reading("before"), 5.0)
    assert traffic.reset and traffic.requests_per_s is None and not traffic.idle


@pytest.mark.parametrize(
    ("buckets", "count", "expected"),
    [
        pytest.param([(1.0, 0.0), (2.0, 10.0)], 10.0, 1.95, id="inside the second bucket"),
        pytest.param([(1.0, 10.0), (2.0, 10.0)], 10.0, 0.95, id="inside the first, from 0"),
        pytest.param([(1.0, 0.0), (2.0, 0.0)], 10.0, 2.0, id="in +Inf: the highest finite bound"),
        pytest.param([(1.0, 0.0)], 0.0, None, id="nothing observed"),
    ],
)
def test_quantiles_interpolate_as_histogram_quantile(buckets, count, expected):
    got = _quantile(None, Histogram(buckets=buckets, count=count), 0.95)
    assert got == (pytest.approx(expected) if expected is not None else None)


def test_two_leaders_add_up_as_one_front_door():
    before, after = reading("before"), reading("after")
    both = between(combine([before, before]), combine([after, after]), 2.0)
    one = between(before, after, 2.0)
    assert both.requests_per_s == 2 * one.requests_per_s
    assert both.ttft_p95_s == pytest.approx(one.ttft_p95_s)
    assert combine([]) is None
    assert combine([ServingReading(), after]).generation_tokens == 16
