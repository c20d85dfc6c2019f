"""A local deployment's namespaces name their peers in their own hosts file.

Inside a namespace this machine's DNS server is not reachable, and c10d asks the resolver for
the name of every peer's address: each boot waited out the resolver (10 s). ``netns.create``
writes ``/etc/netns/NS/hosts`` (which ``ip netns exec`` mounts over ``/etc/hosts``) and
``destroy`` removes it, and only it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tandem.backends import netns
from tandem.spec.cluster import Cluster

SUBNET = "10.61.0.0/24"


def cluster() -> Cluster:
    return Cluster.model_validate(
        {
            "name": "names",
            "transport": "local",
            "local": {"isolation": "netns", "subnet": SUBNET},
            "nodes": [
                {
                    "name": f"n{i}",
                    "address": f"10.61.0.{i + 1}",
                    "control_plane_interface": f"tdm{i}",
                }
                for i in range(2)
            ],
        }
    )


def test_the_hosts_file_keeps_this_machines_and_adds_every_peer_and_the_bridge():
    plan = netns.network_plan("names", cluster())
    text = netns.hosts_text(plan, "127.0.0.1\tlocalhost\n")
    assert text.startswith("127.0.0.1\tlocalhost\n")
    assert "10.61.0.1\tn0\n" in text and "10.61.0.2\tn1\n" in text
    assert "::ffff:10.61.0.2\tn1\n" in text  # how c10d's dual-stack store sees a peer
    assert f"{plan.bridge_address}\t{plan.bridge}\n" in text


@pytest.mark.netns
@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
def test_a_peer_is_named_at_once_and_destroy_removes_only_what_create_wrote():
    plan = netns.network_plan("names", cluster())
    had_names_dir = netns.NAMES_DIR.exists()
    theirs = netns.NAMES_DIR / plan.nodes[1].netns  # a folder this create did not make
    theirs.mkdir(parents=True, exist_ok=True)
    (theirs / "resolv.conf").write_text("nameserver 10.61.0.254\n")
    stale = netns.NAMES_DIR / plan.nodes[0].netns  # what an interrupted run of tandem left
    stale.mkdir(exist_ok=True)
    (stale / "hosts").write_text(
        f"# written by tandem for network namespace {plan.nodes[0].netns}; removed with it\n"
    )
    netns.create(plan, purpose="test")
    try:
        hosts = stale / "hosts"
        assert hosts.read_text().startswith("# written by tandem")
        assert "10.61.0.2\tn1\n" in hosts.read_text()  # written again, not skipped
        started = time.monotonic()
        named = subprocess.run(
            ["ip", "netns", "exec", plan.nodes[0].netns, sys.executable, "-c",
             "import socket; print(socket.getnameinfo(('10.61.0.2', 80), 0)[0], "
             "socket.getnameinfo(('::ffff:10.61.0.2', 80, 0, 0), 0)[0])"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert named.stdout.split() == ["n1", "n1"], named.stderr
        assert time.monotonic() - started < 5  # the resolver's timeout is 2 x 5 s
        assert not (theirs / "hosts").exists()
    finally:
        assert netns.destroy(plan) == []
    assert not hosts.parent.exists()
    assert (theirs / "resolv.conf").exists()  # never tandem's to remove
    (theirs / "resolv.conf").unlink()
    theirs.rmdir()
    assert netns.NAMES_DIR.exists()  # made by this test, not by tandem: not tandem's to remove
    if not had_names_dir:
        netns.NAMES_DIR.rmdir()


@pytest.mark.netns
@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
def test_etc_netns_made_by_tandem_goes_with_the_last_namespace():
    plan = netns.network_plan("names", cluster())
    had_names_dir = netns.NAMES_DIR.exists()
    netns.create(plan, purpose="test")
    try:
        assert (netns.NAMES_DIR / plan.nodes[1].netns / "hosts").exists()
    finally:
        assert netns.destroy(plan) == []
    assert netns.NAMES_DIR.exists() == had_names_dir  # removed only when tandem had made it
