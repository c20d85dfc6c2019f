"""A watch that runs beside another command (``bench --watch``, ``eval --watch``), in a thread.

The sampler does blocking I/O of a few milliseconds per interval, so a daemon thread beside the
load generator costs the measurement nothing it would notice; the sleep between samples waits
on an ``Event``, so ``stop()`` ends the watch at once (a sample being taken is finished and
written first). The folder is an ordinary watch folder: ``tandem watch report`` reads it.

Usage:
    with BackgroundWatch("tiny-local", out / "watch"):
        run_the_benchmark()
"""

from __future__ import annotations

import threading
from pathlib import Path

from tandem.watch.sampler import Watcher

WATCH_DIR = "watch"
"""The folder of a run's telemetry inside the run's own (``bench --out``, ``eval --out``)."""


class BackgroundWatch:
    """Samples a deployment into ``out`` from ``__enter__`` to ``__exit__``."""

    def __init__(self, name: str | None, out: Path, *, interval_s: float | None = None) -> None:
        self._stop = threading.Event()
        self.watcher = Watcher(
            name, Path(out), interval_s=interval_s, should_stop=self._stop.is_set
        )
        self.watcher.sleep = self._pause
        self._thread = threading.Thread(target=self.watcher.run, name="tandem-watch", daemon=True)

    def _pause(self, seconds: float) -> None:
        """Sleep between samples; a stop request ends it at once."""
        self._stop.wait(seconds)

    def __enter__(self) -> BackgroundWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)
