"""Traffic and SLO figures between two observations of a leader's ``/metrics``. Pure.

A status carries each leader's counters as running totals and its latency histograms whole
(``tandem.vllm_metrics.ServingReading``); one observation has no rate. Two observations
``seconds`` apart give what vLLM's Grafana Overview shows on its top row: requests and output
tokens per second, TTFT / ITL / TPOT / E2E p95 over the requests that finished in between,
the share of them that ended in error or abort, preemptions per second, the prefix-cache hit
rate and the speculative acceptance rate.

Every figure is None when the window holds nothing to measure: no request finished is "no
traffic", never a 0 ms p95 or a 0 % error share; a counter that went down (the leader
restarted) voids the window (``reset``). Percentiles interpolate inside a bucket as
Prometheus' ``histogram_quantile`` does, so the page and the Grafana panels agree.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from tandem.vllm_metrics import (
    E2E_SECONDS,
    ERROR_REASONS,
    ITL_SECONDS,
    SERVING_COUNTERS,
    SERVING_GAUGES,
    TPOT_SECONDS,
    TTFT_SECONDS,
    Histogram,
    ServingReading,
)

QUANTILE = 0.95
_COUNTERS = tuple(SERVING_COUNTERS.values())


class Traffic(BaseModel):
    """What was served between two observations; None: nothing to measure in the window."""

    seconds: float = Field(description="The window's length.")
    reset: bool = Field(default=False, description="A counter went down: the leader restarted.")
    finished: float | None = Field(default=None, description="Requests finished in the window.")
    requests_per_s: float | None = None
    input_tok_s: float | None = None
    output_tok_s: float | None = None
    ttft_p95_s: float | None = None
    itl_p95_s: float | None = None
    tpot_p95_s: float | None = None
    e2e_p95_s: float | None = None
    error_share: float | None = Field(default=None, description="error + abort over finished.")
    preemptions_per_s: float | None = None
    prefix_hit_rate: float | None = Field(
        default=None, description="Cached prompt tokens over those looked up (caching on)."
    )
    spec_acceptance: float | None = Field(
        default=None, description="Accepted draft tokens over drafted ones."
    )
    prefix_caching: bool | None = Field(
        default=None, description="The server says it caches prefixes; None: unsaid."
    )
    spec_decoding: bool | None = Field(
        default=None, description="The server exports draft counters (it drafts)."
    )

    @property
    def idle(self) -> bool:
        """No request finished and no token was produced: "no traffic"."""
        return not self.reset and not self.finished and not self.output_tok_s


def combine(readings: list[ServingReading]) -> ServingReading | None:
    """Several leaders' readings as one front door's: counters and gauges summed (KV usage:
    the fullest), histograms summed bucket by bucket. None when no leader answered."""
    if not readings:
        return None
    if len(readings) == 1:
        return readings[0]

    def total(field: str) -> float | None:
        values = [getattr(r, field) for r in readings if getattr(r, field) is not None]
        return sum(values) if values else None

    finished: dict[str, float] = {}
    histograms: dict[str, Histogram] = {}
    for reading in readings:
        for reason, count in reading.finished.items():
            finished[reason] = finished.get(reason, 0.0) + count
        for name, h in reading.histograms.items():
            was = histograms.get(name)
            histograms[name] = h if was is None else _sum(was, h)
    kv = [r.kv_cache_usage for r in readings if r.kv_cache_usage is not None]
    caching = [r.prefix_caching for r in readings if r.prefix_caching is not None]
    return ServingReading(
        **{f: total(f) for f in (*_COUNTERS, *SERVING_GAUGES.values())},
        kv_cache_usage=max(kv) if kv else None,
        prefix_caching=any(caching) if caching else None,
        finished=finished,
        histograms=histograms,
    )


def _sum(a: Histogram, b: Histogram) -> Histogram:
    bounds: dict[float, float] = dict(a.buckets)
    for bound, count in b.buckets:
        bounds[bound] = bounds.get(bound, 0.0) + count
    return Histogram(buckets=sorted(bounds.items()), sum=a.sum + b.sum, count=a.count + b.count)


def between(before: ServingReading, after: ServingReading, seconds: float) -> Traffic:
    """The traffic from ``before`` to ``after``, ``seconds`` apart."""
    if seconds <= 0:
        return Traffic(seconds=seconds)
    moved = {f: _delta(getattr(before, f), getattr(after, f)) for f in _COUNTERS}
    reasons = set(before.finished) | set(after.finished)
    by_reason = {
        r: _delta(before.finished.get(r, 0.0), after.finished.get(r, 0.0)) for r in reasons
    }
    if any(v is not None and v < 0 for v in [*moved.values(), *by_reason.values()]):
        return Traffic(seconds=seconds, reset=True)
    finished = sum(v for v in by_reason.values() if v is not None) if by_reason else None
    errors = sum(by_reason.get(r) or 0.0 for r in ERROR_REASONS)

    def per_s(field: str) -> float | None:
        value = moved[field]
        return value / seconds if value is not None else None

    def p95(name: str) -> float | None:
        return _quantile(before.histograms.get(name), after.histograms.get(name), QUANTILE)

    return Traffic(
        seconds=seconds,
        finished=finished,
        requests_per_s=finished / seconds if finished is not None else None,
        input_tok_s=per_s("prompt_tokens"),
        output_tok_s=per_s("generation_tokens"),
        ttft_p95_s=p95(TTFT_SECONDS),
        itl_p95_s=p95(ITL_SECONDS),
        tpot_p95_s=p95(TPOT_SECONDS),
        e2e_p95_s=p95(E2E_SECONDS),
        error_share=errors / finished if finished else None,
        preemptions_per_s=per_s("preemptions"),
        prefix_hit_rate=_ratio(moved["prefix_cache_hits"], moved["prefix_cache_queries"])
        if after.prefix_caching is not False
        else None,
        spec_acceptance=_ratio(moved["spec_accepted_tokens"], moved["spec_draft_tokens"]),
        prefix_caching=after.prefix_caching,
        spec_decoding=after.spec_drafts is not None,
    )


def _delta(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else after - before


def _ratio(part: float | None, whole: float | None) -> float | None:
    return part / whole if part is not None and whole else None


def _quantile(before: Histogram | None, after: Histogram | None, q: float) -> float | None:
    """The ``q`` quantile of the observations made between two readings of one histogram, as
    Prometheus' ``histogram_quantile`` computes it: linear inside the bucket that holds it, the
    highest finite bound when it lies in ``+Inf``; None when nothing was observed."""
    if after is None:
        return None
    was = dict(before.buckets) if before is not None else {}
    count = after.count - (before.count if before is not None else 0.0)
    if count <= 0:
        return None
    rank = q * count
    lower, below = 0.0, 0.0
    for bound, cumulative in after.buckets:
        here = cumulative - was.get(bound, 0.0)
        if here >= rank:
            if here == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (here - below)
        lower, below = bound, here
    return after.buckets[-1][0] if after.buckets else None
