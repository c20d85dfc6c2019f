"""A watch's verdict: seed 000's soak claims, each measured and held against a threshold (pure).

Seed 000's 3.4-hour GPQA run "doubled as a smoke test": GPU temperature never above 65 °C,
zero thermal-throttling events, unified memory flat at 115–117 GB per node, no OOM, no pod
restarts. The checks, each PASS, FAIL or SKIP (no data, or no threshold set):

- ``peak temperature``: the hottest reading of any GPU, °C, against ``max_temperature_c``;
- ``throttle events``: times a GPU went from not throttled to throttled (thermal or hardware
  slowdown bits, ``tandem.watch.gpu.THROTTLE_BITS``); a GPU throttled at the first sample
  counts once; against ``max_throttle_events``;
- ``memory used <node>``: the highest MemTotal - MemAvailable, GiB, against
  ``max_memory_used_gib``; ``memory drift <node>``: last minus first, GiB, its size against
  ``max_memory_drift_gib``;
- ``OOM events``: the most OOM kills on one node during the watch (increases of
  /proc/vmstat ``oom_kill``), against ``max_oom_events``;
- ``restarts``: group restarts announced in events.log during the watch, against
  ``max_restarts``;
- ``error rate``: (Δ error + Δ abort) / Δ all finished requests, from vLLM's
  ``request_success_total`` per ``finished_reason``, against ``max_error_rate``.

Two checks make the verdict fail closed: ``samples judged`` fails when no sample could be read
(nothing to judge is no success), and ``down samples``, the samples whose health verdict was
``down``, is held against ``max_down_samples`` (default 0: downtime is no success either).
Lines of ``samples.jsonl`` that were no sample are counted in the summary and shown.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from enum import StrEnum
from functools import partial

from pydantic import Field

from tandem.spec.recipe import Watch
from tandem.vllm_metrics import ERROR_REASONS
from tandem.watch.sample import Sample, Verdict, WatchRecord, WatchRun
from tandem.watch.series import (
    GIB,
    counter_increase,
    covered_s,
    finished_value,
    leader_value,
    node_of,
)

SCHEMA_VERSION = 1
SUMMARY_FILE = "summary.json"


class Result(StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"
    SKIP = "SKIP"


class Check(WatchRecord):
    """One claim: what was observed, the largest value that passes, and the result."""

    name: str
    observed: float | None
    threshold: float | None
    unit: str
    result: Result
    detail: str = ""


class NodeMemory(WatchRecord):
    node: str
    total_gib: float | None = None
    min_used_gib: float | None = None
    max_used_gib: float | None = None
    drift_gib: float | None = Field(default=None, description="Last minus first sample.")
    min_available_gib: float | None = None
    oom_kills: int = 0


class WatchSummary(WatchRecord):
    """``summary.json`` of a watch folder: figures, checks and the overall result."""

    schema_version: int = SCHEMA_VERSION
    name: str
    started: datetime | None
    ended: datetime | None
    covered_s: float = Field(description="Seconds sampled, gaps between resumes excluded.")
    samples: int
    segments: int
    interval_s: float
    nodes: list[NodeMemory]
    gpus: int = Field(description="GPUs seen on all nodes.")
    peak_temperature_c: float | None
    throttle_events: int
    restarts: int
    restart_times: list[datetime]
    requests_finished: int
    request_errors: int
    error_rate: float | None
    generation_tokens: int
    peak_kv_cache_usage: float | None = Field(description="Fraction 0..1.")
    max_requests_waiting: float | None
    preemptions: int
    verdicts: dict[str, int] = Field(description="Samples per verdict.")
    damaged_lines: list[int] = Field(
        default_factory=list,
        description="Numbers of the lines of samples.jsonl that were no sample (not judged).",
    )
    torn_last_line: bool = Field(
        default=False, description="The last line was cut short (a watch killed mid-write)."
    )
    mean_sample_cost_s: float | None
    thresholds: Watch
    checks: list[Check]
    passed: bool


def _check(
    name: str,
    observed: float | None,
    threshold: float | None,
    unit: str,
    detail: str = "",
    *,
    magnitude: bool = False,
) -> Check:
    """``observed`` against ``threshold``: skipped, never passed, where either is missing."""
    check = partial(Check, name=name, observed=observed, threshold=threshold, unit=unit)
    if observed is None:
        return check(result=Result.SKIP, detail=detail or "no data")
    if threshold is None:
        return check(result=Result.SKIP, detail=detail or "no threshold set")
    value = abs(observed) if magnitude else observed
    return check(result=Result.PASS if value <= threshold else Result.FAIL, detail=detail)


def _node_memory(node: str, samples: list[Sample]) -> NodeMemory:
    readings = [r for s in samples if (r := node_of(s, node)) is not None]
    used = [u / GIB for r in readings if (u := r.mem_used_bytes) is not None]
    available = [r.mem_available_bytes / GIB for r in readings if r.mem_available_bytes is not None]
    totals = [r.mem_total_bytes for r in readings if r.mem_total_bytes]
    kills = counter_increase(
        samples, lambda s: reading.oom_kills if (reading := node_of(s, node)) else None
    )
    return NodeMemory(
        node=node,
        total_gib=totals[-1] / GIB if totals else None,
        min_used_gib=min(used, default=None),
        max_used_gib=max(used, default=None),
        drift_gib=used[-1] - used[0] if used else None,
        min_available_gib=min(available, default=None),
        oom_kills=round(kills),
    )


def throttle_events(samples: list[Sample]) -> int:
    """Entries into a throttled state, per GPU, summed."""
    events = 0
    was: dict[tuple[str, int], bool] = {}
    for s in samples:
        for n in s.nodes:
            for g in n.gpus:
                key = (n.node, g.index)
                if g.throttled and not was.get(key, False):
                    events += 1
                was[key] = g.throttled
    return events


def summarize(
    run: WatchRun,
    samples: list[Sample],
    thresholds: Watch | None = None,
    *,
    damaged_lines: list[int] | None = None,
    torn_last_line: bool = False,
) -> WatchSummary:
    """The figures and checks of a watch folder's samples; ``damaged_lines`` and
    ``torn_last_line`` say what of the file was not a sample (``tandem.jsonfiles``)."""
    limits = thresholds or run.thresholds
    damaged = damaged_lines or []
    nodes = [_node_memory(node, samples) for node in run.nodes]
    temperatures = [g.temperature_c for s in samples for n in s.nodes for g in n.gpus]
    peak_temperature = max((t for t in temperatures if t is not None), default=None)
    gpus = {(n.node, g.index) for s in samples for n in s.nodes for g in n.gpus}
    throttles = throttle_events(samples)
    restart_times = [e.time for s in samples for e in s.events if e.restart]
    finished = round(counter_increase(samples, finished_value()))
    errors = round(counter_increase(samples, finished_value(ERROR_REASONS)))
    error_rate = errors / finished if finished else None
    kv = [v for s in samples if (v := leader_value("kv_cache_usage")(s)) is not None]
    waiting = [v for s in samples if (v := leader_value("requests_waiting")(s)) is not None]
    verdicts = dict(Counter(s.verdict.value for s in samples))
    no_gpu = "no GPU reported" if not gpus else ""
    down = verdicts.get(Verdict.DOWN.value, 0)
    checks = [
        _samples_judged(len(samples), damaged),
        _check(
            "down samples",
            down if samples else None,
            limits.max_down_samples,
            "samples",
            f"{down} of {len(samples)} samples `down`" if samples else "",
        ),
        _check("peak temperature", peak_temperature, limits.max_temperature_c, "°C", no_gpu),
        _check(
            "throttle events",
            throttles if gpus else None,
            limits.max_throttle_events,
            "events",
            no_gpu,
        ),
        *(
            _check(
                f"memory used {memory.node}",
                memory.max_used_gib,
                limits.max_memory_used_gib,
                "GiB",
                _span(memory.min_used_gib, memory.max_used_gib),
            )
            for memory in nodes
        ),
        *(
            _check(
                f"memory drift {memory.node}",
                memory.drift_gib,
                limits.max_memory_drift_gib,
                "GiB",
                magnitude=True,
            )
            for memory in nodes
        ),
        _check(
            "OOM events",
            max((m.oom_kills for m in nodes), default=None) if samples else None,
            limits.max_oom_events,
            "kills",
            "most on one node",
        ),
        _check(
            "restarts",
            len(restart_times) if samples else None,
            limits.max_restarts,
            "restarts",
            "events.log",
        ),
        _check(
            "error rate",
            error_rate,
            limits.max_error_rate,
            "fraction",
            f"{errors} of {finished} finished requests" if finished else "no request finished",
        ),
    ]
    costs = [s.cost_s for s in samples]
    return WatchSummary(
        name=run.name,
        started=samples[0].time if samples else None,
        ended=samples[-1].time if samples else None,
        covered_s=round(covered_s(samples), 1),
        samples=len(samples),
        segments=len({s.segment for s in samples}),
        interval_s=run.interval_s,
        nodes=nodes,
        gpus=len(gpus),
        peak_temperature_c=peak_temperature,
        throttle_events=throttles,
        restarts=len(restart_times),
        restart_times=restart_times,
        requests_finished=finished,
        request_errors=errors,
        error_rate=error_rate,
        generation_tokens=round(counter_increase(samples, leader_value("generation_tokens"))),
        peak_kv_cache_usage=max(kv, default=None),
        max_requests_waiting=max(waiting, default=None),
        preemptions=round(counter_increase(samples, leader_value("preemptions"))),
        verdicts=verdicts,
        damaged_lines=damaged,
        torn_last_line=torn_last_line,
        mean_sample_cost_s=sum(costs) / len(costs) if costs else None,
        thresholds=limits,
        checks=checks,
        passed=all(c.result is not Result.FAIL for c in checks),
    )


def _samples_judged(count: int, damaged: list[int]) -> Check:
    """PASS with at least one sample, FAIL with none: a report with nothing to judge fails."""
    detail = f"{len(damaged)} damaged line(s) not judged" if damaged else ""
    if not count:
        detail = "nothing to judge: no readable sample" + (f"; {detail}" if detail else "")
    return Check(
        name="samples judged",
        observed=count,
        threshold=None,
        unit="samples",
        result=Result.PASS if count else Result.FAIL,
        detail=detail,
    )


def _span(low: float | None, high: float | None) -> str:
    return f"{low:.2f}–{high:.2f} GiB" if low is not None and high is not None else ""
