"""A deployment of several groups behind one front door: up, status, down.

One group stays the unit of launch, health and restart. With ``replicas: N`` each group is a
deployment of its own (``tandem.spec.deployment.groups``: ``NAME-gG`` on its own nodes, with
its own rank plan, state, logs and caches), launched, judged and stopped by the same code as a
deployment of one group (``tandem.operations.lifecycle``). This module adds what the groups share:
vLLM's router in front (``tandem.backends.router``), and the fleet's record ``fleet.json`` in the
deployment's folder, written before the first group starts, so that ``down`` finds everything an
interrupted ``up`` left.

Membership follows tandem's verdict: a group joins the router only after it answered a real
completion at its own leader, and the deployment is ``degraded``, not ``down``, while at least
one member serves.

A name without replicas passes straight through to ``tandem.operations.lifecycle``, so the CLI asks
this module about every deployment.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable

import httpx

from tandem import ownership, wire
from tandem.backends import router as routers
from tandem.backends.base import OnEvent, OnPhase
from tandem.backends.processes import ProcessIdentity
from tandem.backends.router_node import RouterNode
from tandem.backends.state import (
    DeploymentState,
    FleetState,
    fleet_exists,
    list_deployments,
    load_fleet,
    load_state,
)
from tandem.check.findings import CheckReport
from tandem.endpoint import Endpoint
from tandem.errors import BackendError, EndpointError, RankFailed, StateError
from tandem.operations import lifecycle
from tandem.operations.health import GroupVerdict, ProgressTracker, Verdict, of_groups
from tandem.operations.overview import served_models
from tandem.rankplan import placed_groups
from tandem.spec.cluster import Transport
from tandem.spec.deployment import Deployment
from tandem.vllm_log import BootFigures

READY_QUESTION = "What is the capital of France?"


def launched_by_group(deployment: Deployment) -> bool:
    """Whether ``up`` launches each group as a deployment of its own and starts the router
    itself (replicas on this machine or over ssh). On Kubernetes one apply starts every group
    (the LeaderWorkerSet's ``replicas``) and the router's Deployment: one deployment."""
    return deployment.recipe.replicas > 1 and deployment.cluster.transport is not Transport.K8S


def front_door(name: str | None) -> tuple[str, str]:
    """Where clients of deployment ``name`` send requests, and the model they name: the
    router of a deployment with replicas, else the leader.

    Raises:
        StateError: no such deployment, or its router was never started.
    """
    if name is not None and fleet_exists(ownership.check_name(name)):
        fleet = load_fleet(name)
        if fleet.router is None:
            raise StateError(
                f"'{name}' has no router yet (its `up` did not get that far)",
                hint=f"`tandem down {name}`, then `tandem up` again",
            )
        return fleet.router.url, fleet.model
    state = load_state(name)
    return state.endpoint, state.model


def _api_key() -> str | None:
    return os.environ.get(wire.VLLM_API_KEY)


def up(
    deployment: Deployment,
    *,
    preflight: bool = True,
    timeout_s: float | None = None,
    on_phase: OnPhase = lambda mark: None,
    on_event: OnEvent = lambda text: None,
    on_report: Callable[[CheckReport], None] = lambda report: None,
) -> FleetState:
    """Start every group (preflight and all, as ``tandem.operations.lifecycle.up``), then the
    router, add each group to it, and wait for a real completion through the router.

    Everything is refused before anything starts when the fleet already runs, the pinned
    router is not installed, or its ports are taken; on any failure or interruption every
    group started so far and the router are stopped.

    Raises:
        BackendError: already running, no router of the pinned version, a port taken.
        CheckFailed: a group's preflight found an error.
        RankFailed: a group did not become ready, or the router did not answer.
    """
    name = deployment.name
    spec = deployment.recipe.router
    parts = placed_groups(deployment)
    if fleet_exists(name):
        previous = load_fleet(name)
        if previous.interrupted():
            on_event(f"an earlier `up` of '{name}' was killed before it was ready: stopping it")
            down(name, on_event=on_event)
        else:
            raise BackendError(
                f"deployment '{name}' is already running behind its router",
                hint=f"stop it first with `tandem down {name}`",
            )
    if problem := routers.version_problem(spec):
        raise BackendError(
            problem,
            field="router.version",
            hint=f"pip install {routers.PACKAGE}=={spec.version} beside tandem",
        )
    node = RouterNode.of(deployment.cluster, name)
    for field in ("port", "metrics_port") if node is None else ():
        port = getattr(spec, field)
        if _port_taken(port):
            raise BackendError(
                f"port {port} on this machine is already in use",
                field=f"router.{field}",
                hint="stop what uses it, or give the router another port",
            )
    fleet = FleetState(
        name=name,
        groups=[g.name for g in parts],
        model=deployment.recipe.model.name_for_clients,
        launcher=ProcessIdentity.current().text(),
    )
    fleet.save()
    try:
        states: list[DeploymentState] = []
        for index, group in enumerate(parts):
            on_event(f"group {index} ({group.name}): {len(group.cluster.nodes)} node(s)")
            state, _ = lifecycle.up(
                group,
                preflight=preflight,
                timeout_s=timeout_s,
                on_phase=on_phase,
                on_event=on_event,
                on_report=on_report,
            )
            states.append(state)
        fleet.router = routers.start(
            spec, log=fleet.directory.router_log, node=node, on_event=on_event
        )
        fleet.save()
        for index, state in enumerate(states):
            routers.add(fleet.router, state.endpoint)
            on_event(f"router: group {index} joined ({state.endpoint})")
        answer = _answer_through(fleet, deployment.recipe.timeouts.request_s)
        on_event(f"router: first answer through it: {answer!r}")
        fleet.ready = True
        fleet.launcher = None
        fleet.save()
    except BaseException:
        on_event("start-up of the fleet failed: stopping every group and the router")
        down(name, on_event=on_event)
        raise
    return fleet


def _answer_through(fleet: FleetState, timeout_s: float) -> str:
    """One real completion through the router, once it counts every group healthy.

    Raises:
        RankFailed: the router does not count them all, or the completion failed.
    """
    assert fleet.router is not None
    try:
        ready = httpx.get(fleet.router.url + "/readiness", timeout=10).json()
    except (httpx.HTTPError, ValueError) as exc:
        raise RankFailed(f"the router did not answer /readiness: {exc}") from exc
    if ready.get("healthy_workers") != len(fleet.groups):
        raise RankFailed(
            f"the router counts {ready.get('healthy_workers')} of {len(fleet.groups)} groups "
            f"healthy: {ready}",
            hint=f"see its log {fleet.router.log}",
        )
    try:
        with Endpoint(fleet.router.url, api_key=_api_key(), timeout_s=timeout_s) as front:
            body = front.chat(
                fleet.model,
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


def status(
    name: str | None = None,
    *,
    trackers: dict[str, ProgressTracker] | None = None,
    **kwargs: object,
) -> lifecycle.DeploymentStatus:
    """The deployment's verdict with each group's (``tandem.operations.lifecycle.status`` per
    group) and the router's members. Healthy when every group is healthy and in rotation;
    ``degraded`` while at least one group serves in rotation; else the worst group's verdict.

    ``trackers``: a caller that looks again and again (``tandem dashboard``) keeps one
    progress tracker per group here, by group name, so a stall is judged over time.
    """
    if name is None or not fleet_exists(name):
        if trackers is not None:
            kwargs["tracker"] = trackers.setdefault(name or "", ProgressTracker())
        return lifecycle.status(name, **kwargs)  # type: ignore[arg-type]
    fleet = load_fleet(name)
    running = list_deployments()
    members: list[str] = []
    router_status = None
    if fleet.router is not None:
        alive = fleet.router.running()
        if alive:
            try:
                members = routers.members(fleet.router)
            except BackendError:
                alive = False
        router_status = lifecycle.RouterStatus(
            url=fleet.router.url,
            policy=fleet.router.policy,
            version=fleet.router.version,
            pid=fleet.router.pid,
            running=alive,
            members=members,
            metrics_url=fleet.router.metrics_url,
            models=served_models(fleet.router.url) if alive else None,
        )
    parts: list[lifecycle.GroupStatus] = []
    for index, group_name in enumerate(fleet.groups):
        if group_name not in running:
            parts.append(
                lifecycle.GroupStatus(
                    group=index,
                    name=group_name,
                    endpoint="",
                    verdict=Verdict.DOWN,
                    reason="not running (no state)",
                    member=False,
                    ranks=[],
                )
            )
            continue
        if trackers is not None:
            kwargs["tracker"] = trackers.setdefault(group_name, ProgressTracker())
        one = lifecycle.status(group_name, **kwargs)  # type: ignore[arg-type]
        parts.append(
            one.groups[0].model_copy(update={"group": index, "member": one.endpoint in members})
        )
    if router_status is None or not router_status.running:
        verdict, reason = Verdict.DOWN, "the router is not running"
    else:
        verdict, reason = of_groups(
            [GroupVerdict(g.group, g.verdict, g.reason, bool(g.member)) for g in parts]
        )
    return lifecycle.DeploymentStatus(
        name=fleet.name,
        backend="local",
        endpoint=fleet.router.url if fleet.router else "",
        model=fleet.model,
        ready=fleet.ready,
        verdict=verdict,
        healthy=verdict is Verdict.HEALTHY,
        reason=reason,
        ranks=[],
        boot=BootFigures(),
        phases=[],
        groups=parts,
        router=router_status,
    )


def down(
    name: str | None = None, *, purge_caches: bool = False, on_event: OnEvent = lambda text: None
) -> None:
    """Stop the router, then every group (``tandem.operations.lifecycle.down``), and forget the
    fleet.

    A name without replicas is ``tandem.operations.lifecycle.down``. Only what the fleet's record
    names is touched: the router by its pid and start time, the groups by their own state.
    """
    if name is None or not fleet_exists(ownership.check_name(name)):
        lifecycle.down(name, purge_caches=purge_caches, on_event=on_event)
        return
    fleet = load_fleet(name)
    if fleet.router is not None and routers.stop(fleet.router):
        where = f" on {fleet.router.node.node}" if fleet.router.node else ""
        on_event(f"stopped the router (pid {fleet.router.pid}{where})")
    running = list_deployments()
    failures = []
    for group_name in fleet.groups:
        if group_name not in running:
            continue
        try:
            lifecycle.down(group_name, purge_caches=purge_caches, on_event=on_event)
        except BackendError as exc:
            failures.append(f"{group_name}: {exc}")
    if failures:
        raise BackendError(
            "could not stop every group: " + "; ".join(failures),
            hint=f"`tandem down {name}` again",
        )
    fleet.directory.fleet_file.unlink(missing_ok=True)
