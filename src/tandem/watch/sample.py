"""The typed sample of ``tandem watch``: one line of ``samples.jsonl``, versioned.

A sample holds what was *read* at one instant: gauges as they were and counters as running
totals (tokens, CPU seconds, OOM kills, RDMA words). Rates are never stored; they are a pure
function of two consecutive samples (``tandem.watch.series``), so a resumed watch, a gap or a
counter reset (a restarted leader) is handled in one place.

Layout of a watch folder::

    watch.json       WatchRun: the deployment, its nodes and ranks, the interval, the thresholds
    samples.jsonl    one Sample a line, appended as it goes (a killed watch resumes here)
    report.md, summary.json, *.png   written by ``tandem watch report``
"""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field

from tandem.backends.base import NodeMemory
from tandem.operations.health import Verdict
from tandem.operations.overview import Event
from tandem.spec.recipe import Watch

SCHEMA_VERSION = 1
SAMPLES_FILE = "samples.jsonl"
RUN_FILE = "watch.json"


class WatchRecord(BaseModel):
    """A record of a watch folder's files: a field this tandem does not know is an error."""

    model_config = ConfigDict(extra="forbid")


class RankUsage(WatchRecord):
    """One rank's processes on its node."""

    rank: int
    role: str = Field(description="`leader` or `worker`.")
    up: bool = Field(description="The backend says the rank's process (or pod) is alive.")
    processes: int = Field(default=0, description="Live processes marked with the rank.")
    rss_bytes: int | None = Field(default=None, description="Summed resident memory.")
    cpu_s: float | None = Field(default=None, description="Summed CPU time, running total.")


class GpuReading(WatchRecord):
    """One GPU, from ``nvidia-smi``; a field the GPU does not report is None (GB10 memory)."""

    index: int
    name: str | None = None
    uuid: str | None = None
    temperature_c: float | None = None
    sm_clock_mhz: float | None = None
    max_sm_clock_mhz: float | None = None
    power_w: float | None = None
    utilization_pct: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    event_reasons_mask: int | None = Field(
        default=None, description="clocks_event_reasons.active, NVML's bit mask."
    )
    event_reasons: list[str] = Field(default_factory=list, description="Names of the set bits.")
    throttled: bool = Field(default=False, description="A thermal or hardware slowdown is on.")


class RdmaPort(WatchRecord):
    """An RDMA port's state and counters from sysfs (data counters in bytes, running totals)."""

    device: str
    port: int
    state: str | None = None
    xmit_bytes: int | None = None
    rcv_bytes: int | None = None
    xmit_discards: int | None = None
    symbol_errors: int | None = None
    link_downed: int | None = None


class NodeReading(WatchRecord, NodeMemory):
    """One node at one instant."""

    ranks: list[RankUsage] = Field(default_factory=list)
    gpus: list[GpuReading] = Field(default_factory=list)
    rdma: list[RdmaPort] = Field(default_factory=list)
    error: str | None = Field(default=None, description="Why the node could not be read.")


class LeaderReading(WatchRecord):
    """The leader's vLLM ``/metrics``, summed over engines; counters are running totals."""

    requests_running: float | None = None
    requests_waiting: float | None = None
    kv_cache_usage: float | None = Field(default=None, description="Fraction 0..1.")
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    preemptions: float | None = None
    finished: dict[str, float] = Field(
        default_factory=dict,
        description="finished_reason (stop, length, abort, error, ...) -> "
        "requests, vllm:request_success_total.",
    )
    spec_drafts: float | None = None
    spec_draft_tokens: float | None = None
    spec_accepted_tokens: float | None = None
    scrape_s: float = Field(description="Seconds the GET /metrics took.")


class Sample(WatchRecord):
    """Everything read at one instant; one line of samples.jsonl."""

    schema_version: int = SCHEMA_VERSION
    seq: int = Field(description="0, 1, 2 ... over the whole folder, across resumes.")
    segment: int = Field(description="0 for the first watch of a folder, +1 per resume.")
    time: datetime
    verdict: Verdict = Field(
        description="tandem.operations.health's: starting, healthy, degraded, stalled or down."
    )
    nodes: list[NodeReading]
    leader: LeaderReading | None = Field(default=None, description="None: /metrics unanswered.")
    restarts: int = Field(description="Group restarts in events.log so far (whole file).")
    events: list[Event] = Field(
        default_factory=list, description="events.log lines new since the previous sample."
    )
    cost_s: float = Field(description="Wall seconds this sample took to take.")

    @property
    def unix(self) -> float:
        return self.time.timestamp()


class RankInfo(WatchRecord):
    rank: int
    node: str
    role: str


class WatchRun(WatchRecord):
    """``watch.json``: what a watch folder watches, written by its first watch."""

    schema_version: int = SCHEMA_VERSION
    name: str
    backend: str
    endpoint: str
    interval_s: float
    duration_s: float | None
    nodes: list[str]
    ranks: list[RankInfo]
    thresholds: Watch = Field(description="The recipe's `watch:` section at the first watch.")
    started_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
