"""A deployment's life, whatever the backend: up, status, logs, down.

Each function picks the backend from the cluster's transport (at ``up``) or from the saved state
(afterwards), so the CLI and tests drive every backend the same way.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator

import httpx
from pydantic import BaseModel

from tandem.backends.base import Backend, OnEvent, OnPhase, backend_for
from tandem.backends.state import (
    BootFigures, DeploymentState, PhaseMark, list_deployments, load_state,
)
from tandem.backends.supervisor import stop_supervisor
from tandem.errors import BackendError
from tandem.plan.status import PlannedVsActual, planned_vs_boot
from tandem.rankplan import RankPlan, plan_ranks
from tandem.readiness import Readiness
from tandem.spec.deployment import Deployment


def refuse_if_running(deployment: Deployment) -> None:
    """Raise when a deployment of this name has a rank alive, before any preflight runs.

    The preflight would otherwise report the running deployment's own ports as taken.
    """
    if deployment.name not in list_deployments():
        return
    state = load_state(deployment.name)
    backend = backend_for(state.backend)
    if any(backend.rank_running(state, rank) for rank in state.ranks):
        raise BackendError(f"deployment '{state.name}' is already running at {state.endpoint}",
                           hint=f"stop it first with `tandem down {state.name}`")


def up(deployment: Deployment, *, timeout_s: float | None = None,
       on_phase: OnPhase = lambda mark: None,
       on_event: OnEvent = lambda text: None) -> tuple[DeploymentState, Readiness]:
    """Plan the ranks, launch them on the cluster's backend and wait until the model answers."""
    plan = plan_ranks(deployment)
    backend = backend_for(deployment.cluster.transport.value)
    return backend.up(plan, deployment, timeout_s=timeout_s, on_phase=on_phase, on_event=on_event)


def dry_run(deployment: Deployment) -> tuple[RankPlan, list]:
    """The rank plan and the commands ``up`` would run, without running anything."""
    plan = plan_ranks(deployment)
    return plan, backend_for(deployment.cluster.transport.value).launch_commands(plan, deployment)


class RankStatus(BaseModel):
    rank: int
    node: str
    role: str
    address: str
    pid: int | None
    netns: str | None
    state: str
    log: str


class DeploymentStatus(BaseModel):
    """What ``tandem status --json`` prints."""

    name: str
    backend: str
    endpoint: str
    model: str
    ready: bool
    healthy: bool
    ranks: list[RankStatus]
    boot: BootFigures
    phases: list[PhaseMark]
    planned: PlannedVsActual | None = None


@functools.cache
def _http_client() -> httpx.Client:
    """One client for every ``status`` call: building one costs ~30 ms of CPU (it loads the
    CA bundle into a TLS context), which ``tandem watch`` would pay at every sample. No
    keep-alive: vLLM's server closes an idle connection after 5 s, and a request racing that
    close fails."""
    return httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))


def status(name: str | None = None) -> DeploymentStatus:
    """A deployment's endpoint, whether it answers /health, and each rank's state."""
    state = load_state(name)
    backend = backend_for(state.backend)
    try:
        healthy = _http_client().get(f"{state.endpoint}/health", timeout=3).status_code == 200
    except httpx.HTTPError:
        healthy = False
    ranks = [
        RankStatus(rank=r.rank, node=r.node, role=r.role, address=r.address, pid=r.pid,
                   netns=r.netns, log=r.log,
                   state="running" if backend.rank_running(state, r) else "exited")
        for r in sorted(state.ranks, key=lambda r: r.rank)
    ]
    return DeploymentStatus(name=state.name, backend=state.backend, endpoint=state.endpoint,
                            model=state.model, ready=state.ready, healthy=healthy, ranks=ranks,
                            boot=state.boot, phases=state.phases,
                            planned=planned_vs_boot(state.recipe, state.cluster, state.boot))


def log_lines(name: str | None = None, *, rank: int | None = None, follow: bool = False,
              tail: int | None = None, sleep: Callable[[float], None] | None = None,
              ) -> Iterator[tuple[int, str]]:
    """(rank, line) pairs of the ranks' logs; with ``follow``, keeps yielding new lines."""
    state = load_state(name)
    backend: Backend = backend_for(state.backend)
    ranks = [r for r in sorted(state.ranks, key=lambda r: r.rank) if rank is None or r.rank == rank]
    if not ranks:
        raise BackendError(f"deployment '{state.name}' has no rank {rank}",
                           hint=f"ranks are 0..{len(state.ranks) - 1}")
    readers = {r.rank: backend.log_reader(state, r) for r in ranks}
    for r in ranks:
        lines = readers[r.rank].new_lines()
        for line in lines[-tail:] if tail else lines:
            yield r.rank, line
    while follow:
        (sleep or time.sleep)(0.5)
        for r in ranks:
            for line in readers[r.rank].new_lines():
                yield r.rank, line


def down(name: str | None = None, *, on_event: OnEvent = lambda text: None) -> DeploymentState:
    """Stop every rank, remove what up created, and forget the deployment (logs are kept)."""
    state = load_state(name)
    stop_supervisor(state.name, on_event=on_event)  # or it would restart what we stop
    backend_for(state.backend).down(state, on_event=on_event)
    (state.directory / "state.json").unlink(missing_ok=True)
    return state
