"""Deployment -> RankPlan: the exact process each node runs, computed once for every target.

Terms, as vLLM's multi-node mode without Ray uses them:

- **rank** (node rank): the index of a node in the cluster, 0..N-1, passed as ``--node-rank``.
  Each rank is one ``vllm serve`` process that starts ``world_size / N`` local workers.
- **leader**: rank 0. It hosts the rendezvous (``--master-addr``/``--master-port``) and serves
  the OpenAI API; its address is the deployment's endpoint.
- **worker**: ranks 1..N-1, started with ``--headless``: no API server, only engine workers.
- **start order**: workers first, then the leader, which waits at the rendezvous for them
  (seed 000's lesson; either order works in vLLM, but this one never leaves a leader serving
  a half-joined group).

Algorithm: validate the deployment (collecting every problem), then for each node build the
``vllm serve`` argv from the recipe's typed options in a fixed order, add the distributed flags,
and layer the environment: data plane, control plane, offline cache, recipe env, the node's
own address, the node's overrides. No I/O happens here.
"""

from __future__ import annotations

from dataclasses import replace
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tandem import hf_cache, wire
from tandem.errors import PlanError
from tandem.spec.cluster import Node, Transport
from tandem.spec.deployment import Deployment, deployment_problems, groups, template_group
from tandem.spec.recipe import DataPlaneTransport, Recipe


class Role(StrEnum):
    """A rank's part in the group: the ``leader`` serves the API, a ``worker`` is headless."""

    LEADER = "leader"
    WORKER = "worker"


class Mount(BaseModel):
    """A path a containerised rank needs from its host.

    ``env`` names the variable that points at the mount: a process on the host gets the host
    path, a container gets ``target``.
    """

    model_config = ConfigDict(frozen=True)

    kind: Literal["cache", "device"]
    source: str
    target: str
    env: str | None = None


class RankSpec(BaseModel):
    """One rank's launch: where, as what, with which argv and environment."""

    model_config = ConfigDict(frozen=True)

    rank: int = Field(description="Node rank, 0 for the leader.")
    node: str = Field(description="Name of the node that runs it.")
    address: str = Field(description="The node's control-plane address (VLLM_HOST_IP).")
    role: Role
    argv: list[str] = Field(description="The full command, starting with `vllm serve`.")
    env: dict[str, str] = Field(description="Variables for the process, as on a bare host.")
    mounts: list[Mount] = Field(default_factory=list)
    start_order: int = Field(description="Launch wave: 0 for workers, 1 for the leader.")


class RankPlan(BaseModel):
    """Every rank of a deployment, in rank order, plus where the API will answer."""

    model_config = ConfigDict(frozen=True)

    deployment: str
    model: str = Field(description="The model name clients send.")
    world_size: int
    endpoint: str = Field(description="Base URL of the leader's OpenAI API, e.g. http://h:8000.")
    ranks: list[RankSpec]

    @property
    def leader(self) -> RankSpec:
        return self.ranks[0]

    def in_start_order(self) -> list[RankSpec]:
        """Ranks sorted by launch wave (workers first), then by rank."""
        return sorted(self.ranks, key=lambda r: (r.start_order, r.rank))


def plan_ranks(deployment: Deployment) -> RankPlan:
    """Compute the rank plan of a deployment of one group (with ``replicas``, plan each of
    ``tandem.spec.deployment.groups``).

    Raises:
        PlanError: listing every reason the deployment cannot work, or it has replicas.
    """
    validate(deployment)
    if deployment.recipe.replicas > 1:
        raise in_files(
            PlanError(
                f"'{deployment.name}' has {deployment.recipe.replicas} groups; a rank plan is "
                "one group's",
                field="replicas",
                hint="plan each group (tandem.spec.deployment.groups); `tandem up` does",
            ),
            deployment,
        )
    recipe, cluster = deployment.recipe, deployment.cluster
    ranks = [
        RankSpec(
            rank=i,
            node=node.name,
            address=node.address,
            role=Role.LEADER if i == 0 else Role.WORKER,
            argv=serve_argv(deployment, i),
            env=rank_env(recipe, node, deployment.name, i),
            mounts=rank_mounts(recipe),
            start_order=1 if i == 0 else 0,
        )
        for i, node in enumerate(cluster.nodes)
    ]
    host = cluster.leader.address
    url_host = f"[{host}]" if ":" in host else host
    return RankPlan(
        deployment=deployment.name,
        model=recipe.model.name_for_clients,
        world_size=deployment.world_size,
        endpoint=f"http://{url_host}:{recipe.ports.api}",
        ranks=ranks,
    )


def template_plan(deployment: Deployment) -> RankPlan:
    """The rank plan every group runs where one object launches them all (a LeaderWorkerSet's
    template, which its ``replicas`` copy): group 0's, once the whole deployment is known to
    work. One replica: the deployment's own plan.

    Raises:
        PlanError: listing every reason the deployment cannot work.
    """
    validate(deployment)
    return plan_ranks(template_group(deployment))


def launch_plan(deployment: Deployment) -> RankPlan:
    """What one launch starts: on Kubernetes the LeaderWorkerSet's template, whatever the
    replicas (it copies the template); elsewhere one group's plan (each group of ``replicas``
    is launched on its own, ``placed_groups``).

    Raises:
        PlanError: listing every reason the deployment cannot work.
    """
    if deployment.cluster.transport is Transport.K8S:
        return template_plan(deployment)
    return plan_ranks(deployment)


def placed_groups(deployment: Deployment) -> list[Deployment]:
    """The deployment's groups (``tandem.spec.deployment.groups``), once the whole deployment
    is known to work: replicas that do not divide the nodes are refused before any group is
    cut from them.

    Raises:
        PlanError: listing every reason the deployment cannot work.
    """
    validate(deployment)
    return groups(deployment)


def validate(deployment: Deployment) -> None:
    """Reject a deployment that cannot start, with every reason at once
    (``tandem.spec.deployment.deployment_problems``)."""
    problems = deployment_problems(deployment)
    if problems:
        raise in_files(
            PlanError(
                f"deployment '{deployment.name}' on cluster "
                f"'{deployment.cluster.name}' cannot work",
                problems=problems,
            ),
            deployment,
        )


def in_files(error: PlanError, deployment: Deployment) -> PlanError:
    """``error`` with each problem naming the file its field is in (recipe or cluster), and the
    error itself naming the file when there is one."""
    error.problems = [
        replace(p, file=p.file or deployment.file_of(p.field)) for p in error.problems
    ]
    files = sorted({p.file for p in error.problems if p.file})
    if error.file is None and error.field:
        error.file = deployment.file_of(error.field)
    elif error.file is None and len(files) == 1:
        error.file = files[0]
    return error


PARALLEL_FIELDS = ("tensor_parallel_size", "pipeline_parallel_size")
"""Written before the distributed arguments, the rest of ``engine.serve`` after them, as the
seed's command line does."""


class Distributed(BaseModel):
    """The flags that join one rank to a multi-node group, as text: the Kubernetes renderer
    puts LeaderWorkerSet's variables where it knows them only at run time (the worker's index,
    the leader's address)."""

    model_config = ConfigDict(frozen=True)

    nnodes: str
    node_rank: str
    master_addr: str
    master_port: str
    headless: bool

    def argv(self) -> list[str]:
        return [
            wire.NNODES_FLAG,
            self.nnodes,
            wire.NODE_RANK_FLAG,
            self.node_rank,
            wire.MASTER_ADDR_FLAG,
            self.master_addr,
            wire.MASTER_PORT_FLAG,
            self.master_port,
        ] + ([wire.HEADLESS_FLAG] if self.headless else [])


def distributed(deployment: Deployment, rank: int) -> Distributed | None:
    """Rank ``rank``'s place in the group; ``None`` on one node (no flags)."""
    cluster = deployment.cluster
    if len(cluster.nodes) == 1:
        return None
    return Distributed(
        nnodes=str(len(cluster.nodes)),
        node_rank=str(rank),
        master_addr=cluster.leader.address,
        master_port=str(deployment.recipe.ports.master),
        headless=rank > 0,
    )


def serve_argv(deployment: Deployment, rank: int, group: Distributed | None = None) -> list[str]:
    """The ``vllm serve`` command of one rank; workers differ only in rank and ``--headless``.
    ``group`` replaces the rank's own distributed flags (a renderer's templated ones)."""
    recipe = deployment.recipe
    model = recipe.model
    argv = ["vllm", "serve", model.path or model.repo_id]
    if model.path is None and model.revision != "main":
        argv += ["--revision", model.revision]
    argv += [
        "--served-model-name",
        model.name_for_clients,
        "--host",
        recipe.host,
        "--port",
        str(recipe.ports.api),
    ]
    argv += recipe.engine.serve.argv(only=PARALLEL_FIELDS)
    argv += ["--distributed-executor-backend", recipe.engine.executor.value]
    group = group or distributed(deployment, rank)
    if group is not None:
        argv += group.argv()
    argv += recipe.engine.serve.argv(skip=PARALLEL_FIELDS)
    argv += recipe.engine.extra_args
    return argv


def data_plane_env(recipe: Recipe, node: Node) -> dict[str, str]:
    """NCCL variables of the data plane; empty for the socket transport."""
    dp = recipe.network.data_plane
    if dp.transport is not DataPlaneTransport.IB:
        return {}
    env = {wire.NCCL_NET: "IB", wire.NCCL_IB_DISABLE: "0"}
    hcas = node.hcas if node.hcas is not None else dp.hcas
    if hcas:
        env[wire.NCCL_IB_HCA] = ",".join(hcas)
    if dp.merge_nics is not None:
        env[wire.NCCL_IB_MERGE_NICS] = "1" if dp.merge_nics else "0"
    if dp.gid_index != "auto":
        env[wire.NCCL_IB_GID_INDEX] = str(dp.gid_index)
    if dp.addr_family:
        env[wire.NCCL_IB_ADDR_FAMILY] = dp.addr_family
    if dp.roce_version:
        env[wire.NCCL_IB_ROCE_VERSION_NUM] = str(dp.roce_version)
    if dp.cross_nic is not None:
        env[wire.NCCL_CROSS_NIC] = "1" if dp.cross_nic else "0"
    return env


def control_plane_env(recipe: Recipe, node: Node) -> dict[str, str]:
    """The three socket selectors, all pinned to the node's control-plane interface."""
    interface = node.control_plane_interface or recipe.network.control_plane.interface
    return dict.fromkeys(wire.CONTROL_PLANE_VARS, interface) if interface else {}


def rank_env(recipe: Recipe, node: Node, deployment: str, rank: int) -> dict[str, str]:
    """A rank's environment, layered from general to specific; later layers win."""
    env: dict[str, str] = {}
    env |= data_plane_env(recipe, node)
    env |= control_plane_env(recipe, node)
    if recipe.model.offline:
        env[wire.HF_HUB_OFFLINE] = "1"
    if recipe.model.cache_root:
        env[wire.HF_HOME] = recipe.model.cache_root
    env |= recipe.env
    env[wire.VLLM_HOST_IP] = node.address
    env |= node.env
    env[wire.TANDEM_DEPLOYMENT] = deployment
    env[wire.TANDEM_RANK] = str(rank)
    env[wire.SPT_NOENV] = "1"
    return env


def rank_mounts(recipe: Recipe) -> list[Mount]:
    """Host paths a containerised rank needs: the HF cache and, for RDMA, /dev/infiniband."""
    mounts = [
        Mount(
            kind="cache",
            source=recipe.model.cache_root or hf_cache.DEFAULT_HOME,
            target=wire.CONTAINER_HF_HOME,
            env=wire.HF_HOME,
        )
    ]
    if recipe.network.data_plane.transport is DataPlaneTransport.IB:
        mounts.append(Mount(kind="device", source="/dev/infiniband", target="/dev/infiniband"))
    return mounts
