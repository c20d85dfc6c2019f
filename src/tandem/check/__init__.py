"""The parts of the preflight: the node probe, the rules that judge its facts, the fabric test.

Public surface: ``CheckReport``, ``Finding``, ``Severity``, ``RULES`` (every rule),
``NodeTransport`` (what a cluster transport implements to be checked). The probe itself is
``tandem/check/probe.py``, a stdlib-only script shipped to the nodes. The one call that runs
them all over a deployment's nodes is ``tandem.preflight.run_check``, above the backends.
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
