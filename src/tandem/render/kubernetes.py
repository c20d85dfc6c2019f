"""The rank plan as Kubernetes objects: one LeaderWorkerSet, a Service for the leader, a Secret,
the node agent's ConfigMap; with ``replicas``, vLLM's router in front (``router_objects``) and
the Service on it.

Model (LeaderWorkerSet, ``leaderworkerset.x-k8s.io/v1``): ``replicas`` **groups** of
``size`` = nodes pods. The **leader** pod (worker index 0, pod ``<name>-0``) runs rank 0 and
serves the API; **worker** pods (indexes 1..size-1, pods ``<name>-0-<i>``) run the headless
ranks. ``RecreateGroupOnPodRestart`` restarts the whole group when any pod restarts, because a
vLLM group cannot re-admit one rank. ``startupPolicy: LeaderCreated`` creates the workers right
away and the leader waits for them at the rendezvous; ``LeaderReady`` would deadlock, since the
leader's ``/health`` only answers once every rank has joined.

Each template is the rank plan's rank with its node pinned (``nodeSelector`` on
``kubernetes.io/hostname``), the seed 000 pod shape (host network and IPC,
``ClusterFirstWithHostNet``, privileged with ``IPC_LOCK``, ``nvidia.com/gpu`` limit,
``/dev/infiniband`` and the HF cache as hostPaths, ``/dev/shm`` as a memory emptyDir), the
compile cache root ``/var/cache/tandem/DEPLOYMENT`` of each node as a hostPath at
``/cache/tandem`` with the cache variables pointing into it (``tandem.caches``: a recreated
group starts warm), its
``vllm serve`` argv as ``command`` and its environment. The leader alone gets the port, a
startup probe that allows ``timeouts.startup_s``, and a readiness probe on ``/health`` with no
initial delay: it runs only after the startup probe succeeded (``_probes`` says why seed 000's
600 s delay is gone). Every pod's liveness check is the node agent (``tandem.agent alive``),
read from a ConfigMap mounted at ``/opt/tandem`` (``agent_config_map``).

How ranks learn the leader's address (``kubernetes.leader_address``):

- ``pinned`` (seed 000): ``--master-addr`` is the leader node's inventory address, every value
  literal. With several workers on one template, ``--node-rank`` becomes
  ``$(LWS_WORKER_INDEX)`` and ``VLLM_HOST_IP`` the pod's IP (host network: the node's).
- ``lws``: ``--nnodes $(LWS_GROUP_SIZE) --node-rank $(LWS_WORKER_INDEX) --master-addr
  $(LWS_LEADER_ADDRESS)``; Kubernetes expands ``$(VAR)`` in ``command`` from the variables
  LeaderWorkerSet injects.

Pure: no I/O; ``render`` raises ``PlanError`` when a rule that neither the CRD schema nor the
API server checks is broken (``tandem.render.k8s_validate``).
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

import yaml

from tandem import agent, caches, wire
from tandem.errors import PlanError, Problem
from tandem.rankplan import Mount, RankPlan, RankSpec, Role, distributed, in_files, serve_argv
from tandem.spec.deployment import Deployment, router_image_problem, template_group
from tandem.spec.kubernetes import LeaderAddress, ServiceType

LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
CONTAINER_NAME = "vllm"
API_PORT_NAME = "http"
SECRET_KEY = "api-key"
"""Key of the API key inside the Secret ``<deployment>-api-key``."""
PROBE_PERIOD_S = 10
MANAGED_BY = "tandem"
COMPILE_CACHE_VOLUME = "compile-cache"
AGENT_VOLUME = "tandem-agent"
AGENT_DIR = "/opt/tandem"
AGENT_FILE = "agent.py"
"""Where a pod finds the node agent (``agent.py``), from the ConfigMap ``agent_config_map``."""

_FROM_POD_IP = {"valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
_FROM_WORKER_INDEX = {
    "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{wire.LWS_WORKER_INDEX_LABEL}']"}}
}


# --- names ----------------------------------------------------------------------------------


def lws_name(deployment: Deployment) -> str:
    """The LeaderWorkerSet's name: the recipe's name (also its headless Service's name)."""
    return deployment.name


def service_name(deployment: Deployment) -> str:
    """The leader Service: ``kubernetes.service.name``, else ``<name>-external`` for a Service
    reachable from outside (seed 000's ``dsv4-flash-tp2-external``) or ``<name>-api``."""
    service = deployment.cluster.kubernetes.service
    if service.name:
        return service.name
    suffix = "api" if service.type is ServiceType.CLUSTER_IP else "external"
    return f"{deployment.name}-{suffix}"


def service_url(deployment: Deployment) -> str:
    """Where clients reach the Service: its load balancer's address when the cluster fixes one,
    else its name in the cluster's DNS (reachable from inside the cluster)."""
    options = deployment.cluster.kubernetes.service
    host = options.load_balancer_ip or (
        f"{service_name(deployment)}.{deployment.cluster.namespace}.svc"
    )
    return f"http://{host}:{options.port}"


def router_name(deployment: Deployment) -> str:
    """The router's Deployment, ServiceAccount, Role and RoleBinding (with replicas)."""
    return f"{deployment.name}-router"


def secret_name(deployment: Deployment) -> str:
    return f"{deployment.name}-api-key"


def pod_name(deployment: Deployment, worker_index: int, group: int = 0) -> str:
    """LeaderWorkerSet's pod names: ``<name>-<group>`` for the leader, ``<name>-<group>-<i>``."""
    base = f"{lws_name(deployment)}-{group}"
    return base if worker_index == 0 else f"{base}-{worker_index}"


def agent_config_map_name(deployment: Deployment) -> str:
    """``<deployment>-agent-<first 10 hex of the agent's sha256>``: named by its content."""
    digest = hashlib.sha256(agent.source().encode()).hexdigest()[:10]
    return f"{lws_name(deployment)}-agent-{digest}"


def image_of(deployment: Deployment) -> str:
    """``engine.image``; else the upstream vLLM image of ``engine.vllm_version`` (or latest)."""
    engine = deployment.recipe.engine
    if engine.image:
        return engine.image
    tag = f"v{engine.vllm_version}" if engine.vllm_version else "latest"
    return f"vllm/vllm-openai:{tag}"


def quantity(n_bytes: int) -> str:
    """Bytes as a Kubernetes quantity in the largest exact binary unit: 64 GiB -> ``64Gi``."""
    for unit, power in (("Ti", 4), ("Gi", 3), ("Mi", 2), ("Ki", 1)):
        if n_bytes and n_bytes % 1024**power == 0:
            return f"{n_bytes // 1024**power}{unit}"
    return str(n_bytes)


def host_path(path: str) -> str:
    """A host path as the node sees it; ``~`` is root's home, since the pods run as root."""
    return "/root" + path[1:] if path == "~" or path.startswith("~/") else path


def _labels(deployment: Deployment) -> dict[str, str]:
    return {wire.K8S_NAME_LABEL: deployment.name, wire.K8S_MANAGED_BY_LABEL: MANAGED_BY}


def _metadata(deployment: Deployment, name: str) -> dict[str, Any]:
    """An object of the deployment: its name, the cluster's namespace and the deployment's
    labels (what ``down`` finds it by)."""
    return {"name": name, "namespace": deployment.cluster.namespace, "labels": _labels(deployment)}


# --- pod templates ---------------------------------------------------------------------------


def _volume_name(mount: Mount) -> str:
    if mount.kind == "cache":
        return "hf-cache"
    return mount.target.strip("/").split("/")[-1].lower().replace("_", "-") or "device"


def _volumes(deployment: Deployment, rank: RankSpec) -> tuple[list[dict], list[dict]]:
    """(volumes, volumeMounts): the plan's mounts as hostPaths, plus /dev/shm in memory."""
    volumes: list[dict] = []
    mounts: list[dict] = []

    def add(name: str, source: dict, target: str, **mount: Any) -> None:
        volumes.append({"name": name, **source})
        mounts.append({"name": name, "mountPath": target, **mount})

    def host_dir(name: str, path: str, target: str, kind: str = "DirectoryOrCreate") -> None:
        add(name, {"hostPath": {"path": path, "type": kind}}, target)

    for mount in rank.mounts:
        if mount.kind == "device":
            host_dir(_volume_name(mount), host_path(mount.source), mount.target, "Directory")
    shm = {"medium": "Memory", "sizeLimit": quantity(deployment.recipe.shm_bytes)}
    add("dshm", {"emptyDir": shm}, "/dev/shm")
    for mount in rank.mounts:
        if mount.kind == "cache":
            host_dir(_volume_name(mount), host_path(mount.source), mount.target)
    host_dir(COMPILE_CACHE_VOLUME, caches.k8s_host_root(deployment.name), wire.CONTAINER_CACHE_ROOT)
    agent_map = {"name": agent_config_map_name(deployment), "defaultMode": 0o444}
    add(AGENT_VOLUME, {"configMap": agent_map}, AGENT_DIR, readOnly=True)
    return volumes, mounts


def _role_argv(deployment: Deployment, ranks: list[RankSpec], mode: LeaderAddress) -> list[str]:
    """One argv for every rank of a template: literal where the ranks agree, LWS variables
    where LeaderWorkerSet knows the value."""

    def templated(rank: RankSpec) -> list[str]:
        group = distributed(deployment, rank.rank)
        if group is None or (mode is not LeaderAddress.LWS and len(ranks) == 1):
            return rank.argv
        known_to_lws = {"node_rank": f"$({wire.LWS_WORKER_INDEX})"}
        if mode is LeaderAddress.LWS:
            known_to_lws |= {
                "nnodes": f"$({wire.LWS_GROUP_SIZE})",
                "master_addr": f"$({wire.LWS_LEADER_ADDRESS})",
            }
        return serve_argv(deployment, rank.rank, group.model_copy(update=known_to_lws))

    argvs = [templated(r) for r in ranks]
    if any(a != argvs[0] for a in argvs):
        raise PlanError(
            "the worker ranks run different commands, but a LeaderWorkerSet has one "
            "worker template",
            field="nodes",
            hint="give every worker node the same settings",
        )
    return argvs[0]


def _role_env(ranks: list[RankSpec], mode: LeaderAddress, secret: str | None) -> list[dict]:
    """One env list for every rank of a template, in the plan's order, with the container's
    view of mounted paths (HF_HOME -> the mount target)."""
    per_pod: dict[str, dict] = {}  # a variable each pod sets itself: where it reads it
    if mode is LeaderAddress.LWS or len(ranks) > 1:
        per_pod[wire.VLLM_HOST_IP] = _FROM_POD_IP
    if len(ranks) > 1:
        per_pod[wire.TANDEM_RANK] = _FROM_WORKER_INDEX
    mount_env = {m.env: m.target for m in ranks[0].mounts if m.env}
    first = ranks[0].env
    problems = [
        Problem(
            f"nodes[{r.rank}].env.{k}",
            f"differs between worker nodes ('{first.get(k)}' vs '{r.env.get(k)}')",
            "a LeaderWorkerSet has one worker template; use the same value",
        )
        for r in ranks[1:]
        for k in sorted(set(first) | set(r.env))
        if k not in per_pod and k not in mount_env and first.get(k) != r.env.get(k)
    ]
    if problems:
        raise PlanError("worker nodes differ in their environment", problems=problems)
    env = [
        {"name": key, **per_pod[key]}
        if key in per_pod and key not in mount_env
        else {"name": key, "value": mount_env.get(key, value)}
        for key, value in first.items()
    ]
    env += [{"name": k, "value": v} for k, v in mount_env.items() if k not in first]
    env = [e for e in env if e["name"] not in caches.CACHE_DIRS]
    env += [{"name": k, "value": v} for k, v in caches.cache_env(wire.CONTAINER_CACHE_ROOT).items()]
    if secret:
        env.append(
            {
                "name": wire.VLLM_API_KEY,
                "valueFrom": {
                    "secretKeyRef": {"name": secret, "key": SECRET_KEY, "optional": True}
                },
            }
        )
    return env


def _placement(
    ranks: list[RankSpec], deployment: Deployment, role: Role, pool: list[str] | None = None
) -> dict:
    """nodeSelector for one node (seed 000); several workers: node affinity to their nodes and
    anti-affinity between the group's pods, so each worker gets a node of its own. With
    replicas, ``pool`` is every node of the inventory: any pod of any group may land on any of
    them, one pod a node (every pod of the LeaderWorkerSet repels the others)."""
    nodes = pool or sorted({r.node for r in ranks})
    if len(nodes) == 1:
        return {"nodeSelector": {wire.K8S_HOSTNAME_LABEL: nodes[0]}}
    return {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": wire.K8S_HOSTNAME_LABEL, "operator": "In", "values": nodes}
                            ]
                        }
                    ]
                }
            },
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "topologyKey": wire.K8S_HOSTNAME_LABEL,
                        "labelSelector": {
                            "matchLabels": {wire.LWS_NAME_LABEL: lws_name(deployment)}
                        },
                    }
                ]
            },
        }
    }


def _startup_probe(deployment: Deployment, check: dict) -> dict:
    """A startup probe that allows ``timeouts.startup_s``: as many failures as periods fit."""
    periods = math.ceil(deployment.recipe.timeouts.startup_s / PROBE_PERIOD_S)
    return {**check, "periodSeconds": PROBE_PERIOD_S, "failureThreshold": max(1, periods)}


def _probes(deployment: Deployment) -> dict:
    """Leader only: a startup probe that allows ``timeouts.startup_s``, then readiness.

    Both ask ``/health``, which vLLM answers only once every rank has joined and the model is
    loaded. The startup probe covers the cold start: the kubelet runs no readiness probe until
    the startup probe has succeeded, so the readiness probe needs no initial delay of its own
    (``initialDelaySeconds: 0``). Seed 000 had ``initialDelaySeconds: 600`` (its 6-7 minute
    cold start) on readiness; the delay counts from the container's start, so behind a startup
    probe it only kept a leader whose model was already up out of the Service until minute ten
    (a warm restart, with the weights in page cache, waited most of that for nothing). No
    traffic reaches the leader before the model is up either way: readiness still fails until
    ``/health`` answers.
    """
    http = {"path": wire.HEALTH_PATH, "port": deployment.recipe.ports.api}
    return {
        "startupProbe": _startup_probe(deployment, {"httpGet": dict(http)}),
        "readinessProbe": {"httpGet": dict(http), "initialDelaySeconds": 0},
    }


LIVENESS_PERIOD_S = 30
LIVENESS_FAILURES = 3


def _liveness(deployment: Deployment, role: Role) -> dict:
    """Probes that mean the rank's engine is alive and, on the leader, makes progress.

    The health model as the node agent's ``alive`` check (``tandem.agent``, standard library
    only) run in the pod. The leader's liveness starts after its startup probe; a worker, which
    serves no HTTP, gets a startup probe of its own that waits for its vLLM worker process
    within ``timeouts.startup_s``.
    """
    recipe = deployment.recipe
    args = ["alive", role.value, "--deployment", deployment.name]
    canary_s = max(10, min(60, recipe.timeouts.request_s))
    if role is Role.LEADER:
        args += [
            "--url",
            f"http://127.0.0.1:{recipe.ports.api}",
            "--model",
            recipe.model.name_for_clients,
            "--stall",
            "60",
            "--canary-timeout",
            str(canary_s),
        ]
    command = ["python3", f"{AGENT_DIR}/{AGENT_FILE}", *args]
    probes = {
        "livenessProbe": {
            "exec": {"command": command},
            "periodSeconds": LIVENESS_PERIOD_S,
            "timeoutSeconds": canary_s + 10,
            "failureThreshold": LIVENESS_FAILURES,
        }
    }
    if role is Role.WORKER:
        probes["startupProbe"] = _startup_probe(deployment, {"exec": {"command": list(command)}})
    return probes


def pod_template(
    deployment: Deployment, ranks: list[RankSpec], role: Role, pool: list[str] | None = None
) -> dict:
    """The pod template of one role, built from its ranks (all on the same settings); ``pool``:
    the nodes any replica may use (``_placement``)."""
    options = deployment.cluster.kubernetes
    leader = role is Role.LEADER
    volumes, mounts = _volumes(deployment, ranks[0])
    node_gpus = {n.name: n.gpus for n in deployment.cluster.nodes}
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": image_of(deployment),
        "imagePullPolicy": options.image_pull_policy,
    }
    try:
        container["command"] = _role_argv(deployment, ranks, options.leader_address)
        container["env"] = _role_env(
            ranks, options.leader_address, secret_name(deployment) if leader else None
        )
    except PlanError as exc:
        raise in_files(exc, deployment) from None
    if leader:
        container["ports"] = [
            {"name": API_PORT_NAME, "containerPort": deployment.recipe.ports.api, "protocol": "TCP"}
        ]
    container |= {
        "securityContext": {"privileged": True, "capabilities": {"add": ["IPC_LOCK"]}},
        "resources": {"limits": {options.gpu_resource: str(node_gpus[ranks[0].node])}},
        "volumeMounts": mounts,
    }
    if leader:
        container |= _probes(deployment)
    container |= _liveness(deployment, role)
    spec: dict[str, Any] = {
        "hostNetwork": True,
        "hostIPC": True,
        "dnsPolicy": "ClusterFirstWithHostNet",
        # No docker-link variables: a Service named like `vllm` would set VLLM_PORT=tcp://...
        "enableServiceLinks": False,
        **_placement(ranks, deployment, role, pool),
        "containers": [container],
        "volumes": volumes,
    }
    return {
        "metadata": {"labels": {wire.ROLE_LABEL: role.value, **_labels(deployment)}},
        "spec": spec,
    }


# --- objects ---------------------------------------------------------------------------------


def leader_worker_set(plan: RankPlan, deployment: Deployment) -> dict:
    """The LeaderWorkerSet: ``replicas`` groups of ``len(plan.ranks)`` pods, leader and worker
    templates. ``plan`` is one group's (``template_group``); with replicas the templates may
    use any node of the inventory."""
    unit = template_group(deployment)
    pool = (
        sorted(n.name for n in deployment.cluster.nodes) if deployment.recipe.replicas > 1 else None
    )
    workers = [r for r in plan.ranks if r.role is Role.WORKER]
    leader_template = pod_template(unit, [plan.leader], Role.LEADER, pool)
    worker_template = pod_template(unit, workers, Role.WORKER, pool) if workers else leader_template
    return {
        "apiVersion": LWS_API_VERSION,
        "kind": "LeaderWorkerSet",
        "metadata": _metadata(deployment, lws_name(deployment)),
        "spec": {
            "replicas": deployment.recipe.replicas,
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": len(plan.ranks),
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": leader_template,
                "workerTemplate": worker_template,
            },
        },
    }


def service(deployment: Deployment) -> dict:
    """The Service in front of the leader pod (``role: leader`` of this LeaderWorkerSet)."""
    options = deployment.cluster.kubernetes.service
    annotations = dict(options.annotations)
    if options.load_balancer_ip:
        annotations[wire.CILIUM_LB_IPAM_IPS] = options.load_balancer_ip
    metadata = _metadata(deployment, service_name(deployment))
    if annotations:
        metadata["annotations"] = annotations
    spec: dict[str, Any] = {"type": options.type.value}
    if options.load_balancer_class:
        spec["loadBalancerClass"] = options.load_balancer_class
    if options.external_traffic_policy:
        spec["externalTrafficPolicy"] = options.external_traffic_policy.value
    recipe = deployment.recipe
    routed = recipe.replicas > 1  # the front door is the router
    target = recipe.router.port if routed else recipe.ports.api
    spec["ports"] = [
        {"name": API_PORT_NAME, "port": options.port, "targetPort": target, "protocol": "TCP"}
    ]
    if routed:
        spec["selector"] = {wire.K8S_NAME_LABEL: router_name(deployment)}
    else:
        spec["selector"] = {wire.LWS_NAME_LABEL: lws_name(deployment), wire.ROLE_LABEL: "leader"}
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata, "spec": spec}


def router_objects(deployment: Deployment) -> list[dict]:
    """vLLM's router in front of the groups' leaders: a ServiceAccount allowed to watch the
    namespace's pods, and a Deployment whose router finds the leaders itself (its Kubernetes
    service discovery: pods of this LeaderWorkerSet with worker index 0, leaders only, since
    workers serve no API). A leader joins when Kubernetes calls it ready and leaves when it is
    not: its startup, readiness and liveness probes (``_probes``, ``_liveness``) are tandem's
    health verdict on this backend. The router is ready once one group is."""
    spec = deployment.recipe.router
    namespace = deployment.cluster.namespace
    name = router_name(deployment)
    labels = {**_labels(deployment), wire.K8S_NAME_LABEL: name}
    meta = {"name": name, "namespace": namespace, "labels": labels}
    command = spec.argv(
        host="0.0.0.0",
        discovery=[
            "--service-discovery",
            "--selector",
            f"{wire.LWS_NAME_LABEL}={lws_name(deployment)}",
            f"{wire.LWS_WORKER_INDEX_LABEL}=0",
            "--service-discovery-port",
            str(deployment.recipe.ports.api),
            "--service-discovery-namespace",
            namespace,
        ],
    )
    container = {
        "name": "router",
        "image": spec.image,
        "command": command,
        "ports": [
            {"name": API_PORT_NAME, "containerPort": spec.port, "protocol": "TCP"},
            {"name": "metrics", "containerPort": spec.metrics_port, "protocol": "TCP"},
        ],
        **{  # the router answers /readiness and /liveness, named as the probes
            f"{check}Probe": {
                "httpGet": {"path": f"/{check}", "port": spec.port},
                "periodSeconds": PROBE_PERIOD_S,
            }
            for check in ("readiness", "liveness")
        },
    }
    rules = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    rbac = "rbac.authorization.k8s.io"
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {"apiVersion": f"{rbac}/v1", "kind": "Role", "metadata": meta, "rules": rules},
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "RoleBinding",
            "metadata": meta,
            "roleRef": {"apiGroup": rbac, "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta,
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {wire.K8S_NAME_LABEL: name}},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"serviceAccountName": name, "containers": [container]},
                },
            },
        },
    ]


def agent_config_map(deployment: Deployment) -> dict:
    """The node agent, once for the deployment, mounted by every pod for its exec probes.

    In the probe's own ``command`` the 50 KB script stood three times in every LeaderWorkerSet
    (leader liveness, worker liveness and start-up) and in each pod, so ``kubectl describe pod``
    printed pages of Python. Named by its content and immutable: a pod's template names the
    very agent it was rendered with, and a newer tandem's agent comes as a new ConfigMap (a
    changed template, rolled as any change is), never swapped under running pods.
    """
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(deployment, agent_config_map_name(deployment)),
        "immutable": True,
        "data": {AGENT_FILE: agent.source()},
    }


def api_key_secret(deployment: Deployment, api_key: str) -> dict:
    """The Secret the leader reads ``VLLM_API_KEY`` from. Built only at ``up`` from the
    caller's environment and sent on kubectl's stdin; never part of a rendered file."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": _metadata(deployment, secret_name(deployment)),
        "stringData": {SECRET_KEY: api_key},
    }


def objects(plan: RankPlan, deployment: Deployment) -> list[dict]:
    """The agent's ConfigMap (first: the pods mount it), LeaderWorkerSet and Service, checked by
    the rules neither the schema nor the server has.

    Raises:
        PlanError: listing every broken rule.
    """
    from tandem.render.k8s_validate import check_objects

    result = [
        agent_config_map(deployment),
        leader_worker_set(plan, deployment),
        service(deployment),
    ]
    if deployment.recipe.replicas > 1:
        if missing := router_image_problem(deployment.recipe):  # a cluster of another transport
            message, hint = missing
            raise PlanError(message, field="router.image", hint=hint)
        result += router_objects(deployment)
    problems = check_objects(result)
    if problems:
        raise PlanError(
            f"the Kubernetes objects of '{deployment.name}' would not work", problems=problems
        )
    return result


class _ManifestDumper(yaml.SafeDumper):
    """YAML a person reads: a text of several lines (the node agent's source in its ConfigMap)
    as a ``|`` block, line for line, and no ``&id001`` anchors where one object (the labels)
    appears twice: each place spells it out, as kubectl and a reviewer expect."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_ManifestDumper.add_representer(str, _text)


def to_yaml(items: list[dict]) -> str:
    """The objects as YAML documents, ``---`` between them."""
    return yaml.dump_all(
        items, Dumper=_ManifestDumper, sort_keys=False, width=10_000, allow_unicode=True
    )


def render(plan: RankPlan, deployment: Deployment, fmt: str) -> str:
    """The ``k8s`` target: ``yaml`` (default; documents) or ``json`` (a ``v1 List``)."""
    items = objects(plan, deployment)
    if fmt == "json":
        return json.dumps({"apiVersion": "v1", "kind": "List", "items": items}, indent=2) + "\n"
    cluster = deployment.cluster
    replicas = deployment.recipe.replicas
    if replicas > 1:
        router = deployment.recipe.router
        where = (
            f"# deployment {plan.deployment}: LeaderWorkerSet of {replicas} groups of "
            f"{len(plan.ranks)} pod(s), one pod a node of "
            f"{', '.join(n.name for n in cluster.nodes)} (namespace {cluster.namespace}),\n"
            f"# behind vllm-router {router.version} ({router.policy.value}, Deployment "
            f"{router_name(deployment)}), API through Service {service_name(deployment)} as "
            f"model '{plan.model}'.\n"
        )
    else:
        where = (
            f"# deployment {plan.deployment}: LeaderWorkerSet of {len(plan.ranks)} pod(s) on "
            f"{', '.join(r.node for r in plan.ranks)} (namespace {cluster.namespace}),\n"
            f"# API at {plan.endpoint}/v1 as model '{plan.model}' and through Service "
            f"{service_name(deployment)}.\n"
        )
    header = where + (
        "# Apply server-side (the LeaderWorkerSet CRD must be installed):\n"
        "#   kubectl apply --server-side -f THIS_FILE\n"
        "# API key (optional; read by the leader as VLLM_API_KEY):\n"
        f"#   kubectl -n {cluster.namespace} create secret generic {secret_name(deployment)} "
        f"--from-literal={SECRET_KEY}=...\n"
    )
    return header + to_yaml(items)
