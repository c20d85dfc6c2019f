"""The deployment's health verdict for a sample: one function, so the health model plugs in here.

Until ``tandem.health`` (issue 12) adds ``verdict`` to ``DeploymentStatus``, the verdict is
``healthy`` when the leader answers ``/health`` and ``down`` otherwise. When it lands, the body
becomes ``return Verdict(status.verdict)``.
"""

from __future__ import annotations

from tandem.lifecycle import DeploymentStatus
from tandem.watch.sample import Verdict


def deployment_verdict(status: DeploymentStatus) -> Verdict:
    """The verdict of ``tandem.lifecycle.status(name)``'s result."""
    return Verdict.HEALTHY if status.healthy else Verdict.DOWN
