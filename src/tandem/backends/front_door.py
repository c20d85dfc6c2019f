"""The front door's record on disk: one endpoint for every deployment under this state root,
owned by its own record and by no deployment's.

    $TANDEM_HOME/front/state.json   the front door tandem started: pid, start time, boot, where
                                    it listens, how often it judges the deployments
    $TANDEM_HOME/front/front.log    what it said: each model joining and leaving, and why
    $TANDEM_HOME/front/state.lock   orders a start and a stop

A deployment's ``down`` never reads this record: the front door drops the model on its next
look. ``tandem front stop`` stops the process this record names (its pid, start time and boot,
never a pid alone) and removes only the files above.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, Field

from tandem import files, ownership
from tandem.backends.processes import ProcessIdentity
from tandem.backends.state import state_root
from tandem.errors import StateError
from tandem.jsonfiles import read_json

LOOPBACK = "127.0.0.1"


def front_dir() -> Path:
    return state_root() / "front"


def state_file() -> Path:
    return front_dir() / "state.json"


def log_file() -> Path:
    return front_dir() / "front.log"


class FrontDoor(BaseModel):
    """A front door tandem started."""

    pid: int
    start_ticks: int
    boot: str | None = None
    host: str = Field(description="The address it listens on (127.0.0.1 unless told).")
    port: int
    interval_s: float = Field(description="Seconds between two looks at every deployment.")
    log: str
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))

    @property
    def url(self) -> str:
        """Where clients send requests (``http://127.0.0.1:8300``; a front door listening on
        every address is reached here through loopback)."""
        host = LOOPBACK if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}"

    @property
    def identity(self) -> ProcessIdentity:
        return ProcessIdentity(self.pid, self.start_ticks, self.boot)

    def running(self) -> bool:
        return self.identity.find() is not None


@contextlib.contextmanager
def locked() -> Iterator[None]:
    with files.locked(front_dir() / "state.lock"):
        yield


def read() -> FrontDoor | None:
    """The recorded front door (running or not), None when there is no record.

    Raises:
        StateError: the record is unreadable.
    """
    if not state_file().is_file():
        return None
    return read_json(
        state_file(),
        FrontDoor,
        what="front door state",
        hint="`tandem front stop` clears it",
        error=StateError,
    )


def write(door: FrontDoor) -> None:
    files.private_dir(front_dir())
    files.write_json(state_file(), door, private=True)


def forget() -> None:
    """Remove the record and its lock (the log stays)."""
    ownership.remove_file(state_file(), root=state_root())
    ownership.remove_file(front_dir() / "state.lock", root=state_root())
