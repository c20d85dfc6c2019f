"""The LWS stand-in (``lws_pods``) against the LeaderWorkerSet CRD and LWS v0.10.0's own cases.

No server runs here: the mapping is checked against the CRD file (every field it reads exists
there, with the defaults it assumes), against the cases of LWS's own ``TestAddLWSVariables``
(``pkg/utils/pod/pod_utils_test.go`` at v0.10.0), and against what tandem renders and then
looks for (pod names, labels, the leader address in the command).
"""

from __future__ import annotations

import copy
import hashlib

import pytest
import yaml

from k8s import lws_pods
from k8s.apiserver import LWS_CRD
from tandem import wire
from tandem.rankplan import template_plan
from tandem.render import kubernetes as k8s_render
from tandem.spec.cluster import Cluster
from tandem.spec.deployment import Deployment
from tandem.spec.loading import load_recipe


@pytest.fixture(scope="module")
def crd_schema() -> dict:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    crd = yaml.load(LWS_CRD.read_text(), Loader=loader)
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def schema_at(schema: dict, path: tuple[str, ...]) -> dict | None:
    node: dict | None = schema
    for key in path:
        node = ((node or {}).get("properties") or {}).get(key)
    return node


def lws_object(
    name: str = "test-sample", replicas: int = 1, size: int = 3, namespace: str = "default"
) -> dict:
    """A LeaderWorkerSet as the API server returns it (a uid), one container reading env."""
    container = {"name": "c", "image": "i", "env": [{"name": "LWS_GROUP_SIZE", "value": "bad"}]}
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name, "namespace": namespace, "uid": "u-1"},
        "spec": {
            "replicas": replicas,
            "leaderWorkerTemplate": {
                "size": size,
                "workerTemplate": {"spec": {"containers": [container]}},
            },
        },
    }


def test_every_field_the_stand_in_reads_is_in_the_crd(crd_schema: dict):
    missing = [p for p in lws_pods.READ_FIELDS if schema_at(crd_schema, p) is None]
    assert not missing


def test_the_defaults_the_stand_in_assumes_are_the_crds(crd_schema: dict):
    for path, value in lws_pods.CRD_DEFAULTS.items():
        assert schema_at(crd_schema, path)["default"] == value, path


def test_what_the_stand_in_makes_is_a_value_the_crd_allows(crd_schema: dict):
    startup = schema_at(crd_schema, ("spec", "startupPolicy"))
    assert lws_pods.LEADER_CREATED in startup["enum"] and startup["default"] == "LeaderCreated"
    subdomain = schema_at(crd_schema, ("spec", "networkConfig", "subdomainPolicy"))
    assert lws_pods.SHARED in subdomain["enum"] and "default" not in subdomain  # the webhook's


@pytest.mark.parametrize(
    "change",
    [
        {"startupPolicy": "LeaderReady"},
        {"networkConfig": {"subdomainPolicy": "UniquePerReplica"}},
        {"leaderWorkerTemplate": {"size": 2, "subGroupPolicy": {"subGroupSize": 1}}},
    ],
    ids=["leader ready", "unique subdomain", "sub-groups"],
)
def test_a_feature_the_stand_in_does_not_make_is_refused(change: dict):
    lws = lws_object()
    for key, value in change.items():
        if isinstance(value, dict) and key in lws["spec"]:
            lws["spec"][key].update(value)
        else:
            lws["spec"][key] = value
    with pytest.raises(lws_pods.Unsupported):
        lws_pods.objects(lws)


# LWS v0.10.0 pkg/utils/pod/pod_utils_test.go TestAddLWSVariables: (group, worker, namespace,
# size) -> the leader address; our pods come out of the whole mapping, not a wrapper.
ADD_LWS_VARIABLES = [
    ("Leader pod", 0, 0, "default", 3, "test-sample-0.test-sample.default"),
    ("Worker pod", 0, 1, "default", 3, "test-sample-0.test-sample.default"),
    ("Leader pod, group 1", 1, 0, "default", 2, "test-sample-1.test-sample.default"),
    ("Worker pod, group 1", 1, 1, "default", 2, "test-sample-1.test-sample.default"),
    ("Worker pod, group 1, non-default namespace", 1, 1, "lws", 2, "test-sample-1.test-sample.lws"),
]


@pytest.mark.parametrize("case", ADD_LWS_VARIABLES, ids=[c[0] for c in ADD_LWS_VARIABLES])
def test_lws_variables_come_first_as_lws_own_test_expects(case):
    _, group, worker, namespace, size, address = case
    made = lws_pods.objects(lws_object(replicas=2, size=size, namespace=namespace))
    name = f"test-sample-{group}" + (f"-{worker}" if worker else "")
    pod = next(o for o in made if o["metadata"]["name"] == name)
    env = pod["spec"]["containers"][0]["env"]
    assert env[:3] == [
        {"name": "LWS_LEADER_ADDRESS", "value": address},
        {"name": "LWS_GROUP_SIZE", "value": str(size)},
        {"name": "LWS_WORKER_INDEX", "value": str(worker)},
    ]
    assert len(env) == 3  # the template's own LWS_GROUP_SIZE is dropped, as AddLWSVariables does


def test_identity_labels_and_owner_of_each_pod():
    made = lws_pods.objects(lws_object(replicas=2, size=2))
    service, pods = made[0], made[1:]
    assert service["spec"] == {
        "clusterIP": "None",
        "selector": {lws_pods.NAME: "test-sample"},
        "publishNotReadyAddresses": True,
    }
    assert [p["metadata"]["name"] for p in pods] == [
        "test-sample-0",
        "test-sample-0-1",
        "test-sample-1",
        "test-sample-1-1",
    ]
    for pod in pods:
        meta, spec = pod["metadata"], pod["spec"]
        assert spec["hostname"] == meta["name"] and spec["subdomain"] == "test-sample"
        assert meta["labels"][lws_pods.STS_POD_NAME] == meta["name"]
        assert meta["annotations"][lws_pods.SIZE] == "2"
        assert meta["ownerReferences"][0]["uid"] == "u-1"
    leader, worker = pods[2], pods[3]
    assert leader["metadata"]["labels"][lws_pods.WORKER_INDEX] == "0"
    assert worker["metadata"]["labels"][lws_pods.WORKER_INDEX] == "1"
    assert worker["metadata"]["annotations"][lws_pods.LEADER_NAME] == "test-sample-1"
    for key in (lws_pods.GROUP_INDEX, lws_pods.GROUP_KEY, lws_pods.REVISION_KEY):
        assert worker["metadata"]["labels"][key] == leader["metadata"]["labels"][key]
    # pod_webhook.go genGroupUniqueKey: sha1 of "<namespace>/<leader pod>"
    key = hashlib.sha1(b"default/test-sample-1").hexdigest()
    assert leader["metadata"]["labels"][lws_pods.GROUP_KEY] == key


def test_wire_names_are_lws_names():
    """tandem's spelling of LWS's wire names (``tandem.wire``) is the stand-in's, from LWS."""
    assert (wire.LWS_NAME_LABEL, wire.LWS_WORKER_INDEX_LABEL, wire.LWS_GROUP_INDEX_LABEL) == (
        lws_pods.NAME,
        lws_pods.WORKER_INDEX,
        lws_pods.GROUP_INDEX,
    )
    assert (wire.LWS_GROUP_KEY_LABEL, wire.LWS_SIZE_ANNOTATION) == (
        lws_pods.GROUP_KEY,
        lws_pods.SIZE,
    )
    assert (wire.LWS_LEADER_ADDRESS, wire.LWS_GROUP_SIZE, wire.LWS_WORKER_INDEX) == (
        lws_pods.LEADER_ADDRESS_ENV,
        lws_pods.GROUP_SIZE_ENV,
        lws_pods.WORKER_INDEX_ENV,
    )


def rendered_lws(replicas: int) -> tuple[Deployment, dict]:
    """tiny-local (TP=2) as tandem renders it, ``leader_address: lws``, on as many nodes as
    its groups need."""
    recipe = load_recipe("tiny-local")
    router = recipe.router.model_copy(update={"image": "registry.example/vllm-router:0.1.17"})
    recipe = recipe.model_copy(update={"name": "tiny", "replicas": replicas, "router": router})
    cluster = Cluster.model_validate(
        {
            "name": "c",
            "transport": "k8s",
            "nodes": [
                {"name": f"n{i}", "address": f"192.0.2.{10 + i}"} for i in range(2 * replicas)
            ],
            "kubernetes": {"leader_address": "lws"},
        }
    )
    deployment = Deployment(recipe=recipe, cluster=cluster)
    plan = template_plan(deployment)
    lws = copy.deepcopy(k8s_render.leader_worker_set(plan, deployment))
    lws["metadata"]["uid"] = "u-2"
    return deployment, lws


@pytest.mark.parametrize("replicas", [1, 2])
def test_tandems_rendered_set_gives_the_pods_tandem_looks_for(replicas: int):
    deployment, lws = rendered_lws(replicas)
    pods = lws_pods.objects(lws)[1:]
    expected = [
        k8s_render.pod_name(deployment, index, group)
        for group in range(replicas)
        for index in range(2)
    ]
    assert [p["metadata"]["name"] for p in pods] == expected
    for pod in pods:
        labels = pod["metadata"]["labels"]
        assert labels[wire.LWS_NAME_LABEL] == k8s_render.lws_name(deployment)
        role = "leader" if labels[wire.LWS_WORKER_INDEX_LABEL] == "0" else "worker"
        assert labels[wire.ROLE_LABEL] == role
        command = " ".join(pod["spec"]["containers"][0]["command"])
        assert f"$({wire.LWS_LEADER_ADDRESS})" in command  # expanded by the kubelet
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        group = labels[wire.LWS_GROUP_INDEX_LABEL]
        assert env[wire.LWS_LEADER_ADDRESS] == f"{lws['metadata']['name']}-{group}." + (
            f"{lws['metadata']['name']}.{lws['metadata']['namespace']}"
        )
