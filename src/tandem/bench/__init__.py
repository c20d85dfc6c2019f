"""tandem bench: serving performance of an OpenAI-compatible endpoint, measured correctly.

Modules: ``records`` (one raw ``RequestRecord`` per request), ``metrics`` (definitions and pure
aggregation), ``timed_request`` (streaming requests, timed once for every endpoint kind),
``workload`` (load points, prompts, arrival schedules), ``server_metrics`` (``/metrics``
deltas), ``config`` (``BenchConfig``), ``aiohttp_transport`` (httpx over aiohttp, for cheap
stream reads), ``load_generator`` (``run`` / ``LoadGenerator``), ``compare`` (two summaries).
Rendering lives in ``tandem.report.bench``.

Usage:
    from tandem.bench import BenchConfig, run
    result = run(BenchConfig(url="http://127.0.0.1:8000", concurrency=[1, 2, 4]), Path("runs/b1"))
"""

from tandem.bench.config import BenchConfig
from tandem.bench.load_generator import (
    BenchResult,
    LoadGenerator,
    LoadPointResult,
    ProgressEvent,
    ServerInfo,
    read_records,
    run,
)
from tandem.bench.metrics import LatencyStats, LoadPointMetrics, Slo, load_point_metrics
from tandem.bench.records import ErrorCategory, RequestRecord
from tandem.bench.server_metrics import ServerDelta
from tandem.bench.workload import LoadPoint

__all__ = [
    "BenchConfig",
    "BenchResult",
    "ErrorCategory",
    "LatencyStats",
    "LoadGenerator",
    "LoadPoint",
    "LoadPointMetrics",
    "LoadPointResult",
    "ProgressEvent",
    "RequestRecord",
    "ServerDelta",
    "ServerInfo",
    "Slo",
    "load_point_metrics",
    "read_records",
    "run",
]
