"""The pods tandem renders, run by real kubelets: one vLLM engine across two pods.

The cluster is ``kube_cluster`` (two kubelet nodes on this machine, Kubernetes 1.20.2 built from
Debian's source, containerd 1.6; ``k8s/kube_cluster.py`` says what stands in for what).
``tandem up examples/recipes/tiny-kube.yaml --cluster examples/kube-testbed.yaml`` applies the
rendered objects; the LWS stand-in makes the group's two pods as LWS v0.10.0 would; from there
everything is real: the scheduler, the kubelets running the image, the probes running tandem's
agent, the worker finding the leader by its LWS name through the cluster DNS, the rendezvous
across pods, the Service through kube-proxy. Then tandem's own commands against it, two faults,
and ``down``.

The test order is the file's order: the faults come after the looks at the healthy group, and
``down`` last (no ``breaks_deployment`` marker: those run at the session's end, and the cluster
lives for this module only).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import httpx
import pytest
import yaml
from tandem_cli import run_tandem
from waiting import until

from k8s.kube_cluster import KubeCluster
from tandem.watch.folder import read_samples

pytestmark = [pytest.mark.engine, pytest.mark.netns, pytest.mark.apiserver]
ROOT = Path(__file__).resolve().parents[2]
NAME = "tiny-kube"
LEADER, WORKER = f"{NAME}-0", f"{NAME}-0-1"
API_KEY = "tandem-kube-key"
LB_ADDRESS = "10.86.1.10"
COMPILE_CACHE = Path("/var/cache/tandem") / NAME


@dataclass
class KubeDeployment:
    cluster: KubeCluster
    folder: Path
    env: dict[str, str]
    recipe: Path
    inventory: Path
    outputs: dict[str, str] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    def tandem(self, *args: str, timeout: float = 180, check: bool = True):
        return run_tandem(*args, env=self.env, timeout=timeout, check=check)

    def up(self) -> None:
        started = time.monotonic()
        up = self.tandem("up", str(self.recipe), "--cluster", str(self.inventory), timeout=900,
                         check=False)  # fmt: skip
        self.timings["up"] = time.monotonic() - started
        if up.returncode:
            pytest.fail(f"tandem up failed ({up.returncode}):\n{up.stdout}\n{up.stderr}")
        self.outputs["up"] = up.stdout

    def pod(self, name: str) -> dict:
        return json.loads(self.cluster.kubectl("get", "pod", name, "-o", "json").stdout)

    def container(self, name: str) -> dict:
        return self.pod(name)["status"]["containerStatuses"][0]

    def status(self) -> dict:
        return json.loads(self.tandem("status", NAME, "--json", check=False).stdout)

    def exec(self, pod: str, *argv: str) -> str:
        return self.cluster.kubectl("exec", pod, "--", *argv).stdout


def since(stamp: str, then: str) -> float:
    """Seconds from RFC 3339 ``then`` to ``stamp``."""
    parse = lambda s: datetime.fromisoformat(s.replace("Z", "+00:00"))  # noqa: E731
    return (parse(stamp) - parse(then)).total_seconds()


@pytest.fixture(scope="module")
def setup(kube_cluster: KubeCluster, tiny_hf_home: Path, tmp_path_factory) -> KubeDeployment:
    folder = tmp_path_factory.mktemp("kubedeploy")
    recipe = yaml.safe_load((ROOT / "examples" / "recipes" / "tiny-kube.yaml").read_text())
    recipe["model"]["cache_root"] = str(tiny_hf_home)  # the hostPath of every node's HF cache
    (folder / "tiny-kube.yaml").write_text(yaml.safe_dump(recipe))
    env = {
        **os.environ,
        "TANDEM_HOME": str(folder / "home"),
        "KUBECONFIG": str(kube_cluster.kubeconfig),
        "VLLM_API_KEY": API_KEY,
    }
    return KubeDeployment(
        kube_cluster,
        folder,
        env,
        folder / "tiny-kube.yaml",
        ROOT / "examples" / "kube-testbed.yaml",
    )


@pytest.fixture(scope="module")
def deployment(setup: KubeDeployment):
    ours = not COMPILE_CACHE.exists()  # the pods' compile cache hostPath, made by the kubelet
    try:
        setup.up()
        yield setup
    finally:
        setup.tandem("down", NAME, timeout=300, check=False)
        if ours and COMPILE_CACHE.exists():
            shutil.rmtree(COMPILE_CACHE)


# --- the group comes up -------------------------------------------------------------------------


def test_up_reports_each_pod_and_the_engine_across_pods(deployment: KubeDeployment):
    out = deployment.outputs["up"]
    assert f"rank 1 pod {WORKER}: Running on node1" in out, out
    assert f"rank 0 pod {LEADER}: Running on node0" in out, out
    assert "ready at http://10.86.0.1:8000/v1" in out, out
    created = deployment.cluster.lws.created if deployment.cluster.lws else []
    assert {f"pod/{LEADER}", f"pod/{WORKER}", f"service/{NAME}"} <= set(created)
    assert not deployment.cluster.lws.errors


def test_pod_start_to_ready_is_measured(deployment: KubeDeployment):
    """From the leader pod's creation to its Ready condition, as the API server recorded it."""
    pod = deployment.pod(LEADER)
    ready = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"
    seconds = since(ready["lastTransitionTime"], pod["metadata"]["creationTimestamp"])
    deployment.timings["pod start to Ready"] = seconds
    print(f"pod created -> Ready: {seconds:.0f} s; tandem up: {deployment.timings['up']:.0f} s")
    assert 0 < seconds < 420


def test_the_worker_found_the_leader_by_its_lws_name(deployment: KubeDeployment):
    """``--master-addr $(LWS_LEADER_ADDRESS)``: the kubelet expanded it, and the name resolves
    in the worker's pod through the cluster DNS to the leader's node."""
    command = deployment.pod(WORKER)["spec"]["containers"][0]["command"]
    assert command[command.index("--master-addr") + 1] == "$(LWS_LEADER_ADDRESS)"
    script = (
        "import os, socket; a = os.environ['LWS_LEADER_ADDRESS']; print(a, socket.gethostbyname(a))"
    )
    resolved = deployment.exec(WORKER, "python3", "-c", script).split()
    assert resolved == [f"{NAME}-0.{NAME}.default", "10.86.0.1"]
    environ = deployment.exec(
        WORKER, "python3", "-c", "import os; print(os.environ['VLLM_HOST_IP'])"
    )
    assert environ.strip() == "10.86.0.2"  # status.podIP: the node's, on the host network


def test_the_service_answers_a_completion_through_kube_proxy(deployment: KubeDeployment):
    """The leader is Ready behind its Service; a real completion comes back through the
    load-balancer address and through the cluster IP, both forwarded by kube-proxy."""
    service = json.loads(
        deployment.cluster.kubectl("get", "service", f"{NAME}-external", "-o", "json").stdout
    )
    addresses = [LB_ADDRESS, service["spec"]["clusterIP"]]
    assert service["status"]["loadBalancer"]["ingress"] == [{"ip": LB_ADDRESS}]
    for address in addresses:
        answer = httpx.post(
            f"http://{address}:80/v1/completions",
            headers={"Authorization": f"Bearer {API_KEY}"},
            json={"model": "tiny-deepseek", "prompt": "The sky is", "max_tokens": 4},
            timeout=120,
        )
        assert answer.status_code == 200, (address, answer.text)
        assert answer.json()["usage"]["completion_tokens"] == 4


def test_status_and_logs_through_the_api(deployment: KubeDeployment):
    status = deployment.status()
    assert status["verdict"] == "healthy", status
    logs = deployment.tandem("logs", NAME, "--rank", "1").stdout
    assert "world_size=2 rank=1" in logs, logs[-2000:]


def test_one_watch_sample_reads_both_nodes_through_the_pods(deployment: KubeDeployment):
    """The node agent runs in one pod a node (``kubectl exec``): each node's memory and its
    rank's processes, as the worker's VLLM::Worker sees them."""
    out = deployment.folder / "watch"
    deployment.tandem("watch", NAME, "--interval", "1s", "--duration", "1s", "--out", str(out),
                      "--quiet", timeout=240)  # fmt: skip
    samples = read_samples(out).records
    assert samples and samples[0].verdict == "healthy"
    nodes = {n.node: n for n in samples[0].nodes}
    assert set(nodes) == {"node0", "node1"}
    assert all(r.up and r.processes >= 1 for n in nodes.values() for r in n.ranks)


def test_smoke_checks_that_need_no_meaning_pass(deployment: KubeDeployment):
    out = deployment.folder / "smoke"
    smoke = deployment.tandem("eval", "smoke", NAME, "--out", str(out), "--check", "template",
                              "--check", "determinism", timeout=600, check=False)  # fmt: skip
    assert smoke.returncode == 0, smoke.stdout + smoke.stderr
    checks = {
        c["check"]: c["outcome"] for c in json.loads((out / "smoke.json").read_text())["checks"]
    }
    assert checks == {"template": "pass", "determinism": "pass"}


# --- what only a running pod shows --------------------------------------------------------------


def test_shared_memory_and_the_agent_as_the_pods_see_them(deployment: KubeDeployment):
    """/dev/shm is the pod's own memory volume (the rendered emptyDir), not the node's /dev/shm
    that host IPC would otherwise bring in; the agent's ConfigMap is where the probes run it,
    and each pod's liveness command says alive there.

    Its size is not the rendered 1 GiB on Kubernetes 1.20: the kubelet mounts a memory
    emptyDir as a tmpfs of half the node's memory and enforces ``sizeLimit`` by eviction
    only (``SizeMemoryBackedVolumes``, on by default from 1.22, sizes the tmpfs)."""
    pod = deployment.pod(WORKER)
    marker = f"/dev/shm/tandem-test-{os.getpid()}"
    script = f"import os; open('{marker}', 'w').write('x'); print(os.stat('/dev/shm').st_dev)"
    in_pod = int(deployment.exec(WORKER, "python3", "-c", script))
    assert in_pod != os.stat("/dev/shm").st_dev and not Path(marker).exists()
    node = next(n for n in deployment.cluster.nodes if n.name == pod["spec"]["nodeName"])
    volume = (
        node.folder / "kubelet" / "pods" / pod["metadata"]["uid"] / "volumes"
        / "kubernetes.io~empty-dir" / "dshm"
    )  # fmt: skip
    seen = node.run(["stat", "-c", "%d", str(volume), str(volume / Path(marker).name)])
    assert seen.stdout.split() == [str(in_pod), str(in_pod)], seen.stderr
    for name in (LEADER, WORKER):  # each pod's own liveness command, as the kubelet runs it
        probe = deployment.pod(name)["spec"]["containers"][0]["livenessProbe"]["exec"]["command"]
        assert probe[:2] == ["python3", "/opt/tandem/agent.py"]
        assert deployment.exec(name, *probe).strip() == "alive"


# --- faults -------------------------------------------------------------------------------------


def container_pid(deployment: KubeDeployment, pod: str) -> int:
    """The host pid of the pod's vLLM container (its main process), from its node's
    containerd."""
    status = deployment.container(pod)
    container_id = status["containerID"].removeprefix("containerd://")
    node = next(
        n for n in deployment.cluster.nodes if n.name == deployment.pod(pod)["spec"]["nodeName"]
    )
    for line in node.ctr.run("tasks", "ls").stdout.splitlines()[1:]:
        task, pid, *_ = line.split()
        if task == container_id:
            return int(pid)
    raise AssertionError(f"no task {container_id} on {node.name}")


def test_a_hung_worker_is_caught_by_the_liveness_probe(deployment: KubeDeployment):
    """SIGSTOP to the worker's vLLM worker process: the worker pod's liveness probe (tandem's
    agent) fails on its next run, naming the stopped process. The probe runs every 30 s and the
    kubelet restarts the container after three failures in a row; SIGCONT after the first one
    lets the group serve on, so the next fault meets a healthy group (the kubelet's restart is
    the next test's)."""
    pids = deployment.exec(WORKER, "python3", "-c", (
        "import os\n"
        "for p in os.listdir('/proc'):\n"
        "    if p.isdigit():\n"
        "        n = open(f'/proc/{p}/comm').read().strip()\n"
        "        if n.startswith('VLLM::Worker'): print(p)\n"
    )).split()  # fmt: skip
    assert pids, "no VLLM::Worker process in the worker pod"
    uid = deployment.pod(WORKER)["metadata"]["uid"]  # this pod's events, not its namesakes'

    def signal_worker(number: int) -> None:
        deployment.exec(WORKER, "python3", "-c", f"import os; os.kill({pids[0]}, {number})")

    stopped_at = time.time()
    signal_worker(int(signal.SIGSTOP))
    try:
        unhealthy = until(
            "the kubelet's liveness verdict",
            lambda: [
                e for e in json.loads(deployment.cluster.kubectl(
                    "get", "events", "--field-selector", f"involvedObject.uid={uid}", "-o", "json"
                ).stdout)["items"] if e["reason"] == "Unhealthy" and "Liveness" in e["message"]
            ],
            60,
            every_s=1,
        )  # fmt: skip
    finally:
        signal_worker(int(signal.SIGCONT))
    first = min(unhealthy, key=lambda e: e["firstTimestamp"])
    assert f"(pid {pids[0]}) is stopped" in first["message"], first
    detected = datetime.fromisoformat(first["firstTimestamp"].replace("Z", "+00:00")).timestamp()
    deployment.timings["hung worker -> first failed probe"] = detected - stopped_at
    print(f"hung worker: first failed liveness probe after {detected - stopped_at:.0f} s")
    assert -1 < detected - stopped_at < 40  # event times are whole seconds; the period is 30 s
    assert deployment.container(WORKER).get("restartCount", 0) == 0
    until(
        "the group healthy again",
        lambda: deployment.status()["verdict"] == "healthy",
        120,
        every_s=3,
    )


def test_a_killed_worker_container_is_restarted_and_tandem_says_so(deployment: KubeDeployment):
    """SIGKILL to the worker's container: the kubelet restarts it (no LeaderWorkerSet here to
    recreate the group), and tandem's verdict names the restart and when it happened."""
    pid = container_pid(deployment, WORKER)
    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)
    restarted = until(
        "the kubelet restarting the worker",
        lambda: (c := deployment.container(WORKER)).get("restartCount", 0) >= 1 and c,
        120,
    )
    finished = restarted["lastState"]["terminated"]
    assert finished["exitCode"] == 137, finished
    verdict = until(
        "a verdict naming the restart",
        lambda: (s := deployment.status())["verdict"] != "healthy" and s,
        180,
        every_s=2,
    )
    deployment.timings["killed worker -> verdict"] = time.time() - killed_at
    text = json.dumps(verdict)
    assert "restart" in text, text
    print(f"killed worker container -> tandem verdict {verdict['verdict']}: "
          f"{time.time() - killed_at:.0f} s: {verdict['reason']}")  # fmt: skip


# --- down ---------------------------------------------------------------------------------------


def test_down_leaves_nothing(deployment: KubeDeployment):
    """No object, no pod, no container in either containerd, no pod interface or lease."""
    down = deployment.tandem("down", NAME, timeout=300)
    assert "no pod of" in down.stdout, down.stdout
    kubectl = deployment.cluster.kubectl
    left = kubectl("get", "all,configmaps,secrets,leaderworkersets", "-l",
                   f"app.kubernetes.io/name={NAME}", "-o", "name").stdout  # fmt: skip
    assert left.strip() == ""
    assert kubectl("get", "pods", "-o", "name").stdout.strip() == ""
    assert kubectl("get", "service", NAME, "--ignore-not-found", "-o", "name").stdout.strip() == ""
    until(
        "every container and sandbox removed by the kubelets",
        lambda: not any(deployment.cluster.containers().values()),
        150,
        every_s=3,
    )
    assert not any(deployment.cluster.pod_interfaces().values())
    timings = {**deployment.cluster.timings, **deployment.timings}
    print("timings:", json.dumps({k: round(v, 1) for k, v in timings.items()}))
    print("images imported:", "; ".join(deployment.cluster.imported) or "none (cached)")
    assert not re.search(
        r"\bpanic\b", "\n".join(p.tail(50) for n in deployment.cluster.nodes for p in n.programs)
    )
