"""Deployment state on disk, so ``status``, ``logs`` and ``down`` work from any later shell.

Layout under the state root (``$TANDEM_HOME``, default ``~/.local/state/tandem``), written
down once, in ``DeploymentDir``; every other module asks it for a path::

    deployments/NAME/state.json     this model, rewritten after every change
    deployments/NAME/logs/rankN.log each rank's stdout and stderr (restart-N/: earlier runs)
    deployments/NAME/events.log     the supervisor's events (read by the bundle and watch)
    deployments/NAME/supervisor.pid the supervisor that keeps it up, while one runs
    deployments/NAME/watch/         ``tandem watch``'s samples, unless told elsewhere
    (folders 0700, files 0600: they hold commands, addresses and logs of the user's model)
    $TMPDIR/tandem-HASH/rankN/      TMPDIR of the ranks (removed by down; short, because
                                    vLLM's IPC socket paths must fit in 107 bytes)
    caches/NAME/rankN/              each rank's compile caches (kept by down: tandem.caches)
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from pydantic import BaseModel, Field

from tandem.errors import StateError
from tandem.redact import Redactor
from tandem.spec.cluster import Cluster
from tandem.spec.deployment import Deployment
from tandem.spec.recipe import Recipe
from tandem.vllm_log import BootFigures, PhaseMark

SCHEMA_VERSION = 1


def state_root() -> Path:
    """Where tandem keeps deployment state: ``$TANDEM_HOME`` or ``~/.local/state/tandem``."""
    env = os.environ.get("TANDEM_HOME")
    return Path(env) if env else Path.home() / ".local" / "state" / "tandem"


@dataclass(frozen=True)
class DeploymentDir:
    """One deployment's folder: the only place that knows what lies where inside it."""

    path: Path

    @classmethod
    def of(cls, name: str) -> DeploymentDir:
        return cls(state_root() / "deployments" / name)

    @property
    def state_file(self) -> Path:
        return self.path / "state.json"

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    def rank_log(self, rank: int) -> Path:
        return self.logs / f"rank{rank}.log"

    def rank_logs(self) -> list[Path]:
        """The current run's rank logs, in rank order (a supervisor's ``logs/restart-N/`` not)."""
        return sorted(self.logs.glob("rank*.log"), key=lambda p: (len(p.name), p.name))

    @property
    def events(self) -> Path:
        return self.path / "events.log"

    @property
    def supervisor_pid(self) -> Path:
        return self.path / "supervisor.pid"

    @property
    def watch(self) -> Path:
        return self.path / "watch"

    @property
    def run_dir(self) -> Path:
        """A short folder for the ranks' TMPDIR, named by a hash of this folder: vLLM puts
        ZeroMQ IPC sockets in TMPDIR, and a socket path may not exceed 107 bytes, so it lives
        directly in the system temp dir."""
        tag = hashlib.sha1(str(self.path.resolve()).encode()).hexdigest()[:10]
        return Path(tempfile.gettempdir()) / f"tandem-{tag}"


class ProcessRecord(BaseModel):
    """A process of a rank as it was when the deployment became ready."""

    pid: int
    name: str = Field(description="As the kernel shows it (`VLLM::Worker_TP1`, `vllm`, ...).")
    start_ticks: int = Field(default=0, description="Start time in clock ticks after boot.")


class RankState(BaseModel):
    """One launched rank: its process group, its log, where it runs."""

    rank: int
    node: str
    role: str
    address: str
    pid: int | None = Field(default=None, description="Process id; also the process group id.")
    netns: str | None = Field(default=None, description="Network namespace, local netns only.")
    log: str = Field(description="Path of the rank's log file.")
    started_at: datetime | None = None
    netns_inode: str | None = Field(default=None, description="`net:[INODE]` of its namespace.")
    processes: list[ProcessRecord] = Field(
        default_factory=list,
        description="Its processes when the deployment became ready: the "
        "health model counts a rank broken when one of them is gone.",
    )
    log_offset_ready: int | None = Field(
        default=None,
        description="Size of its log when the deployment became ready: error "
        "signatures are looked for after it.",
    )


class DeploymentState(BaseModel):
    """Everything tandem knows about a running (or failed) deployment."""

    schema_version: int = SCHEMA_VERSION
    name: str
    backend: str = Field(description="`local`, `ssh` or `k8s`.")
    recipe: dict = Field(description="The resolved recipe, as launched.")
    cluster: dict = Field(description="The resolved cluster, as launched.")
    endpoint: str = Field(description="Base URL of the OpenAI API, e.g. http://10.77.0.1:8000.")
    model: str = Field(description="The model name clients send.")
    ranks: list[RankState] = Field(default_factory=list)
    network: dict = Field(default_factory=dict, description="What up created: bridge, netns.")
    run_dir: str | None = Field(default=None, description="The ranks' TMPDIR.")
    phases: list[PhaseMark] = Field(default_factory=list)
    boot: BootFigures = Field(default_factory=BootFigures)
    ready: bool = False
    launch_id: str | None = Field(
        default=None,
        description="The random id every process of this launch carries as TANDEM_LAUNCH.",
    )
    launcher_pid: int | None = Field(
        default=None,
        description="The `up` (or supervisor) that "
        "launched it; with ready false and this gone, the launch "
        "was interrupted.",
    )
    launcher_start_ticks: int | None = None
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))

    @property
    def directory(self) -> DeploymentDir:
        return DeploymentDir.of(self.name)

    def deployment(self) -> Deployment:
        """The deployment this state was launched from (resolved recipe and cluster)."""
        return Deployment(
            recipe=Recipe.model_validate(self.recipe), cluster=Cluster.model_validate(self.cluster)
        )

    def save(self) -> None:
        """Write atomically (a reader never sees half a file), private to the user (folder
        0700, file 0600), and through the one redaction path (``tandem.redact``)."""
        path = self.directory.state_file
        private_dir(path.parent)
        tmp = path.with_suffix(".tmp")
        data = Redactor.for_caller().data(self.model_dump(mode="json"))
        with open_private(tmp, "w") as handle:
            handle.write(json.dumps(data, indent=2))
        tmp.replace(path)


def private_dir(path: Path) -> Path:
    """``path`` as a folder only its owner can enter (0700), created with its parents."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def open_private(path: Path, mode: str = "a") -> IO:
    """Open ``path`` for writing (``w``, ``a``, ``ab``...), created mode 0600 if new, and made
    0600 if it was not."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if "a" in mode else os.O_TRUNC)
    handle = os.fdopen(os.open(path, flags, 0o600), mode)
    os.chmod(path, 0o600)
    return handle


def list_deployments() -> list[str]:
    """Names of deployments that have state."""
    folder = state_root() / "deployments"
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if DeploymentDir(p).state_file.is_file())


def load_state(name: str | None = None) -> DeploymentState:
    """Read a deployment's state; with no name, the only deployment there is.

    Raises:
        StateError: no such deployment, several and none named, or an unreadable file.
    """
    if name is None:
        names = list_deployments()
        if len(names) != 1:
            raise StateError(
                "no deployment is running"
                if not names
                else f"several deployments exist ({', '.join(names)}); name one",
                hint="start one with `tandem up RECIPE`" if not names else "pass its name",
            )
        name = names[0]
    path = DeploymentDir.of(name).state_file
    if not path.is_file():
        known = ", ".join(list_deployments()) or "none"
        raise StateError(
            f"no deployment named '{name}' (known: {known})",
            hint="check the name with `tandem status`",
        )
    try:
        return DeploymentState.model_validate(json.loads(path.read_text()))
    except (OSError, ValueError) as exc:
        raise StateError(
            f"state file is unreadable: {exc}",
            file=str(path),
            hint="remove the folder if the deployment is gone",
        ) from exc
