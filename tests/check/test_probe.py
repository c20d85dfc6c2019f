"""The probe: parses recorded real outputs, runs on this machine, on Python 3.8, in a namespace."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tandem import agent
from tandem.backends import netns
from tandem.check.node_transport import LocalTransport, clock_offset, parse_facts
from tandem.check.rules.host import ClockSkewRule
from tandem.spec.cluster import LocalIsolation
from tandem.spec.deployment import Deployment, local_cluster
from tests.check.conftest import FIXTURES, facts_of
from tests.factories import make_recipe

AGENT = Path(__file__).parents[2] / "src" / "tandem" / "agent.py"


def test_fixture_node_facts_parse_like_a_real_gb10():
    facts = facts_of("spark-101")
    assert facts["errors"] == {}
    assert facts["system"]["kernel"] == "6.17.0-1026-nvidia"
    assert facts["system"]["dgx_release"]["DGX_SWBUILD_VERSION"] == "7.5.0"
    assert facts["gpu"]["driver_version"] == "580.173.02"
    assert facts["gpu"]["cuda_version"] == "13.0"
    assert facts["gpu"]["gpus"][0]["name"] == "NVIDIA GB10"
    assert facts["gpu"]["unified_memory"] is True  # nvidia-smi says [N/A] for memory on GB10
    assert facts["memory"]["available_bytes"] == 121880448 * 1024
    assert facts["shm"]["total_bytes"] == 64 * 2**30
    assert facts["display"]["display_manager"] == "inactive"
    assert facts["software"]["vllm_version"] == "0.25.1"
    assert facts["tools_missing"] == ["docker"]
    devices = {d["name"]: d for d in facts["rdma"]["devices"]}
    assert set(devices) == {"rocep1s0f0", "rocep1s0f1", "roceP2p1s0f0", "roceP2p1s0f1"}
    twin = devices["rocep1s0f1"]
    assert twin["fw_ver"] == "28.45.4028" and twin["netdevs"] == ["enp1s0f1np1"]
    assert twin["ibv_devinfo"]["ports"]["1"]["state"] == "PORT_ACTIVE"
    gids = twin["ports"][0]["gids"]
    assert [(g["index"], g["type"], g["ipv4"]) for g in gids][2:] == [
        (2, "IB/RoCE v1", "192.168.200.101"),
        (3, "RoCE v2", "192.168.200.101"),
    ]
    assert "uverbs0" in facts["rdma"]["dev_infiniband"]
    assert [p["port"] for p in facts["ports"]["listening"]] == [22, 53]
    model = facts["model"]
    assert model["layout"] == "hf-cache" and model["exists"]
    assert model["commit"] == "5c1e0f6a2b9d4e7f8a1b2c3d4e5f60718293a4b5"
    assert len(model["files"]) == 6 and model["missing_shards"] == []


def test_drifted_node_shows_shifted_gid_gui_and_partial_download():
    facts = facts_of("spark-102-drifted")
    twin = {d["name"]: d for d in facts["rdma"]["devices"]}["roceP2p1s0f1"]
    v2 = [(g["index"], g["ipv4"]) for g in twin["ports"][0]["gids"] if g["type"] == "RoCE v2"]
    assert v2 == [(1, None), (3, None), (5, "192.168.201.102")]
    assert facts["display"]["gui_rss_bytes"] == (318204 + 421776) * 1024
    assert [p["name"] for p in facts["gpu"]["graphics_processes"]] == [
        "/usr/lib/xorg/Xorg",
        "/usr/bin/gnome-shell",
    ]
    assert facts["model"]["missing_shards"] == ["model-00003-of-00003.safetensors"]
    assert facts["model"]["incomplete_blobs"][0].endswith(".incomplete")
    assert {"port": 8888, "addresses": ["0.0.0.0"]} in facts["ports"]["listening"]


def test_faulted_node_shows_the_host_faults_mechanisms():
    healthy, faulted = facts_of("spark-102"), facts_of("spark-102-faulted")
    assert healthy["memory"]["cma_total_bytes"] == 32768 * 1024
    assert faulted["memory"]["cma_total_bytes"] == 0
    assert faulted["system"]["kernel"] == "7.0.0-1019-nvidia"
    links = {d["name"]: d["pci"] for d in faulted["rdma"]["devices"]}
    assert links["rocep1s0f1"] == {
        "slot": "0000:01:00.1",
        "current_link_speed": "32.0 GT/s PCIe",
        "current_link_width": 4,
        "max_link_speed": "32.0 GT/s PCIe",
        "max_link_width": 4,
    }
    assert links["roceP2p1s0f1"]["slot"] == "0002:01:00.1"
    assert links["roceP2p1s0f1"]["current_link_width"] == 2
    assert healthy["nccl_conf"] is None
    assert faulted["nccl_conf"]["settings"]["NCCL_IB_USE_INLINE"] == "1"


def test_missing_tools_are_facts_not_crashes(tmp_path: Path):
    (tmp_path / "commands").mkdir()
    node = agent.Node(root=str(tmp_path), commands=str(tmp_path / "commands"))
    facts = agent.collect(
        node,
        argparse.Namespace(
            model="org/m", revision="main", cache_root="/hf", model_path=None, hash=False
        ),
    )
    assert facts["errors"] == {}
    assert {"nvidia-smi", "ibv_devinfo", "ip", "df", "systemctl", "docker", "ctr"} <= set(
        facts["tools_missing"]
    )
    assert facts["gpu"]["present"] is False and facts["rdma"]["devices"] == []
    assert facts["model"]["exists"] is False


def test_the_room_of_the_cache_is_read_where_the_snapshot_will_go(tmp_path: Path):
    """The folder of a snapshot not yet copied does not exist: its filesystem is the nearest
    folder above it that does (what ``tandem model pull`` and ``sync`` judge a copy against)."""
    node = agent.Node(root=str(tmp_path), commands=str(tmp_path))
    facts = agent.model_facts(node, "org/m", "main", "/hf", None)
    stat = os.statvfs(tmp_path)
    assert facts["exists"] is False
    assert abs(facts["free_bytes"] - stat.f_bavail * stat.f_frsize) < 64 * 2**20
    assert agent.free_bytes(agent.Node(root="/"), "/no/such/folder/here") == agent.free_bytes(
        agent.Node(root="/"), "/"
    )


def test_plain_directory_is_not_the_cache_layout(tmp_path: Path):
    flat = tmp_path / "hf" / "DeepSeek-V4-Flash-DSpark"
    flat.mkdir(parents=True)
    (flat / "config.json").write_text("{}")
    node = agent.Node(root=str(tmp_path), commands=str(tmp_path))
    facts = agent.collect(
        node,
        argparse.Namespace(
            model="deepseek-ai/DeepSeek-V4-Flash-DSpark",
            revision="main",
            cache_root="/hf",
            model_path=None,
            hash=False,
        ),
    )
    assert facts["model"]["layout"] == "plain-directory"


def test_ctr_is_asked_only_when_containerds_socket_is_there(tmp_path: Path, monkeypatch):
    """Docker's ctr with no containerd running dials for 10 s before it fails, on every probe.
    A stand-in ctr that prints the recorded listing shows it is not run while the socket is
    absent (and not called missing), and is run and read once the socket is there."""
    recorded = FIXTURES / "spark-101" / "commands" / "ctr-images"
    ran = tmp_path / "ctr-ran"
    ctr = tmp_path / "bin" / "ctr"
    ctr.parent.mkdir()
    ctr.write_text(f"#!/bin/sh\ntouch {ran}\ncat {recorded}\n")
    ctr.chmod(0o755)
    monkeypatch.setenv("PATH", f"{ctr.parent}{os.pathsep}{os.environ['PATH']}")
    sock = tmp_path / "containerd.sock"
    monkeypatch.setenv("CONTAINERD_ADDRESS", str(sock))

    def containerd_images(node: agent.Node) -> list[str]:
        images = agent.image_facts(node)["images"]
        return [i["ref"] for i in images if i["store"] == "containerd/k8s.io"]

    absent = agent.Node()
    assert containerd_images(absent) == [] and not ran.exists()
    assert "ctr" not in absent.tools_missing  # installed, only nothing to ask
    sock.touch()
    assert "registry.k8s.io/pause:3.10" in containerd_images(agent.Node())
    assert ran.exists()


@pytest.mark.parametrize("python", [sys.executable, "/root/.pyenv/versions/3.8.18/bin/python3"])
def test_probe_script_runs_standalone_on_fixtures(python: str):
    if not Path(python).exists():
        pytest.skip(f"{python} not installed")
    root = FIXTURES / "spark-101"
    out = subprocess.run(
        [
            python,
            str(AGENT),
            "facts",
            "--root",
            str(root),
            "--commands",
            str(root / "commands"),
            "--model",
            "deepseek-ai/DeepSeek-V4-Flash-DSpark",
            "--cache-root",
            "/root/.cache/huggingface",
            "--verify",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    facts = json.loads(out.stdout)
    assert facts["system"]["kernel"] == "6.17.0-1026-nvidia"
    files = facts["model"]["files"]
    assert files and all(f["verified"] == "hashed" for f in files)
    assert facts["model"]["corrupt"] == []


def test_probe_runs_for_real_on_this_machine():
    """Piped to `python3 -` as the SSH and kubectl transports ship it."""
    started = time.time()
    out = subprocess.run(
        [sys.executable, "-", "facts", "--model", "org/absent"],
        input=agent.source(),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    facts = parse_facts(out.stdout, "here", started, time.time())
    assert facts["errors"] == {}
    assert abs(facts["clock_offset_s"]) <= facts["clock_offset_bound_s"]  # one clock
    assert facts["system"]["kernel"] == os.uname().release
    assert any(i["name"] == "lo" for i in facts["interfaces"])
    assert facts["memory"]["total_bytes"] > 0 and facts["shm"]["total_bytes"] > 0
    assert facts["software"]["python"]


@pytest.mark.netns
def test_probe_runs_inside_a_network_namespace_node():
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("needs root and iproute2")
    cluster = local_cluster(2, subnet="10.79.41.0/24")
    deployment = Deployment(recipe=make_recipe(name="probe-ns"), cluster=cluster)
    network = netns.network_plan(f"prb{os.getpid()}", cluster)
    netns.create(network)
    try:
        transport = LocalTransport(deployment, netns={n.node: n.netns for n in network.nodes})
        facts = transport.run_probe(cluster.nodes[1])
    finally:
        assert netns.destroy(network) == []
    interfaces = {i["name"]: i for i in facts["interfaces"]}
    assert set(interfaces) == {"lo", "tdm1"}
    assert "10.79.41.2" in interfaces["tdm1"]["addresses"]
    # the same clock: the offset is within its bound however long the probe took
    assert abs(facts["clock_offset_s"]) <= facts["clock_offset_bound_s"]


@pytest.mark.parametrize(
    "stamp, work_s, offset_s, bound_s",
    [
        (100.5, 0.0, 0.0, 0.5),  # the stamp somewhere in a one-second call
        (100.0, 0.8, -0.1, 0.1),  # 0.8 s of the call was the probe's work, after its stamp
        (130.0, 0.8, 29.9, 0.1),  # a node 30 s ahead
        (100.0, 1.5, 0.0, 0.0),  # work longer than the call (clock rates differ): no window left
    ],
    ids=["no work", "work after the stamp", "node ahead", "work longer than the call"],
)
def test_clock_offset_leaves_the_probe_work_out_of_the_round_trip(stamp, work_s, offset_s, bound_s):
    assert clock_offset(stamp, work_s, 100.0, 101.0) == pytest.approx((offset_s, bound_s))


def test_facts_of_an_older_probe_read_with_the_whole_call_as_bound():
    """Facts stamped only at the end (``time_unix``) keep parsing; their bound is half the call."""
    facts = parse_facts(json.dumps({"time_unix": 101.0}), "old", 100.0, 104.0)
    assert (facts["clock_offset_s"], facts["clock_offset_bound_s"]) == (-1.0, 2.0)
    new = parse_facts(
        json.dumps({"time_unix": 103.7, "started_unix": 100.25, "elapsed_s": 3.5}),
        "new",
        100.0,
        104.0,
    )
    assert (new["clock_offset_s"], new["clock_offset_bound_s"]) == (0.0, 0.25)


SLOW_NVIDIA_SMI_S = 1.5
"""Each of the probe's two nvidia-smi calls sleeps this long, as on a real host it can."""


def test_a_slow_probe_does_not_read_as_a_clock_offset(tmp_path: Path):
    """A real slow command in the probe's path: an ``nvidia-smi`` that takes 1.5 s before it
    prints the recorded GB10 output. The probe's work (two calls, 3 s) leaves both the offset
    and its bound; the old reading (end stamp against the call's midpoint) would have been a
    1.5 s offset, over the clock-skew limit (1 s)."""
    recorded = FIXTURES / "spark-101" / "commands"
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        f"#!/bin/sh\nsleep {SLOW_NVIDIA_SMI_S}\n"
        f'case "$1" in --query-gpu=*) cat {recorded / "nvidia-smi-query-gpu"};;\n'
        f"*) cat {recorded / 'nvidia-smi'};; esac\n"
    )
    smi.chmod(0o755)
    cluster = local_cluster(1, isolation=LocalIsolation.LOOPBACK)
    node = cluster.nodes[0].model_copy(
        update={"env": {"PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}}
    )
    transport = LocalTransport(Deployment(recipe=make_recipe(name="probe-slow"), cluster=cluster))
    started = time.time()
    facts = transport.run_probe(node)
    round_trip_s = time.time() - started
    assert facts["gpu"]["gpus"][0]["name"] == "NVIDIA GB10"  # the slow command really ran
    assert facts["elapsed_s"] >= 2 * SLOW_NVIDIA_SMI_S
    offset_s, bound_s = facts["clock_offset_s"], facts["clock_offset_bound_s"]
    assert abs(offset_s) <= bound_s  # one clock
    # the bound is half of what the round trip had besides the probe's work, not half of it all
    assert bound_s <= (round_trip_s - facts["elapsed_s"]) / 2 + 0.001
    assert abs(offset_s) - bound_s <= ClockSkewRule.limit_s
    old_offset_s, _ = clock_offset(facts["time_unix"], 0.0, started, started + round_trip_s)
    assert old_offset_s > ClockSkewRule.limit_s
