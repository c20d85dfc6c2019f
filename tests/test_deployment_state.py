"""One record a deployment, of one group or several: what an interrupted ``up`` or a stale
router leaves, how groups save themselves into it, how earlier releases' records are read (one
launch; a fleet of ``NAME-gG`` folders), how ``down`` clears it without signalling any process
it cannot prove is its router, and how a rolling upgrade refuses before it stops anything. No
engine, no router here."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from factories import launched_local_state

from tandem.backends.processes import ProcessIdentity, read_process
from tandem.backends.router import (
    RouterFigures,
    RouterProcess,
    WorkerFigures,
    members_diff,
)
from tandem.backends.state import (
    DeploymentDir,
    DeploymentState,
    find_group,
    list_deployments,
    load_state,
    owner_of,
)
from tandem.errors import BackendError, SpecError, StateError
from tandem.operations import lifecycle
from tandem.operations.health import Verdict
from tandem.operations.supervisor import Member, others_serve, who_serves
from tandem.spec.loading import load_deployment
from tandem.upgrade import upgrade
from tandem.watch.fleet import router_record


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def router_of(identity: ProcessIdentity) -> RouterProcess:
    return RouterProcess(
        pid=identity.pid,
        start_ticks=identity.start_ticks,
        boot=identity.boot,
        url="http://127.0.0.1:9",
        metrics_url="http://127.0.0.1:9/metrics",
        policy="cache_aware",
        version="0.1.17",
        log="router.log",
    )


def dead_identity() -> ProcessIdentity:
    """The identity of a process that has exited."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    process = read_process(child.pid)
    assert process is not None
    child.kill()
    child.wait()
    return ProcessIdentity.of(process)


def two_groups(tmp_path, name: str = "f", **fields) -> DeploymentState:
    """A deployment record of two groups (tiny-local's launch, placed as groups 0 and 1)."""
    one = launched_local_state(tmp_path)
    DeploymentDir.of("tiny-local").forget()
    record = DeploymentState(
        name=name, backend="local", recipe=one.recipe, cluster=one.cluster, model="m", **fields
    )
    record.write()
    for g in (0, 1):
        one.model_copy(
            update={
                "name": f"{name}-g{g}",
                "deployment_name": name,
                "group": g,
                "home": f"{name}/groups/g{g}",
                "endpoint": f"http://10.0.{g}.1:8000",
            }
        ).save()
    return load_state(name)


def test_a_group_saves_itself_into_its_deployments_record(tmp_path):
    state = two_groups(tmp_path)
    assert [g.group for g in state.groups] == [0, 1] and list_deployments() == ["f"]
    group = state.group(1)
    group.ready = True
    group.save()
    state.revision = 3
    state.save()  # the deployment's own fields; the group's save stays
    again = load_state("f")
    assert again.revision == 3 and again.group(1).ready and not again.group(0).ready
    assert again.group(1).directory.path.parts[-3:] == ("f", "groups", "g1")
    assert os.stat(DeploymentDir.of("f").state_file).st_mode & 0o077 == 0
    with pytest.raises(StateError, match="has no group 7"):
        again.group(7)


def test_a_group_is_found_by_the_name_its_processes_carry(tmp_path):
    two_groups(tmp_path)
    found = find_group("f-g1")
    assert found is not None and (found.deployment_name, found.group) == ("f", 1)
    assert owner_of("f-g1") == "f" and owner_of("f-g7") == "f-g7"
    assert find_group("other-g0") is None


def test_an_interrupted_up_is_told_from_a_running_or_finished_one():
    me = ProcessIdentity.current()
    gone = DeploymentState(
        name="f", backend="local", recipe={}, cluster={}, model="m", launcher=dead_identity().text()
    )
    assert gone.interrupted()
    assert not gone.model_copy(update={"launcher": me.text()}).interrupted()
    assert not gone.model_copy(update={"ready": True}).interrupted()


def test_a_record_of_one_launch_is_read_as_a_deployment_of_one_group(tmp_path):
    """What an earlier release wrote for a deployment without replicas (schema 1)."""
    one = launched_local_state(tmp_path)
    old = one.model_dump(mode="json", exclude={"deployment_name", "group", "home"})
    old["schema_version"], old["revision"] = 1, 4
    DeploymentDir.of("tiny-local").state_file.write_text(json.dumps(old))
    state = load_state("tiny-local")
    assert state.revision == 4 and len(state.groups) == 1
    assert state.groups[0].home == "tiny-local" and state.endpoint == one.endpoint


def test_a_kubernetes_launch_of_several_groups_is_split_by_its_ranks(tmp_path):
    one = launched_local_state(tmp_path)
    old = one.model_dump(mode="json", exclude={"deployment_name", "group", "home"})
    old["backend"] = "k8s"
    old["ranks"][1]["group"] = 1
    DeploymentDir.of("tiny-local").state_file.write_text(json.dumps(old))
    state = load_state("tiny-local")
    assert [(g.group, [r.rank for r in g.ranks]) for g in state.groups] == [(0, [0]), (1, [1])]
    assert lifecycle.launch_units(state) == [state.groups]  # one launch id: stopped at once


def test_an_earlier_releases_fleet_is_moved_into_one_record(tmp_path):
    """fleet.json beside NAME-gG folders (ae8070f): read once into the deployment's record, the
    groups keeping their folders and logs; nothing of it is lost and `down` finds it."""
    one = launched_local_state(tmp_path)
    DeploymentDir.of("tiny-local").forget()
    for g in (0, 1):
        old = one.model_dump(mode="json", exclude={"deployment_name", "group", "home"})
        old |= {"name": f"f-g{g}", "schema_version": 1, "revision": 2}
        folder = DeploymentDir.of(f"f-g{g}").path
        (folder / "logs").mkdir(parents=True)
        (folder / "state.json").write_text(json.dumps(old))
        (folder / "logs" / "rank0.log").write_text("INFO ready\n")
    router = router_of(dead_identity())
    (DeploymentDir.of("f").path).mkdir()
    DeploymentDir.of("f").fleet_file.write_text(
        json.dumps({"name": "f", "groups": ["f-g0", "f-g1"], "model": "m",
                    "router": router.model_dump(mode="json"), "ready": True})
    )  # fmt: skip
    assert list_deployments() == ["f"]
    state = load_state("f")
    assert [(g.name, g.home, g.group) for g in state.groups] == [
        ("f-g0", "f-g0", 0),
        ("f-g1", "f-g1", 1),
    ]
    assert state.router == router and state.ready and state.revision == 2
    assert state.recipe["replicas"] == 2 and state.recipe["name"] == "f"
    assert not DeploymentDir.of("f").fleet_file.exists()
    assert state.group(0).directory.rank_logs()  # its folder and logs stay where they were
    lifecycle.take_down(state)
    assert list_deployments() == []


def test_down_clears_the_record_and_signals_no_process_it_cannot_prove_is_its_router(tmp_path):
    me = ProcessIdentity.current()
    impostor = ProcessIdentity(me.pid, me.start_ticks + 1, me.boot)  # our pid, not our start
    state = two_groups(tmp_path, router=router_of(impostor))
    lifecycle.take_down(state)
    assert "f" not in list_deployments()
    assert ProcessIdentity.current() == me  # still alive: nothing was signalled


def test_status_of_a_deployment_whose_router_is_gone_is_down_with_the_reason(tmp_path):
    two_groups(tmp_path, router=router_of(dead_identity()))
    shown = lifecycle.status("f")
    assert shown.verdict is Verdict.DOWN and shown.reason == "the router is not running"
    assert shown.router is not None and not shown.router.running
    assert shown.endpoint == "http://127.0.0.1:9"
    assert [(g.group, g.name, g.verdict, g.member) for g in shown.groups] == [
        (0, "f-g0", Verdict.DOWN, False),
        (1, "f-g1", Verdict.DOWN, False),
    ]


def test_the_routers_members_change_by_a_pure_diff():
    diff = members_diff(want={"a", "b"}, have=["b", "c"])
    assert (diff.add, diff.remove) == (["a"], ["c"]) and diff
    assert not members_diff(want=["a"], have=["a"])


def test_an_upgrade_keeps_the_name_and_the_number_of_groups(tmp_path):
    state = two_groups(tmp_path, name="smollm2-replicas", ready=True)
    one = load_deployment("smollm2-local", as_root=True).model_copy()
    with pytest.raises(SpecError, match="not 'smollm2-replicas'"):
        upgrade("smollm2-replicas", one)
    three = load_deployment("smollm2-replicas", as_root=True)
    three = three.model_copy(update={"recipe": three.recipe.model_copy(update={"replicas": 1})})
    with pytest.raises(SpecError, match="an upgrade changes what each group runs") as info:
        upgrade(state.name, three)
    assert info.value.field == "replicas"


def test_an_upgrade_never_takes_out_the_last_group_that_serves(tmp_path):
    """The router does not run: taking the canary out would leave no group serving, so the
    roll stops before it, and nothing was stopped."""
    two_groups(tmp_path, name="smollm2-replicas", router=router_of(dead_identity()), ready=True)
    with pytest.raises(BackendError, match="would leave no group serving"):
        others_serve("smollm2-replicas", 0, lambda text: None)


def look_line(t: int, *, running: bool = True, members: int = 2, sent: float = 0.0) -> str:
    workers = {"http://a:8000": {"processed": sent}, "http://b:8000": {"processed": 2 * sent}}
    return json.dumps(
        {
            "time": f"2026-12-03T10:00:0{t}Z",
            "groups": 2,
            "running": running,
            "members": ["http://a:8000", "http://b:8000"][:members] if running else [],
            "workers": workers if running else {},
        }
    )


def test_the_routers_record_counts_missed_looks_and_groups_out_of_rotation(tmp_path):
    (tmp_path / "router.jsonl").write_text(
        "\n".join([look_line(0, sent=1), look_line(1, members=1), look_line(2, sent=4)]) + "\n"
    )
    record = router_record(tmp_path)
    assert (record.looks, record.not_running, record.short_of_members) == (3, 0, 1)
    assert record.sent == {"http://a:8000": 3.0, "http://b:8000": 6.0}
    assert not record.ok
    (tmp_path / "router.jsonl").write_text(look_line(0) + "\n" + look_line(1) + "\n")
    assert router_record(tmp_path).ok


def test_a_folder_of_one_group_has_no_router_record(tmp_path):
    with pytest.raises(SpecError, match=r"no router\.jsonl"):
        router_record(tmp_path)


def member(name: str, verdict: Verdict = Verdict.HEALTHY) -> Member:
    return Member(name, f"http://{name}:8000", verdict)


def test_only_healthy_members_serve_and_a_held_breaker_is_named():
    """tandem's verdict says who serves; the router's breaker says whom to put in again."""
    a, b, c, d = member("a"), member("b"), member("c", Verdict.STALLED), member("d")
    figures = RouterFigures(
        running=True,
        members=[a.endpoint, b.endpoint, c.endpoint],  # d healthy but out of the rotation
        workers={
            a.endpoint: WorkerFigures(circuit_open=False),
            b.endpoint: WorkerFigures(circuit_open=True),
            c.endpoint: WorkerFigures(circuit_open=True),
        },
    )
    serving, stuck = who_serves([a, b, c, d], figures)
    assert serving == [a, b] and stuck == [b]
    assert who_serves([c, d], figures) == ([], [])
