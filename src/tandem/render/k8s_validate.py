"""Checks of rendered Kubernetes objects, in two tiers.

1. ``check_objects`` (pure, always run by the renderer): what neither the LeaderWorkerSet CRD
   schema nor the API server checks, or what the server only checks on a real Pod that never
   gets created here. The LWS admission webhook's rules (``pkg/webhooks/
   leaderworkerset_webhook.go``: size >= 1, replicas 0..1,000,000, replicas x size <= MaxInt32,
   maxSurge/maxUnavailable format and not both 0, subGroupSize divides size or size-1), name
   formats, port ranges, the Service type enum, volumeMount -> volume references, quantity
   format, host network with ``ClusterFirstWithHostNet``, a Service that really selects the
   leader, and names whose Service-link variables would collide with the variables vLLM, NCCL,
   Gloo, Hugging Face or LeaderWorkerSet read (a Service ``vllm`` sets ``VLLM_PORT=tcp://...``).
2. ``schema_problems`` (needs the ``k8s`` extra and the CRD file): the LeaderWorkerSet against
   the CRD's ``openAPIV3Schema`` with unknown fields rejected (as the server's strict field
   validation does), and the Service and each pod template against the ``kubernetes`` client's
   models (unknown and missing required fields) and ``kubernetes-validate``'s strict schemas.

Every check returns all problems it finds, each with the object and field path, like the
webhook's ``field.ErrorList``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

from tandem import wire
from tandem.errors import Problem

MAX_INT32 = 2**31 - 1
MAX_REPLICAS = 1_000_000
SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer", "ExternalName")
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
IANA_SVC_NAME = re.compile(r"^(?=.*[a-z])[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$")
PERCENT_OR_INT = re.compile(r"^(\d+|\d+%)$")
READ_PREFIXES = ("VLLM_", "NCCL_", "GLOO_", "TP_", "HF_", "LWS_", "TORCH_", "CUDA_", "TANDEM_")
"""Variable prefixes that the ranks' programs read; a Service-link variable must not start so."""
INJECTED_BY_LWS = (wire.LWS_LEADER_ADDRESS, wire.LWS_GROUP_SIZE, wire.LWS_WORKER_INDEX)
LWS_POD_SUFFIX = "-0-99"
"""The longest pod-name suffix LeaderWorkerSet adds for a group of up to 100 pods."""


# --- tier 1: rules in Python ------------------------------------------------------------------


def service_link_prefix(service_name: str) -> str:
    """The prefix of the docker-link variables Kubernetes injects for a Service:
    ``vllm`` -> ``VLLM_`` (``VLLM_SERVICE_HOST``, ``VLLM_PORT``, ``VLLM_PORT_80_TCP``...)."""
    return service_name.upper().replace("-", "_") + "_"


def service_link_collision(service_name: str) -> str | None:
    """The prefix a Service's link variables would share with variables the ranks read."""
    prefix = service_link_prefix(service_name)
    for read in READ_PREFIXES:
        if prefix.startswith(read):
            return read
    return None


def _quantity_ok(value: Any) -> bool:
    return isinstance(value, int) or (isinstance(value, str) and bool(QUANTITY.match(value)))


def _label_ok(name: Any) -> bool:
    """A DNS-1123 label: what a volume, container or namespace may be named."""
    return isinstance(name, str) and bool(DNS1123_LABEL.match(name)) and len(name) <= 63


def _port_ok(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535


def lws_webhook_problems(lws: dict, where: str = "LeaderWorkerSet") -> Iterator[Problem]:
    """The LeaderWorkerSet admission webhook's rules (it is not part of the CRD schema)."""
    spec = lws.get("spec") or {}
    template = spec.get("leaderWorkerTemplate") or {}
    replicas = spec.get("replicas", 1)
    size = template.get("size", 1)
    path = f"{where}.spec"
    if isinstance(replicas, int) and not 0 <= replicas <= MAX_REPLICAS:
        yield Problem(
            f"{path}.replicas",
            f"{replicas} must be between 0 and {MAX_REPLICAS:,}",
            "use 1 group",
        )
    if isinstance(size, int) and size < 1:
        yield Problem(
            f"{path}.leaderWorkerTemplate.size",
            f"{size} must be at least 1 (pods per group, leader included)",
            "list at least one node",
        )
    if isinstance(size, int) and isinstance(replicas, int) and replicas * size > MAX_INT32:
        yield Problem(
            f"{path}",
            f"replicas x size = {replicas * size} exceeds {MAX_INT32}",
            "use fewer groups or smaller ones",
        )
    rolling = (spec.get("rolloutStrategy") or {}).get("rollingUpdateConfiguration") or {}
    rolling_path = f"{path}.rolloutStrategy.rollingUpdateConfiguration"
    values = {}
    for key in ("maxUnavailable", "maxSurge"):
        if key in rolling:
            value = rolling[key]
            text = str(value)
            if not PERCENT_OR_INT.match(text):
                yield Problem(
                    f"{rolling_path}.{key}",
                    f"'{value}' is neither a count nor a percentage",
                    "write e.g. 1 or 25%",
                )
            else:
                values[key] = int(text.rstrip("%"))
                if text.endswith("%") and values[key] > 100:
                    yield Problem(
                        f"{rolling_path}.{key}", f"{value} is above 100%", "use at most 100%"
                    )
    if values.get("maxUnavailable", 1) == 0 and values.get("maxSurge", 0) == 0 and rolling:
        yield Problem(
            rolling_path,
            "maxUnavailable and maxSurge cannot both be 0",
            "allow at least one unavailable or one surge group",
        )
    sub = template.get("subGroupPolicy") or {}
    if "subGroupSize" in sub and isinstance(size, int):
        sgs = sub["subGroupSize"]
        sgs_path = f"{path}.leaderWorkerTemplate.subGroupPolicy.subGroupSize"
        if not isinstance(sgs, int) or sgs < 1:
            yield Problem(sgs_path, f"{sgs} must be at least 1")
        elif size % sgs and (size - 1) % sgs:
            yield Problem(sgs_path, f"{sgs} divides neither size {size} nor size - 1")
    leader = _leader_template(lws)
    probes = [c.get("readinessProbe") for c in (leader.get("spec") or {}).get("containers") or []]
    if spec.get("startupPolicy") == "LeaderReady" and any(p and "httpGet" in p for p in probes):
        yield Problem(
            f"{path}.startupPolicy",
            "LeaderReady creates the workers only "
            "once the leader is Ready, but the leader's /health only answers "
            "after every worker joined: the group deadlocks",
            "use LeaderCreated (the leader waits at the rendezvous)",
        )


def _pod_spec_problems(spec: dict, path: str) -> Iterator[Problem]:
    volumes = spec.get("volumes") or []
    names = [v.get("name") for v in volumes]
    for i, name in enumerate(names):
        if not _label_ok(name):
            yield Problem(
                f"{path}.volumes[{i}].name",
                f"'{name}' is not a DNS-1123 label",
                "lower case letters, digits and dashes",
            )
        if names.count(name) > 1:
            yield Problem(f"{path}.volumes[{i}].name", f"'{name}' is listed twice")
        limit = (volumes[i].get("emptyDir") or {}).get("sizeLimit")
        if limit is not None and not _quantity_ok(limit):
            yield Problem(
                f"{path}.volumes[{i}].emptyDir.sizeLimit",
                f"'{limit}' is not a quantity",
                "write e.g. 64Gi",
            )
    if spec.get("hostNetwork") and spec.get("dnsPolicy") != "ClusterFirstWithHostNet":
        yield Problem(
            f"{path}.dnsPolicy",
            f"'{spec.get('dnsPolicy', 'ClusterFirst')}' "
            "with hostNetwork resolves through the node's resolver, so the "
            "LeaderWorkerSet's pod names do not resolve",
            "use ClusterFirstWithHostNet",
        )
    containers = spec.get("containers") or []
    if not containers:
        yield Problem(f"{path}.containers", "no container")
    for ci, container in enumerate(containers):
        yield from _container_problems(
            container, f"{path}.containers[{ci}]", names, bool(spec.get("hostNetwork"))
        )


def _container_problems(
    container: dict, cpath: str, volume_names: list, host_network: bool
) -> Iterator[Problem]:
    """One container of a pod: name, ports, probes, volume mounts, resources, variables."""
    name = container.get("name")
    if not _label_ok(name):
        yield Problem(
            f"{cpath}.name",
            f"'{name}' is not a DNS-1123 label",
            "lower case letters, digits and dashes, e.g. vllm",
        )
    port_names = set()
    for pi, port in enumerate(container.get("ports") or []):
        if not _port_ok(port.get("containerPort")):
            yield Problem(
                f"{cpath}.ports[{pi}].containerPort",
                f"{port.get('containerPort')} is not a port 1-65535",
            )
        if "name" in port:
            port_names.add(port["name"])
            if not IANA_SVC_NAME.match(str(port["name"])) or len(str(port["name"])) > 15:
                yield Problem(
                    f"{cpath}.ports[{pi}].name",
                    f"'{port['name']}' is "
                    "not a port name (at most 15 lower case letters, "
                    "digits, dashes, with a letter)",
                )
        if host_network and "hostPort" in port and port["hostPort"] != port.get("containerPort"):
            yield Problem(
                f"{cpath}.ports[{pi}].hostPort", "must equal containerPort with hostNetwork"
            )
    for probe_name in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = container.get(probe_name)
        if not probe:
            continue
        get = probe.get("httpGet") or probe.get("tcpSocket")
        if get is not None:
            port = get.get("port")
            if not (_port_ok(port) or port in port_names):
                yield Problem(
                    f"{cpath}.{probe_name}.port",
                    f"'{port}' is neither a port 1-65535 nor a named container port",
                )
    mounts = container.get("volumeMounts") or []
    for mi, mount in enumerate(mounts):
        if mount.get("name") not in volume_names:
            yield Problem(
                f"{cpath}.volumeMounts[{mi}].name",
                f"'{mount.get('name')}' names no volume of the pod",
                f"use one of {', '.join(map(str, volume_names)) or 'none'}",
            )
    paths = [m.get("mountPath") for m in mounts]
    for mi, mount_path in enumerate(paths):
        if paths.count(mount_path) > 1:
            yield Problem(
                f"{cpath}.volumeMounts[{mi}].mountPath", f"'{mount_path}' is mounted twice"
            )
    for section in ("limits", "requests"):
        for key, value in ((container.get("resources") or {}).get(section) or {}).items():
            if not _quantity_ok(value):
                yield Problem(
                    f"{cpath}.resources.{section}.{key}",
                    f"'{value}' is not a quantity",
                    'write e.g. "1"',
                )
            elif key == wire.NVIDIA_GPU_RESOURCE and not re.fullmatch(r"\d+", str(value)):
                yield Problem(
                    f"{cpath}.resources.{section}.{key}",
                    f"'{value}' is not a whole number of GPUs",
                )
    for ei, env in enumerate(container.get("env") or []):
        env_name = env.get("name")
        if not isinstance(env_name, str) or not ENV_NAME.match(env_name):
            yield Problem(f"{cpath}.env[{ei}].name", f"'{env_name}' is not a variable name")
        elif env_name in INJECTED_BY_LWS:
            yield Problem(
                f"{cpath}.env[{ei}].name",
                f"{env_name} is injected by LeaderWorkerSet and must not be set",
                "remove it",
            )


def _templates(lws: dict) -> Iterator[tuple[str, dict]]:
    template = (lws.get("spec") or {}).get("leaderWorkerTemplate") or {}
    for key in ("leaderTemplate", "workerTemplate"):
        if template.get(key) is not None:
            yield key, template[key]


def _leader_template(lws: dict) -> dict:
    """The leader's pod template; a group of one pod may give only the worker template."""
    templates = dict(_templates(lws))
    return templates.get("leaderTemplate") or templates.get("workerTemplate") or {}


def _where(obj: dict) -> str:
    """An object as problems name it: ``Kind/name``."""
    return f"{obj.get('kind', '?')}/{(obj.get('metadata') or {}).get('name')}"


def _name_problems(obj: dict, where: str) -> Iterator[Problem]:
    meta = obj.get("metadata") or {}
    name, namespace = meta.get("name"), meta.get("namespace")
    kind = obj.get("kind")
    if kind in ("Service", "LeaderWorkerSet"):
        # A LeaderWorkerSet's name is also its headless Service's name and its pods' prefix.
        if not isinstance(name, str) or not DNS1035_LABEL.match(name) or len(name) > 63:
            yield Problem(
                f"{where}.metadata.name",
                f"'{name}' is not a DNS-1035 label (a Service name)",
                "lower case letters, digits and dashes, starting with a letter",
            )
        elif kind == "LeaderWorkerSet" and len(name) + len(LWS_POD_SUFFIX) > 63:
            yield Problem(
                f"{where}.metadata.name",
                f"'{name}' is too long for its pods' host names ('{name}{LWS_POD_SUFFIX}' > 63)",
                f"use at most {63 - len(LWS_POD_SUFFIX)} characters",
            )
        elif collision := service_link_collision(name):
            yield Problem(
                f"{where}.metadata.name",
                f"Service '{name}' makes Kubernetes "
                f"inject {service_link_prefix(name)}SERVICE_HOST, "
                f"{service_link_prefix(name)}PORT... into pods, under the "
                f"{collision} prefix that the ranks read (a Service 'vllm' "
                "sets VLLM_PORT=tcp://... and vLLM fails)",
                "choose a name that does not start with " + collision.rstrip("_").lower(),
            )
    elif not isinstance(name, str) or not DNS1123_SUBDOMAIN.match(name) or len(name) > 253:
        yield Problem(f"{where}.metadata.name", f"'{name}' is not a DNS-1123 subdomain")
    if namespace is not None and not _label_ok(str(namespace)):
        yield Problem(
            f"{where}.metadata.namespace",
            f"'{namespace}' is not a namespace name (DNS-1123 label)",
        )


def _service_problems(
    svc: dict, where: str, leader_labels: dict | None, fronted: str = "the leader pod"
) -> Iterator[Problem]:
    spec = svc.get("spec") or {}
    kind = spec.get("type", "ClusterIP")
    if kind not in SERVICE_TYPES:
        yield Problem(
            f"{where}.spec.type",
            f"'{kind}' is not a Service type",
            f"use one of {', '.join(SERVICE_TYPES[:3])}",
        )
    if "loadBalancerClass" in spec and kind != "LoadBalancer":
        yield Problem(
            f"{where}.spec.loadBalancerClass",
            "only a LoadBalancer Service may have one",
            "remove it or use type LoadBalancer",
        )
    if "externalTrafficPolicy" in spec and kind not in ("NodePort", "LoadBalancer"):
        yield Problem(
            f"{where}.spec.externalTrafficPolicy",
            f"not allowed on a {kind} Service",
            "remove it",
        )
    ports = spec.get("ports") or []
    if not ports:
        yield Problem(f"{where}.spec.ports", "no port")
    for i, port in enumerate(ports):
        if not _port_ok(port.get("port")):
            yield Problem(
                f"{where}.spec.ports[{i}].port", f"{port.get('port')} is not a port 1-65535"
            )
        target = port.get("targetPort")
        if target is not None and not (
            _port_ok(target) or (isinstance(target, str) and IANA_SVC_NAME.match(target))
        ):
            yield Problem(
                f"{where}.spec.ports[{i}].targetPort",
                f"{target} is neither a port 1-65535 nor a port name",
            )
    selector = spec.get("selector") or {}
    if not selector:
        yield Problem(f"{where}.spec.selector", "selects nothing", "select the leader pod")
    elif leader_labels is not None and any(leader_labels.get(k) != v for k, v in selector.items()):
        yield Problem(
            f"{where}.spec.selector",
            f"{selector} does not match {fronted}'s labels {leader_labels}",
            f"select {wire.LWS_NAME_LABEL}: <name>, {wire.ROLE_LABEL}: leader"
            if fronted == "the leader pod"
            else f"select {wire.K8S_NAME_LABEL}: <name>-router",
        )


def check_objects(objects: list[dict]) -> list[Problem]:
    """Every rule of tier 1 over a rendered set of objects (LeaderWorkerSet, Service...)."""
    problems: list[Problem] = []
    leader_labels: dict | None = None
    for obj in objects:
        if obj.get("kind") == "LeaderWorkerSet":
            leader = _leader_template(obj)
            leader_labels = {
                **((leader.get("metadata") or {}).get("labels") or {}),
                wire.LWS_NAME_LABEL: (obj.get("metadata") or {}).get("name"),
            }
    fronted = "the leader pod"
    for obj in objects:  # with replicas the Service is in front of the router's pods
        if obj.get("kind") == "Deployment":
            router = ((obj.get("spec") or {}).get("template") or {}).get("metadata") or {}
            leader_labels, fronted = router.get("labels") or {}, "the router's pods"
    for obj in objects:
        kind, where = obj.get("kind", "?"), _where(obj)
        problems += _name_problems(obj, where)
        if kind == "LeaderWorkerSet":
            problems += lws_webhook_problems(obj, where)
            for key, template in _templates(obj):
                problems += _pod_spec_problems(
                    template.get("spec") or {}, f"{where}.spec.leaderWorkerTemplate.{key}.spec"
                )
        elif kind == "Service":
            problems += _service_problems(obj, where, leader_labels, fronted)
    return problems


# --- tier 2: schemas (the `k8s` extra) ----------------------------------------------------------


def _strict(schema: Any) -> Any:
    """The CRD schema as the server's strict field validation sees it: unknown fields are errors
    (``additionalProperties: false`` where properties are listed and unknown fields are not
    preserved), ``nullable`` allows null, ``int-or-string`` allows both."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if (
        "properties" in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
        and "additionalProperties" not in out
    ):
        out["additionalProperties"] = False
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"]
    if out.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    return out


@lru_cache(maxsize=4)
def _lws_validator(crd_path: str) -> Any:
    import jsonschema
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    crd = yaml.load(Path(crd_path).read_text(), Loader=loader)
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    schema = _strict(version["schema"]["openAPIV3Schema"])
    return jsonschema.Draft7Validator(schema)


def _path(where: str, parts: Any) -> str:
    """``where`` plus a schema error's path, written as tier 1 writes it: ``a.b[0].c``."""
    text = where
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text


def _pydantic_problems(model: Any, data: dict, where: str) -> list[Problem]:
    from pydantic import ValidationError

    try:
        model.model_validate(data)
    except ValidationError as exc:
        return [Problem(_path(where, e["loc"]), e["msg"]) for e in exc.errors()]
    return []


def schema_problems(
    objects: list[dict], crd_path: str | Path, kubernetes_version: str = "1.34"
) -> list[Problem]:
    """Tier 2: the LWS against its CRD schema, the rest against Kubernetes' own schemas.

    Needs ``pip install tandem-vllm[k8s]`` and the LeaderWorkerSet CRD YAML (the tests keep LWS
    v0.10.0's in ``tests/k8s/crd/``).
    """
    import kubernetes.client as k8s
    import kubernetes_validate

    problems: list[Problem] = []
    for obj in objects:
        kind, where = obj.get("kind", "?"), _where(obj)
        if kind == "LeaderWorkerSet":
            for err in _lws_validator(str(crd_path)).iter_errors(obj):
                problems.append(Problem(_path(where, err.absolute_path), err.message))
            for key, template in _templates(obj):
                path = f"{where}.spec.leaderWorkerTemplate.{key}"
                problems += _pydantic_problems(k8s.V1PodTemplateSpec, template, path)
                wrapped = {
                    "apiVersion": "v1",
                    "kind": "PodTemplate",
                    "metadata": {"name": "template"},
                    "template": template,
                }
                try:
                    kubernetes_validate.validate(wrapped, kubernetes_version, strict=True)
                except kubernetes_validate.ValidationError as exc:
                    problems.append(Problem(_path(path, list(exc.absolute_path)[1:]), exc.message))
            continue
        model = {"Service": k8s.V1Service, "Secret": k8s.V1Secret}.get(kind)
        if model is not None:
            problems += _pydantic_problems(model, obj, where)
        try:
            kubernetes_validate.validate(obj, kubernetes_version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            problems.append(Problem(_path(where, exc.absolute_path), exc.message))
        except kubernetes_validate.SchemaNotFoundError:
            pass
    return problems
