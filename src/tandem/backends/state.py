"""Deployment state on disk, so ``status``, ``logs`` and ``down`` work from any later shell.

Layout under the state root (``$TANDEM_HOME``, default ``~/.local/state/tandem``), written
down once, in ``DeploymentDir``; every other module asks it for a path::

    deployments/NAME/state.json     this model, rewritten after every change
    deployments/NAME/fleet.json     with replicas: the groups (each a deployment NAME-gG)
                                    and the router in front (``tandem.operations.fleet``)
    deployments/NAME/logs/rankN.log each rank's stdout and stderr (restart-N/: earlier runs)
    deployments/NAME/events.log     the supervisor's events (read by the bundle and watch)
    deployments/NAME/supervisor.pid the supervisor that keeps it up, while one runs
    deployments/NAME/watch/         ``tandem watch``'s samples, unless told elsewhere
    deployments/NAME/revisions/N.json  what each ``up`` ran (``tandem.operations.revisions``)
    (folders 0700, files 0600: they hold commands, addresses and logs of the user's model)
    $TMPDIR/tandem-HASH/rankN/      TMPDIR of the ranks (removed by down; short, because
                                    vLLM's IPC socket paths must fit in 107 bytes)
    caches/NAME/rankN/              each rank's compile caches (kept by down: tandem.caches)
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, Field, PrivateAttr, ValidationError

from tandem import files, ownership
from tandem.backends.processes import ProcessIdentity
from tandem.backends.router import RouterProcess
from tandem.errors import StateError
from tandem.files import private_dir
from tandem.jsonfiles import read_json, validation_text
from tandem.plan.status import PlannedVsActual
from tandem.redact import Redactor, redact_text
from tandem.spec.cluster import Cluster
from tandem.spec.deployment import Deployment
from tandem.spec.recipe import Recipe
from tandem.spec.saved import as_saved
from tandem.vllm_log import BootFigures, PhaseMark

SCHEMA_VERSION = 1
_log = logging.getLogger("tandem.state")


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
        """The folder of deployment ``name``, which must pass the recipe's name rule: a name
        is where every command's path starts, so ``..`` or ``/x`` never becomes one.

        Raises:
            SpecError: ``name`` is not a deployment name.
        """
        return cls(state_root() / "deployments" / ownership.check_name(name))

    @property
    def state_file(self) -> Path:
        return self.path / "state.json"

    def forget(self) -> None:
        """Remove the state file (the logs stay): the deployment is no longer listed, and the
        next ``up`` of its name starts clean."""
        ownership.remove_file(self.state_file, root=state_root())

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    def rank_log(self, rank: int) -> Path:
        return self.logs / f"rank{rank}.log"

    def rank_logs(self) -> list[Path]:
        """The current run's rank logs, in rank order (a supervisor's ``logs/restart-N/`` not)."""
        return sorted(self.logs.glob("rank*.log"), key=lambda p: (len(p.name), p.name))

    @property
    def fleet_file(self) -> Path:
        """A deployment with replicas: its groups and its router (``tandem.operations.fleet``)."""
        return self.path / "fleet.json"

    @property
    def router_log(self) -> Path:
        return self.logs / "router.log"

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
    def revisions(self) -> Path:
        """``N.json`` for each revision (``tandem.operations.revisions``); kept by ``down``."""
        return self.path / "revisions"

    @property
    def run_dir(self) -> Path:
        """A short folder for the ranks' TMPDIR, named by a hash of this folder: vLLM puts
        ZeroMQ IPC sockets in TMPDIR, and a socket path may not exceed 107 bytes, so it lives
        directly in the system temp dir."""
        tag = hashlib.sha1(str(self.path.resolve()).encode()).hexdigest()[:10]
        return Path(tempfile.gettempdir()) / f"tandem-{tag}"

    def clear_run_dir(self) -> None:
        """Remove the ranks' TMPDIR, and only it: a link planted at its name that leads out of
        the system temp dir is refused (``tandem.ownership``).

        Raises:
            NotOwned: the run dir resolves outside the temp dir.
            OSError: a file in it could not be removed.
        """
        ownership.remove_tree(self.run_dir, root=Path(tempfile.gettempdir()))


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
    group: int = Field(
        default=0,
        description="Its group of a LeaderWorkerSet's replicas (Kubernetes); 0 elsewhere, "
        "where each group is a deployment of its own.",
    )
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
    planned: PlannedVsActual | None = Field(
        default=None,
        description="The plan of this launch against its boot figures, compared once, when "
        "`up` recorded them: a look at the deployment plans nothing.",
    )
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
    revision: int | None = Field(
        default=None, description="The revision this launch runs (`tandem.operations.revisions`)."
    )
    boot_id: str | None = Field(
        default=None,
        description="This machine's boot id at launch (`/proc/sys/kernel/random/boot_id`): "
        "a pid or session recorded on another boot names someone else's process now.",
    )
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    _warned: set[str] = PrivateAttr(default_factory=set)
    """The parts (recipe, cluster) read leniently and warned about once already."""

    @property
    def directory(self) -> DeploymentDir:
        return DeploymentDir.of(self.name)

    @property
    def groups(self) -> list[int]:
        """The groups its ranks belong to: ``[0]``, but for a LeaderWorkerSet's replicas."""
        return sorted({r.group for r in self.ranks}) or [0]

    def deployment(self, *, lenient: bool = False) -> Deployment:
        """The deployment this state was launched from (resolved recipe and cluster).

        ``lenient`` is for the commands that stop, watch or bundle what already runs: a recipe
        or cluster that today's validators refuse (saved by an older tandem) is read as saved
        (``tandem.spec.saved``), with a warning on stderr, so an old deployment can always be
        stopped. Without it (a relaunch) such a state is refused.

        Raises:
            StateError: not ``lenient``, and the saved recipe or cluster fails today's checks.
        """
        where = str(self.directory.state_file)
        if not lenient:
            try:
                return Deployment(
                    recipe=Recipe.model_validate(self.recipe),
                    cluster=Cluster.model_validate(self.cluster),
                )
            except ValidationError as exc:
                raise StateError(
                    f"the saved recipe or cluster fails today's checks: {validation_text(exc)}",
                    file=where,
                    hint=f"stop it with `tandem down {self.name}`, fix the recipe or cluster, "
                    "and launch it again with `tandem up`",
                ) from exc
        recipe, recipe_refused = as_saved(Recipe, self.recipe)
        cluster, cluster_refused = as_saved(Cluster, self.cluster)
        for part, refused in (("recipe", recipe_refused), ("cluster", cluster_refused)):
            if refused and part not in self._warned:
                self._warned.add(part)
                _log.warning(
                    redact_text(
                        f"warning: {where}: the saved {part} fails today's checks ({refused}); "
                        "read as saved to stop, watch or bundle it; launch it again to fix it"
                    )
                )
        return Deployment.model_construct(recipe=recipe, cluster=cluster)

    def save(self) -> None:
        """Write atomically (a reader never sees half a file), private to the user (folder
        0700, file 0600), through the one writing path (``tandem.files``); the recipe's and
        cluster's secret names are hidden too (``HF_TOKEN: ...`` of an old state)."""
        path = self.directory.state_file
        private_dir(path.parent)
        redactor = Redactor.for_caller()
        files.write_json(
            path, redactor.data(self.model_dump(mode="json")), redactor=redactor, private=True
        )


class FleetState(BaseModel):
    """What ``up`` started for a deployment with replicas (``deployments/NAME/fleet.json``):
    its groups, each a deployment of its own, and the router in front
    (``tandem.operations.fleet``)."""

    name: str
    groups: list[str] = Field(description="Each group's deployment name, in group order.")
    model: str
    router: RouterProcess | None = None
    launcher: str | None = Field(
        default=None, description="The `up` that started it (pid, start, boot) while it runs."
    )
    ready: bool = False
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))

    @property
    def directory(self) -> DeploymentDir:
        return DeploymentDir.of(self.name)

    def save(self) -> None:
        private_dir(self.directory.path)
        files.write_json(self.directory.fleet_file, self.model_dump(mode="json"), private=True)

    def interrupted(self) -> bool:
        """Its ``up`` died before the fleet was ready."""
        if self.ready or self.launcher is None:
            return False
        launcher = ProcessIdentity.parse(self.launcher)
        return launcher is None or launcher.find() is None


def fleet_exists(name: str) -> bool:
    """``name`` is a deployment with replicas that tandem started."""
    return DeploymentDir.of(name).fleet_file.is_file()


def load_fleet(name: str) -> FleetState:
    """The fleet record of ``name``.

    Raises:
        StateError: none, or unreadable.
    """
    return read_json(
        DeploymentDir.of(name).fleet_file,
        FleetState,
        what="fleet state",
        hint=f"`tandem down {name}` stops what it names",
        error=StateError,
    )


def fleet_of(group: str) -> FleetState | None:
    """The fleet whose group ``group`` is (``NAME-gG`` listed in NAME's record), else None."""
    match = re.fullmatch(r"(.+)-g\d+", group)
    if match is None or not fleet_exists(match.group(1)):
        return None
    try:
        fleet = load_fleet(match.group(1))
    except StateError:
        return None
    return fleet if group in fleet.groups else None


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
    return read_json(
        path,
        DeploymentState,
        what="deployment state",
        hint="remove the folder if the deployment is gone",
        error=StateError,
    )
