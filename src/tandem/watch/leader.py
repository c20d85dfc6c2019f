"""The leader's vLLM ``/metrics`` -> ``LeaderReading``: queue, KV pool, token and request totals.

Read by ``tandem.vllm_metrics.serving_fields``, the parser of a status's reading, without the
latency histograms (vLLM exports hundreds of buckets; parsing them all costs the watcher ~13 ms
a sample). Samples of one name are summed over their label sets (one per engine), the KV cache
usage too (a status keeps the fullest engine's instead), except
``vllm:request_success_total``, kept per ``finished_reason``: the error rate is
``error + abort`` over all finished requests, ``length`` included (vllm-doctor's mistake was to
leave it out, ``pypi-peers.md`` §3.3).

Only the leader exports ``/metrics``; headless workers have no API server, so their health
comes from their nodes (``tandem.agent``). The page is the one the health verdict's
scrape brought (``tandem.operations.health.ApiFacts.metrics_text``): a sample scrapes once.
"""

from __future__ import annotations

from tandem.vllm_metrics import serving_fields
from tandem.watch.sample import LeaderReading


def parse_leader_metrics(text: str, scrape_s: float = 0.0) -> LeaderReading:
    """Prometheus exposition text -> the leader's reading. Pure.

    Usage:
        reading = parse_leader_metrics(httpx.get(url + "/metrics").text)
        reading.kv_cache_usage, reading.finished.get("error", 0)
    """
    fields, kv = serving_fields(text, histograms=())
    return LeaderReading(
        **{name: fields[name] for name in LeaderReading.model_fields if name in fields},
        kv_cache_usage=sum(kv, 0.0) if kv else None,
        scrape_s=round(scrape_s, 4),
    )
