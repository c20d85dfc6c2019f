"""Preflight: probe every node of a deployment, judge the facts, and test the fabric.

Public surface: ``run_check`` (the one call), ``CheckReport``, ``Finding``, ``Severity``,
``RULES`` (every rule), ``NodeTransport`` (what a cluster transport implements to be checked).
The probe itself is ``tandem/check/probe.py``, a stdlib-only script shipped to the nodes.
"""

from tandem.check.findings import CheckReport, Finding, Severity
from tandem.check.preflight import run_check
from tandem.check.rules import RULES, CheckContext, evaluate
from tandem.check.transport import NodeTransport, ProbeError

__all__ = [
    "RULES",
    "CheckContext",
    "CheckReport",
    "Finding",
    "NodeTransport",
    "ProbeError",
    "Severity",
    "evaluate",
    "run_check",
]
