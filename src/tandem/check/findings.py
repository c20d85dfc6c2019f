"""What a check reports: findings (pip's diagnostic shape) and the report that holds them.

A finding is one fault or risk on one node (or on the cluster as a whole), with a stable
kebab-case ``rule`` id, a ``severity``, a one-line ``message``, the ``evidence`` read from the
nodes' facts, and the ``fix``. ``CheckReport`` is what ``tandem check --json`` prints:
``{"nodes": {NODE: facts}, "findings": [...], "fabric": {...}}``.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field


class Severity(StrEnum):
    """How bad a finding is.

    - ``error``: the deployment will fail or hang; ``tandem up`` refuses to launch.
    - ``warning``: it will probably run, but slower, with less memory, or fragile.
    - ``info``: a resolved fact worth knowing (e.g. the RoCE v2 GID index per HCA).
    """

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"

    @property
    def rank(self) -> int:
        """Report order: errors (0) first, then warnings, then info."""
        return list(Severity).index(self)


class Finding(BaseModel):
    """One fault found by a rule, with the facts that show it and how to fix it."""

    rule: str = Field(description="Stable kebab-case id of the rule, e.g. `roce-gid-index`.")
    severity: Severity
    node: str | None = Field(
        default=None,
        description="The node it concerns; null for the "
        "cluster as a whole (e.g. a version that differs between nodes).",
    )
    message: str = Field(description="One line: what is wrong.")
    evidence: str = Field(description="The facts that show it, as read from the nodes.")
    fix: str = Field(description="What to do about it.")

    def render(self) -> str:
        """pip-style text: ``error[rule]: message`` then evidence and fix, indented."""
        where = f" on {self.node}" if self.node else ""
        return (
            f"{self.severity.value}[{self.rule}]{where}: {self.message}\n"
            f"  evidence: {self.evidence}\n  fix: {self.fix}"
        )


FATAL_RULES = frozenset(
    {
        "model-snapshot-missing",
        "model-not-cache-layout",
        "model-snapshot-incomplete",
        "model-snapshot-corrupt",
    }
)
"""Rules whose error no launch survives: ``--skip-checks`` is never offered for them."""


class CheckReport(BaseModel):
    """Facts of every node, the findings of every rule, and the fabric test's result."""

    schema_version: int = 1
    deployment: str
    nodes: dict[str, dict[str, Any]] = Field(description="Node name -> the probe's facts.")
    findings: list[Finding] = Field(default_factory=list)
    fabric: dict[str, Any] = Field(
        default_factory=dict,
        description="The fabric test's result (`FabricResult`), empty when it did not run.",
    )

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity is Severity.ERROR]

    @property
    def ok(self) -> bool:
        """True when no finding is an error."""
        return not self.errors

    @property
    def refusal_hint(self) -> str:
        """The fix a refused preflight names: each finding's own, and ``--skip-checks`` only
        when no error is one that no launch survives (a model that is not there: the ranks
        would fail to load it, so skipping the check only moves the failure later)."""
        if any(f.rule in FATAL_RULES for f in self.errors):
            return "fix them: each finding's fix line says how"
        return (
            "fix them (each finding's fix line says how), or pass --skip-checks to `tandem up` "
            "for a finding you know does not apply"
        )
