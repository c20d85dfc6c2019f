"""Metric definitions, in one place, and the pure aggregation of request records.

Every figure tandem bench reports is defined here and computed from ``RequestRecord`` s only;
nothing in this module does I/O or prints. The names follow vLLM's ``vllm bench serve`` where it
has one (see the crosswalk below), and every time is in seconds (``_s``).

Per request (``RequestRecord``; ``start`` is when the request was handed to the HTTP client,
stamped with ``time.perf_counter`` when the bytes arrive, before any JSON is parsed):

- **TTFT** ``ttft_s``: first token chunk of any kind (reasoning or answer) − start.
- **TTFAT** ``ttfat_s``: first *answer* (non-reasoning) chunk − start. vLLM has no such figure;
  GuideLLM calls it TTFOT, AIPerf TTFO.
- **E2EL** ``e2el_s``: last token chunk − start. The usage chunk and ``[DONE]`` are not counted.
- **TPOT** ``tpot_s`` = (E2EL − TTFT) / (output_tokens − 1), only when output_tokens > 1; output
  tokens come from the server's ``usage.completion_tokens``. Same as vLLM's TPOT, GuideLLM's and
  AIPerf's ITL.
- **Prefill speed** ``prefill_tok_s`` = prompt_tokens / TTFT: the prompt processed per second
  of waiting for the first token (llama-benchy's per-request ``pp`` t/s, which divides by its
  time to first response less one measured round trip: the same on a local server).
- **Decode speed** ``decode_tok_s`` = 1 / TPOT (llama-benchy's per-request ``tg`` t/s).
- **ITL** ``itl_s``: each gap between consecutive token chunks, pooled over all requests (vLLM's
  ITL, AIPerf's ICL). With speculative decoding a chunk carries several tokens, so ITL > TPOT.
- **Tokens per chunk** = output_tokens / chunks: 1.0 without speculative decoding; above 1 it is
  the mean number of tokens a decode step accepted, as the client sees it.
- **Queue** ``queue_s``: time the request waited on the client (for a concurrency slot or a late
  event loop) before it was sent. It is *not* part of TTFT or E2EL; it is reported separately.

Per load point (``LoadPointMetrics``):

- **duration_s**: first send (scheduled) to last request end, warm-up excluded.
- **request_throughput_rps** = completed / duration_s.
- **output_throughput_tok_s** = Σ output_tokens of completed requests / duration_s.
- **total_token_throughput_tok_s** = Σ (prompt + output tokens) / duration_s.
- **goodput_rps** = requests meeting *every* given SLO (TTFT, TPOT, E2EL maxima) / duration_s
  (DistServe's definition, as in vLLM). None when no SLO is given.
- **turns** (multi-turn runs): per turn number, its requests' TTFT and prompt tokens. A later
  turn's prompt holds every earlier turn and answer, so its TTFT shows what a longer context
  costs (or, with the prefix cache on, what re-reading the conversation does not).
- Distributions are ``LatencyStats``: count, mean, population std, min, max,
  p50/p90/p95/p99 (percentiles by linear interpolation, as ``numpy.percentile``). With no data
  every field is None, never 0.

Crosswalk: tandem TPOT = vLLM TPOT = GuideLLM ITL = AIPerf ITL; tandem ITL = vLLM ITL = AIPerf
ICL; GuideLLM "TPOT" includes the first token and has no tandem name.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import pairwise

from pydantic import BaseModel, ConfigDict, Field

from tandem.bench.records import RequestRecord


class LatencyStats(BaseModel):
    """Summary of one distribution; every field is None when there is no data.

    Usage:
        stats = LatencyStats.of([0.1, 0.2, 0.3])
        stats.p50      # 0.2
        LatencyStats.of([]).mean   # None, not 0
    """

    model_config = ConfigDict(extra="forbid")

    count: int = 0
    mean: float | None = None
    std: float | None = Field(default=None, description="Population standard deviation.")
    min: float | None = None
    max: float | None = None
    p50: float | None = Field(default=None, description="Median.")
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None

    @classmethod
    def of(cls, values: Iterable[float | None]) -> LatencyStats:
        """The summary of ``values``; a None (a figure a request lacks) is left out, and
        counts (ints) come out as floats, the fields' type."""
        data = sorted(v for v in values if v is not None and math.isfinite(v))
        if not data:
            return cls()
        n = len(data)
        mean = math.fsum(data) / n
        var = math.fsum((v - mean) ** 2 for v in data) / n
        return cls(
            count=n,
            mean=mean,
            std=math.sqrt(var),
            min=data[0],
            max=data[-1],
            **{f"p{q}": percentile(data, q) for q in (50, 90, 95, 99)},
        )


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of already sorted values, linear interpolation.

    Matches ``numpy.percentile(values, q)`` (method ``linear``). Raises ValueError when empty.
    """
    if not sorted_values:
        raise ValueError("percentile of no values")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac


# --- per-request figures ----------------------------------------------------------------------


def tpot_s(record: RequestRecord) -> float | None:
    """(E2EL − TTFT) / (output_tokens − 1); None for a failed request or one with ≤ 1 token."""
    if not record.ok or record.ttft_s is None or record.e2el_s is None:
        return None
    n = record.output_tokens
    if n is None or n <= 1:
        return None
    return (record.e2el_s - record.ttft_s) / (n - 1)


def prefill_tok_s(record: RequestRecord) -> float | None:
    """prompt_tokens / TTFT; None for a failed request or one without either."""
    if not record.ok or not record.prompt_tokens or not record.ttft_s:
        return None
    return record.prompt_tokens / record.ttft_s


def decode_tok_s(record: RequestRecord) -> float | None:
    """1 / TPOT; None where TPOT is."""
    tpot = tpot_s(record)
    return 1.0 / tpot if tpot else None


def itl_gaps_s(record: RequestRecord) -> list[float]:
    """Gaps between consecutive token chunks of one request."""
    times = record.chunk_times_s
    return [b - a for a, b in pairwise(times)]


def tokens_per_chunk(record: RequestRecord) -> float | None:
    """output_tokens / token chunks; None without usage or chunks."""
    if not record.ok or not record.output_tokens_from_usage or not record.chunks:
        return None
    if record.output_tokens is None:
        return None
    return record.output_tokens / record.chunks


class Slo(BaseModel):
    """Service-level objectives: a request is *good* when it meets every one that is set.

    Usage:
        Slo(ttft_s=0.5, tpot_s=0.05)
    """

    model_config = ConfigDict(extra="forbid")

    ttft_s: float | None = Field(default=None, gt=0, description="Maximum TTFT, seconds.")
    tpot_s: float | None = Field(default=None, gt=0, description="Maximum TPOT, seconds.")
    e2el_s: float | None = Field(default=None, gt=0, description="Maximum E2EL, seconds.")

    @property
    def empty(self) -> bool:
        return self.ttft_s is None and self.tpot_s is None and self.e2el_s is None

    def met_by(self, record: RequestRecord) -> bool:
        """True when the request succeeded and meets every SLO that is set."""
        if not record.ok:
            return False
        if self.ttft_s is not None and (record.ttft_s is None or record.ttft_s > self.ttft_s):
            return False
        if self.e2el_s is not None and (record.e2el_s is None or record.e2el_s > self.e2el_s):
            return False
        tpot = tpot_s(record)  # a one-token answer has no TPOT and cannot break a TPOT SLO
        return self.tpot_s is None or tpot is None or tpot <= self.tpot_s


class TurnMetrics(BaseModel):
    """The requests of one turn number of a multi-turn point."""

    model_config = ConfigDict(extra="forbid")

    turn: int = Field(description="From 1.")
    requests: int
    completed: int
    prompt_tokens: LatencyStats = Field(default_factory=LatencyStats)
    ttft_s: LatencyStats = Field(default_factory=LatencyStats)


class LoadPointMetrics(BaseModel):
    """Every client-side figure of one load point, computed from its records."""

    model_config = ConfigDict(extra="forbid")

    requests: int = Field(description="Requests sent, warm-up excluded.")
    completed: int
    failed: int
    errors: dict[str, int] = Field(
        default_factory=dict, description="Failed requests by ErrorCategory value."
    )
    duration_s: float | None = None
    request_throughput_rps: float | None = None
    output_throughput_tok_s: float | None = None
    total_token_throughput_tok_s: float | None = None
    goodput_rps: float | None = Field(default=None, description="None when no SLO was given.")
    prompt_tokens_total: int = 0
    output_tokens_total: int = 0
    reasoning_tokens_total: int | None = None
    max_concurrent_requests: int = Field(
        default=0, description="Most requests in flight at once (sweep over [start, end])."
    )
    ttft_s: LatencyStats = Field(default_factory=LatencyStats)
    ttfat_s: LatencyStats = Field(default_factory=LatencyStats)
    tpot_s: LatencyStats = Field(default_factory=LatencyStats)
    itl_s: LatencyStats = Field(default_factory=LatencyStats)
    e2el_s: LatencyStats = Field(default_factory=LatencyStats)
    queue_s: LatencyStats = Field(default_factory=LatencyStats)
    tokens_per_chunk: LatencyStats = Field(default_factory=LatencyStats)
    prefill_tok_s: LatencyStats = Field(
        default_factory=LatencyStats, description="Per request: prompt_tokens / TTFT."
    )
    decode_tok_s: LatencyStats = Field(
        default_factory=LatencyStats, description="Per request: 1 / TPOT."
    )
    prompt_tokens: LatencyStats = Field(
        default_factory=LatencyStats, description="Prompt tokens per completed request."
    )
    output_tokens: LatencyStats = Field(
        default_factory=LatencyStats, description="Output tokens per completed request."
    )
    turns: list[TurnMetrics] = Field(
        default_factory=list, description="Per turn of the conversations; empty for one turn."
    )


def load_point_metrics(
    records: Sequence[RequestRecord], slo: Slo | None = None
) -> LoadPointMetrics:
    """Aggregate one load point's records. Pure: same records, same figures.

    Usage:
        m = load_point_metrics(records, Slo(ttft_s=1.0))
        m.tpot_s.p50, m.output_throughput_tok_s
    """
    done = [r for r in records if r.ok]
    errors = Counter(str(r.error) for r in records if not r.ok and r.error is not None)
    duration: float | None = None
    if records:
        first = min(min(r.scheduled_s, r.start_s) for r in records)
        duration = max(r.start_s + (r.e2el_s or 0.0) for r in records) - first
        if duration <= 0:
            duration = None
    prompt_total = sum(r.prompt_tokens or 0 for r in done)
    output_total = sum(r.output_tokens or 0 for r in done)
    reasoning = [r.reasoning_tokens for r in done if r.reasoning_tokens is not None]

    def per_s(x: float) -> float | None:
        return x / duration if duration else None

    good = None
    if slo is not None and not slo.empty:
        good = per_s(sum(1 for r in records if slo.met_by(r)))
    return LoadPointMetrics(
        requests=len(records),
        completed=len(done),
        failed=len(records) - len(done),
        errors=dict(sorted(errors.items())),
        duration_s=duration,
        request_throughput_rps=per_s(len(done)),
        output_throughput_tok_s=per_s(output_total),
        total_token_throughput_tok_s=per_s(prompt_total + output_total),
        goodput_rps=good,
        prompt_tokens_total=prompt_total,
        output_tokens_total=output_total,
        reasoning_tokens_total=sum(reasoning) if reasoning else None,
        max_concurrent_requests=max_concurrency(records),
        ttft_s=LatencyStats.of(r.ttft_s for r in done),
        ttfat_s=LatencyStats.of(r.ttfat_s for r in done),
        tpot_s=LatencyStats.of(tpot_s(r) for r in done),
        itl_s=LatencyStats.of(g for r in done for g in itl_gaps_s(r)),
        e2el_s=LatencyStats.of(r.e2el_s for r in done),
        queue_s=LatencyStats.of(r.queue_s for r in records),
        tokens_per_chunk=LatencyStats.of(tokens_per_chunk(r) for r in done),
        prefill_tok_s=LatencyStats.of(prefill_tok_s(r) for r in done),
        decode_tok_s=LatencyStats.of(decode_tok_s(r) for r in done),
        prompt_tokens=LatencyStats.of(r.prompt_tokens for r in done),
        output_tokens=LatencyStats.of(r.output_tokens for r in done),
        turns=turn_metrics(records),
    )


def turn_metrics(records: Sequence[RequestRecord]) -> list[TurnMetrics]:
    """TTFT and prompt tokens per turn number; empty when no record has a turn."""
    numbers = sorted({r.turn for r in records if r.turn is not None})
    result = []
    for number in numbers:
        mine = [r for r in records if r.turn == number]
        done = [r for r in mine if r.ok]
        result.append(
            TurnMetrics(
                turn=number,
                requests=len(mine),
                completed=len(done),
                prompt_tokens=LatencyStats.of(r.prompt_tokens for r in done),
                ttft_s=LatencyStats.of(r.ttft_s for r in done),
            )
        )
    return result


def max_concurrency(records: Iterable[RequestRecord]) -> int:
    """Most requests in flight at once: a sweep over each request's [start, start + E2EL]."""
    events: list[tuple[float, int]] = []
    for r in records:
        if r.e2el_s is None:
            continue
        events.append((r.start_s, 1))
        events.append((r.start_s + r.e2el_s, -1))
    events.sort(key=lambda e: (e[0], e[1]))  # an end before a start at the same instant
    peak = current = 0
    for _, step in events:
        current += step
        peak = max(peak, current)
    return peak
