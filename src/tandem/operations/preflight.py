"""The preflight of a deployment (``tandem check``, and ``tandem up`` before it launches):
probe every node, run the rules, optionally the fabric test.

An orchestrator, a peer of ``tandem.operations.lifecycle``: it builds network namespaces
(``tandem.backends.netns``), picks each cluster's node transport and asks the planner, so it
sits above the backends; the pure parts it drives (rules, findings, the probe, the fabric
ranks) are ``tandem.check``.

Steps, in order:

1. plan the ranks (``tandem.rankplan``); a deployment that cannot work becomes ``plan-invalid``
   findings, and the rules still run on the recipe's own environment;
2. for a local cluster of network namespaces, enter the nodes: the deployment's own
   namespaces when it is running, else a throw-away set built by ``tandem.backends.netns``
   under a unique name and removed at the end;
3. probe every node in parallel through the cluster's node transport;
4. ask ``tandem plan`` for the memory each node needs;
5. evaluate the rules; with ``fabric``, run the all-reduce across the ranks.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tandem import caches, wire
from tandem.backends import netns, snapshots
from tandem.backends.k8s_check import KubernetesNodeTransport
from tandem.backends.ssh_check import SSHNodeTransport
from tandem.backends.state import find_group, owner_of, state_root
from tandem.check.fabric import DEFAULT_PORT, run_fabric
from tandem.check.findings import CheckReport, Finding, Severity
from tandem.check.node_transport import LocalTransport, NodeTransport, ProbeError, Verification
from tandem.check.rules import CheckContext, evaluate
from tandem.errors import BackendError, PlanError, SSHError, TandemError
from tandem.interrupts import shielded
from tandem.operations import revisions
from tandem.plan.config import facts_of
from tandem.plan.planner import Plan, infer_hardware, plan_deployment
from tandem.rankplan import RankPlan, launch_plan
from tandem.spec.cluster import LocalIsolation, Transport
from tandem.spec.deployment import Deployment

OnEvent = Callable[[str], None]
NETNS_DIR = Path("/run/netns")

REMOTE_TRANSPORTS: dict[Transport, type[SSHNodeTransport] | type[KubernetesNodeTransport]] = {
    Transport.SSH: SSHNodeTransport,
    Transport.K8S: KubernetesNodeTransport,
}
"""How the probe reaches the nodes of a remote cluster; each class is built with the
Deployment, ``verification`` and ``compile_caches``. A local cluster's ``LocalTransport`` needs
the namespaces ``local_namespaces`` enters, so ``run_check`` builds it itself."""


@contextmanager
def local_namespaces(deployment: Deployment, on_event: OnEvent) -> Iterator[dict[str, str]]:
    """Node name -> network namespace for a local netns cluster ({} for any other cluster)."""
    cluster = deployment.cluster
    if (
        cluster.transport is not Transport.LOCAL
        or cluster.local.isolation is not LocalIsolation.NETNS
    ):
        yield {}
        return
    own = netns.network_plan(deployment.name, cluster)
    if _running_here(deployment.name, own) and all(_netns_exists(n.netns) for n in own.nodes):
        on_event(
            f"probing inside the running deployment's namespaces "
            f"{', '.join(n.netns for n in own.nodes)}"
        )
        yield {n.node: n.netns for n in own.nodes}
        return
    if os.geteuid() != 0 or shutil.which("ip") is None:
        raise BackendError(
            "a local cluster of network namespaces needs root and iproute2 (`ip`) to be checked",
            field="local.isolation",
            hint="run as root with iproute2 installed, or use isolation: loopback",
        )
    netns.sweep_orphans(on_event)
    temporary = netns.network_plan(f"chk{os.getpid()}", cluster)
    netns.create(temporary, purpose=f"check of '{deployment.name}'")
    try:
        on_event(
            "built throw-away namespaces "
            + ", ".join(f"{n.netns} ({n.interface} {n.address})" for n in temporary.nodes)
        )
        yield {n.node: n.netns for n in temporary.nodes}
    finally:
        with shielded(on_event):  # a second signal cannot leave the namespaces behind
            leftovers = netns.destroy(temporary)
        if leftovers:
            on_event("could not remove: " + "; ".join(leftovers))


def _running_here(name: str, own: netns.NetworkPlan) -> bool:
    """This state folder's deployment of that name runs on exactly this network (namespaces of
    the same name from another TANDEM_HOME, or on another subnet, are not ours to enter)."""
    found = find_group(name)
    return found is not None and found.network == own.model_dump()


def _netns_exists(name: str) -> bool:
    """True when the named network namespace exists (``ip netns add`` makes /run/netns/NAME)."""
    return (NETNS_DIR / name).exists()


def probe_all(deployment: Deployment, transport: NodeTransport) -> dict[str, dict[str, Any]]:
    """Facts of every node, probed in parallel; a node that fails gets ``probe_error``.

    Raises:
        SSHError: nodes that cannot be reached (or refuse the key), every one of them named.
    """

    def probe(node) -> dict[str, Any] | SSHError:
        try:
            return transport.run_probe(node)
        except ProbeError as exc:
            return {"probe_error": exc.message}
        except SSHError as exc:  # every node is tried: one down must not hide another
            return exc

    nodes = deployment.cluster.nodes
    with ThreadPoolExecutor(max_workers=min(16, len(nodes))) as pool:
        answers = dict(zip([n.name for n in nodes], pool.map(probe, nodes)))
    lost = [a for a in answers.values() if isinstance(a, SSHError)]
    if lost:
        raise lost[0] if len(lost) == 1 else _all_unreachable(lost, len(nodes))
    return {name: a for name, a in answers.items() if not isinstance(a, SSHError)}


def _all_unreachable(lost: list[SSHError], nodes: int) -> SSHError:
    """One error for several nodes that could not be probed, each named with its cause."""
    return SSHError(
        f"{len(lost)} of {nodes} nodes could not be probed: "
        + "; ".join(exc.message for exc in lost),
        reason=lost[0].reason,
        hint="; ".join(dict.fromkeys(exc.hint for exc in lost if exc.hint)),
    )


def memory_plan(deployment: Deployment) -> tuple[Plan | None, str | None, PlanError | None]:
    """``tandem plan``'s plan of the deployment; else why it could not plan, or the PlanError
    with which the planner refused the deployment as impossible.

    When ``tandem plan`` cannot find the model's config, or knows no hardware profile for the
    cluster, the memory rules are skipped and the reason is reported (never a crash of the
    preflight). A refusal (``max_model_len`` beyond the model, a KV dtype the model cannot use)
    is an error of the preflight.
    """
    try:
        facts = facts_of(deployment.recipe.model)
        hardware = infer_hardware(deployment, None)
    except TandemError as exc:
        return None, f"tandem plan could not plan it: {exc.message}", None
    try:
        return plan_deployment(deployment, facts, hardware), None, None
    except PlanError as exc:
        return None, None, exc


def run_check(
    deployment: Deployment,
    *,
    fabric: bool = False,
    fabric_port: int = DEFAULT_PORT,
    fabric_sizes: list[int] | None = None,
    fabric_timeout_s: float = 300.0,
    rehash: bool = False,
    transport: NodeTransport | None = None,
    on_event: OnEvent = lambda text: None,
) -> CheckReport:
    """Preflight a deployment: the facts of its nodes, the rules' findings, the fabric.

    Usage:
        report = run_check(load_deployment("tiny-local"), fabric=True)
        if not report.ok:
            for finding in report.errors: print(finding.render())

    Every node's model snapshot is verified: each file's content against the id the Hub gave
    it, skipping what was verified before and has not changed since (``rehash`` reads every
    file again); what was verified is remembered (``tandem.backends.snapshots``).

    Raises:
        BackendError: the nodes cannot be reached at all (e.g. namespaces without root).
    """
    findings: list[Finding] = []
    plan: RankPlan | None = None
    try:
        plan = launch_plan(deployment)
    except PlanError as exc:
        findings += [
            Finding(
                rule="plan-invalid",
                severity=Severity.ERROR,
                node=None,
                message=p.message,
                evidence=f"field {p.field}" if p.field else exc.message,
                fix=p.hint or "fix the recipe or the cluster",
            )
            for p in exc.problems
        ]
    rank_env = {r.node: r.env for r in plan.ranks} if plan else {}
    roots = {
        node.name: caches.rank_root(deployment, rank, state_root=state_root())
        for rank, node in enumerate(deployment.cluster.nodes)
    }
    verification = Verification(enabled=True, known={} if rehash else snapshots.known(deployment))
    with local_namespaces(deployment, on_event) as namespaces:
        if transport is None:
            if deployment.cluster.transport is Transport.LOCAL:
                transport = LocalTransport(
                    deployment, netns=namespaces, verification=verification, compile_caches=roots
                )
            else:
                transport = REMOTE_TRANSPORTS[deployment.cluster.transport](
                    deployment, verification=verification, compile_caches=roots
                )
        on_event(f"probing {len(deployment.cluster.nodes)} node(s)")
        facts = probe_all(deployment, transport)
        snapshots.remember(deployment, facts)
        planned, why_not, refused = memory_plan(deployment)
        if why_not:
            on_event(f"memory headroom not checked: {why_not}")
        need = (
            {n.name: planned.per_node_memory_bytes for n in deployment.cluster.nodes}
            if planned is not None
            else None
        )
        context = CheckContext(
            deployment=deployment,
            facts=facts,
            rank_env=rank_env,
            memory_need_bytes=need,
            plan_fit=planned.fit if planned is not None else None,
            plan_refused=refused,
            api_key_set=bool(os.environ.get(wire.VLLM_API_KEY)),
            manifest=snapshots.load_manifest(
                deployment.recipe.model.repo_id, deployment.recipe.model.revision
            ),
        )
        findings += evaluate(context)
        fabric_result: dict[str, Any] = {}
        if fabric:
            if plan is None or any("probe_error" in f for f in facts.values()):
                findings.append(
                    Finding(
                        rule="fabric-failed",
                        severity=Severity.ERROR,
                        node=None,
                        message="the fabric test did not run",
                        evidence="the deployment has no rank plan or a node "
                        "could not be probed (see above)",
                        fix="fix the errors above, then rerun with --fabric",
                    )
                )
            else:
                gpu_nodes = all((f.get("gpu") or {}).get("gpus") for f in facts.values())
                on_event(
                    f"fabric: {'nccl' if gpu_nodes else 'gloo'} all-reduce across the ranks, "
                    f"rendezvous {plan.leader.address}:{fabric_port}"
                )
                result, extra = run_fabric(
                    deployment,
                    plan,
                    transport,
                    gpu_nodes=gpu_nodes,
                    port=fabric_port,
                    sizes=fabric_sizes,
                    timeout_s=fabric_timeout_s,
                    facts=facts,
                )
                fabric_result = result.model_dump(mode="json")
                findings += extra
    report = CheckReport(deployment=deployment.name, nodes=facts, findings=findings)
    report.findings += revisions.host_changes(owner_of(deployment.name), report)
    report.findings.sort(key=lambda f: f.severity.rank)
    report.fabric = fabric_result
    return report
