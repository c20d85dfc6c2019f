"""A Deployment is a Recipe placed on a Cluster; everything else is derived from it.

This module also builds the cluster that ``tandem`` uses when no inventory is given: the nodes
of this one machine, one per rank, as network namespaces (root) or on loopback.
"""

from __future__ import annotations

import ipaddress
import re

from pydantic import BaseModel, ConfigDict

from tandem import wire
from tandem.spec.cluster import Cluster, LocalIsolation, LocalOptions, Node, Transport
from tandem.spec.recipe import Recipe

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
    """
    network = ipaddress.ip_network(subnet)
    hosts = list(network.hosts())
    result = []
    for i in range(nodes):
        if gpu_count >= nodes:
            env = {"CUDA_VISIBLE_DEVICES": str(i)}
        else:
            env = {wire.VLLM_CPU_OMP_THREADS_BIND: str(i % max(cpu_count, 1))}
        if isolation is LocalIsolation.LOOPBACK:
            node = Node(name=f"node{i}", address="127.0.0.1", control_plane_interface="lo", env=env)
        else:
            node = Node(name=f"node{i}", address=str(hosts[i]),
                        control_plane_interface=interface_name(i), env=env)
        result.append(node)
    return Cluster(name=LOCAL_CLUSTER_NAME, transport=Transport.LOCAL, nodes=result,
                   local=LocalOptions(isolation=isolation, subnet=subnet))


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
        nodes = [n.model_copy(update={"address": "127.0.0.1", "control_plane_interface": "lo"})
                 for n in nodes]
    local = cluster.local.model_copy(update={"isolation": isolation})
    return cluster.model_copy(update={"nodes": nodes, "local": local})
