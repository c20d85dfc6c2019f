"""The server's own counters: ``/metrics`` scraped before and after a load point, differenced.

vLLM exposes Prometheus text at ``GET /metrics``. It is parsed with prometheus_client's parser
(``parse_metrics``, pure) into a ``MetricsSnapshot``; ``server_delta`` turns two snapshots into
the figures a benchmark needs. Samples of one name are summed over their label sets (one set per
engine or data-parallel rank), except where a label is the point (``position`` of speculative
decoding).

Figures (``ServerDelta``), each None when the server does not export the counter:

- ``prompt_tokens`` / ``generation_tokens``: Δ ``vllm:prompt_tokens_total`` /
  ``vllm:generation_tokens_total``. A run that owns the server makes these equal the sums of the
  requests' ``usage``; a difference means foreign traffic (or a client counting error).
- ``preemptions``: Δ ``vllm:num_preemptions_total``.
- ``spec_acceptance_rate`` = Δaccepted_tokens / Δdraft_tokens and ``spec_acceptance_length`` =
  1 + Δaccepted_tokens / Δdrafts (vLLM's definitions), ``spec_per_position_rate[i]`` =
  Δaccepted_at_position_i / Δdrafts.
- ``kv_cache_usage_peak``: highest ``vllm:kv_cache_usage_perc`` seen in the snapshots taken
  during the load point (a fraction 0..1 despite the name).
- ``ttft_mean_s`` = Δ``vllm:time_to_first_token_seconds_sum`` / Δ``…_count``, over
  ``ttft_requests`` = Δcount requests: the server's own mean TTFT for the point's requests, from
  their arrival in vLLM's engine client to the first token. The client's mean TTFT minus this is
  what the HTTP path and the client add (request parsing, tokenization, streaming, the network).
  ``queue_mean_s`` and ``prefill_mean_s`` split the server's part the same way
  (``vllm:request_queue_time_seconds``, ``vllm:request_prefill_time_seconds``; observed as each
  request finishes, so a point that waits for all of its requests counts all of them).
- ``prefix_cache_hit_rate`` = Δ``vllm:prefix_cache_hits_total`` /
  Δ``vllm:prefix_cache_queries_total`` (both in prompt tokens: the share of the point's prompt
  tokens the server found cached), None when nothing was queried; ``prefix_caching`` is what
  the server says of its own prefix cache (``vllm:cache_config_info``), so an absent hit rate
  reads "off", not "no hits".
"""

from __future__ import annotations

from collections.abc import Iterable

import httpx
from pydantic import BaseModel, ConfigDict, Field

from tandem import wire
from tandem.vllm_metrics import (
    GENERATION_TOKENS,
    KV_CACHE_USAGE,
    PREEMPTIONS,
    PREFILL_SECONDS,
    PREFIX_CACHE_HITS,
    PREFIX_CACHE_QUERIES,
    PROMPT_TOKENS,
    QUEUE_SECONDS,
    SPEC_ACCEPTED,
    SPEC_DRAFT_TOKENS,
    SPEC_DRAFTS,
    TTFT_SECONDS,
    MetricsSnapshot,
    parse_metrics,
)


async def scrape(client: httpx.AsyncClient, base_url: str) -> MetricsSnapshot | None:
    """GET /metrics and parse it; None when the server exports none (not an error)."""
    try:
        response = await client.get(base_url + wire.METRICS_PATH, timeout=10)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    try:
        return parse_metrics(response.text)
    except ValueError:
        return None


class ServerDelta(BaseModel):
    """What the server's counters say happened during one load point."""

    model_config = ConfigDict(extra="forbid")

    prompt_tokens: int | None = None
    generation_tokens: int | None = None
    preemptions: int | None = None
    kv_cache_usage_peak: float | None = Field(
        default=None, description="Highest KV cache usage seen, fraction 0..1."
    )
    spec_drafts: int | None = None
    spec_draft_tokens: int | None = None
    spec_accepted_tokens: int | None = None
    spec_acceptance_rate: float | None = Field(default=None, description="accepted / drafted.")
    spec_acceptance_length: float | None = Field(
        default=None, description="1 + accepted / drafts: tokens per decode step."
    )
    spec_per_position_rate: list[float] | None = None
    ttft_requests: int | None = Field(
        default=None, description="Requests the server timed to a first token (Δ TTFT count)."
    )
    ttft_mean_s: float | None = Field(
        default=None, description="The server's mean TTFT over those requests, seconds."
    )
    queue_mean_s: float | None = Field(
        default=None, description="The server's mean scheduler-queue time, seconds."
    )
    prefill_mean_s: float | None = Field(
        default=None, description="The server's mean prefill time, seconds."
    )
    prefix_caching: bool | None = Field(
        default=None, description="Whether the server caches prefixes; None: it does not say."
    )
    prefix_cache_queries: int | None = Field(
        default=None, description="Prompt tokens looked up in the prefix cache."
    )
    prefix_cache_hits: int | None = Field(
        default=None, description="Prompt tokens found there (not computed again)."
    )
    prefix_cache_hit_rate: float | None = Field(
        default=None, description="hits / queries; None when nothing was looked up."
    )


def _delta(before: MetricsSnapshot, after: MetricsSnapshot, name: str) -> int | None:
    a, b = before.get(name), after.get(name)
    if a is None or b is None:
        return None
    return round(b - a)


def _histogram_delta(
    before: MetricsSnapshot, after: MetricsSnapshot, name: str
) -> tuple[float, float] | None:
    """(Δsum, Δcount) of a histogram between two snapshots; None when it is not exported."""
    a, b = before.histogram(name), after.histogram(name)
    if a is None or b is None:
        return None
    return b[0] - a[0], b[1] - a[1]


def _mean(delta: tuple[float, float] | None) -> float | None:
    """The mean of the observations a histogram delta holds; None without any."""
    return delta[0] / delta[1] if delta is not None and delta[1] > 0 else None


def server_delta(
    before: MetricsSnapshot, after: MetricsSnapshot, during: Iterable[MetricsSnapshot] = ()
) -> ServerDelta:
    """Difference two snapshots; ``during`` are the snapshots sampled in between (KV peak)."""
    drafts = _delta(before, after, SPEC_DRAFTS)
    draft_tokens = _delta(before, after, SPEC_DRAFT_TOKENS)
    accepted = _delta(before, after, SPEC_ACCEPTED)
    rate = accepted / draft_tokens if accepted is not None and draft_tokens else None
    length = 1 + accepted / drafts if accepted is not None and drafts else None
    per_pos = None
    if drafts and after.per_position:
        per_pos = [
            (after.per_position[p] - before.per_position.get(p, 0.0)) / drafts
            for p in sorted(after.per_position)
        ]
    kv = [s.get(KV_CACHE_USAGE) for s in (before, *during, after)]
    kv_seen = [v for v in kv if v is not None]
    ttft = _histogram_delta(before, after, TTFT_SECONDS)
    queries = _delta(before, after, PREFIX_CACHE_QUERIES)
    hits = _delta(before, after, PREFIX_CACHE_HITS)
    return ServerDelta(
        prompt_tokens=_delta(before, after, PROMPT_TOKENS),
        generation_tokens=_delta(before, after, GENERATION_TOKENS),
        preemptions=_delta(before, after, PREEMPTIONS),
        kv_cache_usage_peak=max(kv_seen) if kv_seen else None,
        spec_drafts=drafts,
        spec_draft_tokens=draft_tokens,
        spec_accepted_tokens=accepted,
        spec_acceptance_rate=rate,
        spec_acceptance_length=length,
        spec_per_position_rate=per_pos,
        ttft_requests=round(ttft[1]) if ttft is not None else None,
        ttft_mean_s=_mean(ttft),
        queue_mean_s=_mean(_histogram_delta(before, after, QUEUE_SECONDS)),
        prefill_mean_s=_mean(_histogram_delta(before, after, PREFILL_SECONDS)),
        prefix_caching=after.prefix_caching,
        prefix_cache_queries=queries,
        prefix_cache_hits=hits,
        prefix_cache_hit_rate=hits / queries if hits is not None and queries else None,
    )


IDLE_COUNTERS = {PROMPT_TOKENS: "prompt tokens", GENERATION_TOKENS: "generation tokens"}
"""The counters the idle check watches, by the names its warning gives them."""


def counters_moved(before: MetricsSnapshot, after: MetricsSnapshot) -> list[str]:
    """Counters that changed between two snapshots taken while the benchmark sent nothing.

    Returns a description per moved counter, e.g. ``generation tokens +37``; empty when idle.
    """
    moved = ((label, _delta(before, after, name)) for name, label in IDLE_COUNTERS.items())
    return [f"{label} {d:+d}" for label, d in moved if d]
