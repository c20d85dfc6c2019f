"""What ran, each time: a deployment's revisions, so a change can be compared, gated and undone.

A revision belongs to the deployment, not to a group: every ``up`` that becomes ready records
one in the deployment's folder (``revisions/N.json``, kept by ``down``) holding what every group
runs: the recipe and cluster as applied (each group is cut from them,
``tandem.spec.deployment.groups``), the engine image, the model snapshot each node holds, the
tandem and vLLM versions, and each host's facts that break deployments when they change (kernel,
GPU driver, CUDA, NCCL, NIC firmware, as the preflight's node agent read them). Each group's
record says which revision it runs, so a rolling upgrade is "the groups whose revision is not
the target" (as SkyPilot's replicas carry their version).

A revision's ``outcome`` moves only through ``transition``: ``starting`` while an upgrade's gate
has not judged it, ``good`` once it answered (and passed the gate of an upgrade), ``failed`` when
its start or its gate failed (``reason`` says which check, with its evidence). ``tandem
history`` lists them with what changed between them; ``tandem check`` names a host fact that
changed since the last good revision; ``tandem upgrade`` gates a new revision, ``tandem
rollback`` goes back to an earlier one.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from tandem import files, ownership, screen
from tandem.backends.state import (
    DeploymentDir,
    DeploymentState,
    list_deployments,
    load_state,
    state_root,
)
from tandem.check.findings import CheckReport, Finding, Severity
from tandem.errors import StateError
from tandem.jsonfiles import differences, read_json, validation_text
from tandem.spec.deployment import Deployment
from tandem.version import TANDEM_VERSION

_FILE = re.compile(r"^(\d+)\.json$")
VALUE_CHARS = 120
"""The most of one value ``changes`` shows (a field of a revision may be megabytes)."""


class HostFacts(BaseModel):
    """The facts of one node whose change has broken working deployments (a new kernel broke
    RoCE memory registration; a driver or NCCL update changes the fabric)."""

    kernel: str | None = None
    driver: str | None = None
    cuda: str | None = None
    nccl: str | None = None
    vllm: str | None = None
    nic_firmware: dict[str, str] = Field(default_factory=dict)
    model_commit: str | None = None

    def named(self) -> dict[str, str]:
        """Each fact by its name in a message (``kernel``, ``NIC mlx5_0 firmware``...)."""
        found = {
            "kernel": self.kernel,
            "GPU driver": self.driver,
            "CUDA": self.cuda,
            "NCCL": self.nccl,
            "vLLM": self.vllm,
            "model snapshot": self.model_commit,
        }
        found |= {f"NIC {nic} firmware": fw for nic, fw in self.nic_firmware.items()}
        return {k: v for k, v in found.items() if v}

    def changes(self, now: HostFacts) -> list[tuple[str, str, str]]:
        """``(fact, was, now)`` of each fact named both here and in ``now`` that differs."""
        was, new = self.named(), now.named()
        return [(f, was[f], new[f]) for f in sorted(set(was) & set(new)) if was[f] != new[f]]


def host_facts(facts: dict[str, Any]) -> HostFacts:
    """A node's ``HostFacts`` from the probe's facts (``tandem.agent``)."""
    section = lambda name: facts.get(name) or {}  # noqa: E731 - a probe section may be None
    packages = section("software").get("packages") or {}
    nccl = next((v for k, v in packages.items() if k.startswith("nvidia-nccl")), None)
    return HostFacts(
        kernel=section("system").get("kernel"),
        driver=section("gpu").get("driver_version"),
        cuda=section("gpu").get("cuda_version"),
        nccl=nccl,
        vllm=section("software").get("vllm_version"),
        nic_firmware={
            d["name"]: d["fw_ver"]
            for d in section("rdma").get("devices") or []
            if d.get("name") and d.get("fw_ver")
        },
        model_commit=section("model").get("commit"),
    )


class RevisionOutcome(StrEnum):
    STARTING = "starting"
    GOOD = "good"
    FAILED = "failed"


class Revision(BaseModel):
    """One revision of a deployment: what every group of it ran, and how it ended."""

    schema_version: int = 2
    number: int
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    recipe: dict[str, Any] = Field(description="The whole deployment's recipe, as applied.")
    cluster: dict[str, Any] = Field(description="The whole deployment's cluster, as applied.")
    image: str | None = None
    tandem_version: str = TANDEM_VERSION
    hosts: dict[str, HostFacts] = Field(
        default_factory=dict, description="Node -> its facts; empty when no preflight ran."
    )
    outcome: RevisionOutcome = RevisionOutcome.STARTING
    reason: str = ""
    baseline: dict[str, float] = Field(
        default_factory=dict,
        description="The gate's bench figures on this revision (TPOT, throughput), once measured.",
    )
    answers: str | None = Field(
        default=None,
        description="Its answers reference, once recorded (``N.answers.json`` beside this file): "
        "how many answers, and whether they can judge another revision.",
    )
    answers_checked: str | None = Field(
        default=None,
        description="The gate's answers check that passed it: against which revision's "
        "reference, and its verdict.",
    )

    def deployment(self, name: str) -> Deployment:
        """The deployment this revision ran (to roll back to it).

        Raises:
            StateError: the saved recipe or cluster fails today's checks.
        """
        try:
            return Deployment.model_validate({"recipe": self.recipe, "cluster": self.cluster})
        except ValidationError as exc:
            raise StateError(
                f"revision {self.number} of '{name}' fails today's checks and cannot be started "
                f"again: {validation_text(exc)}",
                file=str(folder(name).revisions / f"{self.number}.json"),
                hint=f"`tandem up` a fixed recipe of '{name}' instead",
            ) from exc


MARKER = "upgrade.json"
"""In the deployment's folder while ``tandem upgrade`` runs: a killed upgrade leaves it."""


class UpgradeMarker(BaseModel):
    """What an upgrade in progress writes, so a killed one can be named."""

    from_revision: int
    phase: str


def mark_upgrade(name: str, from_revision: int, phase: str) -> None:
    """Say that an upgrade of ``name`` from ``from_revision`` is in ``phase`` (the marker,
    private like the rest of the deployment's state, removed by ``clear_upgrade``)."""
    marker = UpgradeMarker(from_revision=from_revision, phase=phase)
    files.write_json(folder(name).path / MARKER, marker, private=True)


def clear_upgrade(name: str) -> None:
    """The upgrade of ``name`` ended (or a rollback replaced it): remove its marker."""
    ownership.remove_file(folder(name).path / MARKER, root=state_root())


def interrupted_upgrade(name: str) -> UpgradeMarker | None:
    """The marker a killed upgrade of ``name`` left, if any."""
    path = folder(name).path / MARKER
    if not path.exists():
        return None
    return read_json(path, UpgradeMarker, what="upgrade marker", hint="remove it", error=StateError)


def folder(name: str) -> DeploymentDir:
    return DeploymentDir.of(name)


def history(name: str) -> list[Revision]:
    """Every revision of deployment ``name``, oldest first.

    Raises:
        StateError: no deployment of that name runs or has revisions, or its revisions folder
            is no folder.
    """
    where = folder(name).revisions
    if where.exists() and not where.is_dir():
        raise StateError(
            f"{where} should hold the revisions of '{name}' and is no folder",
            file=str(where),
            hint="move it away; tandem records the next revision there",
        )
    if not where.is_dir():
        if name not in (known := list_deployments()):
            raise StateError(
                f"no deployment named '{name}' (known: {', '.join(known) or 'none'})",
                hint="`tandem status` lists every deployment",
            )
        return []
    numbered = sorted((int(m.group(1)), p) for p in where.iterdir() if (m := _FILE.match(p.name)))
    return [read_json(p, Revision, what="revision", hint="remove the file") for _, p in numbered]


def reference_file(name: str, number: int) -> Path:
    """Where revision ``number``'s answers reference is kept (``tandem.eval.reference``):
    beside its record, recorded when an upgrade first leaves it."""
    return folder(name).revisions / f"{number}.answers.json"


def save(name: str, revision: Revision) -> Revision:
    where = files.private_dir(folder(name).revisions)
    files.write_json(where / f"{revision.number}.json", revision, private=True)
    return revision


def record(
    deployment: Deployment,
    hosts: dict[str, dict[str, Any]],
    *,
    outcome: RevisionOutcome = RevisionOutcome.GOOD,
) -> Revision:
    """Record what is about to run (or just ran) as the deployment's next revision; ``hosts``
    are the preflight's facts of every node of every group."""
    revision = Revision(
        number=next_number(deployment.name),
        recipe=deployment.recipe.model_dump(mode="json"),
        cluster=deployment.cluster.model_dump(mode="json"),
        image=deployment.recipe.engine.image,
        hosts={n: host_facts(f) for n, f in hosts.items()},
        outcome=outcome,
    )
    return save(deployment.name, revision)


def next_number(name: str) -> int:
    """The number the deployment's next revision gets."""
    where = folder(name).revisions
    if not where.is_dir():
        return 1
    numbers = [int(m.group(1)) for p in where.iterdir() if (m := _FILE.match(p.name))]
    return max(numbers, default=0) + 1


def transition(name: str, revision: Revision, to: RevisionOutcome, reason: str = "") -> Revision:
    """The one way a revision's outcome changes: set, with its reason, and saved."""
    revision.outcome = to
    revision.reason = reason
    return save(name, revision)


def current(state: DeploymentState) -> Revision | None:
    """The revision the running deployment is (the state names it)."""
    return next((r for r in history(state.name) if r.number == state.revision), None)


def running_groups(name: str) -> dict[int, list[int]]:
    """Revision -> the groups of ``name`` that run it now (empty when it does not run)."""
    if name not in list_deployments():
        return {}
    found: dict[int, list[int]] = {}
    for group in load_state(name).groups:
        if group.revision is not None:
            found.setdefault(group.revision, []).append(group.group)
    return found


def last_good(name: str) -> Revision | None:
    try:
        known = history(name)
    except StateError:
        return None
    return next((r for r in reversed(known) if r.outcome is RevisionOutcome.GOOD), None)


def revision(name: str, number: int) -> Revision:
    """Revision ``number`` of ``name``.

    Raises:
        StateError: there is none.
    """
    known = history(name)
    found = next((r for r in known if r.number == number), None)
    if found is None:
        numbers = ", ".join(str(r.number) for r in known) or "none"
        raise StateError(
            f"deployment '{name}' has no revision {number} (known: {numbers})",
            hint=f"`tandem history {name}` lists them",
        )
    return found


def changes(old: Revision, new: Revision) -> list[str]:
    """What differs from ``old`` to ``new``: recipe and cluster fields by dotted path (each
    value cut to ``VALUE_CHARS``, its length said), the image, and each host's facts."""
    found = [
        f"{path}: {screen.shown(repr(a), VALUE_CHARS)} -> {screen.shown(repr(b), VALUE_CHARS)}"
        for part in ("recipe", "cluster")
        for path, a, b in differences(getattr(old, part), getattr(new, part), part)
    ]
    return found + [
        f"{fact} {was} -> {now} on {node}"
        for node in sorted(set(old.hosts) & set(new.hosts))
        for fact, was, now in old.hosts[node].changes(new.hosts[node])
    ]


def host_changes(name: str, report: CheckReport) -> list[Finding]:
    """A warning for each host fact that changed since the deployment's last good revision
    ("kernel 6.17.0-1026 -> 7.0.0-1019 on spark-102 since revision 3")."""
    good = last_good(name)
    if good is None:
        return []
    return [
        Finding(
            rule="host-changed",
            severity=Severity.WARNING,
            node=node,
            message=f"{fact} {was} -> {now} on {node} since revision "
            f"{good.number}, the last good one",
            evidence=f"revision {good.number} recorded {fact} {was}",
            fix="if the deployment misbehaves, this change is the first suspect; "
            "`tandem history` lists what ran before",
        )
        for node, facts in report.nodes.items()
        if node in good.hosts
        for fact, was, now in good.hosts[node].changes(host_facts(facts))
    ]
