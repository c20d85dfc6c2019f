"""A Deployment is a Recipe placed on a Cluster; everything else is derived from it.

This module also builds the cluster that ``tandem`` uses when no inventory is given: the nodes
of this one machine, one per rank, as network namespaces (root) or on loopback.
"""

from __future__ import annotations

import ipaddress
import re

from pydantic import BaseModel, ConfigDict

from tandem import ownership, wire
from tandem.errors import Problem, ProblemList, SpecError
from tandem.spec.cluster import Cluster, LocalIsolation, LocalOptions, Node, Transport
from tandem.spec.kubernetes import LeaderAddress
from tandem.spec.recipe import DataPlaneTransport, ExecutorBackend, Recipe

LOCAL_CLUSTER_NAME = "local"


class Deployment(BaseModel):
    """Recipe x Cluster: what to serve, and where."""

    model_config = ConfigDict(frozen=True)

    recipe: Recipe
    cluster: Cluster
    recipe_file: str | None = None
    """Where the recipe was read from (a path, or `built-in recipe 'NAME'`), for messages."""
    cluster_file: str | None = None
    """Where the cluster was read from; None for this machine's own cluster."""

    @property
    def name(self) -> str:
        return self.recipe.name

    def file_of(self, field_path: str) -> str | None:
        """The file a dotted field path of a problem lives in: ``nodes[0].address`` is the
        cluster's, ``engine.serve`` the recipe's."""
        top = re.split(r"[.\[]", field_path, maxsplit=1)[0]
        if top in Cluster.model_fields and top not in Recipe.model_fields:
            return self.cluster_file or "this machine's cluster"
        return self.recipe_file

    @property
    def nodes_per_group(self) -> int:
        """Nodes of one group: the cluster's nodes over ``replicas`` (all of them for one)."""
        return max(len(self.cluster.nodes) // self.recipe.replicas, 1)

    @property
    def world_size(self) -> int:
        """Devices the engine spans: tensor-parallel x pipeline-parallel size."""
        serve = self.recipe.engine.serve
        return serve.tensor_parallel_size * serve.pipeline_parallel_size


def interface_name(index: int) -> str:
    """Name of node ``index``'s interface inside its namespace on the local transport."""
    return f"tdm{index}"


def local_cluster(
    nodes: int,
    *,
    isolation: LocalIsolation = LocalIsolation.NETNS,
    cpu_count: int = 1,
    gpu_count: int = 0,
    subnet: str = "10.77.0.0/24",
    confine: bool = False,
) -> Cluster:
    """The cluster of this machine: ``nodes`` nodes with one device each.

    Each node gets its own device, as if it were its own host: ``CUDA_VISIBLE_DEVICES=i`` when
    the machine has a GPU per node, else its own CPU core (``VLLM_CPU_OMP_THREADS_BIND``), so
    that two CPU workers never bind the same core.

    Args:
        nodes: how many nodes (ranks) to create.
        isolation: ``netns`` gives each node its own address on ``subnet``; ``loopback`` puts
            every node on 127.0.0.1.
        cpu_count: cores of this machine, to spread CPU workers.
        gpu_count: GPUs of this machine.
        confine: on CPU, with a core for each node, run all of a node's processes on its core
            (``cpus``), not only its worker: for groups behind one router, so that a group's
            new start never moves onto the core another group keeps busy (where this kernel
            was seen to hold it for minutes).

    Raises:
        SpecError: more nodes than ``subnet`` has addresses for, beside its bridge's (the
            last); the caller names the file or flag that asked for them.
    """
    hosts = list(ipaddress.ip_network(subnet).hosts())
    if nodes > len(hosts) - 1:  # 253 on the default /24
        raise SpecError(
            f"{nodes} ranks (tensor_parallel_size x pipeline_parallel_size x replicas) "
            f"cannot each have a node of this machine, which holds {len(hosts) - 1} on {subnet}",
            hint="give a cluster of real nodes with --cluster, or lower the sizes",
        )
    result = []
    for i in range(nodes):
        cpus = None
        if gpu_count >= nodes:
            env = {"CUDA_VISIBLE_DEVICES": str(i)}
        else:
            env = {wire.VLLM_CPU_OMP_THREADS_BIND: str(i % max(cpu_count, 1))}
            cpus = str(i) if confine and nodes <= cpu_count else None
        loopback = isolation is LocalIsolation.LOOPBACK
        address, interface = ("127.0.0.1", "lo") if loopback else (str(hosts[i]), interface_name(i))
        result.append(
            Node(
                name=f"node{i}",
                address=address,
                control_plane_interface=interface,
                env=env,
                cpus=cpus,
            )
        )
    return Cluster(
        name=LOCAL_CLUSTER_NAME,
        transport=Transport.LOCAL,
        nodes=result,
        local=LocalOptions(isolation=isolation, subnet=subnet),
    )


def resolve_isolation(cluster: Cluster, *, as_root: bool) -> Cluster:
    """Make a local cluster's ``auto`` isolation concrete; loopback moves every node to 127.0.0.1.

    Any other cluster is returned as it is.
    """
    if cluster.transport is not Transport.LOCAL:
        return cluster
    isolation = cluster.local.isolation
    if isolation is LocalIsolation.AUTO:
        isolation = LocalIsolation.NETNS if as_root else LocalIsolation.LOOPBACK
    nodes = cluster.nodes
    if isolation is LocalIsolation.LOOPBACK:
        nodes = [
            n.model_copy(update={"address": "127.0.0.1", "control_plane_interface": "lo"})
            for n in nodes
        ]
    local = cluster.local.model_copy(update={"isolation": isolation})
    return cluster.model_copy(update={"nodes": nodes, "local": local})


def group_name(name: str, group: int) -> str:
    """The name of group ``group`` of deployment ``name`` (its state, processes, networks)."""
    return f"{name}-g{group}"


def groups(deployment: Deployment) -> list[Deployment]:
    """The deployment's groups, each a deployment of one TP x PP group on its own nodes.

    Group g runs on nodes ``g*k .. g*k+k-1`` of the cluster (``k = nodes_per_group``), under
    the name ``NAME-gG``, so it has its own rank plan, state, ports, caches and logs, and stays
    the unit of launch, health and restart. On this machine's network namespaces each group is
    its own small LAN: group g's nodes move to the g-th subnet after the cluster's (10.77.0.0/24
    -> 10.77.1.0/24), since two bridges cannot hold one subnet. One replica is the deployment.
    """
    recipe, cluster = deployment.recipe, deployment.cluster
    if recipe.replicas == 1:
        return [deployment]
    k = deployment.nodes_per_group
    result = []
    for g in range(recipe.replicas):
        nodes = list(cluster.nodes[g * k : (g + 1) * k])
        local = cluster.local
        if cluster.transport is Transport.LOCAL and local.isolation is LocalIsolation.NETNS:
            subnet = ipaddress.ip_network(local.subnet)
            step = g * subnet.num_addresses
            shifted = ipaddress.ip_network((int(subnet.network_address) + step, subnet.prefixlen))
            nodes = [
                n.model_copy(update={"address": str(ipaddress.ip_address(n.address) + step)})
                for n in nodes
            ]
            local = local.model_copy(update={"subnet": str(shifted)})
        name = group_name(recipe.name, g)
        result.append(
            Deployment(
                recipe=recipe.model_copy(update={"name": name, "replicas": 1}),
                cluster=cluster.model_copy(update={"nodes": nodes, "local": local}),
                recipe_file=deployment.recipe_file,
                cluster_file=deployment.cluster_file,
            )
        )
    return result


def template_group(deployment: Deployment) -> Deployment:
    """Group 0's nodes under the deployment's own name: what a Kubernetes pod template says for
    every replica (LeaderWorkerSet ``replicas`` copies it; the group's place is the scheduler's).
    One replica is the deployment."""
    recipe = deployment.recipe
    if recipe.replicas == 1:
        return deployment
    nodes = list(deployment.cluster.nodes[: deployment.nodes_per_group])
    return deployment.model_copy(
        update={
            "recipe": recipe.model_copy(update={"replicas": 1}),
            "cluster": deployment.cluster.model_copy(update={"nodes": nodes}),
        }
    )


def _replica_problems(deployment: Deployment, problems: ProblemList) -> bool:
    """Add why ``replicas`` cannot be placed on the cluster; True when the groups can be."""
    recipe, cluster = deployment.recipe, deployment.cluster
    replicas, nnodes = recipe.replicas, len(cluster.nodes)
    if replicas == 1:
        return True
    fits = True
    if nnodes % replicas:
        problems.add(
            "replicas",
            f"{replicas} groups cannot split the cluster's {nnodes} node(s) evenly",
            f"list a multiple of {replicas} nodes (each group gets the same number, in order), "
            "or change replicas",
        )
        fits = False
    last = group_name(recipe.name, replicas - 1)
    if problem := ownership.name_problem(last):
        problems.add(
            "name",
            f"with {replicas} replicas its groups are named up to '{last}'; {problem}",
            "shorten the name",
        )
    if cluster.transport is Transport.K8S:
        if cluster.kubernetes.leader_address is not LeaderAddress.LWS:
            problems.add(
                "kubernetes.leader_address",
                f"'{cluster.kubernetes.leader_address.value}' writes one group's leader address "
                "into the manifest; with replicas every group has its own leader",
                "set kubernetes.leader_address: lws",
            )
        if missing := router_image_problem(recipe):
            problems.add("router.image", *missing)
    elif cluster.transport is Transport.SSH:
        names = [n.name for n in cluster.nodes]
        if cluster.ssh.router_node is not None and cluster.ssh.router_node not in names:
            problems.add(
                "ssh.router_node",
                f"'{cluster.ssh.router_node}' is not a node of the cluster",
                f"name one of {', '.join(names)}, or leave it out to run the router here",
            )
    elif cluster.local.isolation is LocalIsolation.LOOPBACK:
        problems.add(
            "local.isolation",
            "on loopback every group's leader would claim the same API port of 127.0.0.1",
            "run as root, so that each group gets its own network namespaces (netns)",
        )
        fits = False
    return fits


def _address_problems(cluster: Cluster, nnodes: int, problems: ProblemList) -> None:
    """Add why the nodes' addresses cannot carry a group of ``nnodes``: a loopback address among
    hosts, or two nodes on one address where each should be a host of its own."""
    if cluster.transport is not Transport.LOCAL and nnodes > 1:
        for i, node in enumerate(cluster.nodes):
            if node.is_loopback:
                problems.add(
                    f"nodes[{i}].address",
                    f"'{node.address}' is a loopback address in "
                    "a multi-host cluster; the other nodes would connect to themselves "
                    "and the rendezvous never completes",
                    "use the node's management address that the other nodes can reach",
                )
    if cluster.transport is not Transport.LOCAL or cluster.local.isolation is LocalIsolation.NETNS:
        seen: dict[str, str] = {}
        for node in cluster.nodes:
            if node.address in seen:
                problems.add(
                    "nodes",
                    f"nodes {seen[node.address]} and {node.name} share address {node.address},"
                    " so two ranks would claim one host",
                    "give each node its own address",
                )
            seen.setdefault(node.address, node.name)


def deployment_problems(deployment: Deployment) -> list[Problem]:
    """Every reason a valid recipe and a valid cluster cannot work together, each with its
    field path (the rank plan refuses them with a ``PlanError``; the loader reports them with
    the files' own problems). With replicas, the nodes of one group are judged against the
    recipe's TP x PP."""
    recipe, cluster = deployment.recipe, deployment.cluster
    serve = recipe.engine.serve
    problems = ProblemList()
    if not _replica_problems(deployment, problems):
        return problems.items
    nnodes = deployment.nodes_per_group
    world = deployment.world_size
    gpus = {n.gpus for n in cluster.nodes}

    if recipe.engine.executor is ExecutorBackend.RAY and nnodes > 1 and min(gpus) < world:
        problems.add(
            "engine.executor",
            "Ray places all TP workers of a node on that node's GPUs and fails "
            f"with 'local_world_size ({world}) must be less than or equal to the number of visible "
            f"devices ({min(gpus)})' on nodes with {min(gpus)} GPU(s)",
            "set engine.executor: mp (vLLM's multi-node mode without Ray)",
        )
    if world % nnodes:
        problems.add(
            "engine.serve",
            f"tensor_parallel_size x pipeline_parallel_size = {world} cannot be "
            f"split evenly over {nnodes} nodes",
            f"use a multiple of {nnodes} devices, or list {world * recipe.replicas} node(s) in the "
            "cluster",
        )
    elif len(gpus) > 1:
        problems.add(
            "nodes[].gpus",
            f"nodes have different GPU counts {sorted(gpus)}; vLLM "
            "starts the same number of workers on every node",
            "list only nodes with the same number of GPUs",
        )
    elif world != nnodes * min(gpus):
        problems.add(
            "engine.serve",
            f"tensor_parallel_size x pipeline_parallel_size = {world} does not "
            f"match {nnodes} node(s) x {min(gpus)} GPU(s) = {nnodes * min(gpus)}",
            f"set tensor_parallel_size x pipeline_parallel_size to {nnodes * min(gpus)}, or "
            "change the nodes' gpus or the node list",
        )
    _address_problems(cluster, nnodes, problems)
    for var in wire.PER_NODE_VARS:
        if var in recipe.env:
            problems.add(
                f"env.{var}",
                f"{var} differs per node and cannot be set for all ranks",
                "remove it; tandem sets it from each node's address",
            )
    if (
        serve.enable_chunked_prefill is False
        and serve.max_num_batched_tokens
        and serve.max_model_len
        and serve.max_num_batched_tokens < serve.max_model_len
    ):
        problems.add(
            "engine.serve.max_num_batched_tokens",
            f"{serve.max_num_batched_tokens} is below max_model_len {serve.max_model_len} "
            "with chunked prefill off, so a long prompt can never be scheduled",
            "enable chunked prefill or raise max_num_batched_tokens",
        )
    dp = recipe.network.data_plane
    if (
        dp.transport is DataPlaneTransport.IB
        and not dp.hcas
        and not all(n.hcas for n in cluster.nodes)
    ):
        problems.add(
            "network.data_plane.hcas",
            "transport ib without RDMA devices lets NCCL pick any HCA, often one twin only",
            "list the HCAs, e.g. [rocep1s0f1, roceP2p1s0f1]",
        )
    return problems.items


def router_image_problem(recipe: Recipe) -> tuple[str, str] | None:
    """Why a recipe with replicas cannot run its router on Kubernetes (the message and the
    fix), or None: with no ``router.image`` there is nothing to run, since no image of
    vllm-router is published. Asked by the k8s transport and by ``render --target k8s`` on any
    cluster."""
    if recipe.replicas == 1 or recipe.router.image:
        return None
    return (
        "on Kubernetes the router runs as a Deployment, and no image of vllm-router is published",
        f"name an image holding vllm-router {recipe.router.version} (e.g. one built "
        f"FROM python:3.12-slim with `pip install vllm-router=={recipe.router.version}`)",
    )
