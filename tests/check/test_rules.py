"""Every rule on the recorded facts of two DGX-Spark-like nodes: one case fires, one does not.

The healthy pair is spark-101 + spark-102; the drifted pair swaps in spark-102-drifted (a
kernel/firmware update on one node, a shifted GID, the desktop on, a partial download, ...).
"""

from __future__ import annotations

import pytest

from tandem.check.findings import CheckReport, Severity
from tandem.check.rules import RULES, CheckContext, evaluate
from tandem.check.rules.host import MemoryHeadroomRule
from tandem.rankplan import plan_ranks
from tandem.spec.cluster import Cluster
from tandem.spec.loading import load_deployment
from tests.check.conftest import seed_deployment, spark_cluster

GIB = 2**30


def run(deployment, facts, **context):
    env = {r.node: r.env for r in plan_ranks(deployment).ranks} if "rank_env" not in context else {}
    ctx = CheckContext(
        deployment=deployment, facts=facts, rank_env=context.pop("rank_env", env), **context
    )
    return evaluate(ctx)


def rules_of(findings, severity=None):
    return {f.rule for f in findings if severity is None or f.severity is severity}


def test_healthy_pair_passes_every_rule(healthy):
    assert run(seed_deployment(), healthy) == []


def test_drifted_pair_is_refused_with_every_fault(drifted):
    errors = rules_of(run(seed_deployment(), drifted), Severity.ERROR)
    assert errors == {
        "version-skew",
        "model-snapshot-incomplete",
        "interface-down",
        "address-not-on-node",
        "mtu-mismatch",
        "roce-gid-index",
        "shm-too-small",
    }


def test_version_skew_names_each_differing_version(drifted, healthy):
    findings = [f for f in run(seed_deployment(), drifted) if f.rule == "version-skew"]
    assert {f.message for f in findings} == {
        "kernel differs between nodes",
        "NIC firmware differs between nodes",
        "image digest differs between nodes",
    }
    kernel = next(f for f in findings if f.message.startswith("kernel"))
    assert kernel.evidence == "spark-101 6.17.0-1026-nvidia, spark-102 6.17.0-1028-nvidia"
    assert "version-skew" not in rules_of(run(seed_deployment(), healthy))


def test_vllm_version_against_the_recipe_on_bare_hosts(drifted, healthy):
    bare = seed_deployment(engine__image=None)
    fired = [f for f in run(bare, drifted) if f.rule == "vllm-version"]
    assert [(f.node, f.message) for f in fired] == [
        ("spark-102", "vLLM 0.25.0; the recipe needs 0.25.1")
    ]
    assert "vllm-version" not in rules_of(run(bare, healthy))


def test_image_missing_on_a_node(healthy):
    healthy["spark-102"]["images"]["images"] = []
    fired = [f for f in run(seed_deployment(), healthy) if f.rule == "image-missing"]
    assert [f.node for f in fired] == ["spark-102"]
    assert "ctr -n k8s.io images pull" in fired[0].fix


@pytest.mark.parametrize(
    "change, rule",
    [
        ("missing", "model-snapshot-missing"),
        ("other-commit", "model-snapshot-differs"),
        ("other-blob", "model-snapshot-differs"),
        ("plain-dir", "model-not-cache-layout"),
    ],
)
def test_model_snapshot_faults(healthy, change, rule):
    snap = healthy["spark-102"]["model"]
    if change == "missing":
        snap.update(exists=False, snapshot_dir=None, commit=None, files=[])
    elif change == "other-commit":
        snap["commit"] = "0" * 40
    elif change == "other-blob":
        snap["files"][1]["blob"] = "f" * 64
    else:
        snap.update(layout="plain-directory", exists=True)
    fired = [f for f in run(seed_deployment(), healthy) if f.rule.startswith("model")]
    assert [f.rule for f in fired] == [rule]
    assert fired[0].severity is Severity.ERROR


def test_a_missing_model_tandem_builds_is_fixed_by_building_it_never_by_a_download(healthy):
    """Newcomer review, defect 1: no hub has tandem-org/..., and whoever registers the name
    would be downloaded; nor is --skip-checks offered, since no rank could load it."""
    healthy["spark-102"]["model"].update(exists=False, snapshot_dir=None, commit=None, files=[])
    tiny = seed_deployment(model__repo_id="tandem-org/tiny-deepseek-v3")
    fired = [f for f in run(tiny, healthy) if f.rule == "model-snapshot-missing"]
    assert "tandem model tiny" in fired[0].fix and "hf download" not in fired[0].fix
    assert "tandem model pull" in fired[0].fix  # ssh nodes: built once, copied to the rest
    report = CheckReport(deployment="x", nodes={}, findings=fired)
    assert "--skip-checks" not in report.refusal_hint
    hub = [f for f in run(seed_deployment(), healthy) if f.rule == "model-snapshot-missing"]
    assert "hf download deepseek-ai/DeepSeek-V4-Flash-DSpark" in hub[0].fix


def test_model_incomplete_lists_the_missing_shard(drifted):
    fired = [f for f in run(seed_deployment(), drifted) if f.rule == "model-snapshot-incomplete"]
    assert fired[0].node == "spark-102"
    assert "model-00003-of-00003.safetensors" in fired[0].evidence
    assert ".incomplete" in fired[0].evidence


def test_a_missing_snapshot_is_only_a_warning_when_ranks_may_download(healthy):
    healthy["spark-102"]["model"].update(exists=False, files=[])
    fired = [
        f
        for f in run(seed_deployment(model__offline=False), healthy)
        if f.rule == "model-snapshot-missing"
    ]
    assert fired[0].severity is Severity.WARNING


def test_interfaces_missing_and_down(drifted, healthy):
    down = [f for f in run(seed_deployment(), drifted) if f.rule == "interface-down"]
    assert [(f.node, f.message) for f in down] == [
        ("spark-102", "control-plane interface enP7s7 is DOWN")
    ]
    cluster = spark_cluster(control_plane_interface="eth9")
    missing = [f for f in run(seed_deployment(cluster), healthy) if f.rule == "interface-missing"]
    assert [f.node for f in missing] == ["spark-101", "spark-102"]
    wrong_hca = seed_deployment(network__data_plane__hcas=["mlx5_9"])
    assert "hca-missing" in rules_of(run(wrong_hca, healthy))
    assert not rules_of(run(seed_deployment(), healthy)) & {
        "interface-down",
        "interface-missing",
        "hca-missing",
    }


def test_address_not_on_the_node(healthy):
    cluster = Cluster.model_validate(
        {
            "name": "s",
            "transport": "ssh",
            "nodes": [
                {"name": "spark-101", "address": "192.168.100.101"},
                {"name": "spark-102", "address": "192.168.100.202"},
            ],
        }
    )
    fired = [f for f in run(seed_deployment(cluster), healthy) if f.rule == "address-not-on-node"]
    assert [f.node for f in fired] == ["spark-102"]


def test_mtu_mismatch_on_the_data_plane(drifted, healthy):
    fired = [f for f in run(seed_deployment(), drifted) if f.rule == "mtu-mismatch"]
    assert fired[0].severity is Severity.ERROR
    assert "spark-102/enP2p1s0f1np1 1500" in fired[0].evidence
    assert "mtu-mismatch" not in rules_of(run(seed_deployment(), healthy))


def test_pinned_gid_index_is_checked_per_hca_and_the_right_one_reported(drifted, healthy):
    fired = [f for f in run(seed_deployment(), drifted) if f.rule == "roce-gid-index"]
    assert [(f.node, f.message) for f in fired] == [
        (
            "spark-102",
            "gid_index 3 is not a RoCE v2 GID of roceP2p1s0f1; the right index there is 5",
        )
    ]
    assert "gid_index: auto" in fired[0].fix  # 3 on three HCAs, 5 on one: no single index fits
    assert "roce-gid-index" not in rules_of(run(seed_deployment(), healthy))


def test_a_wrong_pin_on_identical_nodes_gets_the_index_to_set(healthy):
    fired = [
        f
        for f in run(seed_deployment(network__data_plane__gid_index=1), healthy)
        if f.rule == "roce-gid-index"
    ]
    assert len(fired) == 4  # two HCAs on two nodes
    assert {f.fix for f in fired} == {"set network.data_plane.gid_index: 3"}


def test_auto_gid_index_reports_differing_indices_as_info(drifted):
    fired = [
        f
        for f in run(seed_deployment(network__data_plane__gid_index="auto"), drifted)
        if f.rule == "roce-gid-index"
    ]
    assert [f.severity for f in fired] == [Severity.INFO]


def test_memory_headroom_against_the_plan(healthy):
    tight = run(seed_deployment(), healthy, memory_need_bytes={"spark-101": 114 * GIB})
    assert [(f.rule, f.node, f.severity) for f in tight if f.rule == "memory-headroom"] == [
        ("memory-headroom", "spark-101", Severity.WARNING)
    ]
    over = run(seed_deployment(), healthy, memory_need_bytes={"spark-101": 130 * GIB})
    assert [f.severity for f in over if f.rule == "memory-headroom"] == [Severity.ERROR]
    fits = run(
        seed_deployment(),
        healthy,
        memory_need_bytes={"spark-101": 100 * GIB, "spark-102": 100 * GIB},
    )
    assert "memory-headroom" not in rules_of(fits)


def test_the_nodes_of_a_local_cluster_share_one_memory():
    """Two ranks of this machine each needing 5 GiB, 12 GiB available: 10 GiB + the margin
    does not fit, though each rank alone would."""
    deployment = load_deployment("tiny-local", None)
    facts = {n.name: {"memory": {"available_bytes": 12 * GIB}} for n in deployment.cluster.nodes}
    ctx = CheckContext(
        deployment=deployment,
        facts=facts,
        memory_need_bytes={n.name: 5 * GIB for n in deployment.cluster.nodes},
    )
    fired = list(MemoryHeadroomRule().check(ctx))
    assert [(f.node, f.severity) for f in fired] == [("node0", Severity.WARNING)]
    assert "planned 10.0 GiB" in fired[0].message and "all this machine" in fired[0].message


def test_gui_running_with_the_memory_it_holds(drifted, healthy):
    fired = [f for f in run(seed_deployment(), drifted) if f.rule == "gui-running"]
    assert fired[0].node == "spark-102" and fired[0].severity is Severity.WARNING
    assert "Xorg 311 MiB" in fired[0].evidence and "Xorg 247 MiB" in fired[0].evidence
    assert "systemctl stop display-manager" in fired[0].fix
    assert "gui-running" not in rules_of(run(seed_deployment(), healthy))


def test_known_bad_env_from_the_data_table(healthy):
    env = {
        **seed_deployment().recipe.env,
        "VLLM_USE_B12X_MHC": "1",
        "VLLM_USE_B12X_WO_PROJECTION": "1",
        "NCCL_SOCKET_NTHREADS": "",
    }
    fired = {
        f.message.split("=")[0]: f
        for f in run(seed_deployment(env=env), healthy)
        if f.rule == "known-bad-env"
    }
    assert fired["VLLM_USE_B12X_MHC"].severity is Severity.ERROR
    assert "b12x_mhc_pre" in fired["VLLM_USE_B12X_MHC"].message
    assert fired["VLLM_USE_B12X_MHC"].node is None  # recipe-wide, reported once
    assert fired["VLLM_USE_B12X_WO_PROJECTION"].severity is Severity.WARNING  # cosmetic on 0.25.1
    assert fired["NCCL_SOCKET_NTHREADS"].severity is Severity.WARNING
    on_026 = seed_deployment(env=env, engine__vllm_version="0.26.0")
    assert {f.severity for f in run(on_026, healthy) if "WO_PROJECTION" in f.message} == {
        Severity.ERROR
    }
    assert "known-bad-env" not in rules_of(run(seed_deployment(), healthy))


def test_known_bad_env_set_on_one_node_only(healthy):
    cluster = spark_cluster()
    nodes = [
        cluster.nodes[0],
        cluster.nodes[1].model_copy(update={"env": {"NCCL_IB_DISABLE": "1"}}),
    ]
    cluster = cluster.model_copy(update={"nodes": nodes})
    fired = [f for f in run(seed_deployment(cluster), healthy) if f.rule == "known-bad-env"]
    assert [(f.node, f.severity) for f in fired] == [("spark-102", Severity.ERROR)]


def test_port_taken_on_the_leader(drifted):
    leader_first = seed_deployment(spark_cluster(first="spark-102"))
    fired = [f for f in run(leader_first, drifted) if f.rule == "port-taken"]
    assert [(f.node, f.severity) for f in fired] == [("spark-102", Severity.ERROR)]
    assert "8888" in fired[0].message
    as_worker = [f for f in run(seed_deployment(), drifted) if f.rule == "port-taken"]
    assert [f.severity for f in as_worker] == [Severity.WARNING]  # a stale server on a worker
    assert "port-taken" not in rules_of(
        run(seed_deployment(ports={"api": 8000, "master": 25000}), drifted)
    )


def test_shm_smaller_than_the_recipe(drifted, healthy):
    fired = [f for f in run(seed_deployment(), drifted) if f.rule == "shm-too-small"]
    assert [f.node for f in fired] == ["spark-102"]
    assert "16.0 GiB" in fired[0].message
    assert "shm-too-small" not in rules_of(run(seed_deployment(shm_size="16g"), drifted))


def test_loopback_master_address_on_several_hosts(healthy):
    cluster = Cluster.model_validate(
        {
            "name": "s",
            "transport": "ssh",
            "nodes": [
                {"name": "spark-101", "address": "127.0.0.1"},
                {"name": "spark-102", "address": "192.168.100.102"},
            ],
        }
    )
    findings = run(seed_deployment(cluster), healthy, rank_env={})
    fired = [f for f in findings if f.rule == "loopback-master-address"]
    assert [f.node for f in fired] == ["spark-101"]
    assert "--master-addr" in fired[0].message
    local = Cluster.model_validate(
        {
            "name": "l",
            "transport": "local",
            "nodes": [
                {"name": "spark-101", "address": "127.0.0.1"},
                {"name": "spark-102", "address": "127.0.0.1"},
            ],
            "local": {"isolation": "loopback"},
        }
    )
    assert "loopback-master-address" not in rules_of(
        run(seed_deployment(local), healthy, rank_env={})
    )


@pytest.mark.parametrize(
    "offsets, bounds, fires",
    [
        ((0.01, 2.5), None, True),  # facts without a bound count as exact
        ((0.01, 0.2), None, False),
        ((0.01, 2.5), (0.01, 0.02), True),
        ((0.0, -1.3), (0.05, 0.05), True),  # behind counts as much as ahead
        ((0.0, 2.5), (0.05, 1.5), False),  # a slow reading: they may be only 0.95 s apart
        ((0.0, 2.5), (0.05, 1.0), True),  # at least 1.45 s apart
        ((0.0, 2.5), (0.8, 0.8), False),
        ((0.0, 1.15), (0.1, 0.1), False),
        ((0.0, 1.4), (0.1, 0.1), True),
    ],
    ids=[
        "2.5 s apart, no bound",
        "0.2 s apart, no bound",
        "2.5 s apart, tight bounds",
        "1.3 s behind, tight bounds",
        "2.5 s apart, one bound 1.5 s",
        "2.5 s apart, one bound 1 s",
        "2.5 s apart, both bounds 0.8 s",
        "1.15 s apart, bounds 0.1 s",
        "1.4 s apart, bounds 0.1 s",
    ],
)
def test_clock_skew_counts_only_what_the_bounds_cannot_explain(healthy, offsets, bounds, fires):
    for i, name in enumerate(("spark-101", "spark-102")):
        healthy[name]["clock_offset_s"] = offsets[i]
        if bounds is not None:
            healthy[name]["clock_offset_bound_s"] = bounds[i]
    fired = [f for f in run(seed_deployment(), healthy) if f.rule == "clock-skew"]
    assert bool(fired) is fires
    if fired and bounds:
        assert fired[0].evidence == (
            f"spark-101 {offsets[0]:+.2f} s ± {bounds[0]:.2f} s, "
            f"spark-102 {offsets[1]:+.2f} s ± {bounds[1]:.2f} s"
        )


def test_an_unreachable_node_is_an_error_and_other_rules_still_run(healthy):
    healthy["spark-102"] = {"probe_error": "ssh: connect to host 192.168.100.102 port 22: No route"}
    findings = run(seed_deployment(), healthy)
    assert [(f.rule, f.node) for f in findings] == [("probe-failed", "spark-102")]


def test_rule_names_are_unique_kebab_case():
    names = [rule.name for rule in RULES]
    assert len(names) == len(set(names))
    assert all(n == n.lower() and " " not in n for n in names)


def test_memory_headroom_with_tandem_plans_own_figure(healthy, drifted):
    from tandem.operations.preflight import memory_plan

    plan, why_not, refused = memory_plan(seed_deployment())
    if plan is None:
        pytest.skip(f"tandem plan unavailable: {why_not or refused}")
    need = {n.name: plan.per_node_memory_bytes for n in seed_deployment().cluster.nodes}
    assert 100 * 10**9 < need["spark-101"] < 125 * 10**9  # the seed saw 115-117 GB per node
    assert "memory-headroom" not in rules_of(
        run(seed_deployment(), healthy, memory_need_bytes=need)
    )
    fired = [
        f
        for f in run(seed_deployment(), drifted, memory_need_bytes=need)
        if f.rule == "memory-headroom"
    ]
    assert [f.node for f in fired] == ["spark-102"]  # the desktop and a stale server ate it


# --- host faults (known_hosts): each fires on the recorded fault and is silent without it ---


def test_cma_zero_on_the_september_kernel_is_an_error(faulted, healthy):
    fired = [f for f in run(seed_deployment(), faulted) if f.rule == "kernel-cma-zero"]
    assert [(f.node, f.severity) for f in fired] == [("spark-102", Severity.ERROR)]
    assert "7.0.0-1019-nvidia" in fired[0].message and "CmaTotal: 0 kB" in fired[0].evidence
    assert "#392" in fired[0].evidence and "6.17.0-1031-nvidia" in fired[0].fix
    assert "kernel-cma-zero" not in rules_of(run(seed_deployment(), healthy))
    faulted["spark-102"]["memory"]["cma_total_bytes"] = 32 * 2**20  # the kernel alone: silent
    assert "kernel-cma-zero" not in rules_of(run(seed_deployment(), faulted))


def test_second_controller_at_x2_is_named_with_its_link(faulted, healthy):
    fired = [f for f in run(seed_deployment(), faulted) if f.rule == "pcie-link-narrow"]
    assert [(f.node, f.severity) for f in fired] == [("spark-102", Severity.WARNING)]
    assert "roceP2p1s0f1 (0002:01:00.1): current_link_width 2, max_link_width 4" in (
        fired[0].evidence
    )
    assert "PR #35" in fired[0].evidence and "fwupdmgr" in fired[0].fix
    assert "pcie-link-narrow" not in rules_of(run(seed_deployment(), healthy))


def test_one_twin_in_nccl_ib_hca_on_a_spark(healthy):
    one_twin = seed_deployment(spark_cluster(hcas=["rocep1s0f1"]))
    fired = [f for f in run(one_twin, healthy) if f.rule == "roce-twin-missing"]
    assert [f.node for f in fired] == ["spark-101", "spark-102"]
    assert "its twin roceP2p1s0f1" in fired[0].message and "12.3 GB/s" in fired[0].message
    assert "dgx-spark-playbooks #102" in fired[0].evidence
    assert "roce-twin-missing" not in rules_of(run(seed_deployment(), healthy))


def test_mtu_below_9000_on_the_roce_data_plane(faulted, healthy):
    fired = [f for f in run(seed_deployment(), faulted) if f.rule == "mtu-below-9000"]
    assert [(f.node, f.severity) for f in fired] == [("spark-102", Severity.WARNING)]
    assert fired[0].evidence.startswith("enp1s0f1np1 mtu 1500, enP2p1s0f1np1 mtu 1500")
    assert "18.94" in fired[0].message and "#25" in fired[0].evidence
    assert "mtu-below-9000" not in rules_of(run(seed_deployment(), healthy))


def test_stale_nccl_conf_lines_that_disagree_are_named(faulted, healthy):
    fired = [f for f in run(seed_deployment(), faulted) if f.rule == "stale-nccl-conf"]
    assert {f.node for f in fired} == {"spark-102"}
    evidence = " ".join(f.evidence for f in fired)
    assert "NCCL_IB_HCA=rocep1s0f1 (the rank sets NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1)" in evidence
    assert "NCCL_IB_USE_INLINE=1" in evidence
    assert "NCCL_IB_PREPOST_RECEIVE_WORK_REQUESTS=1" in evidence
    assert "NCCL_DEBUG" not in evidence  # the rank sets WARN too: no disagreement
    assert "luxingcom/aicad-nccl-optimization #1" in evidence
    assert "stale-nccl-conf" not in rules_of(run(seed_deployment(), healthy))
    agreeing = {"NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1", "NCCL_DEBUG": "WARN"}
    healthy["spark-102"]["nccl_conf"] = {"path": "/etc/nccl.conf", "settings": agreeing}
    assert "stale-nccl-conf" not in rules_of(run(seed_deployment(), healthy))
