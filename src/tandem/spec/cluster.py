"""The cluster inventory: where a recipe runs.

A cluster lists nodes in rank order (the first node is the leader, node rank 0), how tandem
reaches each one, and the per-node facts that differ between otherwise identical hosts:
interface names, RDMA devices, GPUs, extra variables.
"""

from __future__ import annotations

import csv
import ipaddress
import re
import shlex
from enum import StrEnum
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    Field,
    ModelWrapValidatorHandler,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails

from tandem import wire
from tandem.errors import FieldFault
from tandem.spec.addresses import is_ip, is_loopback
from tandem.spec.kubernetes import KubernetesOptions
from tandem.spec.paths import check_node_folder
from tandem.spec.recipe import (
    ENV_VALUES,
    EnvVars,
    HostAddress,
    StrictModel,
    becomes,
    fault_at,
    refuse_inline_secrets,
    unless_null,
)


class Transport(StrEnum):
    """How tandem reaches the nodes.

    - ``local``: this machine; with root each node is a network namespace joined to a bridge,
      otherwise all nodes share loopback.
    - ``ssh``: the system's OpenSSH client, so ``~/.ssh/config`` and agents apply.
    - ``k8s``: kubectl against a cluster running the LeaderWorkerSet controller.
    """

    LOCAL = "local"
    SSH = "ssh"
    K8S = "k8s"


class LocalIsolation(StrEnum):
    """How the ``local`` transport separates nodes on one machine.

    - ``netns``: one network namespace per node, joined by veth pairs to a bridge (needs root).
    - ``loopback``: every node on 127.0.0.1, told apart by ports and CPU binding.
    - ``auto``: ``netns`` when running as root, else ``loopback``.
    """

    NETNS = "netns"
    LOOPBACK = "loopback"
    AUTO = "auto"


class Node(StrictModel):
    """``nodes[]`` — one host (or namespace, or Kubernetes node) that runs one rank."""

    name: str = Field(
        description="Node name, e.g. `spark-101`; for k8s the `kubernetes.io/hostname` label value."
    )
    address: HostAddress = Field(
        json_schema_extra=becomes(wire.MASTER_ADDR_FLAG, wire.VLLM_HOST_IP),
        description="Address the other nodes reach this one at on the control "
        "plane; the leader's is `--master-addr`, each rank's is VLLM_HOST_IP.",
    )
    gpus: int = Field(
        examples=[2],
        default=1,
        ge=1,
        description="Accelerators on the node that vLLM may use "
        "(on the CPU backend: worker slots). Default 1, as on a DGX Spark.",
    )
    data_address: str | None = Field(
        examples=["192.168.100.11"],
        default=None,
        description="The node's address on the fast link (a Spark's ConnectX-7 netdev), which "
        "`tandem model pull` copies the weights over. Default: `address`.",
    )
    ssh_host: str | None = Field(
        examples=["spark-a"],
        default=None,
        description="Host for ssh (an alias from ~/.ssh/config works). Default: `address`.",
    )
    ssh_user: str | None = Field(default=None, description="User for ssh. Default: ssh's own.")
    ssh_port: int | None = Field(
        examples=[2222], default=None, ge=1, le=65535, description="Port for ssh."
    )
    control_plane_interface: str | None = Field(
        json_schema_extra=becomes(*wire.CONTROL_PLANE_VARS),
        default=None,
        description="Overrides the recipe's control-plane interface on this node.",
    )
    hcas: list[str] | None = Field(
        examples=[["rocep1s0f1"]],
        json_schema_extra=becomes(wire.NCCL_IB_HCA),
        default=None,
        description="Overrides the recipe's RDMA devices (NCCL_IB_HCA) on this node.",
    )
    env: EnvVars = Field(
        json_schema_extra=becomes("each NAME=VALUE") | ENV_VALUES,
        default_factory=dict,
        description="Variables for this node's rank, applied last.",
    )
    cpus: str | None = Field(
        examples=["0-3"],
        json_schema_extra=becomes("taskset -c CPUS"),
        default=None,
        description="Local transport only: the CPUs of this machine the node's processes run on "
        "(a list as taskset takes it, e.g. `0` or `0-3,8`), so that a node of one machine "
        "behaves as a host of its own: no process of another node runs on them, and none of "
        "this node's moves onto another's busy core. Default: any CPU.",
    )

    @field_validator("name")
    @classmethod
    def _name_shape(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.\-]{0,61}[A-Za-z0-9])?", value):
            raise ValueError(f"'{value}' is not a host name; use letters, digits, dots, dashes")
        return value

    @field_validator("cpus")
    @classmethod
    def _cpus_shape(cls, value: str | None) -> str | None:
        if value is not None:
            cpu_list(value)
        return value

    @field_validator("ssh_host")
    @classmethod
    def _ssh_host_shape(cls, value: str | None) -> str | None:
        # a leading '-' would reach ssh as an option, not a destination
        if value is not None and not re.fullmatch(
            r"[A-Za-z0-9_.:%\[\]][A-Za-z0-9_.:%\-\[\]]*", value
        ):
            raise FieldFault(
                f"'{value}' is not a host for ssh",
                hint="write an address, a host name or an alias from "
                "~/.ssh/config (no spaces, not starting with '-'), or leave it out",
            )
        return value

    @field_validator("ssh_user")
    @classmethod
    def _ssh_user_shape(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,31}\$?", value):
            raise FieldFault(
                f"'{value}' is not a user name for ssh",
                hint="write the login name on the node (letters, digits, '_', '.', '-'), "
                "or leave it out for ssh's own",
            )
        return value

    @property
    def is_loopback(self) -> bool:
        """True when ``address`` is a loopback address or ``localhost``."""
        return is_loopback(self.address)


class LocalOptions(StrictModel):
    """``local:`` — settings of the ``local`` transport."""

    isolation: LocalIsolation = Field(
        default=LocalIsolation.AUTO, description="`netns`, `loopback` or `auto` (netns as root)."
    )
    subnet: str = Field(
        examples=["10.78.0.0/24"],
        default="10.77.0.0/24",
        description="Subnet of the namespaces' bridge; "
        "nodes' addresses must lie in it. The bridge takes the last host address.",
    )

    @field_validator("subnet")
    @classmethod
    def _subnet_shape(cls, value: str) -> str:
        try:
            ipaddress.ip_network(value)
        except ValueError as exc:
            raise ValueError(f"'{value}' is not a subnet; write e.g. 10.77.0.0/24") from exc
        return value


class Runtime(StrEnum):
    """How the ``ssh`` transport runs a rank on its node.

    - ``venv``: a vLLM installed on the host (``ssh.vllm_command``), run as a detached process
      in its own session, with its own log file.
    - ``docker``: the recipe's ``engine.image`` pinned by digest, one container per rank with
      host network and IPC (``tandem render --target docker`` prints the command).
    - ``auto``: ``docker`` when the recipe names an image, else ``venv``.
    """

    VENV = "venv"
    DOCKER = "docker"
    AUTO = "auto"


def check_command(value: str) -> str:
    """``value`` when it splits into shell words, the first one a program (``sudo docker``).

    Raises:
        FieldFault: it is empty, or its quotes do not close (``shlex.split`` refuses it).
    """
    try:
        words = shlex.split(value)
    except ValueError as exc:
        raise FieldFault(
            f"'{value}' cannot be split into words ({exc})", hint="close its quotes"
        ) from None
    if not words:
        raise FieldFault(
            "is empty: no program to run",
            hint="name the program, e.g. `docker` or `sudo docker`, or leave the field out "
            "for the default",
        )
    return value


NodeCommand = Annotated[str, AfterValidator(check_command), AfterValidator(refuse_inline_secrets)]
"""A program run on the nodes with its leading words (``sudo docker``): words a shell splits,
no credential inline."""


_GPU_KEYS = ("count", "device", "driver", "capabilities", "options")
"""The keys of docker's ``--gpus`` (docker/cli ``opts/gpus.go``); a bare value is a count."""


def check_gpu_request(value: str) -> str:
    """``value`` when docker's ``--gpus`` takes it: ``all``, a count, or comma-separated
    ``key=value`` fields (a field holding a comma quoted, as in ``'"device=0,1"'``).

    YAML reads ``none`` as text, not as null; docker would refuse ``--gpus none`` on every
    node, so it is refused here with the spelling that leaves the flag out.

    Raises:
        FieldFault: naming what docker would refuse.
    """
    if value.strip().lower() in ("none", "null", "no", "false", "0", ""):
        raise FieldFault(
            f"'{value}' is not a GPU request: docker's --gpus takes all, a count or "
            "device=..., and YAML reads an unquoted none as the text 'none'",
            hint="write `docker_gpus: null` to leave --gpus out (CPU-only nodes), or e.g. "
            "all or device=0",
        )
    faults = []
    seen: set[str] = set()
    for item in next(csv.reader([value]), []):
        key, eq, setting = item.partition("=")
        if not eq:
            key, setting = "count", item
        if key not in _GPU_KEYS:
            faults.append(f"unknown key '{key}' (docker knows {', '.join(_GPU_KEYS)})")
        elif key in seen:
            faults.append(f"'{key}' is given twice")
        elif key == "count" and not (setting == "all" or (setting.isdigit() and int(setting) > 0)):
            faults.append(f"count '{setting}' is neither all nor a number of GPUs")
        seen.add(key)
    if {"count", "device"} <= seen:
        faults.append("a count and devices together (docker refuses both at once)")
    if faults:
        raise FieldFault(
            f"'{value}' is not a GPU request docker takes: " + "; ".join(faults),
            hint="write all, a count such as 2, device=0, or several devices quoted as "
            "'\"device=0,1\"'; null leaves --gpus out",
        )
    return value


class SSHOptions(StrictModel):
    """``ssh:`` — settings of the ``ssh`` transport (the system's OpenSSH client)."""

    config_file: str | None = Field(
        examples=["~/.ssh/tandem_config"],
        default=None,
        description="ssh_config file passed as "
        "`ssh -F`. Default: `$TANDEM_SSH_CONFIG`, else ssh's own "
        "(~/.ssh/config), so aliases, agents and jump hosts apply.",
    )
    runtime: Runtime = Field(
        examples=["docker"],
        default=Runtime.AUTO,
        description="`venv`, `docker` or `auto` (docker when the recipe has engine.image).",
    )
    vllm_command: NodeCommand = Field(
        examples=["/opt/vllm/.venv/bin/vllm"],
        default="vllm",
        description="The `vllm` program on the nodes for "
        "the venv runtime, e.g. `/opt/vllm/.venv/bin/vllm`. Default: "
        "`vllm` on the login PATH.",
    )
    docker_command: NodeCommand = Field(
        examples=["sudo docker"],
        default="docker",
        description="The docker CLI on the nodes, e.g. `sudo docker`.",
    )
    docker_gpus: Annotated[str | None, unless_null(check_gpu_request)] = Field(
        examples=[None],
        default="all",
        description="`--gpus` of each rank's container (docker runtime): `all`, or a device "
        "request such as `device=0`; null leaves the flag out (CPU-only nodes, where docker "
        "refuses `--gpus`). Default `all`, as the seeds run.",
    )
    remote_dir: Annotated[str, AfterValidator(check_node_folder)] = Field(
        examples=["~/tandem"],
        default="/tmp/tandem",
        description="Folder on each node for the "
        "ranks' logs, pid files and TMPDIR (kept short: vLLM's IPC socket "
        "paths must fit in 107 bytes). One subfolder per deployment and rank. Absolute, or "
        "`~/...` in the ssh user's home.",
    )
    connect_timeout_s: float = Field(
        examples=[30], default=10, gt=0, description="ssh ConnectTimeout, seconds."
    )
    router_node: str | None = Field(
        examples=["spark-a"],
        default=None,
        description="With replicas: the node (by name) that runs vLLM's router, bound to that "
        "node's address, which becomes the deployment's front door. Its admin API has no key, "
        "so keep that network private. Default: this machine, on 127.0.0.1.",
    )
    router_command: NodeCommand = Field(
        examples=["/opt/router/.venv/bin/vllm-router"],
        default="vllm-router",
        description="The `vllm-router` program on `router_node`, e.g. "
        "`/opt/router/.venv/bin/vllm-router`. Default: `vllm-router` on the login PATH.",
    )


class Cluster(StrictModel):
    """A cluster inventory: nodes in rank order, the first one leads."""

    name: str = Field(description="Cluster name, for messages and state.")
    transport: Transport = Field(default=Transport.SSH, description="`local`, `ssh` or `k8s`.")
    nodes: list[Node] = Field(
        min_length=1,
        description="Nodes in rank order; the first is the "
        "leader (node rank 0) and serves the API.",
    )
    local: LocalOptions = Field(default_factory=LocalOptions)
    ssh: SSHOptions = Field(default_factory=SSHOptions)
    namespace: str = Field(
        examples=["inference"],
        default="default",
        description="Kubernetes namespace (k8s transport).",
    )
    kubernetes: KubernetesOptions = Field(default_factory=KubernetesOptions)

    @field_validator("namespace")
    @classmethod
    def _namespace_shape(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", value):
            raise FieldFault(
                f"'{value}' is not a Kubernetes namespace name",
                hint="lower case letters, digits and dashes, at most 63 characters, starting "
                "and ending alphanumeric (a DNS-1123 label), e.g. default",
            )
        return value

    @model_validator(mode="wrap")
    @classmethod
    def _across_nodes(cls, data: Any, handler: ModelWrapValidatorHandler[Cluster]) -> Cluster:
        """Checks across nodes (names and addresses that repeat, namespace addresses) also run
        on the raw input when a field is invalid, so one report holds both, each at its node."""
        try:
            cluster = handler(data)
        except ValidationError as exc:
            faults = node_faults(_raw(data))
            if not faults:
                raise
            raise ValidationError.from_exception_data(
                cls.__name__, [*(_details(e) for e in exc.errors()), *faults]
            ) from None
        faults = node_faults(cluster.model_dump(mode="json"))
        if faults:
            raise ValidationError.from_exception_data(cls.__name__, faults)
        return cluster

    @property
    def leader(self) -> Node:
        return self.nodes[0]


def _raw(data: Any) -> dict[str, Any]:
    """The input of a Cluster as plain data (a caller may pass Node objects)."""
    if isinstance(data, BaseModel):
        return data.model_dump(mode="json")
    if not isinstance(data, dict):
        return {}
    nodes = data.get("nodes")
    if isinstance(nodes, list):
        nodes = [n.model_dump(mode="json") if isinstance(n, BaseModel) else n for n in nodes]
    local = data.get("local")
    if isinstance(local, BaseModel):
        local = local.model_dump(mode="json")
    transport = data.get("transport", Transport.SSH)
    return {**data, "nodes": nodes, "local": local, "transport": str(transport)}


def node_faults(data: dict[str, Any]) -> list[InitErrorDetails]:
    """Faults across the nodes of a (possibly invalid) cluster, each at the node it concerns."""
    nodes = data.get("nodes")
    if not isinstance(nodes, list):
        return []
    faults: list[InitErrorDetails] = []

    def fault(i: int, key: str, message: str, hint: str) -> None:
        faults.append(fault_at(("nodes", i, key), nodes[i].get(key), message, hint))

    transport = data.get("transport")
    local = data.get("local")
    if not isinstance(local, dict):
        local = {}
    first: dict[tuple[str, Any], int] = {}
    for i, node in enumerate(nodes):
        if not isinstance(node, dict):
            continue
        keys = ["name"] if transport == Transport.LOCAL.value else ["name", "address"]
        for key in keys:
            value = node.get(key)
            if not isinstance(value, str) or not value:
                continue
            if (key, value) in first:
                j = first[(key, value)]
                fault(
                    i,
                    key,
                    f"'{value}' is also nodes[{j}]'s {key}",
                    "list each node once"
                    if key == "name"
                    else "give each node of a multi-host cluster its own address",
                )
            first.setdefault((key, value), i)
    if transport != Transport.LOCAL.value:
        for i, node in enumerate(nodes):
            if isinstance(node, dict) and node.get("cpus") is not None:
                fault(
                    i,
                    "cpus",
                    f"cpus confines a node of this machine, but the cluster's transport is "
                    f"{transport}: each of its nodes is a host of its own",
                    "remove it (on a host, set VLLM_CPU_OMP_THREADS_BIND in the node's env)",
                )
    if transport == Transport.LOCAL.value and local.get("isolation", "auto") != "loopback":
        try:
            subnet = ipaddress.ip_network(local.get("subnet", LocalOptions().subnet))
        except (TypeError, ValueError):
            return faults
        for i, node in enumerate(nodes):
            address = node.get("address") if isinstance(node, dict) else None
            if not isinstance(address, str) or not address:
                continue
            if not is_ip(address):
                fault(
                    i,
                    "address",
                    f"'{address}' is a host name, but the nodes of a local "
                    f"cluster are network namespaces with addresses in {subnet}",
                    f"use an address in {subnet}, or isolation: loopback (every node on 127.0.0.1)",
                )
            elif ipaddress.ip_address(address) not in subnet:
                fault(
                    i,
                    "address",
                    f"{address} is outside local.subnet {subnet}",
                    "use an address in it, or change local.subnet",
                )
    return faults


def cpu_list(value: str) -> set[int]:
    """The CPUs a taskset list names (``0``, ``0-3,8``).

    Raises:
        FieldFault: the text is not such a list.
    """
    cpus: set[int] = set()
    for item in value.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:-(\d+))?\s*", item)
        if not match or (match[2] and int(match[2]) < int(match[1])):
            raise FieldFault(
                f"'{value}' is not a list of CPUs",
                hint="write CPU numbers and ranges as taskset takes them, e.g. 0, 2-3 or 0-3,8",
            )
        cpus.update(range(int(match[1]), int(match[2] or match[1]) + 1))
    return cpus


def cpu_text(cpus: set[int]) -> str:
    """A set of CPUs as a taskset list (``0-3,8``), the inverse of ``cpu_list``."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and runs[-1][1] == cpu - 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _details(error: Any) -> InitErrorDetails:
    """A pydantic error as reported, turned back into one that can be raised again."""
    details = InitErrorDetails(type=error["type"], loc=tuple(error["loc"]), input=error["input"])
    if "ctx" in error:
        details["ctx"] = error["ctx"]
    return details
