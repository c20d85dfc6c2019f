"""Rules for the host faults the community already paid for (``tandem.check.known_hosts``):
the kernel whose CMA is zero, a ConnectX-7 twin trained narrow by an old BIOS, one RoCE twin
left out of NCCL_IB_HCA, MTU below 9000 on RoCE, and a stale /etc/nccl.conf.

Each rule judges the mechanism the probe can see (CmaTotal, the PCIe link width, the twin's
port, the MTU, the file's lines), not a version string alone, and each finding names the
recorded value, the fix and the issue or PR where the fault was measured.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tandem import wire
from tandem.check import known_hosts as known
from tandem.check.findings import Finding
from tandem.check.known_env import known_bad
from tandem.check.rules.context import (
    UP_STATES,
    CheckContext,
    fact,
    interfaces_of,
    rdma_devices_of,
)
from tandem.spec.cluster import Node


def listed_hcas(ctx: CheckContext, node: Node) -> list[str] | None:
    """The HCAs NCCL_IB_HCA gives the node's rank (``:port`` dropped), None for an exclusion
    list (``^...``), which names what NCCL must not use."""
    value = (ctx.rank_env.get(node.name) or {}).get(wire.NCCL_IB_HCA)
    if value is None:
        return ctx.hcas(node)
    if value.startswith("^"):
        return None
    return [h.split(":")[0] for h in value.lstrip("=").split(",") if h]


class CmaZeroRule:
    """CmaTotal 0 on a node that uses RDMA: NCCL's ``ibv_reg_mr`` fails with ENOMEM."""

    name = known.CMA_ZERO.rule

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        if not ctx.uses_ib or not ctx.multi_host:
            return
        for node, facts in ctx.probed():
            if fact(facts, "memory", "cma_total_bytes") != 0:
                continue
            kernel = fact(facts, "system", "kernel")
            known_kernel = kernel == known.CMA_KERNEL
            yield known.CMA_ZERO.finding(
                node.name,
                f"kernel {kernel} has no CMA memory (CmaTotal 0) and the data plane is RoCE"
                + (": the known-bad DGX OS kernel of September 2026" if known_kernel else ""),
                f"/proc/meminfo CmaTotal: 0 kB on {kernel}; {known.CMA_ZERO.effect}",
            )


class NarrowTwinRule:
    """On a Spark, each ConnectX-7 twin in use links at PCIe x4; an old BIOS trains one at x2."""

    name = known.NARROW_TWIN.rule

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        if not ctx.uses_ib:
            return
        for node, facts in ctx.probed():
            if not known.is_spark(facts):
                continue
            devices = rdma_devices_of(facts)
            narrow = {
                hca: devices[hca]["pci"]
                for hca in listed_hcas(ctx, node) or []
                if (devices.get(hca) or {}).get("pci")
                and (devices[hca]["pci"].get("current_link_width") or known.TWIN_LINK_WIDTH)
                < known.TWIN_LINK_WIDTH
            }
            if not narrow:
                continue
            yield known.NARROW_TWIN.finding(
                node.name,
                f"{', '.join(narrow)} link(s) at PCIe "
                f"x{min(p['current_link_width'] for p in narrow.values())}, not the "
                f"x{known.TWIN_LINK_WIDTH} of a GB10 twin: {known.NARROW_TWIN.effect}",
                "; ".join(
                    f"{hca} ({p.get('slot')}): current_link_width {p['current_link_width']}, "
                    f"max_link_width {p.get('max_link_width')}, current_link_speed "
                    f"{p.get('current_link_speed')}"
                    for hca, p in narrow.items()
                ),
            )


class MissingTwinRule:
    """On a Spark, NCCL_IB_HCA lists both twins of a QSFP port whose other half is up."""

    name = known.MISSING_TWIN.rule

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        if not ctx.uses_ib or not ctx.multi_host:
            return
        for node, facts in ctx.probed():
            listed = listed_hcas(ctx, node)
            if listed is None or not known.is_spark(facts):
                continue
            devices = rdma_devices_of(facts)
            for hca in listed:
                twin = known.twin_of(hca, list(devices))
                if twin is None or twin in listed or not _active(devices[twin]):
                    continue
                yield known.MISSING_TWIN.finding(
                    node.name,
                    f"NCCL_IB_HCA has {hca} but not its twin {twin}: {known.MISSING_TWIN.effect}",
                    f"NCCL_IB_HCA={','.join(listed)}; {twin} "
                    f"({', '.join(devices[twin].get('netdevs') or [])}) port ACTIVE on the same "
                    f"QSFP port as {hca}",
                )


def _active(device: dict[str, Any]) -> bool:
    return any(p.get("state") == "ACTIVE" for p in device.get("ports") or [])


class SmallMtuRule:
    """The RoCE data plane runs at MTU 9000 (``MtuRule`` only compares nodes with each other)."""

    name = known.SMALL_MTU.rule

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        if not ctx.uses_ib or not ctx.multi_host:
            return
        for node, facts in ctx.probed():
            interfaces = interfaces_of(facts)
            devices = rdma_devices_of(facts)
            small = {}
            for hca in listed_hcas(ctx, node) or []:
                device = devices.get(hca) or {}
                if not any(p.get("link_layer") == "Ethernet" for p in device.get("ports") or []):
                    continue  # InfiniBand: no Ethernet frames to enlarge
                for netdev in device.get("netdevs") or []:
                    interface = interfaces.get(netdev) or {}
                    mtu = interface.get("mtu")
                    if interface.get("state") in UP_STATES and mtu and mtu < known.JUMBO_MTU:
                        small[netdev] = mtu
            if small:
                yield known.SMALL_MTU.finding(
                    node.name,
                    f"MTU {min(small.values())} on the RoCE data plane, not "
                    f"{known.JUMBO_MTU}: {known.SMALL_MTU.effect}",
                    ", ".join(f"{n} mtu {m}" for n, m in small.items()),
                )


class StaleNcclConfRule:
    """/etc/nccl.conf lines that contradict the rank's NCCL environment, and known-bad lines
    that the environment leaves in force."""

    name = known.STALE_NCCL_CONF.rule

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        recipe_env = ctx.deployment.recipe.env
        for node, facts in ctx.probed():
            settings = fact(facts, "nccl_conf", "settings") or {}
            path = fact(facts, "nccl_conf", "path")
            env = ctx.rank_env.get(node.name) or {**recipe_env, **node.env}
            contradicted = {k: v for k, v in settings.items() if k in env and env[k] != v}
            if contradicted:
                yield known.STALE_NCCL_CONF.finding(
                    node.name,
                    f"{path} contradicts the rank's NCCL environment in "
                    f"{len(contradicted)} line(s): {known.STALE_NCCL_CONF.effect}",
                    "; ".join(
                        f"{path}: {k}={v} (the rank sets {k}={env[k]})"
                        for k, v in contradicted.items()
                    ),
                )
            for key, value in settings.items():
                row = known_bad(key, value, uses_ib=ctx.uses_ib)
                if row is None or key in env or not key.startswith("NCCL_"):
                    continue
                yield Finding(
                    rule=self.name,
                    severity=row.severity,
                    node=node.name,
                    message=f"{path} sets {key}={value}, which NCCL applies since the rank "
                    f"does not set {key}: it {row.effect}",
                    evidence=f"{path}: {key}={value}; known from {row.source}",
                    fix=f"delete the line from {path} (or from the image), or override it in "
                    f"the recipe's env ({row.fix})",
                )
