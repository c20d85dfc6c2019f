"""Time series from samples (pure): gauges as read, rates from two consecutive samples.

A rate is ``(counter now - counter before) / seconds between``, and None where it cannot be
told: across a resume (two segments), or when the counter went down (a restarted leader starts
its totals at zero). Memory is in GiB (2**30 bytes), CPU in percent of one core.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from tandem.watch.sample import GpuReading, LeaderReading, NodeReading, RankUsage, Sample

GIB = 1024**3


def counter_rate(
    prev: Sample, cur: Sample, value: Callable[[Sample], float | None]
) -> float | None:
    """Per-second rate of a counter between two samples; None across a resume or a reset."""
    if prev.segment != cur.segment:
        return None
    a, b = value(prev), value(cur)
    dt = cur.unix - prev.unix
    if a is None or b is None or dt <= 0 or b < a:
        return None
    return (b - a) / dt


def covered_s(samples: list[Sample]) -> float:
    """Seconds a folder's samples cover: per segment, last minus first, summed. Pure."""
    spans: dict[int, tuple[float, float]] = {}
    for s in samples:
        first, last = spans.get(s.segment, (s.unix, s.unix))
        spans[s.segment] = (min(first, s.unix), max(last, s.unix))
    return sum(last - first for first, last in spans.values())


def counter_increase(samples: list[Sample], value: Callable[[Sample], float | None]) -> float:
    """How much a counter grew over the samples, summing consecutive increases (resets skipped)."""
    total = 0.0
    for prev, cur in itertools.pairwise(samples):
        a, b = value(prev), value(cur)
        if a is not None and b is not None and b >= a:
            total += b - a
    return total


def node_of(sample: Sample, node: str) -> NodeReading | None:
    return next((n for n in sample.nodes if n.node == node), None)


def gib(value: int | None) -> float | None:
    return value / GIB if value is not None else None


def leader_value(name: str) -> Callable[[Sample], float | None]:
    def read(sample: Sample) -> float | None:
        leader: LeaderReading | None = sample.leader
        return getattr(leader, name) if leader is not None else None

    return read


def finished_value(reasons: tuple[str, ...] | None = None) -> Callable[[Sample], float | None]:
    """Requests finished (all reasons, or only ``reasons``) as a running total."""

    def read(sample: Sample) -> float | None:
        if sample.leader is None or not sample.leader.finished:
            return None
        return sum(v for k, v in sample.leader.finished.items() if reasons is None or k in reasons)

    return read


def _rank(sample: Sample, node: str, rank: int) -> RankUsage | None:
    """A rank's usage as one sample read it on its node; None where the node was not read."""
    reading = node_of(sample, node)
    return next((r for r in reading.ranks if r.rank == rank), None) if reading else None


def rank_cpu(node: str, rank: int) -> Callable[[Sample], float | None]:
    def read(sample: Sample) -> float | None:
        usage = _rank(sample, node, rank)
        return usage.cpu_s if usage else None

    return read


@dataclass
class Series:
    """Columns over time, one entry per sample (None where there is no value)."""

    times: list[datetime] = field(default_factory=list)
    mem_used_gib: dict[str, list[float | None]] = field(default_factory=dict)
    rank_rss_gib: dict[str, list[float | None]] = field(default_factory=dict)
    rank_cpu_pct: dict[str, list[float | None]] = field(default_factory=dict)
    gpu_temperature_c: dict[str, list[float | None]] = field(default_factory=dict)
    gpu_sm_clock_mhz: dict[str, list[float | None]] = field(default_factory=dict)
    gpu_power_w: dict[str, list[float | None]] = field(default_factory=dict)
    gpu_throttled: dict[str, list[bool]] = field(default_factory=dict)
    prompt_tok_s: list[float | None] = field(default_factory=list)
    generation_tok_s: list[float | None] = field(default_factory=list)
    kv_cache_pct: list[float | None] = field(default_factory=list)
    requests_running: list[float | None] = field(default_factory=list)
    requests_waiting: list[float | None] = field(default_factory=list)
    restarts: list[datetime] = field(default_factory=list)
    not_healthy: list[bool] = field(default_factory=list)


def _gpu(sample: Sample, node: str, index: int) -> GpuReading | None:
    reading = node_of(sample, node)
    return next((g for g in reading.gpus if g.index == index), None) if reading else None


def series(samples: list[Sample]) -> Series:
    """Every plotted column of a watch, from its samples."""
    out = Series(times=[s.time for s in samples])
    nodes = list(dict.fromkeys(n.node for s in samples for n in s.nodes))
    ranks = list(dict.fromkeys((n.node, r.rank) for s in samples for n in s.nodes for r in n.ranks))
    gpus = list(dict.fromkeys((n.node, g.index) for s in samples for n in s.nodes for g in n.gpus))
    for node in nodes:
        out.mem_used_gib[node] = [
            gib(r.mem_used_bytes) if (r := node_of(s, node)) else None for s in samples
        ]
    for node, rank in ranks:
        key = f"rank {rank} ({node})"
        out.rank_rss_gib[key] = [
            gib(u.rss_bytes) if (u := _rank(s, node, rank)) else None for s in samples
        ]
        cpu = rank_cpu(node, rank)
        pct: list[float | None] = [None]
        pct += [
            (rate * 100 if (rate := counter_rate(a, b, cpu)) is not None else None)
            for a, b in itertools.pairwise(samples)
        ]
        out.rank_cpu_pct[key] = pct
    for node, index in gpus:
        key = f"GPU {index} on {node}"  # reads right when a node is named gpu0 too
        readings = [_gpu(s, node, index) for s in samples]
        out.gpu_temperature_c[key] = [g.temperature_c if g else None for g in readings]
        out.gpu_sm_clock_mhz[key] = [g.sm_clock_mhz if g else None for g in readings]
        out.gpu_power_w[key] = [g.power_w if g else None for g in readings]
        out.gpu_throttled[key] = [bool(g and g.throttled) for g in readings]
    for name, column in (
        ("prompt_tokens", out.prompt_tok_s),
        ("generation_tokens", out.generation_tok_s),
    ):
        column.append(None)
        column += [counter_rate(a, b, leader_value(name)) for a, b in itertools.pairwise(samples)]
    out.kv_cache_pct = [
        (v * 100 if (v := leader_value("kv_cache_usage")(s)) is not None else None) for s in samples
    ]
    out.requests_running = [leader_value("requests_running")(s) for s in samples]
    out.requests_waiting = [leader_value("requests_waiting")(s) for s in samples]
    out.restarts = [e.time for s in samples for e in s.events if e.restart]
    out.not_healthy = [s.verdict != "healthy" for s in samples]
    return out
