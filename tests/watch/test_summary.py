"""The checks of a watch (pure): seed 000's claims against thresholds, on built samples."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tandem.spec.recipe import Watch
from tandem.watch.gpu import parse_nvidia_smi
from tandem.watch.sample import (
    Event,
    LeaderReading,
    NodeReading,
    RankInfo,
    RankUsage,
    Sample,
    Verdict,
    WatchRun,
)
from tandem.watch.series import counter_rate, covered_s, series
from tandem.watch.summary import Result, summarize

GIB = 1024**3
T0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
GB10 = (
    "index, uuid, name, temperature.gpu, clocks.current.sm [MHz], clocks.max.sm [MHz], "
    "power.draw [W], utilization.gpu [%], memory.used [MiB], memory.total [MiB], "
    "clocks_event_reasons.active\n0, GPU-1, NVIDIA GB10, {t}, 2418, 3003, 40.0, 90, [N/A], "
    "[N/A], {mask}\n"
)


def make_run(**thresholds) -> WatchRun:
    return WatchRun(
        name="pair",
        backend="ssh",
        endpoint="http://h:8000",
        interval_s=5,
        duration_s=None,
        nodes=["spark-101", "spark-102"],
        ranks=[
            RankInfo(rank=0, node="spark-101", role="leader"),
            RankInfo(rank=1, node="spark-102", role="worker"),
        ],
        thresholds=Watch(**thresholds),
    )


def make_sample(
    seq: int,
    *,
    used_gib: float = 116.0,
    temp: float = 60,
    mask: str = "0x0",
    finished: dict | None = None,
    tokens: float = 0,
    segment: int = 0,
    oom: int = 0,
    events: list[Event] | None = None,
    restarts: int = 0,
) -> Sample:
    nodes = [
        NodeReading(
            node=node,
            mem_total_bytes=int(128 * GIB),
            mem_available_bytes=int((128 - used_gib) * GIB),
            oom_kills=oom,
            ranks=[
                RankUsage(
                    rank=rank, role=role, up=True, processes=3, rss_bytes=GIB, cpu_s=seq * 2.0
                )
            ],
            gpus=parse_nvidia_smi(GB10.format(t=temp, mask=mask)),
        )
        for node, rank, role in (("spark-101", 0, "leader"), ("spark-102", 1, "worker"))
    ]
    leader = LeaderReading(
        requests_running=2,
        requests_waiting=0,
        kv_cache_usage=0.3,
        generation_tokens=tokens,
        finished=finished or {},
        scrape_s=0.01,
    )
    return Sample(
        seq=seq,
        segment=segment,
        time=T0 + timedelta(seconds=5 * seq),
        verdict=Verdict.HEALTHY,
        nodes=nodes,
        leader=leader,
        restarts=restarts,
        events=events or [],
        cost_s=0.02,
    )


def results(summary) -> dict[str, Result]:
    return {c.name: c.result for c in summary.checks}


def test_seed_000s_soak_passes_its_own_claims():
    samples = [
        make_sample(
            i,
            used_gib=115 + (i % 3) * 0.5,
            temp=55 + i,
            tokens=100.0 * i,
            finished={"length": 10.0 * i, "stop": 0.0, "error": 0.0},
        )
        for i in range(10)
    ]
    summary = summarize(
        make_run(max_memory_used_gib=117, max_memory_drift_gib=2, max_temperature_c=65), samples
    )
    assert summary.passed and set(results(summary).values()) == {Result.PASS}
    assert summary.peak_temperature_c == 64 and summary.throttle_events == 0
    assert summary.nodes[0].min_used_gib == pytest.approx(115)
    assert summary.nodes[0].max_used_gib == pytest.approx(116)
    assert summary.requests_finished == 90 and summary.error_rate == 0
    assert summary.generation_tokens == 900


@pytest.mark.parametrize(
    "limit, result", [(100.0, Result.FAIL), (120.0, Result.PASS), (None, Result.SKIP)]
)
def test_a_memory_threshold_below_the_observed_fails_and_above_passes(limit, result):
    summary = summarize(make_run(max_memory_used_gib=limit), [make_sample(0), make_sample(1)])
    assert results(summary)["memory used spark-101"] is result
    assert summary.passed is (result is not Result.FAIL)


def test_throttling_counts_each_entry_and_heat_fails():
    masks = ["0x0", "0x20", "0x20", "0x0", "0x40", "0x4"]  # 0x4 alone (power cap) is no throttle
    samples = [make_sample(i, temp=90, mask=m) for i, m in enumerate(masks)]
    summary = summarize(make_run(), samples)
    assert summary.throttle_events == 2 * 2  # two entries on each of the two nodes
    assert results(summary)["throttle events"] is Result.FAIL
    assert results(summary)["peak temperature"] is Result.FAIL


def test_errors_restarts_and_oom_kills_fail_their_checks():
    restart = Event(time=T0, text="restart 1/3 in 10 s: stopping every rank", restart=True)
    samples = [
        make_sample(0, finished={"stop": 0.0, "error": 0.0}),
        make_sample(
            1,
            finished={"stop": 90.0, "error": 5.0, "abort": 5.0},
            oom=1,
            events=[restart],
            restarts=1,
        ),
    ]
    summary = summarize(make_run(), samples)
    assert summary.error_rate == pytest.approx(0.1)
    assert summary.restarts == 1 and summary.nodes[0].oom_kills == 1
    assert {
        k: v for k, v in results(summary).items() if k in ("error rate", "restarts", "OOM events")
    } == {"error rate": Result.FAIL, "restarts": Result.FAIL, "OOM events": Result.FAIL}


def test_no_gpu_and_no_request_skip_instead_of_passing():
    samples = [make_sample(0), make_sample(1)]
    for s in samples:
        for n in s.nodes:
            n.gpus.clear()
    r = results(summarize(make_run(), samples))
    assert r["peak temperature"] is r["throttle events"] is r["error rate"] is Result.SKIP


def test_rates_skip_a_resume_and_a_counter_reset():
    a, b = make_sample(0, tokens=100), make_sample(1, tokens=300)
    read = lambda s: s.leader.generation_tokens  # noqa: E731
    assert counter_rate(a, b, read) == pytest.approx(40)
    assert counter_rate(a, make_sample(1, tokens=300, segment=1), read) is None
    assert counter_rate(b, make_sample(2, tokens=5), read) is None
    cols = series([a, b])
    assert cols.rank_cpu_pct["rank 0 (spark-101)"] == [None, pytest.approx(40)]
    assert list(cols.gpu_temperature_c) == ["GPU 0 on spark-101", "GPU 0 on spark-102"]  # legend
    assert covered_s([a, b, make_sample(7, segment=1), make_sample(9, segment=1)]) == 15


def test_nothing_to_judge_fails_instead_of_passing():
    summary = summarize(make_run(), [])
    assert not summary.passed
    assert results(summary)["samples judged"] is Result.FAIL
    assert "nothing to judge" in next(c.detail for c in summary.checks if c.name.startswith("samp"))


def test_downtime_fails_unless_allowed():
    samples = [make_sample(i) for i in range(4)]
    for s in samples[1:3]:
        s.verdict = Verdict.DOWN
    summary = summarize(make_run(), samples)
    assert results(summary)["down samples"] is Result.FAIL and not summary.passed
    assert "2 of 4 samples `down`" in next(
        c.detail for c in summary.checks if c.name == "down samples"
    )
    assert summarize(make_run(max_down_samples=2), samples).passed
    every = [make_sample(i) for i in range(3)]
    for s in every:
        s.verdict = Verdict.DOWN
    assert not summarize(make_run(), every).passed


def test_damaged_lines_are_counted_in_the_summary():
    summary = summarize(make_run(), [make_sample(0)], damaged_lines=[2, 5], torn_last_line=True)
    assert summary.damaged_lines == [2, 5] and summary.torn_last_line
    assert "2 damaged line(s)" in next(
        c.detail for c in summary.checks if c.name.startswith("samp")
    )
