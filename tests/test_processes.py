"""Process truth with real processes: what vLLM's renaming does to the marks, and stops.

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

from tandem import wire
from tandem.backends import processes
from tandem.backends.processes import RankOwner

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
        deployment="dep", rank=1, launch=launch, session=main.pid, started_after_s=time.time() - 60
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
    assert any("waiting for 1 process(es)" in n for n in notes)
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
