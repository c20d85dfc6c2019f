"""Facts of the recorded DGX-Spark-like nodes, read by the real probe code from the fixtures."""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import pytest

from tandem import agent
from tandem.spec.cluster import Cluster
from tandem.spec.deployment import Deployment
from tandem.spec.loading import load_recipe

FIXTURES = Path(__file__).parent.parent / "fixtures" / "check"
SEED_REPO = "deepseek-ai/DeepSeek-V4-Flash-DSpark"


def fixture_facts(
    name: str,
    *,
    repo: str = SEED_REPO,
    cache_root: str = "/root/.cache/huggingface",
    model_path: str | None = None,
) -> dict:
    """What the agent's facts print for fixture node ``name`` (parsed in-process, same code)."""
    root = FIXTURES / name
    node = agent.Node(root=str(root), commands=str(root / "commands"))
    args = argparse.Namespace(
        model=repo, revision="main", cache_root=cache_root, model_path=model_path, hash=False
    )
    return agent.collect(node, args)


_CACHE: dict[str, dict] = {}


def facts_of(name: str) -> dict:
    """A private copy of a fixture node's facts (tests may change it)."""
    if name not in _CACHE:
        _CACHE[name] = fixture_facts(name)
    return copy.deepcopy(_CACHE[name])


def spark_cluster(first: str = "spark-101", second: str = "spark-102", **node_fields) -> Cluster:
    """Seed 000's two nodes over SSH; management NIC enP7s7 (as the recipe pins)."""
    nodes = [
        {"name": first, "address": "192.168.100.101"},
        {"name": second, "address": "192.168.100.102"},
    ]
    if first == "spark-102":
        nodes = [
            {"name": "spark-102", "address": "192.168.100.102"},
            {"name": "spark-101", "address": "192.168.100.101"},
        ]
    for node in nodes:
        node.update(node_fields)
    return Cluster.model_validate({"name": "sparks", "transport": "ssh", "nodes": nodes})


def seed_deployment(cluster: Cluster | None = None, **recipe_changes) -> Deployment:
    """The built-in seed 000 recipe (deepseek-v4-flash-dspark) on the two Sparks."""
    recipe = load_recipe("deepseek-v4-flash-dspark")
    if recipe_changes:
        data = recipe.model_dump()
        for dotted, value in recipe_changes.items():
            target = data
            *parents, leaf = dotted.split("__")
            for key in parents:
                target = target[key]
            target[leaf] = value
        recipe = type(recipe).model_validate(data)
    return Deployment(recipe=recipe, cluster=cluster or spark_cluster())


@pytest.fixture
def healthy() -> dict[str, dict]:
    return {"spark-101": facts_of("spark-101"), "spark-102": facts_of("spark-102")}


@pytest.fixture
def drifted() -> dict[str, dict]:
    return {"spark-101": facts_of("spark-101"), "spark-102": facts_of("spark-102-drifted")}


@pytest.fixture
def faulted() -> dict[str, dict]:
    """The healthy spark-101 with spark-102 carrying the known host faults (build.py)."""
    return {"spark-101": facts_of("spark-101"), "spark-102": facts_of("spark-102-faulted")}
