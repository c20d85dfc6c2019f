"""The health model's judgement on recorded facts (pure: no process, no server)."""

from __future__ import annotations

import pytest
from factories import make_deployment

from tandem.backends.base import Look, ProcessFact, RankObservation
from tandem.backends.launch import new_state
from tandem.backends.state import ProcessRecord, RankState
from tandem.operations import health
from tandem.operations.health import ApiFacts, ProgressTracker, Verdict, error_signature
from tandem.rankplan import plan_ranks

LEADER = [
    ProcessRecord(pid=10, name="vllm"),
    ProcessRecord(pid=11, name="VLLM::EngineCore"),
    ProcessRecord(pid=12, name="VLLM::Worker_TP0"),
]
WORKER = [ProcessRecord(pid=20, name="vllm"), ProcessRecord(pid=21, name="VLLM::Worker_TP1")]
ANSWERS = ApiFacts(health_status=200, canary="ok")


def judge(state, seen: dict[int, RankObservation], api: ApiFacts, **kwargs):
    """``health.judge`` on what each rank's node showed."""
    return health.judge(state, Look(ranks=seen), api, **kwargs)


def state(ready: bool = True):
    deployment = make_deployment()
    s = new_state(plan_ranks(deployment), deployment, backend="local")
    s.ranks = [
        RankState(rank=0, node="n0", role="leader", address="a", pid=10, log="-", processes=LEADER),
        RankState(rank=1, node="n1", role="worker", address="b", pid=20, log="-", processes=WORKER),
    ]
    s.ready = ready
    return s


def seen(
    rank: int,
    records: list[ProcessRecord],
    *,
    drop: int | None = None,
    stop: int | None = None,
    log: list[str] | None = None,
) -> RankObservation:
    return RankObservation(
        rank=rank,
        log_since_ready=log or [],
        processes=[
            ProcessFact(pid=p.pid, name=p.name, state="T" if p.pid == stop else "S")
            for p in records
            if p.pid != drop
        ],
    )


def facts():
    return {0: seen(0, LEADER), 1: seen(1, WORKER)}


def test_all_alive_and_answering_is_healthy():
    report = judge(state(), facts(), ANSWERS)
    assert report.verdict is Verdict.HEALTHY and report.rank is None
    assert [r.health.state for r in report.ranks] == ["healthy", "healthy"]


@pytest.mark.parametrize(
    "rank, records, pid", [(1, WORKER, 20), (1, WORKER, 21), (0, LEADER, 11), (0, LEADER, 12)]
)
def test_a_lost_process_under_a_200_health_is_degraded_and_names_it(rank, records, pid):
    report = judge(
        state(), facts() | {rank: seen(rank, records, drop=pid)}, ApiFacts(health_status=200)
    )
    assert report.verdict is Verdict.DEGRADED and report.rank == rank
    name = next(p.name for p in records if p.pid == pid)
    assert f"{name} (pid {pid})" in report.reason and "gone" in report.reason


def test_a_dead_worker_rank_is_degraded_while_the_leader_answers():
    report = judge(state(), facts() | {1: RankObservation(rank=1)}, ApiFacts(health_status=200))
    assert report.verdict is Verdict.DEGRADED and report.rank == 1
    assert report.ranks[1].health.state == "dead"
    assert "VLLM::Worker_TP1 21" in report.evidence


def test_a_dead_leader_main_process_is_down():
    report = judge(
        state(),
        facts() | {0: RankObservation(rank=0)},
        ApiFacts(health_error="GET /health: ConnectError"),
    )
    assert report.verdict is Verdict.DOWN and report.rank == 0


def test_a_leader_that_does_not_answer_is_down_with_the_error_as_evidence():
    report = judge(state(), facts(), ApiFacts(health_error="GET /health: ReadTimeout"))
    assert report.verdict is Verdict.DOWN and report.rank == 0
    assert report.ranks[0].health.state == "not-answering"
    assert "ReadTimeout" in report.evidence


def test_a_stopped_worker_is_stalled_even_with_health_200():
    report = judge(state(), facts() | {1: seen(1, WORKER, stop=21)}, ApiFacts(health_status=200))
    assert report.verdict is Verdict.STALLED and report.rank == 1
    assert "VLLM::Worker_TP1 (pid 21) is stopped" in report.reason
    assert report.evidence == "/proc/21/stat state T"


def test_a_canary_past_its_deadline_is_stalled():
    api = ApiFacts(health_status=200, canary="timeout", canary_detail="no answer in 5 s")
    report = judge(state(), facts(), api)
    assert report.verdict is Verdict.STALLED and "1-token completion" in report.reason


def test_frozen_counters_under_load_are_stalled_only_after_the_stall_time():
    api = ApiFacts(health_status=200, requests_running=3, stalled_for_s=12)
    assert judge(state(), facts(), api, stall_s=30).verdict is Verdict.HEALTHY
    api.stalled_for_s = 31
    report = judge(state(), facts(), api, stall_s=30)
    assert report.verdict is Verdict.STALLED and "3 request(s) running" in report.reason


@pytest.mark.parametrize(
    "line, meaning",
    [
        (
            "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.",
            "the engine died",
        ),
        (
            "[rank1]:[E ProcessGroupNCCL.cpp:616] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran for 600000 milliseconds",
            "NCCL",
        ),
        ("RuntimeError: CUDA error: an illegal memory access was encountered", "CUDA"),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "out of memory"),
        ("[kernel] Out of memory: Killed process 4242 (VLLM::Worker_TP)", "out of memory"),
    ],
)
def test_error_signatures_in_a_rank_log_are_named_with_the_line(line, meaning):
    found = error_signature(["INFO all fine", line])
    assert found and meaning in found[0] and found[1] == line
    report = judge(state(), facts() | {1: seen(1, WORKER, log=[line])}, ANSWERS)
    assert report.verdict is Verdict.DEGRADED and report.rank == 1 and report.evidence == line


def test_ordinary_log_lines_are_no_error():
    assert (
        error_signature(
            [
                "INFO 12-01 Avg prompt throughput: 0.0 tokens/s",
                "WARNING max_num_batched_tokens is small",
            ]
        )
        is None
    )


def test_a_launch_whose_up_was_killed_is_named_not_starting_forever():
    killed = state(ready=False)
    killed.launcher_start_ticks = (killed.launcher_start_ticks or 0) + 1  # another process now
    report = judge(killed, facts(), ApiFacts())
    assert report.verdict is Verdict.DEGRADED
    assert f"pid {killed.launcher_pid}) is gone" in report.reason and "tandem up" in report.reason


def test_not_ready_with_processes_is_starting_and_with_a_dead_rank_down():
    assert judge(state(ready=False), facts(), ApiFacts()).verdict is Verdict.STARTING
    report = judge(state(ready=False), facts() | {1: RankObservation(rank=1)}, ApiFacts())
    assert report.verdict is Verdict.DOWN and report.rank == 1


def test_no_rank_running_is_down():
    report = judge(state(), {0: RankObservation(rank=0), 1: RankObservation(rank=1)}, ApiFacts())
    assert report.verdict is Verdict.DOWN and report.reason == "no rank is running"


def test_an_unreachable_node_degrades_with_the_ssh_error():
    report = judge(
        state(), facts() | {1: RankObservation(rank=1, unreachable="no route to host")}, ANSWERS
    )
    assert report.verdict is Verdict.DEGRADED and report.rank == 1
    assert report.evidence == "no route to host"


def test_the_progress_tracker_counts_still_time_only_under_load():
    now = [0.0]
    tracker = ProgressTracker(clock=lambda: now[0])
    assert tracker.update(running=2, tokens=100) is None
    now[0] = 10
    assert tracker.update(running=2, tokens=100) == 10
    now[0] = 15
    assert tracker.update(running=2, tokens=130) is None  # moved
    now[0] = 50
    assert tracker.update(running=0, tokens=130) is None  # idle is not stalled


def test_a_dead_leader_main_process_is_down_at_once_with_its_pid():
    # Its API server died with it, so /health fails; the process table says why, and the
    # supervisor (which waits several misses for a merely silent leader) acts on it at once.
    report = judge(
        state(),
        facts() | {0: seen(0, LEADER, drop=10)},
        ApiFacts(health_error="GET /health: ConnectError"),
    )
    assert report.verdict is Verdict.DOWN and report.rank == 0
    assert report.reason == (
        "vllm (pid 10) of rank 0 is gone, and the leader does not answer /health"
    )
    assert report.ranks[0].health.state == "broken"
    assert "ConnectError" in report.evidence


def test_each_verdict_owns_one_exit_code_apart_from_the_clis_own():
    from tandem.cli import ExitCode

    codes = [v.exit_code for v in Verdict]
    assert Verdict.HEALTHY.exit_code == 0 and len(set(codes)) == len(codes)
    assert not set(codes) - {0} & {int(c) for c in ExitCode}
    assert {v.colour for v in Verdict} >= {"green", "bold red"}
