"""Every deployment tandem knows, one line each: what ``tandem status`` shows without a name
when there is not exactly one (``sky status``, ``docker compose ls``).

A deployment with replicas is one line (its groups, ``NAME-gG``, are not listed apart); a
deployment whose state cannot be read or judged is still listed, with the reason, so that one
broken folder never hides the others.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from tandem.backends.state import fleet_exists, fleet_of, list_deployments, state_root
from tandem.errors import TandemError
from tandem.operations import fleet
from tandem.operations.health import Verdict


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


def deployment_names() -> list[str]:
    """Each deployment once: the ones with replicas by their own name, the rest as they are."""
    folder = state_root() / "deployments"
    fleets = (
        sorted(p.name for p in folder.iterdir() if fleet_exists(p.name)) if folder.is_dir() else []
    )
    alone = [name for name in list_deployments() if fleet_of(name) is None and name not in fleets]
    return sorted(fleets + alone)


def every_deployment(*, canary_timeout_s: float = 5.0) -> list[DeploymentLine]:
    """A line for each deployment, judged as ``tandem status NAME`` judges it."""
    lines = []
    for name in deployment_names():
        try:
            status = fleet.status(name, canary_timeout_s=canary_timeout_s)
        except TandemError as exc:
            lines.append(DeploymentLine(name=name, error=str(exc)))
            continue
        lines.append(
            DeploymentLine(
                name=status.name,
                backend=status.backend,
                endpoint=status.router.url if status.router else status.endpoint,
                model=status.model,
                verdict=status.verdict,
                revision=status.revision,
                groups=max(len(status.groups), 1) if status.router else 1,
            )
        )
    return lines
