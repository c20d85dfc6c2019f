"""A local node's ``cpus``: the CPUs of this machine its processes run on, so that a node of one
machine behaves as a host of its own (issue 31: a new revision's worker that must move onto a
core another group keeps busy stalls inside the kernel)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from factories import make_deployment
from pydantic import ValidationError

from tandem.backends import local
from tandem.backends.state import DeploymentDir
from tandem.errors import BackendError, FieldFault
from tandem.rankplan import plan_ranks
from tandem.spec.cluster import Cluster, cpu_list, cpu_text


def cluster(transport: str = "local", **node1: object) -> dict:
    return {
        "name": "c",
        "transport": transport,
        "local": {"isolation": "loopback"},
        "nodes": [
            {"name": "n0", "address": "10.0.0.1"},
            {"name": "n1", "address": "10.0.0.2", **node1},
        ],
    }


def test_a_taskset_list_reads_both_ways():
    assert cpu_list("0-3,8, 10") == {0, 1, 2, 3, 8, 10}
    assert cpu_text({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11"
    assert cpu_text(cpu_list("5")) == "5"


@pytest.mark.parametrize("text", ["", "a", "3-1", "0;1", "-1", "0-"])
def test_a_list_that_is_not_one_is_refused_with_the_form_to_write(text):
    with pytest.raises(FieldFault, match="is not a list of CPUs") as caught:
        cpu_list(text)
    assert "taskset" in str(caught.value.hint)


def test_cpus_on_hosts_of_their_own_is_refused_at_the_node():
    with pytest.raises(ValidationError) as caught:
        Cluster.model_validate(cluster("ssh", cpus="1"))
    (error,) = caught.value.errors()
    assert error["loc"] == ("nodes", 1, "cpus")
    assert "transport is ssh" in error["msg"]


def test_each_rank_starts_confined_to_its_nodes_cpus_inside_its_namespace():
    deployment = make_deployment(cluster=Cluster.model_validate(cluster(cpus="0")))
    commands = local.launch_commands(plan_ranks(deployment), deployment)
    by_node = {rank.node: argv for rank, argv in commands}
    assert by_node["n1"][:3] == ["taskset", "--cpu-list", "0"]
    assert by_node["n1"][3].endswith("vllm")
    assert by_node["n0"][0].endswith("vllm")  # a node without cpus runs anywhere
    probe = [*by_node["n1"][:3], sys.executable, "-c", "import os; print(os.sched_getaffinity(0))"]
    assert subprocess.run(probe, capture_output=True, text=True, check=True).stdout == "{0}\n"


def test_cpus_this_machine_does_not_let_tandem_use_are_refused_before_anything_starts(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    beyond = max(os.sched_getaffinity(0)) + 1
    deployment = make_deployment(
        cluster=Cluster.model_validate(cluster(cpus=f"0,{beyond}-{beyond + 1}"))
    )
    with pytest.raises(BackendError) as caught:
        local.up(plan_ranks(deployment), deployment)
    message = str(caught.value)
    assert f"nodes[1].cpus: CPU {beyond}-{beyond + 1} of '0,{beyond}-{beyond + 1}'" in message
    assert not DeploymentDir.of(deployment.name).state_file.exists()
