"""Reading every node of a deployment, through the way its backend reaches it.

``readers_for(state)`` picks by the state's backend, as ``tandem check`` picks its transport:

- ``local``: the nodes are this machine (loopback ranks or network namespaces, which share one
  ``/proc``), so ``tandem.watch.host`` is called in-process once per sample and its ranks split
  by node. The scan of ``/proc/*/environ`` for the ranks' processes is redone only when a
  known process is gone or every ``rescan_every`` samples: a sample then costs a few file reads.
- ``ssh``: ``host.py`` piped into the node's ``python3 -`` over the shared OpenSSH connection,
  all nodes at once.
- ``k8s``: the same script through ``kubectl exec -i POD -- python3 -``, one rank pod a node.

Each reader returns one ``NodeReading`` per node; a node that cannot be read gets ``error`` set,
not an exception, so one bad node never stops the watch.
"""

from __future__ import annotations

import json
import shlex
from importlib import resources
from typing import Protocol

from tandem.backends.k8s import Kubectl
from tandem.backends.openssh import OpenSSH, SSHTarget
from tandem.backends.state import DeploymentState
from tandem.errors import TandemError
from tandem.watch import host
from tandem.watch.gpu import parse_nvidia_smi
from tandem.watch.sample import NodeReading, RankUsage, RdmaPort

_EOF = "TANDEM_WATCH_EOF_41c9"
REMOTE_TIMEOUT_S = 20.0


class NodeReader(Protocol):
    def read(self, up: dict[int, bool]) -> list[NodeReading]:
        """Every node now; ``up`` is each rank's liveness as the backend sees it."""


def node_reading(
    node: str, raw: dict, ranks: list[tuple[int, str]], up: dict[int, bool]
) -> NodeReading:
    """``host.raw_sample``'s dict for one node -> its reading (pure)."""
    mem = raw.get("meminfo") or {}
    usage = raw.get("ranks") or {}
    return NodeReading(
        node=node,
        mem_total_bytes=mem.get("MemTotal"),
        mem_available_bytes=mem.get("MemAvailable"),
        swap_total_bytes=mem.get("SwapTotal"),
        swap_free_bytes=mem.get("SwapFree"),
        oom_kills=raw.get("oom_kills"),
        ranks=[
            RankUsage(
                rank=rank,
                role=role,
                up=up.get(rank, False),
                processes=usage.get(str(rank), {}).get("processes", 0),
                rss_bytes=usage.get(str(rank), {}).get("rss_bytes"),
                cpu_s=usage.get(str(rank), {}).get("cpu_s"),
            )
            for rank, role in ranks
        ],
        gpus=parse_nvidia_smi(raw.get("nvidia_smi")),
        rdma=[
            RdmaPort(
                device=p["device"],
                port=p["port"],
                state=p.get("state"),
                xmit_bytes=_words(p.get("port_xmit_data")),
                rcv_bytes=_words(p.get("port_rcv_data")),
                xmit_discards=p.get("port_xmit_discards"),
                symbol_errors=p.get("symbol_error"),
                link_downed=p.get("link_downed"),
            )
            for p in raw.get("rdma") or []
        ],
    )


def _words(value: int | None) -> int | None:
    return value * 4 if value is not None else None  # the data counters count 4-byte words


def _ranks_by_node(state: DeploymentState) -> dict[str, list[tuple[int, str]]]:
    nodes: dict[str, list[tuple[int, str]]] = {}
    for r in sorted(state.ranks, key=lambda r: r.rank):
        nodes.setdefault(r.node, []).append((r.rank, r.role))
    return nodes


class LocalReader:
    """Nodes on this machine: one in-process read of /proc and sysfs per sample."""

    def __init__(
        self,
        state: DeploymentState,
        *,
        proc: str = "/proc",
        sys_root: str = "/sys",
        rescan_every: int = 12,
    ) -> None:
        self.state = state
        self.proc, self.sys_root = proc, sys_root
        self.rescan_every = rescan_every
        self._pids: dict[int, list[int]] | None = None
        self._reads = 0

    def read(self, up: dict[int, bool]) -> list[NodeReading]:
        if self._pids is None or self._reads % self.rescan_every == 0:
            self._pids = host.marked_pids(self.state.name, self.proc)
        self._reads += 1
        raw = host.raw_sample(
            self.state.name, pids=self._pids, proc=self.proc, sys_root=self.sys_root
        )
        known = sum(len(p) for p in self._pids.values())
        if sum(r["processes"] for r in raw["ranks"].values()) < known:
            self._pids = None  # a process is gone: find the current ones next time
        by_node = _ranks_by_node(self.state)
        return [node_reading(node, raw, ranks, up) for node, ranks in by_node.items()]


def _script(name: str, python: str = "python3") -> str:
    source = resources.files("tandem.watch").joinpath("host.py").read_text()
    return f"{python} - {shlex.quote(name)} <<'{_EOF}'\n{source}\n{_EOF}\n"


def _parse(
    node: str, stdout: str, ranks: list[tuple[int, str]], up: dict[int, bool]
) -> NodeReading:
    try:
        raw = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return NodeReading(node=node, error=f"host.py printed no sample: {stdout[-200:]!r}")
    return node_reading(node, raw, ranks, up)


class SSHReader:
    """Nodes over ssh: host.py on each node's python3, in parallel."""

    def __init__(self, state: DeploymentState) -> None:
        cluster = state.deployment(lenient=True).cluster  # an old state is watched too
        self.ssh = OpenSSH.for_cluster(cluster)
        self.targets = {n.name: SSHTarget.of(n) for n in cluster.nodes}
        self.state = state

    def read(self, up: dict[int, bool]) -> list[NodeReading]:
        by_node = _ranks_by_node(self.state)
        jobs = {node: (self.targets[node], _script(self.state.name)) for node in by_node}
        readings = []
        try:
            results = self.ssh.run_all(jobs, timeout_s=REMOTE_TIMEOUT_S, check=False)
        except TandemError as exc:
            return [NodeReading(node=node, error=exc.message) for node in by_node]
        for node, ranks in by_node.items():
            result = results[node]
            readings.append(
                _parse(node, result.stdout, ranks, up)
                if result.ok
                else NodeReading(node=node, error=result.stderr.strip()[-200:])
            )
        return readings


class KubernetesReader:
    """Nodes of a LeaderWorkerSet: host.py through ``kubectl exec`` into each rank's pod."""

    def __init__(self, state: DeploymentState) -> None:
        self.kubectl = Kubectl.of_state(state)
        self.state = state
        self.source = resources.files("tandem.watch").joinpath("host.py").read_text()

    def read(self, up: dict[int, bool]) -> list[NodeReading]:
        readings = []
        for node, ranks in _ranks_by_node(self.state).items():
            record = next(r for r in self.state.ranks if r.rank == ranks[0][0])
            pod = record.log.removeprefix("pod/")
            try:
                done = self.kubectl.run(
                    "exec",
                    "-i",
                    pod,
                    "--",
                    "python3",
                    "-",
                    self.state.name,
                    stdin=self.source,
                    check=False,
                    timeout_s=REMOTE_TIMEOUT_S,
                )
            except TandemError as exc:
                readings.append(NodeReading(node=node, error=exc.message))
                continue
            readings.append(
                _parse(node, done.stdout, ranks, up)
                if done.returncode == 0
                else NodeReading(node=node, error=done.stderr.strip()[-200:])
            )
        return readings


READERS = {"local": LocalReader, "ssh": SSHReader, "k8s": KubernetesReader}


def reader_for(state: DeploymentState) -> NodeReader:
    """The node reader of the backend that launched the deployment."""
    return READERS[state.backend](state)
