"""What was measured of each revision: the bench, smoke and eval runs made against a deployment.

A status page (``tandem dashboard``) shows, beside a revision, the last bench, smoke check and
eval run of *that* revision, with a link to its report, so that a figure from before an upgrade
is never shown as the current one's. Each command that measures a named deployment into an
``--out`` folder appends one line to the deployment's ``evidence.jsonl`` (``record``), with the
revision that ran then: the deployment's for a run through its front door (a bench, an eval),
the group's for a run at one group's leader (each group's smoke checks; during a rolling
upgrade two groups may run two revisions). ``latest`` reads back the newest line of each kind
for a group's revision.

The file is kept by ``down`` (as ``revisions/`` is): a revision's evidence outlives its run.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from tandem import files
from tandem.backends.state import DeploymentDir, list_deployments, load_state

EVIDENCE_FILE = "evidence.jsonl"
Kind = Literal["bench", "smoke", "eval"]
KINDS: tuple[Kind, ...] = ("bench", "smoke", "eval")


class Evidence(BaseModel):
    """One measurement of a running revision: one line of ``evidence.jsonl``."""

    kind: Kind
    revision: int | None = Field(description="The revision that ran; None: not recorded.")
    group: int | None = Field(
        default=None, description="The group it measured; None: the whole deployment."
    )
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
    group: int | None = None,
    summary: str = "",
    passed: bool | None = None,
    report: str | None = None,
) -> Path | None:
    """Append the run in ``folder`` to the evidence of deployment ``name`` (of its ``group``,
    or of the whole deployment), with the revision it runs now; the file written, None for a
    name tandem does not run (a bare ``--url``)."""
    if name not in list_deployments():
        return None
    state = load_state(name)
    line = Evidence(
        kind=kind,
        revision=state.group(group).revision if group is not None else state.revision,
        group=group,
        folder=str(Path(folder).resolve()),
        report=str((Path(folder) / report).resolve()) if report else None,
        summary=summary,
        passed=passed,
    )
    with files.LineLog(_path(state.name), private=True) as log:
        log.write_json(line)
    return _path(state.name)


def latest(name: str, revision: int | None, group: int | None = None) -> dict[str, Evidence]:
    """Kind -> the newest evidence of ``revision`` of deployment ``name``: of the whole
    deployment, or of ``group`` (a line that no longer reads is skipped: this is a display,
    not a record to repair)."""
    path = _path(name)
    found: dict[str, Evidence] = {}
    if revision is None or not path.is_file():
        return found
    for line in path.read_text(errors="replace").splitlines():
        try:
            item = Evidence.model_validate_json(line)
        except ValidationError:
            continue
        if item.revision == revision and item.group in (None, group):
            found[item.kind] = item
    return found
