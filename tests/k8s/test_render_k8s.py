"""`tandem render --target k8s`: seed 000 field by field, offline schema validation of every
rendered deployment, the Ray-free argument modes, and deliberately broken variants."""

from __future__ import annotations

import hashlib
import inspect
import json

import pytest
import yaml
from factories import make_cluster, make_deployment, make_recipe

from k8s.manifests import (
    AGENT,
    BROKEN,
    LWS,
    SERVICE,
    Broken,
    broken_objects,
    deployments,
    rendered,
    seed000_deployment,
    seed000_lws,
    seed_yaml,
    stated_mismatches,
)
from tandem import agent, wire
from tandem.errors import PlanError
from tandem.rankplan import plan_ranks
from tandem.render import kubernetes as k8s_render
from tandem.render import renderer_for
from tandem.render.k8s_validate import check_objects, schema_problems, service_link_collision
from tandem.spec.cluster import Cluster
from tandem.spec.deployment import Deployment


def offline_problems(objs: list[dict], crd) -> list[str]:
    return [str(p) for p in check_objects(objs) + schema_problems(objs, crd)]


# --- seed 000 ----------------------------------------------------------------------------------


def test_seed000_leaderworkerset_matches_the_seed_field_by_field():
    lws = rendered(seed000_deployment())[LWS]
    assert stated_mismatches(seed000_lws(), lws) == []


def test_seed000_service_matches_the_seed_field_by_field():
    svc = rendered(seed000_deployment())[SERVICE]
    assert stated_mismatches(seed_yaml("seed000-lb.yaml"), svc) == []


def test_stated_mismatches_finds_a_difference():
    # The comparison itself must be able to fail.
    lws = rendered(seed000_deployment())[LWS]
    lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["volumes"][1]["emptyDir"][
        "sizeLimit"
    ] = "16Gi"
    assert stated_mismatches(seed000_lws(), lws) == [
        ".spec.leaderWorkerTemplate.workerTemplate.spec.volumes[dshm].emptyDir.sizeLimit: "
        "'16Gi', seed '64Gi'"
    ]


def test_seed000_containers_run_the_rank_plan():
    deployment = seed000_deployment()
    plan = plan_ranks(deployment)
    lws = rendered(deployment)[LWS]["spec"]["leaderWorkerTemplate"]
    leader = lws["leaderTemplate"]["spec"]["containers"][0]
    worker = lws["workerTemplate"]["spec"]["containers"][0]
    assert leader["command"] == plan.ranks[0].argv
    assert worker["command"] == plan.ranks[1].argv
    assert "--headless" in worker["command"] and "--headless" not in leader["command"]
    env = {e["name"]: e.get("value") for e in worker["env"]}
    for key, value in plan.ranks[1].env.items():
        # The HF cache mount's variable points at the mount inside the container.
        assert env[key] == (wire.CONTAINER_HF_HOME if key == wire.HF_HOME else value), key
    assert env[wire.HF_HUB_OFFLINE] == "1"
    assert "readinessProbe" not in worker  # a worker serves no traffic


def test_liveness_probes_run_the_health_model_in_every_pod():
    objs = rendered(seed000_deployment())
    lws = objs[LWS]["spec"]["leaderWorkerTemplate"]
    leader = lws["leaderTemplate"]["spec"]["containers"][0]
    worker = lws["workerTemplate"]["spec"]["containers"][0]
    # The agent once, in an immutable ConfigMap named by its content, which every pod mounts.
    config_map = objs[AGENT]
    assert config_map["data"] == {"agent.py": inspect.getsource(agent)}
    assert config_map["immutable"] is True
    digest = hashlib.sha256(inspect.getsource(agent).encode()).hexdigest()[:10]
    assert config_map["metadata"]["name"] == f"dsv4-flash-tp2-agent-{digest}"
    for key in ("leaderTemplate", "workerTemplate"):
        spec = lws[key]["spec"]
        (volume,) = [v for v in spec["volumes"] if v["name"] == "tandem-agent"]
        assert volume["configMap"]["name"] == config_map["metadata"]["name"]
        (mount,) = [m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "tandem-agent"]
        assert mount == {"name": "tandem-agent", "mountPath": "/opt/tandem", "readOnly": True}
    program = ["python3", "/opt/tandem/agent.py"]
    lead = leader["livenessProbe"]["exec"]["command"]
    assert lead[:4] == [*program, "alive", "leader"]
    assert "--canary-timeout" in lead and "--stall" in lead
    work = worker["livenessProbe"]["exec"]["command"]
    assert work[:4] == [*program, "alive", "worker"]
    # The LeaderWorkerSet stays small enough to read (it carried the 50 KB agent three times).
    assert len(json.dumps(objs[LWS])) < 12_000
    # A worker has no HTTP: it waits for its vLLM worker process within the start-up allowance.
    assert worker["startupProbe"]["exec"]["command"][2:4] == ["alive", "worker"]
    startup_s = seed000_deployment().recipe.timeouts.startup_s
    assert (
        worker["startupProbe"]["periodSeconds"] * worker["startupProbe"]["failureThreshold"]
        >= startup_s
    )
    # The leader's liveness waits behind its startup probe, so no initial delay is needed.
    assert "startupProbe" in leader and "initialDelaySeconds" not in leader["livenessProbe"]


@pytest.mark.parametrize("startup_s", [900, 120, 3600])
def test_the_startup_probe_covers_the_cold_start_and_readiness_does_not_wait_again(startup_s):
    seed = seed000_deployment()
    recipe = seed.recipe.model_copy(
        update={"timeouts": seed.recipe.timeouts.model_copy(update={"startup_s": startup_s})}
    )
    deployment = Deployment(recipe=recipe, cluster=seed.cluster)
    leader = rendered(deployment)[LWS]["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"][
        "containers"
    ][0]
    startup, readiness = leader["startupProbe"], leader["readinessProbe"]
    # the startup probe allows exactly timeouts.startup_s (seed 000: 900 s) ...
    assert startup["periodSeconds"] * startup["failureThreshold"] == startup_s
    # ... and the kubelet starts readiness only after it: no second wait (seed 000 had 600 s),
    # and readiness asks the same /health, so no traffic before the model is up.
    assert readiness["initialDelaySeconds"] == 0
    assert (
        readiness["httpGet"]
        == startup["httpGet"]
        == {"path": "/health", "port": deployment.recipe.ports.api}
    )


def test_seed000_group_policy_and_secret_reference():
    lws = rendered(seed000_deployment())[LWS]
    assert lws["spec"]["startupPolicy"] == "LeaderCreated"
    leader = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
    assert leader["metadata"]["labels"]["role"] == "leader"
    key = [e for e in leader["spec"]["containers"][0]["env"] if e["name"] == wire.VLLM_API_KEY]
    assert key == [
        {
            "name": "VLLM_API_KEY",
            "valueFrom": {
                "secretKeyRef": {
                    "name": "dsv4-flash-tp2-api-key",
                    "key": "api-key",
                    "optional": True,
                }
            },
        }
    ]
    assert leader["spec"]["enableServiceLinks"] is False


def test_render_target_k8s_yaml_and_json():
    deployment = seed000_deployment()
    plan = plan_ranks(deployment)
    text = renderer_for("k8s")(plan, deployment, "yaml")
    docs = list(yaml.safe_load_all(text))
    assert [d["kind"] for d in docs] == ["ConfigMap", "LeaderWorkerSet", "Service"]
    assert "kubectl apply --server-side" in text
    listed = json.loads(renderer_for("k8s")(plan, deployment, "json"))
    assert listed["kind"] == "List" and listed["items"] == docs


def test_api_key_never_in_the_rendered_file(monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "sk-very-secret")
    deployment = seed000_deployment()
    text = renderer_for("k8s")(plan_ranks(deployment), deployment, "yaml")
    assert "sk-very-secret" not in text
    secret = k8s_render.api_key_secret(deployment, "sk-very-secret")
    assert secret["metadata"]["name"] == "dsv4-flash-tp2-api-key"


# --- every deployment validates offline ----------------------------------------------------------


@pytest.mark.parametrize("name", ["seed000", "seed002", "tiny"])
def test_rendered_deployment_validates_offline(name, lws_crd):
    objs = rendered(deployments()[name])
    assert offline_problems(objs, lws_crd) == []


# --- the argument modes --------------------------------------------------------------------------


def _cluster(nodes: int, leader_address: str = "pinned") -> Cluster:
    data = make_cluster(nodes=nodes, transport="k8s").model_dump(mode="json")
    data["kubernetes"] = {"leader_address": leader_address}
    return Cluster.model_validate(data)


def test_lws_mode_takes_the_group_from_the_injected_variables(lws_crd):
    deployment = make_deployment(make_recipe(tp=2), _cluster(2, "lws"))
    objs = rendered(deployment)
    for key in ("leaderTemplate", "workerTemplate"):
        container = objs[LWS]["spec"]["leaderWorkerTemplate"][key]["spec"]["containers"][0]
        argv = container["command"]
        assert argv[argv.index("--nnodes") + 1] == "$(LWS_GROUP_SIZE)"
        assert argv[argv.index("--node-rank") + 1] == "$(LWS_WORKER_INDEX)"
        assert argv[argv.index("--master-addr") + 1] == "$(LWS_LEADER_ADDRESS)"
        host_ip = next(e for e in container["env"] if e["name"] == wire.VLLM_HOST_IP)
        assert host_ip == {
            "name": "VLLM_HOST_IP",
            "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
        }
    assert offline_problems(objs, lws_crd) == []


def test_four_nodes_one_worker_template_spread_by_affinity(lws_crd):
    deployment = make_deployment(make_recipe(tp=4), _cluster(4))
    objs = rendered(deployment)
    template = objs[LWS]["spec"]["leaderWorkerTemplate"]
    assert template["size"] == 4
    worker = template["workerTemplate"]["spec"]
    terms = worker["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["n1", "n2", "n3"]
    argv = worker["containers"][0]["command"]
    assert argv[argv.index("--node-rank") + 1] == "$(LWS_WORKER_INDEX)"
    assert argv[argv.index("--master-addr") + 1] == "192.168.1.10"
    assert template["leaderTemplate"]["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "n0"}
    assert offline_problems(objs, lws_crd) == []


def test_workers_that_differ_cannot_share_a_template():
    cluster = _cluster(3)
    data = cluster.model_dump(mode="json")
    data["nodes"][2]["env"] = {"NCCL_DEBUG": "INFO"}
    deployment = make_deployment(make_recipe(tp=3), Cluster.model_validate(data))
    with pytest.raises(PlanError) as caught:
        rendered(deployment)
    assert "nodes[2].env.NCCL_DEBUG" in str(caught.value)


def test_single_node_group():
    objs = rendered(make_deployment(make_recipe(tp=1), _cluster(1)))
    assert objs[LWS]["spec"]["leaderWorkerTemplate"]["size"] == 1
    assert check_objects(objs) == []


def test_recipe_named_vllm_is_refused_before_rendering():
    deployment = make_deployment(make_recipe(name="vllm"), _cluster(2))
    with pytest.raises(PlanError) as caught:
        rendered(deployment)
    assert "VLLM_SERVICE_HOST" in str(caught.value)


@pytest.mark.parametrize(
    "name,prefix",
    [
        ("vllm", "VLLM_"),
        ("vllm-api", "VLLM_"),
        ("hf", "HF_"),
        ("nccl-x", "NCCL_"),
        ("llm-api", None),
        ("dsv4-flash-tp2-external", None),
    ],
)
def test_service_link_collisions(name, prefix):
    assert service_link_collision(name) == prefix


# --- broken variants -----------------------------------------------------------------------------


@pytest.mark.parametrize("case", BROKEN, ids=[c.id for c in BROKEN])
def test_broken_variant_rejected_offline(case: Broken, lws_crd):
    problems = offline_problems(broken_objects(case), lws_crd)
    assert problems, f"{case.id} was accepted"
    assert any(case.offline in p for p in problems), problems


def test_at_least_ten_broken_variants():
    assert len(BROKEN) >= 10
