"""The fabric test for real: two ranks in two network namespaces, Gloo over their veths.

Also the parts that need no namespaces: the rank environment and the NCCL log parsing (on
lines NCCL really prints).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
from ports import free_ports
from tandem_cli import run_tandem

from tandem.check.fabric import (
    FabricResult,
    FabricSize,
    fabric_findings,
    parse_nccl_transports,
    rank_environment,
)
from tandem.check.findings import Severity
from tandem.operations.preflight import run_check
from tandem.spec.deployment import Deployment, local_cluster
from tests.check.conftest import seed_deployment
from tests.factories import make_recipe

NCCL_LOG = """\
node0:1234:1300 [0] NCCL INFO NET/IB : Using [0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE [RO]; OOB enP7s7:192.168.100.101<0>
node0:1234:1300 [0] NCCL INFO Using network IB
node0:1234:1301 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/IB/0/GDRDMA
node0:1234:1301 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[0] [send] via NET/IB/1/GDRDMA
"""  # noqa: E501 - NCCL's own log line, as printed
SOCKET_LOG = """\
gpu0:88:90 [0] NCCL INFO NET/Socket : Using [0]enP7s7:192.168.100.101<0>
gpu0:88:90 [0] NCCL INFO Using network Socket
gpu0:88:91 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0
"""
P2P_LOG = "h:1:2 [0] NCCL INFO Channel 00/1 : 0[0] -> 1[1] via P2P/CUMEM/read\n"


def test_nccl_transport_is_read_from_the_debug_log():
    assert parse_nccl_transports(NCCL_LOG) == (["NET/IB"], "IB")
    assert parse_nccl_transports(SOCKET_LOG) == (["NET/Socket"], "Socket")
    assert parse_nccl_transports(P2P_LOG) == (["P2P"], None)


def test_rank_environment_is_the_plans_plus_the_rendezvous():
    base = {
        "PATH": "/usr/bin",
        "NCCL_IB_HCA": "stale",
        "GLOO_SOCKET_IFNAME": "eth0",
        "NCCL_NVLS_ENABLE": "0",
        "VLLM_HOST_IP": "1.2.3.4",
    }
    plan = {"GLOO_SOCKET_IFNAME": "tdm1", "VLLM_HOST_IP": "10.0.0.2", "NCCL_DEBUG": "WARN"}
    env = rank_environment(
        base, plan, master="10.0.0.1", port=29600, rank=1, world=2, local_rank=0, nccl=True
    )
    assert env["GLOO_SOCKET_IFNAME"] == "tdm1" and env["VLLM_HOST_IP"] == "10.0.0.2"
    assert "NCCL_IB_HCA" not in env  # the caller's leftovers never leak into a rank
    assert env["NCCL_NVLS_ENABLE"] == "0"  # host safety switch kept
    assert env["NCCL_DEBUG"] == "INFO"  # the fabric test reads NCCL's transport from its log
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["RANK"], env["WORLD_SIZE"]) == (
        "10.0.0.1",
        "29600",
        "1",
        "2",
    )


def _need_netns():
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("needs root and iproute2 for network namespaces")


@pytest.mark.netns
@pytest.mark.timeout(240)
def test_gloo_all_reduce_across_two_namespace_ranks():
    _need_netns()
    recipe = make_recipe(name="fabric-test", model__offline=False, shm_size="64m")
    cluster = local_cluster(2, subnet="10.79.42.0/24", cpu_count=os.cpu_count() or 1)
    deployment = Deployment(recipe=recipe, cluster=cluster)
    before = set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()
    report = run_check(
        deployment,
        fabric=True,
        fabric_port=29611,
        fabric_sizes=[1024, 65536, 1 << 20],
        fabric_timeout_s=180,
    )
    after = set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()
    assert after <= before  # the throw-away namespaces are gone

    fabric = report.fabric
    assert fabric["ok"], fabric
    assert fabric["backend"] == "gloo" and fabric["world_size"] == 2 and fabric["correct"]
    assert fabric["master"] == "10.79.42.1:29611"
    assert [r["node"] for r in fabric["ranks"]] == ["node0", "node1"]
    # each rank ran with its own node's pins, exactly as the rank plan gives them
    assert fabric["rank_env"]["0"]["GLOO_SOCKET_IFNAME"] == "tdm0"
    assert fabric["rank_env"]["1"]["GLOO_SOCKET_IFNAME"] == "tdm1"
    assert fabric["rank_env"]["1"]["VLLM_HOST_IP"] == "10.79.42.2"
    assert [s["bytes"] for s in fabric["sizes"]] == [1024, 65536, 1 << 20]
    assert fabric["sizes"][-1]["busbw_gbps"] > 0 and fabric["peak_busbw_gbps"] > 0
    assert fabric["small_message_latency_us"] > 0
    # probes ran inside the namespaces: each node sees only its own interface
    for i, name in enumerate(["node0", "node1"]):
        names = {x["name"] for x in report.nodes[name]["interfaces"]}
        assert names == {"lo", f"tdm{i}"}
    assert [f.rule for f in report.findings if f.severity.value == "error"] == []
    assert any(f.rule == "fabric" for f in report.findings)


@pytest.mark.netns
@pytest.mark.timeout(120)
def test_a_broken_rank_fails_the_fabric_with_a_finding():
    _need_netns()
    recipe = make_recipe(name="fabric-bad", model__offline=False, shm_size="64m")
    cluster = local_cluster(2, subnet="10.79.43.0/24")
    # rank 1 pinned to an interface its node does not have: Gloo cannot start there
    nodes = [
        cluster.nodes[0],
        cluster.nodes[1].model_copy(
            update={"env": {**cluster.nodes[1].env, "GLOO_SOCKET_IFNAME": "eth9"}}
        ),
    ]
    deployment = Deployment(recipe=recipe, cluster=cluster.model_copy(update={"nodes": nodes}))
    report = run_check(
        deployment, fabric=True, fabric_port=29612, fabric_sizes=[1024], fabric_timeout_s=60
    )
    assert not report.fabric["ok"]
    assert [f.rule for f in report.errors] == ["fabric-failed"]
    assert "rank 1 on node1 exited" in report.errors[0].message


def _tandem(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return run_tandem(*args, env={**os.environ, **(env or {})}, timeout=200, check=False)


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


LOOPBACK_CLUSTER = """\
name: pair
transport: local
local: {isolation: loopback}
nodes:
  - {name: node0, address: 127.0.0.1, control_plane_interface: lo}
  - {name: node1, address: 127.0.0.1, control_plane_interface: lo}
"""


def test_cli_json_interface_and_exit_status(tmp_path: Path, tandem_here):
    cluster = _write(tmp_path, "cluster.yaml", LOOPBACK_CLUSTER)
    api, master = free_ports(2)
    good = _write(
        tmp_path,
        "good.yaml",
        "name: good\nmodel: {repo_id: org/absent, offline: false}\n"
        f"engine: {{serve: {{tensor_parallel_size: 2}}}}\nports: {{api: {api}, master: {master}}}\n"
        "shm_size: 64m\n",
    )
    out = tandem_here("check", str(good), "--cluster", str(cluster), "--json")
    assert out.code == 0, out.err
    report = json.loads(out.out)
    assert set(report) == {"nodes", "findings", "fabric"}
    assert set(report["nodes"]) == {"node0", "node1"}
    assert report["fabric"] == {}
    assert all(
        set(f) >= {"rule", "severity", "node", "evidence", "fix"} for f in report["findings"]
    )

    bad = _write(
        tmp_path,
        "bad.yaml",
        good.read_text().replace("shm_size: 64m\n", "shm_size: 64m\nenv: {VLLM_USE_B12X_MHC: 1}\n"),
    )
    out = tandem_here("check", str(bad), "--cluster", str(cluster), "--json")
    assert out.code == 1
    findings = json.loads(out.out)["findings"]
    assert ("known-bad-env", "error") in {(f["rule"], f["severity"]) for f in findings}


def test_up_refuses_on_preflight_errors_and_logs_a_skip(tmp_path: Path, tandem_here):
    cluster = _write(tmp_path, "cluster.yaml", LOOPBACK_CLUSTER)
    api, master = free_ports(2)
    bad = _write(
        tmp_path,
        "bad.yaml",
        "name: refused\nmodel: {repo_id: org/absent}\n"
        f"engine: {{serve: {{tensor_parallel_size: 2}}}}\nports: {{api: {api}, master: {master}}}\n"
        "shm_size: 64m\n",
    )
    home = {"TANDEM_HOME": str(tmp_path / "home")}
    out = tandem_here("up", str(bad), "--cluster", str(cluster), **home)
    assert out.code == 1
    assert "model-snapshot-missing" in out.out
    assert "refusing to launch 'refused'" in out.err
    assert not (tmp_path / "home" / "deployments" / "refused").exists()  # nothing was started
    dry = tandem_here("up", str(bad), "--cluster", str(cluster), "--dry-run", **home)
    assert dry.code == 0  # a dry run only prints
    # A process of its own: the skip reaches stderr through logging's last resort, which
    # pytest's log capture replaces in this process. The API port is held here, so the launch
    # that follows the skip stops at the backend's port check: no engine starts in this tier.
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", api))
        holder.listen()
        skipped = _tandem("up", str(bad), "--cluster", str(cluster), "--skip-checks", env=home)
    assert skipped.returncode == 2  # an error before anything started
    assert "preflight checks skipped for 'refused' (--skip-checks)" in skipped.stderr
    assert "preflight skipped" in skipped.stdout
    assert f"port {api} on this machine is already in use" in skipped.stderr
    assert not (tmp_path / "home" / "deployments" / "refused").exists()


def _spark_pair_run(busbw_gbps: float, size: int = 1 << 30) -> FabricResult:
    """A two-Spark NCCL run as ``run_fabric`` records it, with the measured bus bandwidth."""
    return FabricResult(
        ok=True,
        backend="nccl",
        world_size=2,
        ranks=[
            {"rank": 0, "node": "spark-101", "address": "192.168.100.101", "local_rank": 0},
            {"rank": 1, "node": "spark-102", "address": "192.168.100.102", "local_rank": 0},
        ],
        master="192.168.100.101:29600",
        correct=True,
        sizes=[
            FabricSize(
                bytes=size,
                iters=20,
                time_us=size / (2 * busbw_gbps * 1e3),
                algbw_gbps=busbw_gbps * 2,
                busbw_gbps=busbw_gbps,
            )
        ],
        peak_busbw_gbps=busbw_gbps,
        nccl_version="2.28.9",
        transports=["NET/IB"],
        nccl_network="IB",
    )


@pytest.mark.parametrize(
    ("busbw", "size", "severity"),
    [
        (23.74, 1 << 30, None),  # both twins, MTU 9000, release NCCL (playbooks #102)
        (18.94, 16 << 30, Severity.WARNING),  # MTU 1500 (playbooks #25)
        (3.04, 1 << 30, Severity.ERROR),  # a dev-branch NCCL build (playbooks #102)
        (3.04, 256 << 20, None),  # too small a message for a verdict
    ],
)
def test_fabric_verdict_against_what_a_spark_pair_reaches(healthy, busbw, size, severity):
    findings = fabric_findings(seed_deployment(), _spark_pair_run(busbw, size), healthy)
    fired = [f for f in findings if f.rule == "fabric-bandwidth"]
    assert [f.severity for f in fired] == ([severity] if severity else [])
    if fired:
        assert f"{busbw:.2f} GB/s" in fired[0].message and "PR #35" in fired[0].evidence
        assert "v2.28.9-1" in fired[0].fix


def test_fabric_verdict_only_when_the_nodes_are_known_sparks(healthy):
    for facts in healthy.values():
        facts["gpu"]["gpus"][0]["name"] = "NVIDIA H200"
    findings = fabric_findings(seed_deployment(), _spark_pair_run(3.04), healthy)
    assert "fabric-bandwidth" not in {f.rule for f in findings}
