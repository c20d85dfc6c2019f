"""A deployment's life, whatever the backend: up, status, logs, down.

Each function picks the backend from the cluster's transport (at ``up``) or from the saved state
(afterwards), so the CLI and tests drive every backend the same way.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator

from pydantic import BaseModel, Field

from tandem import ownership
from tandem.backends import cache_roots, netns
from tandem.backends.base import Backend, OnEvent, OnPhase, ProcessFact, backend_for
from tandem.backends.launch import interrupted
from tandem.backends.state import DeploymentState, list_deployments, load_state
from tandem.check.findings import CheckReport
from tandem.errors import BackendError, CheckFailed, StateError
from tandem.operations import revisions
from tandem.operations.health import (
    Assessment,
    Health,
    ProgressTracker,
    RankCondition,
    Verdict,
    assess,
)
from tandem.operations.overview import GroupOverview, group_overview
from tandem.operations.preflight import run_check
from tandem.operations.supervisor import stop_supervisor
from tandem.plan.status import PlannedVsActual
from tandem.rankplan import RankPlan, launch_plan
from tandem.readiness import Readiness
from tandem.spec.cluster import Cluster
from tandem.spec.deployment import Deployment
from tandem.vllm_log import BootFigures, PhaseMark


def refuse_if_running(deployment: Deployment, on_event: OnEvent = lambda text: None) -> None:
    """Raise when a deployment of this name has a rank alive, before any preflight runs; stop
    what an interrupted launch of it left (its ``up`` killed before ready) and say so.

    The preflight would otherwise report the running deployment's own ports as taken, and the
    ranks a killed ``up`` left hold exactly those ports.
    """
    if deployment.name not in list_deployments():
        return
    state = load_state(deployment.name)
    backend = backend_for(state.backend)
    if interrupted(state):
        on_event(
            f"an earlier `up` of '{state.name}' (pid {state.launcher_pid}) was killed before "
            "it became ready: stopping what it left, then starting afresh"
        )
        backend.down(state, on_event=on_event)
        state.directory.forget()
        return
    if any(backend.rank_running(state, rank) for rank in state.ranks):
        raise BackendError(
            f"deployment '{state.name}' is already running at {state.endpoint}",
            hint=f"stop it first with `tandem down {state.name}`",
        )


def up(
    deployment: Deployment,
    *,
    preflight: bool = True,
    timeout_s: float | None = None,
    on_phase: OnPhase = lambda mark: None,
    on_event: OnEvent = lambda text: None,
    on_report: Callable[[CheckReport], None] = lambda report: None,
    gated: bool = False,
    revision: int | None = None,
) -> tuple[DeploymentState, Readiness]:
    """The launch policy, the same for the CLI and a script: refuse when the deployment already
    runs, run the preflight (``tandem.operations.preflight.run_check``) and refuse on any error in
    it, then plan the ranks, launch them on the cluster's backend and wait until the model answers.

    Usage:
        state, ready = up(load_deployment("tiny-local"), on_event=print)

    Args:
        preflight: False launches without the checks (``tandem up --skip-checks``).
        on_report: given the preflight's report, whatever it found, before a refusal.
        gated: record the new revision as ``starting``, for an upgrade's gate to judge.
        revision: run this recorded revision again (a rollback): no new one is recorded.

    Raises:
        BackendError: the deployment is already running.
        CheckFailed: the preflight found at least one error; nothing was launched.
        RankFailed: a rank exited during start-up, or it timed out.
    """
    refuse_if_running(deployment, on_event)
    report = None
    if preflight:
        report = run_check(deployment, on_event=on_event)
        on_report(report)
        if not report.ok:
            raise CheckFailed(
                f"refusing to launch '{deployment.name}': {len(report.errors)} error(s) "
                "in the preflight",
                hint="fix them, or pass --skip-checks to launch anyway (preflight=False)",
            )
    plan = launch_plan(deployment)
    backend = backend_for(deployment.cluster.transport.value)
    state, ready = backend.up(
        plan, deployment, timeout_s=timeout_s, on_phase=on_phase, on_event=on_event
    )
    if revision is None:
        recorded = revisions.record(deployment, report, outcome="starting" if gated else "good")
        revision = recorded.number
        on_event(f"recorded as revision {revision} (`tandem history {deployment.name}`)")
    state.revision = revision
    state.save()
    return state, ready


def _interrupted_upgrade(name: str) -> str | None:
    marker = revisions.interrupted_upgrade(name)
    if marker is None:
        return None
    return (
        f"an upgrade from revision {marker.from_revision} was interrupted ({marker.phase}); "
        f"`tandem rollback {name} --to {marker.from_revision}` or `tandem upgrade` again"
    )


def dry_run(deployment: Deployment) -> tuple[RankPlan, list]:
    """The rank plan and the commands ``up`` would run, without running anything."""
    plan = launch_plan(deployment)
    return plan, backend_for(deployment.cluster.transport.value).launch_commands(plan, deployment)


class RankStatus(BaseModel):
    rank: int
    node: str
    role: str
    address: str
    pid: int | None
    netns: str | None
    state: str = Field(description="running (some process of the rank lives) or exited.")
    health: Health
    processes: list[ProcessFact] = Field(default_factory=list)
    log: str


class GroupStatus(BaseModel):
    """One group of a deployment: its own verdict and ranks (``tandem status --json``'s
    ``groups``; a deployment without replicas has one)."""

    group: int
    name: str = Field(description="The group's own deployment name (`NAME-gG` with replicas).")
    endpoint: str = Field(description="Its leader's API.")
    verdict: Verdict
    reason: str = ""
    member: bool | None = Field(
        default=None, description="In the router's rotation; None without a router."
    )
    ranks: list[RankStatus]
    overview: GroupOverview | None = Field(
        default=None,
        description="The same observation beyond the verdict: the leader's serving figures, "
        "the nodes' readings (with --nodes), the revision and its evidence, events "
        "(tandem.operations.overview); None for a group that is not running.",
    )


class RouterStatus(BaseModel):
    """The front door of a deployment with replicas (``tandem status --json``'s ``router``)."""

    url: str
    policy: str
    version: str
    pid: int
    running: bool
    members: list[str] = Field(description="The group leaders it sends requests to.")
    metrics_url: str
    models: list[str] | None = Field(
        default=None, description="Its /v1/models as it answers; None: it did not answer."
    )


class DeploymentStatus(BaseModel):
    """What ``tandem status --json`` prints."""

    name: str
    backend: str
    endpoint: str
    model: str
    ready: bool
    verdict: Verdict
    healthy: bool = Field(description="verdict == healthy.")
    reason: str = ""
    evidence: str = ""
    rank: int | None = Field(default=None, description="The rank the verdict is about.")
    ranks: list[RankStatus]
    boot: BootFigures
    phases: list[PhaseMark]
    planned: PlannedVsActual | None = None
    revision: int | None = Field(default=None, description="The revision it runs.")
    upgrade_interrupted: str | None = Field(
        default=None, description="What a killed `tandem upgrade` was doing, if one was."
    )
    groups: list[GroupStatus] = Field(default_factory=list)
    router: RouterStatus | None = None


def status(
    name: str | None = None,
    *,
    canary_timeout_s: float = 5.0,
    canary_mode: str = "idle",
    tracker: ProgressTracker | None = None,
    nodes: bool = False,
) -> DeploymentStatus:
    """A deployment's verdict (``tandem.operations.health``), endpoint, and each rank's health.

    A caller that looks again and again (``tandem watch``) passes a ``tracker``, so a stall is
    judged over time, and sends canaries only now and then (``canary_mode="never"`` between).
    With ``nodes`` the one look at the nodes brings their readings too (memory, GPUs, RDMA),
    into the group's ``overview``.
    """
    state = load_state(name)
    look = backend_for(state.backend).observe(state, nodes=nodes)
    report: Assessment = assess(
        state,
        canary_timeout_s=canary_timeout_s,
        canary_mode=canary_mode,
        tracker=tracker,
        look=look,
    )
    health = {r.rank: r for r in report.ranks}
    ranks = [
        RankStatus(
            rank=r.rank,
            node=r.node,
            role=r.role,
            address=r.address,
            pid=r.pid,
            netns=r.netns,
            log=r.log,
            health=health[r.rank].health,
            processes=health[r.rank].processes,
            state="exited" if health[r.rank].health.state is RankCondition.DEAD else "running",
        )
        for r in sorted(state.ranks, key=lambda r: r.rank)
    ]
    groups = [
        GroupStatus(
            group=0,
            name=state.name,
            endpoint=state.endpoint,
            verdict=report.verdict,
            reason=report.reason,
            ranks=ranks,
            overview=group_overview(state, report, look),
        )
    ]
    if report.groups:  # a LeaderWorkerSet's replicas: group G is its pods NAME-G[-i]
        port = state.deployment(lenient=True).recipe.ports.api
        groups = []
        for index, part in enumerate(report.groups):
            numbers = {h.rank for h in part.ranks}
            own = [r for r in ranks if r.rank in numbers]
            leader = next(r for r in own if r.role == "leader")
            groups.append(
                GroupStatus(
                    group=index,
                    name=f"{state.name}-{index}",
                    endpoint=f"http://{leader.address}:{port}" if leader.address else "",
                    verdict=part.verdict,
                    reason=part.reason,
                    ranks=own,
                )
            )
    return DeploymentStatus(
        groups=groups,
        name=state.name,
        backend=state.backend,
        endpoint=state.endpoint,
        model=state.model,
        ready=state.ready,
        verdict=report.verdict,
        healthy=report.verdict is Verdict.HEALTHY,
        reason=report.reason,
        evidence=report.evidence,
        rank=report.rank,
        ranks=ranks,
        boot=state.boot,
        phases=state.phases,
        planned=state.planned
        or PlannedVsActual(
            unavailable="not compared: launched by an older tandem, or not ready yet"
        ),
        revision=state.revision,
        upgrade_interrupted=_interrupted_upgrade(state.name),
    )


def log_lines(
    name: str | None = None,
    *,
    rank: int | None = None,
    follow: bool = False,
    tail: int | None = None,
    sleep: Callable[[float], None] | None = None,
) -> Iterator[tuple[int, str]]:
    """(rank, line) pairs of the ranks' logs; with ``follow``, keeps yielding new lines."""
    state = load_state(name)
    backend: Backend = backend_for(state.backend)
    ranks = [r for r in sorted(state.ranks, key=lambda r: r.rank) if rank is None or r.rank == rank]
    if not ranks:
        raise BackendError(
            f"deployment '{state.name}' has no rank {rank}",
            hint=f"ranks are 0..{len(state.ranks) - 1}",
        )
    readers = {r.rank: backend.log_reader(state, r) for r in ranks}
    for r in ranks:
        lines = readers[r.rank].new_lines()
        for line in lines if tail is None else lines[len(lines) - tail :]:
            yield r.rank, line
    while follow:
        (sleep or time.sleep)(0.5)
        for r in ranks:
            for line in readers[r.rank].new_lines():
                yield r.rank, line


def sweep_leftovers(on_event: OnEvent = lambda text: None) -> int:
    """Remove the networks killed commands left on this machine; how many there were."""
    if os.geteuid() != 0:
        return 0
    before = len(netns.ledger())
    leftovers = netns.sweep_orphans(on_event)
    if leftovers:
        raise BackendError("could not remove what a killed command left: " + "; ".join(leftovers))
    return before - len(netns.ledger())


def down(
    name: str | None = None, *, purge_caches: bool = False, on_event: OnEvent = lambda text: None
) -> DeploymentState | None:
    """Stop every rank, remove what up created, and forget the deployment (logs are kept).

    Networks that killed commands left behind are removed first, whichever deployment or check
    made them; with no deployment to stop, that sweep alone is the result (None). The ranks'
    compile caches stay (``tandem.caches``), so the next ``up`` starts warm; with
    ``purge_caches`` they are removed on every node too.
    """
    if name is not None:
        ownership.check_name(name)  # before anything is swept or stopped
    swept = sweep_leftovers(on_event)
    try:
        state = load_state(name)
    except StateError:
        if swept and name is None:
            return None
        raise
    if stop_supervisor(state.name, on_event=on_event):  # or it would restart what we stop
        # A restart it was in may have launched anew (another launch id) or cleared the state.
        state = load_state(state.name) if state.directory.state_file.exists() else state
    backend_for(state.backend).down(state, on_event=on_event)
    state.directory.forget()
    if purge_caches:
        purge_compile_caches(state.name, state.deployment(lenient=True).cluster, on_event=on_event)
    return state


def purge_compile_caches(
    name: str, cluster: Cluster | None, *, on_event: OnEvent = lambda text: None
) -> None:
    """Remove every rank's compile cache root of deployment ``name`` on the cluster's nodes
    (None: this machine).

    Raises:
        BackendError: a root could not be removed, or the deployment is still running.
    """
    if name in list_deployments():
        raise BackendError(
            f"deployment '{name}' is running; its caches are in use",
            hint=f"`tandem down {name} --purge-caches` stops it first",
        )
    leftovers = cache_roots.purge(name, cluster, on_event=on_event)
    if leftovers:
        raise BackendError(
            f"could not remove the compile caches {', '.join(leftovers)}",
            hint="remove them by hand (a container may have written them as root)",
        )
