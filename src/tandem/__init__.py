"""tandem: serve one large model across several nodes with vLLM, and prove that it works.

The public surface is the data flow of a deployment: load a recipe and a cluster, place one on
the other, plan the ranks. Launching (``tandem.operations.lifecycle``, which runs the preflight of
``tandem.operations.preflight`` first), planning memory (``tandem.plan``), the preflight's rules
and probe (``tandem.check``), benchmarking (``tandem.bench``) and evaluation (``tandem.eval``) have
their own public names (``__all__`` where they are packages).

Usage:
    import tandem
    deployment = tandem.load_deployment("deepseek-v4-flash", "examples/dgx-spark-pair.yaml")
    for rank in tandem.plan_ranks(deployment).ranks:
        print(rank.node, rank.argv)
"""

from tandem.errors import (
    BackendError,
    CheckFailed,
    ClusterError,
    EndpointError,
    PlanError,
    RankFailed,
    RecipeError,
    SpecError,
    StateError,
    TandemError,
    Unauthorized,
)
from tandem.rankplan import RankPlan, RankSpec, Role, plan_ranks
from tandem.spec.cluster import Cluster, Node
from tandem.spec.deployment import Deployment
from tandem.spec.loading import load_cluster, load_deployment, load_recipe
from tandem.spec.recipe import Recipe

__all__ = [
    "BackendError",
    "CheckFailed",
    "Cluster",
    "ClusterError",
    "Deployment",
    "EndpointError",
    "Node",
    "PlanError",
    "RankFailed",
    "RankPlan",
    "RankSpec",
    "Recipe",
    "RecipeError",
    "Role",
    "SpecError",
    "StateError",
    "TandemError",
    "Unauthorized",
    "load_cluster",
    "load_deployment",
    "load_recipe",
    "plan_ranks",
]
