"""Host faults the DGX Spark community has already paid for, as data with their sources.

Each fault took a working two-Spark fabric from ~20-24 GB/s of NCCL bus bandwidth down to
~3-12 GB/s, or stopped NCCL altogether, and each cost someone a weekend to find. The rules in
``tandem.check.rules.host_faults`` and the fabric verdict in ``tandem.check.fabric`` read this
module; a new lesson is a new entry here, with the issue or PR where it was measured.
Environment variables (and so ``/etc/nccl.conf`` lines) known to be bad live in ``known_env``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tandem.check.findings import Finding, Severity

SPARK_GPU = "NVIDIA GB10"
"""What nvidia-smi calls a DGX Spark's GPU (eugr/spark-vllm-docker autodiscover.sh identifies a
Spark peer by it)."""


@dataclass(frozen=True)
class HostFault:
    """One known fault: its rule id, how bad it is, what it does, the fix, and where it was seen."""

    rule: str
    severity: Severity
    effect: str
    fix: str
    source: str

    def finding(self, node: str, message: str, evidence: str) -> Finding:
        """This fault seen on ``node``: its rule, severity and fix, and evidence that ends with
        where the fault was measured, so a user can read how it was found and fixed."""
        return Finding(
            rule=self.rule,
            severity=self.severity,
            node=node,
            message=message,
            evidence=f"{evidence}; known from {self.source}",
            fix=self.fix,
        )


CMA_KERNEL = "7.0.0-1019-nvidia"
"""The DGX OS kernel (September 2026 update) whose /proc/meminfo shows ``CmaTotal: 0 kB``."""
WORKING_KERNEL = "6.17.0-1031-nvidia"

CMA_ZERO = HostFault(
    rule="kernel-cma-zero",
    severity=Severity.ERROR,
    effect="NCCL cannot register memory with the NIC (`ibv_reg_mr` ENOMEM, even for 1 KB), so "
    "every RoCE collective fails at start",
    fix=f"boot a kernel known to work, e.g. {WORKING_KERNEL} (`sudo grub-reboot` into it, then "
    "`sudo apt-mark hold` the kernel packages until a fixed one ships)",
    source="eugr/spark-vllm-docker #392; luxingcom/aicad-nccl-optimization #1",
)

TWIN_LINK_WIDTH = 4
"""PCIe lanes of each ConnectX-7 controller ("twin") of a GB10 QSFP port: Gen5 x4."""

NARROW_TWIN = HostFault(
    rule="pcie-link-narrow",
    severity=Severity.WARNING,
    effect="the controller carries half its share of the QSFP port, which caps NCCL's bus "
    "bandwidth over it",
    fix="update the BIOS to the 2026-04 release or later (`sudo fwupdmgr refresh && sudo "
    "fwupdmgr update`, then reboot) before measuring anything",
    source="tonyd2wild/DeepSeek-v4-Flash-Vision-Exp-DSpark-1M-NVFP4-KV-2x-DGX-Spark PR #35 "
    "(pre-2026-04 BIOS wires the second controller at Gen5 x2)",
)

MISSING_TWIN = HostFault(
    rule="roce-twin-missing",
    severity=Severity.WARNING,
    effect="NCCL uses half of the 200G port: nccl-tests busbw 98 Gb/s (12.3 GB/s) with one "
    "HCA against 161 Gb/s (20.1 GB/s) with both and NCCL_IB_MERGE_NICS=1",
    fix="list both twins in network.data_plane.hcas (or the node's hcas), e.g. "
    "[rocep1s0f1, roceP2p1s0f1], and keep merge_nics: true",
    source="NVIDIA/dgx-spark-playbooks #102 / PR #103; tonyd2wild/...-2x-DGX-Spark PR #35; "
    "eugr/spark-vllm-docker docs/NETWORKING.md",
)
_TWIN_NAME = re.compile(r"^(?P<kind>[a-z]+?)(?P<domain>P\d+)?(?P<tail>p\d+s\d+f\d+)$")


def twin_of(hca: str, devices: list[str]) -> str | None:
    """The other half of ``hca``'s QSFP port among ``devices``: the same bus, slot and function
    in another PCI domain (``rocep1s0f1`` and ``roceP2p1s0f1``), else None."""
    match = _TWIN_NAME.match(hca)
    if match is None:
        return None
    for name in devices:
        other = _TWIN_NAME.match(name)
        if (
            other
            and name != hca
            and other["kind"] == match["kind"]
            and other["tail"] == match["tail"]
            and other["domain"] != match["domain"]
        ):
            return name
    return None


JUMBO_MTU = 9000
SMALL_MTU = HostFault(
    rule="mtu-below-9000",
    severity=Severity.WARNING,
    effect="RoCE runs with small frames: 18.94 / 20.95 GB/s (16 GiB all_gather, out-of-place / "
    "in-place) at MTU 1500 against 23.74 GB/s at MTU 9000 between two Sparks",
    fix=f"set MTU {JUMBO_MTU} on both twins of every node (netplan `mtu: {JUMBO_MTU}`, then "
    "`sudo netplan apply`) and on the switch, if there is one",
    source="NVIDIA/dgx-spark-playbooks #25, #102 / PR #103",
)

STALE_NCCL_CONF = HostFault(
    rule="stale-nccl-conf",
    severity=Severity.WARNING,
    effect="NCCL reads /etc/nccl.conf and an environment variable wins only while it is set: a "
    "launch path that drops the rank's env (a `docker exec`, nccl-tests, a worker whose env "
    "was not propagated) runs with these lines",
    fix="delete the stale lines from /etc/nccl.conf on the host, or rebuild the image without them",
    source="luxingcom/aicad-nccl-optimization #1 (a stale /etc/nccl.conf in the image broke "
    "NCCL); eugr/spark-vllm-docker #146 (recipe env not propagated to the worker)",
)

SPARK_PAIR_BUSBW_GBPS = 20.0
"""NCCL bus bandwidth a Spark pair over one QSFP cable reaches at >= 1 GiB messages with both
twins, MTU 9000 and a release NCCL: 20.1 GB/s (tonyd2wild PR #35) to 23.74 GB/s
(NVIDIA/dgx-spark-playbooks #102)."""
SPARK_PAIR_FLOOR_GBPS = 12.0
"""Below this one twin is missing or NCCL fell back to TCP: 12.3 GB/s with one HCA (PR #35)."""
VERDICT_MIN_BYTES = 1 << 30
"""The fabric verdict needs a message this large: smaller ones do not reach the link's rate."""
SPARK_PAIR_SOURCES = (
    "NVIDIA/dgx-spark-playbooks #102 / PR #103, #25; tonyd2wild/...-2x-DGX-Spark PR #35"
)
SLOW_SPARK_PAIR_CAUSES = (
    "one twin missing from NCCL_IB_HCA (12.3 GB/s, PR #35), NCCL over TCP, MTU 1500 "
    "(18.9-21 GB/s, playbooks #25), the second controller at Gen5 x2 (pre-2026-04 BIOS, PR #35), "
    "a dev-branch NCCL build (3.04 GB/s where release v2.28.9-1 gives 23.74, playbooks #102)"
)
"""What the Spark community found behind a pair below its bandwidth, in order of how common."""


def is_spark(facts: dict[str, Any]) -> bool:
    """The probe saw GPUs on the node and every one is a GB10."""
    gpus = (facts.get("gpu") or {}).get("gpus") or []
    return bool(gpus) and all(g.get("name") == SPARK_GPU for g in gpus)
