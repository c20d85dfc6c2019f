"""Two groups of the real SmolLM2 over ssh, the router on the second node (``ssh.router_node``):
``up`` brings each group up on its own namespaced host with its own sshd, starts vLLM's router
there, bound to that host's address, and answers through it; ``status`` reads the router's
members there; ``down`` stops the router by its identity on the node and every group, leaving
nothing on either host.

One boot for the module, on hosts, subnet and ports of its own (10.94.0.0/24, router 8160):
3 min 22 s on two cores, which CI's hour has no room for beside tests/test_fleet_engine.py, so
it is run by hand (``pytest tests/test_fleet_ssh_engine.py -m by_hand``); the router-on-a-node
code itself is in the suite (``tests/test_router_node.py``, a real sshd and vllm-router).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import httpx
import pytest
import ssh_hosts
import yaml
from tandem_cli import deployed, replicas_recipe, run_tandem

pytestmark = [pytest.mark.engine, pytest.mark.netns, pytest.mark.by_hand]

BIN = Path(sys.executable).parent
NAME = "fleet-ssh"
API_KEY = "tandem-fleet-ssh-key"


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory):
    reason = ssh_hosts.available()
    if reason:
        pytest.skip(reason)
    folder = tmp_path_factory.mktemp("fleethosts")
    with ssh_hosts.ssh_hosts(folder, name="fleetssh", subnet="10.94.0.0/24") as made:
        yield made


@pytest.fixture(scope="module")
def fleet(hosts: ssh_hosts.SSHHosts, real_hf_home: Path, tmp_path_factory):
    folder = tmp_path_factory.mktemp("fleetssh")
    (folder / "recipe.yaml").write_text(replicas_recipe(NAME, 8160, 8161))
    cluster = {
        "name": "ssh-fleet",
        "transport": "ssh",
        "ssh": {
            "config_file": str(hosts.config_file),
            "runtime": "venv",
            "vllm_command": str(BIN / "vllm"),
            "router_node": "host1",
            "router_command": str(BIN / "vllm-router"),
            "remote_dir": str(folder / "remote"),
            "connect_timeout_s": 5,
        },
        "nodes": [
            {
                "name": h.name,
                "address": h.address,
                "control_plane_interface": h.interface,
                "env": {"VLLM_CPU_OMP_THREADS_BIND": str(i), "HF_HOME": str(real_hf_home)},
            }
            for i, h in enumerate(hosts.hosts)
        ],
    }
    (folder / "cluster.yaml").write_text(yaml.safe_dump(cluster))
    env = {**os.environ, "TANDEM_HOME": str(folder / "home"), "VLLM_API_KEY": API_KEY}
    env.pop("TANDEM_SSH_CONFIG", None)
    with deployed(folder / "recipe.yaml", folder / "cluster.yaml", NAME, env) as said:
        yield env, said


def test_up_starts_the_router_on_the_named_node_and_answers_through_it(fleet, hosts):
    env, said = fleet
    router = f"http://{hosts.hosts[1].address}:8160"
    assert "on host1, pid" in said and router in said, said
    status = json.loads(run_tandem("status", NAME, "--json", env=env).stdout)
    assert status["verdict"] == "healthy" and status["endpoint"] == router, status
    assert sorted(status["router"]["members"]) == [f"http://{h.address}:8000" for h in hosts.hosts]
    answer = httpx.post(
        f"{router}/v1/chat/completions",
        headers={"Authorization": f"Bearer {API_KEY}"},
        json={
            "model": status["model"],
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 16,
            "temperature": 0,
        },
        timeout=120,
    )
    assert "Paris" in answer.json()["choices"][0]["message"]["content"], answer.text


def test_down_stops_the_router_on_its_node_and_every_group(fleet, hosts):
    env, _ = fleet
    pid = json.loads(run_tandem("status", NAME, "--json", env=env).stdout)["router"]["pid"]
    result = run_tandem("down", NAME, env=env, timeout=180)
    assert f"stopped the router (pid {pid} on host1)" in result.stdout, result.stdout
    state = hosts.ssh(hosts.hosts[1], f"ps -o stat= -p {pid} || true").stdout.strip()
    assert state in ("", "Z"), state  # gone (a zombie waits for this machine's init)
    for group in (f"{NAME}-g0", f"{NAME}-g1"):
        marked = hosts.ssh(
            hosts.hosts[0], f"grep -lzx TANDEM_DEPLOYMENT={group} /proc/[0-9]*/environ || true"
        ).stdout
        assert marked.strip() == "", (group, marked)
    assert run_tandem("status", NAME, "--json", env=env, check=False).returncode != 0
