"""The rank plan: roles, argv, environment layering, start order, and impossible plans."""

from __future__ import annotations

import pytest
from factories import make_cluster, make_deployment, make_recipe

from tandem.errors import PlanError
from tandem.rankplan import Role, plan_ranks
from tandem.spec.cluster import Cluster, LocalIsolation
from tandem.spec.deployment import local_cluster, resolve_isolation


def flags(argv: list[str]) -> dict[str, str | None]:
    """argv after the positional model as {flag: value or None}."""
    out: dict[str, str | None] = {}
    i = 3
    while i < len(argv):
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[argv[i]] = argv[i + 1]
            i += 2
        else:
            out[argv[i]] = None
            i += 1
    return out


def test_leader_and_worker_roles_and_distributed_flags():
    plan = plan_ranks(make_deployment())
    leader, worker = plan.ranks
    assert (leader.role, worker.role) == (Role.LEADER, Role.WORKER)
    assert leader.argv[:3] == ["vllm", "serve", "org/model"]
    lf, wf = flags(leader.argv), flags(worker.argv)
    assert lf["--distributed-executor-backend"] == "mp"
    assert lf["--nnodes"] == wf["--nnodes"] == "2"
    assert (lf["--node-rank"], wf["--node-rank"]) == ("0", "1")
    assert lf["--master-addr"] == wf["--master-addr"] == "192.168.1.10"
    assert "--headless" in wf and "--headless" not in lf
    # A worker is the leader with another node rank and --headless, nothing else.
    assert {k: v for k, v in wf.items() if k not in ("--node-rank", "--headless")} == {
        k: v for k, v in lf.items() if k != "--node-rank"
    }
    assert plan.endpoint == "http://192.168.1.10:8000"


def test_workers_start_before_the_leader():
    plan = plan_ranks(make_deployment(make_recipe(tp=4), make_cluster(nodes=4)))
    order = [r.rank for r in plan.in_start_order()]
    assert order == [1, 2, 3, 0]


def test_single_node_has_no_multinode_flags():
    plan = plan_ranks(make_deployment(make_recipe(tp=2), make_cluster(nodes=1, gpus=2)))
    assert "--nnodes" not in plan.leader.argv and "--headless" not in plan.leader.argv


def test_env_layers_later_wins_and_node_address_is_vllm_host_ip():
    recipe = make_recipe(
        env={"NCCL_DEBUG": "WARN", "X": "recipe"}, network={"control_plane": {"interface": "eth0"}}
    )
    cluster = Cluster.model_validate(
        {
            "name": "c",
            "transport": "ssh",
            "nodes": [
                {"name": "a", "address": "10.0.0.1", "control_plane_interface": "enp1"},
                {"name": "b", "address": "10.0.0.2", "env": {"X": "node"}},
            ],
        }
    )
    a, b = plan_ranks(make_deployment(recipe, cluster)).ranks
    assert a.env["GLOO_SOCKET_IFNAME"] == a.env["NCCL_SOCKET_IFNAME"] == "enp1"
    assert b.env["TP_SOCKET_IFNAME"] == "eth0"
    assert (a.env["X"], b.env["X"]) == ("recipe", "node")
    assert (a.env["VLLM_HOST_IP"], b.env["VLLM_HOST_IP"]) == ("10.0.0.1", "10.0.0.2")
    assert a.env["TANDEM_DEPLOYMENT"] == "test" and b.env["TANDEM_RANK"] == "1"


def test_ib_data_plane_renders_nccl_variables_and_node_hca_override():
    recipe = make_recipe(
        network={
            "data_plane": {
                "transport": "ib",
                "hcas": ["x", "y"],
                "gid_index": "auto",
                "merge_nics": True,
            }
        }
    )
    cluster = Cluster.model_validate(
        {
            "name": "c",
            "nodes": [
                {"name": "a", "address": "10.0.0.1"},
                {"name": "b", "address": "10.0.0.2", "hcas": ["z"]},
            ],
        }
    )
    a, b = plan_ranks(make_deployment(recipe, cluster)).ranks
    assert a.env["NCCL_NET"] == "IB" and a.env["NCCL_IB_HCA"] == "x,y"
    assert b.env["NCCL_IB_HCA"] == "z"
    assert "NCCL_IB_GID_INDEX" not in a.env  # auto: left to NCCL, resolved by tandem check
    assert any(m.target == "/dev/infiniband" for m in a.mounts)


def test_speculative_config_is_compact_json_and_toggles_have_no_forms():
    recipe = make_recipe(
        engine={
            "serve": {
                "tensor_parallel_size": 2,
                "speculative_config": {"method": "mtp", "num_speculative_tokens": 2},
                "enable_prefix_caching": False,
            }
        }
    )
    f = flags(plan_ranks(make_deployment(recipe)).leader.argv)
    assert f["--speculative-config"] == '{"method":"mtp","num_speculative_tokens":2}'
    assert "--no-enable-prefix-caching" in f


def test_local_cluster_loopback_when_not_root():
    cluster = resolve_isolation(
        local_cluster(2, isolation=LocalIsolation.AUTO, cpu_count=2), as_root=False
    )
    assert cluster.local.isolation is LocalIsolation.LOOPBACK
    plan = plan_ranks(make_deployment(make_recipe(), cluster))
    assert plan.endpoint == "http://127.0.0.1:8000"
    assert [r.env["VLLM_CPU_OMP_THREADS_BIND"] for r in plan.ranks] == ["0", "1"]


def test_local_cluster_netns_gives_each_node_its_address_and_interface():
    cluster = resolve_isolation(
        local_cluster(2, isolation=LocalIsolation.AUTO, cpu_count=2), as_root=True
    )
    plan = plan_ranks(make_deployment(make_recipe(), cluster))
    assert [r.address for r in plan.ranks] == ["10.77.0.1", "10.77.0.2"]
    assert [r.env["GLOO_SOCKET_IFNAME"] for r in plan.ranks] == ["tdm0", "tdm1"]


def test_local_cluster_with_gpus_pins_one_gpu_per_node():
    cluster = local_cluster(2, gpu_count=2)
    assert [n.env for n in cluster.nodes] == [
        {"CUDA_VISIBLE_DEVICES": "0"},
        {"CUDA_VISIBLE_DEVICES": "1"},
    ]


IMPOSSIBLE = [
    (
        "tp times pp above the devices",
        make_recipe(tp=4),
        make_cluster(nodes=2),
        "engine.serve",
        "does not match",
    ),
    (
        "world not divisible by nodes",
        make_recipe(tp=3),
        make_cluster(nodes=2),
        "engine.serve",
        "split evenly",
    ),
    (
        "ray on one-gpu nodes",
        make_recipe(engine={"executor": "ray", "serve": {"tensor_parallel_size": 2}}),
        make_cluster(nodes=2),
        "engine.executor",
        "local_world_size (2) must be less than or equal to the number of visible devices (1)",
    ),
    (
        "loopback master address on a multi-host cluster",
        make_recipe(),
        make_cluster(addresses=["127.0.0.1", "10.0.0.2"]),
        "nodes[0].address",
        "loopback",
    ),
    (
        "per-node variable in the recipe",
        make_recipe(env={"VLLM_HOST_IP": "1.2.3.4"}),
        make_cluster(),
        "env.VLLM_HOST_IP",
        "differs per node",
    ),
    (
        "nodes with different gpu counts",
        make_recipe(tp=2),
        Cluster.model_validate(
            {
                "name": "c",
                "nodes": [
                    {"name": "a", "address": "10.0.0.1", "gpus": 1},
                    {"name": "b", "address": "10.0.0.2", "gpus": 2},
                ],
            }
        ),
        "nodes[].gpus",
        "different GPU",
    ),
    (
        "long prompts unschedulable",
        make_recipe(
            engine={
                "serve": {
                    "tensor_parallel_size": 2,
                    "enable_chunked_prefill": False,
                    "max_model_len": 8192,
                    "max_num_batched_tokens": 2048,
                }
            }
        ),
        make_cluster(),
        "engine.serve.max_num_batched_tokens",
        "never be scheduled",
    ),
    (
        "ib without hcas",
        make_recipe(network={"data_plane": {"transport": "ib"}}),
        make_cluster(),
        "network.data_plane.hcas",
        "one twin",
    ),
]


@pytest.mark.parametrize(
    "recipe,cluster,field,message", [c[1:] for c in IMPOSSIBLE], ids=[c[0] for c in IMPOSSIBLE]
)
def test_impossible_plans_are_rejected_before_anything_runs(recipe, cluster, field, message):
    with pytest.raises(PlanError) as info:
        plan_ranks(make_deployment(recipe, cluster))
    problems = {p.field: p for p in info.value.problems}
    assert field in problems, problems
    assert message in problems[field].message
    assert problems[field].hint


def test_duplicate_ranks_on_one_local_netns_address():
    cluster = Cluster.model_validate(
        {
            "name": "c",
            "transport": "local",
            "local": {"isolation": "netns"},
            "nodes": [{"name": "a", "address": "10.77.0.1"}, {"name": "b", "address": "10.77.0.1"}],
        }
    )
    with pytest.raises(PlanError) as info:
        plan_ranks(make_deployment(make_recipe(), cluster))
    assert "share address" in str(info.value)
