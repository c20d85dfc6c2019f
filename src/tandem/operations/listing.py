"""Every deployment tandem knows, one line each: what ``tandem status`` shows without a name
when there is not exactly one (``sky status``, ``docker compose ls``).

A deployment with replicas is one line (one record holds its groups); a deployment whose state
cannot be read or judged is still listed, with the reason, so that one broken folder never
hides the others.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from tandem.backends.state import list_deployments
from tandem.errors import TandemError
from tandem.operations import lifecycle
from tandem.operations.admission import others, recorded_holds
from tandem.operations.health import Verdict
from tandem.plan.ledger import HostLedger, NodeHold, ledgers


class DeploymentLine(BaseModel):
    """One deployment as ``tandem status --all --json`` lists it."""

    name: str
    backend: str | None = None
    endpoint: str | None = None
    model: str | None = None
    verdict: Verdict | None = Field(default=None, description="None when it could not be judged.")
    revision: int | None = None
    groups: int = Field(default=1, description="Groups behind the router (replicas), else 1.")
    error: str | None = Field(default=None, description="Why it could not be judged.")
    holds: list[NodeHold] = Field(
        default_factory=list, description="What its plan holds on each of its nodes."
    )


def every_deployment(*, canary_timeout_s: float = 5.0) -> list[DeploymentLine]:
    """A line for each deployment, judged as ``tandem status NAME`` judges it."""
    lines = []
    for name in list_deployments():
        try:
            status = lifecycle.status(name, canary_timeout_s=canary_timeout_s)
        except TandemError as exc:
            lines.append(DeploymentLine(name=name, error=str(exc)))
            continue
        lines.append(
            DeploymentLine(
                name=status.name,
                backend=status.backend,
                endpoint=status.endpoint,
                model=status.model,
                verdict=status.verdict,
                revision=status.revision,
                groups=max(len(status.groups), 1),
                holds=[h for lg in status.ledger for h in lg.holds if h.deployment == status.name],
            )
        )
    return lines


def every_ledger() -> list[HostLedger]:
    """The memory of every host a deployment recorded here draws on, with what each holds."""
    return ledgers(h for state in others() for h in recorded_holds(state))
