"""Nodes as Linux network namespaces: one namespace per node, joined by veth pairs to a bridge.

Each node gets what a real host has: its own interface (named as the cluster says, e.g.
``tdm0``), its own address, and a link to the others. The bridge in the root namespace holds the
subnet's last host address, so this machine reaches every node (and the leader's API) directly,
like a laptop on the same LAN as the hosts.

    root namespace:  bridge tdmbXXXX (10.77.0.254/24) ── tdmhXXXX0 ── tdmhXXXX1
                                                            │            │ veth pairs
    namespace tdm-NAME-node0:                   tdm0 10.77.0.1/24        │
    namespace tdm-NAME-node1:                                tdm1 10.77.0.2/24

``network_plan`` is pure (names and ``ip`` commands); ``create`` and ``destroy`` run them.
"""

from __future__ import annotations

import hashlib
import ipaddress
import subprocess

from pydantic import BaseModel

from tandem.errors import BackendError
from tandem.spec.cluster import Cluster


class NodeNetwork(BaseModel):
    node: str
    netns: str
    interface: str
    host_end: str
    address: str


class NetworkPlan(BaseModel):
    """Names and addresses of what ``create`` makes for a deployment."""

    bridge: str
    bridge_address: str
    prefix: int
    nodes: list[NodeNetwork]

    def netns_of(self, node: str) -> str:
        return next(n.netns for n in self.nodes if n.node == node)


def network_plan(deployment: str, cluster: Cluster) -> NetworkPlan:
    """Choose names for the bridge, namespaces and veth ends of a deployment.

    Interface names are limited to 15 characters, so the deployment is shortened to a hash.
    """
    tag = hashlib.sha1(deployment.encode()).hexdigest()[:6]
    subnet = ipaddress.ip_network(cluster.local.subnet)
    hosts = list(subnet.hosts())
    nodes = []
    for i, node in enumerate(cluster.nodes):
        if ipaddress.ip_address(node.address) not in subnet:
            raise BackendError(f"address {node.address} is outside the local subnet {subnet}",
                               node=node.name, field=f"nodes[{i}].address",
                               hint=f"use an address in {subnet} or change local.subnet")
        nodes.append(NodeNetwork(
            node=node.name,
            netns=f"tdm-{deployment}-{node.name}"[:60],
            interface=node.control_plane_interface or f"tdm{i}",
            host_end=f"tdmh{tag}{i}",
            address=node.address,
        ))
    return NetworkPlan(bridge=f"tdmb{tag}", bridge_address=str(hosts[-1]),
                       prefix=subnet.prefixlen, nodes=nodes)


def setup_commands(plan: NetworkPlan) -> list[list[str]]:
    """The ``ip`` commands that build the namespaces, veth pairs and bridge."""
    cmds = [
        ["ip", "link", "add", plan.bridge, "type", "bridge"],
        ["ip", "addr", "add", f"{plan.bridge_address}/{plan.prefix}", "dev", plan.bridge],
        ["ip", "link", "set", plan.bridge, "up"],
    ]
    for n in plan.nodes:
        cmds += [
            ["ip", "netns", "add", n.netns],
            ["ip", "link", "add", n.host_end, "type", "veth", "peer", "name", n.interface,
             "netns", n.netns],
            ["ip", "link", "set", n.host_end, "master", plan.bridge],
            ["ip", "link", "set", n.host_end, "up"],
            ["ip", "-n", n.netns, "link", "set", "lo", "up"],
            ["ip", "-n", n.netns, "addr", "add", f"{n.address}/{plan.prefix}", "dev", n.interface],
            ["ip", "-n", n.netns, "link", "set", n.interface, "up"],
            ["ip", "-n", n.netns, "route", "add", "default", "via", plan.bridge_address],
        ]
    return cmds


def teardown_commands(plan: NetworkPlan) -> list[list[str]]:
    """Deleting a namespace deletes its veth end and so the pair; then the bridge goes."""
    return [["ip", "netns", "del", n.netns] for n in plan.nodes] + [
        ["ip", "link", "del", plan.bridge]]


def create(plan: NetworkPlan) -> None:
    """Build the network; on any failure remove what was made and say which step failed.

    Raises:
        BackendError: the subnet is already in use on this machine (e.g. by another local
            deployment), or an ``ip`` command failed.
    """
    holder = _address_holder(plan.bridge_address)
    if holder:
        raise BackendError(f"address {plan.bridge_address} is already on interface {holder}, so "
                           "this deployment's subnet would clash with another network",
                           field="local.subnet", hint="stop the other local deployment, or give "
                           "this cluster another local.subnet (and node addresses in it)")
    for cmd in setup_commands(plan):
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode:
            destroy(plan)
            raise BackendError(f"`{' '.join(cmd)}` failed: {result.stderr.strip()}",
                               hint="run as root; `tandem down` removes a half-made network")


def destroy(plan: NetworkPlan) -> list[str]:
    """Remove the namespaces and bridge; returns what could not be removed (absent is fine)."""
    leftovers = []
    for cmd in teardown_commands(plan):
        result = subprocess.run(cmd, capture_output=True, text=True)
        missing = "No such file" in result.stderr or "Cannot find device" in result.stderr
        if result.returncode and not missing:
            leftovers.append(f"{' '.join(cmd)}: {result.stderr.strip()}")
    return leftovers


def _address_holder(address: str) -> str | None:
    """The interface in this namespace that already has ``address``, if any."""
    result = subprocess.run(["ip", "-o", "addr", "show", "to", address], capture_output=True,
                            text=True)
    fields = result.stdout.split()
    return fields[1] if len(fields) > 1 else None
