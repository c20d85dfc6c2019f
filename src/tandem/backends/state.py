"""Deployment state on disk, so every command works from any later shell.

One record a deployment, whatever its backend and however many groups it has: its groups (one
without replicas), the router in front of them, and the revision it runs. A group stays the
unit of launch, health and restart; its record lives inside the deployment's, not beside it.

Layout under the state root (``$TANDEM_HOME``, default ``~/.local/state/tandem``), written
down once, in ``DeploymentDir`` and ``GroupDir``; every other module asks them for a path::

    deployments/NAME/state.json         the deployment: its groups, router and revision,
                                        rewritten after every change (``state.lock`` orders
                                        the writers: a supervisor per group, an upgrade)
    deployments/NAME/logs/rankN.log     each rank's stdout and stderr (one group; a group of
                                        several: groups/gG/logs/rankN.log); restart-N/ earlier runs
    deployments/NAME/logs/router.log    the router's, with replicas
    deployments/NAME/events.log         the supervisor's events (read by the bundle and watch)
    deployments/NAME/supervisor.pid     the supervisor that keeps it up, while one runs
    deployments/NAME/watch/             ``tandem watch``'s samples, unless told elsewhere
    deployments/NAME/revisions/N.json   what each revision ran (``tandem.operations.revisions``)
    (folders 0700, files 0600: they hold commands, addresses and logs of the user's model)
    $TMPDIR/tandem-HASH/rankN/          TMPDIR of a group's ranks (removed by down; short,
                                        because vLLM's IPC socket paths must fit in 107 bytes)
    caches/GROUP/rankN/                 each rank's compile caches (kept by down: tandem.caches)

Earlier releases wrote a deployment of one group as a bare launch (``schema_version`` 1) and a
deployment with replicas as ``fleet.json`` beside one folder per group (``NAME-gG``): both are
read, and the second is moved into the one record the first time it is loaded.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, PrivateAttr, ValidationError, model_validator

from tandem import files, ownership
from tandem.backends.processes import ProcessIdentity
from tandem.backends.router import RouterProcess
from tandem.errors import StateError
from tandem.jsonfiles import read_json, validation_text
from tandem.plan.ledger import NodeHold
from tandem.plan.status import PlannedVsActual
from tandem.redact import Redactor, redact_text
from tandem.spec.cluster import Cluster
from tandem.spec.deployment import Deployment
from tandem.spec.recipe import Recipe
from tandem.spec.saved import as_saved
from tandem.vllm_log import BootFigures, PhaseMark

SCHEMA_VERSION = 2
_log = logging.getLogger("tandem.state")


def state_root() -> Path:
    """Where tandem keeps deployment state: ``$TANDEM_HOME`` or ``~/.local/state/tandem``."""
    env = os.environ.get("TANDEM_HOME")
    return Path(env) if env else Path.home() / ".local" / "state" / "tandem"


def deployments_root() -> Path:
    return state_root() / "deployments"


@dataclass(frozen=True)
class GroupDir:
    """One group's folder: its ranks' logs and the short TMPDIR they run in. A deployment of
    one group keeps them in its own folder (``DeploymentDir``)."""

    path: Path

    @classmethod
    def at(cls, home: str) -> GroupDir:
        """The folder ``home`` (relative to ``deployments/``), each part a deployment name: a
        path saved in a state file never leads out of the state root."""
        parts = home.split("/")
        for part in parts:
            ownership.check_name(part, field="home")
        return cls(deployments_root().joinpath(*parts))

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    def rank_log(self, rank: int) -> Path:
        return self.logs / f"rank{rank}.log"

    def rank_logs(self) -> list[Path]:
        """The current run's rank logs, in rank order (a supervisor's ``logs/restart-N/`` not)."""
        return sorted(self.logs.glob("rank*.log"), key=lambda p: (len(p.name), p.name))

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


@dataclass(frozen=True)
class DeploymentDir(GroupDir):
    """One deployment's folder: the only place that knows what lies where inside it."""

    @classmethod
    def of(cls, name: str) -> DeploymentDir:
        """The folder of deployment ``name``, which must pass the recipe's name rule: a name
        is where every command's path starts, so ``..`` or ``/x`` never becomes one.

        Raises:
            SpecError: ``name`` is not a deployment name.
        """
        return cls(deployments_root() / ownership.check_name(name))

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def state_file(self) -> Path:
        return self.path / "state.json"

    def group_home(self, group: int, groups: int) -> str:
        """Where group ``group`` of ``groups`` keeps its logs, relative to ``deployments/``."""
        return self.name if groups == 1 else f"{self.name}/groups/g{group}"

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the deployment's lock while its record is read, changed and written: a
        supervisor per group and an upgrade may save it at the same time."""
        with files.locked(self.path / "state.lock"):
            yield

    def forget(self) -> None:
        """Remove the state file and its lock (the logs and revisions stay, and the folder
        with them): the deployment is no longer listed, and the next ``up`` of its name starts
        clean."""
        ownership.remove_file(self.state_file, root=state_root())
        ownership.remove_file(self.path / "state.lock", root=state_root())
        with contextlib.suppress(OSError):  # not empty: what it keeps stays
            self.path.rmdir()

    @property
    def router_log(self) -> Path:
        return self.logs / "router.log"

    @property
    def events(self) -> Path:
        return self.path / "events.log"

    def supervisor_pid(self, group: int | None = None) -> Path:
        """The supervisor's pid file: of the deployment, or of one of its groups (a deployment
        of several groups has a supervisor process for each)."""
        return self.path / ("supervisor.pid" if group is None else f"supervisor-g{group}.pid")

    def supervisor_pids(self) -> list[Path]:
        return sorted(self.path.glob("supervisor*.pid"))

    @property
    def watch(self) -> Path:
        return self.path / "watch"

    @property
    def revisions(self) -> Path:
        """``N.json`` for each revision (``tandem.operations.revisions``); kept by ``down``."""
        return self.path / "revisions"

    @property
    def fleet_file(self) -> Path:
        """Where an earlier release kept a deployment with replicas (read once, then moved
        into ``state.json``)."""
        return self.path / "fleet.json"


@dataclass(frozen=True)
class Place:
    """Which group of which deployment a launch is, and where its folder lies."""

    deployment: str
    group: int = 0
    home: str = ""

    @classmethod
    def of(cls, deployment: str, group: int, groups: int) -> Place:
        return cls(deployment, group, DeploymentDir.of(deployment).group_home(group, groups))

    @property
    def directory(self) -> GroupDir:
        return GroupDir.at(self.home or self.deployment)

    @property
    def state_file(self) -> Path:
        return DeploymentDir.of(self.deployment).state_file


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
        description="Its group of a LeaderWorkerSet's replicas (Kubernetes: the pod's name "
        "says it); 0 elsewhere, where each group is launched on its own.",
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


class Launched(BaseModel):
    """The recipe and cluster as launched, read back as a ``Deployment``."""

    recipe: dict = Field(description="The resolved recipe, as launched.")
    cluster: dict = Field(description="The resolved cluster, as launched.")
    _warned: set[str] = PrivateAttr(default_factory=set)
    """The parts (recipe, cluster) read leniently and warned about once already."""

    def deployment(self, *, lenient: bool = False) -> Deployment:
        """The deployment as launched (resolved recipe and cluster).

        ``lenient`` is for the commands that stop, watch or bundle what already runs: a recipe
        or cluster that today's validators refuse (saved by an older tandem) is read as saved
        (``tandem.spec.saved``), with a warning on stderr, so an old deployment can always be
        stopped. Without it (a relaunch) such a state is refused.

        Raises:
            StateError: not ``lenient``, and the saved recipe or cluster fails today's checks.
        """
        where = str(DeploymentDir.of(self.owner).state_file)
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
                    hint=f"stop it with `tandem down {self.owner}`, fix the recipe or cluster, "
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

    @property
    def owner(self) -> str:
        raise NotImplementedError


class GroupState(Launched):
    """One group's launch: its ranks, where it answers, what its start-up showed. On
    Kubernetes one apply launches every group, and each group's record names the same
    objects and launch id."""

    name: str = Field(
        description="The name its processes, networks and caches carry: the deployment's, or "
        "`NAME-gG` for group G of replicas launched one group at a time."
    )
    deployment_name: str = Field(default="", description="The deployment it is a group of.")
    group: int = Field(default=0, description="Its index among the deployment's groups.")
    home: str = Field(default="", description="Its folder under `deployments/` (logs, TMPDIR).")
    backend: str = Field(description="`local`, `ssh` or `k8s`.")
    endpoint: str = Field(description="Base URL of its OpenAI API, e.g. http://10.77.0.1:8000.")
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
        default=None, description="The revision this group runs (`tandem.operations.revisions`)."
    )
    boot_id: str | None = Field(
        default=None,
        description="This machine's boot id at launch (`/proc/sys/kernel/random/boot_id`): "
        "a pid or session recorded on another boot names someone else's process now.",
    )
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))

    @model_validator(mode="after")
    def _placed(self) -> GroupState:
        """A record without its place (built by hand, or by a test) is the one group of the
        deployment its name says."""
        if not self.deployment_name:
            self.deployment_name = self.name
        if not self.home:
            self.home = self.deployment_name
        return self

    @property
    def owner(self) -> str:
        return self.deployment_name

    @property
    def directory(self) -> GroupDir:
        return GroupDir.at(self.home)

    @property
    def leader(self) -> RankState | None:
        return next((r for r in self.ranks if r.role == "leader"), None)

    def by_group(self) -> list[GroupState]:
        """This record as one record a group: a Kubernetes launch holds every group's ranks
        (``RankState.group``), each group's record the launch's objects and id, and its own."""
        indices = sorted({r.group for r in self.ranks})
        if len(indices) < 2:
            return [self]
        return [
            self.model_copy(update={"group": g, "ranks": [r for r in self.ranks if r.group == g]})
            for g in indices
        ]

    def save(self) -> None:
        """Write this group into its deployment's record (``DeploymentState.put``)."""
        with DeploymentDir.of(self.deployment_name).locked():
            record = _read_record(self.deployment_name)
            if record is None:  # a launch of its own (a test, or a state being made)
                record = DeploymentState.of_group(self)
            record.put(self)
            record.write()


class DeploymentState(Launched):
    """Everything tandem knows about a deployment: its groups, its router, its revision."""

    schema_version: int = SCHEMA_VERSION
    name: str
    backend: str = Field(description="`local`, `ssh` or `k8s`.")
    model: str = Field(description="The model name clients send.")
    groups: list[GroupState] = Field(default_factory=list)
    router: RouterProcess | None = Field(
        default=None, description="vLLM's router in front of the groups (replicas, not k8s)."
    )
    revision: int | None = Field(
        default=None, description="The revision it runs (`tandem.operations.revisions`)."
    )
    ready: bool = Field(
        default=False, description="Every group answered (and the router through them)."
    )
    launcher: str | None = Field(
        default=None, description="The `up` that starts it (pid, start, boot) until it is ready."
    )
    holds: list[NodeHold] = Field(
        default_factory=list,
        description="What its plan holds on each node, recorded by `up` before anything "
        "starts: what a later `up` on the same nodes counts (`tandem.operations.admission`).",
    )
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))

    @model_validator(mode="before")
    @classmethod
    def _from_one_launch(cls, data: Any) -> Any:
        """A record of schema 1 was one launch: it becomes the deployment's group (or a
        LeaderWorkerSet's groups, by their ranks' ``group``: ``_one_record_a_group``)."""
        if not isinstance(data, dict) or "groups" in data or "endpoint" not in data:
            return data
        return {
            **{k: data[k] for k in ("name", "backend", "recipe", "cluster", "model") if k in data},
            "schema_version": SCHEMA_VERSION,
            "revision": data.get("revision"),
            "ready": data.get("ready", False),
            "created_at": data.get("created_at") or datetime.now(UTC),
            "groups": [{**data, "deployment_name": data["name"], "home": data["name"]}],
        }

    @model_validator(mode="after")
    def _one_record_a_group(self) -> DeploymentState:
        """A launch of several groups at once, as saved, is each of its groups."""
        self.groups = sorted((p for g in self.groups for p in g.by_group()), key=lambda g: g.group)
        return self

    @classmethod
    def of_group(cls, group: GroupState) -> DeploymentState:
        """The record of a deployment whose one group this is."""
        return cls(
            name=group.deployment_name,
            backend=group.backend,
            recipe=group.recipe,
            cluster=group.cluster,
            model=group.model,
            revision=group.revision,
            ready=group.ready,
        )

    @property
    def owner(self) -> str:
        return self.name

    @property
    def directory(self) -> DeploymentDir:
        return DeploymentDir.of(self.name)

    @property
    def endpoint(self) -> str:
        """Where clients send requests: the router, else the (one) group's leader."""
        if self.router is not None:
            return self.router.url
        return self.groups[0].endpoint if self.groups else ""

    def group(self, index: int) -> GroupState:
        """Group ``index``.

        Raises:
            StateError: it has no such group.
        """
        found = next((g for g in self.groups if g.group == index), None)
        if found is None:
            raise StateError(
                f"deployment '{self.name}' has no group {index} "
                f"(groups: {', '.join(str(g.group) for g in self.groups) or 'none'})",
                hint=f"`tandem status {self.name}` lists them",
            )
        return found

    def put(self, group: GroupState) -> None:
        """Add or replace ``group`` (by its index); a launch of several groups at once (a
        LeaderWorkerSet's) is put as each of its groups."""
        parts = group.by_group()
        indices = {p.group for p in parts}
        self.groups = sorted(
            [g for g in self.groups if g.group not in indices] + parts, key=lambda g: g.group
        )

    @property
    def launcher_pid(self) -> int | None:
        """The pid of the ``up`` that starts it, while it is not ready."""
        launcher = ProcessIdentity.parse(self.launcher) if self.launcher else None
        return launcher.pid if launcher else None

    def interrupted(self) -> bool:
        """Its ``up`` died before every group and the router were ready."""
        if self.ready or self.launcher is None:
            return False
        launcher = ProcessIdentity.parse(self.launcher)
        return launcher is None or launcher.find() is None

    def write(self) -> None:
        """Write atomically (a reader never sees half a file), private to the user (folder
        0700, file 0600), through the one writing path (``tandem.files``); the recipe's and
        cluster's secret names are hidden too (``HF_TOKEN: ...`` of an old state). Callers
        that read, change and write hold ``DeploymentDir.locked``."""
        path = self.directory.state_file
        files.private_dir(path.parent)
        redactor = Redactor.for_caller()
        files.write_json(
            path, redactor.data(self.model_dump(mode="json")), redactor=redactor, private=True
        )

    def save(self) -> None:
        """Write the deployment's own fields (router, revision, readiness); its groups stay as
        their own last save left them (``GroupState.save``), so a restart that a supervisor
        made meanwhile is kept. A record not yet on disk is written whole."""
        with self.directory.locked():
            saved = _read_record(self.name)
            if saved is not None:
                self.groups = saved.groups
            self.write()


def _read_record(name: str) -> DeploymentState | None:
    path = DeploymentDir.of(name).state_file
    if not path.is_file():
        return None
    return read_json(
        path,
        DeploymentState,
        what="deployment state",
        hint="remove the folder if the deployment is gone",
        error=StateError,
    )


def forget_group(group: GroupState) -> None:
    """Drop a group whose launch failed and left nothing from its deployment's record. A
    deployment that never became ready goes with its last group (no phantom of a failed
    ``up``); one that ran stays, for the restart, upgrade or ``down`` that is dealing with it."""
    directory = DeploymentDir.of(group.deployment_name)
    with directory.locked():
        record = _read_record(group.deployment_name)
        if record is None:
            return
        record.groups = [g for g in record.groups if g.group != group.group]
        if record.groups or record.ready or record.router is not None:
            record.write()
        else:
            directory.forget()


class _Fleet(BaseModel):
    """``fleet.json`` of an earlier release: a deployment with replicas, each group a
    deployment folder of its own (``NAME-gG``)."""

    name: str
    groups: list[str]
    model: str
    router: RouterProcess | None = None
    launcher: str | None = None
    ready: bool = False
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))


def _move_fleet(name: str) -> None:
    """Read an earlier release's fleet of ``name`` into one record (its groups keep their
    folders and logs, ``deployments/NAME-gG``), then remove the old records; a group whose
    record is gone is left out, as that release's ``status`` counted it down."""
    directory = DeploymentDir.of(name)
    fleet = read_json(
        directory.fleet_file,
        _Fleet,
        what="fleet state",
        hint=f"`tandem down {name}` stops what it names",
        error=StateError,
    )
    groups = [
        old.groups[0].model_copy(
            update={"deployment_name": name, "group": index, "home": group_name}
        )
        for index, group_name in enumerate(fleet.groups)
        if (old := _read_record(group_name)) is not None
    ]
    first = groups[0] if groups else None
    record = DeploymentState(
        name=name,
        backend=first.backend if first else "local",
        recipe=(first.recipe | {"name": name, "replicas": len(fleet.groups)}) if first else {},
        cluster=first.cluster if first else {},
        model=fleet.model,
        groups=groups,
        router=fleet.router,
        revision=first.revision if first else None,
        ready=fleet.ready,
        launcher=fleet.launcher,
        created_at=fleet.created_at,
    )
    record.write()
    for group_name in fleet.groups:
        if DeploymentDir.of(group_name).state_file.is_file():
            DeploymentDir.of(group_name).forget()
    ownership.remove_file(directory.fleet_file, root=state_root())


def list_deployments() -> list[str]:
    """Names of deployments that have state (an earlier release's fleet counted once)."""
    folder = deployments_root()
    if not folder.is_dir():
        return []
    for fleet in folder.glob("*/fleet.json"):
        with contextlib.suppress(StateError), DeploymentDir(fleet.parent).locked():
            if fleet.is_file():
                _move_fleet(fleet.parent.name)
    return sorted(p.name for p in folder.iterdir() if DeploymentDir(p).state_file.is_file())


def find_group(launch_name: str) -> GroupState | None:
    """The running record of the group whose processes carry ``launch_name``: a deployment's
    one group (its own name), or group G of one with replicas (``NAME-gG``)."""
    match = re.fullmatch(r"(.+)-g\d+", launch_name)
    for owner in ([match.group(1)] if match else []) + [launch_name]:
        if ownership.name_problem(owner):
            continue
        try:
            record = _read_record(owner)
        except StateError:
            continue
        found = next((g for g in record.groups if g.name == launch_name), None) if record else None
        if found is not None:
            return found
    return None


def owner_of(launch_name: str) -> str:
    """The deployment a launch name belongs to (``NAME-gG`` -> ``NAME`` when NAME's record
    has that group; else the name itself)."""
    found = find_group(launch_name)
    return found.deployment_name if found is not None else launch_name


def load_state(name: str | None = None) -> DeploymentState:
    """Read a deployment's state; with no name, the only deployment there is.

    Raises:
        StateError: no such deployment, several and none named, or an unreadable file.
    """
    names = list_deployments()
    if name is None:
        if len(names) != 1:
            raise StateError(
                "no deployment is running"
                if not names
                else f"several deployments exist ({', '.join(names)}); name one",
                hint="start one with `tandem up RECIPE`" if not names else "pass its name",
            )
        name = names[0]
    found = _read_record(ownership.check_name(name))
    if found is None:
        raise StateError(
            f"no deployment named '{name}' (known: {', '.join(names) or 'none'})",
            hint="`tandem status` lists every deployment",
        )
    return found
