"""Against a real kube-apiserver 1.20.2 (etcd on loopback, LWS CRD installed): server-side
dry-run, apply and read-back of the rendered objects, pod templates as core PodTemplates,
broken variants refused, `tandem up`/`down` on `transport: k8s` as far as a cluster without
kubelet lets them go, the pod phase logic on real Pod objects, and the cluster checks.

The server has no scheduler, kubelet or controllers: the LeaderWorkerSet controller never
creates pods, so pods are created here by hand from the rendered templates where needed.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
import yaml

from k8s.apiserver import ApiServer
from k8s.manifests import (
    AGENT,
    BROKEN,
    LWS,
    ROOT,
    ROUTER,
    Broken,
    broken_objects,
    deployments,
    for_server_1_20,
    pod_templates,
    rendered,
    seed000_deployment,
    seed000_lws,
    seed_yaml,
    stated_mismatches,
)
from tandem import agent
from tandem.backends import k8s as backend
from tandem.backends.state import GroupState, RankState, list_deployments, load_state
from tandem.errors import BackendError, KubernetesError, RankFailed
from tandem.operations import lifecycle, supervisor
from tandem.render import kubernetes as k8s_render
from tandem.spec.cluster import Cluster
from tandem.spec.deployment import Deployment
from tandem.spec.loading import load_recipe

pytestmark = [pytest.mark.apiserver, pytest.mark.timeout(300)]


def as_list(objs: list[dict]) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": objs})


def dry_run(server: ApiServer, objs: list[dict]) -> subprocess.CompletedProcess:
    return server.kubectl(
        "apply", "--server-side", "--dry-run=server", "-f", "-", stdin=as_list(objs), check=False
    )


def in_namespace(objs: list[dict], namespace: str) -> list[dict]:
    for obj in objs:
        obj["metadata"]["namespace"] = namespace
    return objs


@pytest.fixture
def namespace(apiserver: ApiServer):
    name = f"t-{uuid.uuid4().hex[:8]}"
    apiserver.kubectl("create", "namespace", name)
    yield name
    apiserver.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def state_home(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    return tmp_path


# --- the rendered objects ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["seed000", "seed002", "tiny"])
def test_server_dry_run_accepts_rendered_deployment(apiserver, name):
    objs = for_server_1_20(rendered(deployments()[name]))
    done = dry_run(apiserver, objs)
    assert done.returncode == 0, done.stderr
    assert "serverside-applied (server dry run)" in done.stdout
    templates = dry_run(apiserver, pod_templates(objs[LWS]))
    assert templates.returncode == 0, templates.stderr


def test_seed000_apply_and_read_back_field_by_field(apiserver, namespace):
    objs = in_namespace(for_server_1_20(rendered(seed000_deployment())), namespace)
    kubectl = backend.Kubectl(
        backend.kubectl_program(Cluster.model_fields["kubernetes"].default_factory()), namespace
    )
    kubectl.apply(objs)
    lws = kubectl.get_json("leaderworkersets.leaderworkerset.x-k8s.io", "dsv4-flash-tp2")
    svc = kubectl.get_json("service", "dsv4-flash-tp2-external")
    assert stated_mismatches(seed000_lws(), lws) == []
    seed_service = seed_yaml("seed000-lb.yaml")
    seed_service["spec"].pop("loadBalancerClass")  # 1.21+, checked offline
    assert stated_mismatches(seed_service, svc) == []
    # What the server filled in: a cluster IP, a node port, our field manager.
    assert svc["spec"]["clusterIP"].startswith("10.96.")
    assert 30000 <= svc["spec"]["ports"][0]["nodePort"] <= 32767
    managed = json.loads(
        apiserver.kubectl(
            "-n",
            namespace,
            "get",
            "leaderworkersets",
            "dsv4-flash-tp2",
            "-o",
            "json",
            "--show-managed-fields",
        ).stdout
    )["metadata"]["managedFields"]
    assert [(m["manager"], m["operation"]) for m in managed] == [(backend.FIELD_MANAGER, "Apply")]
    # The whole rendered object survives the round trip (the CRD schema pruned nothing).
    assert stated_mismatches(objs[LWS]["spec"], lws["spec"]) == []
    kubectl.delete(
        [
            "leaderworkersets.leaderworkerset.x-k8s.io/dsv4-flash-tp2",
            "service/dsv4-flash-tp2-external",
        ]
    )
    assert kubectl.get_json("service", "dsv4-flash-tp2-external") is None


def test_cli_render_output_applies_server_side(apiserver):
    rendered_text = subprocess.run(
        [
            sys.executable,
            "-m",
            "tandem.cli",
            "render",
            "deepseek-v4-flash-dspark",
            "--cluster",
            str(ROOT / "examples" / "dgx-spark-eks.yaml"),
            "--target",
            "k8s",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    objs = for_server_1_20(list(yaml.safe_load_all(rendered_text)))
    done = dry_run(apiserver, objs)
    assert done.returncode == 0, done.stderr
    # The printed file passes through the secret redactor: the agent the pods run comes out
    # whole (its words once looked like secrets to it, tandem.agent._sorted_by).
    assert objs[AGENT]["data"]["agent.py"] == agent.source()


def test_replicas_and_the_router_apply_and_read_back(apiserver, namespace, tmp_path):
    """Two LeaderWorkerSet groups of seed 000 on four Sparks behind vllm-router, rendered by the
    CLI and created for real: the server keeps every field, the router's ServiceAccount may
    watch pods, and the Service fronts the router."""
    recipe = (ROOT / "src/tandem/recipes/deepseek-v4-flash-dspark.yaml").read_text()
    (tmp_path / "r.yaml").write_text(
        recipe + "replicas: 2\nrouter: {image: registry.example/vllm-router:0.1.17}\n"
    )
    cluster = (ROOT / "examples" / "dgx-spark-eks-four.yaml").read_text()
    (tmp_path / "c.yaml").write_text(
        cluster.replace("namespace: default", f"namespace: {namespace}")
    )
    text = subprocess.run(
        [sys.executable, "-m", "tandem.cli", "render", str(tmp_path / "r.yaml"),
         "--cluster", str(tmp_path / "c.yaml"), "--target", "k8s"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    objs = for_server_1_20(list(yaml.safe_load_all(text)))
    assert [o["kind"] for o in objs] == [
        "ConfigMap", "LeaderWorkerSet", "Service",
        "ServiceAccount", "Role", "RoleBinding", "Deployment",
    ]  # fmt: skip
    kubectl = backend.Kubectl(
        backend.kubectl_program(Cluster.model_fields["kubernetes"].default_factory()), namespace
    )
    kubectl.apply(objs)
    lws = kubectl.get_json("leaderworkersets.leaderworkerset.x-k8s.io", "deepseek-v4-flash-dspark")
    assert lws["spec"]["replicas"] == 2
    assert stated_mismatches(objs[LWS]["spec"], lws["spec"]) == []
    router = kubectl.get_json("deployment", "deepseek-v4-flash-dspark-router")
    assert stated_mismatches(objs[ROUTER]["spec"], router["spec"]) == []
    allowed = apiserver.kubectl(
        "auth", "can-i", "watch", "pods", "-n", namespace,
        f"--as=system:serviceaccount:{namespace}:deepseek-v4-flash-dspark-router", check=False,
    )  # fmt: skip
    assert allowed.stdout.strip() == "yes", allowed.stdout + allowed.stderr
    refused = apiserver.kubectl(
        "auth", "can-i", "delete", "pods", "-n", namespace,
        f"--as=system:serviceaccount:{namespace}:deepseek-v4-flash-dspark-router", check=False,
    )  # fmt: skip
    assert refused.stdout.strip() == "no"
    service = kubectl.get_json("service", "deepseek-v4-flash-dspark-external")
    assert service["spec"]["selector"] == {
        "app.kubernetes.io/name": "deepseek-v4-flash-dspark-router"
    }


# --- broken variants -----------------------------------------------------------------------------

SERVER_CHECKED = [c for c in BROKEN if c.server]


@pytest.mark.parametrize("case", SERVER_CHECKED, ids=[c.id for c in SERVER_CHECKED])
def test_broken_variant_refused_by_the_server(apiserver, case: Broken):
    objs = for_server_1_20(broken_objects(case))
    if case.pod_template:
        # Inside the LWS a template is custom-resource data: only the CRD schema sees it...
        assert dry_run(apiserver, objs).returncode == 0
        # ...so full Pod validation needs the template as a core PodTemplate.
        objs = pod_templates(objs[LWS])
    done = dry_run(apiserver, objs)
    assert done.returncode != 0, f"{case.id} accepted"
    assert case.server in done.stderr, done.stderr


def test_webhook_only_rules_pass_the_server_but_not_tandem(apiserver):
    # size 0 is the LWS webhook's rule: the CRD schema and the server accept it.
    case = next(c for c in BROKEN if c.id == "size-zero")
    objs = for_server_1_20(broken_objects(case))
    assert dry_run(apiserver, objs).returncode == 0


# --- tandem up / status / down on transport: k8s -----------------------------------------------


def k8s_deployment(namespace: str, name: str = "tdm-lws") -> Deployment:
    recipe = load_recipe("tiny-local").model_copy(update={"name": name})
    cluster = Cluster.model_validate(
        {
            "name": "test-k8s",
            "transport": "k8s",
            "namespace": namespace,
            "nodes": [
                {"name": "node-a", "address": "192.0.2.10"},
                {"name": "node-b", "address": "192.0.2.11"},
            ],
        }
    )
    return Deployment(recipe=recipe, cluster=cluster)


def test_up_applies_reports_no_pods_and_down_deletes(apiserver, namespace, state_home, monkeypatch):
    deployment = k8s_deployment(namespace)
    monkeypatch.setenv("VLLM_API_KEY", "sk-test-key")
    events: list[str] = []
    monkeypatch.setattr(backend.KubernetesBackend, "appear_timeout_s", 2.0)
    with pytest.raises(RankFailed) as caught:
        lifecycle.up(deployment, preflight=False, timeout_s=60, on_event=events.append)
    message = str(caught.value)
    assert "LeaderWorkerSet controller did not create it" in message, message
    assert "tandem down tdm-lws" in message
    agent_map = k8s_render.agent_config_map_name(deployment)
    assert any(
        f"applied (server-side) Secret/tdm-lws-api-key, ConfigMap/{agent_map}, "
        "LeaderWorkerSet/tdm-lws, Service/tdm-lws-api" in e
        for e in events
    ), events
    assert any("pod tdm-lws-0-1: not created" in e for e in events), events

    # Read back what up applied: the objects stay for inspection after a failed start.
    kubectl = backend.Kubectl.of(deployment.cluster)
    lws = kubectl.get_json("leaderworkersets.leaderworkerset.x-k8s.io", "tdm-lws")
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    secret = kubectl.get_json("secret", "tdm-lws-api-key")
    assert base64.b64decode(secret["data"]["api-key"]) == b"sk-test-key"
    assert (
        "sk-test-key"
        not in (state_home / "state" / "deployments" / "tdm-lws" / "state.json").read_text()
    )
    state = load_state("tdm-lws")
    assert state.backend == "k8s" and [r.log for g in state.groups for r in g.ranks] == [
        "pod/tdm-lws-0",
        "pod/tdm-lws-0-1",
    ]
    status = lifecycle.status("tdm-lws")
    assert [r.state for r in status.ranks] == ["exited", "exited"]
    # No pod, no log: `tandem logs` reads nothing rather than failing.
    assert list(lifecycle.log_lines("tdm-lws")) == []

    # A second up refuses while the LeaderWorkerSet exists.
    with pytest.raises(BackendError, match="already exists"):
        lifecycle.up(deployment, preflight=False, timeout_s=5)

    gone: list[str] = []
    lifecycle.down("tdm-lws", on_event=gone.append)
    for ref in (
        "leaderworkersets.leaderworkerset.x-k8s.io/tdm-lws",
        "service/tdm-lws-api",
        "secret/tdm-lws-api-key",
        f"configmap/{agent_map}",
    ):
        assert kubectl.get_json(ref) is None, ref
    assert any("no pod of 'tdm-lws' is left" in g for g in gone)


def test_up_of_replicas_applies_every_group_and_the_router_and_down_deletes_them(
    apiserver, namespace, state_home, monkeypatch
):
    """``replicas: 2`` on Kubernetes is one apply: the LeaderWorkerSet's two groups and vLLM's
    router (Deployment, its ServiceAccount and Role to watch the leaders, the Service in front of
    it). Each group's pods are ranks of the state, judged group by group; ``down`` deletes it
    all. (This API server runs no LWS controller, so no pod appears.)"""
    one = k8s_deployment(namespace, "tdm-fleet")
    recipe = one.recipe.model_validate(
        {
            **one.recipe.model_dump(mode="json", exclude_unset=True),
            "replicas": 2,
            "router": {"image": "registry.example/vllm-router:0.1.17"},
        }
    )
    nodes = [{"name": f"node-{i}", "address": f"192.0.2.{10 + i}"} for i in range(4)]
    kubernetes = {**one.cluster.kubernetes.model_dump(mode="json"), "leader_address": "lws"}
    cluster = Cluster.model_validate(
        {**one.cluster.model_dump(mode="json"), "nodes": nodes, "kubernetes": kubernetes}
    )
    deployment = Deployment(recipe=recipe, cluster=cluster)
    monkeypatch.setattr(backend.KubernetesBackend, "appear_timeout_s", 2.0)
    events: list[str] = []
    with pytest.raises(RankFailed, match="LeaderWorkerSet controller did not create it"):
        lifecycle.up(deployment, preflight=False, timeout_s=60, on_event=events.append)
    applied = next(e for e in events if e.startswith("applied"))
    for ref in (
        "LeaderWorkerSet/tdm-fleet",
        "Service/tdm-fleet-api",
        "ServiceAccount/tdm-fleet-router",
        "Role/tdm-fleet-router",
        "RoleBinding/tdm-fleet-router",
        "Deployment/tdm-fleet-router",
    ):
        assert ref in applied, applied
    kubectl = backend.Kubectl.of(cluster)
    lws = kubectl.get_json("leaderworkersets.leaderworkerset.x-k8s.io", "tdm-fleet")
    assert lws["spec"]["replicas"] == 2 and lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    service = kubectl.get_json("service", "tdm-fleet-api")
    assert service["spec"]["selector"] == {"app.kubernetes.io/name": "tdm-fleet-router"}

    state = load_state("tdm-fleet")
    assert state.endpoint == f"http://tdm-fleet-api.{namespace}.svc:80"  # the router's Service
    assert [(r.rank, r.group, r.log) for g in state.groups for r in g.ranks] == [
        (0, 0, "pod/tdm-fleet-0"),
        (1, 0, "pod/tdm-fleet-0-1"),
        (2, 1, "pod/tdm-fleet-1"),
        (3, 1, "pod/tdm-fleet-1-1"),
    ]
    status = lifecycle.status("tdm-fleet")
    assert [(g.group, g.name, [r.rank for r in g.ranks]) for g in status.groups] == [
        (0, "tdm-fleet-0", [0, 1]),
        (1, "tdm-fleet-1", [2, 3]),
    ]
    assert {g.verdict.value for g in status.groups} == {"down"} and status.verdict.value == "down"
    shown = subprocess.run(
        [sys.executable, "-m", "tandem.cli", "status", "tdm-fleet"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert "group 1 (tdm-fleet-1, ranks 2, 3): down" in shown.stdout, shown.stdout + shown.stderr
    # Kubernetes restarts a group itself, and the router follows the leaders' readiness.
    with pytest.raises(BackendError, match="Kubernetes restarts a broken group itself"):
        supervisor.supervise("tdm-fleet")

    gone: list[str] = []
    lifecycle.down("tdm-fleet", on_event=gone.append)
    for ref in (
        "leaderworkersets.leaderworkerset.x-k8s.io/tdm-fleet",
        "service/tdm-fleet-api",
        "deployment/tdm-fleet-router",
        "serviceaccount/tdm-fleet-router",
        "role/tdm-fleet-router",
        "rolebinding/tdm-fleet-router",
    ):
        assert kubectl.get_json(ref) is None, ref


def test_up_refused_by_the_server_names_the_field(apiserver, namespace, state_home):
    # A namespace that does not exist: the server refuses, and up says so.
    deployment = k8s_deployment(namespace + "-missing")
    with pytest.raises(BackendError) as caught:
        lifecycle.up(deployment, preflight=False, timeout_s=5)
    assert "not found" in str(caught.value)
    assert list_deployments() == []  # nothing to stop: the next up starts clean


def test_an_apply_refused_half_way_leaves_nothing_behind(
    apiserver, namespace, state_home, monkeypatch
):
    """kubectl applies a list object by object: a namespace quota that allows no Service lets
    the Secret, the agent's ConfigMap and the LeaderWorkerSet in before the Service is refused.
    up deletes them and forgets the deployment, so the next up is not blocked by them."""
    apiserver.kubectl("-n", namespace, "create", "quota", "no-services", "--hard=services=0")
    # What the quota controller (not run here) would report: admission judges by the status.
    quota = json.loads(apiserver.kubectl("-n", namespace, "get", "quota", "no-services",
                                         "-o", "json").stdout)  # fmt: skip
    quota["status"] = {"hard": {"services": "0"}, "used": {"services": "0"}}
    apiserver.kubectl(
        "replace", "--raw",
        f"/api/v1/namespaces/{namespace}/resourcequotas/no-services/status", "-f", "-",
        stdin=json.dumps(quota),
    )  # fmt: skip
    deployment = k8s_deployment(namespace, "tdm-quota")
    monkeypatch.setenv("VLLM_API_KEY", "sk-test-key")
    with pytest.raises(KubernetesError) as caught:
        lifecycle.up(deployment, preflight=False, timeout_s=5)
    assert "no-services" in str(caught.value), caught.value
    kubectl = backend.Kubectl.of(deployment.cluster)
    for ref in (
        "leaderworkersets.leaderworkerset.x-k8s.io/tdm-quota",
        "secret/tdm-quota-api-key",
        f"configmap/{k8s_render.agent_config_map_name(deployment)}",
    ):
        assert kubectl.get_json(ref) is None, ref
    assert list_deployments() == []
    apiserver.kubectl("-n", namespace, "delete", "quota", "no-services")
    monkeypatch.setattr(backend.KubernetesBackend, "appear_timeout_s", 1.0)
    with pytest.raises(RankFailed, match="LeaderWorkerSet controller did not create it"):
        lifecycle.up(deployment, preflight=False, timeout_s=30)  # applied whole this time
    lifecycle.down("tdm-quota")


def test_cli_up_dispatches_on_the_transport(apiserver, namespace, state_home, tmp_path):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(k8s_deployment(namespace).cluster.model_dump(mode="json")))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tandem.cli",
            "up",
            "tiny-local",
            "--cluster",
            str(cluster),
            "--dry-run",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    # one apply creates every rank's pod: printed once, not once a rank
    assert done.stdout.count("apply --server-side") == 1, done.stdout
    assert "# tiny-local: ranks 0, 1, all at once" in done.stdout


# --- pods: phases and failures on real Pod objects ----------------------------------------------


def create_pod(
    server: ApiServer,
    namespace: str,
    deployment: Deployment,
    worker_index: int,
    status: dict | None = None,
    node: str | None = None,
    group: int = 0,
) -> None:
    """A pod as the LWS controller would create it: its template, its name and labels."""
    lws = rendered(deployment)[LWS]
    key = "leaderTemplate" if worker_index == 0 else "workerTemplate"
    template = lws["spec"]["leaderWorkerTemplate"][key]
    name = k8s_render.pod_name(deployment, worker_index, group)
    labels = {
        **template["metadata"]["labels"],
        "leaderworkerset.sigs.k8s.io/name": deployment.name,
        "leaderworkerset.sigs.k8s.io/worker-index": str(worker_index),
        "leaderworkerset.sigs.k8s.io/group-index": str(group),
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {**template["spec"], **({"nodeName": node} if node else {})},
    }
    server.kubectl("create", "-f", "-", stdin=json.dumps(pod))
    if status:
        server.kubectl(
            "-n",
            namespace,
            "patch",
            "pod",
            name,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps({"status": status}),
        )


def _now(delta_s: float = 0) -> str:
    return (datetime.now(UTC) + timedelta(seconds=delta_s)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _container_status(**state) -> dict:
    return {
        "containerStatuses": [
            {
                "name": "vllm",
                "image": "img",
                "imageID": "",
                "ready": False,
                "restartCount": state.pop("restarts", 0),
                **state,
            }
        ]
    }


def test_pod_phases_and_failures_from_real_pods(apiserver, namespace):
    deployment = k8s_deployment(namespace, name="phases")
    kubectl = backend.Kubectl.of(deployment.cluster)
    view = backend.GroupView(kubectl, "phases", max_age_s=0)
    seen: list[str] = []
    leader = backend.PodRank(0, "phases-0", view, on_event=seen.append, appear_timeout_s=600)
    worker = backend.PodRank(1, "phases-0-1", view, on_event=seen.append, appear_timeout_s=600)
    assert leader.exit_code() is None and seen == ["rank 0 pod phases-0: not created"]

    create_pod(apiserver, namespace, deployment, 0, node="node-a")  # as if bound by a scheduler
    assert leader.exit_code() is None
    assert seen[-1] == "rank 0 pod phases-0: Pending on node-a"

    # Unschedulable for longer than the grace period: a wrong node label never heals.
    create_pod(
        apiserver,
        namespace,
        deployment,
        1,
        status={
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "lastTransitionTime": _now(-600),
                    "message": "0/2 nodes are available: 2 node(s) didn't match node selector.",
                }
            ],
        },
    )
    assert worker.exit_code() == 1
    assert seen[-1] == "rank 1 pod phases-0-1: Pending (unscheduled)"
    assert "Unschedulable: 0/2 nodes are available" in worker.recent_text()

    # Running and ready: the leader is up and rank_running says so.
    apiserver.kubectl(
        "-n",
        namespace,
        "patch",
        "pod",
        "phases-0",
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(
            {
                "status": {
                    "phase": "Running",
                    **_container_status(ready=True, state={"running": {"startedAt": _now()}}),
                }
            }
        ),
    )
    assert leader.exit_code() is None
    assert seen[-1] == "rank 0 pod phases-0: Running on node-a, ready"
    state = type(
        "S",
        (),
        {
            "network": {
                "namespace": namespace,
                "kubectl": kubectl.program,
                "kubeconfig": None,
                "context": None,
            }
        },
    )()
    rank = type("R", (), {"log": "pod/phases-0"})()
    assert backend.KubernetesBackend().rank_running(state, rank)

    # A crash: restarted after exit 1 -> the group is being recreated, up gives up with the cause.
    apiserver.kubectl(
        "-n",
        namespace,
        "patch",
        "pod",
        "phases-0",
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(
            {
                "status": _container_status(
                    restarts=1,
                    state={"waiting": {"reason": "CrashLoopBackOff"}},
                    lastState={
                        "terminated": {
                            "exitCode": 1,
                            "reason": "Error",
                            "message": "RuntimeError: NCCL error",
                        }
                    },
                )
            }
        ),
    )
    assert leader.exit_code() == 1
    assert "exited with status 1 (Error): RuntimeError: NCCL error" in leader.failure[1]
    assert seen[-1] == "rank 0 pod phases-0: Running on node-a: CrashLoopBackOff, restarts 1"

    # The pod's events are reported with the failure.
    apiserver.kubectl(
        "create",
        "-f",
        "-",
        stdin=json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": "phases-0.1", "namespace": namespace},
                "involvedObject": {"kind": "Pod", "name": "phases-0", "namespace": namespace},
                "type": "Warning",
                "reason": "BackOff",
                "count": 3,
                "lastTimestamp": _now(),
                "message": "Back-off restarting failed container vllm",
            }
        ),
    )
    assert backend.event_lines(kubectl.events("phases-0")) == [
        "Warning BackOff: Back-off restarting failed container vllm (x3)"
    ]
    assert "event Warning BackOff" in leader.recent_text()
    assert "PodError: the container exited with status 1" in leader.recent_text()


def test_replicas_are_ready_when_every_groups_leader_pod_is(apiserver, namespace, state_home):
    """With replicas, a completion through the router is not enough: the router sends requests
    only to leaders whose pods are Ready, so `up` waits for every group's (real Pod objects,
    their status written as a kubelet would)."""
    deployment = k8s_deployment(namespace, name="ready2")
    for group, ready in ((0, "True"), (1, "False")):
        conditions = [{"type": "Ready", "status": ready}]
        status = {"phase": "Running", "conditions": conditions, "podIP": f"10.1.{group}.5"}
        create_pod(apiserver, namespace, deployment, 0, status=status, node="node-a", group=group)
    state = GroupState(
        name="ready2",
        backend="k8s",
        recipe={},
        cluster={},
        endpoint="http://ready2-api.svc:80",
        model="m",
        ranks=[
            RankState(
                rank=2 * g, group=g, node="", role="leader", address="", log=f"pod/ready2-{g}"
            )
            for g in (0, 1)
        ],
    )
    view = backend.GroupView(backend.Kubectl.of(deployment.cluster), "ready2", max_age_s=0)
    with pytest.raises(RankFailed, match=r"group\(s\) 1 \(pod/ready2-1\) is not Ready"):
        backend.await_leaders_ready(state, view, time.monotonic())
    ready = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    apiserver.kubectl(
        "-n", namespace, "patch", "pod", "ready2-1", "--subresource=status", "--type=merge",
        "-p", json.dumps(ready),
    )  # fmt: skip
    backend.await_leaders_ready(state, view, time.monotonic() + 30)


def test_image_pull_back_off_fails_at_once(apiserver, namespace):
    deployment = k8s_deployment(namespace, name="pull")
    create_pod(
        apiserver,
        namespace,
        deployment,
        0,
        status={
            "phase": "Pending",
            **_container_status(
                state={
                    "waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}
                }
            ),
        },
    )
    kubectl = backend.Kubectl.of(deployment.cluster)
    rank = backend.PodRank(0, "pull-0", backend.GroupView(kubectl, "pull", max_age_s=0))
    assert rank.exit_code() == 1
    assert rank.failure[1] == (
        "ImagePullBackOff: the image cannot be pulled: Back-off pulling image"
    )


# --- tandem check on Kubernetes ----------------------------------------------------------------


def test_cluster_checks_crd_nodes_and_gpus(apiserver, namespace):
    cluster = k8s_deployment(namespace).cluster
    problems = [str(p) for p in backend.cluster_problems(cluster)]
    assert problems == [
        "nodes[0].name: no Kubernetes node is labelled kubernetes.io/hostname=node-a (fix: use "
        "the NAME column of `kubectl get nodes`)",
        "nodes[1].name: no Kubernetes node is labelled kubernetes.io/hostname=node-b (fix: use "
        "the NAME column of `kubectl get nodes`)",
    ]
    for name, gpus in (("node-a", "1"), ("node-b", None)):
        apiserver.kubectl(
            "create",
            "-f",
            "-",
            stdin=json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
                }
            ),
        )
        if gpus:
            apiserver.kubectl(
                "patch",
                "node",
                name,
                "--subresource=status",
                "--type=merge",
                "-p",
                json.dumps(
                    {
                        "status": {
                            "capacity": {"nvidia.com/gpu": gpus},
                            "allocatable": {"nvidia.com/gpu": gpus},
                        }
                    }
                ),
            )
    try:
        problems = [str(p) for p in backend.cluster_problems(cluster)]
        assert problems == [
            "nodes[1]: node node-b advertises no nvidia.com/gpu (fix: install "
            "the NVIDIA GPU Operator (device plugin))"
        ]
        missing = cluster.model_copy(update={"namespace": "nowhere"})
        assert "namespace 'nowhere' does not exist" in str(backend.cluster_problems(missing)[0])
    finally:
        apiserver.kubectl("delete", "node", "node-a", "node-b", check=False)


# --- tandem check and the CLI's up/down, through the preflight ---------------------------------

IMAGE = "ghcr.io/anemll/dspark-vllm-gx10"
DIGEST = "sha256:" + "ab" * 32


def add_node(server: ApiServer, name: str, gpus: str | None) -> None:
    """A Node as a kubelet and the NVIDIA device plugin would report it."""
    server.kubectl(
        "create",
        "-f",
        "-",
        stdin=json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            }
        ),
    )
    status: dict = {
        "nodeInfo": {
            "kernelVersion": "6.17.0-1026-nvidia",
            "osImage": "Ubuntu 24.04.3 LTS",
            "architecture": "arm64",
            "kubeletVersion": "v1.33.5",
            "containerRuntimeVersion": "containerd://1.7.27",
            "machineID": "",
            "systemUUID": "",
            "bootID": "",
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
        },
        "images": [{"names": [f"{IMAGE}@{DIGEST}", f"{IMAGE}:0.1.1"], "sizeBytes": 9_000_000_000}],
    }
    if gpus:
        status |= {"capacity": {"nvidia.com/gpu": gpus}, "allocatable": {"nvidia.com/gpu": gpus}}
    server.kubectl(
        "patch",
        "node",
        name,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
    )


def test_tandem_check_reads_the_nodes_from_the_api(apiserver, namespace):
    from tandem.operations.preflight import run_check

    deployment = k8s_deployment(namespace)
    recipe = deployment.recipe.model_copy(
        update={"engine": deployment.recipe.engine.model_copy(update={"image": f"{IMAGE}:0.1.1"})}
    )
    deployment = Deployment(recipe=recipe, cluster=deployment.cluster)
    add_node(apiserver, "node-a", "1")
    add_node(apiserver, "node-b", None)
    try:
        report = run_check(deployment)
        errors = [(f.node, f.evidence) for f in report.errors]
        assert errors == [
            (
                "node-b",
                "nodes[1]: node node-b advertises no nvidia.com/gpu (fix: "
                "install the NVIDIA GPU Operator (device plugin))",
            )
        ], errors
        facts = report.nodes["node-a"]
        assert facts["system"]["kernel"] == "6.17.0-1026-nvidia"
        assert facts["images"]["images"] == [
            {"ref": f"{IMAGE}:0.1.1", "id": None, "digest": DIGEST}
        ]
        apiserver.kubectl(
            "patch",
            "node",
            "node-b",
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps({"status": {"allocatable": {"nvidia.com/gpu": "1"}}}),
        )
        assert run_check(deployment).errors == []
    finally:
        apiserver.kubectl("delete", "node", "node-a", "node-b", check=False)


def test_cli_up_runs_the_preflight_applies_and_down_deletes(
    apiserver, namespace, state_home, tmp_path
):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(k8s_deployment(namespace).cluster.model_dump(mode="json")))
    # The tiny recipe with an image the nodes have (the preflight checks the image, not a
    # host-installed vLLM, when the recipe names one).
    recipe = load_recipe("tiny-local").model_dump(mode="json", exclude_defaults=True)
    recipe["engine"]["image"] = f"{IMAGE}:0.1.1"
    recipe_file = tmp_path / "tiny-local.yaml"
    recipe_file.write_text(yaml.safe_dump(recipe))
    tandem = [sys.executable, "-m", "tandem.cli"]
    # No nodes yet: the preflight refuses, nothing is applied.
    refused = subprocess.run(
        [*tandem, "up", str(recipe_file), "--cluster", str(cluster), "--timeout", "5"],
        capture_output=True,
        text=True,
    )
    assert refused.returncode != 0
    said = " ".join((refused.stdout + refused.stderr).split())  # rich wraps long lines
    assert "no Kubernetes node is labelled kubernetes.io/hostname=node-a" in said, said
    assert "refusing to launch 'tiny-local'" in said
    kubectl = backend.Kubectl.of(k8s_deployment(namespace).cluster)
    assert kubectl.get_json("leaderworkersets.leaderworkerset.x-k8s.io", "tiny-local") is None
    add_node(apiserver, "node-a", "1")
    add_node(apiserver, "node-b", "1")
    try:
        up = subprocess.run(
            [*tandem, "up", str(recipe_file), "--cluster", str(cluster), "--timeout", "5"],
            capture_output=True,
            text=True,
        )
        out = " ".join((up.stdout + up.stderr).split())
        assert up.returncode != 0, out
        assert (
            "applied (server-side) ConfigMap/tiny-local-agent-" in out
            and ", LeaderWorkerSet/tiny-local, Service/tiny-local-api" in out
        ), out
        assert "not ready after 5 s" in out
        assert kubectl.get_json("leaderworkersets.leaderworkerset.x-k8s.io", "tiny-local")
        down = subprocess.run([*tandem, "down", "tiny-local"], capture_output=True, text=True)
        assert down.returncode == 0, down.stdout + down.stderr
        assert kubectl.get_json("leaderworkersets.leaderworkerset.x-k8s.io", "tiny-local") is None
        assert kubectl.get_json("service", "tiny-local-api") is None
    finally:
        apiserver.kubectl("delete", "node", "node-a", "node-b", check=False)
