"""What was measured of each revision: the bench, smoke and eval runs made against a deployment.

A status page (``tandem dashboard``) shows, beside a revision, the last bench, smoke check and
eval run of *that* revision, with a link to its report, so that a figure from before an upgrade
is never shown as the current one's. Each command that measures a named deployment into an
``--out`` folder appends one line to the deployment's ``evidence.jsonl`` (``record``), with the
revision that ran then; a deployment with replicas gets the line in each group's folder, with
that group's revision. ``latest`` reads back the newest line of each kind for a revision.

The file is kept by ``down`` (as ``revisions/`` is): a revision's evidence outlives its run.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from tandem import files
from tandem.backends.state import (
    DeploymentDir,
    fleet_exists,
    list_deployments,
    load_fleet,
    load_state,
)

EVIDENCE_FILE = "evidence.jsonl"
Kind = Literal["bench", "smoke", "eval"]
KINDS: tuple[Kind, ...] = ("bench", "smoke", "eval")


class Evidence(BaseModel):
    """One measurement of a running revision: one line of ``evidence.jsonl``."""

    kind: Kind
    revision: int | None = Field(description="The revision that ran; None: not recorded.")
    at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    folder: str = Field(description="The run's --out folder, as given (absolute).")
    report: str | None = Field(
        default=None, description="Its report to open (report.html, report.md), if written."
    )
    summary: str = Field(default="", description="One line: its headline figures or verdict.")
    passed: bool | None = Field(default=None, description="Its own verdict, where it has one.")


def _path(name: str) -> Path:
    return DeploymentDir.of(name).path / EVIDENCE_FILE


def record(
    name: str,
    kind: Kind,
    folder: Path,
    *,
    summary: str = "",
    passed: bool | None = None,
    report: str | None = None,
) -> list[Path]:
    """Append the run in ``folder`` to the evidence of deployment ``name`` (each group's, with
    replicas), with the revision each runs now; the files written. A name tandem does not run
    (a bare ``--url``) records nothing."""
    groups = load_fleet(name).groups if fleet_exists(name) else [name]
    running = set(list_deployments())
    written = []
    for group in (g for g in groups if g in running):
        line = Evidence(
            kind=kind,
            revision=load_state(group).revision,
            folder=str(Path(folder).resolve()),
            report=str((Path(folder) / report).resolve()) if report else None,
            summary=summary,
            passed=passed,
        )
        with files.LineLog(_path(group), private=True) as log:
            log.write_json(line)
        written.append(_path(group))
    return written


def latest(name: str, revision: int | None) -> dict[str, Evidence]:
    """Kind -> the newest evidence of ``revision`` of deployment ``name`` (a line that no
    longer reads is skipped: this is a display, not a record to repair)."""
    path = _path(name)
    found: dict[str, Evidence] = {}
    if revision is None or not path.is_file():
        return found
    for line in path.read_text(errors="replace").splitlines():
        try:
            item = Evidence.model_validate_json(line)
        except ValidationError:
            continue
        if item.revision == revision:
            found[item.kind] = item
    return found
