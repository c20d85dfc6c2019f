"""The deployment's health verdict for a sample: one function, so the health model plugs in here.

The verdict is ``tandem.health``'s, as ``tandem.lifecycle.status`` reports it; ``tandem watch``
and ``tandem supervise`` therefore cannot disagree about a deployment.
"""

from __future__ import annotations

from tandem.lifecycle import DeploymentStatus
from tandem.watch.sample import Verdict


def deployment_verdict(status: DeploymentStatus) -> Verdict:
    """The verdict of ``tandem.lifecycle.status(name)``'s result."""
    return Verdict(status.verdict)
