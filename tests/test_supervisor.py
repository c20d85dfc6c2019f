"""Gang supervision with a scripted backend and an injected clock (no processes started)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
from factories import make_deployment

from tandem.backends.base import Look, ProcessFact, RankObservation
from tandem.backends.launch import new_state
from tandem.backends.processes import ProcessIdentity, read_process
from tandem.backends.state import DeploymentDir, ProcessRecord, RankState
from tandem.errors import RankFailed
from tandem.interrupts import Interrupted
from tandem.operations import health, supervisor
from tandem.operations.health import ApiFacts
from tandem.operations.supervisor import (
    BACKOFF_RESET_S,
    SupervisorPolicy,
    backoff_delay,
    stop_supervisors,
    supervise,
)
from tandem.rankplan import plan_ranks


class ScriptedBackend:
    """Ranks die when the script says so; ``up`` fails ``fail_ups`` times before working."""

    name = "scripted"

    def __init__(
        self,
        deaths: list[set[int]],
        fail_ups: int = 0,
        mains_gone: list[set[int]] | None = None,
        up_raises: BaseException | None = None,
    ) -> None:
        self.deaths = deaths  # per look: the ranks found dead
        self.mains_gone = mains_gone or []  # per look: the ranks whose main process is gone
        self.fail_ups = fail_ups
        self.up_raises = up_raises
        self.calls: list[str] = []

    def observe(self, state, *, nodes=False):
        dead = self.deaths.pop(0) if self.deaths else set()
        mains_gone = self.mains_gone.pop(0) if self.mains_gone else set()
        ranks = {
            r.rank: RankObservation(
                rank=r.rank,
                processes=[]
                if r.rank in dead
                else [
                    ProcessFact(pid=p.pid, name=p.name, state="S")
                    for p in r.processes
                    if not (r.rank in mains_gone and p.pid == r.pid)
                ],
            )
            for r in state.ranks
        }
        return Look(ranks=ranks)

    def down(self, state, *, on_event):
        self.calls.append("down")

    def up(self, plan, deployment, *, timeout_s, on_phase, on_event, place=None):
        self.calls.append("up:" + ",".join(str(r.rank) for r in plan.in_start_order()))
        if self.up_raises:
            raise self.up_raises
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
            pid=100 + 10 * i,
            processes=[
                ProcessRecord(pid=100 + 10 * i, name="vllm"),
                ProcessRecord(pid=101 + 10 * i, name="VLLM::EngineCore"),
            ],
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
    folder = supervisor.archive_logs(directory)
    assert folder == directory.logs / "restart-2"
    assert sorted(p.name for p in folder.iterdir()) == ["rank0.log", "rank10.log", "rank2.log"]
    assert directory.rank_logs() == [] and supervisor.archive_logs(directory) is None


def test_a_dead_leader_main_process_restarts_at_once_with_its_pid(home, monkeypatch):
    # Its API server is gone, so /health fails too; the process table already says why.
    backend = ScriptedBackend(deaths=[], mains_gone=[{0}])
    _code, clock, events = run(backend, home, monkeypatch, looks=2, answers=False)
    assert backend.calls == ["down", "up:1,0"]
    broken = next(line for line in events.splitlines() if "group broken" in line)
    assert "down: rank 0: vllm (pid 100) of rank 0 is gone" in broken
    assert clock.sleeps[0] == 10  # the back-off at the first look, not an interval per miss


def test_the_backoff_starts_over_after_a_healthy_period(home, monkeypatch):
    healthy_looks = int(BACKOFF_RESET_S / 5) + 1
    backend = ScriptedBackend(deaths=[{1}, *[set()] * healthy_looks, {1}, {1}])
    _code, clock, events = run(
        backend,
        home,
        monkeypatch,
        looks=healthy_looks + 7,
        policy=SupervisorPolicy(interval_s=5, backoff_s=10, max_restarts=5),
    )
    # unrelated faults minutes apart wait the first back-off each; a crash loop still doubles
    assert [s for s in clock.sleeps if s >= 10] == [10, 10, 20]
    assert f"healthy for {BACKOFF_RESET_S:g} s: the next restart waits 10 s again" in events


def test_a_fault_soon_after_a_restart_doubles_the_backoff(home, monkeypatch):
    backend = ScriptedBackend(deaths=[{1}, set(), set(), {1}])
    _code, clock, _events = run(backend, home, monkeypatch, looks=5)
    assert [s for s in clock.sleeps if s >= 10] == [10, 20]


@pytest.mark.parametrize(
    "cause, said",
    [
        (KeyboardInterrupt(), "interrupted by Ctrl-C (SIGINT)"),
        (Interrupted(signal.SIGTERM), "interrupted by SIGTERM"),
    ],
)
def test_the_supervisor_writes_why_it_stopped(home, monkeypatch, cause, said):
    backend = ScriptedBackend(deaths=[{1}], up_raises=cause)
    with pytest.raises(type(cause)):
        run(backend, home, monkeypatch, looks=3)
    events = (home / "deployments" / "test" / "events.log").read_text()
    assert events.splitlines()[-1].endswith(f"the supervisor stops: {said}")
    assert not DeploymentDir.of("test").supervisor_pid().exists()


def test_a_supervisor_asked_to_stop_says_so(home, monkeypatch):
    _code, _, events = run(ScriptedBackend(deaths=[]), home, monkeypatch, looks=1)
    assert events.splitlines()[-1].endswith("the supervisor stops: asked to")


# --- supervisor.pid: only the supervisor itself is ever signalled -----------------------------


@pytest.fixture
def spawned():
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait(timeout=10)


def sleeper(spawned, *argv: str) -> subprocess.Popen:
    """A live process that is no supervisor; its extra ``argv`` shows in its command line."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; print(flush=True); time.sleep(60)", *argv],
        stdout=subprocess.PIPE,
    )
    proc.stdout.readline()
    spawned.append(proc)
    return proc


def stop(name: str) -> tuple[bool, list[str]]:
    said: list[str] = []
    return stop_supervisors(name, timeout_s=10, on_event=said.append), said


def test_a_stale_bare_pid_of_an_unrelated_tandem_process_is_not_signalled(home, spawned):
    # An older tandem wrote a bare pid; the supervisor died, and the pid now names a process
    # whose command line merely holds "tandem" (what the old check looked for).
    decoy = sleeper(spawned, "tandem")
    pid_file = DeploymentDir.of("test").supervisor_pid()
    pid_file.parent.mkdir(parents=True)
    pid_file.write_text(f"{decoy.pid}\n")
    stopped, said = stop("test")
    assert not stopped and decoy.poll() is None
    assert any(f"names pid {decoy.pid}" in line and "not signalled" in line for line in said)
    assert not pid_file.exists()


@pytest.mark.parametrize("change", ["start", "boot"])
def test_a_pid_file_whose_process_is_gone_is_stale_whoever_has_the_pid(home, spawned, change):
    decoy = sleeper(spawned)
    real = ProcessIdentity.of(read_process(decoy.pid))
    recorded = ProcessIdentity(
        real.pid,
        real.start_ticks + (1 if change == "start" else 0),
        "another-boot" if change == "boot" else real.boot,
    )
    pid_file = DeploymentDir.of("test").supervisor_pid()
    pid_file.parent.mkdir(parents=True)
    pid_file.write_text(recorded.text())
    assert stop("test")[0] is False and decoy.poll() is None


def test_the_supervisor_named_by_its_identity_is_stopped_and_the_log_says_by_whom(home, spawned):
    pid_file = DeploymentDir.of("test").supervisor_pid()
    pid_file.parent.mkdir(parents=True)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from tandem.backends.processes import ProcessIdentity\n"
            "open(sys.argv[1], 'w').write(ProcessIdentity.current().text())\n"
            "print(flush=True)\n"
            "time.sleep(60)\n",
            str(pid_file),
        ],
        stdout=subprocess.PIPE,
    )
    spawned.append(proc)
    proc.stdout.readline()
    stopped, _ = stop("test")
    assert stopped and proc.wait(timeout=10) == -signal.SIGTERM
    events = (home / "deployments" / "test" / "events.log").read_text()
    assert f"stops the supervisor (pid {proc.pid})" in events


def test_a_bare_pid_file_of_an_older_tandem_still_stops_its_supervisor(home, spawned):
    supervising = sleeper(spawned, "supervise")  # started before it wrote the file
    pid_file = DeploymentDir.of("test").supervisor_pid()
    pid_file.parent.mkdir(parents=True)
    pid_file.write_text(str(supervising.pid))
    assert stop("test")[0] and supervising.wait(timeout=10) == -signal.SIGTERM
