"""What the local backend's ``up`` says when it is undone (no engine: ``sleep`` stands in for
vLLM, and the network calls are scripted, so nothing outside the test is built or removed)."""

from __future__ import annotations

import pytest
from factories import make_deployment

from tandem.backends import local, netns
from tandem.backends.processes import marked_processes
from tandem.backends.state import DeploymentDir
from tandem.errors import BackendError
from tandem.interrupts import Interrupted
from tandem.rankplan import plan_ranks
from tandem.spec.cluster import Cluster


def deployment_on(isolation: str, address: str):
    cluster = Cluster.model_validate(
        {
            "name": "c",
            "transport": "local",
            "local": {"isolation": isolation},
            "nodes": [
                {"name": f"n{i}", "address": address.format(i=i + 1), "gpus": 1} for i in (0, 1)
            ],
        }
    )
    return make_deployment(cluster=cluster)


@pytest.fixture
def sleeping_ranks(tmp_path, monkeypatch):
    """Each rank is ``sleep 60``, started as ``up`` starts a rank; no port is checked."""
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    monkeypatch.setattr(
        local,
        "launch_commands",
        lambda plan, d: [(r, ["sleep", "60"]) for r in plan.in_start_order()],
    )
    monkeypatch.setattr(local, "_port_taken", lambda host, port: False)


@pytest.mark.parametrize(
    "signal_, said",
    [
        (KeyboardInterrupt(), "interrupted by Ctrl-C (SIGINT): stopping every rank"),
        (Interrupted(15), "interrupted by SIGTERM: stopping every rank"),
    ],
)
def test_a_signal_while_the_ranks_boot_is_logged_as_what_it_was(
    sleeping_ranks, monkeypatch, signal_, said
):
    deployment = deployment_on("loopback", "127.0.0.1")

    def interrupted_wait(*args, **kwargs):
        raise signal_

    monkeypatch.setattr(local, "await_ready", interrupted_wait)
    events: list[str] = []
    with pytest.raises(type(signal_)):
        local.up(plan_ranks(deployment), deployment, on_event=events.append)
    assert said in events and not any("start-up failed" in e for e in events), events
    assert marked_processes(deployment.name) == {}
    assert not DeploymentDir.of(deployment.name).state_file.exists()


def test_a_refused_network_is_never_removed_nor_said_to_be(sleeping_ranks, monkeypatch):
    # --skip-checks: no preflight saw that the names are another TANDEM_HOME's network.
    deployment = deployment_on("netns", "10.77.0.{i}")
    removed: list[str] = []
    monkeypatch.setattr(local.os, "geteuid", lambda: 0)
    monkeypatch.setattr(netns, "sweep_orphans", lambda on_event: [])

    def refuse(plan, **kwargs):
        raise BackendError(f"{plan.nodes[0].netns} already exist(s) on this machine")

    monkeypatch.setattr(netns, "create", refuse)
    monkeypatch.setattr(netns, "destroy", lambda plan: removed.append(plan.bridge) or [])
    events: list[str] = []
    with pytest.raises(BackendError, match="already exist"):
        local.up(plan_ranks(deployment), deployment, on_event=events.append)
    assert removed == []  # the other command's namespaces are left alone
    assert not any("removed bridge" in e or "stopping every rank" in e for e in events), events
    assert not DeploymentDir.of(deployment.name).state_file.exists()
