"""What a status adds for a person looking at a group: serving figures, nodes, identity, events.

``tandem status`` judges a group from one look at its nodes and one at its leader
(``tandem.operations.health``). A status page (``tandem dashboard``) shows more of that same
observation, so it is carried in the status itself (``GroupStatus.overview``) and printed by
``tandem status --json`` too, never gathered a second way:

- ``serving``: the leader's ``/metrics`` page that the verdict's scrape brought, read whole
  (``tandem.vllm_metrics.parse_serving``); two observations give rates and percentiles;
- ``nodes``: each node's readings from the same node-agent call that listed the ranks'
  processes (memory from ``/proc/meminfo``, nvidia-smi, RDMA counters), when asked for;
- ``models``: what the leader's ``/v1/models`` lists as it answers (the only extra request);
- the deployment's own records, read at the same moment: its revision (``revisions``), the
  model files verified on each node (``backends.snapshots``), the bench, smoke and eval runs of
  that revision (``evidence``), and the tail of ``events.log`` (the supervisor's restarts,
  stalls, membership changes and upgrades).

This module also owns the line format of ``events.log`` as a reader sees it (``parse_event``),
which ``tandem watch`` uses too.
"""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from tandem import wire
from tandem.backends import snapshots
from tandem.backends.base import Look, NodeFacts
from tandem.backends.state import DeploymentState, GroupState
from tandem.endpoint import Endpoint
from tandem.errors import EndpointError, TandemError
from tandem.operations import revisions
from tandem.operations.evidence import Evidence, latest
from tandem.operations.health import Assessment
from tandem.vllm_metrics import ServingReading, parse_serving

EVENTS_SHOWN = 40
"""The newest events.log lines a status carries."""

_LINE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)\s+(.*)$")
_RESTART = re.compile(r"^restart \d+/\d+ in ")


class Event(BaseModel):
    """A line of the deployment's events.log (``tandem supervise``, ``tandem upgrade``)."""

    model_config = ConfigDict(extra="forbid")

    time: datetime
    text: str
    restart: bool = Field(default=False, description="The line announces a group restart.")


def parse_event(line: str, prefix: str = "") -> Event | None:
    """One events.log line (``2026-12-01T08:00:00Z  text``) -> an Event; None for a line
    without a timestamp, or whose text does not start with ``prefix``: a group's lines
    (``group G: text``, from its supervisor) read as that group's own, without it. Pure."""
    match = _LINE.match(line.rstrip("\n"))
    if not match or not match[2].startswith(prefix):
        return None
    stamp = datetime.strptime(match[1], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    text = match[2].removeprefix(prefix).lstrip()
    return Event(time=stamp, text=text, restart=bool(_RESTART.match(text)))


def read_events(
    path: Path, *, group: int | None = None, last: int = EVENTS_SHOWN
) -> tuple[list[Event], int]:
    """The newest ``last`` events of an events.log and its restarts in all (none: no file).

    ``group``: of a deployment of several groups, only that group's lines (its supervisor
    writes them as ``group G: text``), without the prefix.
    """
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return [], 0
    prefix = "" if group is None else f"group {group}: "
    events = [e for line in text.splitlines() if (e := parse_event(line, prefix))]
    return events[-last:], sum(e.restart for e in events)


class Identity(BaseModel):
    """What runs: the revision and what it was made of, and what was measured of it."""

    revision: int | None = None
    outcome: str | None = Field(default=None, description="The revision's: good, starting...")
    recorded_at: datetime | None = None
    image: str | None = Field(default=None, description="The engine image, as the recipe names it.")
    tandem_version: str | None = None
    vllm_version: dict[str, str] = Field(
        default_factory=dict, description="Node -> the vLLM its preflight found."
    )
    model_commit: dict[str, str] = Field(
        default_factory=dict, description="Node -> the model snapshot's commit it holds."
    )
    model_verified: dict[str, bool] = Field(
        default_factory=dict,
        description="Node -> whether tandem read its model files and found each one's Hub id.",
    )
    host_changes: list[str] = Field(
        default_factory=list,
        description="Host facts changed since the revision before it (kernel, driver, NCCL...).",
    )
    evidence: dict[str, Evidence] = Field(
        default_factory=dict, description="bench, smoke, eval -> the newest run of this revision."
    )
    answers_checked: str | None = Field(
        default=None,
        description="Whether this revision's answers were checked, from its revision record: "
        "the gate's answers verdict that passed it, or its own reference once recorded.",
    )


class GroupOverview(BaseModel):
    """One group as the observation showed it, beyond its verdict."""

    observed_at: datetime
    canary: str = Field(default="skipped", description="ok, timeout, error or skipped.")
    canary_s: float | None = None
    serving: ServingReading | None = Field(
        default=None, description="The leader's /metrics; None: it did not answer."
    )
    models: list[str] | None = Field(
        default=None, description="The leader's /v1/models; None: it did not answer."
    )
    nodes: list[NodeFacts] = Field(
        default_factory=list, description="Each node's readings (status --nodes)."
    )
    identity: Identity = Field(default_factory=Identity)
    events: list[Event] = Field(default_factory=list, description="events.log's newest lines.")
    restarts: int = Field(default=0, description="Group restarts in events.log.")


def served_models(url: str, *, timeout_s: float = 3.0) -> list[str] | None:
    """The ids ``url``'s ``/v1/models`` lists now (with the caller's API key); None when it
    does not answer."""
    if not url:
        return None
    try:
        with Endpoint(url, api_key=os.environ.get(wire.VLLM_API_KEY)) as server:
            return [m.id for m in server.models(timeout_s=timeout_s)]
    except EndpointError:
        return None


def identity_of(state: DeploymentState, group: GroupState) -> Identity:
    """The revision ``group`` runs, what it recorded, and what was measured of it."""
    known = revisions.history(state.name)
    current = next((r for r in known if r.number == group.revision), None)
    if current is None:
        return Identity(revision=group.revision)
    earlier = [r for r in known if r.number < current.number]
    changed = revisions.changes(earlier[-1], current) if earlier else []
    try:
        verified = {
            node: any(repos.values())
            for node, repos in snapshots.known(group.deployment(lenient=True)).items()
        }
    except TandemError:  # an unreadable record of verified blobs: say nothing rather than fail
        verified = {}
    return Identity(
        revision=current.number,
        outcome=str(current.outcome),
        recorded_at=current.created_at,
        image=current.image,
        tandem_version=current.tandem_version,
        vllm_version={n: h.vllm for n, h in current.hosts.items() if h.vllm},
        model_commit={n: h.model_commit for n, h in current.hosts.items() if h.model_commit},
        model_verified=verified,
        host_changes=[
            c for c in changed if " on " in c and not c.startswith(("recipe", "cluster"))
        ],
        evidence=latest(state.name, current.number, group.group),
        answers_checked=current.answers_checked
        or (f"reference recorded: {current.answers}" if current.answers else None),
    )


def group_overview(
    state: DeploymentState, group: GroupState, report: Assessment, look: Look, endpoint: str
) -> GroupOverview:
    """The overview of ``group`` of ``state``, from the look and the verdict ``report`` that
    judged it (its scrape of the leader at ``endpoint``), and the deployment's records."""
    text = report.api.metrics_text
    several = len(state.groups) > 1
    events, restarts = read_events(state.directory.events, group=group.group if several else None)
    return GroupOverview(
        observed_at=report.checked_at,
        canary=report.api.canary,
        canary_s=report.api.canary_s,
        serving=parse_serving(text) if text is not None else None,
        models=served_models(endpoint) if report.api.answers else None,
        nodes=list(look.nodes.values()),
        identity=identity_of(state, group),
        events=events,
        restarts=restarts,
    )
