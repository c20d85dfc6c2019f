"""The one interface every backend implements, and the registry that picks one per transport.

A backend turns a RankPlan into running ranks somewhere and finds them again later from the
deployment's state. Readiness, the phase display, status and logs are shared; only launching,
stopping, liveness and log reading differ between this machine, SSH hosts and Kubernetes.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, Field

from tandem.backends.state import GroupState, Place, RankState
from tandem.errors import BackendError
from tandem.rankplan import RankPlan, RankSpec
from tandem.readiness import Readiness
from tandem.spec.deployment import Deployment
from tandem.vllm_log import PhaseMark

if TYPE_CHECKING:
    from tandem.backends.processes import Process

OnPhase = Callable[[PhaseMark], None]
OnEvent = Callable[[str], None]


class ProcessFact(BaseModel):
    """One live process of a rank, as its node reports it."""

    pid: int
    name: str
    state: str = Field(description="One letter as in /proc: R, S, D, T (stopped), Z, ...")
    rss_bytes: int | None = None
    cpu_s: float | None = None

    @classmethod
    def of(cls, process: Process) -> ProcessFact:
        return cls.model_validate(process, from_attributes=True)


class RankObservation(BaseModel):
    """What a backend sees of one rank right now: the facts the health model judges."""

    rank: int
    processes: list[ProcessFact] = Field(default_factory=list)
    alive: bool | None = Field(
        default=None,
        description="Where processes cannot be listed (a pod): whether the rank's unit runs.",
    )
    unreachable: str | None = Field(default=None, description="Why its node could not be asked.")
    problem: str | None = Field(
        default=None,
        description="Something the rank needs is gone "
        "although its processes live (its network namespace).",
    )
    log_since_ready: list[str] = Field(default_factory=list)


class RdmaCounters(BaseModel):
    """An RDMA port's state and counters as sysfs names them (data counters in 4-byte words)."""

    device: str
    port: int
    state: str | None = None
    port_xmit_data: int | None = None
    port_rcv_data: int | None = None
    port_xmit_discards: int | None = None
    symbol_error: int | None = None
    link_downed: int | None = None


class NodeMemory(BaseModel):
    """A node's memory and its OOM kills, as its own files say (``/proc/meminfo``,
    ``/proc/vmstat``); on DGX Spark the GPU's memory too."""

    node: str
    mem_total_bytes: int | None = None
    mem_available_bytes: int | None = None
    swap_total_bytes: int | None = None
    swap_free_bytes: int | None = None
    oom_kills: int | None = Field(default=None, description="/proc/vmstat oom_kill since boot.")

    @property
    def mem_used_bytes(self) -> int | None:
        if self.mem_total_bytes is None or self.mem_available_bytes is None:
            return None
        return self.mem_total_bytes - self.mem_available_bytes

    def memory(self) -> dict[str, str | int | None]:
        """The node and these fields alone, to carry them into a model that has them too."""
        return {name: getattr(self, name) for name in NodeMemory.model_fields}


class NodeFacts(NodeMemory):
    """One node's own readings, from the node agent (``tandem.agent``)."""

    nvidia_smi: str | None = Field(
        default=None, description="nvidia-smi's CSV as printed; None where there is none."
    )
    rdma: list[RdmaCounters] = Field(default_factory=list)
    error: str | None = Field(default=None, description="Why the node could not be read.")

    @classmethod
    def of(cls, node: str, readings: dict[str, Any]) -> NodeFacts:
        """From the agent's ``node_readings``."""
        mem = readings.get("meminfo") or {}
        return cls(
            node=node,
            mem_total_bytes=mem.get("MemTotal"),
            mem_available_bytes=mem.get("MemAvailable"),
            swap_total_bytes=mem.get("SwapTotal"),
            swap_free_bytes=mem.get("SwapFree"),
            oom_kills=readings.get("oom_kills"),
            nvidia_smi=readings.get("nvidia_smi"),
            rdma=[RdmaCounters.model_validate(p) for p in readings.get("rdma") or []],
        )


class Look(BaseModel):
    """One observation of a deployment: every rank as its node shows it and, when asked for,
    each node's own readings; one round trip a node (``Backend.observe``)."""

    ranks: dict[int, RankObservation] = Field(default_factory=dict)
    nodes: dict[str, NodeFacts] = Field(default_factory=dict)

    def rank(self, rank: int) -> RankObservation:
        """What was seen of a rank; nothing seen is a rank with no process."""
        return self.ranks.get(rank) or RankObservation(rank=rank)


class LogReader(Protocol):
    """Reads a rank's log incrementally."""

    def new_lines(self) -> list[str]:
        """Complete lines appended since the last call (all lines on the first call)."""


class Backend(Protocol):
    """Launch, find, read and stop the ranks of a deployment."""

    name: str

    def launch_commands(
        self, plan: RankPlan, deployment: Deployment
    ) -> list[tuple[RankSpec, list[str]]]:
        """What ``up`` would run for each rank, in start order (for ``--dry-run``)."""

    def up(
        self,
        plan: RankPlan,
        deployment: Deployment,
        *,
        timeout_s: float | None,
        on_phase: OnPhase,
        on_event: OnEvent,
        place: Place | None = None,
    ) -> tuple[GroupState, Readiness]:
        """Start every rank, workers first, and wait until the model answers; ``place`` says
        which group of which deployment it is (default: the one group of its own name)."""

    def down(self, state: GroupState, *, on_event: OnEvent) -> None:
        """Stop every rank and remove what ``up`` created; raise if something survives."""

    def rank_running(self, state: GroupState, rank: RankState) -> bool:
        """True while the rank's process (or pod) is alive."""

    def observe(self, state: GroupState, *, nodes: bool = False) -> Look:
        """Every rank's live processes and log lines since ready and, with ``nodes``, each
        node's readings: one call of the node agent a node, all nodes at once."""

    def log_reader(self, state: GroupState, rank: RankState) -> LogReader:
        """A reader of the rank's log."""

    def node_versions(self, state: GroupState) -> dict[str, str]:
        """Node name -> what runs the engine there, for the support bundle (``{}`` where the
        control machine's own versions say it all)."""


# transport -> "module:Class"; a backend is imported only when used.
BACKENDS: dict[str, str] = {
    "local": "tandem.backends.local:LocalBackend",
    "ssh": "tandem.backends.ssh:SSHBackend",
    "k8s": "tandem.backends.k8s:KubernetesBackend",
}


def backend_for(transport: str) -> Backend:
    """The backend of a cluster transport (``local``, ``ssh``, ``k8s``)."""
    if transport not in BACKENDS:
        raise BackendError(
            f"no backend for transport '{transport}' in this version",
            field="transport",
            hint=f"use one of {', '.join(BACKENDS)}, or "
            "`tandem render` to get the per-node commands",
        )
    module, _, cls = BACKENDS[transport].partition(":")
    return getattr(importlib.import_module(module), cls)()
