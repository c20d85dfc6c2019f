"""Group restarts from the deployment's ``events.log``, read incrementally.

``tandem supervise`` writes one line per event,
``2026-12-01T08:00:00Z  text``; a group restart is announced as ``restart N/MAX in D s: ...``
(the line format as read: ``tandem.operations.overview.parse_event``).
The reader keeps its byte offset, so a sample reads only what was appended since the last.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from tandem.backends.state import DeploymentDir
from tandem.operations.overview import Event, parse_event

__all__ = ["EventReader", "parse_event"]


class EventReader:
    """The events of one deployment: a running restart count, and what is new each time.

    Usage:
        reader = EventReader("tiny-local", since=started)
        new, restarts = reader.read()   # events after ``since`` first, then only appended ones
    """

    def __init__(
        self, name: str, *, since: datetime, path: Path | None = None, group: int | None = None
    ) -> None:
        self.path = path or DeploymentDir.of(name).events
        self.since = since
        self.prefix = "" if group is None else f"group {group}: "
        """A deployment of several groups: only this group's lines (its supervisor's)."""
        self.offset = 0
        self.restarts = 0

    def read(self) -> tuple[list[Event], int]:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except OSError:
            return [], self.restarts
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        new = []
        for line in complete.decode(errors="replace").splitlines():
            if (event := parse_event(line, self.prefix)) is None:
                continue
            self.restarts += event.restart
            if event.time >= self.since:
                new.append(event)
        return new, self.restarts
