"""The memory ledger of the hosts several deployments share: what each holds per node, by the
plan, and whether one more fits beside them.

A node of a cluster is a place to run ranks; a *host* is the memory they draw on. The nodes of
a local cluster are all this machine (one host, whatever the namespaces), a node of an ssh
cluster is the host at its address, and on this machine a GPU named by ``CUDA_VISIBLE_DEVICES``
is a host of its own (discrete memory). On unified memory (GB10, vLLM's CPU backend) the host's
memory is the node's memory: what sits outside vLLM's budget there (the OS, page cache and CUDA
context, ``outside``) is counted once per host, not once per deployment.

The rule (``shortfalls``), for every host the new deployment uses::

    held by the others' plans + the new one's budget + outside (once) <= the host's memory

where a deployment's budget on a host is its plan's per-rank budget (vLLM's
``gpu_memory_utilization`` x the device's memory, or weights + ``VLLM_CPU_KVCACHE_SPACE`` on the
CPU backend) times its ranks there. vLLM counts ``gpu_memory_utilization`` against the whole
device, not what is free, so the budgets add up as written. A shortfall names the node, the
term of the new deployment that sizes its budget, by how much it is over, and the change that
makes it fit (``fix_of``). Pure: the caller passes the plans and what the others recorded.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from pydantic import BaseModel, Field

from tandem import wire
from tandem.plan.memory import GIB
from tandem.plan.planner import Plan
from tandem.spec.cluster import Node, Transport
from tandem.spec.deployment import Deployment

THIS_MACHINE = "this machine"
"""The host of every node of a local cluster."""


class NodeHold(BaseModel):
    """What one deployment's plan holds on one of its nodes (``status --json``'s ``holds``, and
    the record's, so that a later ``up`` beside it counts it)."""

    deployment: str
    node: str = Field(description="The node's name in that deployment's cluster.")
    host: str = Field(description="The memory it draws on: `this machine`, or the node's address.")
    ranks: int = Field(default=1, description="Its ranks on the node.")
    budget_bytes: int = Field(
        description="vLLM's budget of those ranks: weights, reserves and KV pool."
    )
    kv_pool_bytes: int = Field(description="Of which the KV pool.")
    weights_bytes: int = Field(description="Of which the weights.")
    outside_bytes: int = Field(
        default=0, description="Unified memory: what runs outside vLLM's budget on the host."
    )
    total_bytes: int = Field(description="The host's memory, as the plan knows the hardware.")
    term: str = Field(
        description="The setting that sizes its budget: `VLLM_CPU_KVCACHE_SPACE` (CPU) or "
        "`gpu_memory_utilization`."
    )
    known: bool = Field(default=True, description="False: launched without a plan; 0 counted.")


class HostLedger(BaseModel):
    """One host: its memory and what every deployment on it holds by plan."""

    host: str
    total_bytes: int
    outside_bytes: int = 0
    holds: list[NodeHold] = Field(default_factory=list)

    @property
    def used_bytes(self) -> int:
        return sum(h.budget_bytes for h in self.holds) + self.outside_bytes

    @property
    def left_bytes(self) -> int:
        return self.total_bytes - self.used_bytes

    def line(self) -> str:
        """``this machine: 16.00 GiB; a 1.28 + b 1.52 planned, 13.20 GiB left``."""
        held = " + ".join(
            f"{h.deployment} {h.budget_bytes / GIB:.2f}" if h.known else f"{h.deployment} ?"
            for h in self.holds
        )
        outside = f" + outside {self.outside_bytes / GIB:.2f}" if self.outside_bytes else ""
        return (
            f"{self.host}: {self.total_bytes / GIB:.2f} GiB; {held or 'nothing'}{outside} "
            f"planned, {self.left_bytes / GIB:.2f} GiB left"
        )


class Shortfall(BaseModel):
    """The new deployment does not fit beside the others on one host."""

    host: str
    node: str = Field(description="The new deployment's node on that host.")
    term: str
    over_bytes: int
    message: str
    fix: str


def host_of(deployment: Deployment, node: Node, gpu: bool) -> str:
    """The memory ``node`` of ``deployment`` draws on (see the module docstring)."""
    cluster = deployment.cluster
    if cluster.transport is Transport.LOCAL:
        devices = node.env.get("CUDA_VISIBLE_DEVICES")
        return f"{THIS_MACHINE}, GPU {devices}" if gpu and devices else THIS_MACHINE
    return node.address


def holds_of(deployment: Deployment, plan: Plan) -> list[NodeHold]:
    """Per node of ``deployment``, what its plan holds there; none on Kubernetes, where the
    scheduler, not tandem, places the pods."""
    if deployment.cluster.transport is Transport.K8S:
        return []
    memory, settings = plan.memory, plan.settings
    cpu = settings.cpu_kv_cache_space_gib is not None or plan.hardware == "cpu"
    gpu = not cpu
    unified = memory.outside_budget_bytes > 0 or cpu
    term = wire.VLLM_CPU_KVCACHE_SPACE if cpu else "gpu_memory_utilization"
    holds = []
    for node in deployment.cluster.nodes:
        ranks = max(node.gpus, 1) if gpu else 1
        holds.append(
            NodeHold(
                deployment=deployment.name,
                node=node.name,
                host=host_of(deployment, node, gpu),
                ranks=ranks,
                budget_bytes=memory.budget_bytes * ranks,
                kv_pool_bytes=max(memory.kv_pool_bytes, 0) * ranks,
                weights_bytes=memory.weights_bytes_per_rank * ranks,
                outside_bytes=memory.outside_budget_bytes,
                total_bytes=memory.memory_total_bytes * (1 if unified else ranks),
                term=term,
            )
        )
    return holds


def ledgers(holds: Iterable[NodeHold]) -> list[HostLedger]:
    """The holds by host (each host's by deployment name): a host's memory is the largest any
    plan on it knows (the new one's when it alone knows it), and what runs outside the budget is
    counted once."""
    by_host: dict[str, HostLedger] = {}
    for hold in holds:
        ledger = by_host.setdefault(hold.host, HostLedger(host=hold.host, total_bytes=0))
        ledger.holds.append(hold)
        ledger.total_bytes = max(ledger.total_bytes, hold.total_bytes)
        ledger.outside_bytes = max(ledger.outside_bytes, hold.outside_bytes)
    for ledger in by_host.values():
        ledger.holds.sort(key=lambda h: (h.deployment, h.node))
    return sorted(by_host.values(), key=lambda ledger: ledger.host)


def shortfalls(new: list[NodeHold], others: list[NodeHold], plan: Plan) -> list[Shortfall]:
    """Each host where ``new`` (one deployment's holds, planned by ``plan``) does not fit
    beside ``others``; nothing where it does, or where no other deployment runs."""
    shared = {h.host for h in others} & {h.host for h in new}
    result = []
    for ledger in ledgers([*others, *new]):
        if ledger.host not in shared or ledger.left_bytes >= 0:
            continue
        mine = [h for h in ledger.holds if h.deployment == new[0].deployment]
        theirs = [h for h in ledger.holds if h.deployment != new[0].deployment]
        room = ledger.total_bytes - ledger.outside_bytes - sum(h.budget_bytes for h in theirs)
        beside = ", ".join(f"{h.deployment} {h.budget_bytes / GIB:.2f} GiB" for h in theirs)
        term = mine[0].term
        outside = (
            f" with {ledger.outside_bytes / GIB:.2f} GiB outside vLLM"
            if ledger.outside_bytes
            else ""
        )
        result.append(
            Shortfall(
                host=ledger.host,
                node=mine[0].node,
                term=term,
                over_bytes=-ledger.left_bytes,
                message=f"node {mine[0].node} ({ledger.host}): {_term_text(plan)} of "
                f"'{mine[0].deployment}' does not fit beside {beside}: "
                f"{ledger.used_bytes / GIB:.2f} GiB planned{outside} of "
                f"{ledger.total_bytes / GIB:.2f} GiB, {-ledger.left_bytes / GIB:.2f} GiB over",
                fix=fix_of(plan, room, sum(h.ranks for h in mine)),
            )
        )
    return result


def _term_text(plan: Plan) -> str:
    settings = plan.settings
    if settings.cpu_kv_cache_space_gib is not None:
        return (
            f"the KV pool ({wire.VLLM_CPU_KVCACHE_SPACE} {settings.cpu_kv_cache_space_gib:g} GiB "
            "a rank)"
        )
    return (
        f"the budget (gpu_memory_utilization {settings.gpu_memory_utilization} = "
        f"{plan.memory.budget_bytes / GIB:.2f} GiB a rank)"
    )


def fix_of(plan: Plan, room_bytes: int, ranks: int) -> str:
    """The change that fits ``plan``'s ranks (``ranks`` on the host) into ``room_bytes``: a
    smaller KV pool (CPU) or ``gpu_memory_utilization``, a shorter ``max_model_len`` where the
    smaller pool cannot hold one request of it, or a node with room."""
    memory, settings = plan.memory, plan.settings
    per_rank = room_bytes / max(ranks, 1)
    one_request = plan.kv.bytes_per_request / max(plan.kv_capacity_scale, 1e-9)
    elsewhere = (
        f"run it on a node with {memory.budget_bytes * ranks / GIB:.2f} GiB free of other "
        "deployments' plans"
    )
    if settings.cpu_kv_cache_space_gib is not None:
        kv = math.floor((per_rank - memory.weights_bytes_per_rank) / GIB)
        if kv >= 1 and kv * GIB >= one_request:
            return (
                f"lower {wire.VLLM_CPU_KVCACHE_SPACE} from {settings.cpu_kv_cache_space_gib:g} "
                f"to {kv} GiB or less, or {elsewhere}"
            )
        return f"there is no room for one {settings.max_model_len:,}-token request: {elsewhere}"
    util = math.floor(per_rank / memory.memory_total_bytes * 1000) / 1000
    pool = util * memory.memory_total_bytes - memory.non_kv_bytes
    if pool >= one_request:
        return (
            f"lower gpu_memory_utilization from {settings.gpu_memory_utilization} to {util} or "
            f"less (its KV pool then {pool / GIB:.2f} GiB), or {elsewhere}"
        )
    tokens = int(pool / plan.kv_bytes_per_token) if pool > 0 else 0
    block = plan.kv.block_size_tokens
    longest = tokens // block * block
    if longest >= block:
        return (
            f"lower gpu_memory_utilization from {settings.gpu_memory_utilization} to {util} and "
            f"max_model_len from {settings.max_model_len:,} to {longest:,} or less, or {elsewhere}"
        )
    return f"its weights and reserves leave no KV pool in the room left: {elsewhere}"
