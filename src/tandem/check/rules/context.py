"""What every preflight rule reads: the ``CheckContext``, the ``Rule`` protocol, and small
readers of the probe's facts (a missing key reads as None, never raises)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from tandem.check.findings import Finding
from tandem.hf_cache import SnapshotManifest
from tandem.spec.cluster import Node, Transport
from tandem.spec.deployment import Deployment
from tandem.spec.recipe import DataPlaneTransport

GIB = 1024**3
MIB = 1024**2
UP_STATES = {"UP", "UNKNOWN"}
"""Operational states of a usable interface (loopback and some veths report UNKNOWN)."""


@dataclass(frozen=True)
class CheckContext:
    """Everything the rules read.

    ``facts``: node name -> the probe's facts (a node that could not be probed has
    ``{"probe_error": "..."}``). ``rank_env``: node name -> the environment its rank gets.
    ``memory_need_bytes``: node name -> memory the plan needs there, when ``tandem plan`` ran.
    ``plan_fit``: the plan's verdict (``tandem.plan.memory.Fit``), when ``tandem plan`` ran.
    ``api_key_set``: whether the caller's environment gives the leader ``VLLM_API_KEY``; None
    when unknown.
    ``manifest``: what a pull recorded of the model's commit (``tandem.backends.snapshots``).
    """

    deployment: Deployment
    facts: dict[str, dict[str, Any]]
    rank_env: dict[str, dict[str, str]] = field(default_factory=dict)
    memory_need_bytes: dict[str, int] | None = None
    plan_fit: Any = None
    plan_refused: Any = None
    """The ``PlanError`` with which ``tandem plan`` refused the deployment, if it did."""
    api_key_set: bool | None = None
    manifest: SnapshotManifest | None = None
    """The files of the model's commit with the Hub's ids, when ``tandem model pull`` took it."""

    @property
    def nodes(self) -> list[Node]:
        return list(self.deployment.cluster.nodes)

    def probed(self) -> Iterator[tuple[Node, dict[str, Any]]]:
        """(node, facts) for every node whose probe answered."""
        for node in self.nodes:
            facts = self.facts.get(node.name)
            if facts and "probe_error" not in facts:
                yield node, facts

    def hcas(self, node: Node) -> list[str]:
        return (
            node.hcas
            if node.hcas is not None
            else list(self.deployment.recipe.network.data_plane.hcas)
        )

    def control_interface(self, node: Node) -> str | None:
        return (
            node.control_plane_interface or self.deployment.recipe.network.control_plane.interface
        )

    @property
    def uses_ib(self) -> bool:
        return self.deployment.recipe.network.data_plane.transport is DataPlaneTransport.IB

    @property
    def multi_host(self) -> bool:
        cluster = self.deployment.cluster
        return len(cluster.nodes) > 1 and cluster.transport is not Transport.LOCAL


class Rule(Protocol):
    name: str

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        """Findings of this rule; nothing when all is well."""


def fact(facts: dict[str, Any], *path: str) -> Any:
    value: Any = facts
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def interfaces_of(facts: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {i["name"]: i for i in facts.get("interfaces") or [] if i.get("name")}


def rdma_devices_of(facts: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for d in fact(facts, "rdma", "devices") or []}


def listing(values: dict[str, Any]) -> str:
    return ", ".join(f"{node} {value}" for node, value in values.items())


def few(names: list[str], shown: int = 5, sep: str = ", ") -> str:
    """The first ``shown`` of ``names``, then `` ...`` when there are more: evidence stays one
    readable line however many files or entries differ."""
    return sep.join(names[:shown]) + (" ..." if len(names) > shown else "")


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"
