"""Gang supervision with a scripted backend and an injected clock (no processes started)."""

from __future__ import annotations

import pytest
from factories import make_deployment

from tandem import health, supervisor
from tandem.backends.base import ProcessFact, RankObservation
from tandem.backends.launch import new_state
from tandem.backends.state import DeploymentDir, RankState
from tandem.errors import RankFailed
from tandem.health import ApiFacts
from tandem.rankplan import plan_ranks
from tandem.supervisor import SupervisorPolicy, backoff_delay, supervise


class ScriptedBackend:
    """Ranks die when the script says so; ``up`` fails ``fail_ups`` times before working."""

    name = "scripted"

    def __init__(self, deaths: list[set[int]], fail_ups: int = 0) -> None:
        self.deaths = deaths  # per look: the ranks found dead
        self.fail_ups = fail_ups
        self.calls: list[str] = []

    def observe(self, state):
        dead = self.deaths.pop(0) if self.deaths else set()
        return {
            r.rank: RankObservation(
                rank=r.rank,
                processes=[]
                if r.rank in dead
                else [ProcessFact(pid=100 + r.rank, name="vllm", state="S")],
            )
            for r in state.ranks
        }

    def down(self, state, *, on_event):
        self.calls.append("down")

    def up(self, plan, deployment, *, timeout_s, on_phase, on_event):
        self.calls.append("up:" + ",".join(str(r.rank) for r in plan.in_start_order()))
        if self.fail_ups:
            self.fail_ups -= 1
            raise RankFailed("exited with status 1 during start-up", rank=1)
        state = saved_state()
        return state, None


def scripted_judge(answers: bool):
    """The real health model on the scripted backend's facts and a scripted leader API."""

    def judge(state, *, backend, tracker, canary_mode, canary_timeout_s, stall_s):
        api = ApiFacts(
            health_status=200 if answers else None,
            health_error=None if answers else "GET /health: ConnectError",
        )
        return health.judge(state, backend.observe(state), api, stall_s=stall_s)

    return judge


def saved_state():
    deployment = make_deployment()
    state = new_state(plan_ranks(deployment), deployment, backend="scripted")
    state.ranks = [
        RankState(
            rank=i,
            node=f"n{i}",
            role="leader" if i == 0 else "worker",
            address=f"192.168.1.{10 + i}",
            log="-",
        )
        for i in (0, 1)
    ]
    state.ready = True
    state.save()
    return state


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    return tmp_path


def run(
    backend,
    home,
    monkeypatch,
    *,
    looks: int,
    policy=SupervisorPolicy(interval_s=5, backoff_s=10, max_restarts=2),
    answers=True,
):
    monkeypatch.setattr(supervisor, "backend_for", lambda name: backend)
    saved_state()
    clock = Clock()
    budget = iter(range(looks))
    code = supervise(
        "test",
        policy,
        clock=clock,
        sleep=clock.sleep,
        judge=scripted_judge(answers),
        should_stop=lambda: next(budget, None) is None,
    )
    events = (home / "deployments" / "test" / "events.log").read_text()
    return code, clock, events


@pytest.mark.parametrize("attempt, delay", [(0, 10), (1, 20), (2, 40), (10, 300)])
def test_backoff_doubles_up_to_the_cap(attempt, delay):
    assert backoff_delay(SupervisorPolicy(backoff_s=10, max_backoff_s=300), attempt) == delay


def test_a_dead_worker_restarts_the_whole_group_workers_first(home, monkeypatch):
    backend = ScriptedBackend(deaths=[set(), {1}])
    code, clock, events = run(backend, home, monkeypatch, looks=4)
    assert code == 0
    assert backend.calls == ["down", "up:1,0"]
    assert "group broken: degraded: rank 1: no process of rank 1 is alive" in events
    assert "restart 1/2 in 10 s" in events and "restart 1 done" in events
    assert 10 in clock.sleeps


def test_a_silent_leader_counts_after_three_misses(home, monkeypatch):
    backend = ScriptedBackend(deaths=[])
    _code, _, events = run(backend, home, monkeypatch, looks=5, answers=False)
    assert backend.calls == ["down", "up:1,0"]
    assert events.count("group broken") == 1
    assert "down: rank 0: the leader does not answer /health" in events


def test_gives_up_after_max_restarts_and_stops_every_rank(home, monkeypatch):
    backend = ScriptedBackend(deaths=[{0}, {0, 1}, {0, 1}, {0, 1}], fail_ups=5)
    code, clock, events = run(backend, home, monkeypatch, looks=10)
    assert code == 1
    assert backend.calls == ["down", "up:1,0", "down", "up:1,0", "down"]
    assert "restart 1 failed" in events and "restart 2 failed" in events
    assert "giving up after 2 restart(s)" in events
    assert [s for s in clock.sleeps if s >= 10] == [10, 20]


def test_exits_when_the_deployment_is_taken_down(home, monkeypatch):
    monkeypatch.setattr(supervisor, "backend_for", lambda name: ScriptedBackend([]))
    code = supervise("absent", SupervisorPolicy(), sleep=lambda s: None, judge=scripted_judge(True))
    assert code == 0
    assert "was taken down" in (home / "deployments" / "absent" / "events.log").read_text()
    assert not (home / "deployments" / "absent" / "supervisor.pid").exists()


def test_archive_moves_the_current_rank_logs_into_the_next_restart_folder(home):
    """`rank10.log` sorts after `rank2.log`, and an earlier restart's folder is left alone."""
    directory = DeploymentDir.of("d")
    (directory.logs / "restart-1").mkdir(parents=True)
    for rank in (10, 2, 0):
        directory.rank_log(rank).write_text(f"rank {rank}\n")
    assert [p.name for p in directory.rank_logs()] == ["rank0.log", "rank2.log", "rank10.log"]
    folder = supervisor.archive_logs("d")
    assert folder == directory.logs / "restart-2"
    assert sorted(p.name for p in folder.iterdir()) == ["rank0.log", "rank10.log", "rank2.log"]
    assert directory.rank_logs() == [] and supervisor.archive_logs("d") is None
