"""The preflight rules: pure functions of a deployment and the facts of its nodes.

Each rule is a small class with a ``name`` and one method, ``check(context)``, that yields
findings (rich's composition: many small named units instead of one function with flags).
``RULES`` lists them in the order a report shows them; ``evaluate`` runs them all. No rule does
I/O: the facts come from ``tandem.check.probe`` through a transport, the environment from the
rank plan, and the memory need from ``tandem plan`` when it is installed.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from tandem.check.findings import Finding, Severity
from tandem.check.known_env import EMPTY_NCCL_VARIABLE, KNOWN_BAD_ENV
from tandem.spec.cluster import Node, Transport
from tandem.spec.deployment import Deployment
from tandem.spec.recipe import DataPlaneTransport

GIB = 1024 ** 3
MIB = 1024 ** 2
UP_STATES = {"UP", "UNKNOWN"}
"""Operational states of a usable interface (loopback and some veths report UNKNOWN)."""


@dataclass(frozen=True)
class CheckContext:
    """Everything the rules read.

    ``facts``: node name -> the probe's facts (a node that could not be probed has
    ``{"probe_error": "..."}``). ``rank_env``: node name -> the environment its rank gets.
    ``memory_need_bytes``: node name -> memory the plan needs there, when ``tandem plan`` ran.
    """

    deployment: Deployment
    facts: dict[str, dict[str, Any]]
    rank_env: dict[str, dict[str, str]] = field(default_factory=dict)
    memory_need_bytes: dict[str, int] | None = None

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
        return node.hcas if node.hcas is not None else list(
            self.deployment.recipe.network.data_plane.hcas)

    def control_interface(self, node: Node) -> str | None:
        return node.control_plane_interface or self.deployment.recipe.network.control_plane.interface

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


def _get(facts: dict[str, Any], *path: str) -> Any:
    value: Any = facts
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def _interfaces(facts: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {i["name"]: i for i in facts.get("interfaces") or [] if i.get("name")}


def _rdma_devices(facts: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for d in _get(facts, "rdma", "devices") or []}


def _listing(values: dict[str, Any]) -> str:
    return ", ".join(f"{node} {value}" for node, value in values.items())


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


class ProbeFailedRule:
    """A node that could not be probed: unreachable, no python3, or the probe crashed."""

    name = "probe-failed"

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        for node in ctx.nodes:
            facts = ctx.facts.get(node.name) or {"probe_error": "no facts"}
            if "probe_error" in facts:
                yield Finding(rule=self.name, severity=Severity.ERROR, node=node.name,
                              message="the node could not be probed", evidence=facts["probe_error"],
                              fix="make the node reachable with python3 >= 3.8 on it, then rerun")


class VersionSkewRule:
    """Kernel, DGX OS, driver, CUDA, NIC firmware, vLLM and image digest must match on all nodes."""

    name = "version-skew"
    fixes = {
        "kernel": "install the same kernel on every node (`apt install linux-image-VERSION`, "
                  "reboot) — NCCL and the GPU driver are built per kernel",
        "DGX OS": "bring every node to the same DGX OS release (`sudo apt update && sudo apt "
                  "full-upgrade`, then reboot)",
        "NVIDIA driver": "install the same driver on every node; mixed drivers break NCCL",
        "CUDA": "install the same CUDA on every node (it comes with the driver on DGX OS)",
        "NIC firmware": "flash the same ConnectX firmware on every node (`mlxfwmanager --online "
                        "-u` or the DGX OS firmware update), then reboot",
        "vLLM": "install the same vLLM on every node",
        "image digest": "pull the same image digest on every node, ideally pinned as "
                        "`engine.image: REPO@sha256:...`",
    }

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        if len(ctx.nodes) < 2:
            return
        image = ctx.deployment.recipe.engine.image
        readings: dict[str, dict[str, Any]] = {name: {} for name in self.fixes}
        for node, facts in ctx.probed():
            readings["kernel"][node.name] = _get(facts, "system", "kernel")
            readings["DGX OS"][node.name] = _get(facts, "system", "dgx_release", "DGX_SWBUILD_VERSION")
            readings["NVIDIA driver"][node.name] = _get(facts, "gpu", "driver_version")
            readings["CUDA"][node.name] = _get(facts, "gpu", "cuda_version")
            devices = _rdma_devices(facts)
            wanted = ctx.hcas(node) if ctx.uses_ib else list(devices)
            firmware = sorted({devices[h]["fw_ver"] for h in wanted if h in devices and devices[h].get("fw_ver")})
            readings["NIC firmware"][node.name] = "/".join(firmware) or None
            if not image:
                readings["vLLM"][node.name] = _get(facts, "software", "vllm_version")
            else:
                digests = sorted({i["digest"] for i in image_matches(facts, image) if i.get("digest")})
                readings["image digest"][node.name] = ",".join(digests) or None
        for what, values in readings.items():
            known = {n: v for n, v in values.items() if v is not None}
            if len(set(known.values())) > 1:
                yield Finding(rule=self.name, severity=Severity.ERROR, node=None,
                              message=f"{what} differs between nodes",
                              evidence=_listing(known), fix=self.fixes[what])


def image_matches(facts: dict[str, Any], image: str) -> list[dict[str, Any]]:
    """Images on a node that are ``image`` (``repo:tag``, or ``repo@sha256:...`` by digest)."""
    images = _get(facts, "images", "images") or []
    if "@" in image:
        repo, digest = image.split("@", 1)
        return [i for i in images if i.get("digest") == digest and i["ref"].rsplit(":", 1)[0] == repo]
    ref = image if ":" in image.rsplit("/", 1)[-1] else image + ":latest"
    return [i for i in images if i.get("ref") in (ref, "docker.io/" + ref, "docker.io/library/" + ref)]


class VllmVersionRule:
    """The recipe's ``engine.vllm_version`` is what each node runs (bare-host runtimes)."""

    name = "vllm-version"

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        engine = ctx.deployment.recipe.engine
        if not engine.vllm_version or engine.image:
            return
        for node, facts in ctx.probed():
            found = _get(facts, "software", "vllm_version")
            if (found or "").split("+", 1)[0] != engine.vllm_version.split("+", 1)[0]:
                yield Finding(
                    rule=self.name, severity=Severity.ERROR, node=node.name,
                    message=f"vLLM {found}; the recipe needs {engine.vllm_version}" if found
                    else f"vLLM is not installed; the recipe needs {engine.vllm_version}",
                    evidence=f"python {_get(facts, 'software', 'executable') or '?'}: packages "
                             f"{_get(facts, 'software', 'packages') or {}}",
                    fix=f"pip install vllm=={engine.vllm_version} on {node.name}")


class ImagePresentRule:
    """The recipe's image is on every node before launch (no slow or failing pull mid-start)."""

    name = "image-missing"

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        image = ctx.deployment.recipe.engine.image
        if not image or ctx.deployment.cluster.transport is Transport.LOCAL:
            return
        for node, facts in ctx.probed():
            if not image_matches(facts, image):
                tools = _get(facts, "images", "tools") or []
                yield Finding(
                    rule=self.name, severity=Severity.ERROR, node=node.name,
                    message=f"image {image} is not on the node",
                    evidence=f"image stores read: {', '.join(tools) or 'none (no docker, no ctr)'}",
                    fix=f"pull it on {node.name} first: `docker pull {image}` or, for "
                        f"Kubernetes, `sudo ctr -n k8s.io images pull {image}`")


class ModelSnapshotRule:
    """The snapshot is present, complete, in the HF cache layout, and the same on every node."""

    name = "model-snapshot"

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        model = ctx.deployment.recipe.model
        download = (f"`HF_HOME={model.cache_root or '~/.cache/huggingface'} hf download "
                    f"{model.repo_id} --revision {model.revision}`")
        present: dict[str, dict[str, Any]] = {}
        for node, facts in ctx.probed():
            snap = facts.get("model")
            if not snap:
                continue
            where = snap.get("snapshot_dir") or snap.get("repo_dir") or snap.get("path")
            if snap.get("layout") == "plain-directory" and not model.path:
                yield Finding(
                    rule="model-not-cache-layout", severity=Severity.ERROR, node=node.name,
                    message="the weights are a plain directory, not the Hugging Face cache layout",
                    evidence=f"{snap.get('plain_dir') or snap.get('repo_dir')} has no "
                             "snapshots/<commit>/ with refs/; an offline vLLM serving by repo id "
                             "will not find it",
                    fix=f"download into the cache with {download}, or serve the directory by "
                        "setting model.path")
                continue
            if not snap.get("exists"):
                severity = Severity.ERROR if model.offline else Severity.WARNING
                yield Finding(
                    rule="model-snapshot-missing", severity=severity, node=node.name,
                    message=f"no snapshot of {model.repo_id}@{model.revision}",
                    evidence=f"{where}: refs/{model.revision} -> {snap.get('commit') or 'absent'}; "
                             f"snapshots present: {snap.get('snapshots') or 'none'}",
                    fix=f"on {node.name}: {download} (the same path on every node)"
                        + ("" if model.offline else "; otherwise every rank downloads at start"))
                continue
            broken = snap.get("broken_links") or []
            shards = snap.get("missing_shards") or []
            partial = snap.get("incomplete_blobs") or []
            if broken or shards or partial:
                parts = []
                if shards:
                    parts.append(f"shards named by the index but absent: {', '.join(shards)}")
                if broken:
                    parts.append(f"links to missing blobs: {', '.join(broken)}")
                if partial:
                    parts.append(f"unfinished downloads in blobs/: {', '.join(partial)}")
                yield Finding(rule="model-snapshot-incomplete", severity=Severity.ERROR,
                              node=node.name, message=f"the snapshot at {where} is incomplete",
                              evidence="; ".join(parts),
                              fix=f"finish the download on {node.name}: {download}")
                continue
            present[node.name] = snap
        yield from self._compare(present)

    def _compare(self, present: dict[str, dict[str, Any]]) -> Iterable[Finding]:
        if len(present) < 2:
            return
        commits = {n: s.get("commit") for n, s in present.items()}
        if len(set(commits.values())) > 1:
            yield Finding(rule="model-snapshot-differs", severity=Severity.ERROR, node=None,
                          message="the nodes hold different snapshots (commits)",
                          evidence=_listing(commits),
                          fix="pin model.revision to one 40-hex commit and download it on every node")
            return
        views = {n: {f["name"]: (f["size"], f.get("blob"), f.get("sha256")) for f in s["files"]}
                 for n, s in present.items()}
        first_node, first = next(iter(views.items()))
        for other_node, other in views.items():
            differing = sorted(k for k in set(first) | set(other) if first.get(k) != other.get(k))
            if differing:
                yield Finding(
                    rule="model-snapshot-differs", severity=Severity.ERROR, node=other_node,
                    message=f"files differ from {first_node}'s snapshot",
                    evidence=f"{len(differing)} file(s) differ in presence, size or blob hash: "
                             f"{', '.join(differing[:5])}{' ...' if len(differing) > 5 else ''}",
                    fix=f"copy the snapshot from {first_node} (`rsync -a --checksum`) or "
                        "re-download it")


class InterfaceRule:
    """The control-plane interface and the HCAs' netdevs exist and are up; HCAs exist."""

    name = "interface"

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        for node, facts in ctx.probed():
            interfaces = _interfaces(facts)
            if not interfaces:
                continue
            wanted = []
            control = ctx.control_interface(node)
            if control:
                wanted.append((control, "control-plane interface"))
            if ctx.uses_ib:
                devices = _rdma_devices(facts)
                for hca in ctx.hcas(node):
                    device = devices.get(hca)
                    if device is None:
                        yield Finding(
                            rule="hca-missing", severity=Severity.ERROR, node=node.name,
                            message=f"RDMA device {hca} (NCCL_IB_HCA) does not exist",
                            evidence=f"RDMA devices: {', '.join(devices) or 'none'}; "
                                     f"/dev/infiniband: {_get(facts, 'rdma', 'dev_infiniband')}",
                            fix="name existing devices in network.data_plane.hcas (see "
                                "`ibdev2netdev`), or load the driver (mlx5_ib)")
                        continue
                    wanted += [(netdev, f"netdev of {hca}") for netdev in device.get("netdevs", [])]
                    ports = device.get("ports") or []
                    if ports and not any(p.get("state") == "ACTIVE" for p in ports):
                        yield Finding(
                            rule="interface-down", severity=Severity.ERROR, node=node.name,
                            message=f"RDMA device {hca} has no ACTIVE port",
                            evidence=", ".join(f"port {p['port']} {p.get('state')}" for p in ports),
                            fix="check the cable and `ibv_devinfo`; bring the netdev up")
            for name, role in wanted:
                interface = interfaces.get(name)
                if interface is None:
                    yield Finding(
                        rule="interface-missing", severity=Severity.ERROR, node=node.name,
                        message=f"{role} {name} does not exist",
                        evidence=f"interfaces: {', '.join(interfaces)}",
                        fix="set the node's control_plane_interface / hcas to names from "
                            "`ip -br link` on that node")
                elif interface.get("state") not in UP_STATES:
                    yield Finding(
                        rule="interface-down", severity=Severity.ERROR, node=node.name,
                        message=f"{role} {name} is {interface.get('state')}",
                        evidence=f"{name}: state {interface.get('state')}, flags "
                                 f"{','.join(interface.get('flags', []))}, addresses "
                                 f"{interface.get('addresses') or 'none'}",
                        fix=f"`sudo ip link set {name} up` and check its cable and netplan")


class AddressOnNodeRule:
    """Each node's address (its VLLM_HOST_IP, the leader's --master-addr) is one of its own."""

    name = "address-not-on-node"

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        for node, facts in ctx.probed():
            interfaces = _interfaces(facts)
            owned = {a for i in interfaces.values() for a in i.get("addresses", [])}
            if not owned or node.address in owned or not _is_ip(node.address):
                continue
            yield Finding(
                rule=self.name, severity=Severity.ERROR, node=node.name,
                message=f"address {node.address} is not on any interface of the node",
                evidence="addresses: " + ", ".join(
                    f"{n} {'/'.join(i['addresses'])}" for n, i in interfaces.items() if i.get("addresses")),
                fix="set the node's address to one it holds on the control plane (and bring "
                    "that interface up)")


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


class MtuRule:
    """The same MTU on each plane's interfaces on every node (RoCE drops larger frames)."""

    name = "mtu-mismatch"

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        if len(ctx.nodes) < 2:
            return
        control: dict[str, Any] = {}
        data: dict[str, Any] = {}
        for node, facts in ctx.probed():
            interfaces = _interfaces(facts)
            name = ctx.control_interface(node)
            if name in interfaces:
                control[node.name] = interfaces[name].get("mtu")
            if ctx.uses_ib:
                devices = _rdma_devices(facts)
                for hca in ctx.hcas(node):
                    for netdev in (devices.get(hca) or {}).get("netdevs", []):
                        if interfaces.get(netdev, {}).get("state") in UP_STATES:
                            data[f"{node.name}/{netdev}"] = interfaces[netdev].get("mtu")
        if len({v for v in data.values() if v}) > 1:
            yield Finding(rule=self.name, severity=Severity.ERROR, node=None,
                          message="the data-plane interfaces have different MTUs",
                          evidence=_listing(data),
                          fix=f"set MTU {max(v for v in data.values() if v)} on every data-plane "
                              "netdev (netplan `mtu:`, then `sudo netplan apply`) and on the switch")
        if len({v for v in control.values() if v}) > 1:
            yield Finding(rule=self.name, severity=Severity.WARNING, node=None,
                          message="the control-plane interfaces have different MTUs",
                          evidence=_listing(control),
                          fix="use one MTU on the control plane of every node")


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
            devices = _rdma_devices(facts)
            for hca in ctx.hcas(node):
                device = devices.get(hca)
                if device is None:
                    continue  # hca-missing says so
                gids = [g for p in device.get("ports", []) if p.get("state") == "ACTIVE"
                        for g in p.get("gids", [])]
                usable = [g for g in gids if g.get("type") == "RoCE v2" and _usable(g, want_v6)]
                family = "IPv6" if want_v6 else "IPv4"
                if not usable:
                    yield Finding(
                        rule=self.name, severity=Severity.ERROR, node=node.name,
                        message=f"{hca} has no RoCE v2 GID with an {family} address",
                        evidence=f"GID table of the active port: {_gid_table(gids)}",
                        fix=f"give {', '.join(device.get('netdevs') or [hca])} an {family} "
                            "address on the data-plane subnet")
                    continue
                best = min(g["index"] for g in usable)
                resolved[f"{node.name}/{hca}"] = best
                if pinned != "auto" and pinned not in {g["index"] for g in usable}:
                    slot = next((g for g in gids if g["index"] == pinned), None)
                    held = f"{slot.get('ipv4') or slot['gid']} {slot.get('type')}" if slot else "empty"
                    wrong.append((node.name, hca, best,
                                  f"GID {pinned}: {held}; table: {_gid_table(gids)}"))
        indices = sorted(set(resolved.values()))
        for node_name, hca, best, evidence in wrong:
            fix = (f"set network.data_plane.gid_index: {best}" if len(indices) == 1 else
                   "set network.data_plane.gid_index: auto, so NCCL picks the RoCE v2 GID of "
                   f"each HCA itself (one pinned index cannot fit: {_listing(resolved)})")
            yield Finding(rule=self.name, severity=Severity.ERROR, node=node_name,
                          message=f"gid_index {pinned} is not a RoCE v2 GID of {hca}; the "
                                  f"right index there is {best}",
                          evidence=evidence, fix=fix)
        if len(indices) > 1 and not wrong:
            yield Finding(rule=self.name, severity=Severity.INFO, node=None,
                          message="the RoCE v2 GID index differs between HCAs",
                          evidence=_listing(resolved),
                          fix="keep gid_index: auto; one pinned NCCL_IB_GID_INDEX cannot fit "
                              "every HCA")


def _usable(gid: dict[str, Any], want_v6: bool) -> bool:
    if want_v6:
        return not gid.get("ipv4") and not str(gid.get("gid", "")).startswith("fe80")
    return bool(gid.get("ipv4"))


def _gid_table(gids: list[dict[str, Any]]) -> str:
    return "; ".join(f"{g['index']} {g.get('ipv4') or g['gid']} {g.get('type')}" for g in gids) or "empty"


class MemoryHeadroomRule:
    """Memory available on each node covers what ``tandem plan`` says the rank needs."""

    name = "memory-headroom"
    margin_bytes = 4 * GIB
    """Left over for the OS, the driver and page cache on unified-memory nodes."""

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        if not ctx.memory_need_bytes:
            return
        for node, facts in ctx.probed():
            need = ctx.memory_need_bytes.get(node.name)
            gpus = _get(facts, "gpu", "gpus") or []
            unified = _get(facts, "gpu", "unified_memory") or not gpus
            if unified:
                available = _get(facts, "memory", "available_bytes")
                pool = "memory available (unified CPU+GPU memory)" if gpus else "memory available"
            else:
                free = [(g["memory_total_mib"] or 0) - (g["memory_used_mib"] or 0) for g in gpus]
                available = min(free) * MIB * len(gpus) if free else None
                pool = "free GPU memory"
            if need is None or available is None:
                continue
            if available < need + self.margin_bytes:
                yield Finding(
                    rule=self.name, severity=Severity.ERROR if available < need else Severity.WARNING,
                    node=node.name,
                    message=f"{pool} {_gib(available)} is short of the planned {_gib(need)} "
                            f"+ {_gib(self.margin_bytes)} margin",
                    evidence=f"MemAvailable {_gib(_get(facts, 'memory', 'available_bytes') or 0)}"
                             f", GUI resident {_gib(_get(facts, 'display', 'gui_rss_bytes') or 0)}",
                    fix="stop other processes (and the desktop), or lower "
                        "engine.serve.gpu_memory_utilization / max_model_len")


class GuiRule:
    """A desktop session holds memory (unified memory on GB10) and GPU time."""

    name = "gui-running"

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        for node, facts in ctx.probed():
            display = facts.get("display") or {}
            processes = display.get("gui_processes") or []
            if display.get("display_manager") != "active" and not processes:
                continue
            held = ", ".join(f"{p['name']} {(p['rss_bytes'] or 0) / MIB:.0f} MiB" for p in processes)
            gpu = ", ".join(f"{p['name'].rsplit('/', 1)[-1]} {p['memory_mib']} MiB"
                            for p in _get(facts, "gpu", "graphics_processes") or [])
            yield Finding(
                rule=self.name, severity=Severity.WARNING, node=node.name,
                message=f"a desktop is running and holds {_gib(display.get('gui_rss_bytes') or 0)}",
                evidence=f"display-manager {display.get('display_manager')}; resident: "
                         f"{held or 'none found'}" + (f"; on the GPU: {gpu}" if gpu else ""),
                fix="`sudo systemctl stop display-manager` before launching (a reboot restores "
                    "it; `sudo systemctl set-default multi-user.target` makes it permanent)")


class KnownBadEnvRule:
    """Environment variables from ``known_env.KNOWN_BAD_ENV`` in any rank's environment."""

    name = "known-bad-env"

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        recipe_env = ctx.deployment.recipe.env
        vllm = ctx.deployment.recipe.engine.vllm_version
        seen: set[tuple[str | None, str]] = set()
        for node in ctx.nodes:
            env = ctx.rank_env.get(node.name) or {**recipe_env, **node.env}
            for name, value in sorted(env.items()):
                row = next((r for r in KNOWN_BAD_ENV if r.name == name and r.matches(value)
                            and (ctx.uses_ib or not r.only_with_ib)), None)
                if row is None and name.startswith("NCCL_") and value == "":
                    row = EMPTY_NCCL_VARIABLE
                if row is None:
                    continue
                where = None if recipe_env.get(name) == value and name not in node.env else node.name
                if (where, name) in seen:
                    continue
                seen.add((where, name))
                origin = "recipe env" if where is None else f"node {node.name}'s environment"
                yield Finding(rule=self.name, severity=row.severity_for(vllm), node=where,
                              message=f"{name}={value!r} {row.effect}",
                              evidence=f"set in the {origin}; known from {row.source}",
                              fix=row.fix)


class PortsRule:
    """The leader's API and rendezvous ports are free; a worker serving the API port is stale."""

    name = "port-taken"

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        ports = ctx.deployment.recipe.ports
        leader = ctx.deployment.cluster.leader.name
        for node, facts in ctx.probed():
            listening = {p["port"]: p["addresses"] for p in _get(facts, "ports", "listening") or []}
            wanted = [(ports.api, "ports.api"), (ports.master, "ports.master")]
            for port, field_name in wanted:
                if port not in listening:
                    continue
                is_leader = node.name == leader
                if not is_leader and field_name == "ports.master":
                    continue
                yield Finding(
                    rule=self.name, severity=Severity.ERROR if is_leader else Severity.WARNING,
                    node=node.name,
                    message=f"port {port} ({field_name}) is already listening"
                            + ("" if is_leader else "; a stale server may hold memory"),
                    evidence=f"TCP {port} LISTEN on {', '.join(listening[port])}",
                    fix=f"stop what holds it (`sudo ss -ltnp 'sport = :{port}'`) or choose "
                        f"another {field_name}")


class ShmRule:
    """/dev/shm is at least the recipe's shm_size (NCCL and vLLM's IPC buffers live there)."""

    name = "shm-too-small"

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        recipe = ctx.deployment.recipe
        for node, facts in ctx.probed():
            total = _get(facts, "shm", "total_bytes")
            if total is None or total >= recipe.shm_bytes:
                continue
            yield Finding(
                rule=self.name, severity=Severity.ERROR, node=node.name,
                message=f"/dev/shm is {_gib(total)}, smaller than shm_size {recipe.shm_size}",
                evidence=f"df /dev/shm: {total} bytes, {_get(facts, 'shm', 'free_bytes')} free",
                fix=f"`sudo mount -o remount,size={recipe.shm_size.upper()} /dev/shm` (and in "
                    "/etc/fstab), or lower shm_size")


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
                if address == "localhost" or (_is_ip(address) and ipaddress.ip_address(address).is_loopback):
                    master = node.name == leader.name
                    yield Finding(
                        rule=self.name, severity=Severity.ERROR, node=node.name,
                        message=f"{what} {address} is loopback on a {len(ctx.nodes)}-host cluster"
                                + (" and is the leader's --master-addr" if master else ""),
                        evidence=f"cluster transport {ctx.deployment.cluster.transport.value}; "
                                 "the other nodes would connect to themselves and wait at "
                                 "'1/2 clients joined'",
                        fix="use the node's management address that the other nodes reach")
                    break


class ClockSkewRule:
    """Node clocks agree within a second (logs and timeouts are compared across nodes)."""

    name = "clock-skew"
    limit_s = 1.0

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        offsets = {node.name: facts["clock_offset_s"] for node, facts in ctx.probed()
                   if isinstance(facts.get("clock_offset_s"), (int, float))}
        if offsets and max(offsets.values()) - min(offsets.values()) > self.limit_s:
            yield Finding(rule=self.name, severity=Severity.WARNING, node=None,
                          message="node clocks disagree by more than a second",
                          evidence=_listing({n: f"{o:+.2f} s" for n, o in offsets.items()}),
                          fix="enable NTP on every node (`timedatectl set-ntp true`)")


RULES: tuple[Rule, ...] = (
    ProbeFailedRule(), VersionSkewRule(), VllmVersionRule(), ImagePresentRule(),
    ModelSnapshotRule(), InterfaceRule(), AddressOnNodeRule(), MtuRule(), RoceGidRule(),
    MemoryHeadroomRule(), GuiRule(), KnownBadEnvRule(), PortsRule(), ShmRule(),
    LoopbackMasterRule(), ClockSkewRule(),
)
"""Every rule, in report order."""


def evaluate(ctx: CheckContext, rules: Iterable[Rule] = RULES) -> list[Finding]:
    """Run every rule; errors first, then warnings, then info, each in rule order."""
    findings = [f for rule in rules for f in rule.check(ctx)]
    order = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}
    return sorted(findings, key=lambda f: order[f.severity])
