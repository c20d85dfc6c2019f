"""Rules on the wire: interfaces and addresses, MTU, RoCE GIDs, ports, and the rendezvous
address of a multi-host deployment."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tandem.check.findings import Finding, Severity
from tandem.check.rules.context import (
    UP_STATES,
    CheckContext,
    fact,
    interfaces_of,
    listing,
    rdma_devices_of,
)
from tandem.spec.addresses import is_ip, is_loopback
from tandem.spec.deployment import Deployment


class InterfaceRule:
    """The control-plane interface and the HCAs' netdevs exist and are up; HCAs exist."""

    name = "interface"

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        for node, facts in ctx.probed():
            interfaces = interfaces_of(facts)
            if not interfaces:
                continue
            wanted = []
            control = ctx.control_interface(node)
            if control:
                wanted.append((control, "control-plane interface"))
            if ctx.uses_ib:
                devices = rdma_devices_of(facts)
                for hca in ctx.hcas(node):
                    device = devices.get(hca)
                    if device is None:
                        yield Finding(
                            rule="hca-missing",
                            severity=Severity.ERROR,
                            node=node.name,
                            message=f"RDMA device {hca} (NCCL_IB_HCA) does not exist",
                            evidence=f"RDMA devices: {', '.join(devices) or 'none'}; "
                            f"/dev/infiniband: {fact(facts, 'rdma', 'dev_infiniband')}",
                            fix="name existing devices in network.data_plane.hcas (see "
                            "`ibdev2netdev`), or load the driver (mlx5_ib)",
                        )
                        continue
                    wanted += [(netdev, f"netdev of {hca}") for netdev in device.get("netdevs", [])]
                    ports = device.get("ports") or []
                    if ports and not any(p.get("state") == "ACTIVE" for p in ports):
                        yield Finding(
                            rule="interface-down",
                            severity=Severity.ERROR,
                            node=node.name,
                            message=f"RDMA device {hca} has no ACTIVE port",
                            evidence=", ".join(f"port {p['port']} {p.get('state')}" for p in ports),
                            fix="check the cable and `ibv_devinfo`; bring the netdev up",
                        )
            for name, role in wanted:
                interface = interfaces.get(name)
                if interface is None:
                    yield Finding(
                        rule="interface-missing",
                        severity=Severity.ERROR,
                        node=node.name,
                        message=f"{role} {name} does not exist",
                        evidence=f"interfaces: {', '.join(interfaces)}",
                        fix="set the node's control_plane_interface / hcas to names from "
                        "`ip -br link` on that node",
                    )
                elif interface.get("state") not in UP_STATES:
                    yield Finding(
                        rule="interface-down",
                        severity=Severity.ERROR,
                        node=node.name,
                        message=f"{role} {name} is {interface.get('state')}",
                        evidence=f"{name}: state {interface.get('state')}, flags "
                        f"{','.join(interface.get('flags', []))}, addresses "
                        f"{interface.get('addresses') or 'none'}",
                        fix=f"`sudo ip link set {name} up` and check its cable and netplan",
                    )


class AddressOnNodeRule:
    """Each node's address (its VLLM_HOST_IP, the leader's --master-addr) is one of its own."""

    name = "address-not-on-node"

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        for node, facts in ctx.probed():
            interfaces = interfaces_of(facts)
            owned = {a for i in interfaces.values() for a in i.get("addresses", [])}
            if not owned or node.address in owned or not is_ip(node.address):
                continue
            yield Finding(
                rule=self.name,
                severity=Severity.ERROR,
                node=node.name,
                message=f"address {node.address} is not on any interface of the node",
                evidence="addresses: "
                + ", ".join(
                    f"{n} {'/'.join(i['addresses'])}"
                    for n, i in interfaces.items()
                    if i.get("addresses")
                ),
                fix="set the node's address to one it holds on the control plane (and bring "
                "that interface up)",
            )


class MtuRule:
    """The same MTU on each plane's interfaces on every node (RoCE drops larger frames)."""

    name = "mtu-mismatch"

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        if len(ctx.nodes) < 2:
            return
        control: dict[str, Any] = {}
        data: dict[str, Any] = {}
        for node, facts in ctx.probed():
            interfaces = interfaces_of(facts)
            name = ctx.control_interface(node)
            if name in interfaces:
                control[node.name] = interfaces[name].get("mtu")
            if ctx.uses_ib:
                devices = rdma_devices_of(facts)
                for hca in ctx.hcas(node):
                    for netdev in (devices.get(hca) or {}).get("netdevs", []):
                        if interfaces.get(netdev, {}).get("state") in UP_STATES:
                            data[f"{node.name}/{netdev}"] = interfaces[netdev].get("mtu")
        if len({v for v in data.values() if v}) > 1:
            yield Finding(
                rule=self.name,
                severity=Severity.ERROR,
                node=None,
                message="the data-plane interfaces have different MTUs",
                evidence=listing(data),
                fix=f"set MTU {max(v for v in data.values() if v)} on every data-plane "
                "netdev (netplan `mtu:`, then `sudo netplan apply`) and on the switch",
            )
        if len({v for v in control.values() if v}) > 1:
            yield Finding(
                rule=self.name,
                severity=Severity.WARNING,
                node=None,
                message="the control-plane interfaces have different MTUs",
                evidence=listing(control),
                fix="use one MTU on the control plane of every node",
            )


class RoceGidRule:
    """Resolve the RoCE v2 GID index per HCA from sysfs; a pinned index must be that one.

    NCCL_IB_GID_INDEX picks one slot of each HCA's GID table. The slot of the RoCE v2 GID that
    carries the netdev's IPv4 address moves when addresses change (an IPv6 address added to a
    twin shifts it by two), and a single literal pinned for every HCA "wedges NCCL with an
    unhandled system error" when the twins differ (MiaAI's start script).
    """

    name = "roce-gid-index"

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        if not ctx.uses_ib:
            return
        data_plane = ctx.deployment.recipe.network.data_plane
        pinned = data_plane.gid_index
        want_v6 = data_plane.addr_family == "AF_INET6"
        resolved: dict[str, int] = {}
        wrong: list[tuple[str, str, int, str]] = []  # node, hca, right index, evidence
        for node, facts in ctx.probed():
            devices = rdma_devices_of(facts)
            for hca in ctx.hcas(node):
                device = devices.get(hca)
                if device is None:
                    continue  # hca-missing says so
                gids = [
                    g
                    for p in device.get("ports", [])
                    if p.get("state") == "ACTIVE"
                    for g in p.get("gids", [])
                ]
                usable = [g for g in gids if g.get("type") == "RoCE v2" and _usable(g, want_v6)]
                family = "IPv6" if want_v6 else "IPv4"
                if not usable:
                    yield Finding(
                        rule=self.name,
                        severity=Severity.ERROR,
                        node=node.name,
                        message=f"{hca} has no RoCE v2 GID with an {family} address",
                        evidence=f"GID table of the active port: {_gid_table(gids)}",
                        fix=f"give {', '.join(device.get('netdevs') or [hca])} an {family} "
                        "address on the data-plane subnet",
                    )
                    continue
                best = min(g["index"] for g in usable)
                resolved[f"{node.name}/{hca}"] = best
                if pinned != "auto" and pinned not in {g["index"] for g in usable}:
                    slot = next((g for g in gids if g["index"] == pinned), None)
                    held = (
                        f"{slot.get('ipv4') or slot['gid']} {slot.get('type')}" if slot else "empty"
                    )
                    wrong.append(
                        (node.name, hca, best, f"GID {pinned}: {held}; table: {_gid_table(gids)}")
                    )
        indices = sorted(set(resolved.values()))
        for node_name, hca, best, evidence in wrong:
            fix = (
                f"set network.data_plane.gid_index: {best}"
                if len(indices) == 1
                else "set network.data_plane.gid_index: auto, so NCCL picks the RoCE v2 GID of "
                f"each HCA itself (one pinned index cannot fit: {listing(resolved)})"
            )
            yield Finding(
                rule=self.name,
                severity=Severity.ERROR,
                node=node_name,
                message=f"gid_index {pinned} is not a RoCE v2 GID of {hca}; the "
                f"right index there is {best}",
                evidence=evidence,
                fix=fix,
            )
        if len(indices) > 1 and not wrong:
            yield Finding(
                rule=self.name,
                severity=Severity.INFO,
                node=None,
                message="the RoCE v2 GID index differs between HCAs",
                evidence=listing(resolved),
                fix="keep gid_index: auto; one pinned NCCL_IB_GID_INDEX cannot fit every HCA",
            )


def _usable(gid: dict[str, Any], want_v6: bool) -> bool:
    if want_v6:
        return not gid.get("ipv4") and not str(gid.get("gid", "")).startswith("fe80")
    return bool(gid.get("ipv4"))


def _gid_table(gids: list[dict[str, Any]]) -> str:
    return (
        "; ".join(f"{g['index']} {g.get('ipv4') or g['gid']} {g.get('type')}" for g in gids)
        or "empty"
    )


class PortsRule:
    """The leader's API and rendezvous ports are free; a worker serving the API port is stale."""

    name = "port-taken"

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        ports = ctx.deployment.recipe.ports
        leader = ctx.deployment.cluster.leader.name
        for node, facts in ctx.probed():
            listening = {p["port"]: p["addresses"] for p in fact(facts, "ports", "listening") or []}
            wanted = [(ports.api, "ports.api"), (ports.master, "ports.master")]
            for port, field_name in wanted:
                if port not in listening:
                    continue
                is_leader = node.name == leader
                if not is_leader and field_name == "ports.master":
                    continue
                yield Finding(
                    rule=self.name,
                    severity=Severity.ERROR if is_leader else Severity.WARNING,
                    node=node.name,
                    message=f"port {port} ({field_name}) is already listening"
                    + ("" if is_leader else "; a stale server may hold memory"),
                    evidence=f"TCP {port} LISTEN on {', '.join(listening[port])}",
                    fix=f"stop what holds it (`sudo ss -ltnp 'sport = :{port}'`) or choose "
                    f"another {field_name}",
                )


def open_api_finding(deployment: Deployment, api_key_set: bool) -> Finding | None:
    """A warning when the leader's API answers beyond this host and asks no key.

    ``host`` (``--host``) other than a loopback address binds every interface named by it, and
    a Kubernetes NodePort or LoadBalancer Service exposes the API further; without
    ``VLLM_API_KEY`` anyone who reaches it can use the model.
    """
    if api_key_set:
        return None
    recipe, cluster = deployment.recipe, deployment.cluster
    host = recipe.host
    service = cluster.kubernetes.service.type.value if cluster.transport.value == "k8s" else None
    exposed = service in ("NodePort", "LoadBalancer")
    if is_loopback(host) and not exposed:
        return None
    where = f"--host {host}" + (f" and a {service} Service" if exposed else "")
    return Finding(
        rule="api-without-key",
        severity=Severity.WARNING,
        node=cluster.leader.name,
        message=f"the API on port {recipe.ports.api} answers beyond this host ({where}) and "
        "asks no key",
        evidence="VLLM_API_KEY is not set in the environment of tandem",
        fix="export VLLM_API_KEY=... before `tandem up` (the leader then requires it), or set "
        "the recipe's host: 127.0.0.1",
    )


class OpenApiRule:
    """The API reachable beyond loopback without an API key is a warning."""

    name = "api-without-key"

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        if ctx.api_key_set is None:
            return
        finding = open_api_finding(ctx.deployment, ctx.api_key_set)
        if finding:
            yield finding


class LoopbackMasterRule:
    """On several hosts, no node (least of all the leader, --master-addr) may be loopback."""

    name = "loopback-master-address"

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        if not ctx.multi_host:
            return
        leader = ctx.deployment.cluster.leader
        for node in ctx.nodes:
            env_ip = (ctx.rank_env.get(node.name) or {}).get("VLLM_HOST_IP", node.address)
            for what, address in (("address", node.address), ("VLLM_HOST_IP", env_ip)):
                if is_loopback(address):
                    master = node.name == leader.name
                    yield Finding(
                        rule=self.name,
                        severity=Severity.ERROR,
                        node=node.name,
                        message=f"{what} {address} is loopback on a {len(ctx.nodes)}-host cluster"
                        + (" and is the leader's --master-addr" if master else ""),
                        evidence=f"cluster transport {ctx.deployment.cluster.transport.value}; "
                        "the other nodes would connect to themselves and wait at "
                        "'1/2 clients joined'",
                        fix="use the node's management address that the other nodes reach",
                    )
                    break
