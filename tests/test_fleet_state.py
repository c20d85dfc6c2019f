"""The fleet's record (``fleet.json``) as an interrupted ``up`` or a stale router leaves it:
``down`` clears it without signalling any process it cannot prove is its router, ``status``
says down with the reason, a group finds its fleet, and a watch's router looks add up. No
engine, no router here."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tandem.backends.processes import ProcessIdentity, read_process
from tandem.backends.router import RouterFigures, RouterProcess, WorkerFigures
from tandem.backends.state import FleetState, fleet_exists, fleet_of, load_fleet
from tandem.errors import BackendError, SpecError, StateError
from tandem.operations import fleet
from tandem.operations.health import Verdict
from tandem.operations.supervisor import Member, who_serves
from tandem.spec.loading import load_deployment
from tandem.upgrade import rolling_upgrade
from tandem.watch.fleet import router_record


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    return tmp_path


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


def test_an_interrupted_up_is_told_from_a_running_or_finished_one():
    me = ProcessIdentity.current()
    gone = FleetState(name="f", groups=["f-g0"], model="m", launcher=dead_identity().text())
    assert gone.interrupted()
    assert not gone.model_copy(update={"launcher": me.text()}).interrupted()
    assert not gone.model_copy(update={"ready": True}).interrupted()


def test_down_clears_the_record_and_signals_no_process_it_cannot_prove_is_its_router():
    me = ProcessIdentity.current()
    impostor = ProcessIdentity(me.pid, me.start_ticks + 1, me.boot)  # our pid, not our start
    FleetState(name="f", groups=["f-g0", "f-g1"], model="m", router=router_of(impostor)).save()
    assert fleet_exists("f")
    fleet.down("f")
    assert not fleet_exists("f")
    assert ProcessIdentity.current() == me  # still alive: nothing was signalled


def test_status_of_a_fleet_whose_router_and_groups_are_gone_is_down_with_the_reason():
    FleetState(
        name="f", groups=["f-g0", "f-g1"], model="m", router=router_of(dead_identity())
    ).save()
    shown = fleet.status("f")
    assert shown.verdict is Verdict.DOWN and shown.reason == "the router is not running"
    assert shown.router is not None and not shown.router.running
    assert [(g.group, g.name, g.verdict, g.member) for g in shown.groups] == [
        (0, "f-g0", Verdict.DOWN, False),
        (1, "f-g1", Verdict.DOWN, False),
    ]


def test_a_group_finds_its_fleet_and_nothing_else_does():
    FleetState(name="f", groups=["f-g0", "f-g1"], model="m").save()
    assert fleet_of("f-g1") == load_fleet("f")
    assert fleet_of("f-g7") is None  # not one of its groups
    assert fleet_of("f") is None and fleet_of("other-g0") is None
    assert os.stat(load_fleet("f").directory.fleet_file).st_mode & 0o077 == 0


def test_clients_of_a_fleet_are_sent_to_its_router():
    FleetState(name="f", groups=["f-g0"], model="m", router=router_of(dead_identity())).save()
    assert fleet.front_door("f") == ("http://127.0.0.1:9", "m")
    FleetState(name="g", groups=["g-g0"], model="m").save()
    with pytest.raises(StateError, match="has no router yet"):
        fleet.front_door("g")


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


def test_a_rolling_upgrade_keeps_the_name_and_the_number_of_groups(tmp_path):
    FleetState(name="smollm2-replicas", groups=["smollm2-replicas-g0"], model="m").save()
    two = load_deployment("smollm2-replicas", as_root=True)
    with pytest.raises(SpecError, match="an upgrade changes what each group runs") as info:
        rolling_upgrade("smollm2-replicas", two)
    assert info.value.field == "replicas"
    FleetState(name="other", groups=["other-g0", "other-g1"], model="m").save()
    with pytest.raises(SpecError, match="not 'other'"):
        rolling_upgrade("other", two)


def test_a_rolling_upgrade_never_takes_out_the_last_group_that_serves():
    """The router of this fleet does not run and its other group has no state: the roll stops
    before the canary, and nothing was stopped (the canary's state is not even read)."""
    FleetState(
        name="smollm2-replicas",
        groups=["smollm2-replicas-g0", "smollm2-replicas-g1"],
        model="m",
        router=router_of(dead_identity()),
    ).save()
    two = load_deployment("smollm2-replicas", as_root=True)
    with pytest.raises(BackendError, match="would leave no group serving") as info:
        rolling_upgrade("smollm2-replicas", two)
    assert "no other group runs; the rolling upgrade stops before smollm2-replicas-g0" in str(
        info.value
    )


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
