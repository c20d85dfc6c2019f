"""``tandem watch`` of a deployment with replicas: every group and the router.

Each group is watched on its own (``Watcher`` into ``OUT/NAME-gG/``, with its own
verdicts, nodes, leader metrics and restarts), all on one clock in threads of this process, and
the router is looked at on the same interval into ``OUT/router.jsonl``: whether it runs, its
members and, per group, the requests it sent there, its own health opinion and circuit breaker.
A group out of rotation shows there while its own samples say why. ``fleet_report`` judges
every group's folder as a watch of one group and adds the router's record: the fleet passes
when every group passes and the router ran, with every group a member, in every look.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, Field

from tandem import files
from tandem.backends import router as routers
from tandem.backends.router import RouterFigures
from tandem.backends.state import DeploymentState, load_state
from tandem.errors import SpecError
from tandem.jsonfiles import read_jsonl
from tandem.ownership import RunKind
from tandem.watch.sample import RUN_FILE
from tandem.watch.sampler import Watcher

ROUTER_FILE = "router.jsonl"
FLEET_FILE = "fleet.json"
RUN = RunKind(
    "watch run",
    "a watch",
    resume_flag=None,
    is_own=lambda folder: is_fleet_watch(folder) or (folder / RUN_FILE).is_file(),
)
"""A watch's ``--out`` folder (of one group, or of a fleet's groups and router), identified by
the deployment it watches; a folder that holds that watch is resumed."""


class RouterLook(RouterFigures):
    """One line of ``router.jsonl``."""

    time: datetime
    groups: int = Field(description="Groups of the fleet at that moment.")


class FleetWatch(BaseModel):
    """``OUT/fleet.json``: which deployment, and where each group's folder is."""

    name: str
    groups: list[str]


def watch_fleet(
    name: str,
    out: Path,
    *,
    interval_s: float | None = None,
    duration_s: float | None = None,
    on_look: Callable[[RouterLook], None] = lambda look: None,
    should_stop: Callable[[], bool] = lambda: False,
) -> FleetWatch:
    """Watch every running group of ``name`` and its router until the duration is covered, the
    fleet is taken down, or ``should_stop``."""
    state = load_state(name)
    record = FleetWatch(name=name, groups=[g.name for g in state.groups])
    out.mkdir(parents=True, exist_ok=True)
    files.write_json(out / FLEET_FILE, record)
    stop = threading.Event()
    watchers = [
        Watcher(
            name,
            out / group.name,
            interval_s=interval_s,
            duration_s=duration_s,
            should_stop=lambda: stop.is_set() or should_stop(),
            group=group.group,
        )
        for group in state.groups
    ]
    threads = [threading.Thread(target=w.run, name=w.state.name, daemon=True) for w in watchers]
    for thread in threads:
        thread.start()
    interval = watchers[0].run_info.interval_s if watchers else interval_s or 5.0
    started = time.monotonic()
    try:
        with files.LineLog(out / ROUTER_FILE) as log:
            while not should_stop() and any(t.is_alive() for t in threads):
                look = _look(state)
                log.write_json(look)
                on_look(look)
                if duration_s is not None and time.monotonic() - started >= duration_s:
                    break
                time.sleep(interval)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    return record


def _look(state: DeploymentState) -> RouterLook:
    figures = routers.look(state.router) if state.router else RouterFigures(running=False)
    return RouterLook(time=datetime.now(UTC), groups=len(state.groups), **figures.model_dump())


class RouterRecord(BaseModel):
    """What the router did over a watch."""

    looks: int
    not_running: int = Field(description="Looks at which it did not answer.")
    short_of_members: int = Field(description="Looks with a group out of rotation.")
    sent: dict[str, float] = Field(description="Requests it sent to each group over the watch.")

    @property
    def ok(self) -> bool:
        return self.looks > 0 and self.not_running == 0 and self.short_of_members == 0


def router_record(folder: Path) -> RouterRecord:
    """The router's looks of a fleet watch folder, summed up.

    Raises:
        SpecError: the folder holds no fleet watch.
    """
    path = Path(folder) / ROUTER_FILE
    if not path.is_file():
        raise SpecError(
            f"{folder} holds no watch of a deployment with replicas (no {ROUTER_FILE})",
            field="RUN_DIR",
            hint="give the --out of a `tandem watch run` of one",
        )
    looks = read_jsonl(
        path, RouterLook.model_validate, what="router look", hint="watch it again"
    ).records
    first, last = (looks[0].workers, looks[-1].workers) if looks else ({}, {})
    return RouterRecord(
        looks=len(looks),
        not_running=sum(not look.running for look in looks),
        short_of_members=sum(look.running and len(look.members) < look.groups for look in looks),
        sent={
            worker: figures.processed - (first[worker].processed if worker in first else 0.0)
            for worker, figures in last.items()
        },
    )


def group_folders(folder: Path) -> list[Path]:
    """The groups' watch folders of a fleet watch folder, in group order."""
    text = (Path(folder) / FLEET_FILE).read_text()
    return [Path(folder) / group for group in FleetWatch.model_validate_json(text).groups]


def is_fleet_watch(folder: Path) -> bool:
    return (Path(folder) / FLEET_FILE).is_file()
