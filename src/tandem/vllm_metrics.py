"""vLLM's ``/metrics``: the sample names tandem reads, and the parser of its exposition text.

Pure and shared by everything that reads a running server: the health model (forward
progress), ``tandem bench`` (counters before and after a load point) and ``tandem watch``.
Parsed with prometheus_client's own parser; samples of one name are summed over their label
sets (one set per engine or data-parallel rank), except the speculative ``position``. Of a
histogram only ``_sum`` and ``_count`` are kept: differenced around a load point they give the
server's mean over exactly that point's requests, which is what a client can be held against.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel, ConfigDict, Field

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
    for family in text_string_to_metric_families(_only_used_families(text)):
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


def _only_used_families(text: str) -> str:
    """The lines of the families tandem reads, so the parser sees ~2 % of vLLM's exposition.

    vLLM exports hundreds of histogram buckets; parsing them all costs ~13 ms a scrape, which
    the client pays on the CPU it shares with the measurement. A line is kept when its metric
    name (or the family named by a ``# HELP``/``# TYPE`` line) is one of ours; of our histograms
    the ``_sum`` and ``_count`` lines, not the buckets.
    """
    kept = []
    for line in text.splitlines():
        if line.startswith("# "):
            parts = line.split(" ", 3)
            name = parts[2] if len(parts) > 2 else ""
        else:
            name = line.split("{", 1)[0].split(" ", 1)[0]
        family = name.removesuffix("_total").removesuffix("_created")
        if family in _FAMILY_PREFIXES or family.removesuffix("_sum").removesuffix("_count") in (
            _HISTOGRAMS
        ):
            kept.append(line)
    return "\n".join(kept) + "\n"
