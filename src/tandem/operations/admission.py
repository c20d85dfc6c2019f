"""Admission of one more deployment beside those already on the same nodes: memory by the
plans, and every port, subnet, core and model name apart.

``up`` (and ``up --dry-run``, through ``lifecycle.check_launchable``) asks ``admit`` before
anything starts. The others are every deployment recorded under this state root
(``$TANDEM_HOME``), running or starting; what each holds per node is what its ``up`` recorded
from its plan (``DeploymentState.holds``), else its saved recipe and cluster planned again.
Memory on a node that someone else's state root or another program holds is what the node
agent reads free: the preflight's ``memory-headroom`` rule judges that, after this.

Checks, in order, each a ``Problem`` with the field to change and the fix, all reported at once:

1. memory: ``tandem.plan.ledger.shortfalls`` on every host shared with another deployment;
2. ports: the leader's API and rendezvous ports, the router's two, and the front door's, where
   they share an address (a local cluster's namespaces each have their own);
3. subnets: a local cluster's namespaces against the others' (the fix names a subnet free of
   every network tandem made on this machine, ``/run/tandem/networks``, whatever the state
   root; a network of another state root is refused when the namespaces are made);
4. cores: a local node's ``cpus`` and ``VLLM_CPU_OMP_THREADS_BIND`` against the others' nodes;
5. the model name clients send: one endpoint routes by it (``tandem front``), so two
   deployments never serve one name.

Compile caches are each group's own by name (``caches/NAME/``), so they cannot clash.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
from collections.abc import Iterator

from pydantic import BaseModel, Field, ValidationError

from tandem import files, wire
from tandem.backends import front_door, netns
from tandem.backends.state import (
    DeploymentDir,
    DeploymentState,
    list_deployments,
    load_state,
    state_root,
)
from tandem.errors import PlanError, Problem, TandemError
from tandem.operations.preflight import memory_plan
from tandem.plan.ledger import THIS_MACHINE, HostLedger, NodeHold, holds_of, ledgers, shortfalls
from tandem.plan.planner import Plan
from tandem.plan.status import launched_plan
from tandem.spec.cluster import LocalIsolation, Node, Transport, cpu_list, cpu_text
from tandem.spec.deployment import Deployment, groups


class Admission(BaseModel):
    """What ``up`` prints when it admits a deployment beside others."""

    deployment: str
    holds: list[NodeHold] = Field(default_factory=list, description="Its own, by its plan.")
    ledgers: list[HostLedger] = Field(
        default_factory=list, description="Each host it shares with another deployment."
    )
    apart: list[str] = Field(
        default_factory=list, description="What was checked apart from the others, one line each."
    )
    notes: list[str] = Field(default_factory=list)

    def lines(self) -> list[str]:
        """What ``up`` says of it: nothing for a deployment alone on its nodes."""
        if not (self.ledgers or self.apart or self.notes):
            return []
        beside = sorted({h.deployment for lg in self.ledgers for h in lg.holds} - {self.deployment})
        head = f"admitted beside {', '.join(beside)}" if beside else "admitted"
        return [
            *(f"{head}: {ledger.line()}" for ledger in self.ledgers),
            *(f"{head}: {text}" for text in self.apart),
            *self.notes,
        ]


def others(name: str | None = None) -> list[DeploymentState]:
    """Every deployment recorded under this state root but ``name`` (an unreadable record is
    left out: ``tandem status`` names it)."""
    found = []
    for other in list_deployments():
        if other == name:
            continue
        with contextlib.suppress(TandemError):
            found.append(load_state(other))
    return found


def planned_holds(deployment: Deployment) -> list[NodeHold]:
    """What ``deployment``'s plan holds on each node; none when it cannot be planned."""
    plan, _, _ = memory_plan(deployment)
    return holds_of(deployment, plan) if plan is not None else []


def recorded_holds(state: DeploymentState) -> list[NodeHold]:
    """What ``state`` holds per node: as its ``up`` recorded it, else its saved recipe and
    cluster planned again, else each node with nothing known (``known`` false)."""
    if state.holds:
        return state.holds
    deployment = state.deployment(lenient=True)
    try:
        return holds_of(deployment, launched_plan(state.recipe, state.cluster))
    except (TandemError, ValidationError):
        return [
            NodeHold(
                deployment=state.name,
                node=node.name,
                host=node.address
                if deployment.cluster.transport is not Transport.LOCAL
                else THIS_MACHINE,
                budget_bytes=0,
                kv_pool_bytes=0,
                weights_bytes=0,
                total_bytes=0,
                term="unknown",
                known=False,
            )
            for node in deployment.cluster.nodes
        ]


def ledgers_around(state: DeploymentState) -> list[HostLedger]:
    """The memory of every host ``state``'s nodes draw on, with what each deployment recorded
    here holds there (``tandem status``'s ``ledger``)."""
    every = {s.name: recorded_holds(s) for s in [state, *others(state.name)]}
    hosts = {h.host for h in every[state.name]}
    return [lg for lg in ledgers(h for hs in every.values() for h in hs) if lg.host in hosts]


@contextlib.contextmanager
def admission_lock() -> Iterator[None]:
    """One admission at a time under this state root: from the check to the record that
    holds its memory, so two ``up`` s at once cannot both take the last room."""
    with files.locked(state_root() / "admission.lock"):
        yield


def admit(deployment: Deployment, *, record: bool = False) -> Admission:
    """Judge ``deployment`` beside every other deployment recorded here (module docstring).
    The plan is made only when another deployment runs, or to ``record`` what this one holds.

    Raises:
        PlanError: it does not fit, or something of it clashes; every problem listed.
    """
    running = others(deployment.name)
    plan: Plan | None = None
    why_not = None
    if running or record:
        plan, why_not, refused = memory_plan(deployment)
        why_not = why_not or (refused.message if refused else None)
    admission = Admission(
        deployment=deployment.name, holds=holds_of(deployment, plan) if plan else []
    )
    problems: list[Problem] = []
    if running and plan is None:
        admission.notes.append(f"memory not admitted beside the others: {why_not}")
    theirs = [h for state in running for h in recorded_holds(state)]
    mine_hosts = {h.host for h in admission.holds}
    admission.ledgers = [
        ledger
        for ledger in ledgers([*theirs, *admission.holds])
        if ledger.host in mine_hosts and len({h.deployment for h in ledger.holds}) > 1
    ]
    short = shortfalls(admission.holds, theirs, plan) if plan is not None else []
    problems += [Problem(_term_field(s.term), s.message, s.fix) for s in short]
    problems += _port_problems(deployment, running, admission)
    problems += _subnet_problems(deployment, running, admission)
    problems += _core_problems(deployment, running, admission)
    problems += _name_problems(deployment, running)
    if problems:
        raise PlanError(
            f"'{deployment.name}' cannot run beside "
            f"{', '.join(s.name for s in running) or 'what runs here'}",
            problems=problems,
            node=short[0].node if short else None,
            hint="change what each problem names, or `tandem down` a deployment that "
            "holds it (`tandem status` lists them with the memory of every node)",
        )
    return admission


def _term_field(term: str) -> str:
    return f"env.{term}" if term == wire.VLLM_CPU_KVCACHE_SPACE else f"engine.serve.{term}"


class _Port(BaseModel):
    deployment: str
    where: str
    port: int
    field: str


def port_claims(deployment: Deployment) -> list[_Port]:
    """The ports each group's leader, the router and nothing else of ``deployment`` listen on,
    by address (a local namespace's own address; this machine for loopback and the router)."""
    cluster, recipe = deployment.cluster, deployment.recipe
    if cluster.transport is Transport.K8S:
        return []
    loopback = (
        cluster.transport is Transport.LOCAL and cluster.local.isolation is not LocalIsolation.NETNS
    )
    claims: list[_Port] = []

    def claim(where: str, field: str, port: int) -> None:
        claims.append(_Port(deployment=deployment.name, where=where, port=port, field=field))

    for part in groups(deployment):
        leader = part.cluster.nodes[0]
        where = THIS_MACHINE if loopback else leader.address
        claim(where, "ports.api", recipe.ports.api)
        claim(where, "ports.master", recipe.ports.master)
    if recipe.replicas > 1:
        node = cluster.ssh.router_node if cluster.transport is Transport.SSH else None
        where = next((n.address for n in cluster.nodes if n.name == node), THIS_MACHINE)
        claim(where, "router.port", recipe.router.port)
        claim(where, "router.metrics_port", recipe.router.metrics_port)
    return claims


def _port_problems(
    deployment: Deployment, running: list[DeploymentState], admission: Admission
) -> list[Problem]:
    mine = port_claims(deployment)
    door = None
    theirs = [c for s in running for c in port_claims(s.deployment(lenient=True))]
    with contextlib.suppress(TandemError):
        door = front_door.read()
    if door is not None:
        theirs.append(_Port(deployment="the front door", where=THIS_MACHINE, port=door.port,
                            field="port"))  # fmt: skip
    taken = {(c.where, c.port) for c in theirs}
    problems = []
    for claim in mine:
        holder = next((c for c in theirs if (c.where, c.port) == (claim.where, claim.port)), None)
        if holder is None:
            continue
        free = next(p for p in range(claim.port + 1, 65536) if (claim.where, p) not in taken)
        problems.append(
            Problem(
                claim.field,
                f"port {claim.port} on {claim.where} is {holder.deployment}'s ({holder.field})",
                f"set {claim.field}: {free} (free of every deployment here)",
            )
        )
    if mine and theirs and not problems:
        shown = ", ".join(sorted({f"{c.field} {c.port} on {c.where}" for c in mine}))
        admission.apart.append(f"ports apart from the others': {shown}")
    return problems


def _machine_networks(own_state: str) -> list[tuple[str, str]]:
    """(who, subnet) of every network tandem made on this machine, from any state root."""
    seen: list[tuple[str, str]] = []
    for entry in netns.ledger():
        if entry.state_file == own_state:
            continue
        net = ipaddress.ip_network(f"{entry.plan.bridge_address}/{entry.plan.prefix}", strict=False)
        seen.append((entry.purpose or f"bridge {entry.plan.bridge}", str(net)))
    return seen


def _networks(running: list[DeploymentState]) -> list[tuple[str, str]]:
    """(who, subnet) of the networks the others recorded here made."""
    seen: list[tuple[str, str]] = []
    for state in running:
        for group in state.groups:
            if group.network.get("bridge_address"):
                net = ipaddress.ip_network(
                    f"{group.network['bridge_address']}/{group.network['prefix']}", strict=False
                )
                seen.append((f"deployment '{state.name}'", str(net)))
    return seen


def _subnet_problems(
    deployment: Deployment, running: list[DeploymentState], admission: Admission
) -> list[Problem]:
    cluster = deployment.cluster
    if cluster.transport is not Transport.LOCAL or cluster.local.isolation is not (
        LocalIsolation.NETNS
    ):
        return []
    seen = _networks(running)
    mine = [ipaddress.ip_network(p.cluster.local.subnet) for p in groups(deployment)]
    problems = []
    for subnet in mine:
        holder = next(
            (who for who, net in seen if ipaddress.ip_network(net).overlaps(subnet)), None
        )
        if holder is None:
            continue
        own_state = str(DeploymentDir.of(deployment.name).state_file.resolve())
        free = _free_subnet(subnet, seen + _machine_networks(own_state), mine)
        problems.append(
            Problem(
                "local.subnet",
                f"subnet {subnet} overlaps {holder}'s network on this machine",
                f"set local.subnet: {free} (free on this machine now) and node addresses in it",
            )
        )
    if seen and not problems:
        admission.apart.append(
            f"subnet(s) {', '.join(str(s) for s in mine)} apart from the others'"
        )
    return problems


def _free_subnet(
    wanted: ipaddress.IPv4Network | ipaddress.IPv6Network,
    seen: list[tuple[str, str]],
    mine: list,
) -> str:
    """The first subnet of ``wanted``'s size after it that overlaps nothing known, leaving room
    for every group of the deployment."""
    taken = [ipaddress.ip_network(net) for _, net in seen]
    step = wanted.num_addresses
    for k in range(1, 256):
        start = int(wanted.network_address) + k * step
        block = [
            ipaddress.ip_network((start + g * step, wanted.prefixlen)) for g in range(len(mine))
        ]
        if not any(b.overlaps(t) for b in block for t in taken):
            return str(block[0])
    return "another private subnet"


def node_cores(node: Node, env: dict[str, str]) -> set[int] | None:
    """The cores a local node's processes run on (``cpus``), else its CPU worker binds
    (``VLLM_CPU_OMP_THREADS_BIND``), else None (any core)."""
    for value in (node.cpus, node.env.get(wire.VLLM_CPU_OMP_THREADS_BIND),
                  env.get(wire.VLLM_CPU_OMP_THREADS_BIND)):  # fmt: skip
        if value:
            with contextlib.suppress(ValueError):
                return cpu_list(value)
    return None


def _core_problems(
    deployment: Deployment, running: list[DeploymentState], admission: Admission
) -> list[Problem]:
    if deployment.cluster.transport is not Transport.LOCAL:
        return []
    held: list[tuple[str, str, set[int]]] = []
    for state in running:
        other = state.deployment(lenient=True)
        if other.cluster.transport is Transport.LOCAL:
            for node in other.cluster.nodes:
                cores = node_cores(node, other.recipe.env)
                if cores:
                    held.append((state.name, node.name, cores))
    taken = set().union(*(cores for _, _, cores in held)) if held else set()
    free = set(range(os.cpu_count() or 1)) - taken
    problems = []
    for i, node in enumerate(deployment.cluster.nodes):
        cores = node_cores(node, deployment.recipe.env)
        clash = [(who, name, c & cores) for who, name, c in held if cores and c & cores]
        if not clash:
            continue
        who, name, shared = clash[0]
        problems.append(
            Problem(
                f"nodes[{i}].cpus",
                f"node {node.name} runs on core(s) {cpu_text(shared)}, which node {name} of "
                f"'{who}' runs on",
                f"set cpus and {wire.VLLM_CPU_OMP_THREADS_BIND} of node {node.name} to "
                f"'{cpu_text(free)}' (the cores no other deployment holds)"
                if free
                else "every core of this machine is held by another deployment: stop one, or "
                "leave this node's cores unset to share them",
            )
        )
    if held and not problems:
        mine = [node_cores(n, deployment.recipe.env) for n in deployment.cluster.nodes]
        shown = ", ".join(cpu_text(c) for c in mine if c) or "unpinned"
        admission.apart.append(f"cores {shown} apart from the others' {cpu_text(taken)}")
    return problems


def _name_problems(deployment: Deployment, running: list[DeploymentState]) -> list[Problem]:
    name = deployment.recipe.model.name_for_clients
    holder = next((s for s in running if s.model == name), None)
    if holder is None:
        return []
    return [
        Problem(
            "model.served_name",
            f"deployment '{holder.name}' already serves the model name '{name}'; one endpoint "
            "routes by that name",
            f"set model.served_name: {deployment.name}",
        )
    ]
