"""Process truth with real processes: what vLLM's renaming does to the marks, and stops; and
ownership on made-up ``/proc`` records: a pid, a session or a boot that is not the launch's.

No engine: small Python processes that rename themselves with the same setproctitle library
vLLM uses, started the way the local backend starts a rank (own session, marks in env).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from factories import make_deployment

from tandem import wire
from tandem.backends import processes
from tandem.backends.launch import interrupted, new_state
from tandem.backends.local import owners
from tandem.backends.processes import RankOwner
from tandem.backends.state import RankState
from tandem.rankplan import plan_ranks

# Each script prints its child's pid (0: none) once every rename and signal disposition is in
# place: the child says so on its own stdout first, so no test sleeps in the hope it is done.
RENAMED_CHILD = """
import os, signal, subprocess, sys, time
import setproctitle
child = subprocess.Popen([sys.executable, "-c",
    "import setproctitle, time; setproctitle.setproctitle('VLLM::Worker_TP1'); print(flush=True);"
    " time.sleep(120)"], stdout=subprocess.PIPE)
child.stdout.readline()
setproctitle.setproctitle("vllm")
print(child.pid, flush=True)
time.sleep(120)
"""


def start_rank(tmp_path, *, launch="L1", noenv=True, script=RENAMED_CHILD, extra_env=None):
    env = {
        **os.environ,
        wire.TANDEM_DEPLOYMENT: "dep",
        wire.TANDEM_RANK: "1",
        wire.TANDEM_LAUNCH: launch,
        **(extra_env or {}),
    }
    env.pop(wire.SPT_NOENV, None)
    if noenv:
        env[wire.SPT_NOENV] = "1"
    main = subprocess.Popen(
        [sys.executable, "-c", script],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    child = int(main.stdout.readline())
    return main, child


def owner(main, launch="L1"):
    return RankOwner(
        deployment="dep",
        rank=1,
        launch=launch,
        boot=processes.boot_id(),
        session=main.pid,
        started_after_s=time.time() - 60,
    )


@pytest.fixture
def cleanup():
    started = []
    yield started
    for proc in started:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


def test_setproctitle_wipes_the_marks_unless_spt_noenv_is_set(tmp_path, cleanup):
    main, child = start_rank(tmp_path, noenv=False)
    cleanup.append(main)
    renamed = processes.read_process(child)
    assert renamed.name.startswith("VLLM::Worker")  # comm keeps 15 characters
    assert renamed.marks == {}  # what made `down` miss the engine and workers
    kept_main, kept_child = start_rank(tmp_path, noenv=True)
    cleanup.append(kept_main)
    assert processes.read_process(kept_child).marks[wire.TANDEM_LAUNCH] == "L1"


def test_a_renamed_child_is_found_by_its_session_after_the_main_process_died(tmp_path, cleanup):
    main, child = start_rank(tmp_path, noenv=False)
    cleanup.append(main)
    os.kill(main.pid, signal.SIGKILL)
    main.wait(timeout=10)
    found = processes.owned([owner(main)])[1]
    assert [p.pid for p in found] == [child]
    survivors = processes.stop(lambda: processes.owned([owner(main)])[1], groups=[main.pid])
    assert survivors == [] and not processes.is_alive(child)


def test_a_decoy_with_the_same_name_but_another_launch_is_not_touched(tmp_path, cleanup):
    mine, _ = start_rank(tmp_path, launch="L1")
    decoy = subprocess.Popen(
        ["sleep", "60"],
        start_new_session=True,
        env={
            **os.environ,
            wire.TANDEM_DEPLOYMENT: "dep",
            wire.TANDEM_RANK: "1",
            wire.TANDEM_LAUNCH: "other",
        },
    )
    cleanup += [mine, decoy]
    found = {p.pid for p in processes.owned([owner(mine)])[1]}
    assert mine.pid in found and decoy.pid not in found
    processes.stop(lambda: processes.owned([owner(mine)])[1], groups=[mine.pid])
    assert processes.is_alive(decoy.pid)
    assert decoy.pid in processes.marked_processes("dep")  # the test oracle sees every mark


IGNORES_TERM = """
import signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print(0, flush=True)
time.sleep(120)
"""


def fast_clock(factor: float):
    """A monotonic clock running FACTOR times as fast as the real one: ``stop`` then waits out
    its grace and its 5 s between progress notes in 1/FACTOR of the time, on real processes."""
    origin = time.monotonic()
    return lambda: origin + factor * (time.monotonic() - origin)


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace_with_progress(tmp_path, cleanup):
    main, _ = start_rank(tmp_path, script=IGNORES_TERM)
    cleanup.append(main)
    name = processes.read_process(main.pid).name
    notes: list[str] = []
    clock = fast_clock(4)  # 10 s of grace in 2.5 s; the note is due in the 1.25 s after 5 s
    started = clock()
    survivors = processes.stop(
        lambda: processes.owned([owner(main)])[1],
        groups=[main.pid],
        grace_s=10,
        on_progress=notes.append,
        clock=clock,
    )
    assert survivors == [] and clock() - started >= 10
    assert notes[0].startswith("SIGTERM to 1 process(es)") and "at most 10 s" in notes[0]
    assert any(f"{name} {main.pid} ignores SIGTERM: SIGKILL at the end" in n for n in notes)
    assert any("sending SIGKILL" in n for n in notes)


def test_only_the_resource_tracker_left_means_no_waiting(tmp_path, cleanup):
    # multiprocessing's resource tracker ignores SIGTERM; its cmdline names it.
    script = IGNORES_TERM.replace("import signal", "import signal  # resource_tracker")
    main = subprocess.Popen(
        [sys.executable, "-c", script + "\n# resource_tracker"],
        start_new_session=True,
        stdout=subprocess.PIPE,
        env={
            **os.environ,
            wire.TANDEM_DEPLOYMENT: "dep",
            wire.TANDEM_RANK: "1",
            wire.TANDEM_LAUNCH: "L1",
        },
    )
    cleanup.append(main)
    main.stdout.readline()
    started = time.monotonic()
    assert (
        processes.stop(lambda: processes.owned([owner(main)])[1], groups=[main.pid], grace_s=30)
        == []
    )
    assert time.monotonic() - started < 5


def test_a_stopped_process_is_continued_so_sigterm_ends_it(tmp_path, cleanup):
    main, child = start_rank(tmp_path)
    cleanup.append(main)
    os.kill(child, signal.SIGSTOP)
    time.sleep(0.2)
    assert processes.read_process(child).stopped
    started = time.monotonic()
    assert processes.stop(lambda: processes.owned([owner(main)])[1], groups=[main.pid]) == []
    assert time.monotonic() - started < 10


def test_hurry_skips_the_grace(tmp_path, cleanup):
    from tandem.interrupts import Hurry

    main, _ = start_rank(tmp_path, script=IGNORES_TERM)
    cleanup.append(main)
    started = time.monotonic()
    processes.stop(
        lambda: processes.owned([owner(main)])[1],
        groups=[main.pid],
        grace_s=30,
        hurry=Hurry(requested=True),
    )
    assert time.monotonic() - started < 5


ORPHAN_IGNORING_TERM = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True);"
    " time.sleep(120)"], stdout=subprocess.PIPE)
child.stdout.readline()
print(child.pid, flush=True)
time.sleep(120)
"""


def test_orphans_of_a_dead_main_process_get_only_the_short_grace(tmp_path, cleanup):
    # vLLM's worker whose main process was killed does not act on SIGTERM any more.
    main, child = start_rank(tmp_path, script=ORPHAN_IGNORING_TERM)
    cleanup.append(main)
    os.kill(main.pid, signal.SIGKILL)
    main.wait(timeout=10)
    started = time.monotonic()
    assert (
        processes.stop(
            lambda: processes.owned([owner(main)])[1],
            groups=[main.pid],
            grace_s=30,
            orphan_grace_s=0.5,
        )
        == []
    )
    assert time.monotonic() - started < 6.5 and not processes.is_alive(child)


WAITS_FOR_GONE_PEERS = """
import signal, sys, time
def shut_down(*_):
    time.sleep(120)  # a shutdown that waits for peers on other ranks, gone already
    sys.exit(0)
signal.signal(signal.SIGTERM, shut_down)
print(0, flush=True)
time.sleep(120)
"""


def test_a_process_stopped_before_the_stop_gets_only_the_short_grace(tmp_path, cleanup):
    # A hung rank (SIGSTOP): continued, its vLLM worker waited the whole 30 s for peers.
    main, _ = start_rank(tmp_path, script=WAITS_FOR_GONE_PEERS)
    cleanup.append(main)
    os.kill(main.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 5
    while not processes.read_process(main.pid).stopped and time.monotonic() < deadline:
        time.sleep(0.05)  # the signal is delivered asynchronously
    notes: list[str] = []
    clock = fast_clock(10)
    started = clock()
    survivors = processes.stop(
        lambda: processes.owned([owner(main)])[1],
        groups=[main.pid],
        grace_s=30,
        orphan_grace_s=5,
        on_progress=notes.append,
        clock=clock,
    )
    assert survivors == [] and 5 <= clock() - started < 30, notes
    killed_after = float(notes[-1].split(" after ")[1].split(" s")[0])
    assert notes[-1].startswith("sending SIGKILL to 1 process(es)") and 5 <= killed_after < 10


def test_the_same_shutdown_not_hung_gets_the_whole_grace(tmp_path, cleanup):
    main, _ = start_rank(tmp_path, script=WAITS_FOR_GONE_PEERS)
    cleanup.append(main)
    clock = fast_clock(8)
    started = clock()
    processes.stop(
        lambda: processes.owned([owner(main)])[1],
        groups=[main.pid],
        grace_s=8,
        orphan_grace_s=0.5,
        clock=clock,
    )
    assert clock() - started >= 8  # it is running its own shutdown: no reason to cut it


# --- ownership: never a pid alone -----------------------------------------------------------

RANK_STARTED_S = 1_000_000.0


def record(pid=4242, sid=4242, marks=None, name="vllm", ppid=1, state="S") -> processes.Process:
    """A process as ``/proc`` would show it (nothing is read: the ids are whatever we say)."""
    return processes.Process(
        pid=pid,
        name=name,
        state=state,
        ppid=ppid,
        pgid=sid,
        sid=sid,
        start_ticks=0,
        rss_bytes=0,
        cpu_s=0.0,
        marks=marks or {},
    )


def judged(owner: RankOwner, process, *, boot="boot-a", booted_at_s=0.0, started_s=None):
    return owner.owns(
        process,
        this_boot=lambda: boot,
        booted_at_s=lambda: booted_at_s,
        started=lambda p: RANK_STARTED_S + 5 if started_s is None else started_s,
        netns_of=lambda pid: None,
    )


def rank_owner(**overrides) -> RankOwner:
    fields = {
        "deployment": "dep",
        "rank": 1,
        "launch": "L1",
        "boot": "boot-a",
        "session": 4242,
        "started_after_s": RANK_STARTED_S,
    }
    return RankOwner(**(fields | overrides))


MARKS = {wire.TANDEM_DEPLOYMENT: "dep", wire.TANDEM_RANK: "1", wire.TANDEM_LAUNCH: "L1"}


def test_a_reused_pid_and_session_of_another_boot_is_not_owned():
    # After a reboot the rank's recorded session id is some other process's pid and session.
    unmarked = record()
    assert judged(rank_owner(), unmarked, boot="boot-a")  # the launch's boot: its session
    assert not judged(rank_owner(), unmarked, boot="boot-b")
    assert not judged(rank_owner(), record(marks=MARKS), boot="boot-b")
    assert not judged(rank_owner(), unmarked, boot=None)  # a boot that cannot be told apart


def test_a_state_without_boot_id_owns_nothing_when_the_machine_booted_after_its_launch():
    legacy = rank_owner(boot=None)
    assert judged(legacy, record(), boot="boot-b", booted_at_s=RANK_STARTED_S - 3600)
    assert not judged(legacy, record(), boot="boot-b", booted_at_s=RANK_STARTED_S + 60)
    assert not judged(rank_owner(boot=None, started_after_s=None), record(), boot="boot-b")


def test_a_session_id_alone_is_never_enough():
    assert not judged(rank_owner(started_after_s=None), record())  # no start to compare with
    assert not judged(rank_owner(), record(), started_s=RANK_STARTED_S - 10)  # older than the rank
    assert not judged(rank_owner(), record(sid=777))


def test_marks_need_the_launch_id_or_without_one_a_start_after_the_rank():
    assert judged(rank_owner(), record(marks=MARKS))
    assert not judged(rank_owner(), record(marks=MARKS | {wire.TANDEM_LAUNCH: "L0"}))
    no_launch = rank_owner(launch=None)
    assert judged(no_launch, record(sid=1, marks=MARKS))
    assert not judged(no_launch, record(sid=1, marks=MARKS), started_s=RANK_STARTED_S - 10)


def test_the_state_records_the_boot_and_every_owner_carries_it(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    deployment = make_deployment()
    state = new_state(plan_ranks(deployment), deployment, backend="local")
    assert state.boot_id == processes.boot_id() and state.boot_id
    state.ranks = [RankState(rank=0, node="n0", role="leader", address="a", pid=4242, log="-")]
    assert [o.boot for o in owners(state)] == [state.boot_id]


def test_a_launcher_pid_alive_on_another_boot_is_an_interrupted_launch(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    deployment = make_deployment()
    state = new_state(plan_ranks(deployment), deployment, backend="local")
    assert not interrupted(state)  # its launcher (this test) runs
    state.boot_id = "another-boot"  # the same pid and start ticks, recorded before a reboot
    assert interrupted(state)
    state.boot_id, state.launcher_start_ticks = processes.boot_id(), 1
    assert interrupted(state)


def test_a_process_identity_is_found_only_while_that_very_process_runs(cleanup):
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    cleanup.append(sleeper)
    me = processes.ProcessIdentity.of(processes.read_process(sleeper.pid))
    assert processes.ProcessIdentity.parse(me.text()) == me
    assert me.find() is not None
    assert processes.ProcessIdentity(me.pid, me.start_ticks + 1, me.boot).find() is None
    assert processes.ProcessIdentity(me.pid, me.start_ticks, "another-boot").find() is None
    assert processes.ProcessIdentity.parse(str(me.pid)) is None  # a bare pid is no identity


def test_the_stop_note_says_what_each_process_waits_for():
    main = record(pid=100, sid=100, name="vllm")
    engine = record(pid=101, sid=100, ppid=100, name="VLLM::EngineCore")
    worker = record(pid=102, sid=100, ppid=101, name="VLLM::Worker_TP0")
    stuck = record(pid=103, sid=100, ppid=100, name="VLLM::Worker_TP1", state="D")
    note = processes.waiting_note(
        [main, engine, worker, stuck], 5.2, 30, sigterm_ignored=lambda pid: False
    )
    assert note.startswith("4 process(es) still shutting down, 5 s after SIGTERM (SIGKILL at 30 s")
    assert "vllm 100 waits for its child(ren) VLLM::EngineCore 101, VLLM::Worker_TP1 103" in note
    assert "VLLM::EngineCore 101 waits for its child(ren) VLLM::Worker_TP0 102 to exit" in note
    assert "VLLM::Worker_TP0 102 is running its own shutdown" in note
    assert "VLLM::Worker_TP1 103 is in uninterruptible disk or device I/O" in note
    assert "ignores SIGTERM" in processes.waits_for(
        worker, [worker], sigterm_ignored=lambda p: True
    )


def test_a_process_sigkill_does_not_end_at_once_is_waited_for_and_named():
    """A process inside a system call the kernel does not interrupt outlives SIGKILL until the
    call returns (seen: a vLLM start in ``sched_setaffinity``, alive 30 s after SIGKILL). The
    stop waits for it, saying so, instead of reporting it gone or leaving it to the next
    start. Its pid is above any pid_max, so the signals reach nothing here."""
    stuck = record(pid=4_194_400, sid=4_194_400, state="R")
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    said: list[str] = []
    survivors = processes.stop(
        lambda: [stuck] if now[0] < 25 else [],
        groups=[],
        on_progress=said.append,
        clock=lambda: now[0],
        sleep=sleep,
    )
    assert survivors == []
    waits = [s for s in said if "after SIGKILL" in s]
    assert len(waits) == 2 and "inside the kernel" in waits[0], said
    assert "vllm 4194400 (state R)" in waits[0]

    now[0] = 0.0
    survivors = processes.stop(
        lambda: [stuck] if now[0] < 25 else [],
        groups=[],
        kill_wait_s=5,
        clock=lambda: now[0],
        sleep=sleep,
    )
    assert survivors == [stuck]  # reported as left behind, never as stopped
