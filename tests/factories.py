"""Builders for test inputs: ``make_recipe(tp=2)``, ``make_cluster(nodes=2)``."""

from __future__ import annotations

from typing import Any

from tandem.spec.cluster import Cluster
from tandem.spec.deployment import Deployment
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
