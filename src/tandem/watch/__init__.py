"""``tandem watch``: a running deployment sampled over time, for soaks of hours.

Modules, one job each: ``nodes`` (a sample's nodes, from the one look at the deployment that
the health verdict judges too), ``leader`` (the leader's /metrics page),
``gpu`` (nvidia-smi's CSV), ``events`` (restarts from events.log),
``sample`` (the versioned sample model), ``folder`` (the JSONL on disk),
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
