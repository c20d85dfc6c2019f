"""A deployment's life, whatever the backend and however many groups: up, status, logs, down.

A deployment is one record (``tandem.backends.state.DeploymentState``) of one or more groups;
a group stays the unit of launch, health and restart. With ``replicas: N`` each group is cut
from the deployment (``tandem.spec.deployment.groups``: its own nodes, and on this machine its
own subnet) and, on this machine and over ssh, launched on its own; vLLM's router
(``tandem.backends.router``) starts in front once every group answered, and the router's
members follow tandem's verdict (``sync_members``): a group joins only after it answered a real
completion at its own leader. On Kubernetes one apply launches every group (the
LeaderWorkerSet's ``replicas``) and the router's Deployment; the record of that launch is split
by group, so every command sees the same shape.

The record is written before anything starts, so ``down`` finds everything an interrupted
``up`` left; the backend is picked from the cluster's transport (at ``up``) or the record
(afterwards), so the CLI and tests drive every backend the same way.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator

import httpx
from pydantic import BaseModel, Field

from tandem import ownership, wire
from tandem.backends import cache_roots, netns
from tandem.backends import router as routers
from tandem.backends.base import Backend, OnEvent, OnPhase, ProcessFact, backend_for
from tandem.backends.launch import interrupted
from tandem.backends.processes import ProcessIdentity
from tandem.backends.router_node import RouterNode
from tandem.backends.state import (
    DeploymentState,
    GroupState,
    Place,
    list_deployments,
    load_state,
)
from tandem.check.findings import CheckReport
from tandem.endpoint import Endpoint
from tandem.errors import (
    BackendError,
    CheckFailed,
    EndpointError,
    RankFailed,
    StateError,
    TandemError,
)
from tandem.interrupts import shielded
from tandem.operations import admission, revisions
from tandem.operations.health import (
    GroupVerdict,
    Health,
    ProgressTracker,
    RankCondition,
    Verdict,
    assess,
    of_groups,
)
from tandem.operations.overview import GroupOverview, group_overview, served_models
from tandem.operations.preflight import run_check
from tandem.operations.supervisor import kubernetes_restarts_groups, stop_supervisors
from tandem.plan.ledger import HostLedger
from tandem.plan.status import PlannedVsActual
from tandem.rankplan import RankPlan, launch_plan, placed_groups, plan_ranks
from tandem.readiness import Readiness
from tandem.spec.cluster import Cluster, Transport
from tandem.spec.deployment import Deployment
from tandem.vllm_log import BootFigures, PhaseMark

READY_QUESTION = "What is the capital of France?"
"""Asked through the router once every group joined it."""


def launched_together(backend: str) -> bool:
    """One launch starts every group (a LeaderWorkerSet's ``replicas``), and the controller,
    not tandem, restarts a broken group and keeps the router's members."""
    return backend == Transport.K8S.value


def launch_units(state: DeploymentState) -> list[list[GroupState]]:
    """The groups as they are started and stopped: one at a time on this machine and over
    ssh, all at once on Kubernetes (they share one launch id)."""
    units: dict[str | None, list[GroupState]] = {}
    for group in state.groups:
        key = group.launch_id if launched_together(state.backend) else f"{group.group}"
        units.setdefault(key, []).append(group)
    return list(units.values())


def refuse_if_running(deployment: Deployment, on_event: OnEvent = lambda text: None) -> None:
    """Raise when a deployment of this name has a rank or its router alive, before any
    preflight runs; stop what an interrupted or stopped earlier launch of it left (its ``up``
    killed before ready, ranks that died) and say so.

    The preflight would otherwise report the running deployment's own ports as taken, and the
    ranks a killed ``up`` left hold exactly those ports.
    """
    if deployment.name not in list_deployments():
        return
    state = load_state(deployment.name)
    killed = [g.launcher_pid for g in state.groups if interrupted(g)]
    if state.interrupted() or killed:
        pid = state.launcher_pid or next(iter(killed), None)
        on_event(
            f"an earlier `up` of '{state.name}'"
            + (f" (pid {pid})" if pid else "")
            + " was killed before it became ready: stopping what it left, then starting afresh"
        )
    elif (state.router is not None and state.router.running()) or any(
        backend_for(state.backend).rank_running(g, rank) for g in state.groups for rank in g.ranks
    ):
        raise BackendError(
            f"deployment '{state.name}' is already running at {state.endpoint}",
            hint=f"stop it first with `tandem down {state.name}`",
        )
    elif launched_together(state.backend):  # its objects are kept after a failed start
        raise BackendError(
            f"deployment '{state.name}' already exists: its objects were kept after a failed "
            "start, for inspection",
            hint=f"`tandem logs {state.name}`, then `tandem down {state.name}`",
        )
    else:
        on_event(f"clearing what a stopped earlier run of '{state.name}' left")
    take_down(state, on_event=on_event)


def check_launchable(
    deployment: Deployment, *, supervise: bool = False, ports: bool = True
) -> list[Deployment]:
    """Everything ``up`` refuses before it touches anything, shared with ``up --dry-run`` and
    ``service install``: the deployment must work as a whole (every group placed), fit beside
    the deployments already on its nodes with nothing of theirs clashing
    (``tandem.operations.admission``), and its router be startable here (``ports``: its ports
    free now). Returns the groups.

    Raises:
        PlanError: listing every reason the deployment cannot work, or cannot work beside
            the others.
        BackendError: no router of the pinned version, a router port taken, or ``supervise``
            of a LeaderWorkerSet of several groups (Kubernetes restarts them itself).
    """
    together = launched_together(deployment.cluster.transport.value)
    if supervise and together and deployment.recipe.replicas > 1:
        raise kubernetes_restarts_groups(deployment.name)
    parts = placed_groups(deployment)
    admission.admit(deployment)
    if len(parts) == 1 or together:
        return parts
    spec = deployment.recipe.router
    if problem := routers.version_problem(spec):
        raise BackendError(
            problem,
            field="router.version",
            hint=f"pip install {routers.PACKAGE}=={spec.version} beside tandem",
        )
    if ports and RouterNode.of(deployment.cluster, deployment.name) is None:
        for field in ("port", "metrics_port"):
            if _port_taken(getattr(spec, field)):
                raise BackendError(
                    f"port {getattr(spec, field)} on this machine is already in use",
                    field=f"router.{field}",
                    hint="stop what uses it, or give the router another port",
                )
    return parts


def up(
    deployment: Deployment,
    *,
    preflight: bool = True,
    timeout_s: float | None = None,
    on_phase: OnPhase = lambda mark: None,
    on_event: OnEvent = lambda text: None,
    on_report: Callable[[CheckReport], None] = lambda report: None,
    revision: int | None = None,
) -> tuple[DeploymentState, list[Readiness]]:
    """The launch policy, the same for the CLI and a script: refuse when the deployment already
    runs, run each group's preflight (``tandem.operations.preflight.run_check``) and refuse on
    any error in it, launch the groups on the cluster's backend, each waited for until it
    answers, put the router in front of them, and record the revision.

    Usage:
        state, ready = up(load_deployment("tiny-local"), on_event=print)

    Args:
        preflight: False launches without the checks (``tandem up --skip-checks``).
        on_report: given each preflight's report, whatever it found, before a refusal.
        revision: run this recorded revision again (a rollback of a deployment that is down):
            no new one is recorded.

    Raises:
        BackendError: the deployment is already running, or its router cannot start.
        CheckFailed: a preflight found at least one error; nothing more was launched.
        RankFailed: a rank exited during start-up, it timed out, or the router did not answer.
    """
    refuse_if_running(deployment, on_event)
    parts = check_launchable(deployment)
    unit = [deployment] if launched_together(deployment.cluster.transport.value) else parts
    hosts: dict[str, dict] = {}
    for part in unit if preflight else []:  # every group's, before anything starts
        hosts |= _preflight(part, on_event, on_report)
    with admission.admission_lock():  # judged again: another `up` may have taken room since
        admitted = admission.admit(deployment, record=True)
        state = DeploymentState(
            name=deployment.name,
            backend=deployment.cluster.transport.value,
            recipe=deployment.recipe.model_dump(mode="json"),
            cluster=deployment.cluster.model_dump(mode="json"),
            model=deployment.recipe.model.name_for_clients,
            launcher=ProcessIdentity.current().text(),
            holds=admitted.holds,
        )
        state.write()  # before anything starts: `down` then finds whatever it leaves
    for line in admitted.lines():
        on_event(line)
    try:
        readiness = []
        for index, part in enumerate(unit):
            if len(unit) > 1:
                on_event(f"group {index} ({part.name}): {len(part.cluster.nodes)} node(s)")
            _, ready = start_group(
                state, part, index, timeout_s=timeout_s, on_phase=on_phase, on_event=on_event
            )
            readiness.append(ready)
        state = load_state(deployment.name)
        if len(parts) > 1 and not launched_together(state.backend):
            _front(state, deployment, on_event)
        if revision is None:
            revision = revisions.record(deployment, hosts).number
            on_event(f"recorded as revision {revision} (`tandem history {deployment.name}`)")
        for group in state.groups:
            group.revision = revision
            group.save()
        state.revision, state.ready, state.launcher = revision, True, None
        state.save()
    except BaseException:
        with shielded(on_event):
            _after_failed_up(deployment.name, several=len(unit) > 1, on_event=on_event)
        raise
    return state, readiness


def _after_failed_up(name: str, *, several: bool, on_event: OnEvent) -> None:
    """What a failed ``up`` leaves: one launch's backend has already stopped it (or, on
    Kubernetes, kept its objects for inspection, which the record then names); the groups
    started before a later one failed, and the router, are stopped here."""
    if name not in list_deployments():
        return
    state = load_state(name)
    if several or state.router is not None:
        on_event("start-up failed: stopping every group and the router")
        try:
            take_down(state, on_event=on_event)
        except TandemError as exc:  # what survived stays in the record, for `down`
            on_event(f"left behind: {exc.message}; `tandem down {name}` stops it")
    elif not state.groups:
        state.directory.forget()  # nothing was launched: no phantom deployment


def _preflight(
    part: Deployment, on_event: OnEvent, on_report: Callable[[CheckReport], None]
) -> dict[str, dict]:
    """One group's preflight; its nodes' facts.

    Raises:
        CheckFailed: it found an error.
    """
    report = run_check(part, on_event=on_event)
    on_report(report)
    if not report.ok:
        raise CheckFailed(
            f"refusing to launch '{part.name}': {len(report.errors)} error(s) in the preflight",
            hint="fix them (`tandem check` shows the same findings), then `tandem up` again",
        )
    return report.nodes


def start_group(
    state: DeploymentState,
    part: Deployment,
    index: int,
    *,
    timeout_s: float | None = None,
    on_phase: OnPhase = lambda mark: None,
    on_event: OnEvent = lambda text: None,
) -> tuple[GroupState, Readiness]:
    """Launch group ``index`` of ``state`` from ``part`` (its own deployment, cut by
    ``placed_groups``) and wait until it answers at its own leader."""
    plan = launch_plan(part) if launched_together(state.backend) else plan_ranks(part)
    groups = state.deployment(lenient=True).recipe.replicas
    place = Place.of(state.name, index, 1 if launched_together(state.backend) else groups)
    return backend_for(state.backend).up(
        plan, part, timeout_s=timeout_s, on_phase=on_phase, on_event=on_event, place=place
    )


def _front(state: DeploymentState, deployment: Deployment, on_event: OnEvent) -> None:
    """Start the router, make every group a member, and wait for an answer through it."""
    spec = deployment.recipe.router
    state.router = routers.start(
        spec,
        log=state.directory.router_log,
        node=RouterNode.of(deployment.cluster, deployment.name),
        on_event=on_event,
    )
    state.save()
    for index, group in enumerate(state.groups):
        routers.sync_members(state.router, [g.endpoint for g in state.groups[: index + 1]])
        on_event(f"router: group {group.group} joined ({group.endpoint})")
    answer = _answer_through(state, deployment.recipe.timeouts.request_s)
    on_event(f"router: first answer through it: {answer!r}")


def _answer_through(state: DeploymentState, timeout_s: float) -> str:
    """One real completion through the router, once it counts every group healthy.

    Raises:
        RankFailed: the router does not count them all, or the completion failed.
    """
    assert state.router is not None
    try:
        ready = httpx.get(state.router.url + "/readiness", timeout=10).json()
    except (httpx.HTTPError, ValueError) as exc:
        raise RankFailed(f"the router did not answer /readiness: {exc}") from exc
    if not isinstance(ready, dict) or ready.get("healthy_workers") != len(state.groups):
        raise RankFailed(
            f"the router counts {ready.get('healthy_workers') if isinstance(ready, dict) else 0}"
            f" of {len(state.groups)} groups healthy: {ready}",
            hint=f"see its log {state.router.log}",
        )
    try:
        key = os.environ.get(wire.VLLM_API_KEY)
        with Endpoint(state.router.url, api_key=key, timeout_s=timeout_s) as front:
            body = front.chat(
                state.model,
                [{"role": "user", "content": READY_QUESTION}],
                max_tokens=16,
                temperature=0,
            )
    except EndpointError as exc:
        raise RankFailed(f"no completion through the router: {exc}") from exc
    return str(body["choices"][0]["message"].get("content") or "")


def _port_taken(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((routers.LOOPBACK, port))
        except OSError:
            return True
    return False


def dry_run(deployment: Deployment) -> list[tuple[Deployment, RankPlan, list]]:
    """Each launch's group, rank plan and commands, without running anything: after every
    check ``up`` makes of the deployment before it touches anything (``check_launchable``;
    the router's ports are the machine's now, not the deployment's: ``up`` checks them)."""
    parts = check_launchable(deployment, ports=False)
    backend = backend_for(deployment.cluster.transport.value)
    unit = [deployment] if launched_together(deployment.cluster.transport.value) else parts
    result = []
    for part in unit:
        plan = launch_plan(part)
        result.append((part, plan, backend.launch_commands(plan, part)))
    return result


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
    name: str = Field(description="The name its processes carry (`NAME-gG` with replicas).")
    endpoint: str = Field(description="Its leader's API.")
    verdict: Verdict
    reason: str = ""
    evidence: str = ""
    rank: int | None = Field(default=None, description="The rank its verdict is about.")
    revision: int | None = Field(default=None, description="The revision it runs.")
    member: bool | None = Field(
        default=None, description="In the router's rotation; None without a router."
    )
    ranks: list[RankStatus]
    overview: GroupOverview | None = Field(
        default=None,
        description="The same observation beyond the verdict: the leader's serving figures, "
        "the nodes' readings (with --nodes), the revision and its evidence, events "
        "(tandem.operations.overview).",
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
    ledger: list[HostLedger] = Field(
        default_factory=list,
        description="The memory of each host its nodes draw on, with what every deployment "
        "recorded here holds there by its plan (`tandem.operations.admission`).",
    )


def group_status(
    state: DeploymentState,
    group: GroupState,
    *,
    canary_timeout_s: float = 5.0,
    canary_mode: str = "idle",
    tracker: ProgressTracker | None = None,
    nodes: bool = False,
) -> GroupStatus:
    """One group's verdict (``tandem.operations.health.assess``) and each rank's health; with
    ``nodes`` the one look at its nodes brings their readings too (into its ``overview``)."""
    look = backend_for(state.backend).observe(group, nodes=nodes)
    report = assess(
        group,
        canary_timeout_s=canary_timeout_s,
        canary_mode=canary_mode,
        tracker=tracker,
        look=look,
    )
    health = {r.rank: r for r in report.ranks}
    ranks = [
        RankStatus(
            **r.model_dump(include={"rank", "node", "role", "address", "pid", "netns", "log"}),
            health=health[r.rank].health,
            processes=health[r.rank].processes,
            state="exited" if health[r.rank].health.state is RankCondition.DEAD else "running",
        )
        for r in sorted(group.ranks, key=lambda r: r.rank)
    ]
    leader = group.leader
    endpoint = group.endpoint
    pods_of_one_set = launched_together(state.backend) and len(state.groups) > 1
    if pods_of_one_set and leader is not None:
        port = state.deployment(lenient=True).recipe.ports.api
        endpoint = f"http://{leader.address}:{port}" if leader.address else ""
    return GroupStatus(
        group=group.group,
        name=f"{state.name}-{group.group}" if pods_of_one_set else group.name,
        endpoint=endpoint,
        verdict=report.verdict,
        reason=report.reason,
        evidence=report.evidence,
        rank=report.rank,
        revision=group.revision,
        ranks=ranks,
        overview=group_overview(state, group, report, look, endpoint),
    )


def _router_status(state: DeploymentState) -> RouterStatus | None:
    if state.router is None:
        return None
    alive = state.router.running()
    members: list[str] = []
    if alive:
        try:
            members = routers.members(state.router)
        except BackendError:
            alive = False
    return RouterStatus(
        url=state.router.url,
        policy=state.router.policy,
        version=state.router.version,
        pid=state.router.pid,
        running=alive,
        members=members,
        metrics_url=state.router.metrics_url,
        models=served_models(state.router.url) if alive else None,
    )


def status(
    name: str | None = None,
    *,
    canary_timeout_s: float = 5.0,
    canary_mode: str = "idle",
    tracker: ProgressTracker | None = None,
    trackers: dict[int, ProgressTracker] | None = None,
    nodes: bool = False,
) -> DeploymentStatus:
    """A deployment's verdict, endpoint, and each group's and rank's health.

    One group: that group's verdict. Several: healthy when every group is healthy and in
    rotation; ``degraded`` while at least one group serves; else the worst group's
    (``tandem.operations.health.of_groups``), and ``down`` when the router does not run. A
    caller that looks again and again (``tandem watch``) passes a ``tracker``, so a stall is
    judged over time, and sends canaries only now and then (``canary_mode="never"`` between);
    of a deployment of several groups it keeps one tracker a group in ``trackers`` (by group
    number). With ``nodes`` the look brings each node's readings (``tandem status --nodes``,
    what ``tandem dashboard`` shows).
    """
    state = load_state(name)
    router = _router_status(state)
    parts = []
    for group in state.groups:
        part = group_status(
            state,
            group,
            canary_timeout_s=canary_timeout_s,
            canary_mode=canary_mode,
            tracker=trackers.setdefault(group.group, ProgressTracker())
            if trackers is not None
            else tracker,
            nodes=nodes,
        )
        if router is not None:
            part.member = group.endpoint in router.members
        parts.append(part)
    first = parts[0] if parts else None
    if first is None:
        verdict, reason = Verdict.DOWN, "no group was launched (its `up` did not get that far)"
    elif router is not None and not router.running:
        verdict, reason = Verdict.DOWN, "the router is not running"
    elif len(parts) == 1:
        verdict, reason = first.verdict, first.reason
    else:
        verdict, reason = of_groups(
            [GroupVerdict(p.group, p.verdict, p.reason, p.member is not False) for p in parts]
        )
    lead = state.groups[0] if state.groups else None
    return DeploymentStatus(
        name=state.name,
        backend=state.backend,
        endpoint=state.endpoint,
        model=state.model,
        ready=state.ready,
        verdict=verdict,
        healthy=verdict is Verdict.HEALTHY,
        reason=reason,
        evidence=first.evidence if first is not None and len(parts) == 1 else "",
        rank=first.rank if first is not None and len(parts) == 1 else None,
        ranks=[r for p in parts for r in p.ranks],
        boot=lead.boot if lead else BootFigures(),
        phases=lead.phases if lead else [],
        planned=(lead.planned if lead else None)
        or PlannedVsActual(
            unavailable="not compared: launched by an older tandem, or not ready yet"
        ),
        revision=state.revision,
        upgrade_interrupted=_interrupted_upgrade(state.name),
        groups=parts,
        router=router,
        ledger=admission.ledgers_around(state),
    )


def _interrupted_upgrade(name: str) -> str | None:
    marker = revisions.interrupted_upgrade(name)
    if marker is None:
        return None
    return (
        f"an upgrade from revision {marker.from_revision} was interrupted ({marker.phase}); "
        f"`tandem rollback {name} --to {marker.from_revision}` or `tandem upgrade` again"
    )


def log_lines(
    name: str | None = None,
    *,
    group: int | None = None,
    rank: int | None = None,
    follow: bool = False,
    tail: int | None = None,
    sleep: Callable[[float], None] | None = None,
) -> Iterator[tuple[int, int, str]]:
    """(group, rank, line) of the ranks' logs; with ``follow``, keeps yielding new lines."""
    state = load_state(name)
    backend: Backend = backend_for(state.backend)
    groups = [state.group(group)] if group is not None else state.groups
    ranks = [
        (g, r)
        for g in groups
        for r in sorted(g.ranks, key=lambda r: r.rank)
        if rank is None or r.rank == rank
    ]
    if not ranks:
        numbers = ", ".join(str(r.rank) for g in groups for r in g.ranks) or "none"
        raise BackendError(
            f"deployment '{state.name}' has no rank {rank}", hint=f"its ranks: {numbers}"
        )
    readers = {(g.group, r.rank): backend.log_reader(g, r) for g, r in ranks}
    for (g, r), reader in readers.items():
        lines = reader.new_lines()
        for line in lines if tail is None else lines[len(lines) - tail :]:
            yield g, r, line
    while follow:
        (sleep or time.sleep)(0.5)
        for (g, r), reader in readers.items():
            for line in reader.new_lines():
                yield g, r, line


def sweep_leftovers(on_event: OnEvent = lambda text: None) -> int:
    """Remove the networks killed commands left on this machine; how many there were."""
    if os.geteuid() != 0:
        return 0
    before = len(netns.ledger())
    leftovers = netns.sweep_orphans(on_event)
    if leftovers:
        raise BackendError("could not remove what a killed command left: " + "; ".join(leftovers))
    return before - len(netns.ledger())


def take_down(state: DeploymentState, *, on_event: OnEvent = lambda text: None) -> None:
    """Stop the router, then every group's launch, and forget the deployment (logs are kept).

    Only what the record names is touched: the router by its pid and start time, each group by
    its own launch id.

    Raises:
        BackendError: something of it survived (the record then stays, for a later ``down``).
    """
    if state.router is not None and routers.stop(state.router):
        where = f" on {state.router.node.node}" if state.router.node else ""
        on_event(f"stopped the router (pid {state.router.pid}{where})")
    failures = []
    backend = backend_for(state.backend)
    for unit in launch_units(state):
        try:
            backend.down(unit[0], on_event=on_event)
        except BackendError as exc:
            failures.append(f"group {unit[0].group}: {exc.message}")
    if failures:
        raise BackendError(
            "could not stop every group: " + "; ".join(failures),
            hint=f"`tandem down {state.name}` again",
        )
    state.directory.forget()


def down(
    name: str | None = None, *, purge_caches: bool = False, on_event: OnEvent = lambda text: None
) -> DeploymentState | None:
    """Stop every group and the router, remove what up created, and forget the deployment
    (logs and revisions are kept).

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
    if stop_supervisors(state.name, on_event=on_event):  # or they restart what we stop
        state = load_state(state.name)  # a restart in progress may have launched anew
    take_down(state, on_event=on_event)
    if purge_caches:
        for group in state.groups:
            purge_compile_caches(
                group.name, group.deployment(lenient=True).cluster, on_event=on_event
            )
    return state


def purge_compile_caches(
    name: str, cluster: Cluster | None, *, on_event: OnEvent = lambda text: None
) -> None:
    """Remove every rank's compile cache root of ``name`` (a group's launch name) on the
    cluster's nodes (None: this machine).

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
