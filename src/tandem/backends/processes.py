"""Finding and stopping the processes of a deployment on this machine.

Every rank is started as the leader of its own process group and with ``TANDEM_DEPLOYMENT`` in
its environment, which its children inherit. So a deployment's processes are found by that
mark in ``/proc/PID/environ`` even when vLLM's workers leave the group or the recorded PID was
reused by an unrelated process — nothing of a deployment outlives ``down``.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from tandem import wire

_PROC = Path("/proc")


def marked_processes(deployment: str) -> dict[int, int | None]:
    """Live processes carrying ``TANDEM_DEPLOYMENT=deployment``: pid -> their TANDEM_RANK."""
    wanted = f"{wire.TANDEM_DEPLOYMENT}={deployment}".encode()
    found: dict[int, int | None] = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if wanted in environ and is_alive(int(entry.name)):
            rank = next((v.split(b"=", 1)[1] for v in environ
                         if v.startswith(wire.TANDEM_RANK.encode() + b"=")), None)
            found[int(entry.name)] = int(rank) if rank and rank.isdigit() else None
    return found


def is_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def stop(deployment: str, group_leaders: list[int], *, grace_s: float = 30.0,
         clock: Callable[[], float] = time.monotonic,
         sleep: Callable[[float], None] = time.sleep) -> list[int]:
    """Stop a deployment's processes: SIGTERM to each group, then SIGKILL after ``grace_s``.

    Only groups whose leader still carries the mark are signalled, so a reused PID is safe.
    Returns the pids that were still there after SIGKILL (should be none).
    """
    marked = marked_processes(deployment)
    group_leaders = [pid for pid in group_leaders if pid in marked]
    for pid in group_leaders:
        _signal_group(pid, signal.SIGTERM)
    for pid in marked_processes(deployment):
        _signal(pid, signal.SIGTERM)
    deadline = clock() + grace_s
    while clock() < deadline and marked_processes(deployment):
        sleep(0.5)
    for pid in group_leaders:
        _signal_group(pid, signal.SIGKILL)
    for pid in marked_processes(deployment):
        _signal(pid, signal.SIGKILL)
    deadline = clock() + 5
    while clock() < deadline and marked_processes(deployment):
        sleep(0.2)
    return sorted(marked_processes(deployment))


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
