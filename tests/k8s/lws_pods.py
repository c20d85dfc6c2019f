"""The pods (and the headless Service) that LeaderWorkerSet v0.10.0 makes of a LeaderWorkerSet.

The LWS controller cannot be built on the test machines (its Go modules are not reachable), so
the Kubernetes test bed (``kube_cluster``) creates, for each LeaderWorkerSet that ``tandem up``
applies, the objects that LWS and the StatefulSet controller would have made of it, with the
same names, labels, annotations, ``LWS_*`` variables, hostname and subdomain. Everything after
their creation is real: the scheduler places them, the kubelets run them, the endpoints
controller publishes them, the garbage collector removes them with their LeaderWorkerSet.

How LWS v0.10.0 (kubernetes-sigs/lws @ 2161f38ff333f9e24d3c44adef7cd5d9787cac00) makes a pod,
in order, and where this module follows it:

1. ``pkg/webhooks/leaderworkerset_webhook.go`` ``Default``: ``networkConfig.subdomainPolicy``
   defaults to ``Shared`` (the CRD has no default for it); ``_subdomain_policy``.
2. ``pkg/utils/controller/controller_utils.go`` ``CreateHeadlessServiceIfNotExists``: the
   headless Service named like the LWS, selecting ``leaderworkerset.sigs.k8s.io/name``, with
   ``publishNotReadyAddresses``; ``headless_service``.
3. ``pkg/controllers/leaderworkerset_controller.go``
   ``constructLeaderStatefulSetApplyConfiguration``: the leader StatefulSet ``<lws>``
   (``serviceName: <lws>``, ``replicas`` groups, Parallel), its template the leader template
   (else the worker template) plus the labels ``worker-index: "0"``, ``name`` and
   ``template-revision-hash`` and the annotation ``size``; ``leader_pod``.
4. ``pkg/controllers/pod_controller.go`` ``constructWorkerStatefulSetApplyConfiguration``: per
   leader pod the worker StatefulSet ``<lws>-<group>`` (ordinals from 1, ``size - 1``
   replicas, ``serviceName`` the LWS), its template the worker template plus the labels
   ``group-index``, ``name``, ``group-key`` (the leader's) and ``template-revision-hash`` and
   the annotations ``size`` and ``leader-name``; ``worker_pod``.
5. Kubernetes v1.20.2 ``pkg/controller/statefulset/stateful_set_utils.go`` ``newStatefulSetPod``
   / ``initIdentity``: the pod is named ``<set>-<ordinal>``, ``hostname`` is its name,
   ``subdomain`` the set's ``serviceName``, and it gets the labels
   ``statefulset.kubernetes.io/pod-name`` and ``controller-revision-hash``.
6. ``pkg/webhooks/pod_webhook.go`` ``Default`` (the pod admission webhook): a leader gets
   ``group-index`` (its ordinal) and ``group-key`` (sha1 of ``<namespace>/<pod>``); a worker
   gets ``worker-index`` (its ordinal). Then ``pkg/utils/pod/pod_utils.go`` ``AddLWSVariables`` puts
   ``LWS_LEADER_ADDRESS=<lws>-<group>.<subdomain>.<namespace>``, ``LWS_GROUP_SIZE`` and
   ``LWS_WORKER_INDEX`` first in every container's environment, dropping any of the same name.

Where the stand-in differs, and why nothing tandem does depends on it:

- the two revision labels (``template-revision-hash``, ``controller-revision-hash``) carry a
  sha1 of the template here: LWS and the StatefulSet controller hash their Go objects' printed
  form (FNV over ``%#v``), which only Go reproduces; tandem reads neither;
- the pods' owner is the LeaderWorkerSet itself (in LWS: a StatefulSet the LeaderWorkerSet
  owns), so that deleting it (``tandem down``) removes them through the real garbage collector;
- what LWS does after creation is not imitated: no restart of the group when a pod restarts
  (``RecreateGroupOnPodRestart``), no rolling update, no status. A container the kubelet
  restarts stays a restarted container, and tandem's verdict must say so.

Features tandem does not render (``subGroupPolicy``, the exclusive-topology annotations,
``startupPolicy: LeaderReady``, ``subdomainPolicy: UniquePerReplica``, volume claim
templates) are refused with ``Unsupported`` rather than half done.
"""

from __future__ import annotations

import copy
import hashlib
import json

LWS_VERSION = "v0.10.0"
LWS_COMMIT = "2161f38ff333f9e24d3c44adef7cd5d9787cac00"

# api/leaderworkerset/v1/leaderworkerset_types.go (v0.10.0)
NAME = "leaderworkerset.sigs.k8s.io/name"
GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
GROUP_KEY = "leaderworkerset.sigs.k8s.io/group-key"
REVISION_KEY = "leaderworkerset.sigs.k8s.io/template-revision-hash"
SIZE = "leaderworkerset.sigs.k8s.io/size"
LEADER_NAME = "leaderworkerset.sigs.k8s.io/leader-name"
EXCLUSIVE_KEYS = (
    "leaderworkerset.sigs.k8s.io/exclusive-topology",
    "leaderworkerset.sigs.k8s.io/subgroup-exclusive-topology",
)
LEADER_ADDRESS_ENV = "LWS_LEADER_ADDRESS"
GROUP_SIZE_ENV = "LWS_GROUP_SIZE"
WORKER_INDEX_ENV = "LWS_WORKER_INDEX"
SHARED = "Shared"
LEADER_CREATED = "LeaderCreated"
# Kubernetes v1.20.2 staging/src/k8s.io/api/apps/v1/types.go
STS_POD_NAME = "statefulset.kubernetes.io/pod-name"
CONTROLLER_REVISION_HASH = "controller-revision-hash"

READ_FIELDS = (
    ("spec", "replicas"),
    ("spec", "startupPolicy"),
    ("spec", "networkConfig", "subdomainPolicy"),
    ("spec", "leaderWorkerTemplate", "size"),
    ("spec", "leaderWorkerTemplate", "leaderTemplate"),
    ("spec", "leaderWorkerTemplate", "workerTemplate"),
    ("spec", "leaderWorkerTemplate", "subGroupPolicy"),
    ("spec", "leaderWorkerTemplate", "volumeClaimTemplates"),
)
"""Every field of a LeaderWorkerSet this module reads (checked against the CRD by a test)."""
REPLICAS = ("spec", "replicas")
SIZE_FIELD = ("spec", "leaderWorkerTemplate", "size")
CRD_DEFAULTS = {REPLICAS: 1, SIZE_FIELD: 1}
"""The defaults this module assumes where a field is absent: the CRD's own."""


class Unsupported(ValueError):
    """The LeaderWorkerSet uses a feature this stand-in does not make pods for."""


def _get(lws: dict, path: tuple[str, ...], default=None):
    node = lws
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return default
        node = node[key]
    return node


def _size(lws: dict) -> int:
    return _get(lws, SIZE_FIELD, CRD_DEFAULTS[SIZE_FIELD])


def _subdomain_policy(lws: dict) -> str:
    return _get(lws, ("spec", "networkConfig", "subdomainPolicy")) or SHARED


def _check_supported(lws: dict) -> None:
    template = lws["spec"]["leaderWorkerTemplate"]
    problems = [
        f"spec.leaderWorkerTemplate.{key}"
        for key in ("subGroupPolicy", "volumeClaimTemplates")
        if template.get(key)
    ]
    if (lws["spec"].get("startupPolicy") or LEADER_CREATED) != LEADER_CREATED:
        problems.append("spec.startupPolicy")
    if _subdomain_policy(lws) != SHARED:
        problems.append("spec.networkConfig.subdomainPolicy")
    problems += [
        f"metadata.annotations.{k}"
        for k in EXCLUSIVE_KEYS
        if k in lws["metadata"].get("annotations", {})
    ]
    if problems:
        raise Unsupported(f"the LWS stand-in does not make pods for {', '.join(problems)}")


def _revision(template: dict) -> str:
    """Stand-in revision hash (module docstring): sha1 of the template, 10 hex digits."""
    return hashlib.sha1(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


def _owner(lws: dict) -> list[dict]:
    meta = lws["metadata"]
    return [
        {
            "apiVersion": lws["apiVersion"],
            "kind": lws["kind"],
            "name": meta["name"],
            "uid": meta["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def headless_service(lws: dict) -> dict:
    """``CreateHeadlessServiceIfNotExists`` for the Shared subdomain policy (step 2)."""
    name, namespace = lws["metadata"]["name"], lws["metadata"]["namespace"]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {NAME: name},
            "ownerReferences": _owner(lws),
        },
        "spec": {"clusterIP": "None", "selector": {NAME: name}, "publishNotReadyAddresses": True},
    }


def _add_lws_variables(pod: dict) -> None:
    """``AddLWSVariables`` (step 6): the three variables first, in this order, in every
    container and init container; a variable of the same name the template had is dropped."""
    labels, spec = pod["metadata"]["labels"], pod["spec"]
    first = [
        {
            "name": LEADER_ADDRESS_ENV,
            "value": f"{labels[NAME]}-{labels[GROUP_INDEX]}.{spec['subdomain']}."
            f"{pod['metadata']['namespace']}",
        },
        {"name": GROUP_SIZE_ENV, "value": pod["metadata"]["annotations"][SIZE]},
        {"name": WORKER_INDEX_ENV, "value": labels[WORKER_INDEX]},
    ]
    names = {e["name"] for e in first}
    for key in ("containers", "initContainers"):
        for container in spec.get(key) or []:
            rest = [e for e in container.get("env") or [] if e["name"] not in names]
            container["env"] = copy.deepcopy(first) + rest


def _pod(lws: dict, template: dict, name: str, subdomain: str) -> dict:
    """A StatefulSet's pod of ``template`` (step 5), owned by the LeaderWorkerSet."""
    pod_template = copy.deepcopy(template)
    metadata = pod_template.get("metadata") or {}
    set_name = name.rsplit("-", 1)[0]
    metadata = {
        "name": name,
        "namespace": lws["metadata"]["namespace"],
        "labels": {
            **(metadata.get("labels") or {}),
            STS_POD_NAME: name,
            CONTROLLER_REVISION_HASH: f"{set_name}-{_revision(template)}",
        },
        "annotations": dict(metadata.get("annotations") or {}),
        "ownerReferences": _owner(lws),
    }
    spec = pod_template["spec"]
    spec["hostname"] = name
    spec["subdomain"] = subdomain
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def leader_pod(lws: dict, group: int) -> dict:
    """Pod ``<lws>-<group>`` of the leader StatefulSet (steps 3, 5, 6)."""
    name, namespace = lws["metadata"]["name"], lws["metadata"]["namespace"]
    lwt = lws["spec"]["leaderWorkerTemplate"]
    template = copy.deepcopy(lwt.get("leaderTemplate") or lwt["workerTemplate"])
    meta = template.setdefault("metadata", {})
    meta["labels"] = {
        **(meta.get("labels") or {}),
        WORKER_INDEX: "0",
        NAME: name,
        REVISION_KEY: _revision(lwt),
    }
    meta["annotations"] = {**(meta.get("annotations") or {}), SIZE: str(_size(lws))}
    pod_name = f"{name}-{group}"
    pod = _pod(lws, template, pod_name, subdomain=name)
    labels = pod["metadata"]["labels"]
    labels[GROUP_INDEX] = str(group)
    labels[GROUP_KEY] = hashlib.sha1(f"{namespace}/{pod_name}".encode()).hexdigest()
    _add_lws_variables(pod)
    return pod


def worker_pod(lws: dict, leader: dict, index: int) -> dict:
    """Pod ``<leader>-<index>`` of the leader's worker StatefulSet (steps 4, 5, 6)."""
    name = lws["metadata"]["name"]
    lwt = lws["spec"]["leaderWorkerTemplate"]
    template = copy.deepcopy(lwt["workerTemplate"])
    leader_labels = leader["metadata"]["labels"]
    meta = template.setdefault("metadata", {})
    meta["labels"] = {
        **(meta.get("labels") or {}),
        GROUP_INDEX: leader_labels[GROUP_INDEX],
        NAME: name,
        GROUP_KEY: leader_labels[GROUP_KEY],
        REVISION_KEY: leader_labels[REVISION_KEY],
    }
    meta["annotations"] = {
        **(meta.get("annotations") or {}),
        SIZE: str(_size(lws)),
        LEADER_NAME: leader["metadata"]["name"],
    }
    pod = _pod(lws, template, f"{leader['metadata']['name']}-{index}", subdomain=name)
    pod["metadata"]["labels"][WORKER_INDEX] = str(index)
    _add_lws_variables(pod)
    return pod


def objects(lws: dict) -> list[dict]:
    """The headless Service, then each group's leader pod and its workers, as LWS v0.10.0 and
    the StatefulSet controller would create them for ``lws`` (as read back from the API server:
    ``metadata.uid`` set).

    Raises:
        Unsupported: ``lws`` uses a feature the stand-in does not make pods for.
    """
    _check_supported(lws)
    size = _size(lws)
    result = [headless_service(lws)]
    for group in range(_get(lws, REPLICAS, CRD_DEFAULTS[REPLICAS])):
        leader = leader_pod(lws, group)
        result.append(leader)
        result += [worker_pod(lws, leader, i) for i in range(1, size)]
    return result
