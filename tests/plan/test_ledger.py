"""The memory ledger of shared hosts (``tandem.plan.ledger``): what each plan holds per node,
and the shortfall of one more deployment, with the node, the term, by how much and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem.plan import plan_for
from tandem.plan.ledger import THIS_MACHINE, holds_of, ledgers, shortfalls
from tandem.plan.memory import GIB
from tandem.spec.cluster import Cluster
from tandem.spec.deployment import Deployment, local_cluster
from tandem.spec.loading import load_deployment
from tandem.spec.recipe import Recipe

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "tests" / "fixtures" / "configs"


def recipe(name: str, **serve: object) -> Recipe:
    return Recipe.model_validate(
        {"name": name, "model": {"repo_id": "Qwen/Qwen2.5-7B-Instruct"},
         "engine": {"serve": {"tensor_parallel_size": 2, "max_model_len": 32768, **serve}}}
    )  # fmt: skip


def qwen_plan(deployment: Deployment):
    return plan_for(deployment, config_path=CONFIGS / "qwen2.5-7b-instruct.json")


@pytest.fixture(scope="module")
def spark_pair():
    """DeepSeek-V4-Flash on the Spark pair (util 0.8, shipped facts): 97.35 GiB of budget on
    each GB10's 121.69 GiB, and 4.7 GiB outside vLLM."""
    deployment = load_deployment("deepseek-v4-flash", ROOT / "examples" / "dgx-spark-pair.yaml")
    return deployment, plan_for(deployment)


def test_a_gb10_node_holds_the_budget_and_its_outside_counted_once(spark_pair):
    deployment, plan = spark_pair
    holds = holds_of(deployment, plan)
    assert [h.node for h in holds] == ["spark-a", "spark-b"]
    assert {h.host for h in holds} == {n.address for n in deployment.cluster.nodes}
    assert all(h.budget_bytes == plan.memory.budget_bytes for h in holds)
    assert all(h.term == "gpu_memory_utilization" for h in holds)
    second = holds_of(deployment.model_copy(update={"recipe": recipe("other")}), plan)
    (ledger, *_) = ledgers([*holds, *second])
    assert ledger.outside_bytes == plan.memory.outside_budget_bytes  # once, not twice
    assert ledger.used_bytes == 2 * plan.memory.budget_bytes + plan.memory.outside_budget_bytes


def test_a_budget_that_does_not_fit_beside_another_names_node_term_excess_and_fix(spark_pair):
    running, held = spark_pair
    new = Deployment(recipe=recipe("qwen", gpu_memory_utilization=0.3), cluster=running.cluster)
    plan = qwen_plan(new)
    found = shortfalls(holds_of(new, plan), holds_of(running, held), plan)
    assert sorted(s.node for s in found) == ["spark-a", "spark-b"]
    short = next(s for s in found if s.node == "spark-a")
    over = plan.memory.budget_bytes + held.memory.budget_bytes + held.memory.outside_budget_bytes
    over -= held.memory.memory_total_bytes
    assert short.term == "gpu_memory_utilization" and short.over_bytes == over
    assert f"{over / GIB:.2f} GiB over" in short.message
    assert "node spark-a" in short.message and "gpu_memory_utilization 0.3" in short.message
    assert "beside deepseek-v4-flash 97.35 GiB" in short.message
    assert short.fix.startswith("lower gpu_memory_utilization from 0.3 to 0.161 or less")
    lowered = Deployment(
        recipe=recipe("qwen", gpu_memory_utilization=0.161), cluster=running.cluster
    )
    plan = qwen_plan(lowered)
    assert not shortfalls(holds_of(lowered, plan), holds_of(running, held), plan)


def test_where_no_room_holds_one_request_the_fix_shortens_max_model_len(spark_pair):
    running, held = spark_pair
    new = Deployment(
        recipe=recipe("qwen", gpu_memory_utilization=0.3, max_model_len=32768),
        cluster=running.cluster,
    )
    plan = qwen_plan(new)
    crowded = holds_of(running, held)
    for hold in crowded:  # the other holds all but 9 GiB: 7.1 GiB of weights, 1.5 of reserves
        hold.budget_bytes = int(hold.total_bytes - hold.outside_bytes - 9 * GIB)
    (short, *_) = shortfalls(holds_of(new, plan), crowded, plan)
    assert "and max_model_len from 32,768 to" in short.fix


def test_deployments_on_other_hosts_share_nothing(spark_pair):
    running, held = spark_pair
    elsewhere = Cluster.model_validate(
        {"name": "spark-c", "transport": "ssh",
         "nodes": [{"name": "x", "address": "10.1.0.1"}, {"name": "y", "address": "10.1.0.2"}]}
    )  # fmt: skip
    new = Deployment(recipe=recipe("qwen", gpu_memory_utilization=0.9), cluster=elsewhere)
    plan = qwen_plan(new)
    assert not shortfalls(holds_of(new, plan), holds_of(running, held), plan)


def test_every_node_of_a_local_cluster_is_this_machine_and_a_cpu_pool_is_its_kv_space():
    new = Deployment(
        recipe=Recipe.model_validate(
            {
                "name": "cpu",
                "model": {"repo_id": "tandem-org/smollm2-135m-instruct"},
                "engine": {"serve": {"pipeline_parallel_size": 2, "max_model_len": 2048}},
                "env": {"VLLM_CPU_KVCACHE_SPACE": 5},
            }
        ),
        cluster=local_cluster(2),
    )
    plan = plan_for(new, config_path=CONFIGS / "smollm2-135m-instruct.json")
    holds = holds_of(new, plan)
    assert {h.host for h in holds} == {THIS_MACHINE} and len(holds) == 2
    assert all(h.term == "VLLM_CPU_KVCACHE_SPACE" and h.kv_pool_bytes == 5 * GIB for h in holds)
    (ledger,) = ledgers(holds)
    assert ledger.used_bytes == 2 * plan.memory.budget_bytes  # both ranks draw on one memory
    other = holds_of(new.model_copy(update={"recipe": new.recipe.model_copy(update={"name": "b"})}),
                     plan)  # fmt: skip
    (short, *_) = shortfalls(holds, other, plan)
    assert short.term == "VLLM_CPU_KVCACHE_SPACE" and "(this machine)" in short.message
    assert short.fix.startswith("lower VLLM_CPU_KVCACHE_SPACE from 5 to 2 GiB or less")


def test_kubernetes_places_its_own_pods():
    deployment = load_deployment("deepseek-v4-flash", ROOT / "examples" / "dgx-spark-eks.yaml")
    assert holds_of(deployment, plan_for(deployment)) == []
