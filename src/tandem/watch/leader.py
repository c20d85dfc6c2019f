"""The leader's vLLM ``/metrics`` -> ``LeaderReading``: queue, KV pool, token and request totals.

Parsed with prometheus_client's parser, after dropping every line of a family tandem does not
read (vLLM exports hundreds of histogram buckets; parsing them all costs the watcher ~13 ms a
sample). Samples of one name are summed over their label sets (one per engine), except
``vllm:request_success_total``, kept per ``finished_reason``: the error rate is
``error + abort`` over all finished requests, ``length`` included (vllm-doctor's mistake was to
leave it out, ``pypi-peers.md`` §3.3).

Only the leader exports ``/metrics``; headless workers have no API server, so their health
comes from their nodes (``tandem.agent``). The page is the one the health verdict's
scrape brought (``tandem.operations.health.ApiFacts.metrics_text``): a sample scrapes once.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tandem import vllm_metrics as names
from tandem.watch.sample import LeaderReading

_FIELDS = {
    names.REQUESTS_RUNNING: "requests_running",
    names.REQUESTS_WAITING: "requests_waiting",
    names.KV_CACHE_USAGE: "kv_cache_usage",
    names.PROMPT_TOKENS: "prompt_tokens",
    names.GENERATION_TOKENS: "generation_tokens",
    names.PREEMPTIONS: "preemptions",
    names.SPEC_DRAFTS: "spec_drafts",
    names.SPEC_DRAFT_TOKENS: "spec_draft_tokens",
    names.SPEC_ACCEPTED: "spec_accepted_tokens",
}
_FAMILIES = {name.removesuffix("_total") for name in (*_FIELDS, names.REQUEST_SUCCESS)}


def parse_leader_metrics(text: str, scrape_s: float = 0.0) -> LeaderReading:
    """Prometheus exposition text -> the leader's reading. Pure.

    Usage:
        reading = parse_leader_metrics(httpx.get(url + "/metrics").text)
        reading.kv_cache_usage, reading.finished.get("error", 0)
    """
    values: dict[str, float] = {}
    finished: dict[str, float] = {}
    for family in text_string_to_metric_families(names.family_lines(text, _FAMILIES)):
        for sample in family.samples:
            if sample.name == names.REQUEST_SUCCESS:
                reason = sample.labels.get("finished_reason", "unknown")
                finished[reason] = finished.get(reason, 0.0) + sample.value
            elif sample.name in _FIELDS:
                field = _FIELDS[sample.name]
                values[field] = values.get(field, 0.0) + sample.value
    return LeaderReading(**values, finished=finished, scrape_s=round(scrape_s, 4))
