"""The parts of the preflight: the rules that judge a node's facts, the fabric test.

Public surface: ``CheckReport``, ``Finding``, ``Severity``, ``RULES`` (every rule),
``NodeTransport`` (what a cluster transport implements to be checked). The facts come from the
node agent's ``facts`` call (``tandem/agent.py``, a stdlib-only script shipped to the nodes,
which also observes a running deployment). The one call that runs
them all over a deployment's nodes is ``tandem.operations.preflight.run_check``, above the backends.
"""

from tandem.check.findings import CheckReport, Finding, Severity
from tandem.check.node_transport import NodeTransport, ProbeError
from tandem.check.rules import RULES, CheckContext, evaluate

__all__ = [
    "RULES",
    "CheckContext",
    "CheckReport",
    "Finding",
    "NodeTransport",
    "ProbeError",
    "Severity",
    "evaluate",
]
