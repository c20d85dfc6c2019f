"""Builders for test inputs: ``make_recipe(tp=2)``, ``make_cluster(nodes=2)``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tandem.backends.launch import new_state, record_rank
from tandem.backends.state import GroupState
from tandem.files import private_dir
from tandem.rankplan import plan_ranks
from tandem.spec.cluster import Cluster
from tandem.spec.deployment import Deployment
from tandem.spec.loading import load_deployment
from tandem.spec.recipe import Recipe


def make_recipe(*, tp: int = 2, pp: int = 1, name: str = "test", **overrides: Any) -> Recipe:
    data: dict[str, Any] = {
        "name": name,
        "model": {"repo_id": "org/model"},
        "engine": {"serve": {"tensor_parallel_size": tp, "pipeline_parallel_size": pp}},
    }
    for dotted, value in overrides.items():
        target = data
        *parents, leaf = dotted.split("__")
        for key in parents:
            target = target.setdefault(key, {})
        target[leaf] = value
    return Recipe.model_validate(data)


def make_cluster(
    *, nodes: int = 2, gpus: int = 1, transport: str = "ssh", addresses: list[str] | None = None
) -> Cluster:
    addresses = addresses or [f"192.168.1.{10 + i}" for i in range(nodes)]
    return Cluster.model_validate(
        {
            "name": "c",
            "transport": transport,
            "nodes": [
                {"name": f"n{i}", "address": addresses[i], "gpus": gpus} for i in range(nodes)
            ],
        }
    )


def make_deployment(recipe: Recipe | None = None, cluster: Cluster | None = None) -> Deployment:
    return Deployment(recipe=recipe or make_recipe(), cluster=cluster or make_cluster())


LOOPBACK_CLUSTER = (
    "name: here\ntransport: local\nlocal: {isolation: loopback}\nnodes:\n"
    "  - {name: n0, address: 127.0.0.1}\n  - {name: n1, address: 127.0.0.1}\n"
)
"""Two local ranks on loopback: a cluster file that needs neither root nor namespaces."""


def launched_local_state(folder: Path, log_text: str = "INFO ready\n") -> GroupState:
    """``tiny-local``'s state as ``up`` leaves it on two loopback ranks, each rank's log holding
    ``log_text`` (no process runs: for what reads a state, never for what stops one)."""
    cluster = folder / "loopback.yaml"
    cluster.write_text(LOOPBACK_CLUSTER)
    deployment = load_deployment("tiny-local", cluster)
    plan = plan_ranks(deployment)
    state = new_state(plan, deployment, backend="local")
    logs = private_dir(state.directory.logs)
    for rank in plan.ranks:
        log = logs / f"rank{rank.rank}.log"
        log.write_text(log_text)
        record_rank(state, rank, log=str(log), pid=None)
    return state
