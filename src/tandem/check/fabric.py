"""The fabric test: a torch.distributed all-reduce across the deployment's ranks, with their env.

Each node starts as many ranks as it has devices (one per GPU with NCCL, one per node with
Gloo on CPU), through the node transport, with exactly the environment the rank plan gives that
node's vLLM rank (control-plane pins, NCCL data-plane variables, VLLM_HOST_IP, the node's own
variables) plus the torch.distributed rendezvous: ``MASTER_ADDR`` = the leader's address and a
free port. With NCCL, ``NCCL_DEBUG=INFO`` is added and the ranks' logs are read to name the
transport NCCL really chose: ``NET/IB`` (RoCE/InfiniBand), ``NET/Socket`` (the silent TCP
fallback), or ``P2P``/``SHM`` between GPUs of one host.

``run_fabric`` returns a ``FabricResult`` and the findings it implies; it never raises for a
fabric that fails, because a failed fabric is a finding.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from tandem import wire
from tandem.check import known_hosts as known
from tandem.check.findings import Finding, Severity
from tandem.check.node_transport import NodeTransport
from tandem.rankplan import RankPlan
from tandem.spec.deployment import Deployment
from tandem.spec.recipe import DataPlaneTransport

DEFAULT_PORT = 29600
SHOWN_VARS = re.compile(
    r"^(NCCL_|GLOO_|TP_SOCKET|VLLM_HOST_IP|CUDA_VISIBLE|MASTER_|RANK|"
    r"WORLD_SIZE|LOCAL_RANK|VLLM_CPU_OMP)"
)
_VIA = re.compile(r"via (NET/[A-Za-z]+|P2P|SHM|CollNet|NVLS)[^\s]*")
_USING_NET = re.compile(r"NCCL INFO Using network (\w+)")


class FabricSize(BaseModel):
    bytes: int
    iters: int
    time_us: float
    algbw_gbps: float = Field(description="bytes / time, in GB/s (10^9 bytes per second).")
    busbw_gbps: float = Field(description="algbw x 2(n-1)/n in GB/s: comparable with the link.")


class FabricResult(BaseModel):
    """What ``"fabric"`` holds in ``tandem check --fabric --json``."""

    ok: bool
    backend: str | None = None
    world_size: int
    ranks: list[dict[str, Any]] = Field(description="rank, node, address, local_rank.")
    master: str
    error: str | None = None
    correct: bool | None = Field(
        default=None, description="The sum of a test all-reduce was right on rank 0."
    )
    sizes: list[FabricSize] = Field(default_factory=list)
    peak_busbw_gbps: float | None = None
    small_message_bytes: int | None = None
    small_message_latency_us: float | None = None
    rendezvous_s: float | None = None
    nccl_version: str | None = None
    torch_version: str | None = None
    transports: list[str] = Field(
        default_factory=list,
        description="NCCL connection kinds seen in the logs, e.g. P2P, SHM, NET/IB, NET/Socket.",
    )
    nccl_network: str | None = Field(
        default=None,
        description="`IB` or `Socket`: the network plugin NCCL loaded ('Using network ...').",
    )
    rank_env: dict[str, dict[str, str]] = Field(
        default_factory=dict, description="Per rank, the fabric-relevant variables it ran with."
    )
    log_tail: dict[str, str] = Field(default_factory=dict)
    elapsed_s: float = 0.0


def script_path() -> str:
    return str(resources.files("tandem.check").joinpath("allreduce.py"))


def rank_environment(
    base: dict[str, str],
    plan_env: dict[str, str],
    *,
    master: str,
    port: int,
    rank: int,
    world: int,
    local_rank: int,
    nccl: bool,
) -> dict[str, str]:
    """The caller's environment less what the plan owns, then the plan's, then the rendezvous."""
    env = {
        k: v
        for k, v in base.items()
        if not k.startswith(wire.RANK_OWNED_PREFIXES) or k in wire.KEPT_HOST_VARS
    }
    env.update(plan_env)
    env.update(
        {
            "MASTER_ADDR": master,
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(local_rank),
            "PYTHONUNBUFFERED": "1",
        }
    )
    if nccl:
        env["NCCL_DEBUG"] = "INFO"
    return env


def parse_nccl_transports(text: str) -> tuple[list[str], str | None]:
    """Connection kinds (``NET/IB``, ``NET/Socket``, ``P2P``, ``SHM``) and the network plugin."""
    kinds = sorted({m.group(1) for m in _VIA.finditer(text)})
    using = _USING_NET.search(text)
    return kinds, using.group(1) if using else None


def parse_rank0(text: str) -> dict[str, Any] | None:
    for line in reversed(text.splitlines()):
        if line.startswith("TANDEM_FABRIC "):
            return json.loads(line.removeprefix("TANDEM_FABRIC "))
    return None


def run_fabric(
    deployment: Deployment,
    plan: RankPlan,
    transport: NodeTransport,
    *,
    gpu_nodes: bool,
    port: int = DEFAULT_PORT,
    sizes: list[int] | None = None,
    timeout_s: float = 300.0,
    facts: dict[str, dict[str, Any]] | None = None,
) -> tuple[FabricResult, list[Finding]]:
    """Run the all-reduce on every rank of ``plan`` and read what the fabric did.

    Args:
        gpu_nodes: the nodes have GPUs (NCCL, one rank per GPU); else Gloo, one rank per node.
        port: the rendezvous port on the leader (the deployment's own master port is left alone).
        sizes: message sizes in bytes; default 1 KiB..256 MiB (NCCL) or 1 KiB..16 MiB (Gloo).
        facts: the probe's facts per node, which tell a Spark pair (``fabric_findings``).
    """
    base = dict(os.environ)
    nodes = {n.name: n for n in deployment.cluster.nodes}
    backend = "nccl" if gpu_nodes else "gloo"
    per_node = {r.node: (nodes[r.node].gpus if gpu_nodes else 1) for r in plan.ranks}
    world = sum(per_node.values())
    master = plan.leader.address
    argv = [
        "python3",
        script_path(),
        "--backend",
        backend,
        "--timeout-s",
        str(max(30.0, timeout_s - 30)),
    ]
    if sizes:
        argv += ["--sizes", ",".join(map(str, sizes))]
    workdir = Path(tempfile.mkdtemp(prefix="tandem-fabric-"))
    started = time.monotonic()
    launched: list[tuple[int, str, subprocess.Popen, Path]] = []
    ranks_info: list[dict[str, Any]] = []
    rank_env: dict[str, dict[str, str]] = {}
    global_rank = 0
    try:
        for spec in plan.ranks:  # rank order: rank 0 on the leader
            for local in range(per_node[spec.node]):
                env = rank_environment(
                    base,
                    spec.env,
                    master=master,
                    port=port,
                    rank=global_rank,
                    world=world,
                    local_rank=local,
                    nccl=gpu_nodes,
                )
                log = workdir / f"rank{global_rank}.log"
                with log.open("wb") as output:
                    process = transport.spawn(nodes[spec.node], argv, env, output)
                launched.append((global_rank, spec.node, process, log))
                ranks_info.append(
                    {
                        "rank": global_rank,
                        "node": spec.node,
                        "address": spec.address,
                        "local_rank": local,
                    }
                )
                rank_env[str(global_rank)] = {
                    k: v for k, v in sorted(env.items()) if SHOWN_VARS.match(k)
                }
                global_rank += 1
        error = _wait(launched, started + timeout_s)
    finally:
        for _, _, process, _ in launched:
            if process.poll() is None:
                _kill_group(process)
    logs = {rank: log.read_text(errors="replace") for rank, _, _, log in launched}
    result = FabricResult(
        ok=False,
        backend=backend,
        world_size=world,
        ranks=ranks_info,
        master=f"{master}:{port}",
        rank_env=rank_env,
        elapsed_s=round(time.monotonic() - started, 2),
    )
    if gpu_nodes:
        result.transports, result.nccl_network = parse_nccl_transports("\n".join(logs.values()))
    data = parse_rank0(logs.get(0, ""))
    if data is None:
        result.error = error or "rank 0 printed no result"
    else:
        result.ok = error is None and data.get("correct", False)
        result.error = error if error else (None if data.get("correct") else "wrong all-reduce sum")
        result.correct = data.get("correct")
        result.sizes = [FabricSize(**s) for s in data["sizes"]]
        result.peak_busbw_gbps = max((s.busbw_gbps for s in result.sizes), default=None)
        for key in (
            "small_message_bytes",
            "small_message_latency_us",
            "rendezvous_s",
            "nccl_version",
            "torch_version",
        ):
            setattr(result, key, data.get(key))
    if not result.ok:  # the ranks' own words on what failed
        result.log_tail = {str(r): text[-2000:] for r, text in logs.items()}
    shutil.rmtree(workdir)
    return result, fabric_findings(deployment, result, facts)


def _wait(launched: list[tuple[int, str, subprocess.Popen, Path]], deadline: float) -> str | None:
    """Wait for every rank; the first failure (exit code or timeout) as text, else None."""
    while time.monotonic() < deadline:
        codes = [(rank, node, p.poll()) for rank, node, p, _ in launched]
        failed = [(r, n, c) for r, n, c in codes if c not in (None, 0)]
        if failed:
            time.sleep(1.0)  # let the others print their view of the failure
            r, n, c = failed[0]
            return f"rank {r} on {n} exited with status {c}"
        if all(c == 0 for _, _, c in codes):
            return None
        time.sleep(0.2)
    waiting = [f"rank {r} on {n}" for r, n, p, _ in launched if p.poll() is None]
    return (
        f"timed out; still running: {', '.join(waiting)} (a rendezvous that never completes "
        "means a rank cannot reach the leader's address and port)"
    )


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        process.kill()
    process.wait(timeout=10)


def fabric_findings(
    deployment: Deployment, result: FabricResult, facts: dict[str, dict[str, Any]] | None = None
) -> list[Finding]:
    """Errors for a fabric that failed or fell back to TCP; on a Spark pair, the bus bandwidth
    against what a pair reaches (``spark_pair_verdict``); an info line for what it measured."""
    if not result.ok:
        tail = next(iter(result.log_tail.values()), "")[-600:]
        return [
            Finding(
                rule="fabric-failed",
                severity=Severity.ERROR,
                node=None,
                message=f"the {result.backend} all-reduce across {result.world_size} "
                f"rank(s) failed: {result.error}",
                evidence=f"rendezvous {result.master}; rank 0 log tail: {tail!r}",
                fix="check that every node reaches the leader's address on the control "
                "plane (firewall, interface pins), then rerun `tandem check --fabric`",
            )
        ]
    findings = []
    ib = deployment.recipe.network.data_plane.transport is DataPlaneTransport.IB
    hosts = len({r["node"] for r in result.ranks})
    if (
        result.backend == "nccl"
        and ib
        and hosts > 1
        and (
            "NET/Socket" in result.transports
            or result.nccl_network == "Socket"
            or "NET/IB" not in result.transports
        )
    ):
        findings.append(
            Finding(
                rule="fabric-socket-fallback",
                severity=Severity.ERROR,
                node=None,
                message="NCCL did not use RoCE/IB between the nodes: it fell back to TCP sockets",
                evidence=f"NCCL connections: {', '.join(result.transports) or 'none seen'}; "
                f"network plugin {result.nccl_network}; "
                f"peak bus bandwidth {result.peak_busbw_gbps} GB/s",
                fix=f"check {wire.NCCL_IB_HCA}, the GID index and /dev/infiniband in the rank's "
                "environment (a container needs the device and IPC_LOCK)",
            )
        )
    verdict = spark_pair_verdict(deployment, result, facts or {})
    if verdict is not None:
        findings.append(verdict)
    biggest = result.sizes[-1] if result.sizes else None
    findings.append(
        Finding(
            rule="fabric",
            severity=Severity.INFO,
            node=None,
            message=f"{result.backend} all-reduce over {result.world_size} rank(s): peak bus "
            f"bandwidth {result.peak_busbw_gbps} GB/s, {result.small_message_bytes}-byte "
            f"latency {result.small_message_latency_us} us",
            evidence=(
                f"transports {', '.join(result.transports) or 'n/a'}; " if result.transports else ""
            )
            + (f"at {biggest.bytes} bytes: {biggest.busbw_gbps} GB/s" if biggest else ""),
            fix="nothing to do",
        )
    )
    return findings


def spark_pair_verdict(
    deployment: Deployment, result: FabricResult, facts: dict[str, dict[str, Any]]
) -> Finding | None:
    """The NCCL bus bandwidth of a two-Spark RoCE run against what a pair should reach.

    A verdict only where the figures apply: NCCL over RoCE/IB between exactly two nodes whose
    probed GPUs are each one GB10, and messages of at least 1 GiB (smaller ones stay below the
    link's rate). Below ``SPARK_PAIR_FLOOR_GBPS`` it is an error, below
    ``SPARK_PAIR_BUSBW_GBPS`` a warning; otherwise, and anywhere else, None.
    """
    large = [s for s in result.sizes if s.bytes >= known.VERDICT_MIN_BYTES]
    nodes = {r["node"] for r in result.ranks}
    if (
        not result.ok
        or result.backend != "nccl"
        or deployment.recipe.network.data_plane.transport is not DataPlaneTransport.IB
        or not large
        or len(nodes) != 2
        or result.world_size != 2
        or not all(known.is_spark(facts.get(n) or {}) for n in nodes)
    ):
        return None
    best = max(large, key=lambda s: s.busbw_gbps)
    if best.busbw_gbps >= known.SPARK_PAIR_BUSBW_GBPS:
        return None
    error = best.busbw_gbps < known.SPARK_PAIR_FLOOR_GBPS
    return Finding(
        rule="fabric-bandwidth",
        severity=Severity.ERROR if error else Severity.WARNING,
        node=None,
        message=f"the Spark pair {' and '.join(sorted(nodes))} reaches {best.busbw_gbps:.2f} "
        f"GB/s bus bandwidth; a pair over RoCE reaches {known.SPARK_PAIR_BUSBW_GBPS:g} GB/s "
        "or more"
        + (
            f" (below {known.SPARK_PAIR_FLOOR_GBPS:g} GB/s: one twin missing or TCP)"
            if error
            else ""
        ),
        evidence=f"all-reduce of {best.bytes} bytes: {best.busbw_gbps} GB/s busbw "
        f"({best.algbw_gbps} GB/s algbw), NCCL {result.nccl_version}, connections "
        f"{', '.join(result.transports) or 'none seen'}; measured pairs: "
        f"{known.SPARK_PAIR_SOURCES}",
        fix=f"look for the known causes (the host-fault findings above name those seen): "
        f"{known.SLOW_SPARK_PAIR_CAUSES}",
    )
