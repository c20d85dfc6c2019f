"""The one interface every backend implements, and the registry that picks one per transport.

A backend turns a RankPlan into running ranks somewhere and finds them again later from the
deployment's state. Readiness, the phase display, status and logs are shared; only launching,
stopping, liveness and log reading differ between this machine, SSH hosts and Kubernetes.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from pydantic import BaseModel, Field

from tandem.backends.state import DeploymentState, RankState
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
        return cls(
            pid=process.pid,
            name=process.name,
            state=process.state,
            rss_bytes=process.rss_bytes,
            cpu_s=process.cpu_s,
        )


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
    ) -> tuple[DeploymentState, Readiness]:
        """Start every rank, workers first, and wait until the model answers."""

    def down(self, state: DeploymentState, *, on_event: OnEvent) -> None:
        """Stop every rank and remove what ``up`` created; raise if something survives."""

    def rank_running(self, state: DeploymentState, rank: RankState) -> bool:
        """True while the rank's process (or pod) is alive."""

    def observe(self, state: DeploymentState) -> dict[int, RankObservation]:
        """Every rank's live processes and log lines since ready, all nodes at once."""

    def log_reader(self, state: DeploymentState, rank: RankState) -> LogReader:
        """A reader of the rank's log."""

    def node_versions(self, state: DeploymentState) -> dict[str, str]:
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
