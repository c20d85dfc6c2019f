"""vLLM's router on a node of an ssh cluster (``ssh.router_node``): the real ``vllm-router``
started over ssh on a namespaced host with its own sshd, reached at that host's address from
this machine, and stopped by its marks, leaving a process with another launch's marks alone.
No engine: the router starts empty, and a group joins it only in the fleet's ``up``."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest
import ssh_hosts

from tandem.backends import router as routers
from tandem.backends.router_node import RouterNode
from tandem.errors import BackendError
from tandem.spec.cluster import Cluster
from tandem.spec.recipe import Router

pytestmark = pytest.mark.netns

ROUTER = Path(sys.executable).parent / "vllm-router"


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory):
    reason = ssh_hosts.available()
    if reason:
        pytest.skip(reason)
    if not ROUTER.exists():
        pytest.skip("vllm-router is not installed beside this Python (make install)")
    folder = tmp_path_factory.mktemp("routerhosts")
    with ssh_hosts.ssh_hosts(folder, name="routertest", subnet="10.93.0.0/24") as made:
        yield made


def node_of(hosts: ssh_hosts.SSHHosts) -> RouterNode:
    cluster = Cluster.model_validate(
        {
            "name": "routertest",
            "nodes": [{"name": h.name, "address": h.address} for h in hosts.hosts],
            "ssh": {
                "config_file": str(hosts.config_file),
                "router_node": "host1",
                "router_command": str(ROUTER),
                "remote_dir": str(hosts.folder / "remote"),
            },
        }
    )
    node = RouterNode.of(cluster, "fleet")
    assert node is not None
    return node


def alive(hosts: ssh_hosts.SSHHosts, pid: str | int) -> bool:
    """Pid runs on host1 (a zombie waiting for this machine's init to reap it does not)."""
    state = hosts.ssh(hosts.hosts[1], f"ps -o stat= -p {pid} || true").stdout.strip()
    return bool(state) and not state.startswith("Z")


def routers_on_node(hosts: ssh_hosts.SSHHosts) -> list[str]:
    return hosts.ssh(hosts.hosts[1], "pgrep -x vllm::router || true").stdout.split()


def test_a_router_of_another_version_is_refused_before_anything_starts(hosts, tmp_path):
    node = node_of(hosts)
    with pytest.raises(BackendError) as info:
        routers.start(Router(version="0.0.1"), log=tmp_path / "router.log", node=node)
    assert f"is vllm-router {routers.installed_version()}" in str(info.value)
    assert "pins 0.0.1" in str(info.value) and info.value.field == "ssh.router_command"
    assert routers_on_node(hosts) == []


def test_the_router_serves_at_the_nodes_address_and_stop_ends_only_it(hosts, tmp_path):
    # The user's own vllm-router on the same node, on other ports: tandem must leave it.
    theirs = hosts.ssh(
        hosts.hosts[1],
        f"setsid {ROUTER} --host 127.0.0.1 --port 8185 --prometheus-port 8186 "
        "> /dev/null 2>&1 < /dev/null & echo $!",
    ).stdout.split()[-1]
    spec = Router(port=8183, metrics_port=8184)
    router = routers.start(spec, log=tmp_path / "router.log", node=node_of(hosts))
    try:
        assert router.url == f"http://{hosts.hosts[1].address}:8183" and router.node
        assert httpx.get(router.url + "/liveness", timeout=5).status_code == 200
        assert routers.members(router) == [] and router.running()
        assert routers.look(router).running  # its /metrics answer at the node's address too
    finally:
        stopped = routers.stop(router)
    assert stopped and not router.running() and not alive(hosts, router.pid)
    with pytest.raises(httpx.HTTPError):
        httpx.get(router.url + "/liveness", timeout=2)
    assert alive(hosts, theirs)  # the other router still runs
    assert not routers.stop(router)  # a second stop finds nothing and signals nothing
    assert alive(hosts, theirs)
    assert "vllm" in hosts.ssh(hosts.hosts[1], f"cat {router.node.log}").stdout.lower()
    hosts.ssh(hosts.hosts[1], f"kill {theirs}")
