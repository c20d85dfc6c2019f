"""Signals that end a command: cleanups run to the end, and a second Ctrl-C hurries them.

By default SIGTERM and SIGHUP end Python at once, so an ``up`` killed that way would leave its
ranks and namespaces behind. ``raise_on_termination`` turns them into ``Interrupted``, raised
like ``KeyboardInterrupt`` wherever the main thread is, so every ``finally`` and
``except BaseException`` cleanup runs. Inside ``shielded()`` (a cleanup in progress) these
signals and Ctrl-C no longer raise: they set ``Hurry.requested``, and a stop then skips the rest
of its grace period and kills what is left, instead of being abandoned half-way.
"""

from __future__ import annotations

import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO

_ENDING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(BaseException):
    """SIGTERM or SIGHUP arrived (a ``BaseException``, like ``KeyboardInterrupt``)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise(signum: int, frame: object) -> None:
    raise Interrupted(signum)


def raise_on_termination() -> None:
    """Make SIGTERM and SIGHUP raise ``Interrupted`` in the main thread, and SIGINT
    ``KeyboardInterrupt`` even where the parent ignored it (a shell starts background jobs
    with SIGINT ignored, and Python then installs no handler): a stop always cleans up."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, _raise)
        signal.signal(signal.SIGHUP, _raise)


@dataclass
class Hurry:
    """Set when the user asked again to stop while a cleanup runs: skip the waiting."""

    requested: bool = False


@contextmanager
def shielded(on_event: Callable[[str], None] = lambda text: None) -> Iterator[Hurry]:
    """Run a cleanup that signals cannot cut short; they hurry it instead."""
    hurry = Hurry()
    if threading.current_thread() is not threading.main_thread():
        yield hurry
        return

    def hurry_up(signum: int, frame: object) -> None:
        if not hurry.requested:
            on_event(f"{signal.Signals(signum).name} during cleanup: killing what is left now")
        hurry.requested = True

    previous = {sig: signal.signal(sig, hurry_up) for sig in _ENDING}
    try:
        yield hurry
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def detached(
    argv: list[str], output: IO[bytes], env: dict[str, str] | None = None
) -> subprocess.Popen:
    """Start ``argv`` in a session of its own, nothing on its stdin, its stdout and stderr into
    ``output``: a Ctrl-C or a hang-up at the terminal reaches tandem, never the child, which
    tandem then stops as it means to (or leaves serving: a rank, the router, the front door)."""
    return subprocess.Popen(
        argv,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=output,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def interruption(exc: BaseException) -> str | None:
    """What a stop by signal is called in an event (``interrupted by SIGTERM``); None when
    ``exc`` is a failure, not a signal: a Ctrl-C or a ``tandem down`` is no failed start-up."""
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted by Ctrl-C (SIGINT)"
    if isinstance(exc, Interrupted):
        return f"interrupted by {signal.Signals(exc.signum).name}"
    return None
