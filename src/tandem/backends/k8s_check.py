"""``tandem check`` on Kubernetes: node facts from the API server instead of a probe on the host.

A node of a ``k8s`` cluster is read from its Node object (``kubectl get nodes``): what the
kubelet reports (kernel, OS, architecture, kubelet version, the images in its containerd) and
what the device plugin advertises (``nvidia.com/gpu``). These facts use the probe's own keys
(``system.kernel``, ``images.images[]``), so the shared rules (same kernel on every node, the
recipe's image present on each node) apply unchanged.

A node cannot be checked, and so gets a ``probe_error`` the rules report as an error, when the
LeaderWorkerSet CRD is not installed, no Node carries ``kubernetes.io/hostname=<name>``, or it
advertises fewer GPUs than the inventory says (``tandem.backends.k8s.cluster_problems``).
"""

from __future__ import annotations

import subprocess
import threading
from typing import IO, Any

from tandem import wire
from tandem.backends.k8s import Kubectl, cluster_problems
from tandem.check.node_transport import ProbeError
from tandem.spec.cluster import Node
from tandem.spec.deployment import Deployment


def node_facts(node_object: dict) -> dict[str, Any]:
    """Probe-shaped facts from a Node object's status (pure)."""
    status = node_object.get("status") or {}
    info = status.get("nodeInfo") or {}
    images = []
    for image in status.get("images") or []:
        names = image.get("names") or []
        digest = next((n.split("@", 1)[1] for n in names if "@sha256:" in n), None)
        images += [{"ref": n, "id": None, "digest": digest} for n in names if "@" not in n]
    allocatable = status.get("allocatable") or {}
    return {
        "system": {
            "kernel": info.get("kernelVersion"),
            "os": info.get("osImage"),
            "arch": info.get("architecture"),
        },
        "images": {"tools": ["kubelet"], "images": images},
        "kubernetes": {
            "node": node_object["metadata"]["name"],
            "labels": node_object["metadata"].get("labels") or {},
            "kubelet_version": info.get("kubeletVersion"),
            "container_runtime": info.get("containerRuntimeVersion"),
            "allocatable": allocatable,
        },
    }


class KubernetesNodeTransport:
    """``tandem.check.node_transport.NodeTransport`` for ``transport: k8s`` (facts via the API)."""

    def __init__(self, deployment: Deployment, **options: Any) -> None:
        self.deployment = deployment
        self.kubectl = Kubectl.of(deployment.cluster)
        self._lock = threading.Lock()
        self._problems: dict[str, list[str]] | None = None
        self._nodes: dict[str, dict] = {}

    def _read_cluster(self) -> None:
        with self._lock:
            if self._problems is not None:
                return
            cluster = self.deployment.cluster
            by_node: dict[str, list[str]] = {n.name: [] for n in cluster.nodes}
            for problem in cluster_problems(cluster):
                if problem.field.startswith("nodes["):
                    index = int(problem.field[6 : problem.field.index("]")])
                    by_node[cluster.nodes[index].name].append(str(problem))
                else:  # cluster-wide: the CRD, the namespace
                    for messages in by_node.values():
                        messages.append(str(problem))
            items = (self.kubectl.get_json("nodes") or {}).get("items", [])
            self._nodes = {
                name: n
                for n in items
                if (name := (n["metadata"].get("labels") or {}).get(wire.K8S_HOSTNAME_LABEL))
            }
            self._problems = by_node

    def run_probe(self, node: Node) -> dict[str, Any]:
        self._read_cluster()
        assert self._problems is not None
        if self._problems[node.name]:
            raise ProbeError("; ".join(self._problems[node.name]), node=node.name)
        return node_facts(self._nodes[node.name])

    def spawn(
        self, node: Node, argv: list[str], env: dict[str, str], output: IO[bytes]
    ) -> subprocess.Popen:
        raise ProbeError(
            "the fabric test does not run on Kubernetes nodes in this version",
            node=node.name,
            hint="run `tandem check --fabric` over ssh to the nodes",
        )
