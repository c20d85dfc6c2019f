"""The preflight rules: pure functions of a deployment and the facts of its nodes.

Each rule is a small class with a ``name`` and one method, ``check(context)``, that yields
findings (rich's composition: many small named units instead of one function with flags).
``RULES`` lists them in the order a report shows them; ``evaluate`` runs them all. No rule does
I/O: the facts come from the node agent (``tandem.agent facts``) through a transport, the
environment from the rank plan, and the memory need from ``tandem plan`` when it is installed.

Modules by what a rule looks at: ``software`` (probe, versions, image, model, environment),
``network`` (interfaces, MTU, RoCE GIDs, ports, rendezvous), ``host`` (memory, desktop, shm,
clocks), ``host_faults`` (the known-bad kernel, BIOS link width, RoCE twins, MTU, nccl.conf),
``cache`` (the ranks' compile caches); ``context`` holds what they all read.
"""

from __future__ import annotations

from collections.abc import Iterable

from tandem.check.findings import Finding
from tandem.check.rules.cache import CacheParityRule
from tandem.check.rules.context import CheckContext, Rule
from tandem.check.rules.host import ClockSkewRule, GuiRule, MemoryHeadroomRule, PlanFitRule, ShmRule
from tandem.check.rules.host_faults import (
    CmaZeroRule,
    MissingTwinRule,
    NarrowTwinRule,
    SmallMtuRule,
    StaleNcclConfRule,
)
from tandem.check.rules.network import (
    AddressOnNodeRule,
    InterfaceRule,
    LoopbackMasterRule,
    MtuRule,
    OpenApiRule,
    PortsRule,
    RoceGidRule,
)
from tandem.check.rules.software import (
    ImagePresentRule,
    KnownBadEnvRule,
    ModelSnapshotRule,
    ProbeFailedRule,
    VersionSkewRule,
    VllmVersionRule,
)

RULES: tuple[Rule, ...] = (
    ProbeFailedRule(),
    VersionSkewRule(),
    VllmVersionRule(),
    ImagePresentRule(),
    ModelSnapshotRule(),
    InterfaceRule(),
    AddressOnNodeRule(),
    MtuRule(),
    RoceGidRule(),
    MissingTwinRule(),
    SmallMtuRule(),
    NarrowTwinRule(),
    CmaZeroRule(),
    PlanFitRule(),
    MemoryHeadroomRule(),
    GuiRule(),
    KnownBadEnvRule(),
    StaleNcclConfRule(),
    PortsRule(),
    ShmRule(),
    LoopbackMasterRule(),
    OpenApiRule(),
    ClockSkewRule(),
    CacheParityRule(),
)
"""Every rule, in report order."""


def evaluate(ctx: CheckContext, rules: Iterable[Rule] = RULES) -> list[Finding]:
    """Run every rule; errors first, then warnings, then info, each in rule order."""
    findings = [f for rule in rules for f in rule.check(ctx)]
    return sorted(findings, key=lambda f: f.severity.rank)


__all__ = ["RULES", "CheckContext", "Rule", "evaluate"]
