"""Finding and stopping the processes of a deployment on this machine, whatever vLLM renames.

A rank is started as the leader of its own session and process group, with three marks in its
environment: ``TANDEM_DEPLOYMENT``, ``TANDEM_RANK`` and ``TANDEM_LAUNCH`` (a random id per
``up``, kept in the state). vLLM renames its engine and worker processes with setproctitle,
which by default overwrites the memory that ``/proc/PID/environ`` shows, so the marks of
``VLLM::EngineCore`` and ``VLLM::Worker_TP0`` would vanish; ``SPT_NOENV=1`` in every rank's
environment keeps them. A process also still belongs to its rank when its environment cannot be
read: it is in the session the rank's first process led (the session id survives that process's
death, unlike its pid) and started after the rank. Within a network namespace that ``up`` made,
every process is the deployment's by construction (``tandem.backends.netns``).

So ``down`` finds every process of a rank even when the rank's main process is already dead, and
touches nothing it does not own: a process with the same deployment name from another
``TANDEM_HOME``, another launch or another user lacks the launch id.

A pid is never enough. Pids and sessions are reused, and after a reboot every one of them
belongs to someone else, so the state records the machine's boot id
(``/proc/sys/kernel/random/boot_id``) at launch and nothing of another boot is ever owned. A
single process tandem must find again later (the supervisor, the ``up`` that launched) is
recorded as a ``ProcessIdentity``: its pid, its start time and the boot.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from tandem import wire
from tandem.interrupts import Hurry

_PROC = Path("/proc")
_TICKS = os.sysconf("SC_CLK_TCK")
_BOOT_ID = _PROC / "sys" / "kernel" / "random" / "boot_id"


@dataclass(frozen=True)
class Process:
    """One process as ``/proc`` shows it now."""

    pid: int
    name: str
    state: str
    """One letter: R running, S sleeping, D disk wait, T stopped, Z zombie, ..."""
    ppid: int
    pgid: int
    sid: int
    start_ticks: int
    """Start time in clock ticks after boot (tells a reused pid apart)."""
    rss_bytes: int
    cpu_s: float
    marks: dict[str, str]
    """``TANDEM_*`` variables of its environment ({} when unreadable)."""
    cmdline: str = ""

    @property
    def alive(self) -> bool:
        return self.state not in ("Z", "X")

    @property
    def stopped(self) -> bool:
        """Stopped by a signal (SIGSTOP, SIGTSTP) or a tracer: it runs no code."""
        return self.state in ("T", "t")

    @property
    def ignores_term(self) -> bool:
        """multiprocessing's resource tracker ignores SIGTERM by design; waiting for it is waste."""
        return "resource_tracker" in self.cmdline


def read_process(pid: int) -> Process | None:
    """The process ``pid`` now, or None if it is gone."""
    base = _PROC / str(pid)
    try:
        stat = (base / "stat").read_text()
    except OSError:
        return None
    name = stat[stat.index("(") + 1 : stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2 :].split()
    try:
        environ = (base / "environ").read_bytes().split(b"\0")
    except OSError:
        environ = []
    marks = {}
    for item in environ:
        if item.startswith(b"TANDEM_"):
            key, _, value = item.decode(errors="replace").partition("=")
            marks[key] = value
    try:
        cmdline = (
            (base / "cmdline")
            .read_bytes()[:300]
            .replace(b"\0", b" ")
            .decode(errors="replace")
            .strip()
        )
    except OSError:
        cmdline = ""
    page = os.sysconf("SC_PAGE_SIZE")
    return Process(
        pid=pid,
        name=name,
        state=fields[0],
        ppid=int(fields[1]),
        pgid=int(fields[2]),
        sid=int(fields[3]),
        start_ticks=int(fields[19]),
        rss_bytes=int(fields[21]) * page,
        cpu_s=(int(fields[11]) + int(fields[12])) / _TICKS,
        marks=marks,
        cmdline=cmdline,
    )


def all_processes() -> list[Process]:
    found = []
    for entry in _PROC.iterdir():
        if entry.name.isdigit() and (process := read_process(int(entry.name))):
            found.append(process)
    return found


@functools.cache
def boot_time_s() -> float:
    """The machine's boot time, seconds since the epoch (to turn start ticks into times)."""
    for line in (_PROC / "stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return 0.0


def started_at_s(process: Process) -> float:
    return boot_time_s() + process.start_ticks / _TICKS


@functools.cache
def boot_id() -> str | None:
    """This boot's random id (a new one at every boot), None where the kernel hides it."""
    try:
        return _BOOT_ID.read_text().strip() or None
    except OSError:
        return None


@dataclass(frozen=True)
class ProcessIdentity:
    """One process for good: a pid is reused, its pid with its start time on one boot is not.

    Usage:
        me = ProcessIdentity.current(); ...; me.find()  # None once that process is gone
    """

    pid: int
    start_ticks: int
    """Clock ticks after boot; two processes of one boot never share pid and start."""
    boot: str | None
    """The boot id; None where it was not recorded (then pid and start time must do)."""

    @classmethod
    def of(cls, process: Process) -> ProcessIdentity:
        return cls(pid=process.pid, start_ticks=process.start_ticks, boot=boot_id())

    @classmethod
    def current(cls) -> ProcessIdentity:
        """This process."""
        me = read_process(os.getpid())
        return cls(pid=os.getpid(), start_ticks=me.start_ticks if me else 0, boot=boot_id())

    def text(self) -> str:
        """``PID START_TICKS BOOT_ID``, one line, as a pid file holds it."""
        return f"{self.pid} {self.start_ticks} {self.boot or '-'}"

    @classmethod
    def parse(cls, text: str) -> ProcessIdentity | None:
        """The identity ``text`` holds, None if it is no such line (a bare pid is none)."""
        words = text.split()
        if len(words) != 3 or not (words[0].isdigit() and words[1].isdigit()):
            return None
        return cls(int(words[0]), int(words[1]), None if words[2] == "-" else words[2])

    def find(
        self,
        *,
        read: Callable[[int], Process | None] = read_process,
        this_boot: Callable[[], str | None] = boot_id,
    ) -> Process | None:
        """The process while it still runs; None once it is gone, whoever has its pid now."""
        if self.boot is not None and self.boot != this_boot():
            return None
        process = read(self.pid)
        if process is None or not process.alive or process.start_ticks != self.start_ticks:
            return None
        return process


def netns_inode(pid: int) -> str | None:
    """The network namespace a process is in (``net:[4026532250]``), None if unreadable."""
    try:
        return os.readlink(_PROC / str(pid) / "ns" / "net")
    except OSError:
        return None


@dataclass(frozen=True)
class RankOwner:
    """What tells the processes of one launched rank apart from every other process.

    Nothing of another boot is owned: the rank's processes died with it, and its pids and its
    session id now name others. On the launch's boot a process is the rank's when it carries the
    rank's marks and the launch id, or, with no marks readable, when it is in the rank's session,
    started after the rank and (netns) runs in the rank's namespace. A state written before
    launch ids existed owns marked processes only when they started after the rank; one written
    before boot ids existed counts as this boot's only when the rank started after this boot.
    """

    deployment: str
    rank: int
    launch: str | None
    """The launch id of its ``up``; None for a state written before launch ids existed."""
    boot: str | None = None
    """The boot id at launch; None for a state written before boot ids were recorded."""
    session: int | None = None
    """The pid of the rank's first process, which led its session."""
    started_after_s: float | None = None
    netns: str | None = None
    """Inode of the rank's namespace when it runs in one that ``up`` made."""

    def on_this_boot(
        self,
        *,
        this_boot: Callable[[], str | None] = boot_id,
        booted_at_s: Callable[[], float] = boot_time_s,
    ) -> bool:
        """The rank was launched since this machine last booted."""
        if self.boot is not None:
            return self.boot == this_boot()
        return self.started_after_s is not None and self.started_after_s >= booted_at_s()

    def owns(
        self,
        process: Process,
        *,
        netns_of: Callable[[int], str | None] = netns_inode,
        started: Callable[[Process], float] = started_at_s,
        this_boot: Callable[[], str | None] = boot_id,
        booted_at_s: Callable[[], float] = boot_time_s,
    ) -> bool:
        if not self.on_this_boot(this_boot=this_boot, booted_at_s=booted_at_s):
            return False
        started_after = self.started_after_s is not None and (
            started(process) >= self.started_after_s - 1
        )
        marks = process.marks
        if marks.get(wire.TANDEM_DEPLOYMENT) == self.deployment and (
            marks.get(wire.TANDEM_RANK) == str(self.rank)
        ):
            if self.launch is None:
                return started_after
            return marks.get(wire.TANDEM_LAUNCH) == self.launch
        if marks or self.session is None or process.sid != self.session or not started_after:
            return False  # marked for something else, or nothing but a session id to go by
        return self.netns is None or netns_of(process.pid) == self.netns


def owned(
    owners: Iterable[RankOwner],
    processes: Iterable[Process] | None = None,
) -> dict[int, list[Process]]:
    """Rank -> its live processes, for every owner."""
    owners = list(owners)
    found: dict[int, list[Process]] = {o.rank: [] for o in owners}
    for process in all_processes() if processes is None else processes:
        if not process.alive:
            continue
        for owner in owners:
            if owner.owns(process):
                found[owner.rank].append(process)
                break
    return found


def marked_processes(deployment: str) -> dict[int, int | None]:
    """Every live process carrying ``TANDEM_DEPLOYMENT=deployment``: pid -> its TANDEM_RANK.

    Any launch, any state folder: what a test asserts is gone after ``down``.
    """
    found = {}
    for p in all_processes():
        if p.alive and p.marks.get(wire.TANDEM_DEPLOYMENT) == deployment:
            rank = p.marks.get(wire.TANDEM_RANK, "")
            found[p.pid] = int(rank) if rank.isdigit() else None
    return found


def is_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    process = read_process(pid)
    return process is not None and process.alive


def _orphans_or_hung(left: list[Process], hung: set[int]) -> bool:
    """Only processes that cannot shut down in order are left (or the resource tracker).

    An orphan's parent is outside the set and it leads no session: nothing above it will shut
    it down in order. A hung one was stopped (a SIGSTOP, a debugger) when the stop began:
    continued, it wakes into a shutdown whose peers on the other ranks have already gone, and
    waits for them (seen: a vLLM worker of a stopped rank waited the whole 30 s). Waiting the
    whole grace for either is waste.
    """
    pids = {p.pid for p in left}
    return all(
        p.ignores_term or p.pid in hung or (p.ppid not in pids and p.pid != p.sid) for p in left
    )


def stop(
    find: Callable[[], list[Process]],
    *,
    groups: Iterable[int] = (),
    grace_s: float = 30.0,
    orphan_grace_s: float = 5.0,
    kill_wait_s: float = 90.0,
    on_progress: Callable[[str], None] = lambda text: None,
    hurry: Hurry | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[Process]:
    """Stop the processes ``find`` returns: SIGTERM, wait on evidence, SIGKILL; return survivors.

    ``groups`` are the ranks' process groups, signalled as a whole even when their leader is
    dead. Stopped processes are continued so they can act on SIGTERM. The wait ends as soon as
    only processes that ignore SIGTERM are left (multiprocessing's resource tracker), after
    ``orphan_grace_s`` when only orphans of a dead main process (a vLLM worker whose parent
    was killed does not act on SIGTERM) or processes that were stopped when the stop began
    are left, after ``grace_s``, or when ``hurry`` is requested. It says what it does, so a
    clean shutdown of a few seconds does not read like a hang: what got SIGTERM and for how
    long, then every 5 s what each process still waits for.

    A process that SIGKILL does not end at once is inside a system call the kernel does not
    interrupt; it ends when the call returns. Seen: a vLLM start sitting for minutes in
    ``sched_setaffinity`` on a busy machine, alive 30 s after SIGKILL. Up to ``kill_wait_s`` is
    given to it, so that what comes next (a rollback's start on the same ports) does not find
    it still there.
    """
    hurry = hurry or Hurry()
    targets = find()
    if not targets:
        return []
    on_progress(
        f"SIGTERM to {len(targets)} process(es) ({_named(targets)}): waiting for them to shut "
        f"down, at most {grace_s:g} s, then SIGKILL (Ctrl-C: SIGKILL now)"
    )
    # A group is signalled only while one of its members is ours: a pgid whose members are all
    # gone may be reused by an unrelated process.
    groups = sorted({p.pgid for p in targets} & set(groups))
    hung = {p.pid for p in targets if p.stopped}
    for sig in (signal.SIGTERM, signal.SIGCONT):
        send(sig, [p.pid for p in targets], groups=groups)
    started = clock()
    next_note = started + 5
    while not hurry.requested and clock() - started < grace_s:
        left = _still_running(targets)  # the known pids only: a whole /proc scan at 5 Hz is waste
        if all(p.ignores_term for p in left) or (
            _orphans_or_hung(left, hung) and clock() - started >= orphan_grace_s
        ):
            break
        if clock() >= next_note:
            on_progress(waiting_note(left, clock() - started, grace_s))
            next_note += 5
        sleep(0.2)
    left = find()
    if left:
        if not all(p.ignores_term for p in left):
            on_progress(
                f"sending SIGKILL to {len(left)} process(es) after "
                f"{clock() - started:.1f} s: {_named(left)}"
            )
        send(signal.SIGKILL, [p.pid for p in left], groups=groups)
    killed = clock()
    next_note = killed + 10
    while clock() - killed < kill_wait_s and (left := find()):
        if clock() >= next_note:
            on_progress(
                f"{len(left)} process(es) still there {clock() - killed:.0f} s after SIGKILL, "
                f"inside the kernel (a system call it does not interrupt), waiting at most "
                f"{kill_wait_s:g} s: "
                + ", ".join(f"{p.name} {p.pid} (state {p.state})" for p in left[:6])
            )
            next_note += 10
        sleep(0.1)
    return left


def _named(processes: list[Process], most: int = 6) -> str:
    more = len(processes) - most
    return ", ".join(f"{p.name} {p.pid}" for p in processes[:most]) + (
        f" and {more} more" if more > 0 else ""
    )


def ignores_sigterm(pid: int) -> bool:
    """SIGTERM is ignored by the process (``SigIgn`` of ``/proc/PID/status``): only SIGKILL ends
    it."""
    try:
        for line in (_PROC / str(pid) / "status").read_text().splitlines():
            if line.startswith("SigIgn:"):
                return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def waits_for(
    process: Process,
    left: list[Process],
    *,
    sigterm_ignored: Callable[[int], bool] = ignores_sigterm,
) -> str:
    """What ``process``, sent SIGTERM, still waits for before it exits (from ``/proc``)."""
    children = [p for p in left if p.ppid == process.pid]
    if process.ignores_term:
        return "ignores SIGTERM by design (multiprocessing's resource tracker): killed at the end"
    if sigterm_ignored(process.pid):
        return "ignores SIGTERM: SIGKILL at the end of the grace"
    if process.stopped:
        return "is stopped by a signal or a tracer"
    if children:
        return f"waits for its child(ren) {_named(children, 3)} to exit"
    if process.state == "D":
        return "is in uninterruptible disk or device I/O"
    return "is running its own shutdown"


def waiting_note(
    left: list[Process],
    elapsed_s: float,
    grace_s: float,
    *,
    sigterm_ignored: Callable[[int], bool] = ignores_sigterm,
) -> str:
    """The progress line of a stop: how long it has waited, and for what, process by process."""
    shown = "; ".join(
        f"{p.name} {p.pid} {waits_for(p, left, sigterm_ignored=sigterm_ignored)}" for p in left[:6]
    )
    more = f"; and {len(left) - 6} more" if len(left) > 6 else ""
    return (
        f"{len(left)} process(es) still shutting down, {elapsed_s:.0f} s after SIGTERM "
        f"(SIGKILL at {grace_s:g} s, or now on Ctrl-C): {shown}{more}"
    )


def _still_running(processes: list[Process]) -> list[Process]:
    """Those of ``processes`` still alive as the same process (a reused pid is another one)."""
    return [now for p in processes if (now := ProcessIdentity.of(p).find())]


def send(sig: signal.Signals, pids: Iterable[int], *, groups: Iterable[int] = ()) -> None:
    """``sig`` to each process group, then to each pid; one gone already, or not ours, is passed
    over."""
    for kill, targets in ((os.killpg, groups), (os.kill, pids)):
        for target in targets:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(target, sig)
