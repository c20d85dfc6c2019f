"""Test inputs of the Kubernetes tests: the rendered deployments, seed 000's stated fields,
and deliberately broken variants of the seed 000 objects."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tandem.rankplan import plan_ranks
from tandem.render import kubernetes as k8s_render
from tandem.spec.cluster import LocalIsolation
from tandem.spec.deployment import Deployment, local_cluster
from tandem.spec.loading import load_cluster, load_recipe

ROOT = Path(__file__).resolve().parents[2]
SEEDS = ROOT / "tests" / "fixtures" / "seeds"
SEED000_NODES = {"<leader-node-name>": "spark-101", "<worker-node-name>": "spark-102"}


def seed000_deployment() -> Deployment:
    """The built-in recipe of seed 000 under the seed's own name (`dsv4-flash-tp2`, which the
    seed's manifests carry; the built-in deploys as `deepseek-v4-flash-dspark`)."""
    recipe = load_recipe("deepseek-v4-flash-dspark")
    return Deployment(
        recipe=recipe.model_copy(update={"name": "dsv4-flash-tp2"}),
        cluster=load_cluster(ROOT / "examples" / "dgx-spark-eks.yaml"),
    )


def deployments() -> dict[str, Deployment]:
    """Both seed deployments and the tiny one, each on its example cluster."""
    return {
        "seed000": seed000_deployment(),
        "seed002": Deployment(
            recipe=load_recipe("deepseek-v4-flash"),
            cluster=load_cluster(ROOT / "examples" / "dgx-spark-pair.yaml"),
        ),
        "tiny": Deployment(
            recipe=load_recipe("tiny-local"),
            cluster=local_cluster(2, isolation=LocalIsolation.NETNS),
        ),
    }


AGENT, LWS, SERVICE, ROUTER = 0, 1, 2, 6
"""Where ``k8s_render.objects`` puts each: the agent's ConfigMap first (the pods mount it), the
LeaderWorkerSet, its Service; with replicas the router's ServiceAccount, Role, RoleBinding and
Deployment after them."""


def rendered(deployment: Deployment) -> list[dict]:
    return k8s_render.objects(plan_ranks(deployment), deployment)


def seed_yaml(name: str) -> Any:
    data = yaml.safe_load((SEEDS / name).read_text())

    def fill(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: fill(v) for k, v in node.items()}
        if isinstance(node, list):
            return [fill(v) for v in node]
        return SEED000_NODES.get(node, node)

    return fill(data)


def seed000_lws() -> dict:
    """The seed's LeaderWorkerSet with its shared pod spec in both templates; the readiness
    probe stays on the leader only (the worker is headless and serves nothing), without the
    seed's ``initialDelaySeconds: 600``: tandem's startup probe covers the cold start, and
    readiness does not run before it succeeds (``tandem.render.kubernetes._probes``). Two
    additions: the compile cache hostPath the seed lacks (every pod restart compiled from
    scratch), and the node agent's ConfigMap, which the liveness probes run."""
    lws = seed_yaml("seed000-lws.yaml")
    pod = seed_yaml("seed000-podspec.yaml")
    template = lws["spec"]["leaderWorkerTemplate"]
    for key in ("leaderTemplate", "workerTemplate"):
        spec = copy.deepcopy(pod)
        if key == "workerTemplate":
            spec["containers"][0].pop("readinessProbe")
        else:
            spec["containers"][0]["readinessProbe"].pop("initialDelaySeconds")
        spec["volumes"].append(
            {
                "name": "compile-cache",
                "hostPath": {
                    "path": "/var/cache/tandem/" + lws["metadata"]["name"],
                    "type": "DirectoryOrCreate",
                },
            }
        )
        spec["containers"][0]["volumeMounts"].append(
            {"name": "compile-cache", "mountPath": "/cache/tandem"}
        )
        agent = k8s_render.agent_config_map_name(seed000_deployment())
        spec["volumes"].append(
            {"name": "tandem-agent", "configMap": {"name": agent, "defaultMode": 0o444}}
        )
        spec["containers"][0]["volumeMounts"].append(
            {"name": "tandem-agent", "mountPath": "/opt/tandem", "readOnly": True}
        )
        template[key]["spec"] |= spec
    return lws


def stated_mismatches(stated: Any, ours: Any, path: str = "") -> list[str]:
    """Where ``ours`` differs from what ``stated`` states (fields ``stated`` omits are free;
    list items with a ``name`` are matched by name)."""
    if isinstance(stated, dict):
        if not isinstance(ours, dict):
            return [f"{path}: {ours!r} is not a mapping"]
        out = []
        for key, value in stated.items():
            if key not in ours:
                out.append(f"{path}.{key}: missing (seed: {value!r})")
            else:
                out += stated_mismatches(value, ours[key], f"{path}.{key}")
        return out
    if isinstance(stated, list) and stated and all(isinstance(s, dict) for s in stated):
        if not isinstance(ours, list) or len(ours) != len(stated):
            return [
                f"{path}: {len(ours) if isinstance(ours, list) else ours!r} items, seed "
                f"{len(stated)}"
            ]
        if all("name" in s for s in stated):
            by_name = {o.get("name"): o for o in ours}
            if [s["name"] for s in stated] != [o.get("name") for o in ours]:
                return [
                    f"{path}: names {[o.get('name') for o in ours]}, seed "
                    f"{[s['name'] for s in stated]}"
                ]
            return [
                m
                for s in stated
                for m in stated_mismatches(s, by_name[s["name"]], f"{path}[{s['name']}]")
            ]
        return [
            m
            for i, (s, o) in enumerate(zip(stated, ours))
            for m in stated_mismatches(s, o, f"{path}[{i}]")
        ]
    return [] if stated == ours else [f"{path}: {ours!r}, seed {stated!r}"]


# --- broken variants -------------------------------------------------------------------------

LEADER = ("spec", "leaderWorkerTemplate", "leaderTemplate")


def _leader_container(objs: list[dict]) -> dict:
    return objs[LWS]["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]


@dataclass
class Broken:
    """One deliberate fault: how to make it, and words its rejection must contain offline and,
    where a 1.20 server checks it, from the server (``server`` None: only tandem checks it;
    ``pod_template``: only a core PodTemplate dry-run catches it)."""

    id: str
    mutate: Callable[[list[dict]], None]
    offline: str
    server: str | None = None
    pod_template: bool = False


def _set(path: tuple, value: Any) -> Callable[[list[dict]], None]:
    def mutate(objs: list[dict]) -> None:
        index, *keys = path
        target = objs[index]
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value

    return mutate


def _del_path(objs: list[dict]) -> None:
    spec = objs[LWS]["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
    del spec["volumes"][0]["hostPath"]["path"]


def _del_probe_port(objs: list[dict]) -> None:
    del _leader_container(objs)["readinessProbe"]["httpGet"]["port"]


def _rename_container(objs: list[dict]) -> None:
    _leader_container(objs)["name"] = "worker_0"


def _missing_volume(objs: list[dict]) -> None:
    _leader_container(objs)["volumeMounts"].append({"name": "models", "mountPath": "/models"})


def _gpu_eight(objs: list[dict]) -> None:
    _leader_container(objs)["resources"]["limits"]["nvidia.com/gpu"] = "eight"


def _unknown_lws_field(objs: list[dict]) -> None:
    objs[LWS]["spec"]["leaderWorkerTemplate"]["sizee"] = 2


def _unknown_service_field(objs: list[dict]) -> None:
    objs[SERVICE]["spec"]["ports"][0]["protocl"] = "TCP"


def _no_surge(objs: list[dict]) -> None:
    objs[LWS]["spec"]["rolloutStrategy"] = {
        "type": "RollingUpdate",
        "rollingUpdateConfiguration": {"maxUnavailable": 0, "maxSurge": 0},
    }


def _leader_ready(objs: list[dict]) -> None:
    objs[LWS]["spec"]["startupPolicy"] = "LeaderReady"


def _dns_policy(objs: list[dict]) -> None:
    objs[LWS]["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["dnsPolicy"] = (
        "ClusterFirst"
    )


def _select_worker(objs: list[dict]) -> None:
    objs[SERVICE]["spec"]["selector"]["role"] = "worker"


def _lws_env(objs: list[dict]) -> None:
    _leader_container(objs)["env"].append({"name": "LWS_WORKER_INDEX", "value": "0"})


BROKEN = [
    Broken(
        "container-name-underscore",
        _rename_container,
        "'worker_0' is not a DNS-1123 label",
        server="worker_0",
        pod_template=True,
    ),
    Broken(
        "volume-mount-without-volume",
        _missing_volume,
        "'models' names no volume",
        server="models",
        pod_template=True,
    ),
    Broken("gpu-limit-not-a-quantity", _gpu_eight, "'eight' is not a quantity", server="eight"),
    Broken("hostpath-without-path", _del_path, "'path' is a required property", server="path"),
    Broken(
        "readiness-probe-without-port",
        _del_probe_port,
        "'port' is a required property",
        server="port",
    ),
    Broken(
        "restart-policy-not-in-enum",
        _set((LWS, "spec", "leaderWorkerTemplate", "restartPolicy"), "Always"),
        "'Always' is not one of",
        server="restartPolicy",
    ),
    Broken("lws-unknown-field", _unknown_lws_field, "'sizee' was unexpected", server="sizee"),
    Broken(
        "size-as-string",
        _set((LWS, "spec", "leaderWorkerTemplate", "size"), "2"),
        "'2' is not of type 'integer'",
        server="size",
    ),
    Broken(
        "name-not-dns",
        _set((LWS, "metadata", "name"), "LLM_Serve"),
        "'LLM_Serve' is not a DNS-1035 label",
        server="LLM_Serve",
    ),
    Broken(
        "service-port-out-of-range",
        _set((SERVICE, "spec", "ports", 0, "port"), 70000),
        "70000 is not a port 1-65535",
        server="70000",
    ),
    Broken(
        "service-type-typo",
        _set((SERVICE, "spec", "type"), "LoadBalancr"),
        "'LoadBalancr' is not a Service type",
        server="LoadBalancr",
    ),
    Broken("service-unknown-field", _unknown_service_field, "protocl", server="protocl"),
    Broken(
        "size-zero", _set((LWS, "spec", "leaderWorkerTemplate", "size"), 0), "0 must be at least 1"
    ),
    Broken("service-named-vllm", _set((SERVICE, "metadata", "name"), "vllm"), "VLLM_PORT"),
    Broken("service-selects-worker", _select_worker, "does not match the leader pod's labels"),
    Broken("host-network-cluster-first", _dns_policy, "use ClusterFirstWithHostNet"),
    Broken("startup-leader-ready-deadlock", _leader_ready, "deadlocks"),
    Broken("rolling-update-no-surge-no-unavailable", _no_surge, "cannot both be 0"),
    Broken("sets-lws-injected-variable", _lws_env, "injected by LeaderWorkerSet"),
]


def broken_objects(case: Broken) -> list[dict]:
    objs = copy.deepcopy(rendered(seed000_deployment()))
    case.mutate(objs)
    return objs


def for_server_1_20(objs: list[dict]) -> list[dict]:
    """The objects without fields newer than the test server (1.20): loadBalancerClass (1.21)
    is checked offline against the newer schemas instead."""
    objs = copy.deepcopy(objs)
    for obj in objs:
        if obj.get("kind") == "Service":
            obj["spec"].pop("loadBalancerClass", None)
    return objs


def pod_templates(lws: dict) -> list[dict]:
    """Each LWS template as a core ``v1 PodTemplate``, so that a server runs full Pod
    validation on it (inside the LWS it is only checked against the CRD schema)."""
    name = lws["metadata"]["name"]
    result = []
    for key in ("leaderTemplate", "workerTemplate"):
        template = lws["spec"]["leaderWorkerTemplate"].get(key)
        if template is not None:
            result.append(
                {
                    "apiVersion": "v1",
                    "kind": "PodTemplate",
                    "metadata": {
                        "name": f"{name.lower().replace('_', '-')}-{key.removesuffix('Template')}",
                        "namespace": lws["metadata"].get("namespace", "default"),
                    },
                    "template": template,
                }
            )
    return result
