"""``tandem watch``: a running deployment sampled over time, for soaks of hours.

Modules, one job each: ``host`` (what a node's own files say; also a script for remote nodes),
``nodes`` (reaching every node through its backend), ``leader`` (the leader's /metrics),
``gpu`` (nvidia-smi's CSV), ``events`` (restarts from events.log), ``verdict`` (the health
verdict), ``sample`` (the versioned sample model), ``folder`` (the JSONL on disk),
``sampler`` (the loop), ``background`` (beside bench and eval), ``series`` (rates and columns),
``summary`` (the checks), ``exporter`` (the latest sample for Prometheus). Views are in
``tandem.report.watch``.
"""

from tandem.watch.background import BackgroundWatch
from tandem.watch.sample import Sample, Verdict, WatchRun
from tandem.watch.sampler import Watcher
from tandem.watch.summary import WatchSummary, summarize

__all__ = [
    "BackgroundWatch",
    "Sample",
    "Verdict",
    "WatchRun",
    "WatchSummary",
    "Watcher",
    "summarize",
]
